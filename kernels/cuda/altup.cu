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

/* ---- backward (formulas in kernels.h) ------------------------------------------------------- */

__global__ static void altup_predict_dx_k(float *dx, const float *dpred, const float *coef, int64_t S, int64_t N,
                                          int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over S N C */
    if (e >= S * N * C) return;
    int64_t i = e / (N * C), n = (e / C) % N, c = e % C;
    const float *cf = coef + n * S * S;
    float o = dpred[e];
    for (int64_t j = 0; j < S; j++) o += cf[j * S + i] * dpred[(j * N + n) * C + c];
    dx[e] = o;
}

/* one block per (n, j, i): the dot of dpred[j] and x[i] over C */
__global__ static void altup_predict_dcoef_k(float *dcoef, const float *dpred, const float *x, int64_t S, int64_t N,
                                             int64_t C) {
    int64_t b = blockIdx.x, n = b / (S * S), j = (b / S) % S, i = b % S;
    const float *dj = dpred + (j * N + n) * C, *xi = x + (i * N + n) * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dj[c] * xi[c];
    s = gm_block_sum(s);
    if (threadIdx.x == 0) dcoef[b] = s;
}

__global__ static void altup_correct_bwd_k(float *dpred, float *dact, const float *dy, const float *coef, int64_t S,
                                           int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over N C */
    if (e >= N * C) return;
    int64_t n = e / C;
    float v = 0.0f;
    for (int64_t j = 0; j < S; j++) {
        float d = dy[j * N * C + e];
        v += d * (coef[n * S + j] + 1.0f);
        if (j > 0) dpred[j * N * C + e] = d;
    }
    dact[e] = v;
    dpred[e] = dy[e] - v;
}

/* one block per (n, j) */
__global__ static void altup_correct_dcoef_k(float *dcoef, const float *dy, const float *pred, const float *act, int64_t S,
                                             int64_t N, int64_t C) {
    int64_t b = blockIdx.x, n = b / S, j = b % S;
    const float *dj = dy + (j * N + n) * C, *a = act + n * C, *p0 = pred + n * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += dj[c] * (a[c] - p0[c]);
    s = gm_block_sum(s);
    if (threadIdx.x == 0) dcoef[b] = s;
}

__global__ static void rms_match_bwd_k(float *dx, float *dtarget, const float *dy, const float *x, const float *target,
                                       int64_t C, float eps) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * C, *tr = target + n * C, *dyr = dy + n * C;
    float sx = 0.0f, st = 0.0f, s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        sx += xr[c] * xr[c];
        st += tr[c] * tr[c];
        s += dyr[c] * xr[c];
    }
    sx = gm_block_sum(sx);
    st = gm_block_sum(st);
    s = gm_block_sum(s);
    float mx = sx / (float)C, rt = sqrtf(st / (float)C);
    bool above = mx > eps;
    float r = sqrtf(above ? mx : eps), f = rt / r;
    float kx = above ? f * s / ((float)C * r * r) : 0.0f, kt = rt > 0.0f ? s / ((float)C * r * rt) : 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        dx[n * C + c] = f * dyr[c] - kx * xr[c];
        dtarget[n * C + c] += kt * tr[c];
    }
}

__global__ static void gaussian_topk_bwd_k(float *dx, const float *dy, const float *x, int64_t F, float std_mult) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * F, *dyr = dy + n * F;
    float s = 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) s += xr[f];
    float mean = gm_block_sum(s) / (float)F, v = 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) v += (xr[f] - mean) * (xr[f] - mean);
    float sd = sqrtf(gm_block_sum(v) / (float)F), cut = mean + std_mult * sd, G = 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x) G += xr[f] > cut ? dyr[f] : 0.0f;
    G = gm_block_sum(G);
    float k1 = G / (float)F, k2 = sd > 0.0f ? G * std_mult / ((float)F * sd) : 0.0f;
    for (int64_t f = threadIdx.x; f < F; f += blockDim.x)
        dx[n * F + f] = (xr[f] > cut ? dyr[f] : 0.0f) - k1 - k2 * (xr[f] - mean);
}

__global__ static void tanh_bwd_k(float *dx, const float *dy, const float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

extern "C" void gm_k_altup_predict_bwd_cuda(const gm_kctx *ctx, float *dx, float *dcoef, const float *dpred,
                                            const float *x, const float *coef, int64_t S, int64_t N, int64_t C) {
    int64_t n = S * N * C;
    if (!n) return;
    altup_predict_dx_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dpred, coef, S, N, C);
    altup_predict_dcoef_k<<<(unsigned)(N * S * S), 256, 0, gm_stream(ctx)>>>(dcoef, dpred, x, S, N, C);
}

extern "C" void gm_k_altup_correct_bwd_cuda(const gm_kctx *ctx, float *dpred, float *dact, float *dcoef, const float *dy,
                                            const float *pred, const float *act, const float *coef, int64_t S, int64_t N,
                                            int64_t C) {
    int64_t n = N * C;
    if (!n) return;
    altup_correct_dcoef_k<<<(unsigned)(N * S), 256, 0, gm_stream(ctx)>>>(dcoef, dy, pred, act, S, N, C);
    altup_correct_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dpred, dact, dy, coef, S, N, C);
}

extern "C" void gm_k_rms_match_bwd_cuda(const gm_kctx *ctx, float *dx, float *dtarget, const float *dy, const float *x,
                                        const float *target, int64_t N, int64_t C, float eps) {
    if (N) rms_match_bwd_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(dx, dtarget, dy, x, target, C, eps);
}

extern "C" void gm_k_gaussian_topk_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t N,
                                            int64_t F, float std_mult) {
    if (N) gaussian_topk_bwd_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(dx, dy, x, F, std_mult);
}

extern "C" void gm_k_tanh_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *y, int64_t n) {
    if (n) tanh_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, y, n);
}
