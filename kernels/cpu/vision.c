/*
 * vision.c - the kernels a vision tower adds (SigLIP, gemma_architecture.md §2.1-2.2): LayerNorm
 * with weight and bias, forward and backward; a bias added to every row; the ungated tanh GELU of
 * its MLP; the projector's average pooling over the patch grid. Shapes in kernels.h.
 *
 * LayerNorm as torch.nn.LayerNorm: biased variance, eps inside the square root; its statistics
 * are accumulated in double here (one pass for the mean, one for the variance) so the f32 result
 * does not depend on C's blocking.
 */
#include "kernels.h"

#include "gm_omp.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

void gm_k_layernorm_fwd_cpu(const gm_kctx *ctx, float *out, float *mean, float *rstd, const float *x, const float *w,
                            const float *b, int64_t N, int64_t C, float eps) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        double s = 0.0;
        for (int64_t c = 0; c < C; c++) s += (double)xr[c];
        double mu = s / (double)C, v = 0.0;
        for (int64_t c = 0; c < C; c++) v += ((double)xr[c] - mu) * ((double)xr[c] - mu);
        float m = (float)mu, r = (float)(1.0 / sqrt(v / (double)C + (double)eps));
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = r;
        float *o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = (xr[c] - m) * r * w[c] + b[c];
    });
}

void gm_k_layernorm_bwd_cpu(const gm_kctx *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                            const float *w, const float *mean, const float *rstd, int64_t N, int64_t C, float beta) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *dyr = dy + n * C;
        float m = mean[n], r = rstd[n];
        double sg = 0.0, sgx = 0.0; /* sums of g = dy w and of g xh */
        for (int64_t c = 0; c < C; c++) {
            double g = (double)dyr[c] * (double)w[c];
            sg += g;
            sgx += g * (double)((xr[c] - m) * r);
        }
        float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
        float *dxr = dx + n * C;
        for (int64_t c = 0; c < C; c++) {
            float xh = (xr[c] - m) * r;
            float v = r * (dyr[c] * w[c] - mg - xh * mgx);
            dxr[c] = beta != 0.0f ? dxr[c] + v : v;
        }
    });
    /* parameter gradients: column sums over the rows, one thread per column range */
    if (dw || db) {
        GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
        for (int64_t c = 0; c < C; c++) {
            double sw = 0.0, sb = 0.0;
            for (int64_t n = 0; n < N; n++) {
                float d = dy[n * C + c];
                sw += (double)d * (double)((x[n * C + c] - mean[n]) * rstd[n]);
                sb += (double)d;
            }
            if (dw) dw[c] += (float)sw;
            if (db) db[c] += (float)sb;
        });
    }
}

void gm_k_bias_fwd_cpu(const gm_kctx *ctx, float *y, const float *b, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * C > 262144, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        float *yr = y + n * C;
        for (int64_t c = 0; c < C; c++) yr[c] += b[c];
    });
}

GM_CPU_CLONES void gm_k_gelu_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        out[i] = gm_gelu_tanh(x[i]);
    });
}

/* d gelu_tanh / dz: vmath.h. */
GM_CPU_CLONES void gm_k_gelu_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        float gelu, d = gm_gelu_tanh_grad(x[i], &gelu);
        dx[i] = dy[i] * d;
    });
}

/* Output token (i, j) of image b averages grid rows i K .. i K + K - 1 and columns j K .. ; the
 * sum runs in the window's row-major order, as torch's CPU AvgPool2d does, then divides once. */
void gm_k_avgpool_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t B, int64_t P, int64_t K,
                          int64_t C) {
    int64_t Q = P / K;
    float inv = 1.0f / (float)(K * K);
    GM_OMP_FOR(ctx->n_threads, B * P * P * C > 65536, schedule(static),
    for (int64_t o = 0; o < B * Q * Q; o++) {
        int64_t b = o / (Q * Q), i = (o / Q) % Q, j = o % Q;
        float *orow = out + o * C;
        memset(orow, 0, (size_t)C * sizeof(float));
        for (int64_t di = 0; di < K; di++)
            for (int64_t dj = 0; dj < K; dj++) {
                const float *xr = x + ((b * P + i * K + di) * P + j * K + dj) * C;
                for (int64_t c = 0; c < C; c++) orow[c] += xr[c];
            }
        for (int64_t c = 0; c < C; c++) orow[c] *= inv;
    });
}

void gm_k_avgpool_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, int64_t B, int64_t P, int64_t K,
                          int64_t C) {
    int64_t Q = P / K;
    float inv = 1.0f / (float)(K * K);
    GM_OMP_FOR(ctx->n_threads, B * P * P * C > 65536, schedule(static),
    for (int64_t t = 0; t < B * P * P; t++) {
        int64_t b = t / (P * P), y = (t / P) % P, xcol = t % P;
        const float *g = dy + ((b * Q + y / K) * Q + xcol / K) * C;
        float *d = dx + t * C;
        for (int64_t c = 0; c < C; c++) d[c] = g[c] * inv;
    });
}
