/*
 * gemma3n_audio.c - the conformer blocks of Gemma 3n's audio encoder (Gemma3nAudioEncoder's
 * `conformer`): their spec, and the block's forward and backward on the graph that Gemma 4's audio
 * tower shares (conformer.h; its names in core/arch/gemma4_audio.c), so that the encoder's linears
 * carry LoRA adapters like any other graph's (PEFT names them
 * "model.audio_tower.conformer.N.attention.attn.q_proj", ...).
 *
 * gemma_architecture.md §3.9 (transformers' modeling_gemma3n.py: Gemma3nAudioConformerBlock,
 * Gemma3nAudioConformerFeedForward, Gemma3nAudioConformerAttention, Gemma3nAudioAttention,
 * Gemma3nAudioConformerLightConv1d). Per block, x (N, C) with N = clips x frames, G the config's
 * gradient_clipping (a clamp in the forward), rw its conf_residual_weight, lin(u) = u W^T:
 *   ffw(x)  = x + rw RMSNorm_post(clip(lin2(silu(lin1(RMSNorm_pre(clip(x)))))))       (twice)
 *   attn(x) = x + RMSNorm_post(clip(post(att(q s, k ks, v)))), q, k, v = lin(RMSNorm_pre(clip(x))),
 *             s = Dh^-1/2 / softplus(0) softplus(per_dim_scale), ks = 1 (Gemma 3n) or
 *             softplus(1) / softplus(0) (Gemma4AudioAttention.k_scale), att the chunked local
 *             attention with relative-position logits and logit cap (kernels.h audio_attention_fwd);
 *   lconv(x): m = x with padding frames zeroed; m + lin_end(silu(RMSNorm_c(clip(conv(glu(
 *             lin_start(RMSNorm_l(m)))))))), conv the causal depthwise convolution;
 *   block   = RMSNorm(clip(ffw_end(lconv(attn(ffw_start(x)))))).
 * Gemma 4 (Gemma4AudioLayer) is this block with every lin clipped: clamp(clamp(u, in_min, in_max)
 * W^T, out_min, out_max), the checkpoint's four bounds per linear, LoRA adapting W inside the clamps
 * (as on its vision tower); its light convolution does not zero the padding frames, which changes
 * only the padding frames' own rows (the convolution is causal and padding trails each clip, the
 * attention masks padding keys): the valid frames' values and gradients are the same.
 * The RMSNorms scale by their weight as stored (Gemma3nRMSNorm, Gemma4RMSNorm); the light
 * convolution's two use audio_config.rms_norm_eps, the others 1e-6 (the class default).
 *
 * The encoder (core/audio/gm_audio_encoder.c) owns what is around the blocks - the sub-sampling
 * convolutions writing X[0], what reads X[L] - and fills the graph's weight views: the linears as
 * stored, the norms and the depthwise kernel as f32, and two tables it derives at load in the slots
 * of the weights they come from: W_QSCALE holds s (Dh) and W_POS the relative-position table
 * (L + R + 1, C) = timing signal x pos_proj^T. pos_proj is therefore not LoRA-targetable (its output
 * is a table computed once), nor are the model-level linears (input projection, embedder). The
 * graph's row_valid marks the real frames.
 */
#include "conformer.h"

#include <math.h>

/* Gemma3nRMSNorm's default eps (the conformer's norms other than the light convolution's). */
#define CONFORMER_NORM_EPS 1e-6f

/* ---- spec --------------------------------------------------------------------------------- */

/* lora_id 32.. (the decoder's are 0..15, SigLIP's 16..21): an audio adapter's RNG streams are its
 * own. No GGUF names: llama.cpp has no Gemma 3n audio tower. */
#define NORM(hf) {hf, "", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false}
#define LIN(hf, r, c, id) {hf, "", GM_W_LINEAR, r, c, GM_WHEN_ALWAYS, id, false, false}
#define CLIP(m, b) {m "." b, "", GM_W_VEC, GM_DIM_1, GM_DIM_NONE, GM_WHEN_CLIPPED, -1, false, false}
#define CLIPS(m) CLIP(m, "input_min"), CLIP(m, "input_max"), CLIP(m, "output_min"), CLIP(m, "output_max")
static const gm_weight_spec layer_weights[CF_W_COUNT] = {
    [CF_W_F0_PRE] = NORM("ffw_layer_start.pre_layer_norm.weight"),
    [CF_W_F0_1] = LIN("ffw_layer_start.ffw_layer_1.weight", GM_DIM_F, GM_DIM_C, 32),
    [CF_W_F0_2] = LIN("ffw_layer_start.ffw_layer_2.weight", GM_DIM_C, GM_DIM_F, 33),
    [CF_W_F0_POST] = NORM("ffw_layer_start.post_layer_norm.weight"),
    [CF_W_A_PRE] = NORM("attention.pre_attn_norm.weight"),
    [CF_W_Q] = LIN("attention.attn.q_proj.weight", GM_DIM_QW, GM_DIM_C, 34),
    [CF_W_K] = LIN("attention.attn.k_proj.weight", GM_DIM_KW, GM_DIM_C, 35),
    [CF_W_V] = LIN("attention.attn.v_proj.weight", GM_DIM_KW, GM_DIM_C, 36),
    /* derived at load (file comment): the effective query scale, the relative-position table */
    [CF_W_QSCALE] = {"attention.attn.per_dim_scale", "", GM_W_VEC, GM_DIM_D, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [CF_W_POS] = LIN("attention.attn.relative_position_embedding.pos_proj.weight", GM_DIM_C, GM_DIM_C, -1),
    [CF_W_POST] = LIN("attention.post.weight", GM_DIM_C, GM_DIM_QW, 37),
    [CF_W_A_POST] = NORM("attention.post_norm.weight"),
    [CF_W_L_PRE] = NORM("lconv1d.pre_layer_norm.weight"),
    [CF_W_L_START] = LIN("lconv1d.linear_start.weight", GM_DIM_C2, GM_DIM_C, 38),
    /* (C, 1, K) as stored, read as (C, K) f32 */
    [CF_W_L_CONV] = {"lconv1d.depthwise_conv1d.weight", "", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [CF_W_L_NORM] = NORM("lconv1d.conv_norm.weight"),
    [CF_W_L_END] = LIN("lconv1d.linear_end.weight", GM_DIM_C, GM_DIM_C, 39),
    [CF_W_F1_PRE] = NORM("ffw_layer_end.pre_layer_norm.weight"),
    [CF_W_F1_1] = LIN("ffw_layer_end.ffw_layer_1.weight", GM_DIM_F, GM_DIM_C, 40),
    [CF_W_F1_2] = LIN("ffw_layer_end.ffw_layer_2.weight", GM_DIM_C, GM_DIM_F, 41),
    [CF_W_F1_POST] = NORM("ffw_layer_end.post_layer_norm.weight"),
    [CF_W_NORM] = NORM("norm.weight"),
    /* Gemma 3n's linears are not clipped: these slots are never present (its config says so) */
    CLIPS("ffw_layer_start.ffw_layer_1"), CLIPS("ffw_layer_start.ffw_layer_2"), CLIPS("attention.attn.q_proj"),
    CLIPS("attention.attn.k_proj"), CLIPS("attention.attn.v_proj"), CLIPS("attention.post"),
    CLIPS("lconv1d.linear_start"), CLIPS("lconv1d.linear_end"), CLIPS("ffw_layer_end.ffw_layer_1"),
    CLIPS("ffw_layer_end.ffw_layer_2"),
};
#undef NORM
#undef LIN
#undef CLIP
#undef CLIPS

/* No model-level weights in the graph (the encoder holds the sub-sampling and what follows the
 * blocks); the three slots every spec starts with are empty. */
const gm_weight_spec gm_conformer_globals[3] = {
    [GM_GLOBAL_EMBED] = {"", "", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED, -1, false, false},
    [GM_GLOBAL_FINAL_NORM] = {"", "", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_UNTIED, -1, false, false},
    [GM_GLOBAL_LM_HEAD] = {"", "", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED, -1, false, false},
};

/* One block's record. F-wide: the feed-forward halves' hidden units (4C); linear_start's output
 * is 2C wide. Clipped linears (Gemma 4) also keep their clamped input (what W and its adapter
 * multiplied) and, for the backward, their output before its clamp. */
enum {
    A_TMP,                                                           /* forward scratch */
    A_F0_XN, A_F0_RSTD1, A_F0_U, A_F0_S, A_F0_Y, A_F0_RSTD2,         /* ffw_layer_start */
    A_H1, A_A_XN, A_A_RSTD1, A_Q, A_K, A_V, A_ATT, A_O, A_A_RSTD2,   /* attention */
    A_H2, A_L_XN, A_L_RSTD1, A_L_BIG, A_L_CV, A_L_CN, A_L_RSTD2, A_L_S, /* light convolution */
    A_H3, A_F1_XN, A_F1_RSTD1, A_F1_U, A_F1_S, A_F1_Y, A_F1_RSTD2,   /* ffw_layer_end */
    A_H4, A_RSTD,
    A_CIN0, A_CRAW0 = A_CIN0 + CF_N_LIN, A_COUNT = A_CRAW0 + CF_N_LIN
};

/* each clipped linear's slot, input and output widths */
static const int CL_SLOT[CF_N_LIN] = {CF_W_F0_1, CF_W_F0_2, CF_W_Q,     CF_W_K,    CF_W_V,
                                      CF_W_POST, CF_W_L_START, CF_W_L_END, CF_W_F1_1, CF_W_F1_2};

#define ACT(n, w) {n, w, GM_WHEN_ALWAYS, GM_ACT_BOTH}
#define RSTD(n) {n, GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN}
#define CIN(n, w) {n "_in", w, GM_WHEN_CLIPPED, GM_ACT_BOTH}
#define CRAW(n, w) {n "_raw", w, GM_WHEN_CLIPPED, GM_ACT_TRAIN}
const gm_act_spec gm_conformer_acts[A_COUNT] = {
    [A_TMP] = ACT("tmp", GM_DIM_C),
    [A_F0_XN] = ACT("ffw0_xn", GM_DIM_C), [A_F0_RSTD1] = RSTD("ffw0_rstd1"), [A_F0_U] = ACT("ffw0_u", GM_DIM_F),
    [A_F0_S] = ACT("ffw0_s", GM_DIM_F), [A_F0_Y] = ACT("ffw0_y", GM_DIM_C), [A_F0_RSTD2] = RSTD("ffw0_rstd2"),
    [A_H1] = ACT("h1", GM_DIM_C), [A_A_XN] = ACT("attn_xn", GM_DIM_C), [A_A_RSTD1] = RSTD("attn_rstd1"),
    [A_Q] = ACT("q", GM_DIM_QW), [A_K] = ACT("k", GM_DIM_KW), [A_V] = ACT("v", GM_DIM_KW), [A_ATT] = ACT("att", GM_DIM_QW),
    [A_O] = ACT("o", GM_DIM_C), [A_A_RSTD2] = RSTD("attn_rstd2"),
    [A_H2] = ACT("h2", GM_DIM_C), [A_L_XN] = ACT("lconv_xn", GM_DIM_C), [A_L_RSTD1] = RSTD("lconv_rstd1"),
    [A_L_BIG] = ACT("lconv_start", GM_DIM_C2), [A_L_CV] = ACT("lconv_conv", GM_DIM_C), [A_L_CN] = ACT("lconv_cn", GM_DIM_C),
    [A_L_RSTD2] = RSTD("lconv_rstd2"), [A_L_S] = ACT("lconv_s", GM_DIM_C),
    [A_H3] = ACT("h3", GM_DIM_C), [A_F1_XN] = ACT("ffw1_xn", GM_DIM_C), [A_F1_RSTD1] = RSTD("ffw1_rstd1"),
    [A_F1_U] = ACT("ffw1_u", GM_DIM_F), [A_F1_S] = ACT("ffw1_s", GM_DIM_F), [A_F1_Y] = ACT("ffw1_y", GM_DIM_C),
    [A_F1_RSTD2] = RSTD("ffw1_rstd2"),
    [A_H4] = ACT("h4", GM_DIM_C), [A_RSTD] = RSTD("rstd"),
    [A_CIN0 + CF_F0_1] = CIN("ffw0_1", GM_DIM_C), [A_CIN0 + CF_F0_2] = CIN("ffw0_2", GM_DIM_F),
    [A_CIN0 + CF_Q] = CIN("q", GM_DIM_C), [A_CIN0 + CF_K] = CIN("k", GM_DIM_C), [A_CIN0 + CF_V] = CIN("v", GM_DIM_C),
    [A_CIN0 + CF_POST] = CIN("post", GM_DIM_QW), [A_CIN0 + CF_L_START] = CIN("lconv_start", GM_DIM_C),
    [A_CIN0 + CF_L_END] = CIN("lconv_end", GM_DIM_C), [A_CIN0 + CF_F1_1] = CIN("ffw1_1", GM_DIM_C),
    [A_CIN0 + CF_F1_2] = CIN("ffw1_2", GM_DIM_F),
    [A_CRAW0 + CF_F0_1] = CRAW("ffw0_1", GM_DIM_F), [A_CRAW0 + CF_F0_2] = CRAW("ffw0_2", GM_DIM_C),
    [A_CRAW0 + CF_Q] = CRAW("q", GM_DIM_QW), [A_CRAW0 + CF_K] = CRAW("k", GM_DIM_KW), [A_CRAW0 + CF_V] = CRAW("v", GM_DIM_KW),
    [A_CRAW0 + CF_POST] = CRAW("post", GM_DIM_C), [A_CRAW0 + CF_L_START] = CRAW("lconv_start", GM_DIM_C2),
    [A_CRAW0 + CF_L_END] = CRAW("lconv_end", GM_DIM_C), [A_CRAW0 + CF_F1_1] = CRAW("ffw1_1", GM_DIM_F),
    [A_CRAW0 + CF_F1_2] = CRAW("ffw1_2", GM_DIM_C),
};
_Static_assert((int)A_COUNT == (int)CF_N_ACTS, "conformer.h's CF_N_ACTS");
#undef ACT
#undef RSTD
#undef CIN
#undef CRAW

enum { G_T, G_D1, G_D2, G_F1, G_F2, G_DATT, G_DQ, G_DK, G_DV, G_WORK, G_CIN, G_COUT, G_COUNT };
#define GR(n, w) {n, w, GM_WHEN_ALWAYS, GM_ACT_TRAIN}
const gm_act_spec gm_conformer_grads[G_COUNT] = {
    [G_T] = GR("t", GM_DIM_C), [G_D1] = GR("d1", GM_DIM_C), [G_D2] = GR("d2", GM_DIM_C),
    [G_F1] = GR("df1", GM_DIM_F), [G_F2] = GR("df2", GM_DIM_F), [G_DATT] = GR("datt", GM_DIM_QW),
    [G_DQ] = GR("dq", GM_DIM_QW), [G_DK] = GR("dk", GM_DIM_KW), [G_DV] = GR("dv", GM_DIM_KW),
    [G_WORK] = GR("attn_work", GM_DIM_C), /* (N, H, 2) <= (N, C): the audio config has Dh >= 2 */
    /* a clipped linear's input gradient before its input clamp, its output gradient after its
     * output clamp: the widest input and output (F = 4C >= 2C) */
    [G_CIN] = {"clip_din", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_TRAIN},
    [G_COUT] = {"clip_dout", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_TRAIN},
};
_Static_assert((int)G_COUNT == (int)CF_N_GRADS, "conformer.h's CF_N_GRADS");
#undef GR

/* ---- pieces -------------------------------------------------------------------------------- */

static const float *vec(const gm_graph *g, int64_t l, int slot) { return gm_graph_norm(g, l, slot); }

static bool clipped(const gm_graph *g) { return g->cfg->arch == GM_ARCH_GEMMA4_AUDIO && g->cfg->audio.clipped; }

/* out (N, n_out) = lin(in (N, n_in)) of clipped linear `lin` (see the top; W^T alone unclipped). */
static void lin_fwd(gm_graph *g, int64_t l, int lin, float *out, const float *in, int64_t n_in, int64_t n_out) {
    float **a = gm_graph_record(g, l);
    if (!clipped(g)) gm_graph_linear(g, l, CL_SLOT[lin], out, in);
    else gm_graph_linear_clipped(g, l, CL_SLOT[lin], CF_W_CLIP0 + 4 * lin, out, a[A_CRAW0 + lin], a[A_CIN0 + lin], in, n_in, n_out);
}

/* Backward of lin_fwd: dy (N, n_out) = dL/dout (left as it is); dx (N, n_in) = beta dx + dL/din,
 * in the forward's input; the adapter's gradients accumulate. */
static void lin_bwd(gm_graph *g, int64_t l, int lin, float *dx, const float *dy, const float *in, int64_t n_in,
                    int64_t n_out, float beta) {
    float **a = gm_graph_record(g, l), **d = g->grad;
    if (!clipped(g)) gm_graph_linear_bwd(g, l, CL_SLOT[lin], dx, dy, in, beta);
    else gm_graph_linear_clipped_bwd(g, l, CL_SLOT[lin], CF_W_CLIP0 + 4 * lin, dx, dy, d[G_COUT], a[A_CRAW0 + lin],
                                     a[A_CIN0 + lin], in, d[G_CIN], n_in, n_out, beta);
}

/* Gemma4AudioAttention.k_scale = log(1 + e) / log(2) (f32); 1 on Gemma 3n */
static float key_scale(const gm_graph *g) {
    return g->cfg->arch == GM_ARCH_GEMMA4_AUDIO ? (float)(log1p(exp(1.0)) / log(2.0)) : 1.0f;
}

static const int FF_SLOTS[2][2] = {{CF_W_F0_PRE, CF_W_F0_POST}, {CF_W_F1_PRE, CF_W_F1_POST}};
static const int FF_LINS[2][2] = {{CF_F0_1, CF_F0_2}, {CF_F1_1, CF_F1_2}};
static const int FF_ACTS[2][6] = {{A_F0_XN, A_F0_RSTD1, A_F0_U, A_F0_S, A_F0_Y, A_F0_RSTD2},
                                  {A_F1_XN, A_F1_RSTD1, A_F1_U, A_F1_S, A_F1_Y, A_F1_RSTD2}};

/* out = x + rw RMSNorm_post(clip(lin2(silu(lin1(RMSNorm_pre(clip(x))))))); out must not alias x. */
static void ffw_fwd(gm_graph *g, int64_t l, int j, float *out, const float *x) {
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_audio_config *ac = &g->cfg->audio;
    float **a = gm_graph_record(g, l);
    const int *w = FF_SLOTS[j], *r = FF_ACTS[j];
    int64_t N = g->N, C = g->cfg->hidden_size, F = gm_dim_value(g->cfg, l, GM_DIM_F, 0);
    k->clamp_fwd(kc, a[r[0]], x, N * C, ac->clip);
    k->rmsnorm_fwd(kc, a[r[0]], a[r[1]], a[r[0]], vec(g, l, w[0]), N, C, CONFORMER_NORM_EPS);
    lin_fwd(g, l, FF_LINS[j][0], a[r[2]], a[r[0]], C, F);
    k->silu_fwd(kc, a[r[3]], a[r[2]], N * F);
    lin_fwd(g, l, FF_LINS[j][1], a[r[4]], a[r[3]], F, C);
    k->clamp_fwd(kc, a[A_TMP], a[r[4]], N * C, ac->clip);
    k->rmsnorm_fwd(kc, a[A_TMP], a[r[5]], a[A_TMP], vec(g, l, w[1]), N, C, CONFORMER_NORM_EPS);
    k->scale_fwd(kc, a[A_TMP], a[A_TMP], N * C, ac->residual_weight);
    k->scale_fwd(kc, out, x, N * C, 1.0f);
    k->add_fwd(kc, out, a[A_TMP], N * C);
}

/* dh (N, C): dL/d(ffw's output) in, dL/dx out (the residual plus the branch); x the input. */
static void ffw_bwd(gm_graph *g, int64_t l, int j, float *dh, const float *x) {
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_audio_config *ac = &g->cfg->audio;
    float **a = gm_graph_record(g, l), **d = g->grad;
    const int *w = FF_SLOTS[j], *r = FF_ACTS[j];
    int64_t N = g->N, C = g->cfg->hidden_size, F = gm_dim_value(g->cfg, l, GM_DIM_F, 0);
    k->scale_fwd(kc, d[G_D1], dh, N * C, ac->residual_weight);
    k->clamp_fwd(kc, d[G_T], a[r[4]], N * C, ac->clip);
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, w[1]), a[r[5]], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], a[r[4]], N * C, ac->clip);
    lin_bwd(g, l, FF_LINS[j][1], d[G_F1], d[G_D2], a[r[3]], F, C, 0.0f);
    k->silu_bwd(kc, d[G_F1], d[G_F1], a[r[2]], N * F);
    lin_bwd(g, l, FF_LINS[j][0], d[G_D1], d[G_F1], a[r[0]], C, F, 0.0f);
    k->clamp_fwd(kc, d[G_T], x, N * C, ac->clip);
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, w[0]), a[r[1]], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], x, N * C, ac->clip);
    k->add_fwd(kc, dh, d[G_D2], N * C);
}

/* ---- layer --------------------------------------------------------------------------------- */

void gm_conformer_layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_audio_config *ac = &c->audio;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, Dh = c->head_dim, QW = H * Dh;
    int64_t L, R;
    gm_conformer_window(ac, c->arch == GM_ARCH_GEMMA4_AUDIO, &L, &R);
    float G = ac->clip, ks = key_scale(g);
    ffw_fwd(g, l, 0, a[A_H1], g->X[l]);
    /* attention */
    k->clamp_fwd(kc, a[A_A_XN], a[A_H1], N * C, G);
    k->rmsnorm_fwd(kc, a[A_A_XN], a[A_A_RSTD1], a[A_A_XN], vec(g, l, CF_W_A_PRE), N, C, CONFORMER_NORM_EPS);
    lin_fwd(g, l, CF_Q, a[A_Q], a[A_A_XN], C, QW);
    lin_fwd(g, l, CF_K, a[A_K], a[A_A_XN], C, QW);
    lin_fwd(g, l, CF_V, a[A_V], a[A_A_XN], C, QW);
    k->mul_cols_fwd(kc, a[A_Q], a[A_Q], vec(g, l, CF_W_QSCALE), N * H, Dh);
    if (ks != 1.0f) k->scale_fwd(kc, a[A_K], a[A_K], N * QW, ks);
    k->audio_attention_fwd(kc, a[A_ATT], a[A_Q], a[A_K], a[A_V], vec(g, l, CF_W_POS), g->row_valid, g->B, g->T, H, Dh,
                           ac->chunk, L, R, ac->logit_cap);
    lin_fwd(g, l, CF_POST, a[A_O], a[A_ATT], QW, C);
    k->clamp_fwd(kc, a[A_TMP], a[A_O], N * C, G);
    k->rmsnorm_fwd(kc, a[A_TMP], a[A_A_RSTD2], a[A_TMP], vec(g, l, CF_W_A_POST), N, C, CONFORMER_NORM_EPS);
    k->scale_fwd(kc, a[A_H2], a[A_H1], N * C, 1.0f);
    k->add_fwd(kc, a[A_H2], a[A_TMP], N * C);
    /* light convolution, on the real frames */
    k->scale_fwd(kc, a[A_TMP], a[A_H2], N * C, 1.0f);
    k->mask_rows_fwd(kc, a[A_TMP], g->row_valid, NULL, N, C);
    k->rmsnorm_fwd(kc, a[A_L_XN], a[A_L_RSTD1], a[A_TMP], vec(g, l, CF_W_L_PRE), N, C, ac->rms_eps);
    lin_fwd(g, l, CF_L_START, a[A_L_BIG], a[A_L_XN], C, 2 * C);
    k->glu_fwd(kc, a[A_L_S], a[A_L_BIG], N, C);
    k->conv1d_causal_fwd(kc, a[A_L_CV], a[A_L_S], vec(g, l, CF_W_L_CONV), g->B, g->T, C, ac->conv_kernel);
    k->clamp_fwd(kc, a[A_L_CN], a[A_L_CV], N * C, G);
    k->rmsnorm_fwd(kc, a[A_L_CN], a[A_L_RSTD2], a[A_L_CN], vec(g, l, CF_W_L_NORM), N, C, ac->rms_eps);
    k->silu_fwd(kc, a[A_L_S], a[A_L_CN], N * C); /* the GLU's output is no longer needed */
    lin_fwd(g, l, CF_L_END, a[A_H3], a[A_L_S], C, C);
    k->add_fwd(kc, a[A_H3], a[A_TMP], N * C);
    ffw_fwd(g, l, 1, a[A_H4], a[A_H3]);
    float *xo = g->X[l + 1]; /* at inference the same buffer as X[l], no longer read */
    k->clamp_fwd(kc, xo, a[A_H4], N * C, G);
    k->rmsnorm_fwd(kc, xo, a[A_RSTD], xo, vec(g, l, CF_W_NORM), N, C, CONFORMER_NORM_EPS);
}

/* g->g: dL/dX[l+1] in, dL/dX[l] out. The tower's weights are frozen (only adapters on its linears
 * learn), so no norm gradients are formed. */
void gm_conformer_layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_audio_config *ac = &c->audio;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, Dh = c->head_dim, QW = H * Dh;
    int64_t L, R;
    gm_conformer_window(ac, c->arch == GM_ARCH_GEMMA4_AUDIO, &L, &R);
    float G = ac->clip, ks = key_scale(g);
    float *dh = g->g;
    /* the block's norm */
    k->clamp_fwd(kc, d[G_T], a[A_H4], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, dh, d[G_T], vec(g, l, CF_W_NORM), a[A_RSTD], N, C, 0.0f);
    k->clamp_bwd(kc, dh, d[G_D1], a[A_H4], N * C, G);
    ffw_bwd(g, l, 1, dh, a[A_H3]); /* dh: dL/dH3 */
    /* light convolution: H3 = m + lin_end(silu(cn)), m the masked H2 */
    lin_bwd(g, l, CF_L_END, d[G_D1], dh, a[A_L_S], C, C, 0.0f);
    k->silu_bwd(kc, d[G_D1], d[G_D1], a[A_L_CN], N * C);
    k->clamp_fwd(kc, d[G_T], a[A_L_CV], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, CF_W_L_NORM), a[A_L_RSTD2], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], a[A_L_CV], N * C, G);
    k->conv1d_causal_bwd(kc, d[G_D1], d[G_D2], vec(g, l, CF_W_L_CONV), g->B, g->T, C, ac->conv_kernel);
    k->glu_bwd(kc, d[G_F1], d[G_D1], a[A_L_BIG], N, C);
    lin_bwd(g, l, CF_L_START, d[G_D2], d[G_F1], a[A_L_XN], C, 2 * C, 0.0f);
    k->scale_fwd(kc, d[G_T], a[A_H2], N * C, 1.0f);
    k->mask_rows_fwd(kc, d[G_T], g->row_valid, NULL, N, C);
    k->rmsnorm_bwd(kc, dh, NULL, d[G_D2], d[G_T], vec(g, l, CF_W_L_PRE), a[A_L_RSTD1], N, C, 1.0f);
    k->mask_rows_fwd(kc, dh, g->row_valid, NULL, N, C); /* dh: dL/dH2 */
    /* attention: H2 = H1 + RMSNorm_post(clip(o)) */
    k->clamp_fwd(kc, d[G_T], a[A_O], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, dh, d[G_T], vec(g, l, CF_W_A_POST), a[A_A_RSTD2], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D1], d[G_D1], a[A_O], N * C, G);
    lin_bwd(g, l, CF_POST, d[G_DATT], d[G_D1], a[A_ATT], QW, C, 0.0f);
    k->audio_attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], a[A_K], a[A_V], vec(g, l, CF_W_POS),
                           g->row_valid, d[G_WORK], g->B, g->T, H, Dh, ac->chunk, L, R, ac->logit_cap);
    k->mul_cols_fwd(kc, d[G_DQ], d[G_DQ], vec(g, l, CF_W_QSCALE), N * H, Dh);
    if (ks != 1.0f) k->scale_fwd(kc, d[G_DK], d[G_DK], N * QW, ks);
    lin_bwd(g, l, CF_Q, d[G_D2], d[G_DQ], a[A_A_XN], C, QW, 0.0f);
    lin_bwd(g, l, CF_K, d[G_D2], d[G_DK], a[A_A_XN], C, QW, 1.0f);
    lin_bwd(g, l, CF_V, d[G_D2], d[G_DV], a[A_A_XN], C, QW, 1.0f);
    k->clamp_fwd(kc, d[G_T], a[A_H1], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, d[G_D2], d[G_T], vec(g, l, CF_W_A_PRE), a[A_A_RSTD1], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D1], d[G_D1], a[A_H1], N * C, G);
    k->add_fwd(kc, dh, d[G_D1], N * C); /* dh: dL/dH1 */
    ffw_bwd(g, l, 0, dh, g->X[l]);      /* dh: dL/dX[l] */
}

const gm_arch_def gm_arch_gemma3n_audio = {
    .id = GM_ARCH_GEMMA3N_AUDIO,
    .name = "gemma3n_audio",
    .layers_prefix = "conformer.",
    .encoder = true,
    .own_attention = true,
    .globals = gm_conformer_globals,
    .n_globals = 3,
    .layer = layer_weights,
    .n_layer = CF_W_COUNT,
    .acts = gm_conformer_acts,
    .n_acts = A_COUNT,
    .grads = gm_conformer_grads,
    .n_grads = G_COUNT,
    .embed_scale = NULL,
    .layer_fwd = gm_conformer_layer_fwd,
    .layer_bwd = gm_conformer_layer_bwd,
};
