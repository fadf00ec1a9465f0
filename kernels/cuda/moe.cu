/*
 * moe.cu - CUDA twins of kernels/cpu/moe.c (Gemma 4's mixture-of-experts routing and
 * combination; formulas in kernels.h and the CPU file). Routing: one thread per token (E and K
 * are small: 128 and 8 in 26B-A4B), sums in double as on the CPU. Combination: one thread per
 * (token, channel), the K slots summed in order, so the result does not depend on scheduling.
 */
#include "common.cuh"

__global__ static void route_fwd_k(int32_t *idx, float *w, float *probs, const float *pes, int64_t N, int64_t E, int64_t K) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float *p = probs + n * E;
    float mx = p[0];
    for (int64_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t e = 0; e < E; e++) p[e] *= inv;
    int32_t *ix = idx + n * K;
    double s = 0.0;
    for (int64_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k; j++) taken = taken || ix[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
        }
        ix[k] = best;
        s += p[best];
    }
    for (int64_t k = 0; k < K; k++) w[n * K + k] = (float)(p[ix[k]] / s) * pes[ix[k]];
}

__global__ static void route_bwd_k(float *dlogits, const float *dw, const float *probs, const int32_t *idx, const float *pes,
                                   int64_t N, int64_t E, int64_t K) {
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float *p = probs + n * E;
    const int32_t *ix = idx + n * K;
    float *dz = dlogits + n * E;
    double s = 0.0, gp = 0.0;
    for (int64_t k = 0; k < K; k++) {
        s += p[ix[k]];
        gp += (double)dw[n * K + k] * pes[ix[k]] * p[ix[k]];
    }
    for (int64_t e = 0; e < E; e++) dz[e] = 0.0f;
    double pdp = 0.0;
    for (int64_t k = 0; k < K; k++) {
        double dp = (double)dw[n * K + k] * pes[ix[k]] / s - gp / (s * s);
        dz[ix[k]] = (float)dp;
        pdp += p[ix[k]] * dp;
    }
    for (int64_t e = 0; e < E; e++) dz[e] = (float)(p[e] * ((double)dz[e] - pdp));
}

__global__ static void combine_fwd_k(float *y, const float *ys, const float *w, const int32_t *slot, int64_t N, int64_t K,
                                     int64_t C) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C) return;
    int64_t n = i / C, c = i % C;
    float o = 0.0f;
    for (int64_t k = 0; k < K; k++) o += (w ? w[n * K + k] : 1.0f) * ys[(int64_t)slot[n * K + k] * C + c];
    y[i] = o;
}

/* dw: one block per (token, choice), reduced across the block (the CPU sums in double) */
__global__ static void combine_dw_k(float *dw, const float *dy, const float *ys, const int32_t *slot, int64_t K, int64_t C) {
    int64_t nk = blockIdx.x, n = nk / K;
    const float *g = dy + n * C, *r = ys + (int64_t)slot[nk] * C;
    float d = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d += g[c] * r[c];
    d = gm_block_sum(d);
    if (threadIdx.x == 0) dw[nk] = d;
}

__global__ static void combine_dys_k(float *dys, const float *dy, const float *w, const int32_t *slot, int64_t N, int64_t K,
                                     int64_t C) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * K * C) return;
    int64_t nk = i / C, c = i % C, n = nk / K;
    dys[(int64_t)slot[nk] * C + c] = w[nk] * dy[n * C + c];
}

extern "C" void gm_k_moe_route_fwd_cuda(const gm_kctx *ctx, int32_t *idx, float *w, float *probs, const float *per_expert_scale,
                                        int64_t N, int64_t E, int64_t K) {
    if (N == 0) return;
    route_fwd_k<<<gm_blocks(N, 128), 128, 0, gm_stream(ctx)>>>(idx, w, probs, per_expert_scale, N, E, K);
}

extern "C" void gm_k_moe_route_bwd_cuda(const gm_kctx *ctx, float *dlogits, const float *dw, const float *probs,
                                        const int32_t *idx, const float *per_expert_scale, int64_t N, int64_t E, int64_t K) {
    if (N == 0) return;
    route_bwd_k<<<gm_blocks(N, 128), 128, 0, gm_stream(ctx)>>>(dlogits, dw, probs, idx, per_expert_scale, N, E, K);
}

extern "C" void gm_k_moe_combine_fwd_cuda(const gm_kctx *ctx, float *y, const float *ys, const float *w, const int32_t *slot,
                                          int64_t N, int64_t K, int64_t C) {
    if (N * C == 0) return;
    combine_fwd_k<<<gm_blocks(N * C, 256), 256, 0, gm_stream(ctx)>>>(y, ys, w, slot, N, K, C);
}

extern "C" void gm_k_moe_combine_bwd_cuda(const gm_kctx *ctx, float *dys, float *dw, const float *dy, const float *ys,
                                          const float *w, const int32_t *slot, int64_t N, int64_t K, int64_t C) {
    if (N * K * C == 0) return;
    /* dw reads ys before dys (which may alias it) is written: two launches on one stream */
    if (dw) combine_dw_k<<<(unsigned)(N * K), 256, 0, gm_stream(ctx)>>>(dw, dy, ys, slot, K, C);
    combine_dys_k<<<gm_blocks(N * K * C, 256), 256, 0, gm_stream(ctx)>>>(dys, dy, w, slot, N, K, C);
}
