/*
 * matmul.cu - CUDA twin of kernels/cpu/matmul.c via cuBLAS.
 *
 * Row-major out (M, N) = x (M, K) . W^T is, in cuBLAS's column-major terms, out^T = W . x^T:
 * cublasSgemm(T, N, N, M, K, W (ld K), x (ld K), out (ld N)). Non-f32 weights are dequantized
 * panel by panel into ctx->scratch (device memory) first, as on the CPU.
 *
 * bf16 (ctx->bf16_gemm, kernels.h): a non-f32 weight multiplies in bf16 with f32 accumulation
 * (cublasGemmEx, CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F, f32 output with beta) - what PEFT +
 * bitsandbytes run on a GPU, and what the tensor cores' bf16 peak counts. A bf16 weight with
 * contiguous rows is used in place; others are dequantized panel by panel into ctx->scratch as
 * bf16 (half the f32 panel's bytes). The activation (x, or dy's panel columns) is rounded to bf16
 * (round to nearest even, __float2bfloat16_rn) into the backend's staging buffer
 * (GM_CUDA_BF16_STAGING_BYTES), in row chunks when it does not fit at once.
 */
#include "common.cuh"
#include "gm_cuda.h"

#include <cuda_bf16.h>
#include <stdio.h>

extern "C" {
#include "gm_backend.h" /* GM_CUBLAS_WORKSPACE_BYTES */
#include "gm_log.h"
}

static cublasHandle_t handle;
static cudaStream_t handle_stream;
static void *workspace; /* cuBLAS's workspace, ours: counted in gm_cuda_peak_bytes, planned */
static __nv_bfloat16 *staging; /* bf16 copies of activations (GM_CUDA_BF16_STAGING_BYTES), planned */

cublasHandle_t gm_cuda_blas(cudaStream_t s) {
    if (!handle) {
        if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
            handle = NULL;
            gm_log(GM_LOG_ERROR, "cuBLAS initialisation failed");
            gm_cuda_record_error("cuBLAS initialisation failed");
            return NULL;
        }
        workspace = gm_cuda_malloc(GM_CUBLAS_WORKSPACE_BYTES);
        staging = (__nv_bfloat16 *)gm_cuda_malloc(GM_CUDA_BF16_STAGING_BYTES);
        handle_stream = (cudaStream_t)-1; /* set below */
    }
    if (s != handle_stream) {
        /* cublasSetStream resets the workspace to cuBLAS's own pool (cuBLAS documentation,
         * cublasSetStream): ours is set again after it */
        cublasSetStream(handle, s);
        if (workspace) cublasSetWorkspace(handle, workspace, GM_CUBLAS_WORKSPACE_BYTES);
        handle_stream = s;
    }
    return handle;
}

static void blas_failed(cublasStatus_t st) {
    char msg[96];
    snprintf(msg, sizeof msg, "cuBLAS GEMM failed (status %d)", (int)st);
    gm_log(GM_LOG_ERROR, "%s", msg);
    gm_cuda_record_error(msg);
}

void gm_cuda_blas_shutdown(void) {
    if (handle) cublasDestroy(handle);
    handle = NULL;
    gm_cuda_free(workspace);
    gm_cuda_free(staging);
    workspace = NULL;
    staging = NULL;
}

/* ---- bf16 ---------------------------------------------------------------------------------- */

#define STAGING_ELEMS (GM_CUDA_BF16_STAGING_BYTES / sizeof(__nv_bfloat16))

/* out (rows, cols) contiguous = bf16 of in (rows, cols) with row stride ld_in. */
__global__ static void to_bf16_k(__nv_bfloat16 *out, const float *in, int64_t rows, int64_t cols, int64_t ld_in) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    out[i] = __float2bfloat16_rn(in[(i / cols) * ld_in + i % cols]);
}

/* Rows [row0, row0 + rows) of any weight as bf16 (rows, cols): the twin of dequant_rows_k. */
__global__ static void dequant_rows_bf16_k(__nv_bfloat16 *out, gm_wview w, int64_t row0, int64_t rows) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * w.cols) return;
    out[i] = __float2bfloat16_rn(gm_dq_welem(w, row0 + i / w.cols, i % w.cols));
}

static void to_bf16(cudaStream_t s, __nv_bfloat16 *out, const float *in, int64_t rows, int64_t cols, int64_t ld_in) {
    if (rows * cols) to_bf16_k<<<gm_blocks(rows * cols, 256), 256, 0, s>>>(out, in, rows, cols, ld_in);
}

/* Rows [p0, p0 + np) of w in bf16: in place for a contiguous bf16 weight (*ld its row stride in
 * elements), else dequantized into `panel` (ld = cols). */
static const __nv_bfloat16 *weight_bf16(cudaStream_t s, const gm_wview *w, int64_t p0, int64_t np,
                                        __nv_bfloat16 *panel, int64_t *ld) {
    if (w->type == GM_BF16 && w->row_bytes % 2 == 0) {
        *ld = (int64_t)(w->row_bytes / 2);
        return (const __nv_bfloat16 *)((const uint8_t *)w->data + (size_t)p0 * w->row_bytes);
    }
    *ld = w->cols;
    if (np * w->cols) dequant_rows_bf16_k<<<gm_blocks(np * w->cols, 256), 256, 0, s>>>(panel, *w, p0, np);
    return panel;
}

/* Row-major C (M, N) f32 = alpha op(A) op(B) + beta C, A and B bf16 (gm_cuda_sgemm_rm's
 * convention, operands swapped for column-major cuBLAS). */
static void gemm_bf16_rm(cudaStream_t s, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *B, int64_t ldb, float beta, float *C,
                         int64_t ldc) {
    cublasHandle_t h = gm_cuda_blas(s);
    if (!h) return;
    const float one = 1.0f;
    cublasStatus_t st = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                                     (int)M, (int)K, &one, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda, &beta, C,
                                     CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) blas_failed(st);
}

/* out (M, N) = beta out + x (M, K) W^T in bf16 (the file comment). */
static void matmul_fwd_bf16(const gm_kctx *ctx, float *out, const float *x, const gm_wview *w, int64_t M, float beta) {
    cudaStream_t s = gm_stream(ctx);
    int64_t N = w->rows, K = w->cols, chunk = (int64_t)STAGING_ELEMS / K;
    if (!staging || chunk < 1) {
        gm_cuda_record_error("bf16 GEMM: no staging buffer for a row of this width");
        return;
    }
    __nv_bfloat16 *panel = (__nv_bfloat16 *)ctx->scratch;
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        int64_t mc = M - m0 < chunk ? M - m0 : chunk;
        to_bf16(s, staging, x + m0 * K, mc, K, K);
        for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
            int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS, ldw = K;
            const __nv_bfloat16 *wp = weight_bf16(s, w, p0, np, panel, &ldw);
            gemm_bf16_rm(s, false, true, mc, np, K, staging, K, wp, ldw, beta, out + m0 * N + p0, N);
        }
    }
}

/* dx (M, K) = beta dx + dy (M, N) W in bf16: per panel of W's rows, dy's matching columns. */
static void matmul_bwd_input_bf16(const gm_kctx *ctx, float *dx, const float *dy, const gm_wview *w, int64_t M,
                                  float beta) {
    cudaStream_t s = gm_stream(ctx);
    int64_t N = w->rows, K = w->cols;
    __nv_bfloat16 *panel = (__nv_bfloat16 *)ctx->scratch;
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS, ldw = K;
        int64_t chunk = (int64_t)STAGING_ELEMS / np;
        if (!staging || chunk < 1) {
            gm_cuda_record_error("bf16 GEMM: no staging buffer");
            return;
        }
        const __nv_bfloat16 *wp = weight_bf16(s, w, p0, np, panel, &ldw);
        for (int64_t m0 = 0; m0 < M; m0 += chunk) {
            int64_t mc = M - m0 < chunk ? M - m0 : chunk;
            to_bf16(s, staging, dy + m0 * N + p0, mc, np, N);
            gemm_bf16_rm(s, false, false, mc, K, np, staging, np, wp, ldw, p0 == 0 ? beta : 1.0f, dx + m0 * K, K);
        }
    }
}

static void sgemm(cudaStream_t s, float *out, const float *x, const float *w, int64_t M, int64_t N, int64_t K,
                  int64_t ldw, int64_t ldc, float beta) {
    cublasHandle_t h = gm_cuda_blas(s);
    if (!h) return;
    const float one = 1.0f;
    cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, w, (int)ldw, x,
                                    (int)K, &beta, out, (int)ldc);
    if (st != CUBLAS_STATUS_SUCCESS) blas_failed(st);
}

extern "C" void gm_k_matmul_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const gm_wview *w, int64_t M,
                                     float beta) {
    cudaStream_t s = gm_stream(ctx);
    int64_t N = w->rows, K = w->cols;
    if (w->type == GM_F32) {
        sgemm(s, out, x, (const float *)w->data, M, N, K, (int64_t)(w->row_bytes / sizeof(float)), N, beta);
        return;
    }
    if (ctx->bf16_gemm) {
        matmul_fwd_bf16(ctx, out, x, w, M, beta);
        return;
    }
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cuda(ctx, ctx->scratch, w, p0, np);
        sgemm(s, out + p0, x, ctx->scratch, M, np, K, K, N, beta);
    }
}

/* One call each: a GPU has no fork / join to share (kernels.h, matmul_fwd_multi). */
extern "C" void gm_k_matmul_fwd_multi_cuda(const gm_kctx *ctx, float *const *out, const float *x,
                                           const gm_wview *const *w, int n, int64_t M) {
    for (int i = 0; i < n; i++) gm_k_matmul_fwd_cuda(ctx, out[i], x, w[i], M, 0.0f);
}

void gm_cuda_sgemm_rm(cudaStream_t s, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cublasHandle_t h = gm_cuda_blas(s);
    if (!h) return;
    cublasStatus_t st = cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A, (int)lda, &beta, C, (int)ldc);
    if (st != CUBLAS_STATUS_SUCCESS) blas_failed(st);
}

extern "C" void gm_k_matmul_bwd_input_cuda(const gm_kctx *ctx, float *dx, const float *dy, const gm_wview *w,
                                           int64_t M, float beta) {
    cudaStream_t s = gm_stream(ctx);
    int64_t N = w->rows, K = w->cols;
    if (w->type == GM_F32) {
        gm_cuda_sgemm_rm(s, false, false, M, K, N, 1.0f, dy, N, (const float *)w->data,
                         (int64_t)(w->row_bytes / sizeof(float)), beta, dx, K);
        return;
    }
    if (ctx->bf16_gemm) {
        matmul_bwd_input_bf16(ctx, dx, dy, w, M, beta);
        return;
    }
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cuda(ctx, ctx->scratch, w, p0, np);
        gm_cuda_sgemm_rm(s, false, false, M, K, np, 1.0f, dy + p0, N, ctx->scratch, K, p0 == 0 ? beta : 1.0f, dx, K);
    }
}

extern "C" void gm_k_matmul_bwd_weight_cuda(const gm_kctx *ctx, float *dw, const float *dy, const float *x,
                                            int64_t M, int64_t N, int64_t K, float beta) {
    gm_cuda_sgemm_rm(gm_stream(ctx), true, false, N, K, M, 1.0f, dy, N, x, K, beta, dw, K);
}
