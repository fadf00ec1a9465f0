/*
 * dequant.cu - CUDA twin of kernels/cpu/dequant.c: rows of any stored dtype to f32.
 */
#include "common.cuh"

__global__ static void dequant_rows_k(float *out, const uint8_t *src, gm_dtype type, int64_t rows,
                                      int64_t cols, size_t row_bytes) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    int64_t r = i / cols, c = i % cols;
    out[i] = gm_dq_elem(type, src + (size_t)r * row_bytes, c);
}

extern "C" void gm_k_dequant_rows_cuda(const gm_kctx *ctx, float *out, const void *src, gm_dtype type,
                                       int64_t rows, int64_t cols, size_t src_row_bytes) {
    int64_t n = rows * cols;
    if (n == 0) return;
    dequant_rows_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, (const uint8_t *)src, type, rows, cols,
                                                                 src_row_bytes);
}
