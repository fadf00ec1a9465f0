/*
 * rope.cu - CUDA twin of kernels/cpu/rope.c (NeoX half-split RoPE), forward and backward. One
 * thread per (row, head, pair); out may alias x because each thread reads and writes only its
 * own pair. The backward is the same rotation by the negated angle (the rotation matrix is
 * orthogonal: R^T = R(-angle)), so both launch one kernel with sign = +1 / -1, as on the CPU.
 * Pairs k >= n_rot pass through (Gemma 4's proportional RoPE).
 */
#include "common.cuh"

__global__ static void rope_k(float *out, const float *x, const int32_t *pos, int64_t N, int64_t NH, int64_t D,
                              int64_t n_rot, float theta, float pos_scale, float sign) {
    int64_t half = D / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * NH * half) return;
    int64_t k = i % half, h = (i / half) % NH, n = i / (half * NH);
    const float *xr = x + (n * NH + h) * D;
    float x1 = xr[k], x2 = xr[k + half];
    float *o = out + (n * NH + h) * D;
    if (k >= n_rot) { /* a zero frequency (proportional RoPE): the pair passes through */
        o[k] = x1;
        o[k + half] = x2;
        return;
    }
    float inv_freq = 1.0f / powf(theta, (float)(2 * k) / (float)D);
    float ang = ((float)pos[n] * pos_scale) * inv_freq;
    float c = cosf(ang), s = sign * sinf(ang);
    o[k] = x1 * c - x2 * s;
    o[k + half] = x2 * c + x1 * s;
}

static void rope(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos, int64_t N, int64_t NH,
                 int64_t D, int64_t n_rot, float theta, float pos_scale, float sign) {
    int64_t n = N * NH * (D / 2);
    if (n == 0) return;
    rope_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, pos, N, NH, D, n_rot, theta, pos_scale, sign);
}

extern "C" void gm_k_rope_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos, int64_t N,
                                   int64_t NH, int64_t D, int64_t n_rot, float theta, float pos_scale) {
    rope(ctx, out, x, pos, N, NH, D, n_rot, theta, pos_scale, 1.0f);
}

extern "C" void gm_k_rope_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const int32_t *pos, int64_t N,
                                   int64_t NH, int64_t D, int64_t n_rot, float theta, float pos_scale) {
    rope(ctx, dx, dy, pos, N, NH, D, n_rot, theta, pos_scale, -1.0f);
}
