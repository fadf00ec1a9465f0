/*
 * optim.c - AdamW update and the sum of squares behind gradient-norm clipping (kernels.h).
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>
#include <omp.h>

void gm_k_adamw_cpu(const gm_kctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, float beta1,
                    float beta2, float eps, float decay, float step_size, float bc2_sqrt) {
    float one_m_b1 = 1.0f - beta1, one_m_b2 = 1.0f - beta2;
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        p[i] *= decay;
        m[i] += one_m_b1 * (gi - m[i]);           /* torch lerp_(grad, 1 - beta1), weight < 0.5 */
        v[i] = v[i] * beta2 + one_m_b2 * gi * gi; /* mul_(beta2).addcmul_(g, g, 1 - beta2) */
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] += -step_size * m[i] / denom;        /* addcdiv_(m, denom, value=-step_size) */
    });
}

/* Per-thread partial sums combined in thread order, so the total does not depend on timing. */
void gm_k_sumsq_cpu(const gm_kctx *ctx, double *out, const float *x, int64_t n) {
    double part[256] = {0};
    int nt = ctx->n_threads < 256 ? ctx->n_threads : 256;
    GM_OMP_PARALLEL(nt, n > 65536, {
        int id = omp_get_thread_num(), k = omp_get_num_threads();
        int64_t lo = n * id / k, hi = n * (id + 1) / k;
        double s = 0.0;
        for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[id] = s;
    });
    double total = 0.0;
    for (int i = 0; i < nt; i++) total += part[i];
    *out = total;
}
