/*
 * gemma4.c - Gemma 4 text decoder (Gemma4ForCausalLM, and the text part of
 * Gemma4ForConditionalGeneration): its spec, its front (the per-layer inputs), its layer, forward
 * and backward (the chain rule through the same steps in reverse, with the kernels' formulas,
 * kernels.h; the KV-shared layers' key / value gradients are held until their source layer's
 * backward adds them to its own, as in gemma3n.c).
 *
 * Sources: transformers' modeling_gemma4.py (Gemma4TextModel, Gemma4TextDecoderLayer,
 * Gemma4TextAttention, Gemma4TextMLP) and gemma_architecture.md §4.1-4.4. One residual stream of
 * width C; RMSNorm multiplies by the stored weight (no 1 + w); v_norm has no weight.
 *
 * Front: the per-layer inputs ple (L, N, P) of the E-models, as Gemma 3n's (gemma_ple.c); none on
 * the large models (hidden_size_per_layer_input 0).
 * Layer l, on x (N, C), D and KVH the layer's own (full layers: global_head_dim, and on k_eq_v
 * models num_global_key_value_heads):
 *   xn1 = RMSNorm_in(x); q = RoPE(RMSNorm_q(xn1 Wq^T)) per head;
 *   own keys: k_pre = xn1 Wk^T; v_pre = k_pre on a k_eq_v full layer, else xn1 Wv^T;
 *             k = RoPE(RMSNorm_k(k_pre)); v = RMSNorm(v_pre) without weight, unrotated;
 *   KV-shared layers (the last num_kv_shared_layers) read kv_source[l]'s k and v;
 *   RoPE: theta 10k over the whole head on sliding layers, 1M on full layers with only the first
 *   partial_rotary_factor of the pairs rotating ("proportional", §4.3);
 *   att = attention(q, k, v; causal, window on sliding layers, scale 1: no 1/sqrt(d));
 *   x_mid = x + RMSNorm_post_attn(att Wo^T);
 *   x_ffn = x_mid + RMSNorm_post_ffw(((gelu_tanh(xn2 Wgate^T) * (xn2 Wup^T)) Wdown^T), xn2 =
 *   RMSNorm_pre_ffw(x_mid) (the KV-shared layers' MLP twice as wide on E2B: the config's ffn_dim);
 *   with per-layer inputs: x_ple = x_ffn + RMSNorm_ppl((gelu_tanh(x_ffn Wgate_pl^T) * ple_l) Wproj_pl^T);
 *   y = layer_scalar * x_ple.
 * Head: the final norm and the soft-capped LM head as every Gemma (gm_graph, gm_decoder).
 *
 * 26B-A4B's mixture of experts (enable_moe_block): beside the dense MLP, on x_mid,
 *   router: p = softmax(((RMSNorm(x_mid) * scale) C^-1/2) Wr^T) over E; the top K, renormalized to
 *   sum 1, times per_expert_scale; the experts' GeGLU MLPs (stacked gate_up [E, 2 Fe, C], down
 *   [E, C, Fe]) on RMSNorm_pre_ffw_2(x_mid), their weighted sum y;
 *   x_ffn = x_mid + RMSNorm_post_ffw(RMSNorm_post_ffw_1(d_pre) + RMSNorm_post_ffw_2(y)).
 * A token's K choices are "slots" grouped by expert on the host (gm_graph_moe_group) so that each
 * expert multiplies its rows at once; the experts are frozen (no LoRA on them), but gradients run
 * through them and through the router's weights to x_mid.
 *
 * What gemmarun leaves out here: LoRA on the per-layer-input linears, the router and the experts
 * (the targets are the attention and MLP linears, as on Gemma 3 and 3n).
 */
#include "gemma_decoder.h"
#include "gm_arch.h"
#include "gm_graph.h"

#include <math.h>

/* ---- spec --------------------------------------------------------------------------------- */

enum {
    GM_GEMMA_DECODER_SLOTS, W_PL_GATE, W_PL_PROJ, W_PL_NORM, W_LAYER_SCALAR,
    W_ROUTER, W_ROUTER_SCALE, W_EXPERT_SCALE, W_EXPERTS_GU, W_EXPERTS_DOWN, W_FFN_NORM_2, W_POST_FFW_NORM_1,
    W_POST_FFW_NORM_2, W_COUNT
};

/* The attention and MLP weights as Gemma 3's (gemma_decoder.h: v only where the layer computes its
 * own values, not on a k_eq_v full layer), then the per-layer-input branch and the layer's output
 * scalar (a buffer of one value: transformers' Gemma4TextDecoderLayer.layer_scalar). No GGUF
 * names for these: gemmarun reads Gemma 4 from Hugging Face folders. */
#define N4(hf, kind, r, c, when) {hf, NULL, kind, r, c, when, -1, false}
static const gm_weight_spec layer_weights[W_COUNT] = {
    GM_GEMMA_DECODER_WEIGHTS,
    [W_PL_GATE] = N4("per_layer_input_gate.weight", GM_W_LINEAR, GM_DIM_P, GM_DIM_C, GM_WHEN_PLE),
    [W_PL_PROJ] = N4("per_layer_projection.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_P, GM_WHEN_PLE),
    [W_PL_NORM] = N4("post_per_layer_input_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_PLE),
    [W_LAYER_SCALAR] = N4("layer_scalar", GM_W_VEC, GM_DIM_1, GM_DIM_NONE, GM_WHEN_ALWAYS),
    /* the mixture of experts beside the MLP (26B-A4B): router, per-expert scales, the experts'
     * stacked [E, 2 Fe, C] gate-and-up and [E, C, Fe] down matrices, three more norms */
    [W_ROUTER] = N4("router.proj.weight", GM_W_LINEAR, GM_DIM_E, GM_DIM_C, GM_WHEN_MOE),
    [W_ROUTER_SCALE] = N4("router.scale", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_MOE),
    [W_EXPERT_SCALE] = N4("router.per_expert_scale", GM_W_VEC, GM_DIM_E, GM_DIM_NONE, GM_WHEN_MOE),
    [W_EXPERTS_GU] = {"experts.gate_up_proj", NULL, GM_W_LINEAR, GM_DIM_E2FE, GM_DIM_C, GM_WHEN_MOE, -1, false, false, true},
    [W_EXPERTS_DOWN] = {"experts.down_proj", NULL, GM_W_LINEAR, GM_DIM_EC, GM_DIM_FE, GM_WHEN_MOE, -1, false, false, true},
    [W_FFN_NORM_2] = N4("pre_feedforward_layernorm_2.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_MOE),
    [W_POST_FFW_NORM_1] = N4("post_feedforward_layernorm_1.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_MOE),
    [W_POST_FFW_NORM_2] = N4("post_feedforward_layernorm_2.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_MOE),
};

/* Model-level weights: GM_GLOBAL_* first, then the per-layer-input table, its projection and norm
 * (E-models only). */
enum { G_PLE_EMBED = 3, G_PLE_PROJ, G_PLE_NORM, N_GLOBALS };
#define GG(hf, kind, r, c) {hf, NULL, kind, r, c, GM_WHEN_PLE, -1, false}
static const gm_weight_spec global_weights[N_GLOBALS] = {
    GM_GEMMA_DECODER_GLOBALS,
    [G_PLE_EMBED] = GG("embed_tokens_per_layer.weight", GM_W_EMBED, GM_DIM_PV, GM_DIM_LP),
    [G_PLE_PROJ] = GG("per_layer_model_projection.weight", GM_W_LINEAR, GM_DIM_LP, GM_DIM_C),
    [G_PLE_NORM] = GG("per_layer_projection_norm.weight", GM_W_NORM, GM_DIM_P, GM_DIM_NONE),
};

/* One layer's record (widths per token). */
enum {
    A_XN1, A_RSTD1, A_QPRE, A_RSTDQ, A_KPRE, A_RSTDK, A_Q, A_K, A_VPRE, A_RSTDV, A_V, A_ATT, A_LSE, A_OPRE, A_RSTDPA,
    A_XMID, A_XN2, A_RSTD2, A_GATE, A_UP, A_H, A_DPRE, A_RSTDPF, A_XFFN, A_PG, A_PH, A_PP, A_RSTDPP,
    A_D1, A_RSTDP1, A_RN, A_RSTDR, A_PROBS, A_RIDX, A_RW, A_SLOT, A_SEL, A_XE, A_RSTDE, A_EG, A_EU, A_EH, A_Y2, A_RSTDP2,
    A_DSUM, A_COUNT
};

static const gm_act_spec acts[A_COUNT] = {
    [A_XN1] = {"xn1", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTD1] = {"rstd1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_QPRE] = {"q_pre", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDQ] = {"rstd_q", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_KPRE] = {"k_pre", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},   /* also v_pre on a k_eq_v layer */
    [A_RSTDK] = {"rstd_k", GM_DIM_KVH, GM_WHEN_OWN_KV, GM_ACT_TRAIN},
    [A_Q] = {"q", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_K] = {"k", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_VPRE] = {"v_pre", GM_DIM_KW, GM_WHEN_OWN_V, GM_ACT_BOTH},
    [A_RSTDV] = {"rstd_v", GM_DIM_KVH, GM_WHEN_OWN_KV, GM_ACT_TRAIN},
    [A_V] = {"v", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_ATT] = {"att", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_LSE] = {"lse", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_OPRE] = {"o_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDPA] = {"rstd_pa", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_XMID] = {"x_mid", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_XN2] = {"xn2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTD2] = {"rstd2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_GATE] = {"gate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_UP] = {"up", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_H] = {"h", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_DPRE] = {"d_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTDPF] = {"rstd_pf", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_XFFN] = {"x_ffn", GM_DIM_C, GM_WHEN_PLE, GM_ACT_BOTH},   /* residual after the MLP (the branch's input) */
    [A_PG] = {"pl_gate", GM_DIM_P, GM_WHEN_PLE, GM_ACT_BOTH},
    [A_PH] = {"pl_h", GM_DIM_P, GM_WHEN_PLE, GM_ACT_BOTH},      /* gelu(pl_gate) * ple_l */
    [A_PP] = {"pl_proj", GM_DIM_C, GM_WHEN_PLE, GM_ACT_BOTH},
    [A_RSTDPP] = {"rstd_pl", GM_DIM_1, GM_WHEN_PLE, GM_ACT_TRAIN},
    /* the mixture of experts: int32 routing tables live in float-sized slots (same width) */
    [A_D1] = {"dense_out", GM_DIM_C, GM_WHEN_MOE, GM_ACT_BOTH},      /* RMSNorm_post_ffw_1(d_pre) */
    [A_RSTDP1] = {"rstd_pf1", GM_DIM_1, GM_WHEN_MOE, GM_ACT_TRAIN},
    [A_RN] = {"router_in", GM_DIM_C, GM_WHEN_MOE, GM_ACT_BOTH},
    [A_RSTDR] = {"rstd_router", GM_DIM_1, GM_WHEN_MOE, GM_ACT_TRAIN},
    [A_PROBS] = {"router_probs", GM_DIM_E, GM_WHEN_MOE, GM_ACT_BOTH},
    [A_RIDX] = {"expert_idx", GM_DIM_K, GM_WHEN_MOE, GM_ACT_BOTH},   /* int32 */
    [A_RW] = {"expert_weights", GM_DIM_K, GM_WHEN_MOE, GM_ACT_BOTH},
    [A_SLOT] = {"expert_slot", GM_DIM_K, GM_WHEN_MOE, GM_ACT_BOTH},  /* int32 */
    [A_SEL] = {"slot_token", GM_DIM_K, GM_WHEN_MOE, GM_ACT_BOTH},    /* int32 */
    [A_XE] = {"experts_in", GM_DIM_C, GM_WHEN_MOE, GM_ACT_BOTH},     /* RMSNorm_pre_ffw_2(x_mid) */
    [A_RSTDE] = {"rstd_experts_in", GM_DIM_1, GM_WHEN_MOE, GM_ACT_TRAIN},
    [A_EG] = {"experts_gate", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_BOTH}, /* per slot, expert-sorted */
    [A_EU] = {"experts_up", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_BOTH},
    [A_EH] = {"experts_h", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_BOTH},
    [A_Y2] = {"experts_out", GM_DIM_C, GM_WHEN_MOE, GM_ACT_BOTH},    /* the weighted sum */
    [A_RSTDP2] = {"rstd_pf2", GM_DIM_1, GM_WHEN_MOE, GM_ACT_TRAIN},
    [A_DSUM] = {"ffw_sum", GM_DIM_C, GM_WHEN_MOE, GM_ACT_BOTH},      /* dense + experts, into post_ffw */
};

/* Model-level activations: the per-layer inputs (token-major work buffer, then layer-major), and
 * under activation checkpointing, where one record serves every layer, the keys and values the
 * KV-shared layers read, kept from their source layers (sliding, full). */
enum { M_PLE_WORK, M_PLE, M_PLE_RSTD, M_KS, M_VS, M_KF, M_VF, M_SLOTS, M_COUNT };
static const gm_act_spec model_acts[M_COUNT] = {
    [M_PLE_WORK] = {"ple_work", GM_DIM_LP, GM_WHEN_PLE, GM_ACT_BOTH},
    [M_PLE] = {"ple", GM_DIM_LP, GM_WHEN_PLE, GM_ACT_BOTH},
    [M_PLE_RSTD] = {"ple_rstd", GM_DIM_L, GM_WHEN_PLE, GM_ACT_TRAIN},
    [M_KS] = {"k_shared_sliding", GM_DIM_KW, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [M_VS] = {"v_shared_sliding", GM_DIM_KW, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [M_KF] = {"k_shared_full", GM_DIM_KWF, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [M_VF] = {"v_shared_full", GM_DIM_KWF, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    /* the experts' inputs and outputs per slot, one layer at a time (recomputed by the backward) */
    [M_SLOTS] = {"expert_slots", GM_DIM_KC, GM_WHEN_MOE, GM_ACT_BOTH},
};

/* The backward's workspace (one layer at a time), and the KV-shared layers' key / value gradients
 * waiting for their source layer (one pair per layer type). */
enum { G_DTMP, G_DXN, G_DQ, G_DATT, G_DK, G_DV, G_DGATE, G_DUP, G_DH, G_DP1, G_DP2, G_DP3, G_DKS, G_DVS, G_DKF, G_DVF,
       G_DM1, G_DM2, G_DE, G_DKW, G_DKF1, G_DKF2, G_DKF3, G_COUNT };

static const gm_act_spec grads[G_COUNT] = {
    [G_DTMP] = {"dtmp", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    GM_GEMMA_DECODER_GRADS,
    [G_DP1] = {"dpl", GM_DIM_P, GM_WHEN_PLE, GM_ACT_TRAIN},
    [G_DP2] = {"dpl2", GM_DIM_P, GM_WHEN_PLE, GM_ACT_TRAIN},
    [G_DP3] = {"dple", GM_DIM_P, GM_WHEN_PLE, GM_ACT_TRAIN}, /* the per-layer input's (read by the front's backward) */
    [G_DKS] = {"dk_shared_sliding", GM_DIM_KW, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [G_DVS] = {"dv_shared_sliding", GM_DIM_KW, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [G_DKF] = {"dk_shared_full", GM_DIM_KWF, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [G_DVF] = {"dv_shared_full", GM_DIM_KWF, GM_WHEN_KV_SHARED, GM_ACT_TRAIN},
    [G_DM1] = {"dmoe", GM_DIM_C, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DM2] = {"dmoe2", GM_DIM_C, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DE] = {"drouter_logits", GM_DIM_E, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DKW] = {"dexpert_weights", GM_DIM_K, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DKF1] = {"dexperts_h", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DKF2] = {"dexperts_gate", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_TRAIN},
    [G_DKF3] = {"dexperts_up", GM_DIM_KFE, GM_WHEN_MOE, GM_ACT_TRAIN},
};

/* transformers' Gemma4TextScaledWordEmbedding: rows times sqrt(hidden_size), the scale in the
 * weights' dtype (f32 here; a bf16 run rounds it: §4.2). */
static float embed_scale(const gm_config *c) { return sqrtf((float)c->hidden_size); }

/* ---- front -------------------------------------------------------------------------------- */

static void front(gm_graph *g) {
    if (g->cfg->ple_dim <= 0) return;
    gm_ple_fwd(g, G_PLE_PROJ, G_PLE_NORM, G_PLE_EMBED, g->mrec[M_PLE_WORK], g->mrec[M_PLE], g->mrec[M_PLE_RSTD]);
}

/* g->g (N, C) = dL/dX[0] in; += what the per-layer inputs owe x0 (layer_bwd left their gradients
 * in mrec[M_PLE]). */
static void front_bwd(gm_graph *g) {
    if (g->cfg->ple_dim <= 0) return;
    gm_ple_bwd(g, G_PLE_PROJ, G_PLE_NORM, g->mrec[M_PLE], g->mrec[M_PLE_WORK], g->mrec[M_PLE_RSTD], g->g);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* KV sharing in training (gemma_decoder.h): this file's record and buffers */
static const gm_kv_share KV_SHARE = {A_K, A_V, M_KS, G_DKS};

/* On a k_eq_v full layer the values are the raw key projection (transformers: value_states =
 * key_states before k_norm). */
static bool k_eq_v(const gm_config *c, int64_t l) { return c->k_eq_v_full && c->layer_type[l] == GM_LAYER_FULL; }

static const float *layer_scalar(const gm_graph *g, int64_t l) {
    return (const float *)gm_graph_weight(g, l, W_LAYER_SCALAR)->data;
}

/* One product per expert with slots (moe_off[l]), on its block of the stacked matrix in `slot`: rows
 * [e per + r0, + rows) of the (E per, in) view. Forward (bwd false): y (S, rows) = x (S, in) W_e^T;
 * backward: y (S, in) = beta y + x (S, rows) W_e. y and x have ycols and xcols floats per slot. */
static void experts_mm(gm_graph *g, int64_t l, int slot, int64_t per, int64_t r0, int64_t rows, float *y, int64_t ycols,
                       const float *x, int64_t xcols, bool bwd, float beta) {
    int64_t E = g->cfg->n_experts;
    const int64_t *off = g->moe_off + l * (E + 1);
    for (int64_t e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) continue;
        gm_wview w = gm_wview_rows(gm_graph_weight(g, l, slot), e * per + r0, rows);
        if (bwd) g->k->matmul_bwd_input(&g->kc, y + off[e] * ycols, x + off[e] * xcols, &w, n, beta);
        else g->k->matmul_fwd(&g->kc, y + off[e] * ycols, x + off[e] * xcols, &w, n, 0.0f);
    }
}

/* The mixture of experts of layer l on x_mid (gemma_architecture.md §4.4): the router's choice and
 * weights, the chosen experts' GeGLU MLPs on RMSNorm_pre_ffw_2(x_mid), their weighted sum, normed
 * into a[A_Y2] -> the layer's a[A_DSUM] = RMSNorm_post_ffw_1(d_pre) + RMSNorm_post_ffw_2(sum). */
static void moe_fwd(gm_graph *g, int64_t l, float **a) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N, C = c->hidden_size, E = c->n_experts, K = c->experts_top_k, Fe = c->expert_ffn;
    float eps = c->rms_norm_eps, *xs = g->mrec[M_SLOTS];
    int32_t *idx = (int32_t *)a[A_RIDX], *slot = (int32_t *)a[A_SLOT], *sel = (int32_t *)a[A_SEL];
    k->rmsnorm_fwd(kc, a[A_D1], a[A_RSTDP1], a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM_1), N, C, eps);
    /* router: softmax(((RMSNorm(x_mid) * scale) C^-1/2) Wr^T), top K, renormalized, per-expert scaled */
    k->rmsnorm_fwd(kc, a[A_RN], a[A_RSTDR], a[A_XMID], NULL, N, C, eps);
    k->mul_cols_fwd(kc, a[A_RN], a[A_RN], (const float *)gm_graph_weight(g, l, W_ROUTER_SCALE)->data, N, C);
    k->scale_fwd(kc, a[A_RN], a[A_RN], N * C, 1.0f / sqrtf((float)C));
    gm_graph_linear(g, l, W_ROUTER, a[A_PROBS], a[A_RN]);
    k->moe_route_fwd(kc, idx, a[A_RW], a[A_PROBS], (const float *)gm_graph_weight(g, l, W_EXPERT_SCALE)->data, N, E, K);
    gm_graph_moe_group(g, l, idx, slot, sel);
    /* the experts on their slots */
    k->rmsnorm_fwd(kc, a[A_XE], a[A_RSTDE], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM_2), N, C, eps);
    k->gather_rows(kc, xs, a[A_XE], sel, N * K, C);
    /* per expert: gate = rows [0, Fe) of its [2 Fe, C] block, up = rows [Fe, 2 Fe); down (C, Fe) */
    experts_mm(g, l, W_EXPERTS_GU, 2 * Fe, 0, Fe, a[A_EG], Fe, xs, C, false, 0.0f);
    experts_mm(g, l, W_EXPERTS_GU, 2 * Fe, Fe, Fe, a[A_EU], Fe, xs, C, false, 0.0f);
    k->geglu_fwd(kc, a[A_EH], a[A_EG], a[A_EU], N * K * Fe);
    experts_mm(g, l, W_EXPERTS_DOWN, C, 0, C, xs, C, a[A_EH], Fe, false, 0.0f);
    k->moe_combine_fwd(kc, a[A_Y2], xs, a[A_RW], slot, N, K, C);
    k->rmsnorm_fwd(kc, a[A_DSUM], a[A_RSTDP2], a[A_Y2], gm_graph_norm(g, l, W_POST_FFW_NORM_2), N, C, eps);
    k->add_fwd(kc, a[A_DSUM], a[A_D1], N * C);
}

/* Backward of moe_fwd: dsum (N, C) = dL/d a[A_DSUM] in; dL/dx_mid from the router and the experts
 * += into gx; dL/d d_pre (the dense MLP's output) into ddpre (may alias dsum). */
static void moe_bwd(gm_graph *g, int64_t l, float **a, float *gx, float *dsum, float *ddpre) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **d = g->grad;
    int64_t N = g->N, C = c->hidden_size, E = c->n_experts, K = c->experts_top_k, Fe = c->expert_ffn;
    float *xs = g->mrec[M_SLOTS];
    const int32_t *idx = (const int32_t *)a[A_RIDX], *slot = (const int32_t *)a[A_SLOT];
    /* the experts' weighted sum: dw from the recomputed outputs, then each slot's gradient */
    k->rmsnorm_bwd(kc, d[G_DM1], NULL, dsum, a[A_Y2], gm_graph_norm(g, l, W_POST_FFW_NORM_2), a[A_RSTDP2], N, C, 0.0f);
    experts_mm(g, l, W_EXPERTS_DOWN, C, 0, C, xs, C, a[A_EH], Fe, false, 0.0f);
    k->moe_combine_bwd(kc, xs, d[G_DKW], d[G_DM1], xs, a[A_RW], slot, N, K, C);
    experts_mm(g, l, W_EXPERTS_DOWN, C, 0, C, d[G_DKF1], Fe, xs, C, true, 0.0f); /* dh = dys Wd */
    k->geglu_bwd(kc, d[G_DKF2], d[G_DKF3], d[G_DKF1], a[A_EG], a[A_EU], N * K * Fe);
    experts_mm(g, l, W_EXPERTS_GU, 2 * Fe, 0, Fe, xs, C, d[G_DKF2], Fe, true, 0.0f); /* dxs = dgate Wg + dup Wu */
    experts_mm(g, l, W_EXPERTS_GU, 2 * Fe, Fe, Fe, xs, C, d[G_DKF3], Fe, true, 1.0f);
    k->moe_combine_fwd(kc, d[G_DM1], xs, NULL, slot, N, K, C); /* each token's slots summed: dL/d experts_in */
    k->rmsnorm_bwd(kc, gx, NULL, d[G_DM1], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM_2), a[A_RSTDE], N, C, 1.0f);
    /* the router: through the weights' renormalization and softmax, the projection, the scales, the norm */
    k->moe_route_bwd(kc, d[G_DE], d[G_DKW], a[A_PROBS], idx, (const float *)gm_graph_weight(g, l, W_EXPERT_SCALE)->data, N,
                     E, K);
    gm_graph_linear_bwd(g, l, W_ROUTER, d[G_DM2], d[G_DE], a[A_RN], 0.0f);
    k->mul_cols_fwd(kc, d[G_DM2], d[G_DM2], (const float *)gm_graph_weight(g, l, W_ROUTER_SCALE)->data, N, C);
    k->scale_fwd(kc, d[G_DM2], d[G_DM2], N * C, 1.0f / sqrtf((float)C));
    k->rmsnorm_bwd(kc, gx, NULL, d[G_DM2], a[A_XMID], NULL, a[A_RSTDR], N, C, 1.0f);
    /* the dense MLP's share */
    k->rmsnorm_bwd(kc, ddpre, NULL, dsum, a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM_1), a[A_RSTDP1], N, C, 0.0f);
}

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, P = c->ple_dim;
    int64_t KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    int64_t rot = gm_config_rope_pairs(c, l);
    float eps = c->rms_norm_eps, theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    const float *x = g->X[l];
    float *y = g->X[l + 1]; /* at inference the same buffer as x, read no more once x_mid is formed */
    /* attention: scale 1, v normed without weight */
    k->rmsnorm_fwd(kc, a[A_XN1], a[A_RSTD1], x, gm_graph_norm(g, l, W_ATTN_NORM), N, C, eps);
    /* q, k and v (none where k is v) read the same normed x: one call */
    bool own_kv = c->kv_source[l] == l;
    const int qkv[3] = {W_Q, W_K, W_V};
    gm_graph_linear_multi(g, l, own_kv ? (k_eq_v(c, l) ? 2 : 3) : 1, qkv, (float *const[]){a[A_QPRE], a[A_KPRE], a[A_VPRE]},
                          a[A_XN1]);
    k->rmsnorm_fwd(kc, a[A_Q], a[A_RSTDQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), N * H, D, eps);
    k->rope_fwd(kc, a[A_Q], a[A_Q], g->pos, N, H, D, rot, theta, pscale);
    const float *kk = NULL, *vv = NULL;
    if (own_kv) {
        const float *vpre = k_eq_v(c, l) ? a[A_KPRE] : a[A_VPRE];
        k->rmsnorm_fwd(kc, a[A_V], a[A_RSTDV], vpre, NULL, N * KVH, D, eps);
        k->rmsnorm_fwd(kc, a[A_K], a[A_RSTDK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), N * KVH, D, eps);
        k->rope_fwd(kc, a[A_K], a[A_K], g->pos, N, KVH, D, rot, theta, pscale);
        kk = a[A_K], vv = a[A_V];
        gm_kv_keep(g, l, &KV_SHARE, kk, vv, N * KVH * D); /* kept apart for the shared layers */
    } else if (g->o.mode == GM_GRAPH_TRAIN) {
        float *ks, *vs;
        gm_kv_train_source(g, l, &KV_SHARE, &ks, &vs);
        kk = ks, vv = vs;
    }
    gm_graph_attention(g, l, a[A_ATT], a[A_LSE], a[A_Q], kk, vv, 1.0f);
    gm_graph_linear(g, l, W_O, a[A_OPRE], a[A_ATT]);
    k->rmsnorm_fwd(kc, a[A_XMID], a[A_RSTDPA], a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), N, C, eps);
    k->add_fwd(kc, a[A_XMID], x, N * C);
    /* MLP */
    k->rmsnorm_fwd(kc, a[A_XN2], a[A_RSTD2], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), N, C, eps);
    const int gate_up[2] = {W_GATE, W_UP};
    gm_graph_linear_multi(g, l, 2, gate_up, (float *const[]){a[A_GATE], a[A_UP]}, a[A_XN2]);
    k->geglu_fwd(kc, a[A_H], a[A_GATE], a[A_UP], N * F);
    gm_graph_linear(g, l, W_DOWN, a[A_DPRE], a[A_H]);
    const float *ffw = a[A_DPRE];
    if (c->n_experts > 0) {
        moe_fwd(g, l, a);
        ffw = a[A_DSUM];
    }
    float *xf = P > 0 ? a[A_XFFN] : y;
    k->rmsnorm_fwd(kc, xf, a[A_RSTDPF], ffw, gm_graph_norm(g, l, W_POST_FFW_NORM), N, C, eps);
    k->add_fwd(kc, xf, a[A_XMID], N * C);
    /* the per-layer input */
    if (P > 0) {
        gm_graph_linear(g, l, W_PL_GATE, a[A_PG], xf);
        k->geglu_fwd(kc, a[A_PH], a[A_PG], g->mrec[M_PLE] + l * N * P, N * P);
        gm_graph_linear(g, l, W_PL_PROJ, a[A_PP], a[A_PH]);
        k->rmsnorm_fwd(kc, y, a[A_RSTDPP], a[A_PP], gm_graph_norm(g, l, W_PL_NORM), N, C, eps);
        k->add_fwd(kc, y, xf, N * C);
    }
    k->mul_cols_fwd(kc, y, y, layer_scalar(g, l), N * C, 1); /* every value times the one scalar */
}

/* ---- backward ----------------------------------------------------------------------------- */

static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t B = g->B, T = g->T, N = g->N, C = c->hidden_size, H = c->n_heads, P = c->ple_dim;
    int64_t KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    int64_t rot = gm_config_rope_pairs(c, l);
    float theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    float *gy = g->g; /* dL/dX[l+1] on entry, dL/dX[l] on exit */
    k->mul_cols_fwd(kc, gy, gy, layer_scalar(g, l), N * C, 1); /* the scalar is frozen */
    /* the per-layer input: x_ple = x_ffn + RMSNorm_ppl(proj(gelu(gate(x_ffn)) * ple_l)) */
    if (P > 0) {
        const float *ple = g->mrec[M_PLE] + l * N * P;
        k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gy, a[A_PP], gm_graph_norm(g, l, W_PL_NORM), a[A_RSTDPP], N, C, 0.0f);
        gm_graph_linear_bwd(g, l, W_PL_PROJ, d[G_DP1], d[G_DTMP], a[A_PH], 0.0f);
        k->geglu_bwd(kc, d[G_DP2], d[G_DP3], d[G_DP1], a[A_PG], ple, N * P);
        /* the front's backward reads dL/d(this layer's input) where it was (no later layer reads it) */
        if (g->front_grad) k->scale_fwd(kc, g->mrec[M_PLE] + l * N * P, d[G_DP3], N * P, 1.0f);
        gm_graph_linear_bwd(g, l, W_PL_GATE, gy, d[G_DP2], a[A_XFFN], 1.0f); /* gy: now dL/dx_ffn */
    }
    /* MLP: x_ffn = x_mid + RMSNorm_post_ffw(d_pre), or of d_pre's norm plus the experts' (moe_fwd) */
    bool moe = c->n_experts > 0;
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gy, moe ? a[A_DSUM] : a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), a[A_RSTDPF],
                   N, C, 0.0f);
    if (moe) moe_bwd(g, l, a, gy, d[G_DTMP], d[G_DTMP]);
    gm_graph_linear_bwd(g, l, W_DOWN, d[G_DH], d[G_DTMP], a[A_H], 0.0f);
    k->geglu_bwd(kc, d[G_DGATE], d[G_DUP], d[G_DH], a[A_GATE], a[A_UP], N * F);
    gm_graph_linear_bwd(g, l, W_GATE, d[G_DXN], d[G_DGATE], a[A_XN2], 0.0f);
    gm_graph_linear_bwd(g, l, W_UP, d[G_DXN], d[G_DUP], a[A_XN2], 1.0f);
    k->rmsnorm_bwd(kc, gy, NULL, d[G_DXN], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), a[A_RSTD2], N, C, 1.0f);
    /* attention: x_mid = x + RMSNorm_post_attn(o_pre) */
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gy, a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), a[A_RSTDPA], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_O, d[G_DATT], d[G_DTMP], a[A_ATT], 0.0f);
    bool full = c->layer_type[l] == GM_LAYER_FULL;
    float *kk, *vv;
    gm_kv_train_source(g, l, &KV_SHARE, &kk, &vv);
    int64_t window = full ? 0 : c->sliding_window, KW = KVH * D;
    k->attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], kk, vv, a[A_ATT], a[A_LSE],
                     gm_graph_kv_end(g, l), B, T, H, KVH, D, window, 1.0f);
    k->rope_bwd(kc, d[G_DQ], d[G_DQ], g->pos, N, H, D, rot, theta, pscale);
    k->rmsnorm_bwd(kc, d[G_DQ], NULL, d[G_DQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), a[A_RSTDQ], N * H, D, 0.0f);
    gm_graph_linear_bwd(g, l, W_Q, d[G_DXN], d[G_DQ], a[A_XN1], 0.0f);
    if (gm_kv_grads(g, l, &KV_SHARE, d[G_DK], d[G_DV], N * KW)) { /* a source layer: on into its projections */
        bool kv = k_eq_v(c, l);
        k->rope_bwd(kc, d[G_DK], d[G_DK], g->pos, N, KVH, D, rot, theta, pscale);
        k->rmsnorm_bwd(kc, d[G_DK], NULL, d[G_DK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), a[A_RSTDK], N * KVH, D, 0.0f);
        /* k_eq_v: the values' gradient joins the keys' on the one projection */
        k->rmsnorm_bwd(kc, kv ? d[G_DK] : d[G_DV], NULL, d[G_DV], kv ? a[A_KPRE] : a[A_VPRE], NULL, a[A_RSTDV], N * KVH, D,
                       kv ? 1.0f : 0.0f);
        gm_graph_linear_bwd(g, l, W_K, d[G_DXN], d[G_DK], a[A_XN1], 1.0f);
        if (!kv) gm_graph_linear_bwd(g, l, W_V, d[G_DXN], d[G_DV], a[A_XN1], 1.0f);
    }
    k->rmsnorm_bwd(kc, gy, NULL, d[G_DXN], g->X[l], gm_graph_norm(g, l, W_ATTN_NORM), a[A_RSTD1], N, C, 1.0f);
}

_Static_assert((int)W_COUNT <= GM_MAX_LAYER_WEIGHTS, "its slots fit GM_MAX_LAYER_WEIGHTS (gm_arch.h)");

const gm_arch_def gm_arch_gemma4 = {
    .id = GM_ARCH_GEMMA4,
    .name = "gemma4",
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
    .model_acts = model_acts,
    .n_model_acts = M_COUNT,
    .front = front,
    .front_bwd = front_bwd,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
    .kv_sharing_bwd = true,
};
