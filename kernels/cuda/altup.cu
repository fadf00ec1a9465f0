/*
 * altup.cu - CUDA twins of kernels/cpu/altup.c (Gemma 3n: AltUp predict / correct, magnitude
 * matching, gaussian top-k, per-channel scale). Row statistics: one block per row, reduced in f32
 * across the block (the CPU reference uses double: inside the kernel tolerance table).
 */
#include "common.cuh"

__global__ static void altup_predict_k(float *out, const float *x, const float *coef, int64_t S, int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over S N C */
    if (e >= S * N * C) return;
    int64_t j = e / (N * C), n = (e / C) % N, c = e % C;
    const float *cf = coef + n * S * S + j * S;
    float o = x[e];
    for (int64_t i = 0; i < S; i++) o += cf[i] * x[(i * N + n) * C + c];
    out[e] = o;
}

__global__ static void altup_correct_k(float *out, const float *pred, const float *act, const float *coef, int64_t S,
                                       int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over N C: all streams of one element */
    if (e >= N * C) return;
    int64_t n = e / C;
    float innov = act[e] - pred[e];
    for (int64_t j = 0; j < S; j++) out[j * N * C + e] = pred[j * N * C + e] + (coef[n * S + j] + 1.0f) * innov;
}

__global__ static void rms_match_k(float *out, const float *x, const float *target, int64_t C, float eps) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * C, *tr = target + n * C;
    float sx = 0.0f, st = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        sx += xr[c] * xr[c];
        st += tr[c] * tr[c];
    }
    sx = gm_block_sum(sx);
    st = gm_block_sum(st);
    float mx = sx / (float)C;
    float f = sqrtf(st / (float)C) / sqrtf(mx > eps ? mx : eps);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = xr[c] * f;
}

__global__ static void gaussian_topk_k(float *out, const float *x, int64_t F, float std_mult) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * F;
    float s = 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) s += xr[f];
    float mean = gm_block_sum(s) / (float)F, v = 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) v += (xr[f] - mean) * (xr[f] - mean);
    float cut = mean + std_mult * sqrtf(gm_block_sum(v) / (float)F);
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) out[n * F + f] = xr[f] > cut ? xr[f] - cut : 0.0f;
}

__global__ static void mul_cols_k(float *out, const float *x, const float *s, int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < N * C) out[e] = x[e] * s[e % C];
}

extern "C" void gm_k_altup_predict_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *coef, int64_t S,
                                            int64_t N, int64_t C) {
    int64_t n = S * N * C;
    if (n) altup_predict_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, coef, S, N, C);
}

extern "C" void gm_k_altup_correct_fwd_cuda(const gm_kctx *ctx, float *out, const float *pred, const float *act,
                                            const float *coef, int64_t S, int64_t N, int64_t C) {
    int64_t n = N * C;
    if (n) altup_correct_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, pred, act, coef, S, N, C);
}

extern "C" void gm_k_rms_match_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *target, int64_t N,
                                        int64_t C, float eps) {
    if (N) rms_match_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(out, x, target, C, eps);
}

extern "C" void gm_k_gaussian_topk_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t N, int64_t F,
                                            float std_mult) {
    if (N) gaussian_topk_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(out, x, F, std_mult);
}

extern "C" void gm_k_mul_cols_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *s, int64_t N,
                                       int64_t C) {
    int64_t n = N * C;
    if (n) mul_cols_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, s, N, C);
}
