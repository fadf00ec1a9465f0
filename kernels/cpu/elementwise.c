/*
 * elementwise.c - GeGLU (forward, backward), residual add, soft-capping, scaling, dropout.
 *
 * gelu_tanh(z) = 0.5 z (1 + tanh(c (z + 0.044715 z^3))), c = sqrt(2/pi)
 * (gemma_architecture.md §1.6; PyTorch gelu(approximate="tanh")); tanh and exp: vmath.h.
 * softcap(x) = cap * tanh(x / cap) (§1.7; Gemma 3n/4 final logits).
 */
#include "kernels.h"

#include "gm_philox.h"
#include "gm_omp.h"
#include "vmath.h"

#include <math.h>

GM_CPU_CLONES void gm_k_geglu_fwd_cpu(const gm_kctx *ctx, float *out, const float *gate, const float *up,
                        int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
        for (int64_t i = 0; i < n; i++) out[i] = gm_gelu_tanh(gate[i]) * up[i];
    );
}

void gm_k_add_fwd_cpu(const gm_kctx *ctx, float *y, const float *x, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
        for (int64_t i = 0; i < n; i++) y[i] += x[i];
    );
}

GM_CPU_CLONES void gm_k_softcap_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, float cap) {
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
        for (int64_t i = 0; i < n; i++) out[i] = cap * gm_vtanhf(x[i] / cap);
    );
}

/* d gelu_tanh / dz: vmath.h. dgate may alias gate, dup may alias up: each element is read before
 * it is written. */
GM_CPU_CLONES void gm_k_geglu_bwd_cpu(const gm_kctx *ctx, float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        float z = gate[i], u = up[i], g = dh[i];
        float gelu, dgelu = gm_gelu_tanh_grad(z, &gelu);
        dgate[i] = g * u * dgelu;
        dup[i] = g * gelu;
    });
}

void gm_k_scale_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, float s) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
        for (int64_t i = 0; i < n; i++) out[i] = s * x[i];
    );
}

void gm_k_dropout_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, float p, uint64_t key) {
    float keep_scale = 1.0f / (1.0f - p);
    GM_OMP_FOR(ctx->n_threads, n > 65536, schedule(static),
        for (int64_t i = 0; i < n; i++) out[i] = gm_philox_uniform(key, (uint64_t)i) >= p ? x[i] * keep_scale : 0.0f;
    );
}
