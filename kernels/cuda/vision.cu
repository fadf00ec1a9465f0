/*
 * vision.cu - CUDA twins of kernels/cpu/vision.c: LayerNorm (one block per row, statistics in
 * f32 block reductions; the CPU reference accumulates in double), bias, GELU, average pooling.
 * LayerNorm's weight and bias gradients are column sums: one thread per column.
 */
#include "common.cuh"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

__global__ static void layernorm_k(float *out, float *mean, float *rstd, const float *x, const float *w,
                                   const float *b, int64_t C, float eps) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
    float m = gm_block_sum(s) / (float)C;
    float v = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v += (xr[c] - m) * (xr[c] - m);
    float r = rsqrtf(gm_block_sum(v) / (float)C + eps);
    if (threadIdx.x == 0) {
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = r;
    }
    __syncthreads(); /* out may alias x: every thread has read its row's statistics inputs */
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = (xr[c] - m) * r * w[c] + b[c];
}

__global__ static void layernorm_bwd_k(float *dx, const float *dy, const float *x, const float *w, const float *mean,
                                       const float *rstd, int64_t C, float beta) {
    int64_t n = blockIdx.x;
    const float *xr = x + n * C, *dyr = dy + n * C;
    float m = mean[n], r = rstd[n], sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float g = dyr[c] * w[c];
        sg += g;
        sgx += g * (xr[c] - m) * r;
    }
    float mg = gm_block_sum(sg) / (float)C;
    float mgx = gm_block_sum(sgx) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = r * (dyr[c] * w[c] - mg - (xr[c] - m) * r * mgx);
        dx[n * C + c] = beta != 0.0f ? dx[n * C + c] + v : v;
    }
}

__global__ static void layernorm_dwdb_k(float *dw, float *db, const float *dy, const float *x, const float *mean,
                                        const float *rstd, int64_t N, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int64_t n = 0; n < N; n++) {
        float d = dy[n * C + c];
        sw += d * (x[n * C + c] - mean[n]) * rstd[n];
        sb += d;
    }
    if (dw) dw[c] += sw;
    if (db) db[c] += sb;
}

__global__ static void bias_k(float *y, const float *b, int64_t N, int64_t C) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N * C) y[i] += b[i % C];
}

__global__ static void gelu_k(float *out, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float z = x[i];
    out[i] = 0.5f * z * (1.0f + tanhf(GELU_C * (z + 0.044715f * z * z * z)));
}

__global__ static void gelu_bwd_k(float *dx, const float *dy, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float z = x[i];
    float t = tanhf(GELU_C * (z + 0.044715f * z * z * z));
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * 0.044715f * z * z));
}

__global__ static void avgpool_k(float *out, const float *x, int64_t B, int64_t P, int64_t K, int64_t C) {
    int64_t Q = P / K, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * Q * Q * C) return;
    int64_t c = i % C, o = i / C, b = o / (Q * Q), qi = (o / Q) % Q, qj = o % Q;
    float s = 0.0f;
    for (int64_t di = 0; di < K; di++)
        for (int64_t dj = 0; dj < K; dj++) s += x[((b * P + qi * K + di) * P + qj * K + dj) * C + c];
    out[i] = s * (1.0f / (float)(K * K));
}

__global__ static void avgpool_bwd_k(float *dx, const float *dy, int64_t B, int64_t P, int64_t K, int64_t C) {
    int64_t Q = P / K, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * P * P * C) return;
    int64_t c = i % C, t = i / C, b = t / (P * P), y = (t / P) % P, xc = t % P;
    dx[i] = dy[((b * Q + y / K) * Q + xc / K) * C + c] * (1.0f / (float)(K * K));
}

extern "C" void gm_k_layernorm_fwd_cuda(const gm_kctx *ctx, float *out, float *mean, float *rstd, const float *x,
                                        const float *w, const float *b, int64_t N, int64_t C, float eps) {
    if (N) layernorm_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(out, mean, rstd, x, w, b, C, eps);
}

extern "C" void gm_k_layernorm_bwd_cuda(const gm_kctx *ctx, float *dx, float *dw, float *db, const float *dy,
                                        const float *x, const float *w, const float *mean, const float *rstd, int64_t N,
                                        int64_t C, float beta) {
    if (!N) return;
    layernorm_bwd_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(dx, dy, x, w, mean, rstd, C, beta);
    if (dw || db) layernorm_dwdb_k<<<gm_blocks(C, 256), 256, 0, gm_stream(ctx)>>>(dw, db, dy, x, mean, rstd, N, C);
}

extern "C" void gm_k_bias_fwd_cuda(const gm_kctx *ctx, float *y, const float *b, int64_t N, int64_t C) {
    if (N * C) bias_k<<<gm_blocks(N * C, 256), 256, 0, gm_stream(ctx)>>>(y, b, N, C);
}

extern "C" void gm_k_gelu_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n) {
    if (n) gelu_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n);
}

extern "C" void gm_k_gelu_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n) {
    if (n) gelu_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, x, n);
}

extern "C" void gm_k_avgpool_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t B, int64_t P, int64_t K,
                                      int64_t C) {
    int64_t n = B * (P / K) * (P / K) * C;
    if (n) avgpool_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, B, P, K, C);
}

extern "C" void gm_k_avgpool_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, int64_t B, int64_t P, int64_t K,
                                      int64_t C) {
    int64_t n = B * P * P * C;
    if (n) avgpool_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, B, P, K, C);
}
