/*
 * vision4.c - the kernels Gemma 4's vision tower adds (transformers' modeling_gemma4.py): the
 * clamps of its clipped linears (Gemma4ClippableLinear: torch.clamp between the checkpoint's
 * input_min / input_max and output_min / output_max buffers) and its 2-D rotary embedding
 * (Gemma4VisionRotaryEmbedding + apply_multidimensional_rope). Contracts in kernels.h.
 *
 * The clamp's bounds are one float each in the table's memory, read here (on CUDA, on the
 * device): the model never copies them to the host. NaN passes through, and lo > hi gives hi, as
 * torch.clamp does (min(max(x, lo), hi)). Its gradient passes where lo <= x <= hi, the bounds
 * included (torch's clamp_backward_min_max).
 *
 * 2-D RoPE: a head of width D is two halves; the first half rotates at the patch's x position,
 * the second at its y position, each as rope.c's NeoX rotate_half RoPE of head width D/2 (pairs
 * (j, j + D/4), inv_freq[i] = theta^(-2i/(D/2)), angle in f32 exactly as rope.c computes it, so a
 * half equals gm_k_rope_fwd_cpu with D/2, n_rot D/4, pos_scale 1, bit for bit). Backward: the
 * rotation by -angle (sin negated).
 *
 * Pooling by positions (Gemma4VisionPooler._avg_pool_by_positions): each output row (a soft
 * token) is scale times the sum of K rows of x named by src, summed in src's order in f32; the
 * CUDA twin does the same operations in the same order. The backward assigns: dx zeroed, then each
 * named row gets scale * dout of its token - each x row is named at most once (a patch belongs to
 * one cell), so nothing accumulates.
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>
#include <string.h>

void gm_k_clip_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, const float *lo,
                       const float *hi) {
    const float l = *lo, h = *hi;
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] < l ? l : x[i];
        out[i] = v > h ? h : v;
    });
}

void gm_k_clip_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n, const float *lo,
                       const float *hi) {
    const float l = *lo, h = *hi;
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) dx[i] = x[i] >= l && x[i] <= h ? dy[i] : 0.0f;);
}

/* sign = +1: the rotation; sign = -1: its transpose (the backward). */
static void rope2d(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos_x, const int32_t *pos_y,
                   int64_t N, int64_t NH, int64_t D, float theta, float sign) {
    const int64_t half = D / 2, q = D / 4; /* a half's width, its pair offset */
    GM_OMP_FOR(ctx->n_threads, N * NH * D > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        for (int64_t part = 0; part < 2; part++) {
            float p = (float)(part ? pos_y[n] : pos_x[n]) * 1.0f; /* rope.c's pos * pos_scale, scale 1 */
            for (int64_t i = 0; i < q; i++) {
                /* rope.c with head width D/2: inv_freq = 1 / theta^(2i / (D/2)), in f32 */
                float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)half);
                float ang = p * inv_freq;
                float c = cosf(ang), s = sign * sinf(ang);
                for (int64_t h = 0; h < NH; h++) {
                    const float *xr = x + (n * NH + h) * D + part * half;
                    float *o = out + (n * NH + h) * D + part * half;
                    float x1 = xr[i], x2 = xr[i + q];
                    o[i] = x1 * c - x2 * s;
                    o[i + q] = x2 * c + x1 * s;
                }
            }
        }
    });
}

void gm_k_rope2d_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const int32_t *pos_x, const int32_t *pos_y,
                         int64_t N, int64_t NH, int64_t D, float theta) {
    rope2d(ctx, out, x, pos_x, pos_y, N, NH, D, theta, 1.0f);
}

void gm_k_rope2d_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const int32_t *pos_x, const int32_t *pos_y,
                         int64_t N, int64_t NH, int64_t D, float theta) {
    rope2d(ctx, dx, dy, pos_x, pos_y, N, NH, D, theta, -1.0f);
}

void gm_k_pool_gather_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const int32_t *src, int64_t R,
                              int64_t K, int64_t C, float scale) {
    GM_OMP_FOR(ctx->n_threads, R * K * C > 65536, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        float *o = out + r * C;
        for (int64_t c = 0; c < C; c++) o[c] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            const float *xr = x + (int64_t)src[r * K + j] * C;
            for (int64_t c = 0; c < C; c++) o[c] += xr[c];
        }
        for (int64_t c = 0; c < C; c++) o[c] *= scale;
    });
}

void gm_k_pool_gather_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dout, const int32_t *src, int64_t R,
                              int64_t K, int64_t N, int64_t C, float scale) {
    memset(dx, 0, (size_t)(N * C) * sizeof(float));
    /* each x row named at most once (kernels.h): rows r write disjoint rows of dx */
    GM_OMP_FOR(ctx->n_threads, R * K * C > 65536, schedule(static),
    for (int64_t r = 0; r < R; r++) {
        const float *g = dout + r * C;
        for (int64_t j = 0; j < K; j++) {
            float *d = dx + (int64_t)src[r * K + j] * C;
            for (int64_t c = 0; c < C; c++) d[c] = scale * g[c];
        }
    });
}
