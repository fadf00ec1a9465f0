/*
 * gemma3n_audio.c - the conformer blocks of Gemma 3n's audio encoder (Gemma3nAudioEncoder's
 * `conformer`): their spec and one block's forward and backward on the graph, so that the
 * encoder's linears carry LoRA adapters like any other graph's (PEFT names them
 * "model.audio_tower.conformer.N.attention.attn.q_proj", ...).
 *
 * gemma_architecture.md §3.9 (transformers' modeling_gemma3n.py: Gemma3nAudioConformerBlock,
 * Gemma3nAudioConformerFeedForward, Gemma3nAudioConformerAttention, Gemma3nAudioAttention,
 * Gemma3nAudioConformerLightConv1d). Per block, x (N, C) with N = clips x frames, G the config's
 * gradient_clipping (a clamp in the forward), rw its conf_residual_weight:
 *   ffw(x)  = x + rw RMSNorm_post(clip(silu(RMSNorm_pre(clip(x)) W1^T) W2^T))       (twice)
 *   attn(x) = x + RMSNorm_post(clip(att(q s, k, v) Wpost^T)), q, k, v = RMSNorm_pre(clip(x)) W^T,
 *             s = Dh^-1/2 / softplus(0) softplus(per_dim_scale), att the chunked local attention
 *             with relative-position logits and logit cap (kernels.h audio_attention_fwd);
 *   lconv(x): m = x with padding frames zeroed; m + silu(RMSNorm_c(clip(conv(glu(
 *             RMSNorm_l(m) Wstart^T))))) Wend^T, conv the causal depthwise convolution;
 *   block   = RMSNorm(clip(ffw_end(lconv(attn(ffw_start(x)))))).
 * The RMSNorms scale by their weight as stored (Gemma3nRMSNorm); the light convolution's two use
 * audio_config.rms_norm_eps, the others 1e-6 (the class default).
 *
 * The encoder (core/audio/gm_audio_encoder.c) owns what is around the blocks - the sub-sampling
 * convolutions writing X[0], the reduction and the embedder reading X[L] - and fills the graph's
 * weight views: the linears as stored, the norms and the depthwise kernel as f32, and two tables
 * it derives at load in the slots of the weights they come from: W_QSCALE holds s (Dh) and W_POS
 * the relative-position table (L + R + 1, C) = timing signal x pos_proj^T. pos_proj is therefore
 * not LoRA-targetable (its output is a table computed once), nor are the model-level linears
 * (input projection, embedder). The graph's row_valid marks the real frames.
 */
#include "gm_arch.h"
#include "gm_graph.h"

/* Gemma3nRMSNorm's default eps (the conformer's norms other than the light convolution's). */
#define CONFORMER_NORM_EPS 1e-6f

/* ---- spec --------------------------------------------------------------------------------- */

enum {
    W_F0_PRE, W_F0_1, W_F0_2, W_F0_POST,
    W_A_PRE, W_Q, W_K, W_V, W_QSCALE, W_POS, W_POST, W_A_POST,
    W_L_PRE, W_L_START, W_L_CONV, W_L_NORM, W_L_END,
    W_F1_PRE, W_F1_1, W_F1_2, W_F1_POST,
    W_NORM, W_COUNT
};

/* lora_id 32.. (the decoder's are 0..15, SigLIP's 16..21): an audio adapter's RNG streams are its
 * own. No GGUF names: llama.cpp has no Gemma 3n audio tower. */
#define NORM(hf) {hf, "", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false}
#define LIN(hf, r, c, id) {hf, "", GM_W_LINEAR, r, c, GM_WHEN_ALWAYS, id, false, false}
static const gm_weight_spec layer_weights[W_COUNT] = {
    [W_F0_PRE] = NORM("ffw_layer_start.pre_layer_norm.weight"),
    [W_F0_1] = LIN("ffw_layer_start.ffw_layer_1.weight", GM_DIM_F, GM_DIM_C, 32),
    [W_F0_2] = LIN("ffw_layer_start.ffw_layer_2.weight", GM_DIM_C, GM_DIM_F, 33),
    [W_F0_POST] = NORM("ffw_layer_start.post_layer_norm.weight"),
    [W_A_PRE] = NORM("attention.pre_attn_norm.weight"),
    [W_Q] = LIN("attention.attn.q_proj.weight", GM_DIM_QW, GM_DIM_C, 34),
    [W_K] = LIN("attention.attn.k_proj.weight", GM_DIM_KW, GM_DIM_C, 35),
    [W_V] = LIN("attention.attn.v_proj.weight", GM_DIM_KW, GM_DIM_C, 36),
    /* derived at load (file comment): the effective query scale, the relative-position table */
    [W_QSCALE] = {"attention.attn.per_dim_scale", "", GM_W_VEC, GM_DIM_D, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_POS] = LIN("attention.attn.relative_position_embedding.pos_proj.weight", GM_DIM_C, GM_DIM_C, -1),
    [W_POST] = LIN("attention.post.weight", GM_DIM_C, GM_DIM_QW, 37),
    [W_A_POST] = NORM("attention.post_norm.weight"),
    [W_L_PRE] = NORM("lconv1d.pre_layer_norm.weight"),
    [W_L_START] = LIN("lconv1d.linear_start.weight", GM_DIM_C2, GM_DIM_C, 38),
    /* (C, 1, K) as stored, read as (C, K) f32 */
    [W_L_CONV] = {"lconv1d.depthwise_conv1d.weight", "", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_L_NORM] = NORM("lconv1d.conv_norm.weight"),
    [W_L_END] = LIN("lconv1d.linear_end.weight", GM_DIM_C, GM_DIM_C, 39),
    [W_F1_PRE] = NORM("ffw_layer_end.pre_layer_norm.weight"),
    [W_F1_1] = LIN("ffw_layer_end.ffw_layer_1.weight", GM_DIM_F, GM_DIM_C, 40),
    [W_F1_2] = LIN("ffw_layer_end.ffw_layer_2.weight", GM_DIM_C, GM_DIM_F, 41),
    [W_F1_POST] = NORM("ffw_layer_end.post_layer_norm.weight"),
    [W_NORM] = NORM("norm.weight"),
};
#undef NORM
#undef LIN

/* No model-level weights in the graph (the encoder holds the sub-sampling and the embedder); the
 * three slots every spec starts with are empty. */
static const gm_weight_spec global_weights[3] = {
    [GM_GLOBAL_EMBED] = {"", "", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED, -1, false, false},
    [GM_GLOBAL_FINAL_NORM] = {"", "", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_UNTIED, -1, false, false},
    [GM_GLOBAL_LM_HEAD] = {"", "", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED, -1, false, false},
};

/* One block's record. F-wide: the feed-forward halves' hidden units (4C); linear_start's output
 * is 2C wide. */
enum {
    A_TMP,                                                           /* forward scratch */
    A_F0_XN, A_F0_RSTD1, A_F0_U, A_F0_S, A_F0_Y, A_F0_RSTD2,         /* ffw_layer_start */
    A_H1, A_A_XN, A_A_RSTD1, A_Q, A_K, A_V, A_ATT, A_O, A_A_RSTD2,   /* attention */
    A_H2, A_L_XN, A_L_RSTD1, A_L_BIG, A_L_CV, A_L_CN, A_L_RSTD2, A_L_S, /* light convolution */
    A_H3, A_F1_XN, A_F1_RSTD1, A_F1_U, A_F1_S, A_F1_Y, A_F1_RSTD2,   /* ffw_layer_end */
    A_H4, A_RSTD, A_COUNT
};

#define ACT(n, w) {n, w, GM_WHEN_ALWAYS, GM_ACT_BOTH}
#define RSTD(n) {n, GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN}
static const gm_act_spec acts[A_COUNT] = {
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
};
#undef ACT
#undef RSTD

enum { G_T, G_D1, G_D2, G_F1, G_F2, G_DATT, G_DQ, G_DK, G_DV, G_WORK, G_COUNT };
#define GR(n, w) {n, w, GM_WHEN_ALWAYS, GM_ACT_TRAIN}
static const gm_act_spec grads[G_COUNT] = {
    [G_T] = GR("t", GM_DIM_C), [G_D1] = GR("d1", GM_DIM_C), [G_D2] = GR("d2", GM_DIM_C),
    [G_F1] = GR("df1", GM_DIM_F), [G_F2] = GR("df2", GM_DIM_F), [G_DATT] = GR("datt", GM_DIM_QW),
    [G_DQ] = GR("dq", GM_DIM_QW), [G_DK] = GR("dk", GM_DIM_KW), [G_DV] = GR("dv", GM_DIM_KW),
    [G_WORK] = GR("attn_work", GM_DIM_C), /* (N, H, 2) <= (N, C): the audio config has Dh >= 2 */
};
#undef GR

/* ---- pieces -------------------------------------------------------------------------------- */

static const float *vec(const gm_graph *g, int64_t l, int slot) { return gm_graph_norm(g, l, slot); }

static const int FF_SLOTS[2][4] = {{W_F0_PRE, W_F0_1, W_F0_2, W_F0_POST}, {W_F1_PRE, W_F1_1, W_F1_2, W_F1_POST}};
static const int FF_ACTS[2][6] = {{A_F0_XN, A_F0_RSTD1, A_F0_U, A_F0_S, A_F0_Y, A_F0_RSTD2},
                                  {A_F1_XN, A_F1_RSTD1, A_F1_U, A_F1_S, A_F1_Y, A_F1_RSTD2}};

/* out = x + rw RMSNorm_post(clip(silu(RMSNorm_pre(clip(x)) W1^T) W2^T)); out must not alias x. */
static void ffw_fwd(gm_graph *g, int64_t l, int j, float *out, const float *x) {
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_audio_config *ac = &g->cfg->audio;
    float **a = gm_graph_record(g, l);
    const int *w = FF_SLOTS[j], *r = FF_ACTS[j];
    int64_t N = g->N, C = g->cfg->hidden_size, F = gm_dim_value(g->cfg, l, GM_DIM_F, 0);
    k->clamp_fwd(kc, a[r[0]], x, N * C, ac->clip);
    k->rmsnorm_fwd(kc, a[r[0]], a[r[1]], a[r[0]], vec(g, l, w[0]), N, C, CONFORMER_NORM_EPS);
    gm_graph_linear(g, l, w[1], a[r[2]], a[r[0]]);
    k->silu_fwd(kc, a[r[3]], a[r[2]], N * F);
    gm_graph_linear(g, l, w[2], a[r[4]], a[r[3]]);
    k->clamp_fwd(kc, a[A_TMP], a[r[4]], N * C, ac->clip);
    k->rmsnorm_fwd(kc, a[A_TMP], a[r[5]], a[A_TMP], vec(g, l, w[3]), N, C, CONFORMER_NORM_EPS);
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
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, w[3]), a[r[5]], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], a[r[4]], N * C, ac->clip);
    gm_graph_linear_bwd(g, l, w[2], d[G_F1], d[G_D2], a[r[3]], 0.0f);
    k->silu_bwd(kc, d[G_F1], d[G_F1], a[r[2]], N * F);
    gm_graph_linear_bwd(g, l, w[1], d[G_D1], d[G_F1], a[r[0]], 0.0f);
    k->clamp_fwd(kc, d[G_T], x, N * C, ac->clip);
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, w[0]), a[r[1]], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], x, N * C, ac->clip);
    k->add_fwd(kc, dh, d[G_D2], N * C);
}

/* ---- layer --------------------------------------------------------------------------------- */

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_audio_config *ac = &c->audio;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, Dh = c->head_dim;
    int64_t L = ac->context_left > 0 ? ac->context_left - 1 : 0, R = ac->context_right;
    float G = ac->clip;
    ffw_fwd(g, l, 0, a[A_H1], g->X[l]);
    /* attention */
    k->clamp_fwd(kc, a[A_A_XN], a[A_H1], N * C, G);
    k->rmsnorm_fwd(kc, a[A_A_XN], a[A_A_RSTD1], a[A_A_XN], vec(g, l, W_A_PRE), N, C, CONFORMER_NORM_EPS);
    gm_graph_linear(g, l, W_Q, a[A_Q], a[A_A_XN]);
    gm_graph_linear(g, l, W_K, a[A_K], a[A_A_XN]);
    gm_graph_linear(g, l, W_V, a[A_V], a[A_A_XN]);
    k->mul_cols_fwd(kc, a[A_Q], a[A_Q], vec(g, l, W_QSCALE), N * H, Dh);
    k->audio_attention_fwd(kc, a[A_ATT], a[A_Q], a[A_K], a[A_V], vec(g, l, W_POS), g->row_valid, g->B, g->T, H, Dh,
                           ac->chunk, L, R, ac->logit_cap);
    gm_graph_linear(g, l, W_POST, a[A_O], a[A_ATT]);
    k->clamp_fwd(kc, a[A_TMP], a[A_O], N * C, G);
    k->rmsnorm_fwd(kc, a[A_TMP], a[A_A_RSTD2], a[A_TMP], vec(g, l, W_A_POST), N, C, CONFORMER_NORM_EPS);
    k->scale_fwd(kc, a[A_H2], a[A_H1], N * C, 1.0f);
    k->add_fwd(kc, a[A_H2], a[A_TMP], N * C);
    /* light convolution, on the real frames */
    k->scale_fwd(kc, a[A_TMP], a[A_H2], N * C, 1.0f);
    k->mask_rows_fwd(kc, a[A_TMP], g->row_valid, NULL, N, C);
    k->rmsnorm_fwd(kc, a[A_L_XN], a[A_L_RSTD1], a[A_TMP], vec(g, l, W_L_PRE), N, C, ac->rms_eps);
    gm_graph_linear(g, l, W_L_START, a[A_L_BIG], a[A_L_XN]);
    k->glu_fwd(kc, a[A_L_S], a[A_L_BIG], N, C);
    k->conv1d_causal_fwd(kc, a[A_L_CV], a[A_L_S], vec(g, l, W_L_CONV), g->B, g->T, C, ac->conv_kernel);
    k->clamp_fwd(kc, a[A_L_CN], a[A_L_CV], N * C, G);
    k->rmsnorm_fwd(kc, a[A_L_CN], a[A_L_RSTD2], a[A_L_CN], vec(g, l, W_L_NORM), N, C, ac->rms_eps);
    k->silu_fwd(kc, a[A_L_S], a[A_L_CN], N * C); /* the GLU's output is no longer needed */
    gm_graph_linear(g, l, W_L_END, a[A_H3], a[A_L_S]);
    k->add_fwd(kc, a[A_H3], a[A_TMP], N * C);
    ffw_fwd(g, l, 1, a[A_H4], a[A_H3]);
    float *xo = g->X[l + 1]; /* at inference the same buffer as X[l], no longer read */
    k->clamp_fwd(kc, xo, a[A_H4], N * C, G);
    k->rmsnorm_fwd(kc, xo, a[A_RSTD], xo, vec(g, l, W_NORM), N, C, CONFORMER_NORM_EPS);
}

/* g->g: dL/dX[l+1] in, dL/dX[l] out. The tower's weights are frozen (only adapters on its linears
 * learn), so no norm gradients are formed. */
static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_audio_config *ac = &c->audio;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, Dh = c->head_dim;
    int64_t L = ac->context_left > 0 ? ac->context_left - 1 : 0, R = ac->context_right;
    float G = ac->clip;
    float *dh = g->g;
    /* the block's norm */
    k->clamp_fwd(kc, d[G_T], a[A_H4], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, dh, d[G_T], vec(g, l, W_NORM), a[A_RSTD], N, C, 0.0f);
    k->clamp_bwd(kc, dh, d[G_D1], a[A_H4], N * C, G);
    ffw_bwd(g, l, 1, dh, a[A_H3]); /* dh: dL/dH3 */
    /* light convolution: H3 = m + silu(cn) Wend^T, m the masked H2 */
    gm_graph_linear_bwd(g, l, W_L_END, d[G_D1], dh, a[A_L_S], 0.0f);
    k->silu_bwd(kc, d[G_D1], d[G_D1], a[A_L_CN], N * C);
    k->clamp_fwd(kc, d[G_T], a[A_L_CV], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D2], NULL, d[G_D1], d[G_T], vec(g, l, W_L_NORM), a[A_L_RSTD2], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D2], d[G_D2], a[A_L_CV], N * C, G);
    k->conv1d_causal_bwd(kc, d[G_D1], d[G_D2], vec(g, l, W_L_CONV), g->B, g->T, C, ac->conv_kernel);
    k->glu_bwd(kc, d[G_F1], d[G_D1], a[A_L_BIG], N, C);
    gm_graph_linear_bwd(g, l, W_L_START, d[G_D2], d[G_F1], a[A_L_XN], 0.0f);
    k->scale_fwd(kc, d[G_T], a[A_H2], N * C, 1.0f);
    k->mask_rows_fwd(kc, d[G_T], g->row_valid, NULL, N, C);
    k->rmsnorm_bwd(kc, dh, NULL, d[G_D2], d[G_T], vec(g, l, W_L_PRE), a[A_L_RSTD1], N, C, 1.0f);
    k->mask_rows_fwd(kc, dh, g->row_valid, NULL, N, C); /* dh: dL/dH2 */
    /* attention: H2 = H1 + RMSNorm_post(clip(o)) */
    k->clamp_fwd(kc, d[G_T], a[A_O], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, dh, d[G_T], vec(g, l, W_A_POST), a[A_A_RSTD2], N, C, 0.0f);
    k->clamp_bwd(kc, d[G_D1], d[G_D1], a[A_O], N * C, G);
    gm_graph_linear_bwd(g, l, W_POST, d[G_DATT], d[G_D1], a[A_ATT], 0.0f);
    k->audio_attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], a[A_K], a[A_V], vec(g, l, W_POS),
                           g->row_valid, d[G_WORK], g->B, g->T, H, Dh, ac->chunk, L, R, ac->logit_cap);
    k->mul_cols_fwd(kc, d[G_DQ], d[G_DQ], vec(g, l, W_QSCALE), N * H, Dh);
    gm_graph_linear_bwd(g, l, W_Q, d[G_D2], d[G_DQ], a[A_A_XN], 0.0f);
    gm_graph_linear_bwd(g, l, W_K, d[G_D2], d[G_DK], a[A_A_XN], 1.0f);
    gm_graph_linear_bwd(g, l, W_V, d[G_D2], d[G_DV], a[A_A_XN], 1.0f);
    k->clamp_fwd(kc, d[G_T], a[A_H1], N * C, G);
    k->rmsnorm_bwd(kc, d[G_D1], NULL, d[G_D2], d[G_T], vec(g, l, W_A_PRE), a[A_A_RSTD1], N, C, 0.0f);
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
    .globals = global_weights,
    .n_globals = 3,
    .layer = layer_weights,
    .n_layer = W_COUNT,
    .acts = acts,
    .n_acts = A_COUNT,
    .grads = grads,
    .n_grads = G_COUNT,
    .embed_scale = NULL,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
};
