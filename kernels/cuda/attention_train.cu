/*
 * attention_train.cu - CUDA twins of kernels/cpu/attention_train.c. Each (batch, query head)
 * pair is processed in turn with cuBLAS for the three products and small kernels for the masked
 * softmax and the dS step; per-query-head kv gradients are summed over groups at the end, as on
 * the CPU. Scratch layout matches gm_k_attention_scratch_floats with ctx->n_threads = 1.
 */
#include "common.cuh"

static __device__ __forceinline__ int64_t first_key(int64_t t, int64_t window) {
    return (window > 0 && t - window + 1 > 0) ? t - window + 1 : 0;
}

/* One past the last visible key of query t (kernels.h, kv_end; kv_end already offset to the
 * (b) sequence by the caller). */
static __device__ __forceinline__ int64_t end_key(const int32_t *kv_end, int64_t T, int64_t t) {
    if (!kv_end) return t + 1;
    int64_t e = kv_end[t];
    return e < t + 1 ? t + 1 : e > T ? T : e;
}

/* One block per query row: masked softmax of S in place, lse saved. */
__global__ static void softmax_rows_k(float *S, float *lse, const int32_t *kv_end, int64_t T, int64_t window) {
    int64_t t = blockIdx.x, lo = first_key(t, window), hi = end_key(kv_end, T, t);
    float *row = S + t * T;
    float mx = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) mx = fmaxf(mx, row[j]);
    __shared__ float smax[32];
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) smax[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x / 32); i++) mx = fmaxf(mx, smax[i]);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
        float e = (j >= lo && j < hi) ? expf(row[j] - mx) : 0.0f;
        row[j] = e;
        sum += e;
    }
    sum = gm_block_sum(sum);
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) row[j] /= sum;
    if (threadIdx.x == 0) lse[t] = mx + logf(sum);
}

__global__ static void recompute_p_k(float *P, const float *lse, const int32_t *kv_end, int64_t T, int64_t window) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * T) return;
    int64_t t = i / T, j = i % T;
    P[i] = (j >= first_key(t, window) && j < end_key(kv_end, T, t)) ? expf(P[i] - lse[t]) : 0.0f;
}

/* One block per row: dS = P * (dP - sum_d dO*O) in place in dP. */
__global__ static void ds_rows_k(float *dP, const float *P, const float *dO, const float *O, int64_t T, int64_t D,
                                 int64_t ld) {
    int64_t t = blockIdx.x;
    float delta = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) delta += dO[t * ld + d] * O[t * ld + d];
    delta = gm_block_sum(delta);
    for (int64_t j = threadIdx.x; j < T; j += blockDim.x) dP[t * T + j] = P[t * T + j] * (dP[t * T + j] - delta);
}

__global__ static void group_sum_k(float *dk, float *dv, const float *dk_part, const float *dv_part, int64_t B,
                                   int64_t T, int64_t H, int64_t KVH, int64_t D) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * T * KVH * D) return;
    int64_t d = i % D, kh = (i / D) % KVH, t = (i / (D * KVH)) % T, b = i / (D * KVH * T);
    int64_t group = H / KVH;
    float sk = 0.0f, sv = 0.0f;
    for (int64_t g = 0; g < group; g++) {
        int64_t h = kh * group + g;
        sk += dk_part[((b * H + h) * T + t) * D + d];
        sv += dv_part[((b * H + h) * T + t) * D + d];
    }
    dk[i] = sk;
    dv[i] = sv;
}

extern "C" void gm_k_attention_train_fwd_cuda(const gm_kctx *ctx, float *out, float *lse, const float *q,
                                              const float *k, const float *v, const int32_t *kv_end, int64_t B,
                                              int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t window,
                                              float scale) {
    cudaStream_t s = gm_stream(ctx);
    int64_t group = H / KVH, qs = H * D, ks = KVH * D;
    float *S = ctx->scratch;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t kvh = h / group;
            const float *qh = q + b * T * qs + h * D, *kh = k + b * T * ks + kvh * D, *vh = v + b * T * ks + kvh * D;
            gm_cuda_sgemm_rm(s, false, true, T, T, D, scale, qh, qs, kh, ks, 0.0f, S, T);
            softmax_rows_k<<<(unsigned)T, 256, 0, s>>>(S, lse + (b * H + h) * T, kv_end ? kv_end + b * T : NULL, T,
                                                        window);
            gm_cuda_sgemm_rm(s, false, false, T, D, T, 1.0f, S, T, vh, ks, 0.0f, out + b * T * qs + h * D, qs);
        }
}

extern "C" void gm_k_attention_bwd_cuda(const gm_kctx *ctx, float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v, const float *out,
                                        const float *lse, const int32_t *kv_end, int64_t B, int64_t T, int64_t H,
                                        int64_t KVH, int64_t D, int64_t window, float scale) {
    cudaStream_t s = gm_stream(ctx);
    int64_t group = H / KVH, qs = H * D, ks = KVH * D;
    float *P = ctx->scratch, *dP = P + T * T;
    float *dk_part = ctx->scratch + (size_t)ctx->n_threads * 2u * (size_t)(T * T);
    float *dv_part = dk_part + B * H * T * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t kvh = h / group;
            const float *qh = q + b * T * qs + h * D, *kh = k + b * T * ks + kvh * D, *vh = v + b * T * ks + kvh * D;
            const float *doh = dout + b * T * qs + h * D, *oh = out + b * T * qs + h * D;
            gm_cuda_sgemm_rm(s, false, true, T, T, D, scale, qh, qs, kh, ks, 0.0f, P, T);
            recompute_p_k<<<gm_blocks(T * T, 256), 256, 0, s>>>(P, lse + (b * H + h) * T,
                                                                 kv_end ? kv_end + b * T : NULL, T, window);
            gm_cuda_sgemm_rm(s, true, false, T, D, T, 1.0f, P, T, doh, qs, 0.0f, dv_part + (b * H + h) * T * D, D);
            gm_cuda_sgemm_rm(s, false, true, T, T, D, 1.0f, doh, qs, vh, ks, 0.0f, dP, T);
            ds_rows_k<<<(unsigned)T, 256, 0, s>>>(dP, P, doh, oh, T, D, qs);
            gm_cuda_sgemm_rm(s, false, false, T, D, T, scale, dP, T, kh, ks, 0.0f, dq + b * T * qs + h * D, qs);
            gm_cuda_sgemm_rm(s, true, false, T, D, T, scale, dP, T, qh, qs, 0.0f, dk_part + (b * H + h) * T * D, D);
        }
    int64_t n = B * T * KVH * D;
    group_sum_k<<<gm_blocks(n, 256), 256, 0, s>>>(dk, dv, dk_part, dv_part, B, T, H, KVH, D);
}
