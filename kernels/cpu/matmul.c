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
 *
 * bf16 (ctx->bf16_gemm with ctx->bf16_staging, kernels.h): x / dy are rounded to bf16 in row chunks
 * and multiplied by the weight's bf16 rows - a bf16 base as stored, other types a dequantized panel
 * at a time rounded to bf16 - with oneDNN's matmul, summing in f32 (gemm_bf16.c). The GEMV path
 * (M <= GEMV_MAX_M: decoding) stays f32: it is bound by reading the weights, not by multiplying.
 */
#include "kernels.h"

#include "gm_status.h"
#include "gm_omp.h"
#include "gemm_bf16.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
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

/* OpenBLAS cores older than Haswell (no AVX2 kernels): on a CPU with AVX2, a detection that
 * fell back (gm_kernels_startup). */
static const char *const pre_avx2_cores[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge",
                                             "Atom", "Katmai", "Coppermine", "Northwood", "Banias", "Opteron",
                                             "Opteron_SSE3", "Barcelona", "Bobcat", "Bulldozer", "Piledriver",
                                             "Steamroller", "Excavator", "Unknown"};

const char *gm_blas_core_fallback(void) {
#if defined(__x86_64__)
    if (getenv("OPENBLAS_CORETYPE")) return NULL;
    const char *core = openblas_get_corename();
    bool old = false;
    for (size_t i = 0; core && i < sizeof pre_avx2_cores / sizeof pre_avx2_cores[0]; i++)
        old = old || strcasecmp(core, pre_avx2_cores[i]) == 0;
    if (!old) return NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

const char *gm_blas_info(void) {
    const char *config = openblas_get_config();
    return config ? config : "OpenBLAS";
}

void gm_kernels_startup(char **argv) {
    bool changed = false;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT"))
        changed = setenv("GOMP_SPINCOUNT", GM_OMP_SPINCOUNT, 0) == 0 || changed;
    const char *core = gm_blas_core_fallback();
    if (core) changed = setenv("OPENBLAS_CORETYPE", core, 0) == 0 || changed;
    if (changed) execv("/proc/self/exe", argv);
}

size_t gm_k_matmul_bf16_staging_elems(gm_dtype w_type, int64_t N, int64_t K, int64_t M) {
    if (w_type == GM_F32) return 0;
    int64_t prow = w_type == GM_BF16 ? 0 : (N < GM_MATMUL_PANEL_ROWS ? N : GM_MATMUL_PANEL_ROWS);
    return (size_t)(prow * K + M * (N > K ? N : K));
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
        omp_set_num_threads(n_threads > 0 ? n_threads : 1); /* oneDNN's matmul (gemm_bf16.c) */
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

/* out (M, N) = beta*out + x . W^T in f32: a dequantized panel of W at a time, one sgemm each. */
static void fwd_panels_f32(const gm_kctx *ctx, float *out, const float *x, const gm_wview *w, int64_t M, float beta) {
    int64_t N = w->rows, K = w->cols;
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)np, (int)K, 1.0f, x, (int)K, ctx->scratch,
                    (int)K, beta, out + p0, (int)N);
    }
}

/* dx (M, K) = beta*dx + dy . W in f32: the sum over row panels of W of dy[:, panel] . W[panel, :]. */
static void bwd_panels_f32(const gm_kctx *ctx, float *dx, const float *dy, const gm_wview *w, int64_t M, float beta) {
    int64_t N = w->rows, K = w->cols;
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)np, 1.0f, dy + p0, (int)N,
                    ctx->scratch, (int)K, p0 == 0 ? beta : 1.0f, dx, (int)K);
    }
}

/* The bf16 staging split for a GEMM whose weight panels are prow x K and whose activation rows are
 * `width` wide: the panel first, then as many activation rows as fit (0: no room, compute in f32). */
static int64_t bf16_rows(const gm_kctx *ctx, int64_t prow, int64_t K, int64_t width) {
    if (!ctx->bf16_gemm || !ctx->bf16_staging || (size_t)(prow * K) >= ctx->bf16_staging_elems) return 0;
    return (int64_t)((ctx->bf16_staging_elems - (size_t)(prow * K)) / (size_t)width);
}

/* A bf16 base is multiplied as stored; other types a dequantized panel at a time. */
static bool bf16_direct(const gm_wview *w) { return w->type == GM_BF16 && w->row_bytes % 2 == 0; }

/* out (M, N) = beta*out + x . W^T in bf16 (file comment). false: nothing computed, use f32. */
static bool matmul_fwd_bf16(const gm_kctx *ctx, float *out, const float *x, const gm_wview *w, int64_t M, float beta) {
    int64_t N = w->rows, K = w->cols, prow = bf16_direct(w) ? 0 : (N < GM_MATMUL_PANEL_ROWS ? N : GM_MATMUL_PANEL_ROWS);
    int64_t mc = bf16_rows(ctx, prow, K, K);
    if (mc < 1) return false;
    uint16_t *wb = ctx->bf16_staging, *xb = wb + prow * K;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t mr = M - m0 < mc ? M - m0 : mc;
        gm_cpu_to_bf16(xb, K, x + m0 * K, K, mr, K, ctx->n_threads);
        if (prow == 0) {
            if (!gm_cpu_gemm_bf16(mr, N, K, xb, K, (const uint16_t *)w->data, (int64_t)(w->row_bytes / 2), true,
                                  out + m0 * N, N, beta != 0.0f))
                fwd_panels_f32(ctx, out + m0 * N, x + m0 * K, w, mr, beta); /* oneDNN failed: these rows in f32 */
            continue;
        }
        for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
            int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
            gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
            gm_cpu_to_bf16(wb, K, ctx->scratch, K, np, K, ctx->n_threads);
            if (!gm_cpu_gemm_bf16(mr, np, K, xb, K, wb, K, true, out + m0 * N + p0, N, beta != 0.0f))
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mr, (int)np, (int)K, 1.0f, x + m0 * K,
                            (int)K, ctx->scratch, (int)K, beta, out + m0 * N + p0, (int)N);
        }
    }
    return true;
}

/* dx (M, K) = beta*dx + dy . W in bf16. false: nothing computed, use f32. */
static bool matmul_bwd_input_bf16(const gm_kctx *ctx, float *dx, const float *dy, const gm_wview *w, int64_t M,
                                  float beta) {
    int64_t N = w->rows, K = w->cols, prow = bf16_direct(w) ? 0 : (N < GM_MATMUL_PANEL_ROWS ? N : GM_MATMUL_PANEL_ROWS);
    int64_t mc = bf16_rows(ctx, prow, K, N);
    if (mc < 1) return false;
    uint16_t *wb = ctx->bf16_staging, *db = wb + prow * K;
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
        int64_t mr = M - m0 < mc ? M - m0 : mc;
        gm_cpu_to_bf16(db, N, dy + m0 * N, N, mr, N, ctx->n_threads);
        if (prow == 0) {
            if (!gm_cpu_gemm_bf16(mr, K, N, db, N, (const uint16_t *)w->data, (int64_t)(w->row_bytes / 2), false,
                                  dx + m0 * K, K, beta != 0.0f))
                bwd_panels_f32(ctx, dx + m0 * K, dy + m0 * N, w, mr, beta); /* oneDNN failed: these rows in f32 */
            continue;
        }
        for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
            int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
            float b = p0 == 0 ? beta : 1.0f;
            gm_k_dequant_rows_cpu(ctx, ctx->scratch, w, p0, np);
            gm_cpu_to_bf16(wb, K, ctx->scratch, K, np, K, ctx->n_threads);
            if (!gm_cpu_gemm_bf16(mr, K, np, db + p0, N, wb, K, false, dx + m0 * K, K, b != 0.0f))
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mr, (int)K, (int)np, 1.0f, dy + m0 * N + p0,
                            (int)N, ctx->scratch, (int)K, b, dx + m0 * K, (int)K);
        }
    }
    return true;
}

/* Does the GEMV of weight w take the int8 dots (gm_kctx.int8_dot, kernels.h)? */
static bool gemv_int8(const gm_kctx *ctx, const gm_wview *w, int64_t M) {
    return M == 1 && ctx->int8_dot && gm_int8_dot_supports(w->type) && w->cols % gm_dtype_get(w->type)->block_size == 0;
}

/* The GEMV path (M <= GEMV_MAX_M: decoding) of n non-f32 weights W_i (N_i, K) sharing x (M, K):
 * out_i = beta*out_i + x . W_i^T in one parallel region, the work split in units over the weights in
 * turn - runs of 64 rows, one gm_dot_rows_q8 call each, for the int8 dots (x quantized once, after
 * the threads' rows in scratch), single rows otherwise. Each row's value is the same whichever
 * weights share the region and whichever thread computes it. */
static void gemv(const gm_kctx *ctx, int n, float *const *outs, const float *x, const gm_wview *const *ws, int64_t M,
                 float beta) {
    int64_t K = ws[0]->cols, units[GM_MATMUL_MULTI_MAX + 1] = {0}; /* units[i]: the first unit of weight i */
    bool q8[GM_MATMUL_MULTI_MAX], any_q8 = false; /* q8[i]: weight i takes the int8 dots */
    for (int i = 0; i < n; i++) {
        q8[i] = gemv_int8(ctx, ws[i], M);
        any_q8 = any_q8 || q8[i];
        units[i + 1] = units[i] + (q8[i] ? (ws[i]->rows + 63) / 64 : ws[i]->rows);
    }
    void *xq = NULL;
    if (any_q8) {
        xq = ctx->scratch + (size_t)ctx->n_threads * (size_t)K;
        gm_quantize_x_q8(x, K, xq);
    }
    /* Taken dynamically, so that a thread slowed by another process leaves its share to the others
     * (decoding beside a busy process: docs/benchmarks.md "Fused projections"), in chunks of about
     * 256 rows: 16-row ones cost a fifth of the quiet speed (each thread's stream of weight rows
     * restarts the hardware prefetcher at every chunk), larger ones leave a thread idle at the end
     * of q / k / v. At least 4 chunks a thread, at least 64 rows. */
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += ws[i]->rows;
    int64_t span = rows / (4 * (int64_t)ctx->n_threads);
    span = span > 256 ? 256 : span < 64 ? 64 : span / 64 * 64;
    int chunk = (int)(any_q8 ? span / 64 : span);
    GM_OMP_PARALLEL(ctx->n_threads, 1, {
        float *row = ctx->scratch + (size_t)omp_get_thread_num() * (size_t)K;
        GM_PRAGMA(omp for schedule(dynamic, chunk))
        for (int64_t u = 0; u < units[n]; u++) {
            int i = 0;
            while (u >= units[i + 1]) i++;
            const gm_wview *w = ws[i];
            float *out = outs[i];
            int64_t N = w->rows;
            if (q8[i]) { /* rows in runs of 64, one call each */
                int64_t n0 = (u - units[i]) * 64, nr = N - n0 < 64 ? N - n0 : 64;
                float v[64];
                gm_dot_rows_q8(w, n0, nr, xq, v);
                for (int64_t r = 0; r < nr; r++) out[n0 + r] = beta != 0.0f ? out[n0 + r] + v[r] : v[r];
                continue;
            }
            int64_t r = u - units[i];
            float v1;
            if (M == 1 && gm_dot_wrow(w, r, x, &v1)) { /* decoding: fused, same bits */
                out[r] = beta != 0.0f ? out[r] + v1 : v1;
                continue;
            }
            gm_dequant_wrow(w, r, row);
            for (int64_t m = 0; m < M; m++) {
                float v = dot(x + m * K, row, K);
                out[m * N + r] = beta != 0.0f ? out[m * N + r] + v : v;
            }
        }
    });
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
        gemv(ctx, 1, &out, x, &w, M, beta);
        return;
    }
    if (matmul_fwd_bf16(ctx, out, x, w, M, beta)) return;
    fwd_panels_f32(ctx, out, x, w, M, beta);
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
    if (matmul_bwd_input_bf16(ctx, dx, dy, w, M, beta)) return;
    bwd_panels_f32(ctx, dx, dy, w, M, beta);
}

void gm_k_matmul_bwd_weight_cpu(const gm_kctx *ctx, float *dw, const float *dy, const float *x, int64_t M,
                                int64_t N, int64_t K, float beta) {
    gm_kernels_set_threads(ctx->n_threads);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)M, 1.0f, dy, (int)N, x, (int)K, beta,
                dw, (int)K);
}

void gm_k_matmul_fwd_multi_cpu(const gm_kctx *ctx, float *const *out, const float *x, const gm_wview *const *w, int n,
                               int64_t M) {
    GM_ASSERT(n >= 1 && n <= GM_MATMUL_MULTI_MAX);
    bool gemv_all = M <= GEMV_MAX_M;
    for (int i = 0; i < n; i++) {
        GM_ASSERT(w[i]->cols == w[0]->cols);
        gemv_all = gemv_all && w[i]->type != GM_F32;
    }
    if (!gemv_all) { /* GEMMs (or f32 weights): one call each, nothing to share */
        for (int i = 0; i < n; i++) gm_k_matmul_fwd_cpu(ctx, out[i], x, w[i], M, 0.0f);
        return;
    }
    gm_kernels_set_threads(ctx->n_threads);
    for (int i = 0; i < n; i++)
        GM_ASSERT(ctx->scratch &&
                  ctx->scratch_floats >= gm_k_matmul_scratch_floats(w[i]->type, w[i]->rows, w[i]->cols, ctx->n_threads));
    gemv(ctx, n, out, x, w, M, 0.0f);
}
