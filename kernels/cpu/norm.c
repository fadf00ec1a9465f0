/*
 * norm.c - RMSNorm forward (gemma_architecture.md §1.4).
 *
 * out (N, C) = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps), statistics accumulated in
 * double so that the f32 result does not depend on C's blocking (Gemma's post-norm scales reach
 * ~740, which amplifies any error in rstd). w is the effective scale (1 + stored weight for
 * Hugging Face checkpoints, the stored value for GGUF, which already holds 1 + w).
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>

void gm_k_rmsnorm_fwd_cpu(const gm_kctx *ctx, float *out, float *rstd, const float *x,
                          const float *w, int64_t N, int64_t C, float eps) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * (double)xr[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        if (rstd) rstd[n] = r;
        float *o = out + n * C;
        if (w)
            for (int64_t c = 0; c < C; c++) o[c] = (xr[c] * r) * w[c];
        else
            for (int64_t c = 0; c < C; c++) o[c] = xr[c] * r;
    });
}

void gm_k_rmsnorm_bwd_cpu(const gm_kctx *ctx, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int64_t N, int64_t C, float beta) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *dyr = dy + n * C;
        float r = rstd[n];
        double dot = 0.0; /* mean(u * xh), u = dy * w, xh = x * r */
        for (int64_t c = 0; c < C; c++) dot += (double)(dyr[c] * (w ? w[c] : 1.0f)) * (double)(xr[c] * r);
        float mean = (float)(dot / (double)C);
        float *dxr = dx + n * C;
        for (int64_t c = 0; c < C; c++) {
            float g = r * (dyr[c] * (w ? w[c] : 1.0f) - xr[c] * r * mean);
            dxr[c] = beta != 0.0f ? dxr[c] + g : g;
        }
    });
    if (dw) { /* column sums, parallel over columns so no two threads write one element */
        GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
        for (int64_t c = 0; c < C; c++) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += (double)dy[n * C + c] * (double)(x[n * C + c] * rstd[n]);
            dw[c] += (float)s;
        });
    }
}
