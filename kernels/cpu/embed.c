/*
 * embed.c - token embedding lookup, scaled (gemma_architecture.md §1.3 step 1).
 *
 * out (N, C) = dequant(table[ids[n]]) * scale. The caller passes scale = sqrt(C) rounded to
 * the weight dtype as Hugging Face does (exact f32 for f32 weights, bf16(sqrt(C)) for bf16).
 */
#include "kernels.h"
#include "gm_omp.h"

void gm_k_embed_fwd_cpu(const gm_kctx *ctx, float *out, const int32_t *ids, const gm_wview *table, int64_t N,
                        float scale) {
    int64_t C = table->cols;
    GM_OMP_FOR(ctx->n_threads, N > 16, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        float *o = out + n * C;
        gm_dequant_wrow(table, ids[n], o);
        for (int64_t c = 0; c < C; c++) o[c] *= scale;
    });
}
