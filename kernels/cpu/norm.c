/*
 * norm.c - RMSNorm forward (gemma_architecture.md §1.4).
 *
 * out (N, C) = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps), statistics accumulated in
 * double so that the f32 result does not depend on C's blocking (Gemma's post-norm scales reach
 * ~740, which amplifies any error in rstd). w is the effective scale (1 + stored weight for
 * Hugging Face checkpoints, the stored value for GGUF, which already holds 1 + w).
 */
#include "kernels.h"

#include <math.h>

void gm_k_rmsnorm_fwd_cpu(const gm_kctx *ctx, float *out, float *rstd, const float *x,
                          const float *w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * (double)xr[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        if (rstd) rstd[n] = r;
        float *o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = (xr[c] * r) * w[c];
    }
}
