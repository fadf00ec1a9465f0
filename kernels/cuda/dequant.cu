/*
 * dequant.cu - CUDA twin of kernels/cpu/dequant.c: rows of any weight view to f32.
 */
#include "common.cuh"

__global__ static void dequant_rows_k(float *out, gm_wview w, int64_t row0, int64_t rows) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * w.cols) return;
    out[i] = gm_dq_welem(w, row0 + i / w.cols, i % w.cols);
}

extern "C" void gm_k_dequant_rows_cuda(const gm_kctx *ctx, float *out, const gm_wview *w, int64_t row0,
                                       int64_t rows) {
    int64_t n = rows * w->cols;
    if (n == 0) return;
    dequant_rows_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, *w, row0, rows);
}
