/*
 * attention.cu - CUDA twin of kernels/cpu/attention.c: causal / sliding GQA attention over a
 * ring-buffered KV cache, online softmax in f32. One block per (b, t, h), one thread per head
 * dimension (D <= 1024); each key's score is a block-wide reduction. Straightforward rather than
 * fast: the tiled version belongs in kernels/cuda/lab/ until it beats this one.
 */
#include "common.cuh"

__global__ static void attention_k(float *out, const float *q, const float *kc, const float *vc,
                                   const int32_t *kv_end, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S,
                                   int64_t pos0, int64_t window, float scale) {
    int64_t h = blockIdx.x % H, t = (blockIdx.x / H) % T, b = blockIdx.x / (H * T);
    int64_t d = threadIdx.x;
    int64_t p = pos0 + t, lo = 0;
    if (window > 0 && p - window + 1 > lo) lo = p - window + 1;
    int64_t last = kv_end ? (int64_t)kv_end[b * T + t] - 1 : p; /* the end of the query's image */
    if (last < p) last = p;
    if (last > pos0 + T - 1) last = pos0 + T - 1;
    int64_t kvh = h / (H / KVH);
    float qd = d < D ? q[((b * T + t) * H + h) * D + d] : 0.0f;
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int64_t j = lo; j <= last; j++) {
        int64_t slot = j % S;
        const float *kv = kc + ((b * S + slot) * KVH + kvh) * D;
        float s = gm_block_sum(d < D ? qd * kv[d] : 0.0f) * scale;
        float mn = fmaxf(m, s);
        float corr = __expf(m - mn), w = __expf(s - mn);
        l = l * corr + w;
        float vd = d < D ? vc[((b * S + slot) * KVH + kvh) * D + d] : 0.0f;
        acc = acc * corr + w * vd;
        m = mn;
    }
    if (d < D) out[((b * T + t) * H + h) * D + d] = acc / l;
}

extern "C" void gm_k_attention_fwd_cuda(const gm_kctx *ctx, float *out, const float *q, const float *k_cache,
                                        const float *v_cache, const int32_t *kv_end, int64_t B, int64_t T,
                                        int64_t H, int64_t KVH, int64_t D, int64_t S, int64_t pos0, int64_t window,
                                        float scale) {
    if (B * T * H == 0) return;
    unsigned threads = (unsigned)((D + 31) / 32 * 32);
    attention_k<<<(unsigned)(B * T * H), threads, 0, gm_stream(ctx)>>>(out, q, k_cache, v_cache, kv_end, T, H, KVH, D,
                                                                        S, pos0, window, scale);
}
