/*
 * gemma_decoder.c - what Gemma 3n and Gemma 4 share beyond the decoder's weights (declared in
 * gemma_decoder.h), written once for both architectures:
 *   - the per-layer inputs, forward and backward (transformers' Gemma3nTextModel / Gemma4TextModel:
 *     get_per_layer_inputs, project_per_layer_inputs; gemma_architecture.md §3.3, §4.2): token-major
 *     (N, L, P) while the norm runs per (token, layer), then gathered layer-major (L, N, P) so that
 *     layer l reads one contiguous (N, P) block;
 *   - KV sharing in training (§3.5, §4.4): where a sharing layer's keys and values come from and
 *     where its gradients go.
 */
#include "gemma_decoder.h"
#include "gm_graph.h"

#include <math.h>

void gm_ple_fwd(gm_graph *g, int proj, int norm, int table, float *work, float *ple, float *rstd) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = c->hidden_size, L = c->n_layers, P = c->ple_dim;
    k->matmul_fwd(kc, work, g->X[0], &w->global[proj], N, 0.0f);
    k->scale_fwd(kc, work, work, N * L * P, 1.0f / sqrtf((float)C));
    k->rmsnorm_fwd(kc, work, rstd, work, (const float *)w->global[norm].data, N * L, P, c->rms_norm_eps);
    k->embed_fwd(kc, ple, g->ple_ids, &w->global[table], N, sqrtf((float)P));
    k->add_fwd(kc, work, ple, N * L * P);
    k->scale_fwd(kc, work, work, N * L * P, 1.0f / sqrtf(2.0f));
    k->gather_rows(kc, ple, work, g->ple_sel, L * N, P); /* (N, L, P) -> (L, N, P) */
}

void gm_ple_bwd(gm_graph *g, int proj, int norm, float *dple, float *dwork, const float *rstd, float *gx) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    const gm_weights *w = g->w;
    int64_t N = g->N, C = c->hidden_size, L = c->n_layers, P = c->ple_dim;
    k->scatter_rows(kc, dwork, dple, g->ple_sel, L * N, P); /* (L, N, P) -> (N, L, P) */
    k->scale_fwd(kc, dwork, dwork, N * L * P, 1.0f / sqrtf(2.0f));
    float *y = dple; /* free now: the projection before its norm, recomputed */
    k->matmul_fwd(kc, y, g->X[0], &w->global[proj], N, 0.0f);
    k->scale_fwd(kc, y, y, N * L * P, 1.0f / sqrtf((float)C));
    k->rmsnorm_bwd(kc, dwork, NULL, dwork, y, (const float *)w->global[norm].data, rstd, N * L, P, 0.0f);
    k->scale_fwd(kc, dwork, dwork, N * L * P, 1.0f / sqrtf((float)C));
    k->matmul_bwd_input(kc, gx, dwork, &w->global[proj], N, 1.0f);
}

/* ---- KV sharing in training ---------------------------------------------------------------- */

bool gm_kv_shared_later(const gm_config *c, int64_t l) {
    int32_t src = c->kv_source[l];
    for (int64_t m = l + 1; m < c->n_layers; m++)
        if (c->kv_source[m] == src && m != src) return true;
    return false;
}

void gm_kv_train_source(gm_graph *g, int64_t l, const gm_kv_share *s, float **k, float **v) {
    const gm_config *c = g->cfg;
    int full = c->layer_type[l] == GM_LAYER_FULL ? 2 : 0;
    if (g->n_rec == 1 && (c->kv_source[l] != l || gm_kv_shared_later(c, l))) {
        *k = g->mrec[s->m_kv + full], *v = g->mrec[s->m_kv + full + 1];
        return;
    }
    float **src = gm_graph_record(g, c->kv_source[l]);
    *k = src[s->a_k], *v = src[s->a_v];
}

void gm_kv_keep(gm_graph *g, int64_t l, const gm_kv_share *s, const float *k, const float *v, int64_t n) {
    if (g->o.mode != GM_GRAPH_TRAIN || g->n_rec != 1 || !gm_kv_shared_later(g->cfg, l)) return;
    float *ks, *vs;
    gm_kv_train_source(g, l, s, &ks, &vs);
    g->k->scale_fwd(&g->kc, ks, k, n, 1.0f);
    g->k->scale_fwd(&g->kc, vs, v, n, 1.0f);
}

bool gm_kv_grads(gm_graph *g, int64_t l, const gm_kv_share *s, float *dk, float *dv, int64_t n) {
    const gm_config *c = g->cfg;
    const gm_kernel_table *k = g->k;
    int full = c->layer_type[l] == GM_LAYER_FULL ? 2 : 0;
    float *dks = g->grad[s->g_dkv + full], *dvs = g->grad[s->g_dkv + full + 1];
    bool later = gm_kv_shared_later(c, l);
    if (c->kv_source[l] != l) {
        /* keys and values belong to the source layer: its backward (later in this pass) takes them */
        if (later) {
            k->add_fwd(&g->kc, dks, dk, n);
            k->add_fwd(&g->kc, dvs, dv, n);
        } else {
            k->scale_fwd(&g->kc, dks, dk, n, 1.0f);
            k->scale_fwd(&g->kc, dvs, dv, n, 1.0f);
        }
        return false;
    }
    if (later) {
        k->add_fwd(&g->kc, dk, dks, n);
        k->add_fwd(&g->kc, dv, dvs, n);
    }
    return true;
}
