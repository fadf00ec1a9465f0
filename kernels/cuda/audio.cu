/*
 * audio.cu - CUDA twins of kernels/cpu/audio.c (Gemma 3n's audio encoder, forward and backward): one thread per
 * output element (the convolutions, GLU, SiLU, clamp, row masking), one block per clip for the
 * cumulative group norm (its statistics run along time), one thread per (clip, frame, head) for the
 * chunked local attention (at most GM_K_AUDIO_SPAN_MAX keys). Sums in f32 (the CPU reference uses
 * double: inside the kernel tolerance table).
 */
#include "common.cuh"

__global__ static void conv2d_k(float *out, const float *x, const float *w, int64_t B, int64_t T, int64_t F,
                                int64_t Ci, int64_t Co, int64_t KT, int64_t KF, int64_t ST, int64_t SF, int64_t PT,
                                int64_t PF, int64_t To, int64_t Fo) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B To Fo Co */
    if (e >= B * To * Fo * Co) return;
    int64_t oc = e % Co, f = (e / Co) % Fo, t = (e / (Co * Fo)) % To, b = e / (Co * Fo * To);
    float acc = 0.0f;
    for (int64_t kt = 0; kt < KT; kt++) {
        int64_t ti = t * ST + kt - PT;
        if (ti < 0 || ti >= T) continue;
        for (int64_t kf = 0; kf < KF; kf++) {
            int64_t fi = f * SF + kf - PF;
            if (fi < 0 || fi >= F) continue;
            const float *xi = x + ((b * T + ti) * F + fi) * Ci;
            const float *wi = w + (oc * Ci * KT + kt) * KF + kf;
            for (int64_t i = 0; i < Ci; i++) acc += wi[i * KT * KF] * xi[i];
        }
    }
    out[e] = acc;
}

/* One block per clip; 256 threads reduce each frame's sums. */
__global__ static void cumulative_group_norm_k(float *out, const float *x, const float *w, int64_t T, int64_t G,
                                               int64_t C, float eps, int relu) {
    __shared__ float red[256];
    int64_t b = blockIdx.x;
    float cum_sum = 0.0f, cum_sq = 0.0f;
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + (b * T + t) * G;
        float *o = out + (b * T + t) * G;
        float n = (float)G * (float)(t + 1), s = 0.0f;
        for (int64_t g = threadIdx.x; g < G; g += blockDim.x) s += xr[g];
        red[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if ((int)threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        cum_sum += red[0];
        __syncthreads();
        float mean = cum_sum / n, sq = 0.0f;
        for (int64_t g = threadIdx.x; g < G; g += blockDim.x) sq += (xr[g] - mean) * (xr[g] - mean);
        red[threadIdx.x] = sq;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if ((int)threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        cum_sq += red[0];
        __syncthreads();
        float rstd = rsqrtf(cum_sq / n + eps);
        for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
            float y = (xr[g] - mean) * rstd * w[g % C];
            o[g] = relu && y < 0.0f ? 0.0f : y;
        }
    }
}

__global__ static void audio_attention_k(float *out, const float *q, const float *k, const float *v, const float *pos,
                                         const uint8_t *valid, int64_t B, int64_t T, int64_t H, int64_t D, int64_t W,
                                         int64_t L, int64_t R, float cap) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B T H */
    if (e >= B * T * H) return;
    int64_t b = e / (T * H), t = (e / H) % T, h = e % H;
    const float *qr = q + e * D;
    float *o = out + e * D;
    int64_t lo = t - L < 0 ? 0 : t - L, hi = t + R > T - 1 ? T - 1 : t + R;
    float m = -INFINITY, z = 0.0f;
    for (int64_t s = lo; s <= hi; s++) {
        if (!valid[b * T + s]) continue;
        const float *kr = k + ((b * T + s) * H + h) * D, *pr = pos + ((s - t + L) * H + h) * D;
        float a = 0.0f;
        for (int64_t d = 0; d < D; d++) a += qr[d] * (kr[d] + pr[d]);
        m = fmaxf(m, cap * tanhf(a / cap));
    }
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    if (m == -INFINITY) { /* every key masked: the whole context's average (kernels.h) */
        int64_t Cx = W + L + R, u0 = (t / W) * W - L, u1 = u0 + Cx - 1;
        for (int64_t s = u0 < 0 ? 0 : u0; s <= u1 && s < T; s++)
            for (int64_t d = 0; d < D; d++) o[d] += v[((b * T + s) * H + h) * D + d];
        for (int64_t d = 0; d < D; d++) o[d] /= (float)Cx;
        return;
    }
    for (int64_t s = lo; s <= hi; s++) {
        if (!valid[b * T + s]) continue;
        const float *kr = k + ((b * T + s) * H + h) * D, *pr = pos + ((s - t + L) * H + h) * D;
        float a = 0.0f;
        for (int64_t d = 0; d < D; d++) a += qr[d] * (kr[d] + pr[d]);
        float p = expf(cap * tanhf(a / cap) - m);
        z += p;
        const float *vr = v + ((b * T + s) * H + h) * D;
        for (int64_t d = 0; d < D; d++) o[d] += p * vr[d];
    }
    for (int64_t d = 0; d < D; d++) o[d] /= z;
}

__global__ static void conv1d_causal_k(float *out, const float *x, const float *w, int64_t B, int64_t T, int64_t C,
                                       int64_t K) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B T C */
    if (e >= B * T * C) return;
    int64_t c = e % C, t = (e / C) % T, b = e / (C * T);
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t ti = t - K + 1 + j;
        if (ti >= 0) acc += w[c * K + j] * x[(b * T + ti) * C + c];
    }
    out[e] = acc;
}

__global__ static void glu_k(float *out, const float *x, int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= N * C) return;
    int64_t n = e / C, c = e % C;
    out[e] = x[n * 2 * C + c] / (1.0f + expf(-x[n * 2 * C + C + c]));
}

__global__ static void silu_k(float *out, const float *x, int64_t n) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) out[e] = x[e] / (1.0f + expf(-x[e]));
}

__global__ static void clamp_k(float *out, const float *x, int64_t n, float limit) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) out[e] = fminf(fmaxf(x[e], -limit), limit);
}

__global__ static void mask_rows_k(float *x, const uint8_t *keep, const float *fill, int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= N * C || keep[e / C]) return;
    x[e] = fill ? fill[e % C] : 0.0f;
}

extern "C" void gm_k_conv2d_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *w, int64_t B,
                                     int64_t T, int64_t F, int64_t Ci, int64_t Co, int64_t KT, int64_t KF, int64_t ST,
                                     int64_t SF, int64_t PT, int64_t PF) {
    int64_t To = (T - 1) / ST + 1, Fo = (F + 2 * PF - KF) / SF + 1, n = B * To * Fo * Co;
    if (n > 0) conv2d_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, w, B, T, F, Ci, Co, KT, KF, ST, SF, PT, PF, To, Fo);
}

extern "C" void gm_k_cumulative_group_norm_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *w,
                                                    int64_t B, int64_t T, int64_t G, int64_t C, float eps, int relu) {
    if (B > 0 && T > 0) cumulative_group_norm_k<<<(unsigned)B, 256, 0, gm_stream(ctx)>>>(out, x, w, T, G, C, eps, relu);
}

extern "C" void gm_k_audio_attention_fwd_cuda(const gm_kctx *ctx, float *out, const float *q, const float *k,
                                              const float *v, const float *pos, const uint8_t *valid, int64_t B,
                                              int64_t T, int64_t H, int64_t D, int64_t W, int64_t L, int64_t R,
                                              float cap) {
    int64_t n = B * T * H;
    if (n > 0) audio_attention_k<<<gm_blocks(n, 128), 128, 0, gm_stream(ctx)>>>(out, q, k, v, pos, valid, B, T, H, D, W, L, R, cap);
}

extern "C" void gm_k_conv1d_causal_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, const float *w, int64_t B,
                                            int64_t T, int64_t C, int64_t K) {
    int64_t n = B * T * C;
    if (n > 0) conv1d_causal_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, w, B, T, C, K);
}

extern "C" void gm_k_glu_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t N, int64_t C) {
    int64_t n = N * C;
    if (n > 0) glu_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, N, C);
}

extern "C" void gm_k_silu_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n) {
    if (n > 0) silu_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n);
}

extern "C" void gm_k_clamp_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n, float limit) {
    if (n > 0) clamp_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n, limit);
}

extern "C" void gm_k_mask_rows_fwd_cuda(const gm_kctx *ctx, float *x, const uint8_t *keep, const float *fill, int64_t N,
                                        int64_t C) {
    int64_t n = N * C;
    if (n > 0) mask_rows_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(x, keep, fill, N, C);
}

/* ---- backward (kernels.h: two passes, queries then keys, no atomics) ---- */

__device__ static float audio_logit_raw_d(const float *qr, const float *kr, const float *pr, int64_t D) {
    float a = 0.0f;
    for (int64_t d = 0; d < D; d++) a += qr[d] * (kr[d] + pr[d]);
    return a;
}

__device__ static float dot_d(const float *x, const float *y, int64_t D) {
    float a = 0.0f;
    for (int64_t d = 0; d < D; d++) a += x[d] * y[d];
    return a;
}

__global__ static void audio_attention_bwd_q_k(float *dq, float *work, const float *dout, const float *q, const float *k,
                                               const float *v, const float *pos, const uint8_t *valid, int64_t B,
                                               int64_t T, int64_t H, int64_t D, int64_t L, int64_t R, float cap) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B T H */
    if (e >= B * T * H) return;
    int64_t b = e / (T * H), t = (e / H) % T, h = e % H;
    const float *qr = q + e * D, *dor = dout + e * D;
    float *dqr = dq + e * D;
    int64_t lo = t - L < 0 ? 0 : t - L, hi = t + R > T - 1 ? T - 1 : t + R;
    float m = -INFINITY;
    for (int64_t s = lo; s <= hi; s++)
        if (valid[b * T + s])
            m = fmaxf(m, cap * tanhf(audio_logit_raw_d(qr, k + ((b * T + s) * H + h) * D, pos + ((s - t + L) * H + h) * D, D) / cap));
    for (int64_t d = 0; d < D; d++) dqr[d] = 0.0f;
    if (m == -INFINITY) {
        work[2 * e] = INFINITY, work[2 * e + 1] = 0.0f;
        return;
    }
    float z = 0.0f;
    for (int64_t s = lo; s <= hi; s++)
        if (valid[b * T + s])
            z += expf(cap * tanhf(audio_logit_raw_d(qr, k + ((b * T + s) * H + h) * D, pos + ((s - t + L) * H + h) * D, D) / cap) - m);
    float lse = m + logf(z), delta = 0.0f;
    for (int64_t s = lo; s <= hi; s++) {
        if (!valid[b * T + s]) continue;
        const float *kr = k + ((b * T + s) * H + h) * D, *pr = pos + ((s - t + L) * H + h) * D;
        delta += expf(cap * tanhf(audio_logit_raw_d(qr, kr, pr, D) / cap) - lse) * dot_d(dor, v + ((b * T + s) * H + h) * D, D);
    }
    work[2 * e] = lse, work[2 * e + 1] = delta;
    for (int64_t s = lo; s <= hi; s++) {
        if (!valid[b * T + s]) continue;
        const float *kr = k + ((b * T + s) * H + h) * D, *pr = pos + ((s - t + L) * H + h) * D;
        float l = cap * tanhf(audio_logit_raw_d(qr, kr, pr, D) / cap), th = l / cap;
        float da = expf(l - lse) * (dot_d(dor, v + ((b * T + s) * H + h) * D, D) - delta) * (1.0f - th * th);
        for (int64_t d = 0; d < D; d++) dqr[d] += da * (kr[d] + pr[d]);
    }
}

__global__ static void audio_attention_bwd_kv_k(float *dk, float *dv, const float *work, const float *dout,
                                                const float *q, const float *k, const float *v, const float *pos,
                                                const uint8_t *valid, int64_t B, int64_t T, int64_t H, int64_t D,
                                                int64_t W, int64_t L, int64_t R, float cap) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B T H: key s */
    if (e >= B * T * H) return;
    int64_t b = e / (T * H), s = (e / H) % T, h = e % H, Cx = W + L + R;
    const float *kr = k + e * D, *vr = v + e * D;
    float *dkr = dk + e * D, *dvr = dv + e * D;
    for (int64_t d = 0; d < D; d++) dkr[d] = 0.0f, dvr[d] = 0.0f;
    int64_t t0 = s - R - W - Cx < 0 ? 0 : s - R - W - Cx, t1 = s + L + W + Cx > T - 1 ? T - 1 : s + L + W + Cx;
    for (int64_t t = t0; t <= t1; t++) {
        int64_t qe = (b * T + t) * H + h;
        const float *dor = dout + qe * D;
        float lse = work[2 * qe];
        if (lse == INFINITY) {
            int64_t u0 = (t / W) * W - L;
            if (s >= u0 && s <= u0 + Cx - 1)
                for (int64_t d = 0; d < D; d++) dvr[d] += dor[d] / (float)Cx;
            continue;
        }
        if (t < s - R || t > s + L || !valid[b * T + s]) continue;
        const float *qr = q + qe * D, *pr = pos + ((s - t + L) * H + h) * D;
        float l = cap * tanhf(audio_logit_raw_d(qr, kr, pr, D) / cap), th = l / cap, p = expf(l - lse);
        float da = p * (dot_d(dor, vr, D) - work[2 * qe + 1]) * (1.0f - th * th);
        for (int64_t d = 0; d < D; d++) {
            dkr[d] += da * qr[d];
            dvr[d] += p * dor[d];
        }
    }
}

__global__ static void conv1d_causal_bwd_k(float *dx, const float *dy, const float *w, int64_t B, int64_t T, int64_t C,
                                           int64_t K) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* over B T C */
    if (e >= B * T * C) return;
    int64_t c = e % C, t = (e / C) % T, b = e / (C * T);
    float acc = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t to = t + K - 1 - j;
        if (to < T) acc += w[c * K + j] * dy[(b * T + to) * C + c];
    }
    dx[e] = acc;
}

__global__ static void glu_bwd_k(float *dx, const float *dy, const float *x, int64_t N, int64_t C) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= N * C) return;
    int64_t n = e / C, c = e % C;
    float a = x[n * 2 * C + c], sg = 1.0f / (1.0f + expf(-x[n * 2 * C + C + c])), g = dy[e];
    dx[n * 2 * C + c] = g * sg;
    dx[n * 2 * C + C + c] = g * a * sg * (1.0f - sg);
}

__global__ static void silu_bwd_k(float *dx, const float *dy, const float *x, int64_t n) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    float sg = 1.0f / (1.0f + expf(-x[e]));
    dx[e] = dy[e] * sg * (1.0f + x[e] * (1.0f - sg));
}

__global__ static void clamp_bwd_k(float *dx, const float *dy, const float *x, int64_t n, float limit) {
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < n) dx[e] = x[e] >= -limit && x[e] <= limit ? dy[e] : 0.0f;
}

extern "C" void gm_k_audio_attention_bwd_cuda(const gm_kctx *ctx, float *dq, float *dk, float *dv, const float *dout,
                                              const float *q, const float *k, const float *v, const float *pos,
                                              const uint8_t *valid, float *work, int64_t B, int64_t T, int64_t H,
                                              int64_t D, int64_t W, int64_t L, int64_t R, float cap) {
    int64_t n = B * T * H;
    if (n <= 0) return;
    audio_attention_bwd_q_k<<<gm_blocks(n, 128), 128, 0, gm_stream(ctx)>>>(dq, work, dout, q, k, v, pos, valid, B, T, H, D, L,
                                                                          R, cap);
    audio_attention_bwd_kv_k<<<gm_blocks(n, 128), 128, 0, gm_stream(ctx)>>>(dk, dv, work, dout, q, k, v, pos, valid, B, T, H,
                                                                           D, W, L, R, cap);
}

extern "C" void gm_k_conv1d_causal_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *w, int64_t B,
                                            int64_t T, int64_t C, int64_t K) {
    int64_t n = B * T * C;
    if (n > 0) conv1d_causal_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, w, B, T, C, K);
}

extern "C" void gm_k_glu_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t N, int64_t C) {
    int64_t n = N * C;
    if (n > 0) glu_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, x, N, C);
}

extern "C" void gm_k_silu_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n) {
    if (n > 0) silu_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, x, n);
}

extern "C" void gm_k_clamp_bwd_cuda(const gm_kctx *ctx, float *dx, const float *dy, const float *x, int64_t n,
                                    float limit) {
    if (n > 0) clamp_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dx, dy, x, n, limit);
}
