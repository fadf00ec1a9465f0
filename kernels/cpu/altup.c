/*
 * altup.c - Gemma 3n's own forward kernels: the AltUp stream mix (predict, correct), the
 * magnitude matching of the stream projections, the FFN gate's gaussian top-k, a per-channel
 * scale. Contracts in kernels.h; formulas from transformers' modeling_gemma3n.py
 * (Gemma3nTextAltUp.predict / correct, Gemma3nTextModel.forward, Gemma3nTextMLP._gaussian_topk)
 * and gemma_architecture.md §3. Row statistics accumulate in double, as norm.c's do.
 */
#include "kernels.h"
#include "gm_omp.h"

#include <math.h>
#include <stdbool.h>

void gm_k_altup_predict_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *coef, int64_t S,
                                int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, S * N * C > 65536, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *cf = coef + n * S * S;
        for (int64_t j = 0; j < S; j++) {
            float *o = out + (j * N + n) * C;
            const float *xj = x + (j * N + n) * C;
            for (int64_t c = 0; c < C; c++) o[c] = xj[c];
            for (int64_t i = 0; i < S; i++) {
                float a = cf[j * S + i];
                const float *xi = x + (i * N + n) * C;
                for (int64_t c = 0; c < C; c++) o[c] += a * xi[c];
            }
        }
    });
}

void gm_k_altup_correct_fwd_cpu(const gm_kctx *ctx, float *out, const float *pred, const float *act, const float *coef,
                                int64_t S, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, S * N * C > 65536, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *a = act + n * C, *p0 = pred + n * C;
        for (int64_t c = 0; c < C; c++) {
            float innov = a[c] - p0[c]; /* read before stream 0 is overwritten (out may be pred) */
            for (int64_t j = 0; j < S; j++) {
                int64_t e = (j * N + n) * C + c;
                out[e] = pred[e] + (coef[n * S + j] + 1.0f) * innov;
            }
        }
    });
}

void gm_k_rms_match_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *target, int64_t N, int64_t C,
                            float eps) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *tr = target + n * C;
        double sx = 0.0, st = 0.0;
        for (int64_t c = 0; c < C; c++) {
            sx += (double)xr[c] * (double)xr[c];
            st += (double)tr[c] * (double)tr[c];
        }
        double mx = sx / (double)C;
        float f = (float)(sqrt(st / (double)C) / sqrt(mx > (double)eps ? mx : (double)eps));
        float *o = out + n * C;
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] * f;
    });
}

void gm_k_gaussian_topk_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, int64_t N, int64_t F, float std_mult) {
    GM_OMP_FOR(ctx->n_threads, N * F > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * F;
        double s = 0.0;
        for (int64_t f = 0; f < F; f++) s += xr[f];
        double mean = s / (double)F, v = 0.0;
        for (int64_t f = 0; f < F; f++) v += ((double)xr[f] - mean) * ((double)xr[f] - mean);
        float cut = (float)(mean + (double)std_mult * sqrt(v / (double)F));
        float *o = out + n * F;
        for (int64_t f = 0; f < F; f++) o[f] = xr[f] > cut ? xr[f] - cut : 0.0f;
    });
}

void gm_k_mul_cols_fwd_cpu(const gm_kctx *ctx, float *out, const float *x, const float *s, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, N * C > 262144, schedule(static),
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) out[n * C + c] = x[n * C + c] * s[c];
    );
}

/* ---- backward (formulas in kernels.h) ------------------------------------------------------- */

void gm_k_altup_predict_bwd_cpu(const gm_kctx *ctx, float *dx, float *dcoef, const float *dpred, const float *x,
                                const float *coef, int64_t S, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, S * N * C > 65536, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *cf = coef + n * S * S;
        for (int64_t i = 0; i < S; i++) {
            float *o = dx + (i * N + n) * C;
            const float *di = dpred + (i * N + n) * C;
            for (int64_t c = 0; c < C; c++) o[c] = di[c];
            for (int64_t j = 0; j < S; j++) {
                float a = cf[j * S + i];
                const float *dj = dpred + (j * N + n) * C;
                for (int64_t c = 0; c < C; c++) o[c] += a * dj[c];
            }
        }
        for (int64_t j = 0; j < S; j++)
            for (int64_t i = 0; i < S; i++) {
                const float *dj = dpred + (j * N + n) * C, *xi = x + (i * N + n) * C;
                double s = 0.0;
                for (int64_t c = 0; c < C; c++) s += (double)dj[c] * (double)xi[c];
                dcoef[n * S * S + j * S + i] = (float)s;
            }
    });
}

void gm_k_altup_correct_bwd_cpu(const gm_kctx *ctx, float *dpred, float *dact, float *dcoef, const float *dy,
                                const float *pred, const float *act, const float *coef, int64_t S, int64_t N, int64_t C) {
    GM_OMP_FOR(ctx->n_threads, S * N * C > 65536, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *cf = coef + n * S, *a = act + n * C, *p0 = pred + n * C;
        for (int64_t j = 0; j < S; j++) {
            const float *dj = dy + (j * N + n) * C;
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) s += (double)dj[c] * ((double)a[c] - (double)p0[c]);
            dcoef[n * S + j] = (float)s;
        }
        float *da = dact + n * C;
        for (int64_t c = 0; c < C; c++) {
            float v = 0.0f;
            for (int64_t j = 0; j < S; j++) v += dy[(j * N + n) * C + c] * (cf[j] + 1.0f);
            da[c] = v;
        }
        for (int64_t j = 1; j < S; j++)
            for (int64_t c = 0; c < C; c++) dpred[(j * N + n) * C + c] = dy[(j * N + n) * C + c];
        for (int64_t c = 0; c < C; c++) dpred[n * C + c] = dy[n * C + c] - da[c];
    });
}

void gm_k_rms_match_bwd_cpu(const gm_kctx *ctx, float *dx, float *dtarget, const float *dy, const float *x,
                            const float *target, int64_t N, int64_t C, float eps) {
    GM_OMP_FOR(ctx->n_threads, N * C > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *tr = target + n * C, *dyr = dy + n * C;
        double sx = 0.0, st = 0.0, s = 0.0;
        for (int64_t c = 0; c < C; c++) {
            sx += (double)xr[c] * (double)xr[c];
            st += (double)tr[c] * (double)tr[c];
            s += (double)dyr[c] * (double)xr[c];
        }
        double mx = sx / (double)C, rt = sqrt(st / (double)C);
        bool above = mx > (double)eps;
        double r = sqrt(above ? mx : (double)eps), f = rt / r;
        double kx = above ? f * s / ((double)C * r * r) : 0.0, kt = rt > 0.0 ? s / ((double)C * r * rt) : 0.0;
        float *dxr = dx + n * C, *dtr = dtarget + n * C;
        for (int64_t c = 0; c < C; c++) {
            dxr[c] = (float)(f * (double)dyr[c] - kx * (double)xr[c]);
            dtr[c] += (float)(kt * (double)tr[c]);
        }
    });
}

void gm_k_gaussian_topk_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t N, int64_t F,
                                float std_mult) {
    GM_OMP_FOR(ctx->n_threads, N * F > 32768, schedule(static),
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * F, *dyr = dy + n * F;
        double s = 0.0;
        for (int64_t f = 0; f < F; f++) s += xr[f];
        double mean = s / (double)F, v = 0.0;
        for (int64_t f = 0; f < F; f++) v += ((double)xr[f] - mean) * ((double)xr[f] - mean);
        double sd = sqrt(v / (double)F);
        float cut = (float)(mean + (double)std_mult * sd); /* the forward's cut, to the bit */
        double G = 0.0;
        for (int64_t f = 0; f < F; f++) G += xr[f] > cut ? (double)dyr[f] : 0.0;
        double k1 = G / (double)F, k2 = sd > 0.0 ? G * (double)std_mult / ((double)F * sd) : 0.0;
        float *dxr = dx + n * F;
        for (int64_t f = 0; f < F; f++)
            dxr[f] = (float)((xr[f] > cut ? (double)dyr[f] : 0.0) - k1 - k2 * ((double)xr[f] - mean));
    });
}

void gm_k_tanh_bwd_cpu(const gm_kctx *ctx, float *dx, const float *dy, const float *y, int64_t n) {
    GM_OMP_FOR(ctx->n_threads, n > 262144, schedule(static),
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
    );
}
