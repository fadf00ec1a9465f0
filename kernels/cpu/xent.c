/*
 * xent.c - the two halves of the chunked cross-entropy over the vocabulary (kernels.h).
 *
 * The LM head produces logits for R rows and one vocabulary chunk [v0, v0+Vc) at a time; the
 * first pass folds each chunk into a running max and sum of exponentials per row (online
 * log-sum-exp), the second recomputes each chunk and turns it into its gradient. Full
 * (R x 262,144) logits never exist (DESIGN.md §7). Optional final soft-capping
 * z = c tanh(l / c) (Gemma 3n/4) with dz/dl = 1 - (z/c)^2 (gemma_architecture.md §1.7).
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>

static inline float capped(float l, float c) { return c > 0.0f ? c * tanhf(l / c) : l; }

void gm_k_xent_lse_update_cpu(const gm_kctx *ctx, float *run_max, float *run_sum, float *tgt_logit,
                              const float *logits, const int32_t *targets, int64_t R, int64_t Vc, int64_t v0,
                              float softcap) {
    GM_OMP_FOR(ctx->n_threads, 1, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        const float *row = logits + r * Vc;
        float mx = run_max[r];
        for (int64_t j = 0; j < Vc; j++) {
            float z = capped(row[j], softcap);
            mx = z > mx ? z : mx;
        }
        /* rescale the old sum to the new max (exp(-inf) = 0 on the first chunk) */
        double s = run_max[r] == -INFINITY ? 0.0 : (double)run_sum[r] * exp((double)run_max[r] - (double)mx);
        for (int64_t j = 0; j < Vc; j++) s += exp((double)capped(row[j], softcap) - (double)mx);
        run_max[r] = mx;
        run_sum[r] = (float)s;
        int32_t t = targets[r];
        if (t >= v0 && t < v0 + Vc) tgt_logit[r] = capped(row[t - v0], softcap);
    });
}

void gm_k_xent_grad_cpu(const gm_kctx *ctx, float *dlogits, const float *lse, const int32_t *targets, int64_t R,
                        int64_t Vc, int64_t v0, float softcap, float grad_scale) {
    GM_OMP_FOR(ctx->n_threads, 1, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        float *row = dlogits + r * Vc;
        int32_t t = targets[r];
        if (t < 0) {
            for (int64_t j = 0; j < Vc; j++) row[j] = 0.0f;
            continue;
        }
        for (int64_t j = 0; j < Vc; j++) {
            float z = capped(row[j], softcap);
            float g = expf(z - lse[r]) - (v0 + j == t ? 1.0f : 0.0f);
            if (softcap > 0.0f) g *= 1.0f - (z / softcap) * (z / softcap);
            row[j] = grad_scale * g;
        }
    });
}
