/*
 * elementwise.c - GeGLU, residual add, soft-capping.
 *
 * gelu_tanh(z) = 0.5 z (1 + tanh(c (z + 0.044715 z^3))), c = sqrt(2/pi)
 * (gemma_architecture.md §1.6; PyTorch gelu(approximate="tanh")).
 * softcap(x) = cap * tanh(x / cap) (§1.7; Gemma 3n/4 final logits).
 */
#include "kernels.h"

#include <math.h>

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

static inline float gelu_tanh(float z) {
    return 0.5f * z * (1.0f + tanhf(GELU_C * (z + 0.044715f * z * z * z)));
}

void gm_k_geglu_fwd_cpu(const gm_kctx *ctx, float *out, const float *gate, const float *up,
                        int64_t n) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) out[i] = gelu_tanh(gate[i]) * up[i];
}

void gm_k_add_fwd_cpu(const gm_kctx *ctx, float *y, const float *x, int64_t n) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static) if (n > 262144)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void gm_k_softcap_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, float cap) {
#pragma omp parallel for num_threads(ctx->n_threads) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) out[i] = cap * tanhf(x[i] / cap);
}
