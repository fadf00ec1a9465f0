/*
 * gemma4_vision.c - Gemma 4's vision tower (Gemma4VisionModel) and the embedder that maps its soft
 * tokens into the text width (Gemma4MultimodalEmbedder "embed_vision"): spec, encoder layer
 * (forward and backward), front and head.
 *
 * Sources: transformers 5.24's modeling_gemma4.py (Gemma4VisionPatchEmbedder, Gemma4VisionEncoder-
 * Layer, Gemma4VisionAttention, Gemma4VisionRotaryEmbedding, Gemma4ClippableLinear,
 * Gemma4VisionPooler, Gemma4VisionModel, Gemma4MultimodalEmbedder) and gemma_architecture.md §4.5.
 *   front: X0 = (2 (x - 0.5)) Wpatch^T + table[0][col] + table[1][row], patches (N, p p 3) in
 *          (y, x, channel) order (the processor's convert_image_to_patches), no bias;
 *   layer: xn1 = RMSNorm_in(x); q = RoPE2(RMSNorm_q(clin_q(xn1))), k likewise, v = RMSNorm(clin_v(xn1))
 *          without weight; att = softmax(q k^T) v over the image's patches (scale 1, no mask);
 *          x_mid = x + RMSNorm_post_attn(clin_o(att));
 *          x_out = x_mid + RMSNorm_post_ffw(clin_down(gelu_tanh(clin_gate(xn2)) * clin_up(xn2))),
 *          xn2 = RMSNorm_pre_ffw(x_mid);
 *          clin(u) = clamp(clamp(u, in_min, in_max) W^T, out_min, out_max) with the checkpoint's four
 *          bounds per linear (use_clipped_linears; W^T alone without them). LoRA adapts W inside the
 *          clamps (PEFT's target "q_proj.linear": the adapter sees the clamped input and its output is
 *          clamped with the base's), never around them (the story's failure: an adapter on the whole
 *          Gemma4ClippableLinear bypasses the clipping);
 *          RoPE2: the first half of each head rotated by its patch's column, the second by its row
 *          (base 100, each half as a head of width D/2: the "axial" H-H-W-W layout);
 *   head:  each soft token the average of its k x k cell of patches (the cells of each image's own
 *          grid, row-major: pool_gather_fwd on the caller's index table), times sqrt(C) (f32),
 *          (pooled - std_bias) * std_scale when standardize, RMSNorm without weight,
 *          embedding_projection to C_text.
 * Images of different grids run as one batch padded to the largest (gm_graph_begin_encoder_lens:
 * each image's keys end at its own patches; padding rows are never pooled, and get zero gradients).
 * RMSNorm weights are used as stored (Gemma4RMSNorm: no 1 + w). Its linears can carry LoRA adapters
 * like any other graph's; the patch embedding, tables and embedder are frozen.
 */
#include "gm_arch.h"
#include "gm_graph.h"

#include <math.h>

/* ---- spec --------------------------------------------------------------------------------- */

/* The seven clipped linears, and their bounds' slots: CLIP0 + 4 i + {in_min, in_max, out_min, out_max} */
enum { L_Q, L_K, L_V, L_O, L_GATE, L_UP, L_DOWN, N_LIN };

enum {
    W_IN_NORM, W_Q, W_K, W_V, W_O, W_Q_NORM, W_K_NORM, W_POST_ATTN_NORM, W_FFN_NORM, W_POST_FFW_NORM, W_GATE, W_UP, W_DOWN,
    W_CLIP0, W_COUNT = W_CLIP0 + 4 * N_LIN
};

static const int LIN_SLOT[N_LIN] = {W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN};

#define NRM(hf, r) {hf, NULL, GM_W_NORM, r, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false, false}
#define LIN(hf, r, c, id) {hf, NULL, GM_W_LINEAR, r, c, GM_WHEN_ALWAYS, id, false, false, false}
#define CLIP(m, b) {m "." b, NULL, GM_W_VEC, GM_DIM_1, GM_DIM_NONE, GM_WHEN_CLIPPED, -1, false, false, false}
#define CLIPS(m) CLIP(m, "input_min"), CLIP(m, "input_max"), CLIP(m, "output_min"), CLIP(m, "output_max")
/* lora_id 48..54: a tower adapter's RNG streams differ from the decoder's (0..15), SigLIP's (16..21)
 * and the audio conformer's (32..) */
static const gm_weight_spec layer_weights[W_COUNT] = {
    [W_IN_NORM] = NRM("input_layernorm.weight", GM_DIM_C),
    [W_Q] = LIN("self_attn.q_proj.linear.weight", GM_DIM_QW, GM_DIM_C, 48),
    [W_K] = LIN("self_attn.k_proj.linear.weight", GM_DIM_KW, GM_DIM_C, 49),
    [W_V] = LIN("self_attn.v_proj.linear.weight", GM_DIM_KW, GM_DIM_C, 50),
    [W_O] = LIN("self_attn.o_proj.linear.weight", GM_DIM_C, GM_DIM_QW, 51),
    [W_Q_NORM] = NRM("self_attn.q_norm.weight", GM_DIM_D),
    [W_K_NORM] = NRM("self_attn.k_norm.weight", GM_DIM_D),
    [W_POST_ATTN_NORM] = NRM("post_attention_layernorm.weight", GM_DIM_C),
    [W_FFN_NORM] = NRM("pre_feedforward_layernorm.weight", GM_DIM_C),
    [W_POST_FFW_NORM] = NRM("post_feedforward_layernorm.weight", GM_DIM_C),
    [W_GATE] = LIN("mlp.gate_proj.linear.weight", GM_DIM_F, GM_DIM_C, 52),
    [W_UP] = LIN("mlp.up_proj.linear.weight", GM_DIM_F, GM_DIM_C, 53),
    [W_DOWN] = LIN("mlp.down_proj.linear.weight", GM_DIM_C, GM_DIM_F, 54),
    CLIPS("self_attn.q_proj"), CLIPS("self_attn.k_proj"), CLIPS("self_attn.v_proj"), CLIPS("self_attn.o_proj"),
    CLIPS("mlp.gate_proj"), CLIPS("mlp.up_proj"), CLIPS("mlp.down_proj"),
};

/* Model-level weights below the tower's prefix ("model.vision_tower."); the embedder's below the
 * model's root (top_level). The common slots: the 2-D position table [2, T, C] viewed as (2 T, C)
 * rows (x's then y's), no final norm, the "head" tied to the table (never read). */
static const gm_weight_spec global_weights[GM_G4V_GLOBALS] = {
    [GM_GLOBAL_EMBED] = {"patch_embedder.position_embedding_table", NULL, GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_ALWAYS, -1,
                         false, false, false},
    [GM_GLOBAL_FINAL_NORM] = {"(none)", NULL, GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ABSENT, -1, false, false, false},
    [GM_GLOBAL_LM_HEAD] = {"patch_embedder.position_embedding_table", NULL, GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED,
                           -1, false, false, false},
    [GM_G4V_PATCH] = {"patch_embedder.input_proj.weight", NULL, GM_W_LINEAR, GM_DIM_C, GM_DIM_PATCH, GM_WHEN_ALWAYS, -1, false,
                      false, false},
    [GM_G4V_STD_BIAS] = {"std_bias", NULL, GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_STANDARDIZE, -1, false, false, false},
    [GM_G4V_STD_SCALE] = {"std_scale", NULL, GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_STANDARDIZE, -1, false, false, false},
    [GM_G4V_PROJ] = {"embed_vision.embedding_projection.weight", NULL, GM_W_LINEAR, GM_DIM_OUT, GM_DIM_C, GM_WHEN_ALWAYS, -1,
                     true, false, false},
};

/* One layer's record. The clipped linears keep their clamped inputs (what W and its adapter
 * multiplied) and, for the backward, their outputs before the output clamp. */
enum {
    A_XN1, A_RSTD1, A_QIN, A_KIN, A_VIN, A_QRAW, A_QPRE, A_RSTDQ, A_Q, A_KRAW, A_KPRE, A_RSTDK, A_K, A_VRAW, A_VPRE, A_RSTDV,
    A_V, A_ATT, A_LSE, A_OIN, A_ORAW, A_OPRE, A_RSTDPA, A_XMID, A_XN2, A_RSTD2, A_GIN, A_UIN, A_GRAW, A_GATE, A_URAW, A_UP,
    A_H, A_DIN, A_DRAW, A_DPRE, A_RSTDPF, A_COUNT
};

#define ACT(n, w, when, use) {n, w, when, use}
static const gm_act_spec acts[A_COUNT] = {
    [A_XN1] = ACT("xn1", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTD1] = ACT("rstd1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_QIN] = ACT("q_in", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_KIN] = ACT("k_in", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_VIN] = ACT("v_in", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_QRAW] = ACT("q_raw", GM_DIM_QW, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_QPRE] = ACT("q_pre", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTDQ] = ACT("rstd_q", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_Q] = ACT("q", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_KRAW] = ACT("k_raw", GM_DIM_KW, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_KPRE] = ACT("k_pre", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTDK] = ACT("rstd_k", GM_DIM_KVH, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_K] = ACT("k", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_VRAW] = ACT("v_raw", GM_DIM_KW, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_VPRE] = ACT("v_pre", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTDV] = ACT("rstd_v", GM_DIM_KVH, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_V] = ACT("v", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_ATT] = ACT("att", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_LSE] = ACT("lse", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_BOTH), /* the training kernel writes it in both modes */
    [A_OIN] = ACT("o_in", GM_DIM_QW, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_ORAW] = ACT("o_raw", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_OPRE] = ACT("o_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTDPA] = ACT("rstd_pa", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_XMID] = ACT("x_mid", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_XN2] = ACT("xn2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTD2] = ACT("rstd2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [A_GIN] = ACT("gate_in", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_UIN] = ACT("up_in", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_GRAW] = ACT("gate_raw", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_GATE] = ACT("gate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_URAW] = ACT("up_raw", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_UP] = ACT("up", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_H] = ACT("h", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_DIN] = ACT("down_in", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_BOTH),
    [A_DRAW] = ACT("down_raw", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [A_DPRE] = ACT("d_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [A_RSTDPF] = ACT("rstd_pf", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
};

/* Model-level: the patches' grid positions (int32 in float-sized slots, columns then rows) and the
 * front's second table gather. */
enum { M_POS, M_TMP, M_COUNT };
static const gm_act_spec model_acts[M_COUNT] = {
    [M_POS] = ACT("patch_xy", GM_DIM_2, GM_WHEN_ALWAYS, GM_ACT_BOTH),
    [M_TMP] = ACT("pos_rows", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH),
};

enum { G_DTMP, G_DXN, G_DQ, G_DK, G_DV, G_DATT, G_DGATE, G_DUP, G_DH, G_DC, G_DQW, G_DF, G_COUNT };
static const gm_act_spec grads[G_COUNT] = {
    [G_DTMP] = ACT("dtmp", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DXN] = ACT("dxn", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DQ] = ACT("dq", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DK] = ACT("dk", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DV] = ACT("dv", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DATT] = ACT("datt", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DGATE] = ACT("dgate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DUP] = ACT("dup", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    [G_DH] = ACT("dh", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN),
    /* a clipped linear's input gradient before its input clamp masks it, per input width */
    [G_DC] = ACT("din_c", GM_DIM_C, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [G_DQW] = ACT("din_qw", GM_DIM_QW, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
    [G_DF] = ACT("din_f", GM_DIM_F, GM_WHEN_CLIPPED, GM_ACT_TRAIN),
};

/* ---- the clipped linear -------------------------------------------------------------------- */

/* out (N, n_out) = clin(in (N, n_in)) of linear `lin` (see the top). Clipped: cin (N, n_in) keeps
 * the clamped input, raw (training: the output before its clamp; NULL at inference). */
static void clin_fwd(gm_graph *g, int64_t l, int lin, float *out, float *raw, float *cin, const float *in, int64_t n_in,
                     int64_t n_out) {
    if (!g->cfg->vision.clipped) gm_graph_linear(g, l, LIN_SLOT[lin], out, in);
    else gm_graph_linear_clipped(g, l, LIN_SLOT[lin], W_CLIP0 + 4 * lin, out, raw, cin, in, n_in, n_out);
}

/* Backward of clin_fwd: dy (N, n_out) = dL/dout in (overwritten: masked by the output clamp);
 * dx (N, n_in) = beta dx + dL/din; the adapter's gradients accumulate. tmp (N, n_in) workspace. */
static void clin_bwd(gm_graph *g, int64_t l, int lin, float *dx, float *dy, const float *raw, const float *cin,
                     const float *in, float *tmp, int64_t n_in, int64_t n_out, float beta) {
    if (!g->cfg->vision.clipped) gm_graph_linear_bwd(g, l, LIN_SLOT[lin], dx, dy, in, beta);
    else gm_graph_linear_clipped_bwd(g, l, LIN_SLOT[lin], W_CLIP0 + 4 * lin, dx, dy, dy, raw, cin, in, tmp, n_in, n_out, beta);
}

/* ---- layer -------------------------------------------------------------------------------- */

static const int32_t *pos_x(const gm_graph *g) { return (const int32_t *)g->mrec[M_POS]; }
static const int32_t *pos_y(const gm_graph *g) { return (const int32_t *)g->mrec[M_POS] + g->N; }

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    bool train = g->o.mode == GM_GRAPH_TRAIN;
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim, F = c->intermediate_size;
    int64_t QW = H * D, KW = KVH * D;
    float eps = c->rms_norm_eps, theta = c->rope_theta[l];
    const float *x = g->X[l];
    float *y = g->X[l + 1];
#define RAW(i) (train ? a[i] : NULL)
    k->rmsnorm_fwd(kc, a[A_XN1], a[A_RSTD1], x, gm_graph_norm(g, l, W_IN_NORM), N, C, eps);
    clin_fwd(g, l, L_Q, a[A_QPRE], RAW(A_QRAW), a[A_QIN], a[A_XN1], C, QW);
    k->rmsnorm_fwd(kc, a[A_Q], a[A_RSTDQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), N * H, D, eps);
    k->rope2d_fwd(kc, a[A_Q], a[A_Q], pos_x(g), pos_y(g), N, H, D, theta);
    clin_fwd(g, l, L_K, a[A_KPRE], RAW(A_KRAW), a[A_KIN], a[A_XN1], C, KW);
    k->rmsnorm_fwd(kc, a[A_K], a[A_RSTDK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), N * KVH, D, eps);
    k->rope2d_fwd(kc, a[A_K], a[A_K], pos_x(g), pos_y(g), N, KVH, D, theta);
    clin_fwd(g, l, L_V, a[A_VPRE], RAW(A_VRAW), a[A_VIN], a[A_XN1], C, KW);
    k->rmsnorm_fwd(kc, a[A_V], a[A_RSTDV], a[A_VPRE], NULL, N * KVH, D, eps);
    gm_graph_attention(g, l, a[A_ATT], a[A_LSE], a[A_Q], a[A_K], a[A_V], 1.0f);
    clin_fwd(g, l, L_O, a[A_OPRE], RAW(A_ORAW), a[A_OIN], a[A_ATT], QW, C);
    k->rmsnorm_fwd(kc, a[A_XMID], a[A_RSTDPA], a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), N, C, eps);
    k->add_fwd(kc, a[A_XMID], x, N * C);
    k->rmsnorm_fwd(kc, a[A_XN2], a[A_RSTD2], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), N, C, eps);
    clin_fwd(g, l, L_GATE, a[A_GATE], RAW(A_GRAW), a[A_GIN], a[A_XN2], C, F);
    clin_fwd(g, l, L_UP, a[A_UP], RAW(A_URAW), a[A_UIN], a[A_XN2], C, F);
    k->geglu_fwd(kc, a[A_H], a[A_GATE], a[A_UP], N * F);
    clin_fwd(g, l, L_DOWN, a[A_DPRE], RAW(A_DRAW), a[A_DIN], a[A_H], F, C);
    k->rmsnorm_fwd(kc, y, a[A_RSTDPF], a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), N, C, eps);
    k->add_fwd(kc, y, a[A_XMID], N * C);
#undef RAW
}

/* g->g: dL/dX[l+1] in, dL/dX[l] out. Only adapters on the linears learn. */
static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t B = g->B, T = g->T, N = g->N, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    int64_t F = c->intermediate_size, QW = H * D, KW = KVH * D;
    float theta = c->rope_theta[l];
    float *gy = g->g;
    /* MLP: x_out = x_mid + RMSNorm_post_ffw(clin_down(gelu(clin_gate(xn2)) * clin_up(xn2))) */
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gy, a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), a[A_RSTDPF], N, C, 0.0f);
    clin_bwd(g, l, L_DOWN, d[G_DH], d[G_DTMP], a[A_DRAW], a[A_DIN], a[A_H], d[G_DF], F, C, 0.0f);
    k->geglu_bwd(kc, d[G_DGATE], d[G_DUP], d[G_DH], a[A_GATE], a[A_UP], N * F);
    clin_bwd(g, l, L_GATE, d[G_DXN], d[G_DGATE], a[A_GRAW], a[A_GIN], a[A_XN2], d[G_DC], C, F, 0.0f);
    clin_bwd(g, l, L_UP, d[G_DXN], d[G_DUP], a[A_URAW], a[A_UIN], a[A_XN2], d[G_DC], C, F, 1.0f);
    k->rmsnorm_bwd(kc, gy, NULL, d[G_DXN], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), a[A_RSTD2], N, C, 1.0f);
    /* attention: x_mid = x + RMSNorm_post_attn(clin_o(att)) */
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gy, a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), a[A_RSTDPA], N, C, 0.0f);
    clin_bwd(g, l, L_O, d[G_DATT], d[G_DTMP], a[A_ORAW], a[A_OIN], a[A_ATT], d[G_DQW], QW, C, 0.0f);
    k->attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], a[A_K], a[A_V], a[A_ATT], a[A_LSE], g->kv_end, B, T, H,
                     KVH, D, 0, 1.0f);
    k->rope2d_bwd(kc, d[G_DQ], d[G_DQ], pos_x(g), pos_y(g), N, H, D, theta);
    k->rmsnorm_bwd(kc, d[G_DQ], NULL, d[G_DQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), a[A_RSTDQ], N * H, D, 0.0f);
    k->rope2d_bwd(kc, d[G_DK], d[G_DK], pos_x(g), pos_y(g), N, KVH, D, theta);
    k->rmsnorm_bwd(kc, d[G_DK], NULL, d[G_DK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), a[A_RSTDK], N * KVH, D, 0.0f);
    k->rmsnorm_bwd(kc, d[G_DV], NULL, d[G_DV], a[A_VPRE], NULL, a[A_RSTDV], N * KVH, D, 0.0f);
    clin_bwd(g, l, L_Q, d[G_DXN], d[G_DQ], a[A_QRAW], a[A_QIN], a[A_XN1], d[G_DC], C, QW, 0.0f);
    clin_bwd(g, l, L_K, d[G_DXN], d[G_DK], a[A_KRAW], a[A_KIN], a[A_XN1], d[G_DC], C, KW, 1.0f);
    clin_bwd(g, l, L_V, d[G_DXN], d[G_DV], a[A_VRAW], a[A_VIN], a[A_XN1], d[G_DC], C, KW, 1.0f);
    k->rmsnorm_bwd(kc, gy, NULL, d[G_DXN], g->X[l], gm_graph_norm(g, l, W_IN_NORM), a[A_RSTD1], N, C, 1.0f);
}

/* ---- front and head ----------------------------------------------------------------------- */

void gm_gemma4_vision_embed(gm_graph *g, const float *patches, const int32_t *xy) {
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = g->cfg->hidden_size, rows = g->cfg->vision.pos_table;
    gm_backend_upload(g->be, g->mrec[M_POS], xy, (size_t)(2 * N) * sizeof(int32_t));
    /* the table's x rows are its first `rows`, its y rows the next */
    gm_wview tx = w->global[GM_GLOBAL_EMBED], ty = tx;
    tx.rows = ty.rows = rows;
    ty.data = (const uint8_t *)ty.data + (size_t)rows * ty.row_bytes;
    g->k->matmul_fwd(kc, g->X[0], patches, &w->global[GM_G4V_PATCH], N, 0.0f);
    g->k->embed_fwd(kc, g->mrec[M_TMP], pos_x(g), &tx, N, 1.0f);
    g->k->add_fwd(kc, g->X[0], g->mrec[M_TMP], N * C);
    g->k->embed_fwd(kc, g->mrec[M_TMP], pos_y(g), &ty, N, 1.0f);
    g->k->add_fwd(kc, g->X[0], g->mrec[M_TMP], N * C);
}

void gm_gemma4_vision_head(gm_graph *g, const gm_siglip_head_bufs *b) {
    const gm_kctx *kc = &g->kc;
    const gm_config *c = g->cfg;
    const gm_weights *w = g->w;
    int64_t C = c->hidden_size, R = b->rows, kk = c->vision.pool * c->vision.pool;
    g->k->pool_gather_fwd(kc, b->pooled, g->X[c->n_layers], b->pool_src, R, kk, C, 1.0f / (float)kk);
    g->k->scale_fwd(kc, b->pooled, b->pooled, R * C, sqrtf((float)C));
    if (c->vision.standardize) {
        g->k->bias_fwd(kc, b->pooled, b->std_nbias, R, C);
        g->k->mul_cols_fwd(kc, b->pooled, b->pooled, (const float *)w->global[GM_G4V_STD_SCALE].data, R, C);
    }
    g->k->rmsnorm_fwd(kc, b->normed, b->rstd_mm, b->pooled, NULL, R, C, c->vision.layer_norm_eps);
    g->k->matmul_fwd(kc, b->out, b->normed, &w->global[GM_G4V_PROJ], R, 0.0f);
}

void gm_gemma4_vision_head_bwd(gm_graph *g, const gm_siglip_head_bufs *b) {
    const gm_kctx *kc = &g->kc;
    const gm_config *c = g->cfg;
    const gm_weights *w = g->w;
    int64_t C = c->hidden_size, R = b->rows, kk = c->vision.pool * c->vision.pool;
    g->k->matmul_bwd_input(kc, b->dnormed, b->dout, &w->global[GM_G4V_PROJ], R, 0.0f);
    g->k->rmsnorm_bwd(kc, b->dpooled, NULL, b->dnormed, b->pooled, NULL, b->rstd_mm, R, C, 0.0f);
    if (c->vision.standardize)
        g->k->mul_cols_fwd(kc, b->dpooled, b->dpooled, (const float *)w->global[GM_G4V_STD_SCALE].data, R, C);
    g->k->scale_fwd(kc, b->dpooled, b->dpooled, R * C, sqrtf((float)C));
    g->k->pool_gather_bwd(kc, g->g, b->dpooled, b->pool_src, R, kk, g->N, C, 1.0f / (float)kk);
}

_Static_assert((int)W_COUNT <= GM_MAX_LAYER_WEIGHTS, "its slots fit GM_MAX_LAYER_WEIGHTS (gm_arch.h)");

const gm_arch_def gm_arch_gemma4_vision = {
    .id = GM_ARCH_GEMMA4_VISION,
    .name = "gemma4_vision",
    .layers_prefix = "encoder.layers.",
    .encoder = true,
    .globals = global_weights,
    .n_globals = GM_G4V_GLOBALS,
    .layer = layer_weights,
    .n_layer = W_COUNT,
    .acts = acts,
    .n_acts = A_COUNT,
    .grads = grads,
    .n_grads = G_COUNT,
    .embed_scale = NULL,
    .model_acts = model_acts,
    .n_model_acts = M_COUNT,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
};
