/*
 * gemma3.c - Gemma 3 text decoder (Gemma3ForCausalLM, and the text part of
 * Gemma3ForConditionalGeneration): its spec and its layer, forward and backward.
 *
 * The layer (gemma_architecture.md §1.3), on the residual stream x (N = B*T rows, C):
 *   xn1 = RMSNorm_in(x); q_pre, k_pre, v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T;
 *   q = RoPE(RMSNorm_q(q_pre)), k = RoPE(RMSNorm_k(k_pre)) per head, at the layer's base;
 *   att = attention(q, k, v; causal, sliding window on local layers, scale
 *         query_pre_attn_scalar^-1/2); o_pre = att Wo^T;
 *   x_mid = x + RMSNorm_post_attn(o_pre);
 *   xn2 = RMSNorm_pre_ffw(x_mid); h = gelu_tanh(xn2 Wgate^T) * (xn2 Wup^T); d_pre = h Wdown^T;
 *   x_out = x_mid + RMSNorm_post_ffw(d_pre)
 * RMSNorm weights are effective scales (1 + w, added once at load: §5.3). The backward is the
 * chain rule through the same steps in reverse, with the kernels' formulas (kernels.h, §1.4-1.7).
 * Layers that read another layer's keys and values (kv_source, Gemma 3n / 4 KV sharing) skip
 * their own k / v projections; Gemma 3 checkpoints have none.
 *
 * What the graph (gm_graph.h) makes of these calls: a KV cache at inference, saved records in
 * training, adapters on every linear they target.
 */
#include "gemma_decoder.h"
#include "gm_arch.h"
#include "gm_graph.h"

#include <math.h>

/* ---- spec --------------------------------------------------------------------------------- */

/* Per-layer weights (gemma_decoder.h: the attention and MLP weights, lora_id 0..6). */
enum { GM_GEMMA_DECODER_SLOTS, W_COUNT };

static const gm_weight_spec layer_weights[W_COUNT] = {GM_GEMMA_DECODER_WEIGHTS};

/* Model-level weights (GM_GLOBAL_* order). */
static const gm_weight_spec global_weights[3] = {GM_GEMMA_DECODER_GLOBALS};

/* What one layer keeps (its record): saved for the backward in training; at inference the
 * GM_ACT_BOTH entries are the layer's scratch. Widths per token. */
enum {
    A_XN1, A_RSTD1, A_QPRE, A_RSTDQ, A_KPRE, A_RSTDK, A_Q, A_K, A_V, A_ATT, A_LSE, A_OPRE, A_RSTDPA,
    A_XMID, A_XN2, A_RSTD2, A_GATE, A_UP, A_H, A_DPRE, A_RSTDPF, A_COUNT
};

static const gm_act_spec acts[A_COUNT] = {
    [A_XN1] = {"xn1", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},         /* input RMSNorm output */
    [A_RSTD1] = {"rstd1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},    /* its 1/rms */
    [A_QPRE] = {"q_pre", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},     /* q projection before QK-norm */
    [A_RSTDQ] = {"rstd_q", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},   /* per head */
    [A_KPRE] = {"k_pre", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_RSTDK] = {"rstd_k", GM_DIM_KVH, GM_WHEN_OWN_KV, GM_ACT_TRAIN},
    [A_Q] = {"q", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},            /* after QK-norm and RoPE */
    [A_K] = {"k", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},
    [A_V] = {"v", GM_DIM_KW, GM_WHEN_OWN_KV, GM_ACT_BOTH},            /* v projection */
    [A_ATT] = {"att", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},        /* attention output */
    [A_LSE] = {"lse", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_TRAIN},        /* (B, H, T) log-sum-exp */
    [A_OPRE] = {"o_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},      /* o_proj before post-norm */
    [A_RSTDPA] = {"rstd_pa", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_XMID] = {"x_mid", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},      /* residual after attention */
    [A_XN2] = {"xn2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_RSTD2] = {"rstd2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_GATE] = {"gate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},       /* pre-activations */
    [A_UP] = {"up", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_H] = {"h", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},             /* gelu(gate) * up */
    [A_DPRE] = {"d_pre", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},      /* down_proj before post-norm */
    [A_RSTDPF] = {"rstd_pf", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
};

/* The backward's workspace (one layer at a time). */
enum { G_DTMP, G_DXN, G_DQ, G_DATT, G_DK, G_DV, G_DGATE, G_DUP, G_DH, G_COUNT };

static const gm_act_spec grads[G_COUNT] = {
    [G_DTMP] = {"dtmp", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN}, /* gradient of a post-norm input */
    GM_GEMMA_DECODER_GRADS,
};

/* Hugging Face's Gemma3TextScaledWordEmbedding: rows times sqrt(hidden_size), the scale cast to
 * the compute dtype (f32 here; gemma_architecture.md §1.3). */
static float embed_scale(const gm_config *c) { return sqrtf((float)c->hidden_size); }

/* ---- forward ------------------------------------------------------------------------------ */

static float attn_scale(const gm_config *c) { return 1.0f / sqrtf(c->query_pre_attn_scalar); }

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, H = c->n_heads, KVH = gm_dim_value(c, l, GM_DIM_KVH, 0);
    int64_t D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    float eps = c->rms_norm_eps, theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    bool own_kv = c->kv_source[l] == l;
    const float *x = g->X[l];
    /* attention block */
    k->rmsnorm_fwd(kc, a[A_XN1], a[A_RSTD1], x, gm_graph_norm(g, l, W_ATTN_NORM), N, C, eps);
    /* q, k, v read the same normed x: one call (one parallel region when decoding) */
    const int qkv[3] = {W_Q, W_K, W_V};
    gm_graph_linear_multi(g, l, own_kv ? 3 : 1, qkv, (float *const[]){a[A_QPRE], a[A_KPRE], a[A_V]}, a[A_XN1]);
    k->rmsnorm_fwd(kc, a[A_Q], a[A_RSTDQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), N * H, D, eps);
    k->rope_fwd(kc, a[A_Q], a[A_Q], g->pos, N, H, D, gm_config_rope_pairs(c, l), theta, pscale);
    const float *kk = NULL, *vv = NULL;
    if (own_kv) {
        k->rmsnorm_fwd(kc, a[A_K], a[A_RSTDK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), N * KVH, D, eps);
        k->rope_fwd(kc, a[A_K], a[A_K], g->pos, N, KVH, D, gm_config_rope_pairs(c, l), theta, pscale);
        kk = a[A_K], vv = a[A_V];
    } else if (g->o.mode == GM_GRAPH_TRAIN) {
        float **src = gm_graph_record(g, c->kv_source[l]); /* the source layer's record */
        kk = src[A_K], vv = src[A_V];
    }
    gm_graph_attention(g, l, a[A_ATT], a[A_LSE], a[A_Q], kk, vv, attn_scale(c));
    gm_graph_linear(g, l, W_O, a[A_OPRE], a[A_ATT]);
    k->rmsnorm_fwd(kc, a[A_XMID], a[A_RSTDPA], a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), N, C, eps);
    k->add_fwd(kc, a[A_XMID], x, N * C);
    /* MLP block */
    k->rmsnorm_fwd(kc, a[A_XN2], a[A_RSTD2], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), N, C, eps);
    const int gate_up[2] = {W_GATE, W_UP};
    gm_graph_linear_multi(g, l, 2, gate_up, (float *const[]){a[A_GATE], a[A_UP]}, a[A_XN2]);
    k->geglu_fwd(kc, a[A_H], a[A_GATE], a[A_UP], N * F);
    gm_graph_linear(g, l, W_DOWN, a[A_DPRE], a[A_H]);
    float *xo = g->X[l + 1]; /* at inference the same buffer as x, which is no longer read */
    k->rmsnorm_fwd(kc, xo, a[A_RSTDPF], a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), N, C, eps);
    k->add_fwd(kc, xo, a[A_XMID], N * C);
}

/* ---- backward ----------------------------------------------------------------------------- */

static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t B = g->B, T = g->T, N = g->N, C = c->hidden_size, H = c->n_heads;
    int64_t KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0), F = gm_dim_value(c, l, GM_DIM_F, 0);
    float theta = c->rope_theta[l], pscale = c->rope_pos_scale[l];
    float *gr = g->g;
    /* MLP block: x_out = x_mid + post_ffw_norm(d_pre) */
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gr, a[A_DPRE], gm_graph_norm(g, l, W_POST_FFW_NORM), a[A_RSTDPF], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_DOWN, d[G_DH], d[G_DTMP], a[A_H], 0.0f);
    k->geglu_bwd(kc, d[G_DGATE], d[G_DUP], d[G_DH], a[A_GATE], a[A_UP], N * F);
    gm_graph_linear_bwd(g, l, W_GATE, d[G_DXN], d[G_DGATE], a[A_XN2], 0.0f);
    gm_graph_linear_bwd(g, l, W_UP, d[G_DXN], d[G_DUP], a[A_XN2], 1.0f);
    k->rmsnorm_bwd(kc, gr, NULL, d[G_DXN], a[A_XMID], gm_graph_norm(g, l, W_FFN_NORM), a[A_RSTD2], N, C, 1.0f);
    /* attention block: x_mid = x + post_attn_norm(o_pre) */
    k->rmsnorm_bwd(kc, d[G_DTMP], NULL, gr, a[A_OPRE], gm_graph_norm(g, l, W_POST_ATTN_NORM), a[A_RSTDPA], N, C, 0.0f);
    gm_graph_linear_bwd(g, l, W_O, d[G_DATT], d[G_DTMP], a[A_ATT], 0.0f);
    int64_t window = c->layer_type[l] == GM_LAYER_SLIDING ? c->sliding_window : 0;
    k->attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], a[A_K], a[A_V], a[A_ATT], a[A_LSE],
                     gm_graph_kv_end(g, l), B, T, H, KVH, D,
                     window, attn_scale(c));
    k->rope_bwd(kc, d[G_DQ], d[G_DQ], g->pos, N, H, D, gm_config_rope_pairs(c, l), theta, pscale);
    k->rope_bwd(kc, d[G_DK], d[G_DK], g->pos, N, KVH, D, gm_config_rope_pairs(c, l), theta, pscale);
    /* QK-norm backward in place: d q_pre = rmsnorm_bwd(d q) */
    k->rmsnorm_bwd(kc, d[G_DQ], NULL, d[G_DQ], a[A_QPRE], gm_graph_norm(g, l, W_Q_NORM), a[A_RSTDQ], N * H, D, 0.0f);
    k->rmsnorm_bwd(kc, d[G_DK], NULL, d[G_DK], a[A_KPRE], gm_graph_norm(g, l, W_K_NORM), a[A_RSTDK], N * KVH, D, 0.0f);
    gm_graph_linear_bwd(g, l, W_Q, d[G_DXN], d[G_DQ], a[A_XN1], 0.0f);
    gm_graph_linear_bwd(g, l, W_K, d[G_DXN], d[G_DK], a[A_XN1], 1.0f);
    gm_graph_linear_bwd(g, l, W_V, d[G_DXN], d[G_DV], a[A_XN1], 1.0f);
    k->rmsnorm_bwd(kc, gr, NULL, d[G_DXN], g->X[l], gm_graph_norm(g, l, W_ATTN_NORM), a[A_RSTD1], N, C, 1.0f);
}

_Static_assert((int)W_COUNT <= GM_MAX_LAYER_WEIGHTS, "its slots fit GM_MAX_LAYER_WEIGHTS (gm_arch.h)");

const gm_arch_def gm_arch_gemma3 = {
    .id = GM_ARCH_GEMMA3,
    .name = "gemma3",
    .layers_prefix = "layers.",
    .globals = global_weights,
    .n_globals = 3,
    .layer = layer_weights,
    .n_layer = W_COUNT,
    .acts = acts,
    .n_acts = A_COUNT,
    .grads = grads,
    .n_grads = G_COUNT,
    .embed_scale = embed_scale,
    .layer_fwd = layer_fwd,
    .layer_bwd = layer_bwd,
};
