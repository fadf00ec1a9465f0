/*
 * siglip.c - the SigLIP vision tower of multimodal Gemma 3 (Gemma3ForConditionalGeneration's
 * vision_tower, SiglipVisionModel without its pooling head) and the multimodal projector: its
 * spec, its encoder layer (forward and backward), and the front and head around the layers.
 *
 * gemma_architecture.md §2.1-2.2 (transformers' modeling_siglip.py and modeling_gemma3.py):
 *   front: X0 = patches (N, 3 p p) Wpatch^T + bpatch + pos[t], the conv of kernel = stride = p
 *          written as a matmul on patches in (channel, y, x) order, t the patch's row-major index;
 *   layer: xn1 = LN1(x); q, k, v = xn1 W^T + b; att = softmax(q k^T / sqrt(D)) v over all the
 *          image's patches (no mask); x_mid = x + att Wo^T + bo;
 *          xn2 = LN2(x_mid); x_out = x_mid + gelu_tanh(xn2 W1^T + b1) W2^T + b2;
 *   head:  post = LN_post(X_L); pooled = average over K x K patches (K = patches per side /
 *          tokens per side) -> (tokens, C); normed = RMSNorm(pooled) with Gemma's 1 + w;
 *          soft tokens = normed Wproj^T (Wproj stored (C, C_text) in the checkpoint, transposed at
 *          load: gm_weight_spec.transposed).
 * LayerNorm weights and every bias are used as stored (GM_W_VEC). The tower's config is its own
 * gm_config (gm_config_vision_tower). Its linears can carry LoRA adapters like any other graph.
 */
#include "gm_arch.h"
#include "gm_graph.h"

#include <math.h>

/* ---- spec --------------------------------------------------------------------------------- */

enum {
    W_LN1_W, W_LN1_B, W_Q, W_Q_B, W_K, W_K_B, W_V, W_V_B, W_O, W_O_B, W_LN2_W, W_LN2_B, W_FC1, W_FC1_B, W_FC2, W_FC2_B,
    W_COUNT
};

/* lora_id 16.. so that a tower adapter's RNG streams never coincide with the decoder's (0..6). */
static const gm_weight_spec layer_weights[W_COUNT] = {
    [W_LN1_W] = {"layer_norm1.weight", "ln1.weight", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_LN1_B] = {"layer_norm1.bias", "ln1.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_Q] = {"self_attn.q_proj.weight", "attn_q.weight", GM_W_LINEAR, GM_DIM_QW, GM_DIM_C, GM_WHEN_ALWAYS, 16, false, false},
    [W_Q_B] = {"self_attn.q_proj.bias", "attn_q.bias", GM_W_VEC, GM_DIM_QW, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_K] = {"self_attn.k_proj.weight", "attn_k.weight", GM_W_LINEAR, GM_DIM_KW, GM_DIM_C, GM_WHEN_ALWAYS, 17, false, false},
    [W_K_B] = {"self_attn.k_proj.bias", "attn_k.bias", GM_W_VEC, GM_DIM_KW, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_V] = {"self_attn.v_proj.weight", "attn_v.weight", GM_W_LINEAR, GM_DIM_KW, GM_DIM_C, GM_WHEN_ALWAYS, 18, false, false},
    [W_V_B] = {"self_attn.v_proj.bias", "attn_v.bias", GM_W_VEC, GM_DIM_KW, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_O] = {"self_attn.out_proj.weight", "attn_out.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_QW, GM_WHEN_ALWAYS, 19, false,
             false},
    [W_O_B] = {"self_attn.out_proj.bias", "attn_out.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_LN2_W] = {"layer_norm2.weight", "ln2.weight", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_LN2_B] = {"layer_norm2.bias", "ln2.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_FC1] = {"mlp.fc1.weight", "ffn_up.weight", GM_W_LINEAR, GM_DIM_F, GM_DIM_C, GM_WHEN_ALWAYS, 20, false, false},
    [W_FC1_B] = {"mlp.fc1.bias", "ffn_up.bias", GM_W_VEC, GM_DIM_F, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [W_FC2] = {"mlp.fc2.weight", "ffn_down.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_F, GM_WHEN_ALWAYS, 21, false, false},
    [W_FC2_B] = {"mlp.fc2.bias", "ffn_down.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
};

/* Model-level weights, named below the tower's prefix (gm_model.prefix: "vision_tower.vision_model."
 * in the hub's layout, "vision_tower." as transformers 5 saves it, each under "model." in the
 * converters' layout); the projector's below the multimodal model's root (top_level, gm_model.root).
 * GGUF names are llama.cpp's mmproj names (gemma_architecture.md §5.4). */
#define VT ""
#define MMP "multi_modal_projector."
static const gm_weight_spec global_weights[GM_SIGLIP_GLOBALS] = {
    [GM_GLOBAL_EMBED] = {VT "embeddings.position_embedding.weight", "v.position_embd.weight", GM_W_EMBED, GM_DIM_V, GM_DIM_C,
                         GM_WHEN_ALWAYS, -1, false, false},
    [GM_GLOBAL_FINAL_NORM] = {VT "post_layernorm.weight", "v.post_ln.weight", GM_W_VEC, GM_DIM_C, GM_DIM_NONE,
                              GM_WHEN_ALWAYS, -1, false, false},
    [GM_GLOBAL_LM_HEAD] = {VT "embeddings.position_embedding.weight", "v.position_embd.weight", GM_W_EMBED, GM_DIM_V,
                           GM_DIM_C, GM_WHEN_UNTIED, -1, false, false},
    [GM_SIGLIP_POST_LN_B] = {VT "post_layernorm.bias", "v.post_ln.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS,
                             -1, false, false},
    [GM_SIGLIP_PATCH] = {VT "embeddings.patch_embedding.weight", "v.patch_embd.weight", GM_W_LINEAR, GM_DIM_C,
                         GM_DIM_PATCH, GM_WHEN_ALWAYS, -1, false, false},
    [GM_SIGLIP_PATCH_B] = {VT "embeddings.patch_embedding.bias", "v.patch_embd.bias", GM_W_VEC, GM_DIM_C, GM_DIM_NONE,
                           GM_WHEN_ALWAYS, -1, false, false},
    [GM_SIGLIP_MM_NORM] = {MMP "mm_soft_emb_norm.weight", "mm.soft_emb_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE,
                           GM_WHEN_ALWAYS, -1, true, false},
    [GM_SIGLIP_MM_PROJ] = {MMP "mm_input_projection_weight", "mm.input_projection.weight", GM_W_LINEAR, GM_DIM_OUT,
                           GM_DIM_C, GM_WHEN_ALWAYS, -1, true, true},
};
#undef VT
#undef MMP

enum {
    A_XN1, A_MEAN1, A_RSTD1, A_Q, A_K, A_V, A_ATT, A_LSE, A_XMID, A_XN2, A_MEAN2, A_RSTD2, A_FC1, A_H, A_COUNT
};

static const gm_act_spec acts[A_COUNT] = {
    [A_XN1] = {"xn1", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_MEAN1] = {"mean1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_RSTD1] = {"rstd1", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_Q] = {"q", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_K] = {"k", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_V] = {"v", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_ATT] = {"att", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_LSE] = {"lse", GM_DIM_H, GM_WHEN_ALWAYS, GM_ACT_BOTH}, /* the training kernel writes it in both modes */
    [A_XMID] = {"x_mid", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_XN2] = {"xn2", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_BOTH},
    [A_MEAN2] = {"mean2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_RSTD2] = {"rstd2", GM_DIM_1, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [A_FC1] = {"fc1", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH}, /* before the GELU */
    [A_H] = {"h", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_BOTH},
};

enum { G_DXN, G_DQ, G_DK, G_DV, G_DATT, G_DH, G_COUNT };

static const gm_act_spec grads[G_COUNT] = {
    [G_DXN] = {"dxn", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DQ] = {"dq", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DK] = {"dk", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DV] = {"dv", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DATT] = {"datt", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
    [G_DH] = {"dh", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN},
};

static const float *vec(const gm_graph *g, int64_t l, int slot) { return gm_graph_norm(g, l, slot); }

static float attn_scale(const gm_config *c) { return 1.0f / sqrtf((float)c->head_dim); }

/* ---- layer -------------------------------------------------------------------------------- */

static void layer_fwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l);
    int64_t N = g->N, C = c->hidden_size, F = gm_dim_value(c, l, GM_DIM_F, 0);
    float eps = c->rms_norm_eps;
    const float *x = g->X[l];
    k->layernorm_fwd(kc, a[A_XN1], a[A_MEAN1], a[A_RSTD1], x, vec(g, l, W_LN1_W), vec(g, l, W_LN1_B), N, C, eps);
    gm_graph_linear(g, l, W_Q, a[A_Q], a[A_XN1]);
    k->bias_fwd(kc, a[A_Q], vec(g, l, W_Q_B), N, C);
    gm_graph_linear(g, l, W_K, a[A_K], a[A_XN1]);
    k->bias_fwd(kc, a[A_K], vec(g, l, W_K_B), N, C);
    gm_graph_linear(g, l, W_V, a[A_V], a[A_XN1]);
    k->bias_fwd(kc, a[A_V], vec(g, l, W_V_B), N, C);
    gm_graph_attention(g, l, a[A_ATT], a[A_LSE], a[A_Q], a[A_K], a[A_V], attn_scale(c));
    gm_graph_linear(g, l, W_O, a[A_XMID], a[A_ATT]);
    k->bias_fwd(kc, a[A_XMID], vec(g, l, W_O_B), N, C);
    k->add_fwd(kc, a[A_XMID], x, N * C);
    k->layernorm_fwd(kc, a[A_XN2], a[A_MEAN2], a[A_RSTD2], a[A_XMID], vec(g, l, W_LN2_W), vec(g, l, W_LN2_B), N, C, eps);
    gm_graph_linear(g, l, W_FC1, a[A_FC1], a[A_XN2]);
    k->bias_fwd(kc, a[A_FC1], vec(g, l, W_FC1_B), N, F);
    k->gelu_fwd(kc, a[A_H], a[A_FC1], N * F);
    float *xo = g->X[l + 1]; /* at inference the same buffer as x, which is no longer read */
    gm_graph_linear(g, l, W_FC2, xo, a[A_H]);
    k->bias_fwd(kc, xo, vec(g, l, W_FC2_B), N, C);
    k->add_fwd(kc, xo, a[A_XMID], N * C);
}

/* g->g: dL/dX[l+1] in, dL/dX[l] out. The tower's own weights are frozen (only adapters on its
 * linears learn), so no LayerNorm or bias gradients are formed. */
static void layer_bwd(gm_graph *g, int64_t l) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    float **a = gm_graph_record(g, l), **d = g->grad;
    int64_t B = g->B, T = g->T, N = g->N, C = c->hidden_size, H = c->n_heads, D = c->head_dim;
    int64_t F = gm_dim_value(c, l, GM_DIM_F, 0);
    float *gr = g->g;
    /* MLP: x_out = x_mid + fc2(gelu(fc1(LN2(x_mid)))) */
    gm_graph_linear_bwd(g, l, W_FC2, d[G_DH], gr, a[A_H], 0.0f);
    k->gelu_bwd(kc, d[G_DH], d[G_DH], a[A_FC1], N * F);
    gm_graph_linear_bwd(g, l, W_FC1, d[G_DXN], d[G_DH], a[A_XN2], 0.0f);
    k->layernorm_bwd(kc, gr, NULL, NULL, d[G_DXN], a[A_XMID], vec(g, l, W_LN2_W), a[A_MEAN2], a[A_RSTD2], N, C, 1.0f);
    /* attention: x_mid = x + out_proj(attention(LN1(x))) */
    gm_graph_linear_bwd(g, l, W_O, d[G_DATT], gr, a[A_ATT], 0.0f);
    k->attention_bwd(kc, d[G_DQ], d[G_DK], d[G_DV], d[G_DATT], a[A_Q], a[A_K], a[A_V], a[A_ATT], a[A_LSE], g->kv_end, B, T,
                     H, H, D, 0, attn_scale(c));
    gm_graph_linear_bwd(g, l, W_Q, d[G_DXN], d[G_DQ], a[A_XN1], 0.0f);
    gm_graph_linear_bwd(g, l, W_K, d[G_DXN], d[G_DK], a[A_XN1], 1.0f);
    gm_graph_linear_bwd(g, l, W_V, d[G_DXN], d[G_DV], a[A_XN1], 1.0f);
    k->layernorm_bwd(kc, gr, NULL, NULL, d[G_DXN], g->X[l], vec(g, l, W_LN1_W), a[A_MEAN1], a[A_RSTD1], N, C, 1.0f);
}

/* ---- front and head ----------------------------------------------------------------------- */

void gm_siglip_embed(gm_graph *g, const float *patches) {
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = g->cfg->hidden_size;
    /* X0 = pos[t] (gathered by the graph's positions t = patch index), + patches Wpatch^T + b */
    g->k->embed_fwd(kc, g->X[0], g->pos, &w->global[GM_GLOBAL_EMBED], N, 1.0f);
    g->k->matmul_fwd(kc, g->X[0], patches, &w->global[GM_SIGLIP_PATCH], N, 1.0f);
    g->k->bias_fwd(kc, g->X[0], (const float *)w->global[GM_SIGLIP_PATCH_B].data, N, C);
}

static const float *norm_scale(const gm_graph *g, const gm_siglip_head_bufs *b) {
    return b->norm_scale ? b->norm_scale : (const float *)g->w->global[GM_SIGLIP_MM_NORM].data;
}

void gm_siglip_head(gm_graph *g, const gm_siglip_head_bufs *b) {
    const gm_kctx *kc = &g->kc;
    const gm_config *c = g->cfg;
    const gm_weights *w = g->w;
    int64_t B = g->B, N = g->N, C = c->hidden_size, side = (int64_t)llround(sqrt((double)g->T));
    int64_t tside = (int64_t)llround(sqrt((double)c->vision.tokens)), R = B * c->vision.tokens;
    g->k->layernorm_fwd(kc, b->post, b->mean, b->rstd, g->X[c->n_layers], (const float *)w->global[GM_GLOBAL_FINAL_NORM].data,
                        (const float *)w->global[GM_SIGLIP_POST_LN_B].data, N, C, c->rms_norm_eps);
    g->k->avgpool_fwd(kc, b->pooled, b->post, B, side, side / tside, C);
    g->k->rmsnorm_fwd(kc, b->normed, b->rstd_mm, b->pooled, norm_scale(g, b), R, C, c->rms_norm_eps);
    if (b->proj) { /* out (R, C_text) = normed (R, C) . proj (C, C_text): the input-gradient product */
        gm_wview pv = gm_wview_f32((float *)b->proj, C, c->vision.out_hidden_size);
        g->k->matmul_bwd_input(kc, b->out, b->normed, &pv, R, 0.0f);
    } else {
        g->k->matmul_fwd(kc, b->out, b->normed, &w->global[GM_SIGLIP_MM_PROJ], R, 0.0f);
    }
}

void gm_siglip_head_bwd(gm_graph *g, const gm_siglip_head_bufs *b, bool into_tower) {
    const gm_kctx *kc = &g->kc;
    const gm_config *c = g->cfg;
    const gm_weights *w = g->w;
    int64_t B = g->B, N = g->N, C = c->hidden_size, Ct = c->vision.out_hidden_size;
    int64_t side = (int64_t)llround(sqrt((double)g->T)), tside = (int64_t)llround(sqrt((double)c->vision.tokens));
    int64_t R = B * c->vision.tokens;
    if (b->proj) {
        gm_wview pv = gm_wview_f32((float *)b->proj, C, Ct);
        g->k->matmul_fwd(kc, b->dnormed, b->dout, &pv, R, 0.0f);                 /* dnormed = dout proj^T */
        if (b->dproj) g->k->matmul_bwd_weight(kc, b->dproj, b->normed, b->dout, R, C, Ct, 1.0f); /* += normed^T dout */
    } else {
        g->k->matmul_bwd_input(kc, b->dnormed, b->dout, &w->global[GM_SIGLIP_MM_PROJ], R, 0.0f);
    }
    g->k->rmsnorm_bwd(kc, b->dpooled, b->dnorm, b->dnormed, b->pooled, norm_scale(g, b), b->rstd_mm, R, C, 0.0f);
    if (!into_tower) return;
    g->k->avgpool_bwd(kc, b->dpost, b->dpooled, B, side, side / tside, C);
    g->k->layernorm_bwd(kc, g->g, NULL, NULL, b->dpost, g->X[c->n_layers], (const float *)w->global[GM_GLOBAL_FINAL_NORM].data,
                        b->mean, b->rstd, N, C, 0.0f);
}

_Static_assert((int)W_COUNT <= GM_MAX_LAYER_WEIGHTS, "its slots fit GM_MAX_LAYER_WEIGHTS (gm_arch.h)");

const gm_arch_def gm_arch_siglip = {
    .id = GM_ARCH_SIGLIP,
    .name = "siglip",
    .layers_prefix = "encoder.layers.",
    .encoder = true,
    .globals = global_weights,
    .n_globals = GM_SIGLIP_GLOBALS,
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
