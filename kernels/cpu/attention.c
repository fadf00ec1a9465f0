/*
 * attention.c - causal (optionally sliding-window) grouped-query attention forward.
 *
 * q (B, T, H, D) holds queries at absolute positions pos0 .. pos0+T-1. Keys and values live in
 * caches (B, S, KVH, D); absolute position j is in slot j % S, so one kernel serves training
 * (S = T, pos0 = 0), prefill and token-by-token generation with ring-buffered sliding layers
 * (S = window). Query head h reads kv head h / (H / KVH) (consecutive query heads share a kv
 * head, gemma_architecture.md §1.5 step 6).
 *
 * Visible keys for query position p: j <= p (causal), or j < kv_end[b, t] when kv_end is given
 * (an image's tokens see their whole image: gemma_architecture.md §2.4), and, if window > 0,
 * j > p - window (HF sliding_window_overlay: kv_idx > q_idx - W, applied after the image OR).
 *
 * Softmax is computed in blocks of KEY_BLOCK keys with a running max and sum (the "online"
 * softmax of FlashAttention, Dao et al. 2022), in f32, so no score buffer of length S is needed.
 */
#include "kernels.h"

#include "gm_status.h"
#include "gm_omp.h"

#include <math.h>
#include <string.h>

#define KEY_BLOCK 64
#define MAX_HEAD_DIM 1024

static float dotf(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void gm_k_attention_fwd_cpu(const gm_kctx *ctx, float *out, const float *q, const float *k_cache,
                            const float *v_cache, const int32_t *kv_end, int64_t B, int64_t T, int64_t H,
                            int64_t KVH, int64_t D, int64_t S, int64_t pos0, int64_t window, float scale) {
    GM_ASSERT(H % KVH == 0 && D <= MAX_HEAD_DIM);
    int64_t group = H / KVH;
    /* Decoding one token (T = 1) over a short context is a few hundred thousand multiply-adds,
     * less than waking the other threads costs (a parallel region per layer and token; kernels.h,
     * gm_kernels_startup: their waits sleep after a short spin): such calls run on the calling thread. The bound is
     * on B * T * H * keys * D multiply-adds of q k (as many again for p v): 2^20, ~0.1 ms here. */
    int64_t work = B * T * H * (pos0 + T) * D;
    GM_OMP_FOR(ctx->n_threads, work > ((int64_t)1 << 20), collapse(3) schedule(static),
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) {
                int64_t p = pos0 + t;
                int64_t lo = 0;
                if (window > 0 && p - window + 1 > lo) lo = p - window + 1;
                /* the last visible key: p, or the end of the query's image (within this call) */
                int64_t last = kv_end ? (int64_t)kv_end[b * T + t] - 1 : p;
                if (last < p) last = p;
                if (last > pos0 + T - 1) last = pos0 + T - 1;
                GM_ASSERT(last - lo + 1 <= S); /* every visible key must still be in the cache */
                const float *qv = q + ((b * T + t) * H + h) * D;
                int64_t kvh = h / group;
                float acc[MAX_HEAD_DIM];
                memset(acc, 0, (size_t)D * sizeof(float));
                float m = -INFINITY, l = 0.0f;
                float sc[KEY_BLOCK];
                for (int64_t j0 = lo; j0 <= last; j0 += KEY_BLOCK) {
                    int64_t nj = last + 1 - j0 < KEY_BLOCK ? last + 1 - j0 : KEY_BLOCK;
                    float bm = -INFINITY;
                    for (int64_t jj = 0; jj < nj; jj++) {
                        int64_t slot = (j0 + jj) % S;
                        const float *kv = k_cache + ((b * S + slot) * KVH + kvh) * D;
                        sc[jj] = dotf(qv, kv, D) * scale;
                        if (sc[jj] > bm) bm = sc[jj];
                    }
                    float mn = bm > m ? bm : m;
                    float corr = expf(m - mn); /* exp(-inf) = 0 on the first block */
                    l *= corr;
                    for (int64_t d = 0; d < D; d++) acc[d] *= corr;
                    for (int64_t jj = 0; jj < nj; jj++) {
                        int64_t slot = (j0 + jj) % S;
                        const float *vv = v_cache + ((b * S + slot) * KVH + kvh) * D;
                        float w = expf(sc[jj] - mn);
                        l += w;
                        for (int64_t d = 0; d < D; d++) acc[d] += w * vv[d];
                    }
                    m = mn;
                }
                float *o = out + ((b * T + t) * H + h) * D;
                float inv = 1.0f / l;
                for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
            }
        }
    });
}
