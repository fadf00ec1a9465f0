/*
 * matmul.c - out (M, N) = beta*out + x (M, K) . W^T for W (N, K) of any stored dtype.
 *
 * f32 weights go straight to OpenBLAS sgemm. Other dtypes (bf16, f16, GGUF block formats)
 * stay as stored (mmapped) and are dequantized panel by panel into ctx->scratch:
 *   - M <= GEMV_MAX_M (token-by-token generation): each thread dequantizes one weight row at a
 *     time into its own K-float slice and dots it with the M inputs - memory-bound anyway;
 *   - otherwise: GM_MATMUL_PANEL_ROWS rows at a time, dequantized in parallel, then one
 *     multi-threaded sgemm per panel.
 * Rejected: dequantizing whole matrices at load (a 262,144 x 640 embedding is 671 MB in f32).
 */
#include "kernels.h"

#include "gm_status.h"
#include "gm_omp.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define GEMV_MAX_M 4

size_t gm_k_matmul_scratch_floats(gm_dtype w_type, int64_t N, int64_t K, int n_threads) {
    if (w_type == GM_F32) return 0;
    int64_t panel = N < GM_MATMUL_PANEL_ROWS ? N : GM_MATMUL_PANEL_ROWS;
    size_t gemm = (size_t)(panel * K);
    /* GEMV: a K-float row per thread, then x quantized for the int8 dots (gm_kctx.int8_dot) */
    size_t gemv = (size_t)n_threads * (size_t)K + (GM_XQ8_BYTES(K) + sizeof(float) - 1) / sizeof(float);
    return gemm > gemv ? gemm : gemv;
}

/* MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6): kernels.h says why. */
static void flush_denormals(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040u);
#endif
}

void gm_kernels_set_threads(int n_threads) {
    static int current = -1;
    if (n_threads != current) {
        openblas_set_num_threads(n_threads);
        flush_denormals();
#pragma omp parallel num_threads(n_threads > 0 ? n_threads : 1)
        flush_denormals();
        current = n_threads;
    }
}

/* Dot product in 32 independent lanes (gm_lanes_sum32: why and the order), so the compiler
 * vectorizes it without reassociation flags; deterministic for a given n. */
GM_CPU_CLONES static float dot(const float *a, const float *b, int64_t n) {
    float s[32] = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 32; k++) s[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) s[k] += a[i] * b[i];
    return gm_lanes_sum32(s);
}

void gm_k_matmul_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const gm_wview *w, int64_t M,
                         float beta) {
    GM_ASSERT(beta == 0.0f || beta == 1.0f);
    int64_t N = w->rows, K = w->cols;
    gm_kernels_set_threads(ctx->n_threads);
    if (w->type == GM_F32) {
        GM_ASSERT(w->row_bytes % sizeof(float) == 0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x,
                    (int)K, (const float *)w->data, (int)(w->row_bytes / sizeof(float)), beta, out, (int)N);
        return;
    }
    GM_ASSERT(ctx->scratch && ctx->scratch_floats >= gm_k_matmul_scratch_floats(w->type, N, K, ctx->n_threads));
    if (M <= GEMV_MAX_M) {
        /* opt-in int8 dots (kernels.h): x quantized once, after the threads' rows */
        void *xq = NULL;
        if (M == 1 && ctx->int8_dot && gm_int8_dot_supports(w->type) && K % gm_dtype_get(w->type)->block_size == 0) {
            xq = ctx->scratch + (size_t)ctx->n_threads * (size_t)K;
            gm_quantize_x_q8(x, K, xq);
        }
        GM_OMP_PARALLEL(ctx->n_threads, 1, {
            float *row = ctx->scratch + (size_t)omp_get_thread_num() * (size_t)K;
            if (xq) { /* rows in runs of 64, one call each */
            GM_PRAGMA(omp for schedule(static))
                for (int64_t n0 = 0; n0 < N; n0 += 64) {
                    int64_t nr = N - n0 < 64 ? N - n0 : 64;
                    float v[64];
                    gm_dot_rows_q8(w, n0, nr, xq, v);
                    for (int64_t i = 0; i < nr; i++) out[n0 + i] = beta != 0.0f ? out[n0 + i] + v[i] : v[i];
                }
            } else {
            GM_PRAGMA(omp for schedule(static))
                for (int64_t n = 0; n < N; n++) {
                    float v1;
                    if (M == 1 && gm_dot_wrow(w, n, x, &v1)) { /* decoding: fused, same bits */
                        out[n] = beta != 0.0f ? out[n] + v1 : v1;
                        continue;
                    }
                    gm_dequant_wrow(w, n, row);
                    for (int64_t m = 0; m < M; m++) {
                        float v = dot(x + m * K, row, K);
                        out[m * N + n] = beta != 0.0f ? out[m * N + n] + v : v;
                    }
                }
            }
        });
        return;
    }
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)np, (int)K, 1.0f, x,
                    (int)K, ctx->scratch, (int)K, beta, out + p0, (int)N);
    }
}

void gm_k_matmul_bwd_input_cpu(const gm_kctx *ctx, float *dx, const float *dy, const gm_wview *w, int64_t M,
                               float beta) {
    GM_ASSERT(beta == 0.0f || beta == 1.0f);
    int64_t N = w->rows, K = w->cols;
    gm_kernels_set_threads(ctx->n_threads);
    if (w->type == GM_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)N, 1.0f, dy, (int)N,
                    (const float *)w->data, (int)(w->row_bytes / sizeof(float)), beta, dx, (int)K);
        return;
    }
    GM_ASSERT(ctx->scratch && ctx->scratch_floats >= gm_k_matmul_scratch_floats(w->type, N, K, ctx->n_threads));
    /* dx = sum over row panels of W: dy[:, panel] . W[panel, :] */
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)np, 1.0f, dy + p0, (int)N,
                    ctx->scratch, (int)K, p0 == 0 ? beta : 1.0f, dx, (int)K);
    }
}

void gm_k_matmul_bwd_weight_cpu(const gm_kctx *ctx, float *dw, const float *dy, const float *x, int64_t M,
                                int64_t N, int64_t K, float beta) {
    gm_kernels_set_threads(ctx->n_threads);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)M, 1.0f, dy, (int)N, x, (int)K, beta,
                dw, (int)K);
}
