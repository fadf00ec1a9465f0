/*
 * gemma3n.c - Gemma 3n text decoder (Gemma3nForCausalLM, and the text part of
 * Gemma3nForConditionalGeneration): its spec, its front and head, its layer, forward and
 * backward (the backward: the chain rule through the same steps in reverse, with the kernels'
 * formulas, kernels.h; the KV-shared layers' key / value gradients are held until their source
 * layer's backward adds them to its own).
 *
 * Sources: transformers' modeling_gemma3n.py (Gemma3nTextModel, Gemma3nTextDecoderLayer,
 * Gemma3nTextAltUp, Gemma3nTextLaurelBlock, Gemma3nTextMLP, Gemma3nTextAttention) and
 * gemma_architecture.md §3. The residual stream is S = altup_inputs (4) streams of width C,
 * stored stream-major: X[l] is (S, N, C), stream j at X[l] + j N C. RMSNorm multiplies by the
 * stored weight (no 1 + w); v_norm has no weight.
 *
 * Front (after the token embeddings, scaled by sqrt(C), are in stream 0):
 *   stream i = rms_match(x0 Wproj_i^T, x0) for i = 1..S-1 (altup_projections);
 *   per-layer inputs ple (L, N, P), layer-major:
 *     ((RMSNorm_P(x0 Wple^T * C^-1/2)) + E_ple[id] * sqrt(P)) * 2^-1/2,
 *   ids past the per-layer table reading its row 0 (get_per_layer_inputs).
 * Layer l, on streams x:
 *   router(v) = tanh((RMSNorm_router(v) / C) Wrouter^T)                          (N, S)
 *   pred = x + mix(x; router(x_0) Wpred^T)        (altup_predict_fwd, coefficients (N, S, S))
 *   xn1 = RMSNorm_in(pred_0); laurel = xn1 + RMSNorm_laurel((xn1 Wl^T) Wr^T)
 *   attention as Gemma 3's, scale 1, v RMS-normed without weight, keys / values of
 *   kv_source[l] on the KV-shared last layers;
 *   xl = (pred_0 + RMSNorm_post_attn(o) + laurel) / sqrt(2)
 *   gate = xn2 Wgate^T, gaussian top-k on the sparse layers (max(0, gate - mean - z std), z the
 *   standard normal's quantile of the layer's sparsity); act = xl + RMSNorm_post_ffw(
 *   (gelu(gate) * up) Wdown^T)
 *   y = pred + (router(act) Wcorr^T + 1) (act - pred_0)                      (altup_correct_fwd)
 *   y_j += RMSNorm_ppl(((gelu((y_0 * correct_output_scale) Wgate_pl^T)) * ple_l) Wproj_pl^T)
 *   for j = 1..S-1
 * Head: (x_0 + sum_i rms_match(x_i Wunembed_i^T, x_0)) / S, then the final norm and the soft-
 * capped LM head as every Gemma.
 *
 * What gemmarun leaves out: altup_coef_clip (transformers clamps the coefficient weights to
 * +-120 in training mode only; published weights lie far inside it), LoRA on the AltUp / LAuReL
 * / per-layer linears (the targets are the attention and MLP linears, as on Gemma 3).
 */
#include "gemma_decoder.h"
#include "gm_arch.h"
#include "gm_graph.h"

#include <math.h>

/* ---- spec --------------------------------------------------------------------------------- */

enum {
    GM_GEMMA_DECODER_SLOTS,
    W_CORR_SCALE, W_CORR, W_ROUTER, W_PRED, W_ROUTER_NORM,
    W_LAUREL_L, W_LAUREL_R, W_LAUREL_NORM,
    W_PL_GATE, W_PL_PROJ, W_PL_NORM, W_COUNT
};

/* The attention and MLP weights as Gemma 3's (gemma_decoder.h; v is "own V" = "own K,V" here: no
 * Gemma 3n layer shares K as V). No GGUF names for the rest: llama.cpp's Gemma 3n files stack the
 * AltUp projections into 3-D tensors; gemmarun reads Gemma 3n from Hugging Face folders. */
#define N3(hf, kind, r, c, when, id) {hf, NULL, kind, r, c, when, id, false}
static const gm_weight_spec layer_weights[W_COUNT] = {
    GM_GEMMA_DECODER_WEIGHTS,
    [W_CORR_SCALE] = N3("altup.correct_output_scale", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1),
    [W_CORR] = N3("altup.correction_coefs.weight", GM_W_LINEAR, GM_DIM_S, GM_DIM_S, GM_WHEN_ALWAYS, -1),
    [W_ROUTER] = N3("altup.modality_router.weight", GM_W_LINEAR, GM_DIM_S, GM_DIM_C, GM_WHEN_ALWAYS, -1),
    [W_PRED] = N3("altup.prediction_coefs.weight", GM_W_LINEAR, GM_DIM_SS, GM_DIM_S, GM_WHEN_ALWAYS, -1),
    [W_ROUTER_NORM] = N3("altup.router_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1),
    [W_LAUREL_L] = N3("laurel.linear_left.weight", GM_W_LINEAR, GM_DIM_LR, GM_DIM_C, GM_WHEN_ALWAYS, -1),
    [W_LAUREL_R] = N3("laurel.linear_right.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_LR, GM_WHEN_ALWAYS, -1),
    [W_LAUREL_NORM] = N3("laurel.post_laurel_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1),
    [W_PL_GATE] = N3("per_layer_input_gate.weight", GM_W_LINEAR, GM_DIM_P, GM_DIM_C, GM_WHEN_ALWAYS, -1),
    [W_PL_PROJ] = N3("per_layer_projection.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_P, GM_WHEN_ALWAYS, -1),
    [W_PL_NORM] = N3("post_per_layer_input_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1),
};

/* Model-level weights: GM_GLOBAL_* first, then the per-layer-input table, its projection and
 * norm, the AltUp stream projections in and out (S = 4 in every published Gemma 3n; the config
 * reader refuses other counts for loading). */
enum { G_PLE_EMBED = 3, G_PLE_PROJ, G_PLE_NORM, G_ALTUP_IN, G_ALTUP_OUT = G_ALTUP_IN + 3, N_GLOBALS = G_ALTUP_OUT + 3 };
#define GG(hf, kind, r, c) {hf, NULL, kind, r, c, GM_WHEN_ALWAYS, -1, false}
static const gm_weight_spec global_weights[N_GLOBALS] = {
    GM_GEMMA_DECODER_GLOBALS,
    [G_PLE_EMBED] = GG("embed_tokens_per_layer.weight", GM_W_EMBED, GM_DIM_PV, GM_DIM_LP),
    [G_PLE_PROJ] = GG("per_layer_model_projection.weight", GM_W_LINEAR, GM_DIM_LP, GM_DIM_C),
    [G_PLE_NORM] = GG("per_layer_projection_norm.weight", GM_W_NORM, GM_DIM_P, GM_DIM_NONE),
    [G_ALTUP_IN + 0] = GG("altup_projections.0.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
    [G_ALTUP_IN + 1] = GG("altup_projections.1.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
    [G_ALTUP_IN + 2] = GG("altup_projections.2.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
    [G_ALTUP_OUT + 0] = GG("altup_unembed_projections.0.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
    [G_ALTUP_OUT + 1] = GG("altup_unembed_projections.1.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
    [G_ALTUP_OUT + 2] = GG("altup_unembed_projections.2.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_C),
};

/* One layer's record (widths per token). */
enum {
    A_RN, A_RSTDR, A_MOD, A_PCOEF, A_PRED,                 /* predict */
    A_XN1, A_RSTD1, A_LL, A_LRT, A_RSTDL, A_LAUREL,        /* input norm, LAuReL */
    A_QPRE, A_RSTDQ, A_KPRE, A_RSTDK, A_Q, A_K, A_VPRE, A_RSTDV, A_V, A_ATT, A_LSE, A_OPRE, A_RSTDPA, A_XL,
    A_XN2, A_RSTD2, A_GATE, A_GSP, A_UP, A_H, A_DPRE, A_RSTDPF, A_ACT,   /* MLP */
    A_RC, A_RSTDC, A_MODC, A_CCOEF,                        /* correct */
    A_FP, A_PG, A_PH, A_PP, A_RSTDPP, A_PN,                /* per-layer input */
    A_COUNT
};

static const gm_act_spec acts[A_COUNT] = {
    [A_RN] = {"router_in", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},      /* RMSNorm_router(x_0) / C */
    [A_RSTDR] = {"rstd_router", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_MOD] = {"modalities", GM_DIM_S, GM_WHEN_ALWAYS, GM_ACT_BOTH},    /* tanh(router) */
    [A_PCOEF] = {"pred_coefs", GM_DIM_SS, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_PRED] = {"predictions", GM_DIM_SC, GM_WHEN_ALWAYS, GM_ACT_BOTH}, /* (S, N, C) */
    [A_XN1] = {"xn1", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTD1] = {"rstd1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_LL] = {"laurel_left", GM_DIM_LR, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_LRT] = {"laurel_right", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDL] = {"rstd_laurel", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_LAUREL] = {"laurel", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},     /* xn1 + its normed branch */
    [A_QPRE] = {"q_pre", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDQ] = {"rstd_q", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_KPRE] = {"k_pre", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_RSTDK] = {"rstd_k", GM_DIM_KVH, GM_WHEN_OWN_KV, GM_ACT_TRAIN},
    [A_Q] = {"q", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_K] = {"k", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_VPRE] = {"v_pre", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_RSTDV] = {"rstd_v", GM_DIM_KVH, GM_WHEN_OWN_KV, GM_ACT_TRAIN},
    [A_V] = {"v", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_ATT] = {"att", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_LSE] = {"lse", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_OPRE] = {"o_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDPA] = {"rstd_pa", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_XL] = {"attn_laurel", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_XN2] = {"xn2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTD2] = {"rstd2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_GATE] = {"gate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_GSP] = {"gate_sparse", GM_DIM_F, GM_WHEN_SPARSE, GM_ACT_BOTH},  /* after the gaussian top-k */
    [A_UP] = {"up", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_H] = {"h", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_DPRE] = {"d_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDPF] = {"rstd_pf", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_ACT] = {"activated", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},   /* the layer's output on stream 0 */
    [A_RC] = {"router_in_c", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDC] = {"rstd_router_c", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_MODC] = {"modalities_c", GM_DIM_S, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_CCOEF] = {"corr_coefs", GM_DIM_S, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_FP] = {"first_scaled", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},   /* y_0 * correct_output_scale */
    [A_PG] = {"pl_gate", GM_DIM_P, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_PH] = {"pl_h", GM_DIM_P, GM_WHEN_ALWAYS, GM_ACT_BOTH},           /* gelu(pl_gate) * ple_l */
    [A_PP] = {"pl_proj", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDPP] = {"rstd_pl", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_PN] = {"pl_out", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
};

/* Model-level activations: the per-layer inputs, token-major work buffer then layer-major. */
enum { M_PLE_WORK, M_PLE, M_PLE_RSTD, M_HEAD_TMP, M_KS, M_VS, M_KF, M_VF, M_COUNT };
static const gm_act_spec model_acts[M_COUNT] = {
    [M_PLE_WORK] = {"ple_work", GM_DIM_LP, GM_WHEN_ALWAYS, GM_ACT_BOTH}, /* (N, L, P) */
    [M_PLE] = {"ple", GM_DIM_LP, GM_WHEN_ALWAYS, GM_ACT_BOTH},           /* (L, N, P) */
    [M_PLE_RSTD] = {"ple_rstd", GM_DIM_L, GM_WHEN_ALWAYS, GM_ACT_TRAIN}, /* (N, L): the projection's 1/rms */
    [M_HEAD_TMP] = {"head_tmp", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},  /* one unembedded stream */
    /* training under activation checkpointing, where one record serves every layer: the keys and
     * values the KV-shared layers read, kept from their source layer (sliding, full) */
    [M_KS] = {"k_shared_sliding", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [M_VS] = {"v_shared_sliding", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [M_KF] = {"k_shared_full", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [M_VF] = {"v_shared_full", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
};

/* The backward's workspace (one layer at a time), and the KV-shared layers' key / value gradients
 * waiting for their source layer (one pair per layer type: every Gemma 3n shares from one layer
 * of each type). */
enum {
    G_DPRED, G_DACT, G_DXL, G_DXN, G_DC1, G_DC2, G_DS, G_DPC, G_DP1, G_DP2, G_DP3, G_DLL,
    G_DQ, G_DATT, G_DK, G_DV, G_DGATE, G_DUP, G_DH, G_DKS, G_DVS, G_DKF, G_DVF, G_COUNT
};

static const gm_act_spec grads[G_COUNT] = {
    [G_DPRED] = {"dpred", GM_DIM_SC, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DACT] = {"dact", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DXL] = {"dxl", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DC1] = {"dtmp", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DC2] = {"dtmp2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DS] = {"dmod", GM_DIM_S, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DPC] = {"dcoef", GM_DIM_SS, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DP1] = {"dpl", GM_DIM_P, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DP2] = {"dpl2", GM_DIM_P, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DP3] = {"dple", GM_DIM_P, GM_WHEN_ALWAYS, GM_ACT_TRAIN}, /* the per-layer input's: unused (frozen) */
    [G_DLL] = {"dlaurel_left", GM_DIM_LR, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    GM_GEMMA_DECODER_GRADS,
    [G_DKS] = {"dk_shared_sliding", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DVS] = {"dv_shared_sliding", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DKF] = {"dk_shared_full", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DVF] = {"dv_shared_full", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
};

/* transformers' Gemma3nTextScaledWordEmbedding: rows times sqrt(hidden_size) in f32. */
static float embed_scale(const gm_config *c) { return sqrtf((float)c->hidden_size); }

/* ---- front and head ----------------------------------------------------------------------- */

/* Floor of a magnitude the stream projections are matched from (transformers: clamp(min=1e-5)). */
#define MAG_EPS 1e-5f

static void front(gm_graph *g) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    float *x0 = g->X[0];
    /* per-layer inputs: projection of x0, scaled and normed per layer, plus the table's rows */
    gm_ple_fwd(g, G_PLE_PROJ, G_PLE_NORM, G_PLE_EMBED, g->mrec[M_PLE_WORK], g->mrec[M_PLE], g->mrec[M_PLE_RSTD]);
    /* the other AltUp streams: projections of x0 at x0's magnitude */
    for (int64_t i = 1; i < S; i++) {
        float *xi = x0 + i * N * C;
        k->matmul_fwd(kc, xi, x0, &w->global[G_ALTUP_IN + i - 1], N, 0.0f);
        k->rms_match_fwd(kc, xi, xi, x0, N, C, MAG_EPS);
    }
}

/* Backward of front (gm_graph_backward with front_grad): g->g (S, N, C) = dL/dX[0] in; stream 0
 * += what streams 1.. and the per-layer inputs owe x0. layer_bwd left dL/d(per-layer inputs) in
 * mrec[M_PLE] (L, N, P); each projection is recomputed. */
static void front_bwd(gm_graph *g) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    const float *x0 = g->X[0];
    float *gx = g->g;
    /* the other streams: x_i = rms_match(x0 W_i^T, x0) */
    float *u = g->mrec[M_HEAD_TMP], *du = g->grad[G_DC2];
    for (int64_t i = 1; i < S; i++) {
        const gm_wview *W = &w->global[G_ALTUP_IN + i - 1];
        k->matmul_fwd(kc, u, x0, W, N, 0.0f);
        k->rms_match_bwd(kc, du, gx, gx + i * N * C, u, x0, N, C, MAG_EPS); /* x0 as the target, += */
        k->matmul_bwd_input(kc, gx, du, W, N, 1.0f);
    }
    /* the per-layer inputs: ((RMSNorm(x0 Wple^T C^-1/2) + table) 2^-1/2), layer-major */
    gm_ple_bwd(g, G_PLE_PROJ, G_PLE_NORM, g->mrec[M_PLE], g->mrec[M_PLE_WORK], g->mrec[M_PLE_RSTD], gx);
}

static void head(gm_graph *g, float *out) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    const float *x = g->X[c->n_layers];
    float *t = g->mrec[M_HEAD_TMP];
    k->scale_fwd(kc, out, x, N * C, 1.0f); /* stream 0 as it is */
    for (int64_t i = 1; i < S; i++) {
        k->matmul_fwd(kc, t, x + i * N * C, &g->w->global[G_ALTUP_OUT + i - 1], N, 0.0f);
        k->rms_match_fwd(kc, t, t, x, N, C, MAG_EPS);
        k->add_fwd(kc, out, t, N * C);
    }
    k->scale_fwd(kc, out, out, N * C, 1.0f / (float)S);
}

/* Backward of head: dout (N, C) = dL/d(head's output) in, dL/dX[L] (S, N, C) into g->g
 * (assigned); each stream's unembedding is recomputed. */
static void head_bwd(gm_graph *g, const float *dout) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    const float *x = g->X[c->n_layers];
    float *gx = g->g, *u = g->mrec[M_HEAD_TMP], *dm = g->grad[G_DC1], *du = g->grad[G_DC2];
    k->scale_fwd(kc, dm, dout, N * C, 1.0f / (float)S); /* the mean's share of every stream */
    k->scale_fwd(kc, gx, dm, N * C, 1.0f);                /* stream 0 directly */
    for (int64_t i = 1; i < S; i++) {
        const gm_wview *W = &g->w->global[G_ALTUP_OUT + i - 1];
        k->matmul_fwd(kc, u, x + i * N * C, W, N, 0.0f);
        k->rms_match_bwd(kc, du, gx, dm, u, x, N, C, MAG_EPS); /* and stream 0 as the target */
        k->matmul_bwd_input(kc, gx + i * N * C, du, W, N, 0.0f);
    }
}

/* ---- forward ------------------------------------------------------------------------------ */

/* The standard normal's quantile at p (transformers: Normal(0, 1).icdf(sparsity) in f32), by
 * Newton's method on the CDF from a point where it converges for 0 < p < 1. */
static float normal_quantile(float p) {
    double x = 0.0, target = (double)p;
    for (int i = 0; i < 60; i++) {
        double cdf = 0.5 * erfc(-x / sqrt(2.0)), pdf = exp(-0.5 * x * x) * 0.3989422804014327; /* 1/sqrt(2 pi) */
        double step = (cdf - target) / pdf;
        if (step > 2.0) step = 2.0;
        if (step < -2.0) step = -2.0;
        x -= step;
        if (fabs(step) < 1e-15) break;
    }
    return (float)x;
}

/* KV sharing in training (gemma_decoder.h): this file's record and buffers */
static const gm_kv_share KV_SHARE = {A_K, A_V, M_KS, G_DKS};

/* AltUp's router: mod (N, S) = tanh((RMSNorm_router(v) / C) Wrouter^T); rn (N, C) and rstd
 * its intermediates. */
static void router(gm_graph *g, int64_t l, float *rn, float *rstd, float *mod, const float *v) {
    const gm_config *c = g->cfg;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    g->k->rmsnorm_fwd(&g->kc, rn, rstd, v, gm_graph_norm(g, l, W_ROUTER_NORM), N, C, c->rms_norm_eps);
    g->k->scale_fwd(&g->kc, rn, rn, N * C, 1.0f / (float)C);
    gm_graph_linear(g, l, W_ROUTER, mod, rn);
    g->k->softcap_fwd(&g->kc, mod, mod, N * S, 1.0f); /* tanh */
}

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, S = c->altup_inputs, P = c->ple_dim;
    int64_t KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    float eps = c->rms_norm_eps, theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    const float *x = g->X[l];
    float *y = g->X[l + 1]; /* at inference the same buffer as x, read no more after the prediction */
    /* predict */
    router(g, l, a[A_RN], a[A_RSTDR], a[A_MOD], x);
    gm_graph_linear(g, l, W_PRED, a[A_PCOEF], a[A_MOD]);
    k->altup_predict_fwd(kc, a[A_PRED], x, a[A_PCOEF], S, N, C);
    const float *p0 = a[A_PRED];
    /* input norm and LAuReL */
    k->rmsnorm_fwd(kc, a[A_XN1], a[A_RSTD1], p0, gm_graph_norm(g, l, W_ATTN_NORM), N, C, eps);
    gm_graph_linear(g, l, W_LAUREL_L, a[A_LL], a[A_XN1]);
    gm_graph_linear(g, l, W_LAUREL_R, a[A_LRT], a[A_LL]);
    k->rmsnorm_fwd(kc, a[A_LAUREL], a[A_RSTDL], a[A_LRT], gm_graph_norm(g, l, W_LAUREL_NORM), N, C, eps);
    k->add_fwd(kc, a[A_LAUREL], a[A_XN1], N * C);
    /* attention: scale 1, v normed without weight */
    /* q, k, v read the same normed x: one call (one parallel region when decoding) */
    bool own_kv = c->kv_source[l] == l;
    const int qkv[3] = {W_Q, W_K, W_V};
    gm_graph_linear_multi(g, l, own_kv ? 3 : 1, qkv, (float *const[]){a[A_QPRE], a[A_KPRE], a[A_VPRE]}, a[A_XN1]);
    k->rmsnorm_fwd(kc, a[A_Q], a[A_RSTDQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), N * H, D, eps);
    k->rope_fwd(kc, a[A_Q], a[A_Q], g->pos, N, H, D, gm_config_rope_pairs(c, l), theta, pscale);
    const float *kk = NULL, *vv = NULL;
    if (own_kv) {
        k->rmsnorm_fwd(kc, a[A_K], a[A_RSTDK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), N * KVH, D, eps);
        k->rope_fwd(kc, a[A_K], a[A_K], g->pos, N, KVH, D, gm_config_rope_pairs(c, l), theta, pscale);
        k->rmsnorm_fwd(kc, a[A_V], a[A_RSTDV], a[A_VPRE], NULL, N * KVH, D, eps);
        kk = a[A_K], vv = a[A_V];
        gm_kv_keep(g, l, &KV_SHARE, kk, vv, N * KVH * D); /* kept apart for the shared layers */
    } else if (g->o.mode == GM_GRAPH_TRAIN) {
        float *ks, *vs;
        gm_kv_train_source(g, l, &KV_SHARE, &ks, &vs);
        kk = ks, vv = vs;
    }
    gm_graph_attention(g, l, a[A_ATT], a[A_LSE], a[A_Q], kk, vv, 1.0f);
    gm_graph_linear(g, l, W_O, a[A_OPRE], a[A_ATT]);
    k->rmsnorm_fwd(kc, a[A_XL], a[A_RSTDPA], a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), N, C, eps);
    k->add_fwd(kc, a[A_XL], p0, N * C);
    k->add_fwd(kc, a[A_XL], a[A_LAUREL], N * C);
    k->scale_fwd(kc, a[A_XL], a[A_XL], N * C, 1.0f / sqrtf(2.0f));
    /* MLP, with the gaussian top-k on the sparse layers */
    k->rmsnorm_fwd(kc, a[A_XN2], a[A_RSTD2], a[A_XL], gm_graph_norm(g, l, W_FFN_NORM), N, C, eps);
    const int gate_up[2] = {W_GATE, W_UP}; /* up does not read the sparse gate: one call */
    gm_graph_linear_multi(g, l, 2, gate_up, (float *const[]){a[A_GATE], a[A_UP]}, a[A_XN2]);
    const float *gate = a[A_GATE];
    if (c->act_sparsity[l] > 0.0f) {
        k->gaussian_topk_fwd(kc, a[A_GSP], a[A_GATE], N, F, normal_quantile(c->act_sparsity[l]));
        gate = a[A_GSP];
    }
    k->geglu_fwd(kc, a[A_H], gate, a[A_UP], N * F);
    gm_graph_linear(g, l, W_DOWN, a[A_DPRE], a[A_H]);
    k->rmsnorm_fwd(kc, a[A_ACT], a[A_RSTDPF], a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), N, C, eps);
    k->add_fwd(kc, a[A_ACT], a[A_XL], N * C);
    /* correct: all streams from the predictions and the activated stream 0 */
    router(g, l, a[A_RC], a[A_RSTDC], a[A_MODC], a[A_ACT]);
    gm_graph_linear(g, l, W_CORR, a[A_CCOEF], a[A_MODC]);
    k->altup_correct_fwd(kc, y, a[A_PRED], a[A_ACT], a[A_CCOEF], S, N, C);
    /* the per-layer input, into streams 1..S-1 */
    const float *ple = g->mrec[M_PLE] + l * N * P;
    k->mul_cols_fwd(kc, a[A_FP], y, (const float *)gm_graph_weight(g, l, W_CORR_SCALE)->data, N, C);
    gm_graph_linear(g, l, W_PL_GATE, a[A_PG], a[A_FP]);
    k->geglu_fwd(kc, a[A_PH], a[A_PG], ple, N * P);
    gm_graph_linear(g, l, W_PL_PROJ, a[A_PP], a[A_PH]);
    k->rmsnorm_fwd(kc, a[A_PN], a[A_RSTDPP], a[A_PP], gm_graph_norm(g, l, W_PL_NORM), N, C, eps);
    for (int64_t j = 1; j < S; j++) k->add_fwd(kc, y + j * N * C, a[A_PN], N * C);
}

/* ---- backward ----------------------------------------------------------------------------- */

/* Backward of router() into dv (accumulated): dmod (N, S) in, overwritten. */
static void router_bwd(gm_graph *g, int64_t l, float *dv, float *dmod, const float *rn, const float *rstd, const float *mod,
                       const float *v) {
    const gm_config *c = g->cfg;
    int64_t N = g->N, C = c->hidden_size, S = c->altup_inputs;
    float *drn = g->grad[G_DC1];
    g->k->tanh_bwd(&g->kc, dmod, dmod, mod, N * S);
    gm_graph_linear_bwd(g, l, W_ROUTER, drn, dmod, rn, 0.0f);
    g->k->scale_fwd(&g->kc, drn, drn, N * C, 1.0f / (float)C);
    g->k->rmsnorm_bwd(&g->kc, dv, NULL, drn, v, gm_graph_norm(g, l, W_ROUTER_NORM), rstd, N, C, 1.0f);
}

static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t B = g->B, T = g->T, N = g->N, C = c->hidden_size, H = c->n_heads, S = c->altup_inputs, P = c->ple_dim;
    int64_t KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    float theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    float *gy = g->g; /* dL/dX[l+1] (S, N, C); dL/dX[l] on exit */
    const float *x = g->X[l];
    /* the per-layer input went into streams 1..S-1 */
    k->scale_fwd(kc, d[G_DC2], gy + N * C, N * C, 1.0f);
    for (int64_t j = 2; j < S; j++) k->add_fwd(kc, d[G_DC2], gy + j * N * C, N * C);
    k->rmsnorm_bwd(kc, d[G_DC1], NULL, d[G_DC2], a[A_PP], gm_graph_norm(g, l, W_PL_NORM), a[A_RSTDPP], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_PL_PROJ, d[G_DP1], d[G_DC1], a[A_PH], 0.0f);
    k->geglu_bwd(kc, d[G_DP2], d[G_DP3], d[G_DP1], a[A_PG], g->mrec[M_PLE] + l * N * P, N * P);
    /* the front's backward reads dL/d(this layer's input) where it was (no later layer reads it) */
    if (g->front_grad) k->scale_fwd(kc, g->mrec[M_PLE] + l * N * P, d[G_DP3], N * P, 1.0f);
    gm_graph_linear_bwd(g, l, W_PL_GATE, d[G_DC2], d[G_DP2], a[A_FP], 0.0f);
    k->mul_cols_fwd(kc, d[G_DC2], d[G_DC2], (const float *)gm_graph_weight(g, l, W_CORR_SCALE)->data, N, C);
    k->add_fwd(kc, gy, d[G_DC2], N * C); /* gy: now dL/d(corrected streams) */
    /* correct, and its router on the activated stream */
    k->altup_correct_bwd(kc, d[G_DPRED], d[G_DACT], d[G_DS], gy, a[A_PRED], a[A_ACT], a[A_CCOEF], S, N, C);
    gm_graph_linear_bwd(g, l, W_CORR, d[G_DC2], d[G_DS], a[A_MODC], 0.0f); /* (N, S) */
    router_bwd(g, l, d[G_DACT], d[G_DC2], a[A_RC], a[A_RSTDC], a[A_MODC], a[A_ACT]);
    /* act = xl + RMSNorm_post_ffw(d_pre) */
    k->scale_fwd(kc, d[G_DXL], d[G_DACT], N * C, 1.0f);
    k->rmsnorm_bwd(kc, d[G_DC1], NULL, d[G_DACT], a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), a[A_RSTDPF], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_DOWN, d[G_DH], d[G_DC1], a[A_H], 0.0f);
    bool sparse = c->act_sparsity[l] > 0.0f;
    k->geglu_bwd(kc, d[G_DGATE], d[G_DUP], d[G_DH], sparse ? a[A_GSP] : a[A_GATE], a[A_UP], N * F);
    const float *dgate = d[G_DGATE];
    if (sparse) {
        k->gaussian_topk_bwd(kc, d[G_DH], d[G_DGATE], a[A_GATE], N, F, normal_quantile(c->act_sparsity[l]));
        dgate = d[G_DH];
    }
    gm_graph_linear_bwd(g, l, W_GATE, d[G_DXN], dgate, a[A_XN2], 0.0f);
    gm_graph_linear_bwd(g, l, W_UP, d[G_DXN], d[G_DUP], a[A_XN2], 1.0f);
    k->rmsnorm_bwd(kc, d[G_DXL], NULL, d[G_DXN], a[A_XL], gm_graph_norm(g, l, W_FFN_NORM), a[A_RSTD2], N, C, 1.0f);
    /* xl = (pred_0 + RMSNorm_post_attn(o_pre) + laurel) / sqrt(2): each part's gradient */
    k->scale_fwd(kc, d[G_DXL], d[G_DXL], N * C, 1.0f / sqrtf(2.0f));
    k->add_fwd(kc, d[G_DPRED], d[G_DXL], N * C);
    /* laurel = xn1 + RMSNorm_laurel((xn1 Wl^T) Wr^T) */
    k->rmsnorm_bwd(kc, d[G_DC1], NULL, d[G_DXL], a[A_LRT], gm_graph_norm(g, l, W_LAUREL_NORM), a[A_RSTDL], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_LAUREL_R, d[G_DLL], d[G_DC1], a[A_LL], 0.0f);
    k->scale_fwd(kc, d[G_DXN], d[G_DXL], N * C, 1.0f);
    gm_graph_linear_bwd(g, l, W_LAUREL_L, d[G_DXN], d[G_DLL], a[A_XN1], 1.0f);
    /* attention */
    k->rmsnorm_bwd(kc, d[G_DC1], NULL, d[G_DXL], a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), a[A_RSTDPA], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_O, d[G_DATT], d[G_DC1], a[A_ATT], 0.0f);
    bool full = c->layer_type[l] == GM_LAYER_FULL;
    float *kk, *vv;
    gm_kv_train_source(g, l, &KV_SHARE, &kk, &vv);
    int64_t window = full ? 0 : c->sliding_window, KW = KVH * D;
    k->attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], kk, vv, a[A_ATT], a[A_LSE],
                     gm_graph_kv_end(g, l), B, T, H, KVH, D, window, 1.0f);
    if (gm_kv_grads(g, l, &KV_SHARE, d[G_DK], d[G_DV], N * KW)) { /* a source layer: on into its projections */
        k->rope_bwd(kc, d[G_DK], d[G_DK], g->pos, N, KVH, D, gm_config_rope_pairs(c, l), theta, pscale);
        k->rmsnorm_bwd(kc, d[G_DK], NULL, d[G_DK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), a[A_RSTDK], N * KVH, D, 0.0f);
        k->rmsnorm_bwd(kc, d[G_DV], NULL, d[G_DV], a[A_VPRE], NULL, a[A_RSTDV], N * KVH, D, 0.0f);
        gm_graph_linear_bwd(g, l, W_K, d[G_DXN], d[G_DK], a[A_XN1], 1.0f);
        gm_graph_linear_bwd(g, l, W_V, d[G_DXN], d[G_DV], a[A_XN1], 1.0f);
    }
    k->rope_bwd(kc, d[G_DQ], d[G_DQ], g->pos, N, H, D, gm_config_rope_pairs(c, l), theta, pscale);
    k->rmsnorm_bwd(kc, d[G_DQ], NULL, d[G_DQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), a[A_RSTDQ], N * H, D, 0.0f);
    gm_graph_linear_bwd(g, l, W_Q, d[G_DXN], d[G_DQ], a[A_XN1], 1.0f);
    k->rmsnorm_bwd(kc, d[G_DPRED], NULL, d[G_DXN], a[A_PRED], gm_graph_norm(g, l, W_ATTN_NORM), a[A_RSTD1], N, C, 1.0f);
    /* predict, and its router on stream 0 */
    k->altup_predict_bwd(kc, gy, d[G_DPC], d[G_DPRED], x, a[A_PCOEF], S, N, C);
    gm_graph_linear_bwd(g, l, W_PRED, d[G_DC2], d[G_DPC], a[A_MOD], 0.0f); /* (N, S) */
    router_bwd(g, l, gy, d[G_DC2], a[A_RN], a[A_RSTDR], a[A_MOD], x);
}

_Static_assert((int)W_COUNT <= GM_MAX_LAYER_WEIGHTS, "its slots fit GM_MAX_LAYER_WEIGHTS (gm_arch.h)");

const gm_arch_def gm_arch_gemma3n = {
    .id = GM_ARCH_GEMMA3N,
    .name = "gemma3n",
    .layers_prefix = "layers.",
    .globals = global_weights,
    .n_globals = N_GLOBALS,
    .layer = layer_weights,
    .n_layer = W_COUNT,
    .acts = acts,
    .n_acts = A_COUNT,
    .grads = grads,
    .n_grads = G_COUNT,
    .embed_scale = embed_scale,
    .altup = true,
    .model_acts = model_acts,
    .n_model_acts = M_COUNT,
    .front = front,
    .front_bwd = front_bwd,
    .head = head,
    .head_bwd = head_bwd,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
    .kv_sharing_bwd = true,
};
