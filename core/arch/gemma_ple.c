/*
 * gemma_ple.c - the per-layer inputs of Gemma 3n and Gemma 4 (declared in gemma_decoder.h), forward
 * and backward, written once for both architectures.
 *
 * Source: transformers' Gemma3nTextModel / Gemma4TextModel (get_per_layer_inputs,
 * project_per_layer_inputs) and gemma_architecture.md §3.3, §4.2. Token-major (N, L, P) while
 * the norm runs per (token, layer), then gathered layer-major (L, N, P) so that layer l reads one
 * contiguous (N, P) block.
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
