/*
 * moe.c - Gemma 4's mixture-of-experts routing and combination (kernels.h: moe_*), the CPU
 * reference. Sources: transformers' Gemma4TextRouter (softmax in f32, topk, renormalize, then
 * per_expert_scale) and Gemma4TextExperts (the weighted sum of the chosen experts' outputs);
 * gemma_architecture.md §4.4.
 *
 * Backward of the routing weights w_k = p_{i_k} / s * q_{i_k} (s = sum over the chosen p, q the
 * per-expert scale): with g_k = dw_k q_{i_k}, dp_j = g_j / s - sum_k g_k p_{i_k} / s^2 for a chosen
 * j (0 otherwise), then the softmax's dz = p (dp - sum_j p_j dp_j). Sums in double.
 */
#include "gm_omp.h"
#include "kernels.h"

#include <math.h>
#include <stdbool.h>

void gm_k_moe_route_fwd_cpu(const gm_kctx *ctx, int32_t *idx, float *w, float *probs, const float *per_expert_scale,
                            int64_t N, int64_t E, int64_t K) {
    GM_OMP_FOR(ctx->n_threads, N * E > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
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
        /* top K by selection, largest first; ties keep the lower expert */
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
        for (int64_t k = 0; k < K; k++) w[n * K + k] = (float)(p[ix[k]] / s) * per_expert_scale[ix[k]];
    });
}

void gm_k_moe_route_bwd_cpu(const gm_kctx *ctx, float *dlogits, const float *dw, const float *probs, const int32_t *idx,
                            const float *per_expert_scale, int64_t N, int64_t E, int64_t K) {
    GM_OMP_FOR(ctx->n_threads, N * E > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *p = probs + n * E;
        const int32_t *ix = idx + n * K;
        float *dz = dlogits + n * E;
        double s = 0.0, gp = 0.0;
        for (int64_t k = 0; k < K; k++) {
            s += p[ix[k]];
            gp += (double)dw[n * K + k] * per_expert_scale[ix[k]] * p[ix[k]];
        }
        for (int64_t e = 0; e < E; e++) dz[e] = 0.0f;
        /* dp on the chosen experts, then dz = p (dp - p . dp) */
        double pdp = 0.0;
        for (int64_t k = 0; k < K; k++) {
            double dp = (double)dw[n * K + k] * per_expert_scale[ix[k]] / s - gp / (s * s);
            dz[ix[k]] = (float)dp;
            pdp += p[ix[k]] * dp;
        }
        for (int64_t e = 0; e < E; e++) dz[e] = (float)(p[e] * ((double)dz[e] - pdp));
    });
}

void gm_k_moe_combine_fwd_cpu(const gm_kctx *ctx, float *y, const float *ys, const float *w, const int32_t *slot, int64_t N,
                              int64_t K, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * K * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        float *yr = y + n * C;
        for (int64_t c = 0; c < C; c++) yr[c] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const float *r = ys + (int64_t)slot[n * K + k] * C;
            float wk = w ? w[n * K + k] : 1.0f;
            for (int64_t c = 0; c < C; c++) yr[c] += wk * r[c];
        }
    });
}

void gm_k_moe_combine_bwd_cpu(const gm_kctx *ctx, float *dys, float *dw, const float *dy, const float *ys, const float *w,
                              const int32_t *slot, int64_t N, int64_t K, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * K * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *g = dy + n * C;
        for (int64_t k = 0; k < K; k++) {
            int64_t s = slot[n * K + k];
            if (dw) {
                double d = 0.0;
                for (int64_t c = 0; c < C; c++) d += (double)g[c] * ys[s * C + c];
                dw[n * K + k] = (float)d;
            }
            float wk = w[n * K + k];
            for (int64_t c = 0; c < C; c++) dys[s * C + c] = wk * g[c];
        }
    });
}
