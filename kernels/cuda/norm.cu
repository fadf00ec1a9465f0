/*
 * norm.cu - CUDA twin of kernels/cpu/norm.c (RMSNorm with an effective-scale weight).
 * One block per row; the sum of squares is reduced in f32 across the block (the CPU reference
 * uses double: the difference is inside the kernel tolerance table).
 */
#include "common.cuh"

__global__ static void rmsnorm_k(float *out, float *rstd, const float *x, const float *w, int64_t C, float eps) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * C;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
    ss = gm_block_sum(ss);
    float r = rsqrtf(ss / (float)C + eps);
    if (rstd && threadIdx.x == 0) rstd[n] = r;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = w ? (xr[c] * r) * w[c] : xr[c] * r;
}

extern "C" void gm_k_rmsnorm_fwd_cuda(const gm_kctx *ctx, float *out, float *rstd, const float *x, const float *w,
                                      int64_t N, int64_t C, float eps) {
    if (N == 0) return;
    rmsnorm_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(out, rstd, x, w, C, eps);
}
