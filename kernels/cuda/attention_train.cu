/*
 * attention_train.cu - CUDA twins of kernels/cpu/attention_train.c, fused: no T x T score matrix
 * is ever stored (the CPU twin keeps one per head and thread; at max_length 2048 that is 16 MiB a
 * head, and cuBLAS products over it move T^2 floats through memory three times per head).
 *
 * Forward: one block per (query t, head h, sequence b) streams the visible keys in tiles of
 * ATT_THREADS with the online softmax (running maximum m and sum l, the accumulator rescaled by
 * exp(m_old - m_new) per tile: Milakov & Gimelshein 2018, "Online normalizer calculation for
 * softmax"; FlashAttention, Dao et al. 2022) and writes out = acc / l and lse = m + log l.
 * Backward (FlashAttention-2's equations, Dao 2023, with P recomputed from the saved lse):
 *   delta_t = dO_t . O_t;  p_tj = exp(scale q_t . k_j - lse_t);  ds_tj = p_tj (dO_t . v_j - delta_t)
 *   dQ_t = scale sum_j ds_tj k_j      (one block per query row, keys streamed)
 *   dK_j = scale sum_{h in group, t} ds_tj q_t,  dV_j = sum_{h in group, t} p_tj dO_t
 *                                     (one block per key row and kv head, queries streamed)
 * Each output row is summed by one block in a fixed order: no atomics, the same bits on every
 * run. Visibility is kernels.h's: key j of query t when first_key(t) <= j < end_key(t) (causal,
 * sliding window, kv_end for images seen whole). Scratch: delta (B, H, T) floats, within
 * gm_k_attention_scratch_floats (which the CPU twin sizes, and the plan counts, for both).
 */
#include "common.cuh"

#define ATT_THREADS 128

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

static __device__ __forceinline__ float dot(const float *a, const float *b, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* grid (T, H, B); shared: q row (D), accumulator (D), the tile's probabilities (ATT_THREADS). */
__global__ static void att_fwd_k(float *out, float *lse, const float *q, const float *k, const float *v,
                                 const int32_t *kv_end, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t window,
                                 float scale) {
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KVH), qs = H * D, ks = KVH * D;
    extern __shared__ float sm[];
    float *qr = sm, *acc = sm + D, *pt = sm + 2 * D;
    const float *qp = q + (b * T + t) * qs + h * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qr[d] = qp[d], acc[d] = 0.0f;
    __syncthreads();
    const float *kb = k + b * T * ks + kvh * D, *vb = v + b * T * ks + kvh * D;
    int64_t lo = first_key(t, window), hi = end_key(kv_end ? kv_end + b * T : NULL, T, t);
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = lo; j0 < hi; j0 += ATT_THREADS) {
        int64_t j = j0 + threadIdx.x, nt = hi - j0 < ATT_THREADS ? hi - j0 : ATT_THREADS;
        float s = j < hi ? dot(qr, kb + j * ks, D) * scale : -INFINITY;
        float mnew = fmaxf(m, gm_block_max(s)); /* finite: the tile has a visible key */
        float p = j < hi ? expf(s - mnew) : 0.0f;
        pt[threadIdx.x] = p;
        float corr = expf(m - mnew); /* 0 on the first tile (m = -inf) */
        l = l * corr + gm_block_sum(p); /* gm_block_sum synchronizes: pt is complete */
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float a = acc[d] * corr;
            for (int64_t jj = 0; jj < nt; jj++) a += pt[jj] * vb[(j0 + jj) * ks + d];
            acc[d] = a;
        }
        m = mnew;
        __syncthreads(); /* pt is rewritten by the next tile */
    }
    float *op = out + (b * T + t) * qs + h * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) op[d] = acc[d] / l;
    if (threadIdx.x == 0) lse[(b * H + h) * T + t] = m + logf(l);
}

/* delta (B, H, T) = dO . O per query row; grid (T, H, B). */
__global__ static void att_delta_k(float *delta, const float *dout, const float *out, int64_t T, int64_t H, int64_t D) {
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, off = (b * T + t) * H * D + h * D;
    float s = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += dout[off + d] * out[off + d];
    s = gm_block_sum(s);
    if (threadIdx.x == 0) delta[(b * H + h) * T + t] = s;
}

/* dQ; grid (T, H, B); shared: q row, dO row, accumulator (D each), ds of the tile. */
__global__ static void att_dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
                                const float *lse, const float *delta, const int32_t *kv_end, int64_t T, int64_t H,
                                int64_t KVH, int64_t D, int64_t window, float scale) {
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kvh = h / (H / KVH), qs = H * D, ks = KVH * D;
    extern __shared__ float sm[];
    float *qr = sm, *dor = sm + D, *acc = sm + 2 * D, *dst = sm + 3 * D;
    int64_t row = (b * T + t) * qs + h * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qr[d] = q[row + d], dor[d] = dout[row + d], acc[d] = 0.0f;
    __syncthreads();
    const float *kb = k + b * T * ks + kvh * D, *vb = v + b * T * ks + kvh * D;
    float lt = lse[(b * H + h) * T + t], dt = delta[(b * H + h) * T + t];
    int64_t lo = first_key(t, window), hi = end_key(kv_end ? kv_end + b * T : NULL, T, t);
    for (int64_t j0 = lo; j0 < hi; j0 += ATT_THREADS) {
        int64_t j = j0 + threadIdx.x, nt = hi - j0 < ATT_THREADS ? hi - j0 : ATT_THREADS;
        float ds = 0.0f;
        if (j < hi) {
            float p = expf(dot(qr, kb + j * ks, D) * scale - lt);
            ds = p * (dot(dor, vb + j * ks, D) - dt);
        }
        dst[threadIdx.x] = ds;
        __syncthreads();
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float a = acc[d];
            for (int64_t jj = 0; jj < nt; jj++) a += dst[jj] * kb[(j0 + jj) * ks + d];
            acc[d] = a;
        }
        __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dq[row + d] = scale * acc[d];
}

/* dK, dV; grid (T keys, KVH, B); shared: k row, v row, two accumulators (D each), p and ds of
 * the tile. The queries that may see key j: all (kv_end: an image's tokens see ahead), else
 * those from j on, within the window. */
__global__ static void att_dkv_k(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                                 const float *lse, const float *delta, const int32_t *kv_end, int64_t T, int64_t H,
                                 int64_t KVH, int64_t D, int64_t window, float scale) {
    int64_t j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, group = H / KVH, qs = H * D, ks = KVH * D;
    extern __shared__ float sm[];
    float *kr = sm, *vr = sm + D, *dka = sm + 2 * D, *dva = sm + 3 * D, *pt = sm + 4 * D, *dst = pt + ATT_THREADS;
    int64_t row = (b * T + j) * ks + kvh * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) kr[d] = k[row + d], vr[d] = v[row + d], dka[d] = 0.0f, dva[d] = 0.0f;
    __syncthreads();
    const int32_t *ke = kv_end ? kv_end + b * T : NULL;
    int64_t tlo = ke ? 0 : j, thi = (!ke && window > 0 && j + window < T) ? j + window : T;
    for (int64_t g = 0; g < group; g++) {
        int64_t h = kvh * group + g;
        const float *qb = q + b * T * qs + h * D, *db = dout + b * T * qs + h * D;
        for (int64_t t0 = tlo; t0 < thi; t0 += ATT_THREADS) {
            int64_t t = t0 + threadIdx.x, nt = thi - t0 < ATT_THREADS ? thi - t0 : ATT_THREADS;
            float p = 0.0f, ds = 0.0f;
            if (t < thi && j >= first_key(t, window) && j < end_key(ke, T, t)) {
                p = expf(dot(qb + t * qs, kr, D) * scale - lse[(b * H + h) * T + t]);
                ds = p * (dot(db + t * qs, vr, D) - delta[(b * H + h) * T + t]);
            }
            pt[threadIdx.x] = p, dst[threadIdx.x] = ds;
            __syncthreads();
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
                float a = dka[d], c = dva[d];
                for (int64_t tt = 0; tt < nt; tt++) {
                    a += dst[tt] * qb[(t0 + tt) * qs + d];
                    c += pt[tt] * db[(t0 + tt) * qs + d];
                }
                dka[d] = a, dva[d] = c;
            }
            __syncthreads();
        }
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dk[row + d] = scale * dka[d], dv[row + d] = dva[d];
}

extern "C" void gm_k_attention_train_fwd_cuda(const gm_kctx *ctx, float *out, float *lse, const float *q,
                                              const float *k, const float *v, const int32_t *kv_end, int64_t B,
                                              int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t window,
                                              float scale) {
    if (B * T * H == 0) return;
    dim3 grid((unsigned)T, (unsigned)H, (unsigned)B);
    size_t shm = (size_t)(2 * D + ATT_THREADS) * sizeof(float);
    att_fwd_k<<<grid, ATT_THREADS, shm, gm_stream(ctx)>>>(out, lse, q, k, v, kv_end, T, H, KVH, D, window, scale);
}

extern "C" void gm_k_attention_bwd_cuda(const gm_kctx *ctx, float *dq, float *dk, float *dv, const float *dout,
                                        const float *q, const float *k, const float *v, const float *out,
                                        const float *lse, const int32_t *kv_end, int64_t B, int64_t T, int64_t H,
                                        int64_t KVH, int64_t D, int64_t window, float scale) {
    if (B * T * H == 0) return;
    cudaStream_t s = gm_stream(ctx);
    float *delta = ctx->scratch; /* (B, H, T) */
    dim3 qgrid((unsigned)T, (unsigned)H, (unsigned)B), kgrid((unsigned)T, (unsigned)KVH, (unsigned)B);
    att_delta_k<<<qgrid, ATT_THREADS, 0, s>>>(delta, dout, out, T, H, D);
    att_dq_k<<<qgrid, ATT_THREADS, (size_t)(3 * D + ATT_THREADS) * sizeof(float), s>>>(dq, dout, q, k, v, lse, delta,
                                                                                        kv_end, T, H, KVH, D, window, scale);
    att_dkv_k<<<kgrid, ATT_THREADS, (size_t)(4 * D + 2 * ATT_THREADS) * sizeof(float), s>>>(
        dk, dv, dout, q, k, v, lse, delta, kv_end, T, H, KVH, D, window, scale);
}
