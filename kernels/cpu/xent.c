/*
 * xent.c - the chunked cross-entropy over the vocabulary (kernels.h: xent_*).
 *
 * The LM head produces logits for R rows and one vocabulary chunk [v0, v0+Vc) at a time; each
 * chunk is folded into a running max and sum of exponentials per row (online log-sum-exp,
 * Milakov & Gimelshein 2018, arXiv:1805.02867). Without a gradient that is all (xent_lse_update).
 * With one, the same pass turns the chunk into softmax weights relative to the running max and the
 * caller multiplies them into dh at once; dh is rescaled whenever the max grows, as flash
 * attention rescales its output (Dao et al. 2022, arXiv:2205.14135), so the logits are computed
 * once instead of twice (xent_grad_update, xent_grad_finish). Full (R x 262,144) logits never
 * exist (DESIGN.md §7). Optional final soft-capping z = c tanh(l / c) (Gemma 3n/4) with
 * dz/dl = 1 - (z/c)^2 (gemma_architecture.md §1.7).
 *
 * Speed: the exponentials are the loop's cost (262,144 per row and step), so exp and tanh are
 * vmath.h's, which GCC vectorizes (GM_CPU_CLONES), and the row statistics are kept in 16 lanes.
 */
#include "kernels.h"
#include "gm_omp.h"
#include "vmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

static inline float capped(float l, float c) { return c > 0.0f ? c * gm_vtanhf(l / c) : l; }

/* The (soft-capped) chunk row's max, folded with the running max m. */
GM_CPU_CLONES static float row_max(const float *row, int64_t Vc, float softcap, float m) {
    float lane[LANES];
    for (int l = 0; l < LANES; l++) lane[l] = m;
    int64_t j = 0;
    if (softcap > 0.0f) {
        for (; j < Vc; j++) {
            float z = capped(row[j], softcap);
            m = z > m ? z : m;
        }
        return m;
    }
    for (; j + LANES <= Vc; j += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = row[j + l] > lane[l] ? row[j + l] : lane[l];
    for (; j < Vc; j++) m = row[j] > m ? row[j] : m;
    for (int l = 0; l < LANES; l++) m = lane[l] > m ? lane[l] : m;
    return m;
}

/* sum_j exp(z_j - m) (lanes in double); with w, also w_j = exp(z_j - m) dz/dl (w may be row). */
GM_CPU_CLONES static double row_sumexp(const float *row, float *w, int64_t Vc, float softcap, float m) {
    double lane[LANES] = {0};
    int64_t j = 0;
    if (softcap > 0.0f) {
        double s = 0;
        for (; j < Vc; j++) {
            float z = capped(row[j], softcap), e = gm_vexpf(z - m);
            s += e;
            if (w) w[j] = e * (1.0f - (z / softcap) * (z / softcap));
        }
        return s;
    }
    if (w)
        for (; j + LANES <= Vc; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float e = gm_vexpf(row[j + l] - m);
                lane[l] += e;
                w[j + l] = e;
            }
    else
        for (; j + LANES <= Vc; j += LANES)
            for (int l = 0; l < LANES; l++) lane[l] += gm_vexpf(row[j + l] - m);
    double s = 0;
    for (; j < Vc; j++) {
        float e = gm_vexpf(row[j] - m);
        s += e;
        if (w) w[j] = e;
    }
    for (int l = 0; l < LANES; l++) s += lane[l];
    return s;
}

/* One row of xent_lse_update / xent_grad_update; returns exp(old max - new max) (0 on the first
 * chunk: exp(-inf) = 0). */
static float row_update(float *run_max, float *run_sum, float *tgt_logit, const float *row, float *w,
                        int32_t t, int64_t Vc, int64_t v0, float softcap) {
    float old = *run_max, mx = row_max(row, Vc, softcap, old);
    if (t >= v0 && t < v0 + Vc) *tgt_logit = capped(row[t - v0], softcap); /* before w overwrites row */
    double alpha = old == -INFINITY ? 0.0 : exp((double)old - (double)mx);
    *run_sum = (float)((double)*run_sum * alpha + row_sumexp(row, w, Vc, softcap, mx));
    *run_max = mx;
    return (float)alpha;
}

void gm_k_xent_lse_update_cpu(const gm_kctx *ctx, float *run_max, float *run_sum, float *tgt_logit,
                              const float *logits, const int32_t *targets, int64_t R, int64_t Vc, int64_t v0,
                              float softcap) {
    GM_OMP_FOR(ctx->n_threads, 1, schedule(static),
    for (int64_t r = 0; r < R; r++)
        row_update(&run_max[r], &run_sum[r], &tgt_logit[r], logits + r * Vc, NULL, targets[r], Vc, v0, softcap);
    );
}

void gm_k_xent_grad_update_cpu(const gm_kctx *ctx, float *run_max, float *run_sum, float *tgt_logit, float *logits,
                               float *dh, const int32_t *targets, int64_t R, int64_t Vc, int64_t v0, int64_t C,
                               float softcap) {
    GM_OMP_FOR(ctx->n_threads, 1, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        float *row = logits + r * Vc, *d = dh + r * C;
        int32_t t = targets[r];
        float alpha = row_update(&run_max[r], &run_sum[r], &tgt_logit[r], row, row, t, Vc, v0, softcap);
        if (t >= v0 && t < v0 + Vc) row[t - v0] = 0.0f; /* the target's p_t - 1 is added whole at the finish */
        if (alpha == 0.0f) memset(d, 0, (size_t)C * sizeof(float)); /* the first chunk, or a max that jumped */
        else if (alpha != 1.0f)
            for (int64_t c = 0; c < C; c++) d[c] *= alpha;
    });
}

void gm_k_xent_grad_finish_cpu(const gm_kctx *ctx, float *dh, const float *e_tgt, const float *run_sum,
                               const float *lse, const float *tgt_logit, const int32_t *targets, int64_t R, int64_t C,
                               float softcap, float grad_scale) {
    GM_OMP_FOR(ctx->n_threads, 1, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        float *d = dh + r * C;
        const float *e = e_tgt + r * C;
        if (targets[r] < 0) {
            memset(d, 0, (size_t)C * sizeof(float));
            continue;
        }
        float z = tgt_logit[r], dz = softcap > 0.0f ? 1.0f - (z / softcap) * (z / softcap) : 1.0f;
        float inv = grad_scale / run_sum[r], te = grad_scale * dz * (expf(z - lse[r]) - 1.0f);
        for (int64_t c = 0; c < C; c++) d[c] = inv * d[c] + te * e[c];
    });
}
