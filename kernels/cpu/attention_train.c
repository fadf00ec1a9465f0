/*
 * attention_train.c - attention over whole sequences for training: forward saving the
 * log-sum-exp of every query, and the backward (gemma_architecture.md §1.5; the backward
 * formulas are those of FlashAttention, Dao et al. 2022, with the probabilities recomputed from
 * the saved log-sum-exp instead of stored).
 *
 * Work is split over (batch, query head) pairs; each pair's T x T scores live in its thread's
 * slice of the scratch and are multiplied with OpenBLAS (single-threaded inside the parallel
 * region, which OpenBLAS's OpenMP build does by itself). kv-head gradients are first written
 * per query head into scratch and then summed over each group, so no two threads write the same
 * memory and the result does not depend on the thread count.
 */
#include "kernels.h"

#include "gm_status.h"
#include "gm_omp.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

size_t gm_k_attention_scratch_floats(int64_t B, int64_t T, int64_t H, int64_t D, int n_threads) {
    /* per thread: P and dP (T x T); shared: per-query-head partial dK and dV (B, H, T, D) */
    return (size_t)n_threads * 2u * (size_t)(T * T) + 2u * (size_t)(B * H * T * D);
}

/* First visible key of query t. */
static inline int64_t first_key(int64_t t, int64_t window) {
    return (window > 0 && t - window + 1 > 0) ? t - window + 1 : 0;
}

/* One past the last visible key of query t of sequence b: t + 1 (causal), or the end of its
 * image (kernels.h, kv_end). */
static inline int64_t end_key(const int32_t *kv_end, int64_t b, int64_t T, int64_t t) {
    if (!kv_end) return t + 1;
    int64_t e = kv_end[b * T + t];
    return e < t + 1 ? t + 1 : e > T ? T : e;
}

void gm_k_attention_train_fwd_cpu(const gm_kctx *ctx, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *kv_end, int64_t B, int64_t T, int64_t H,
                                  int64_t KVH, int64_t D, int64_t window, float scale) {
    GM_ASSERT(ctx->scratch && ctx->scratch_floats >= gm_k_attention_scratch_floats(B, T, H, D, ctx->n_threads));
    int64_t group = H / KVH, qs = H * D, ks = KVH * D;
    GM_OMP_FOR(ctx->n_threads, 1, schedule(dynamic, 1),
    for (int64_t task = 0; task < B * H; task++) {
        int64_t b = task / H, h = task % H, kvh = h / group;
        float *S = ctx->scratch + (size_t)omp_get_thread_num() * 2u * (size_t)(T * T);
        const float *qh = q + b * T * qs + h * D, *kh = k + b * T * ks + kvh * D, *vh = v + b * T * ks + kvh * D;
        /* S = scale * Q K^T  (T x T) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)D, scale, qh, (int)qs, kh,
                    (int)ks, 0.0f, S, (int)T);
        for (int64_t t = 0; t < T; t++) {
            float *row = S + t * T;
            int64_t lo = first_key(t, window), hi = end_key(kv_end, b, T, t);
            float mx = -INFINITY;
            for (int64_t j = lo; j < hi; j++) mx = row[j] > mx ? row[j] : mx;
            float sum = 0.0f;
            for (int64_t j = 0; j < T; j++) {
                float e = (j >= lo && j < hi) ? expf(row[j] - mx) : 0.0f;
                row[j] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
            for (int64_t j = lo; j < hi; j++) row[j] *= inv;
            lse[(b * H + h) * T + t] = mx + logf(sum);
        }
        /* O = P V  (T x D), written into the strided (B, T, H, D) output */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, S, (int)T, vh,
                    (int)ks, 0.0f, out + b * T * qs + h * D, (int)qs);
    });
}

void gm_k_attention_bwd_cpu(const gm_kctx *ctx, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int32_t *kv_end, int64_t B, int64_t T, int64_t H,
                            int64_t KVH, int64_t D, int64_t window, float scale) {
    GM_ASSERT(ctx->scratch && ctx->scratch_floats >= gm_k_attention_scratch_floats(B, T, H, D, ctx->n_threads));
    int64_t group = H / KVH, qs = H * D, ks = KVH * D;
    float *dk_part = ctx->scratch + (size_t)ctx->n_threads * 2u * (size_t)(T * T);
    float *dv_part = dk_part + (size_t)(B * H * T * D);
    GM_OMP_FOR(ctx->n_threads, 1, schedule(dynamic, 1),
    for (int64_t task = 0; task < B * H; task++) {
        int64_t b = task / H, h = task % H, kvh = h / group;
        float *P = ctx->scratch + (size_t)omp_get_thread_num() * 2u * (size_t)(T * T);
        float *dP = P + T * T;
        const float *qh = q + b * T * qs + h * D, *kh = k + b * T * ks + kvh * D, *vh = v + b * T * ks + kvh * D;
        const float *doh = dout + b * T * qs + h * D, *oh = out + b * T * qs + h * D;
        const float *lh = lse + (b * H + h) * T;
        /* recompute P = exp(scale Q K^T - lse) on the visible keys */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)D, scale, qh, (int)qs, kh,
                    (int)ks, 0.0f, P, (int)T);
        for (int64_t t = 0; t < T; t++) {
            int64_t lo = first_key(t, window), hi = end_key(kv_end, b, T, t);
            float *row = P + t * T;
            for (int64_t j = 0; j < T; j++) row[j] = (j >= lo && j < hi) ? expf(row[j] - lh[t]) : 0.0f;
        }
        /* dV_h = P^T dO  (T x D), per query head */
        float *dvh = dv_part + (b * H + h) * T * D;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)D, (int)T, 1.0f, P, (int)T, doh,
                    (int)qs, 0.0f, dvh, (int)D);
        /* dP = dO V^T; dS = P * (dP - rowsum(dO * O)) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)D, 1.0f, doh, (int)qs, vh,
                    (int)ks, 0.0f, dP, (int)T);
        for (int64_t t = 0; t < T; t++) {
            float delta = 0.0f;
            for (int64_t d = 0; d < D; d++) delta += doh[t * qs + d] * oh[t * qs + d];
            float *pr = P + t * T, *dr = dP + t * T;
            for (int64_t j = 0; j < T; j++) dr[j] = pr[j] * (dr[j] - delta);
        }
        /* dQ_h = scale dS K ; dK_h = scale dS^T Q_h */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)D, (int)T, scale, dP, (int)T, kh,
                    (int)ks, 0.0f, dq + b * T * qs + h * D, (int)qs);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)D, (int)T, scale, dP, (int)T, qh,
                    (int)qs, 0.0f, dk_part + (b * H + h) * T * D, (int)D);
    });
    /* sum the query heads of each group into the kv-head gradients */
    GM_OMP_FOR(ctx->n_threads, 1, collapse(2) schedule(static),
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            for (int64_t kh = 0; kh < KVH; kh++) {
                float *dkr = dk + (b * T + t) * ks + kh * D, *dvr = dv + (b * T + t) * ks + kh * D;
                for (int64_t d = 0; d < D; d++) dkr[d] = dvr[d] = 0.0f;
                for (int64_t g = 0; g < group; g++) {
                    int64_t h = kh * group + g;
                    const float *pk = dk_part + ((b * H + h) * T + t) * D, *pv = dv_part + ((b * H + h) * T + t) * D;
                    for (int64_t d = 0; d < D; d++) {
                        dkr[d] += pk[d];
                        dvr[d] += pv[d];
                    }
                }
            }
        }
    });
}
