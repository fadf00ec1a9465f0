/*
 * audio.c - the forward kernels of Gemma 3n's audio encoder: the sub-sampling convolutions and
 * their cumulative group norm, the conformer's chunked local attention with relative positions,
 * its causal depthwise convolution, GLU, SiLU, clamp and row masking. Contracts in kernels.h;
 * formulas from transformers' modeling_gemma3n.py (Gemma3nAudioSSCPConvBlock,
 * Gemma3nAudioCumulativeGroupNorm, Gemma3nAudioAttention, Gemma3nAudioRelativePositionEmbedding,
 * Gemma3nAudioConformerLightConv1d) and gemma_architecture.md §3.9. Sums over a row or a group
 * accumulate in double, as norm.c's do.
 */
#include "kernels.h"
#include "gm_omp.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

void gm_k_conv2d_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *w, int64_t B, int64_t T,
                         int64_t F, int64_t Ci, int64_t Co, int64_t KT, int64_t KF, int64_t ST, int64_t SF,
                         int64_t PT, int64_t PF) {
    int64_t To = (T - 1) / ST + 1, Fo = (F + 2 * PF - KF) / SF + 1;
    GM_OMP_FOR(ctx->n_threads, B * To * Fo * Co * Ci * KT * KF > 262144, schedule(static),
    for (int64_t bt = 0; bt < B * To; bt++) {
        int64_t b = bt / To, t = bt % To;
        for (int64_t f = 0; f < Fo; f++) {
            float *o = out + (bt * Fo + f) * Co;
            for (int64_t oc = 0; oc < Co; oc++) {
                double acc = 0.0;
                for (int64_t kt = 0; kt < KT; kt++) {
                    int64_t ti = t * ST + kt - PT;
                    if (ti < 0 || ti >= T) continue; /* the zero padding around the frames */
                    for (int64_t kf = 0; kf < KF; kf++) {
                        int64_t fi = f * SF + kf - PF;
                        if (fi < 0 || fi >= F) continue;
                        const float *xi = x + ((b * T + ti) * F + fi) * Ci;
                        const float *wi = w + (oc * Ci * KT + kt) * KF + kf; /* w[oc, i, kt, kf] */
                        for (int64_t i = 0; i < Ci; i++) acc += (double)wi[i * KT * KF] * xi[i];
                    }
                }
                o[oc] = (float)acc;
            }
        }
    });
}

void gm_k_cumulative_group_norm_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *w, int64_t B,
                                        int64_t T, int64_t G, int64_t C, float eps, int relu) {
    GM_OMP_FOR(ctx->n_threads, B > 1 && B * T * G > 65536, schedule(static),
    for (int64_t b = 0; b < B; b++) {
        double cum_sum = 0.0, cum_sq = 0.0;
        for (int64_t t = 0; t < T; t++) {
            const float *xr = x + (b * T + t) * G;
            float *o = out + (b * T + t) * G;
            double n = (double)G * (double)(t + 1), s = 0.0;
            for (int64_t g = 0; g < G; g++) s += xr[g];
            cum_sum += s;
            float mean = (float)(cum_sum / n);
            double sq = 0.0;
            for (int64_t g = 0; g < G; g++) {
                double d = (double)xr[g] - mean;
                sq += d * d;
            }
            cum_sq += sq;
            float rstd = (float)(1.0 / sqrt(cum_sq / n + eps));
            for (int64_t g = 0; g < G; g++) {
                float y = (xr[g] - mean) * rstd * w[g % C];
                o[g] = relu && y < 0.0f ? 0.0f : y;
            }
        }
    });
}

void gm_k_audio_attention_fwd_cpu(const gm_kctx *ctx, float *out, const float *q, const float *k, const float *v,
                                  const float *pos, const uint8_t *valid, int64_t B, int64_t T, int64_t H, int64_t D,
                                  int64_t W, int64_t L, int64_t R, float cap) {
    int64_t Cx = W + L + R; /* the block's context */
    GM_OMP_FOR(ctx->n_threads, B * T * H * Cx * D > 65536, schedule(static),
    for (int64_t e = 0; e < B * T * H; e++) {
        int64_t b = e / (T * H), t = (e / H) % T, h = e % H;
        const float *qr = q + e * D;
        float *o = out + e * D;
        int64_t lo = t - L, hi = t + R; /* keys this query may see */
        if (lo < 0) lo = 0;
        if (hi > T - 1) hi = T - 1;
        double m = -INFINITY, z = 0.0;
        float logit[GM_K_AUDIO_SPAN_MAX];
        int64_t n_vis = 0;
        for (int64_t s = lo; s <= hi; s++) {
            if (!valid[b * T + s]) {
                logit[s - lo] = -INFINITY;
                continue;
            }
            const float *kr = k + ((b * T + s) * H + h) * D;
            const float *pr = pos + ((s - t + L) * H + h) * D;
            double a = 0.0;
            for (int64_t d = 0; d < D; d++) a += (double)qr[d] * ((double)kr[d] + pr[d]);
            float l = cap * tanhf((float)a / cap);
            logit[s - lo] = l;
            if (l > m) m = l;
            n_vis++;
        }
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        if (n_vis == 0) {
            /* every key masked: transformers' softmax of a row of finfo.min is uniform over the
             * block's whole context, whose keys outside 0..T-1 are zero padding */
            int64_t u0 = (t / W) * W - L, u1 = u0 + Cx - 1;
            for (int64_t s = u0 < 0 ? 0 : u0; s <= u1 && s < T; s++) {
                const float *vr = v + ((b * T + s) * H + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] += vr[d];
            }
            for (int64_t d = 0; d < D; d++) o[d] /= (float)Cx;
            continue;
        }
        for (int64_t s = lo; s <= hi; s++)
            if (logit[s - lo] != -INFINITY) z += exp(logit[s - lo] - m);
        for (int64_t s = lo; s <= hi; s++) {
            if (logit[s - lo] == -INFINITY) continue;
            float p = (float)(exp(logit[s - lo] - m) / z);
            const float *vr = v + ((b * T + s) * H + h) * D;
            for (int64_t d = 0; d < D; d++) o[d] += p * vr[d];
        }
    });
}

void gm_k_conv1d_causal_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *w, int64_t B, int64_t T,
                                int64_t C, int64_t K) {
    GM_OMP_FOR(ctx->n_threads, B * T * C * K > 262144, schedule(static),
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        for (int64_t c = 0; c < C; c++) {
            double acc = 0.0;
            for (int64_t j = 0; j < K; j++) {
                int64_t ti = t - K + 1 + j;
                if (ti >= 0) acc += (double)w[c * K + j] * x[(b * T + ti) * C + c];
            }
            out[bt * C + c] = (float)acc;
        }
    });
}

void gm_k_glu_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * C > 262144, schedule(static),
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float g = x[n * 2 * C + C + c];
            out[n * C + c] = x[n * 2 * C + c] / (1.0f + expf(-g));
        });
}

void gm_k_silu_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + expf(-x[i])););
}

void gm_k_clamp_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t n, float limit) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) out[i] = x[i] > limit ? limit : x[i] < -limit ? -limit : x[i];);
}

void gm_k_mask_rows_fwd_cpu(const gm_kctx *ctx, float *x, const uint8_t *keep, const float *fill, int64_t N,
                            int64_t C) {
    (void)ctx;
    for (int64_t n = 0; n < N; n++)
        if (!keep[n])
            for (int64_t c = 0; c < C; c++) x[n * C + c] = fill ? fill[c] : 0.0f;
}

/* ---- backward (LoRA on the conformer's linears: the gradient runs through every block) ---- */

/* The logit of query qr against key s (row kr, relative-position row pr), before the cap, in
 * double as the forward sums it. */
static double audio_logit_raw(const float *qr, const float *kr, const float *pr, int64_t D) {
    double a = 0.0;
    for (int64_t d = 0; d < D; d++) a += (double)qr[d] * ((double)kr[d] + pr[d]);
    return a;
}

void gm_k_audio_attention_bwd_cpu(const gm_kctx *ctx, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v, const float *pos,
                                  const uint8_t *valid, float *work, int64_t B, int64_t T, int64_t H, int64_t D,
                                  int64_t W, int64_t L, int64_t R, float cap) {
    int64_t Cx = W + L + R;
    /* phase 1, per query: the softmax's log-sum-exp and delta = sum_s P_s (dout . v_s), then dq */
    GM_OMP_FOR(ctx->n_threads, B * T * H * Cx * D > 65536, schedule(static),
    for (int64_t e = 0; e < B * T * H; e++) {
        int64_t b = e / (T * H), t = (e / H) % T, h = e % H;
        const float *qr = q + e * D, *dor = dout + e * D;
        float *dqr = dq + e * D;
        int64_t lo = t - L < 0 ? 0 : t - L, hi = t + R > T - 1 ? T - 1 : t + R;
        float logit[GM_K_AUDIO_SPAN_MAX];
        double m = -INFINITY;
        for (int64_t s = lo; s <= hi; s++) {
            logit[s - lo] = -INFINITY;
            if (!valid[b * T + s]) continue;
            double a = audio_logit_raw(qr, k + ((b * T + s) * H + h) * D, pos + ((s - t + L) * H + h) * D, D);
            logit[s - lo] = cap * tanhf((float)a / cap);
            if (logit[s - lo] > m) m = logit[s - lo];
        }
        for (int64_t d = 0; d < D; d++) dqr[d] = 0.0f;
        if (m == -INFINITY) { /* no visible key: the output is a plain average, q has no gradient */
            work[2 * e] = INFINITY, work[2 * e + 1] = 0.0f;
            continue;
        }
        double z = 0.0, delta = 0.0;
        for (int64_t s = lo; s <= hi; s++)
            if (logit[s - lo] != -INFINITY) z += exp(logit[s - lo] - m);
        float lse = (float)(m + log(z));
        for (int64_t s = lo; s <= hi; s++) {
            if (logit[s - lo] == -INFINITY) continue;
            double p = exp(logit[s - lo] - lse), dp = 0.0;
            const float *vr = v + ((b * T + s) * H + h) * D;
            for (int64_t d = 0; d < D; d++) dp += (double)dor[d] * vr[d];
            delta += p * dp;
        }
        work[2 * e] = lse, work[2 * e + 1] = (float)delta;
        for (int64_t s = lo; s <= hi; s++) {
            if (logit[s - lo] == -INFINITY) continue;
            const float *kr = k + ((b * T + s) * H + h) * D, *pr = pos + ((s - t + L) * H + h) * D;
            const float *vr = v + ((b * T + s) * H + h) * D;
            double dp = 0.0;
            for (int64_t d = 0; d < D; d++) dp += (double)dor[d] * vr[d];
            float p = expf(logit[s - lo] - lse), th = logit[s - lo] / cap;
            float da = (float)(p * (dp - delta)) * (1.0f - th * th);
            for (int64_t d = 0; d < D; d++) dqr[d] += da * (kr[d] + pr[d]);
        }
    });
    /* phase 2, per key s: the queries s - R .. s + L that saw it, and the averaging queries whose
     * block context holds it */
    GM_OMP_FOR(ctx->n_threads, B * T * H * Cx * D > 65536, schedule(static),
    for (int64_t e = 0; e < B * T * H; e++) {
        int64_t b = e / (T * H), s = (e / H) % T, h = e % H;
        const float *kr = k + e * D, *vr = v + e * D;
        float *dkr = dk + e * D, *dvr = dv + e * D;
        for (int64_t d = 0; d < D; d++) dkr[d] = 0.0f, dvr[d] = 0.0f;
        int64_t t0 = s - R - W - Cx < 0 ? 0 : s - R - W - Cx, t1 = s + L + W + Cx > T - 1 ? T - 1 : s + L + W + Cx;
        for (int64_t t = t0; t <= t1; t++) {
            int64_t qe = (b * T + t) * H + h;
            const float *dor = dout + qe * D;
            float lse = work[2 * qe];
            if (lse == INFINITY) { /* an averaging query: does its block context hold s? */
                int64_t u0 = (t / W) * W - L;
                if (s >= u0 && s <= u0 + Cx - 1)
                    for (int64_t d = 0; d < D; d++) dvr[d] += dor[d] / (float)Cx;
                continue;
            }
            if (t < s - R || t > s + L || !valid[b * T + s]) continue;
            const float *qr = q + qe * D, *pr = pos + ((s - t + L) * H + h) * D;
            float l = cap * tanhf((float)audio_logit_raw(qr, kr, pr, D) / cap);
            float p = expf(l - lse), th = l / cap;
            double dp = 0.0;
            for (int64_t d = 0; d < D; d++) dp += (double)dor[d] * vr[d];
            float da = (float)(p * (dp - work[2 * qe + 1])) * (1.0f - th * th);
            for (int64_t d = 0; d < D; d++) {
                dkr[d] += da * qr[d];
                dvr[d] += p * dor[d];
            }
        }
    });
}

void gm_k_conv1d_causal_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *w, int64_t B, int64_t T,
                                int64_t C, int64_t K) {
    GM_OMP_FOR(ctx->n_threads, B * T * C * K > 262144, schedule(static),
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        for (int64_t c = 0; c < C; c++) {
            double acc = 0.0;
            for (int64_t j = 0; j < K; j++) {
                int64_t to = t + K - 1 - j; /* the output that read x[t] through tap j */
                if (to < T) acc += (double)w[c * K + j] * dy[(b * T + to) * C + c];
            }
            dx[bt * C + c] = (float)acc;
        }
    });
}

void gm_k_glu_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * C > 262144, schedule(static),
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float a = x[n * 2 * C + c], sg = 1.0f / (1.0f + expf(-x[n * 2 * C + C + c])), g = dy[n * C + c];
            dx[n * 2 * C + c] = g * sg;
            dx[n * 2 * C + C + c] = g * a * sg * (1.0f - sg);
        });
}

void gm_k_silu_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * sg * (1.0f + x[i] * (1.0f - sg));
    });
}

void gm_k_clamp_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n, float limit) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
    for (int64_t i = 0; i < n; i++) dx[i] = x[i] >= -limit && x[i] <= limit ? dy[i] : 0.0f;);
}
