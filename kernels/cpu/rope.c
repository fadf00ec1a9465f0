/*
 * rope.c - rotary position embedding, NeoX/half-split layout (gemma_architecture.md §1.5).
 *
 * For each head vector x = [x1 | x2] (halves of D/2) at position p:
 *   inv_freq[i] = theta^(-2i/D), angle = (p * pos_scale) * inv_freq[i]   (f32, as HF computes it)
 *   out = [x1*cos - x2*sin | x2*cos + x1*sin]
 * Only pairs i < n_rot rotate; the others pass through (inv_freq 0: cos 1, sin 0), as Gemma 4's
 * proportional RoPE (transformers' _compute_proportional_rope_parameters: the rotated pairs keep
 * the exponent denominator D, the rest are zero frequencies).
 * pos_scale is 1/factor for linear RoPE scaling (Gemma 3 4B+ global layers), else 1.
 * Backward: the rotation is orthogonal, so the gradient is rotated by -angle (sin negated).
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>

/* sign = +1: the rotation; sign = -1: its transpose (the backward). */
static void rope(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos, int64_t N, int64_t NH,
                 int64_t D, int64_t n_rot, float theta, float pos_scale, float sign) {
    int64_t half = D / 2;
    if (n_rot > half) n_rot = half;
    if (out != x)
        for (int64_t r = 0; r < N * NH; r++)
            for (int64_t i = n_rot; i < half; i++) {
                out[r * D + i] = x[r * D + i];
                out[r * D + i + half] = x[r * D + i + half];
            }
    GM_OMP_FOR(ctx->n_threads, N * NH * D > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        float p = (float)pos[n] * pos_scale;
        for (int64_t i = 0; i < n_rot; i++) {
            /* HF: inv_freq = 1 / (base ** (arange(0, dim, 2).float() / dim)), in f32 */
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
            float ang = p * inv_freq;
            float c = cosf(ang), s = sign * sinf(ang);
            for (int64_t h = 0; h < NH; h++) {
                const float *xr = x + (n * NH + h) * D;
                float *o = out + (n * NH + h) * D;
                float x1 = xr[i], x2 = xr[i + half];
                o[i] = x1 * c - x2 * s;
                o[i + half] = x2 * c + x1 * s;
            }
        }
    });
}

void gm_k_rope_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos, int64_t N, int64_t NH,
                       int64_t D, int64_t n_rot, float theta, float pos_scale) {
    rope(ctx, out, x, pos, N, NH, D, n_rot, theta, pos_scale, 1.0f);
}

void gm_k_rope_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const int32_t *pos, int64_t N, int64_t NH,
                       int64_t D, int64_t n_rot, float theta, float pos_scale) {
    rope(ctx, dx, dy, pos, N, NH, D, n_rot, theta, pos_scale, -1.0f);
}
