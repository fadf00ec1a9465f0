/*
 * vision4.cu - CUDA twins of kernels/cpu/vision4.c (Gemma 4's vision tower): the clipped linears'
 * clamps, one thread per element, the bounds read on the device from the one float each of the
 * checkpoint's buffers (no host copy, no synchronization); the 2-D RoPE, one thread per (row,
 * head, half, pair) - the first half of a head at pos_x, the second at pos_y, each rope.cu's
 * rotation of head width D/2. out may alias x: each thread reads and writes only its own element
 * or pair. The backward is the same rotation by the negated angle. Pooling by positions: one
 * thread per (token, channel) sums its K rows in src's order, then scales (vision4.c's operations
 * in its order); the backward zeroes dx, then one thread per (token, j, channel) assigns - each x
 * row is named at most once (kernels.h), so no atomics.
 */
#include "common.cuh"

__global__ static void clip_k(float *out, const float *x, int64_t n, const float *lo, const float *hi) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float l = *lo, h = *hi;
    float v = x[e] < l ? l : x[e]; /* comparisons, not fminf / fmaxf: NaN stays NaN, as on the CPU */
    out[e] = v > h ? h : v;
}

__global__ static void clip_bwd_k(float *dx, const float *dy, const float *x, int64_t n, const float *lo,
                                  const float *hi) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float l = *lo, h = *hi;
    dx[e] = x[e] >= l && x[e] <= h ? dy[e] : 0.0f;
}

__global__ static void rope2d_k(float *out, const float *x, const int32_t *pos_x, const int32_t *pos_y, int64_t N,
                                int64_t NH, int64_t D, float theta, float sign) {
    int64_t half = D / 2, q = D / 4;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * NH * half) return;
    int64_t k = i % half, h = (i / half) % NH, n = i / (half * NH);
    int64_t part = k / q, j = k % q;
    const float *xr = x + (n * NH + h) * D + part * half;
    float *o = out + (n * NH + h) * D + part * half;
    float x1 = xr[j], x2 = xr[j + q];
    float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)half);
    float ang = ((float)(part ? pos_y[n] : pos_x[n]) * 1.0f) * inv_freq;
    float c = cosf(ang), s = sign * sinf(ang);
    o[j] = x1 * c - x2 * s;
    o[j + q] = x2 * c + x1 * s;
}

__global__ static void pool_gather_k(float *out, const float *x, const int32_t *src, int64_t R, int64_t K, int64_t C,
                                     float scale) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= R * C) return;
    int64_t r = e / C, c = e % C;
    const int32_t *s = src + r * K;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) acc += x[(int64_t)s[j] * C + c];
    out[e] = acc * scale;
}

__global__ static void pool_gather_bwd_k(float *dx, const float *dout, const int32_t *src, int64_t R, int64_t K,
                                         int64_t C, float scale) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= R * K * C) return;
    int64_t rj = e / C, c = e % C, r = rj / K;
    dx[(int64_t)src[rj] * C + c] = scale * dout[r * C + c];
}

extern "C" void gm_k_clip_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n, const float *lo,
                                   const float *hi) {
    if (n > 0) clip_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n, lo, hi);
}

extern "C" void gm_k_clip_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n,
                                   const float *lo, const float *hi) {
    if (n > 0) clip_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, x, n, lo, hi);
}

static void rope2d(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos_x, const int32_t *pos_y,
                   int64_t N, int64_t NH, int64_t D, float theta, float sign) {
    int64_t n = N * NH * (D / 2);
    if (n == 0) return;
    rope2d_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, pos_x, pos_y, N, NH, D, theta, sign);
}

extern "C" void gm_k_rope2d_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos_x,
                                     const int32_t *pos_y, int64_t N, int64_t NH, int64_t D, float theta) {
    rope2d(ctx, out, x, pos_x, pos_y, N, NH, D, theta, 1.0f);
}

extern "C" void gm_k_rope2d_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const int32_t *pos_x,
                                     const int32_t *pos_y, int64_t N, int64_t NH, int64_t D, float theta) {
    rope2d(ctx, dx, dy, pos_x, pos_y, N, NH, D, theta, -1.0f);
}

extern "C" void gm_k_pool_gather_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const int32_t *src,
                                          int64_t R, int64_t K, int64_t C, float scale) {
    if (R * C > 0) pool_gather_k<<<gm_blocks(R * C, 256), 256, 0, gm_stream(ctx)>>>(out, x, src, R, K, C, scale);
}

extern "C" void gm_k_pool_gather_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dout, const int32_t *src,
                                          int64_t R, int64_t K, int64_t N, int64_t C, float scale) {
    if (N * C > 0) GM_CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)(N * C) * sizeof(float), gm_stream(ctx)));
    if (R * K * C > 0)
        pool_gather_bwd_k<<<gm_blocks(R * K * C, 256), 256, 0, gm_stream(ctx)>>>(dx, dout, src, R, K, C, scale);
}
