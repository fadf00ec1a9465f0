/*
 * vision4.cu - CUDA twins of kernels/cpu/vision4.c (Gemma 4's vision tower): the clipped linears'
 * clamps, one thread per element, the bounds read on the device from the one float each of the
 * checkpoint's buffers (no host copy, no synchronization); the 2-D RoPE, one thread per (row,
 * head, half, pair) - the first half of a head at pos_x, the second at pos_y, each rope.cu's
 * rotation of head width D/2. out may alias x: each thread reads and writes only its own element
 * or pair. The backward is the same rotation by the negated angle.
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
