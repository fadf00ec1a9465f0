/*
 * movement.cu - CUDA twins of kernels/cpu/movement.c (fill, row gather / scatter, KV-cache
 * store, log-sum-exp finish).
 */
#include "common.cuh"

__global__ static void fill_k(float *out, int64_t n, float value) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

/* One element per thread: (row i, column c) of the R x C block. */
__global__ static void gather_k(float *out, const float *x, const int32_t *rows, int64_t R, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= R * C) return;
    int64_t i = e / C, c = e % C;
    out[e] = x[(int64_t)rows[i] * C + c];
}

__global__ static void scatter_k(float *out, const float *x, const int32_t *rows, int64_t R, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= R * C) return;
    int64_t i = e / C, c = e % C;
    out[(int64_t)rows[i] * C + c] = x[e];
}

__global__ static void kv_store_k(float *cache, const float *x, int64_t B, int64_t T, int64_t S, int64_t W,
                                  int64_t pos0) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= B * T * W) return;
    int64_t w = e % W, bt = e / W, t = bt % T, b = bt / T;
    cache[(b * S + (pos0 + t) % S) * W + w] = x[e];
}

__global__ static void lse_finish_k(float *lse, const float *run_max, const float *run_sum, int64_t R) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < R) lse[i] = run_max[i] + logf(run_sum[i]);
}

extern "C" void gm_k_fill_cuda(const gm_kctx *ctx, float *out, int64_t n, float value) {
    if (n) fill_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, n, value);
}

extern "C" void gm_k_gather_rows_cuda(const gm_kctx *ctx, float *out, const float *x, const int32_t *rows, int64_t R,
                                      int64_t C) {
    if (R * C) gather_k<<<gm_blocks(R * C, 256), 256, 0, gm_stream(ctx)>>>(out, x, rows, R, C);
}

extern "C" void gm_k_scatter_rows_cuda(const gm_kctx *ctx, float *out, const float *x, const int32_t *rows, int64_t R,
                                       int64_t C) {
    if (R * C) scatter_k<<<gm_blocks(R * C, 256), 256, 0, gm_stream(ctx)>>>(out, x, rows, R, C);
}

extern "C" void gm_k_kv_store_cuda(const gm_kctx *ctx, float *cache, const float *x, int64_t B, int64_t T, int64_t S,
                                   int64_t W, int64_t pos0) {
    int64_t n = B * T * W;
    if (n) kv_store_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(cache, x, B, T, S, W, pos0);
}

extern "C" void gm_k_xent_lse_finish_cuda(const gm_kctx *ctx, float *lse, const float *run_max, const float *run_sum,
                                          int64_t R) {
    if (R) lse_finish_k<<<gm_blocks(R, 256), 256, 0, gm_stream(ctx)>>>(lse, run_max, run_sum, R);
}
