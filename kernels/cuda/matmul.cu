/*
 * matmul.cu - CUDA twin of kernels/cpu/matmul.c via cuBLAS.
 *
 * Row-major out (M, N) = x (M, K) . W^T is, in cuBLAS's column-major terms, out^T = W . x^T:
 * cublasSgemm(T, N, N, M, K, W (ld K), x (ld K), out (ld N)). Non-f32 weights are dequantized
 * panel by panel into ctx->scratch (device memory) first, as on the CPU.
 */
#include "common.cuh"
#include "gm_cuda.h"

#include <stdio.h>

extern "C" {
#include "gm_backend.h" /* GM_CUBLAS_WORKSPACE_BYTES */
#include "gm_log.h"
}

static cublasHandle_t handle;
static cudaStream_t handle_stream;
static void *workspace; /* cuBLAS's workspace, ours: counted in gm_cuda_peak_bytes, planned */

cublasHandle_t gm_cuda_blas(cudaStream_t s) {
    if (!handle) {
        if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
            handle = NULL;
            gm_log(GM_LOG_ERROR, "cuBLAS initialisation failed");
            gm_cuda_record_error("cuBLAS initialisation failed");
            return NULL;
        }
        workspace = gm_cuda_malloc(GM_CUBLAS_WORKSPACE_BYTES);
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
    snprintf(msg, sizeof msg, "cublasSgemm failed (status %d)", (int)st);
    gm_log(GM_LOG_ERROR, "%s", msg);
    gm_cuda_record_error(msg);
}

void gm_cuda_blas_shutdown(void) {
    if (handle) cublasDestroy(handle);
    handle = NULL;
    gm_cuda_free(workspace);
    workspace = NULL;
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
    for (int64_t p0 = 0; p0 < N; p0 += GM_MATMUL_PANEL_ROWS) {
        int64_t np = N - p0 < GM_MATMUL_PANEL_ROWS ? N - p0 : GM_MATMUL_PANEL_ROWS;
        gm_k_dequant_rows_cuda(ctx, ctx->scratch, w, p0, np);
        sgemm(s, out + p0, x, ctx->scratch, M, np, K, K, N, beta);
    }
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
