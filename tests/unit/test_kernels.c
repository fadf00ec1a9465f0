/*
 * test_kernels.c - every CPU forward kernel against a double-precision reference loop written
 * straight from the formulas (gemma_architecture.md §1.4-1.6), on random inputs, including
 * GQA, sliding windows, ring-buffered caches and every weight dtype of the matmul.
 */
#include "kernels.h"
#include "cpu/vmath.h"
#include "test_util.h"

#include "gm_alloc.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t seed = 0x1234567ull;

static float *rnd(int64_t n, float scale) {
    float *p = gm_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = gm_test_rand(&seed) * scale;
    return p;
}

static gm_kctx make_ctx(int threads, size_t scratch) {
    gm_kctx c = {.n_threads = threads, .stream = NULL, .scratch = NULL, .scratch_floats = scratch};
    if (scratch) c.scratch = gm_malloc(scratch * sizeof(float));
    return c;
}

static void test_rmsnorm(void) {
    int64_t N = 7, C = 640;
    float *x = rnd(N * C, 3.0f), *w = rnd(C, 2.0f), *out = gm_malloc((size_t)(N * C) * 4), *rstd = gm_malloc((size_t)N * 4);
    float *ref = gm_malloc((size_t)(N * C) * 4);
    gm_kctx k = make_ctx(2, 0);
    gm_k_rmsnorm_fwd_cpu(&k, out, rstd, x, w, N, C, 1e-6f);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += (double)x[n * C + c] * x[n * C + c];
        double r = 1.0 / sqrt(ss / (double)C + 1e-6);
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = (float)(x[n * C + c] * r * w[c]);
    }
    gm_check_close("rmsnorm", out, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    /* in place */
    gm_k_rmsnorm_fwd_cpu(&k, x, NULL, x, w, N, C, 1e-6f);
    gm_check_close("rmsnorm in place", x, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_free(x), gm_free(w), gm_free(out), gm_free(rstd), gm_free(ref);
}

static void test_rope(void) {
    int64_t N = 5, NH = 3, D = 16;
    float *x = rnd(N * NH * D, 1.0f), *out = gm_malloc((size_t)(N * NH * D) * 4), *ref = gm_malloc((size_t)(N * NH * D) * 4);
    int32_t pos[5] = {0, 1, 7, 100, 4000};
    gm_kctx k = make_ctx(1, 0);
    /* variant 2: Gemma 4's proportional RoPE, 2 of 8 pairs rotating (inv_freq 0 past them) */
    for (int variant = 0; variant < 3; variant++) {
        float theta = variant ? 1e6f : 1e4f, ps = variant == 1 ? 0.125f : 1.0f;
        int64_t n_rot = variant == 2 ? 2 : D / 2;
        gm_k_rope_fwd_cpu(&k, out, x, pos, N, NH, D, n_rot, theta, ps);
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t i = 0; i < D / 2; i++) {
                    /* f32 angle as HF computes it (inv_freq in f32, product in f32), then exact trig */
                    float inv = i < n_rot ? 1.0f / powf(theta, (float)(2 * i) / (float)D) : 0.0f;
                    float ang = ((float)pos[n] * ps) * inv;
                    double c = cos((double)ang), s = sin((double)ang);
                    const float *xr = x + (n * NH + h) * D;
                    ref[(n * NH + h) * D + i] = (float)(xr[i] * c - xr[i + D / 2] * s);
                    ref[(n * NH + h) * D + i + D / 2] = (float)(xr[i + D / 2] * c + xr[i] * s);
                }
        gm_check_close(variant == 2 ? "rope (1e6, 2 of 8 pairs)" : variant ? "rope (1e6, linear x8)" : "rope (1e4)", out, ref, (size_t)(N * NH * D),
                       TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    }
    gm_free(x), gm_free(out), gm_free(ref);
}

/* Reference attention with explicit positions: keys for absolute positions 0..pos0+T-1 are given
 * in full (B, P, KVH, D); the kernel sees them through a ring buffer of S slots. */
static void ref_attention(float *out, const float *q, const float *kf, const float *vf, const int32_t *kv_end, int64_t B,
                          int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t P, int64_t pos0, int64_t window,
                          float scale) {
    double *sc = malloc((size_t)P * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                /* keys up to p, or to the end of the query's image */
                int64_t p = kv_end && kv_end[b * T + t] - 1 > pos0 + t ? kv_end[b * T + t] - 1 : pos0 + t;
                int64_t kvh = h / (H / KVH), qp = pos0 + t;
                double mx = -1e300;
                for (int64_t j = 0; j <= p; j++) {
                    bool vis = window <= 0 || j > qp - window;
                    if (!vis) continue;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)q[((b * T + t) * H + h) * D + d] * kf[((b * P + j) * KVH + kvh) * D + d];
                    sc[j] = s * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                double z = 0;
                for (int64_t j = 0; j <= p; j++)
                    if (window <= 0 || j > qp - window) z += exp(sc[j] - mx);
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= p; j++)
                        if (window <= 0 || j > qp - window)
                            acc += exp(sc[j] - mx) / z * vf[((b * P + j) * KVH + kvh) * D + d];
                    out[((b * T + t) * H + h) * D + d] = (float)acc;
                }
            }
    free(sc);
}

static void check_attention(const char *what, int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                            int64_t pos0, int64_t window, int64_t S, const int32_t *kv_end) {
    int64_t P = pos0 + T;
    float *q = rnd(B * T * H * D, 1.0f), *kf = rnd(B * P * KVH * D, 1.0f), *vf = rnd(B * P * KVH * D, 1.0f);
    float *kc = gm_calloc((size_t)(B * S * KVH * D), 4), *vc = gm_calloc((size_t)(B * S * KVH * D), 4);
    /* fill the ring buffer in position order, as the decoder does */
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < P; j++) {
            memcpy(kc + ((b * S + j % S) * KVH) * D, kf + ((b * P + j) * KVH) * D, (size_t)(KVH * D) * 4);
            memcpy(vc + ((b * S + j % S) * KVH) * D, vf + ((b * P + j) * KVH) * D, (size_t)(KVH * D) * 4);
        }
    float *out = gm_malloc((size_t)(B * T * H * D) * 4), *ref = gm_malloc((size_t)(B * T * H * D) * 4);
    gm_kctx k = make_ctx(2, 0);
    float scale = 1.0f / sqrtf(24.0f);
    gm_k_attention_fwd_cpu(&k, out, q, kc, vc, kv_end, B, T, H, KVH, D, S, pos0, window, scale);
    ref_attention(ref, q, kf, vf, kv_end, B, T, H, KVH, D, P, pos0, window, scale);
    gm_check_close(what, out, ref, (size_t)(B * T * H * D), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_free(q), gm_free(kf), gm_free(vf), gm_free(kc), gm_free(vc), gm_free(out), gm_free(ref);
}

static void test_attention(void) {
    check_attention("attention causal MHA", 1, 9, 2, 2, 16, 0, 0, 9, NULL);
    check_attention("attention GQA 4:1, batch 2", 2, 12, 4, 1, 32, 0, 0, 12, NULL);
    check_attention("attention sliding W=4", 2, 12, 4, 2, 16, 0, 4, 12, NULL);
    check_attention("attention sliding W=4, ring of 4+T-1 slots, chunk at pos 20", 1, 5, 4, 2, 16, 20, 4, 8, NULL);
    check_attention("attention decode step at pos 150 (more than one key block)", 1, 1, 4, 1, 64, 150, 0, 151, NULL);
    check_attention("attention decode, sliding W=70, ring of 70 slots", 1, 1, 2, 1, 16, 200, 70, 70, NULL);
    /* images seen whole (kv_end, absolute positions): text, a 70-token image (more than one key
     * block), text; the second sequence is one image (everything visible); then a prefill chunk at
     * position 10 holding a 4-token image, under a window of 3 that cuts the image from below */
    int32_t ends[2 * 80];
    for (int t = 0; t < 80; t++) {
        ends[t] = t >= 5 && t < 75 ? 75 : t + 1;
        ends[80 + t] = 80;
    }
    check_attention("attention image blocks (kv_end), batch 2", 2, 80, 4, 2, 16, 0, 0, 80, ends);
    int32_t chunk[6] = {11, 16, 16, 16, 16, 16};
    check_attention("attention image block at pos 10, W=3", 1, 6, 2, 1, 16, 10, 3, 8, chunk);
}

/* vmath.h's exp and tanh against libm in double over their ranges; tanh exactly +-1 and the tanh
 * GELU's gradient exactly 0 / 1 far out (libm's rounding, which 1 - t^2 relies on). */
static void test_vmath(void) {
    double we = 0, wt = 0;
    float xe = 0, xt = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.3f * (float)i / 2000000.0f, y = -20.0f + 40.0f * (float)i / 2000000.0f;
        double re = exp((double)x), rt = tanh((double)y);
        double ee = fabs(gm_vexpf(x) - re) / re, et = rt != 0.0 ? fabs(gm_vtanhf(y) - rt) / fabs(rt) : fabs(gm_vtanhf(y));
        if (ee > we) we = ee, xe = x;
        if (et > wt) wt = et, xt = y;
    }
    CHECK(we < TOL_VMATH_EXP_REL, "gm_vexpf: relative error %.3g at %.7g", we, (double)xe);
    CHECK(wt < TOL_VMATH_TANH_REL, "gm_vtanhf: relative error %.3g at %.7g", wt, (double)xt);
    CHECK(gm_vexpf(-90.0f) == 0.0f && isfinite(gm_vexpf(1000.0f)), "gm_vexpf's clamps: %g, %g", (double)gm_vexpf(-90.0f),
          (double)gm_vexpf(1000.0f));
    /* a diverging run's NaN / inf: NaN stays NaN (no integer conversion of it: UBSan), inf clamps */
    CHECK(isnan(gm_vexpf(NAN)) && isnan(gm_vtanhf(NAN)) && gm_vexpf(-INFINITY) == 0.0f && isfinite(gm_vexpf(INFINITY)) &&
              gm_vtanhf(INFINITY) == 1.0f && gm_vtanhf(-INFINITY) == -1.0f,
          "vmath on NaN / inf: exp %g %g %g, tanh %g %g %g", (double)gm_vexpf(NAN), (double)gm_vexpf(-INFINITY),
          (double)gm_vexpf(INFINITY), (double)gm_vtanhf(NAN), (double)gm_vtanhf(INFINITY), (double)gm_vtanhf(-INFINITY));
    float g;
    CHECK(gm_vtanhf(9.5f) == 1.0f && gm_vtanhf(-9.5f) == -1.0f, "gm_vtanhf(+-9.5) = %.9g, %.9g", (double)gm_vtanhf(9.5f),
          (double)gm_vtanhf(-9.5f));
    CHECK(gm_gelu_tanh_grad(100.0f, &g) == 1.0f && gm_gelu_tanh_grad(-100.0f, &g) == 0.0f,
          "gelu_tanh'(+-100) = %.9g, %.9g", (double)gm_gelu_tanh_grad(100.0f, &g), (double)gm_gelu_tanh_grad(-100.0f, &g));
    printf("vmath: exp %.2e, tanh %.2e relative (worst)\n", we, wt);
}

static void test_geglu_add_softcap(void) {
    int64_t n = 1000;
    float *g = rnd(n, 4.0f), *u = rnd(n, 2.0f), *out = gm_malloc((size_t)n * 4), *ref = gm_malloc((size_t)n * 4);
    gm_kctx k = make_ctx(2, 0);
    gm_k_geglu_fwd_cpu(&k, out, g, u, n);
    for (int64_t i = 0; i < n; i++) {
        double z = g[i];
        ref[i] = (float)(0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z))) * u[i]);
    }
    gm_check_close("geglu", out, ref, (size_t)n, TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_k_softcap_fwd_cpu(&k, out, g, n, 3.0f);
    for (int64_t i = 0; i < n; i++) ref[i] = (float)(3.0 * tanh(g[i] / 3.0));
    gm_check_close("softcap", out, ref, (size_t)n, TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    memcpy(out, g, (size_t)n * 4);
    gm_k_add_fwd_cpu(&k, out, u, n);
    for (int64_t i = 0; i < n; i++) ref[i] = g[i] + u[i];
    gm_check_close("add", out, ref, (size_t)n, 0, 0);
    gm_free(g), gm_free(u), gm_free(out), gm_free(ref);
}

/* Builds a weight (N, K) in `type` from f32 values by a simple encoder, so that the matmul sees
 * real block layouts; the reference multiplies by the dequantized values. */
static void *encode_weight(gm_dtype type, const float *w, int64_t N, int64_t K, size_t *row_bytes) {
    *row_bytes = gm_dtype_row_bytes(type, K);
    uint8_t *buf = gm_calloc((size_t)N, *row_bytes);
    for (int64_t n = 0; n < N; n++) {
        uint8_t *r = buf + (size_t)n * *row_bytes;
        const float *x = w + n * K;
        switch (type) {
        case GM_F32: memcpy(r, x, (size_t)K * 4); break;
        case GM_F16:
            for (int64_t i = 0; i < K; i++) ((uint16_t *)r)[i] = gm_f32_to_f16(x[i]);
            break;
        case GM_BF16:
            for (int64_t i = 0; i < K; i++) ((uint16_t *)r)[i] = gm_f32_to_bf16(x[i]);
            break;
        case GM_Q8_0:
            for (int64_t b = 0; b < K / 32; b++) {
                float amax = 0;
                for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
                float d = amax / 127.0f;
                uint16_t dh = gm_f32_to_f16(d);
                memcpy(r + b * 34, &dh, 2);
                for (int i = 0; i < 32; i++)
                    ((int8_t *)(r + b * 34 + 2))[i] = (int8_t)(d ? roundf(x[b * 32 + i] / d) : 0);
            }
            break;
        default: { /* other block types: random bytes are valid encodings once the f16 scales are sane */
            const gm_dtype_info *in = gm_dtype_get(type);
            for (size_t i = 0; i < *row_bytes; i++) r[i] = (uint8_t)(gm_test_rand(&seed) * 127 + 128);
            int off[2] = {-1, -1};
            switch (type) {
            case GM_Q4_0: case GM_Q5_0: off[0] = 0; break;
            case GM_Q4_1: case GM_Q5_1: case GM_Q4_K: case GM_Q5_K: off[0] = 0, off[1] = 2; break;
            case GM_Q2_K: off[0] = 80, off[1] = 82; break;
            case GM_Q3_K: off[0] = 108; break;
            case GM_Q6_K: off[0] = 208; break;
            default: break;
            }
            for (int64_t b = 0; b < K / in->block_size; b++)
                for (int j = 0; j < 2; j++)
                    if (off[j] >= 0) {
                        uint16_t h = gm_f32_to_f16(0.01f + 0.02f * fabsf(gm_test_rand(&seed)));
                        memcpy(r + b * in->type_size + off[j], &h, 2);
                    }
            break;
        }
        }
    }
    return buf;
}

static void check_matmul(gm_dtype type, int64_t M, int64_t N, int64_t K, float beta) {
    float *wf = rnd(N * K, 0.5f), *x = rnd(M * K, 1.0f), *out = rnd(M * N, 1.0f);
    float *ref = gm_malloc((size_t)(M * N) * 4), *wd = gm_malloc((size_t)(N * K) * 4);
    memcpy(ref, out, (size_t)(M * N) * 4);
    size_t rb;
    void *w = encode_weight(type, wf, N, K, &rb);
    for (int64_t n = 0; n < N; n++) gm_dequant_row(type, (uint8_t *)w + (size_t)n * rb, wd + n * K, K);
    double *mag = gm_malloc((size_t)(M * N) * sizeof(double));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int64_t kk = 0; kk < K; kk++) {
                s += (double)x[m * K + kk] * wd[n * K + kk];
                a += fabs((double)x[m * K + kk] * wd[n * K + kk]);
            }
            ref[m * N + n] = (float)(beta * ref[m * N + n] + s);
            mag[m * N + n] = a + fabs(beta * ref[m * N + n]);
        }
    gm_kctx k = make_ctx(2, gm_k_matmul_scratch_floats(type, N, K, 2));
    gm_wview wv = {type, w, rb, N, K, 0, 0, 0.0f, 0};
    gm_k_matmul_fwd_cpu(&k, out, x, &wv, M, beta);
    /* f32 dot products: |error| <= K * eps_f32 * sum|x_k w_k| in the worst case; blocked sums
     * stay far below that, so 1e-5 (~ 84 ulp of the magnitude) is a bound that still catches a
     * wrong element, a wrong panel or a wrong row stride. */
    size_t bad = 0, worst = 0;
    double wd_ = 0;
    for (int64_t i = 0; i < M * N; i++) {
        double d = fabs((double)out[i] - ref[i]);
        if (d > 1e-5 * mag[i] + 1e-6) bad++;
        if (d > wd_) wd_ = d, worst = (size_t)i;
    }
    CHECK(bad == 0, "matmul %s M=%lld N=%lld K=%lld beta=%g: %zu elements off; worst [%zu] %.7g vs %.7g",
          gm_dtype_name(type), (long long)M, (long long)N, (long long)K, (double)beta, bad, worst,
          (double)out[worst], (double)ref[worst]);
    gm_free(mag);
    gm_free(wf), gm_free(x), gm_free(out), gm_free(ref), gm_free(wd), gm_free(w), gm_free(k.scratch);
}

static void test_matmul(void) {
    gm_dtype types[] = {GM_F32, GM_F16, GM_BF16, GM_Q8_0, GM_Q4_0, GM_Q4_1, GM_Q5_0, GM_Q5_1,
                        GM_Q2_K, GM_Q3_K, GM_Q4_K, GM_Q5_K, GM_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_matmul(types[i], 1, 600, 512, 0.0f);   /* GEMV path (generation), N not a panel multiple */
        check_matmul(types[i], 9, 1100, 512, 0.0f);  /* panel + sgemm path, 3 panels */
    }
    check_matmul(GM_Q8_0, 3, 70, 256, 1.0f);         /* accumulate (LoRA / residual use) */
    check_matmul(GM_F32, 17, 33, 64, 1.0f);
}

static void test_embed(void) {
    int64_t V = 50, C = 64, N = 6;
    float *tf = rnd(V * C, 1.0f);
    size_t rb;
    void *table = encode_weight(GM_Q8_0, tf, V, C, &rb);
    int32_t ids[6] = {0, 49, 3, 3, 17, 8};
    float *out = gm_malloc((size_t)(N * C) * 4), *ref = gm_malloc((size_t)(N * C) * 4);
    gm_kctx k = make_ctx(2, 0);
    gm_wview tv = {GM_Q8_0, table, rb, V, C, 0, 0, 0.0f, 0};
    gm_k_embed_fwd_cpu(&k, out, ids, &tv, N, 8.0f);
    for (int64_t n = 0; n < N; n++) {
        gm_dequant_row(GM_Q8_0, (uint8_t *)table + (size_t)ids[n] * rb, ref + n * C, C);
        for (int64_t c = 0; c < C; c++) ref[n * C + c] *= 8.0f;
    }
    gm_check_close("embed q8_0", out, ref, (size_t)(N * C), 0, 0);
    gm_free(tf), gm_free(table), gm_free(out), gm_free(ref);
}

static void test_threads_deterministic(void) {
    /* The same inputs and thread count give bit-identical outputs (training reproducibility). */
    int64_t M = 9, N = 700, K = 256;
    float *wf = rnd(N * K, 0.5f), *x = rnd(M * K, 1.0f);
    size_t rb;
    void *w = encode_weight(GM_Q5_0, wf, N, K, &rb);
    float *o1 = gm_malloc((size_t)(M * N) * 4), *o2 = gm_malloc((size_t)(M * N) * 4);
    gm_kctx k = make_ctx(2, gm_k_matmul_scratch_floats(GM_Q5_0, N, K, 2));
    gm_wview wv = {GM_Q5_0, w, rb, N, K, 0, 0, 0.0f, 0};
    gm_k_matmul_fwd_cpu(&k, o1, x, &wv, M, 0.0f);
    gm_k_matmul_fwd_cpu(&k, o2, x, &wv, M, 0.0f);
    CHECK(memcmp(o1, o2, (size_t)(M * N) * 4) == 0, "two identical matmuls differ");
    gm_free(wf), gm_free(x), gm_free(w), gm_free(o1), gm_free(o2), gm_free(k.scratch);
}

/* Decoding (M = 1) takes the fused row dot (gm_dot_wrow) for Q8_0, Q5_0, Q4_K and Q6_K: it must
 * return the bits of the dequantize-then-dot path that M = 2 takes, with the AVX2 twin and with the
 * baseline code, at block counts that are not a multiple of anything (K = 32 .. 768), with
 * accumulation. */
static void test_fused_gemv(void) {
    gm_dtype types[] = {GM_Q8_0, GM_Q5_0, GM_Q4_K, GM_Q6_K, GM_Q5_K /* not fused: the same check holds */};
    int64_t Ks[] = {32, 96, 256, 672, 768}, N = 37;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki];
            if (K % gm_dtype_get(types[t])->block_size) continue;
            float *wf = rnd(N * K, 0.5f), *x1 = rnd(K, 1.0f), *x2 = gm_malloc((size_t)(2 * K) * 4);
            memcpy(x2, x1, (size_t)K * 4), memcpy(x2 + K, x1, (size_t)K * 4);
            size_t rb;
            void *w = encode_weight(types[t], wf, N, K, &rb);
            gm_kctx k = make_ctx(2, gm_k_matmul_scratch_floats(types[t], N, K, 2));
            gm_wview wv = {types[t], w, rb, N, K, 0, 0, 0.0f, 0};
            float *o2 = gm_malloc((size_t)(2 * N) * 4), *o1 = gm_malloc((size_t)N * 4), *o1b = gm_malloc((size_t)N * 4);
            gm_k_matmul_fwd_cpu(&k, o2, x2, &wv, 2, 0.0f);
            for (int simd = 1; simd >= 0; simd--) {
                gm_cpu_simd = simd != 0;
                gm_k_matmul_fwd_cpu(&k, o1, x1, &wv, 1, 0.0f);
                for (int64_t n = 0; n < N; n++) o1b[n] = 0.25f;
                gm_k_matmul_fwd_cpu(&k, o1b, x1, &wv, 1, 1.0f);
                size_t bad = 0, bad_acc = 0;
                for (int64_t n = 0; n < N; n++) {
                    bad += memcmp(&o1[n], &o2[n], 4) != 0 || memcmp(&o1[n], &o2[N + n], 4) != 0;
                    float want = 0.25f + o2[n];
                    bad_acc += memcmp(&o1b[n], &want, 4) != 0;
                }
                CHECK(bad == 0 && bad_acc == 0, "fused GEMV %s K=%lld (%s): %zu of %lld rows differ from dequantize-then-dot, "
                      "%zu with accumulation", gm_dtype_name(types[t]), (long long)K, simd ? "dispatched" : "baseline",
                      bad, (long long)N, bad_acc);
            }
            gm_cpu_simd = true;
            gm_free(wf), gm_free(x1), gm_free(x2), gm_free(w), gm_free(o1), gm_free(o1b), gm_free(o2), gm_free(k.scratch);
        }
}

/* matmul_fwd_multi: three weights sharing x (q / k / v-like: 3 dtypes, 3 heights, and an f32 weight
 * among them once) give, each, the bits of its own matmul_fwd call, at M = 1 (the one-region GEMV,
 * with and without the int8 dots), 3 (GEMV, no fused dot) and 9 (GEMMs), on 1 and 3 threads. */
static void test_matmul_fwd_multi(void) {
    int64_t K = 512, Ns[3] = {200, 64, 37}, Ms[3] = {1, 3, 9};
    gm_dtype sets[2][3] = {{GM_Q5_0, GM_Q8_0, GM_Q4_K}, {GM_Q6_K, GM_F32, GM_BF16}};
    for (int set = 0; set < 2; set++)
        for (int nt = 1; nt <= 3; nt += 2) {
            void *wd[3];
            gm_wview wv[3];
            const gm_wview *wp[3];
            size_t scratch = 0;
            for (int i = 0; i < 3; i++) {
                float *wf = rnd(Ns[i] * K, 0.5f);
                size_t rb;
                wd[i] = encode_weight(sets[set][i], wf, Ns[i], K, &rb);
                wv[i] = (gm_wview){sets[set][i], wd[i], rb, Ns[i], K, 0, 0, 0.0f, 0};
                wp[i] = &wv[i];
                size_t f = gm_k_matmul_scratch_floats(sets[set][i], Ns[i], K, nt);
                scratch = f > scratch ? f : scratch;
                gm_free(wf);
            }
            gm_kctx k = make_ctx(nt, scratch);
            for (int mi = 0; mi < 3; mi++)
                for (int q8 = 0; q8 <= 1; q8++) {
                    int64_t M = Ms[mi];
                    k.int8_dot = q8;
                    float *x = rnd(M * K, 1.0f), *one[3], *multi[3];
                    for (int i = 0; i < 3; i++) {
                        one[i] = gm_malloc((size_t)(M * Ns[i]) * 4), multi[i] = gm_malloc((size_t)(M * Ns[i]) * 4);
                        gm_k_matmul_fwd_cpu(&k, one[i], x, wp[i], M, 0.0f);
                    }
                    gm_k_matmul_fwd_multi_cpu(&k, multi, x, wp, 3, M);
                    for (int i = 0; i < 3; i++) {
                        CHECK(memcmp(one[i], multi[i], (size_t)(M * Ns[i]) * 4) == 0,
                              "matmul_fwd_multi %s (%d of 3) M=%lld threads %d int8 %d: not matmul_fwd's bits",
                              gm_dtype_name(sets[set][i]), i, (long long)M, nt, q8);
                        gm_free(one[i]), gm_free(multi[i]);
                    }
                    gm_free(x);
                }
            for (int i = 0; i < 3; i++) gm_free(wd[i]);
            gm_free(k.scratch);
        }
}

/* x quantized for the int8 dots (gm_quantize_x_q8): the AVX2 and baseline twins give the same bytes,
 * on random blocks and on blocks built to hit every edge: amax 127 so that 1/d is 1 and halves are
 * exact ties (to even: 2.5 -> 2, -3.5 -> -4), -0.0, a block of zeros, subnormals, a lone maximum. */
static void test_quantize_x_q8(void) {
    enum { K = 32 * 8 };
    float *x = rnd(K, 3.0f);
    for (int e = 0; e < 32; e++) x[e] = (float)(e - 16) + 0.5f; /* ties; amax 15.5 */
    x[31] = 127.0f;                                              /* now amax 127: 1/d = 1 */
    for (int e = 0; e < 32; e++) x[32 + e] = e % 2 ? -0.0f : 0.0f;
    for (int e = 0; e < 32; e++) x[64 + e] = (e % 3 ? 1.0f : -1.0f) * 1e-40f;
    for (int e = 0; e < 32; e++) x[96 + e] = e == 7 ? -4.0f : 0.0f;
    uint8_t q[2][GM_XQ8_BYTES(K)];
    for (int simd = 0; simd < 2; simd++) {
        gm_cpu_simd = simd != 0;
        gm_quantize_x_q8(x, K, q[simd]);
    }
    gm_cpu_simd = true;
    size_t bad = 0;
    for (size_t i = 0; i < sizeof q[0]; i++) bad += q[0][i] != q[1][i];
    CHECK(bad == 0, "quantize_x_q8: the AVX2 and baseline twins differ in %zu bytes", bad);
    int8_t ties[4] = {(int8_t)q[1][8 + 2 + 16], (int8_t)q[1][8 + 3 + 16], (int8_t)q[1][8 + 16 - 4], (int8_t)q[1][8 + 16 - 3]};
    CHECK(ties[0] == 2 && ties[1] == 4 && ties[2] == -4 && ties[3] == -2,
          "quantize_x_q8: halves round to even: 2.5 3.5 -3.5 -2.5 -> %d %d %d %d", ties[0], ties[1], ties[2], ties[3]);
    gm_free(x);
}

/* The int8 dots of decoding (gm_kctx.int8_dot, generation's default): for Q8_0, Q5_0, Q4_K and Q6_K weights the AVX2 and
 * baseline twins give the same bits (with and without accumulation); against the f32 dot each row
 * is within the quantization bound of kernels.h (TOL_INT8_DOT_STEPS), which the worst row nears
 * (printed: the bound is not loose); other types, and K not a multiple of 32, fall back to the f32
 * dots bit for bit; a block of zeros quantizes to zeros. */
static void test_int8_gemv(void) {
    gm_dtype types[] = {GM_Q8_0, GM_Q5_0, GM_Q4_K, GM_Q6_K, GM_Q5_K /* not int8: falls back */};
    int64_t Ks[] = {32, 96, 256, 672, 2048}, N = 37;
    double worst_ratio = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            int64_t K = Ks[ki];
            if (K % gm_dtype_get(types[t])->block_size) continue;
            float *wf = rnd(N * K, 0.5f), *x = rnd(K, 1.0f);
            for (int e = 0; e < 32 && K >= 64; e++) x[32 + e] = 0.0f; /* a block of zeros */
            size_t rb;
            void *w = encode_weight(types[t], wf, N, K, &rb);
            gm_kctx k = make_ctx(2, gm_k_matmul_scratch_floats(types[t], N, K, 2));
            gm_wview wv = {types[t], w, rb, N, K, 0, 0, 0.0f, 0};
            float *exact = gm_malloc((size_t)N * 4), *o[2], *acc = gm_malloc((size_t)N * 4);
            gm_k_matmul_fwd_cpu(&k, exact, x, &wv, 1, 0.0f);
            k.int8_dot = true;
            for (int simd = 1; simd >= 0; simd--) {
                gm_cpu_simd = simd != 0;
                o[simd] = gm_malloc((size_t)N * 4);
                gm_k_matmul_fwd_cpu(&k, o[simd], x, &wv, 1, 0.0f);
                for (int64_t n = 0; n < N; n++) acc[n] = 0.25f;
                gm_k_matmul_fwd_cpu(&k, acc, x, &wv, 1, 1.0f);
                size_t bad_acc = 0;
                for (int64_t n = 0; n < N; n++) {
                    float want = 0.25f + o[simd][n];
                    bad_acc += memcmp(&acc[n], &want, 4) != 0;
                }
                CHECK(bad_acc == 0, "int8 GEMV %s K=%lld (%s): %zu rows differ with accumulation", gm_dtype_name(types[t]),
                      (long long)K, simd ? "dispatched" : "baseline", bad_acc);
            }
            gm_cpu_simd = true;
            CHECK(memcmp(o[0], o[1], (size_t)N * 4) == 0, "int8 GEMV %s K=%lld: the AVX2 and baseline twins differ",
                  gm_dtype_name(types[t]), (long long)K);
            if (!gm_int8_dot_supports(types[t])) {
                CHECK(memcmp(o[1], exact, (size_t)N * 4) == 0, "int8_dot on %s K=%lld: the f32 dots, bit for bit",
                      gm_dtype_name(types[t]), (long long)K);
            } else {
                float *row = gm_malloc((size_t)K * 4);
                size_t over = 0;
                for (int64_t n = 0; n < N; n++) {
                    gm_dequant_wrow(&wv, n, row);
                    double bound = 0, mag = 0;
                    for (int64_t b = 0; b < K / 32; b++) {
                        double amax = 0, wsum = 0;
                        for (int e = 0; e < 32; e++) amax = fmax(amax, fabs(x[32 * b + e])), wsum += fabs(row[32 * b + e]);
                        bound += TOL_INT8_DOT_STEPS * (amax / 127.0) * wsum;
                    }
                    for (int64_t i = 0; i < K; i++) mag += fabs((double)x[i] * row[i]);
                    bound += TOL_KERNEL_F32_REL * mag;
                    double d = fabs((double)o[1][n] - exact[n]);
                    over += d > bound;
                    worst_ratio = fmax(worst_ratio, d / bound);
                }
                CHECK(over == 0, "int8 GEMV %s K=%lld: %zu of %lld rows outside the quantization bound", gm_dtype_name(types[t]),
                      (long long)K, over, (long long)N);
                gm_free(row);
            }
            gm_free(wf), gm_free(x), gm_free(w), gm_free(exact), gm_free(o[0]), gm_free(o[1]), gm_free(acc), gm_free(k.scratch);
        }
    printf("int8 GEMV: worst row at %.2f of its quantization bound\n", worst_ratio);
    CHECK(worst_ratio > 0.05, "the int8 dots differ from the f32 ones at all (worst row at %.3f of the bound)", worst_ratio);
}

/* fill, row gather / scatter, KV-cache store, log-sum-exp finish (kernels/cpu/movement.c), against
 * loops written from the contracts in kernels.h. */
static void test_movement(void) {
    gm_kctx k = make_ctx(2, 0);
    int64_t R = 5, C = 12, rows_in = 9;
    float *x = rnd(rows_in * C, 1.0f), *out = gm_malloc((size_t)(rows_in * C) * 4), *ref = gm_malloc((size_t)(rows_in * C) * 4);
    int32_t rows[5] = {8, 0, 3, 7, 1};
    gm_k_fill_cpu(&k, out, rows_in * C, -2.5f);
    bool filled = true;
    for (int64_t i = 0; i < rows_in * C; i++) filled = filled && out[i] == -2.5f;
    CHECK(filled, "fill");
    gm_k_gather_rows_cpu(&k, out, x, rows, R, C);
    for (int64_t i = 0; i < R; i++)
        for (int64_t c = 0; c < C; c++) ref[i * C + c] = x[rows[i] * C + c];
    gm_check_close("gather_rows", out, ref, (size_t)(R * C), 0, 0);
    /* scatter: rows of x into out at rows[i]; the other rows keep their value */
    for (int64_t i = 0; i < rows_in * C; i++) out[i] = ref[i] = 7.0f;
    gm_k_scatter_rows_cpu(&k, out, x, rows, R, C);
    for (int64_t i = 0; i < R; i++)
        for (int64_t c = 0; c < C; c++) ref[rows[i] * C + c] = x[i * C + c];
    gm_check_close("scatter_rows", out, ref, (size_t)(rows_in * C), 0, 0);
    /* kv_store: a ring of S = 4 slots, positions 5..7 of 2 sequences */
    int64_t B = 2, T = 3, S = 4, W = 6, pos0 = 5;
    float *kv = rnd(B * T * W, 1.0f), *cache = gm_malloc((size_t)(B * S * W) * 4), *cref = gm_malloc((size_t)(B * S * W) * 4);
    for (int64_t i = 0; i < B * S * W; i++) cache[i] = cref[i] = -1.0f;
    gm_k_kv_store_cpu(&k, cache, kv, B, T, S, W, pos0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t w = 0; w < W; w++) cref[(b * S + (pos0 + t) % S) * W + w] = kv[(b * T + t) * W + w];
    gm_check_close("kv_store ring buffer", cache, cref, (size_t)(B * S * W), 0, 0);
    /* lse = max + log(sum) in f32 */
    float mx[3] = {1.5f, -3.0f, 40.0f}, sm[3] = {1.0f, 2.5f, 1234.5f}, lse[3], lref[3];
    gm_k_xent_lse_finish_cpu(&k, lse, mx, sm, 3);
    for (int i = 0; i < 3; i++) lref[i] = mx[i] + logf(sm[i]);
    gm_check_close("xent_lse_finish", lse, lref, 3, 0, 0);
    gm_free(x), gm_free(out), gm_free(ref), gm_free(kv), gm_free(cache), gm_free(cref);
}

/* Gemma 3n's kernels against loops written from transformers' formulas (kernels.h): AltUp's
 * predict and correct on 4 streams, magnitude matching (one row under the 1e-5 floor), the
 * gaussian top-k at 95% sparsity (z = 1.6448536), the per-channel scale, the weightless RMSNorm. */
static void test_gemma3n_kernels(void) {
    int64_t S = 4, N = 5, C = 96, F = 512;
    gm_kctx k = make_ctx(2, 0);
    float *x = rnd(S * N * C, 2.0f), *cf = rnd(N * S * S, 0.3f), *out = gm_malloc((size_t)(S * N * C) * 4);
    float *ref = gm_malloc((size_t)(S * N * C) * 4), *act = rnd(N * C, 2.0f), *cc = rnd(N * S, 0.3f);
    gm_k_altup_predict_fwd_cpu(&k, out, x, cf, S, N, C);
    for (int64_t j = 0; j < S; j++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                double v = x[(j * N + n) * C + c];
                for (int64_t i = 0; i < S; i++) v += (double)cf[n * S * S + j * S + i] * x[(i * N + n) * C + c];
                ref[(j * N + n) * C + c] = (float)v;
            }
    gm_check_close("altup_predict_fwd", out, ref, (size_t)(S * N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    for (int64_t j = 0; j < S; j++)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                int64_t e = (j * N + n) * C + c;
                ref[e] = (float)(x[e] + ((double)cc[n * S + j] + 1.0) * ((double)act[n * C + c] - x[n * C + c]));
            }
    gm_k_altup_correct_fwd_cpu(&k, x, x, act, cc, S, N, C); /* in place */
    gm_check_close("altup_correct_fwd in place", x, ref, (size_t)(S * N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    /* magnitude matching: row 0 of x tiny (its mean square under the floor) */
    float *t = rnd(N * C, 3.0f);
    for (int64_t c = 0; c < C; c++) x[c] *= 1e-4f;
    for (int64_t n = 0; n < N; n++) {
        double sx = 0, st = 0;
        for (int64_t c = 0; c < C; c++) sx += (double)x[n * C + c] * x[n * C + c], st += (double)t[n * C + c] * t[n * C + c];
        double f = sqrt(st / (double)C) / sqrt(fmax(sx / (double)C, 1e-5));
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = (float)(x[n * C + c] * f);
    }
    gm_k_rms_match_fwd_cpu(&k, out, x, t, N, C, 1e-5f);
    gm_check_close("rms_match_fwd", out, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    /* gaussian top-k: mean + z std (population), then relu */
    float *g = rnd(N * F, 2.0f), *go = gm_malloc((size_t)(N * F) * 4), *gr = gm_malloc((size_t)(N * F) * 4);
    int64_t kept = 0;
    for (int64_t n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int64_t f = 0; f < F; f++) m += g[n * F + f];
        m /= (double)F;
        for (int64_t f = 0; f < F; f++) v += (g[n * F + f] - m) * (g[n * F + f] - m);
        double cut = m + 1.6448536 * sqrt(v / (double)F);
        for (int64_t f = 0; f < F; f++) gr[n * F + f] = (float)fmax(g[n * F + f] - cut, 0.0), kept += gr[n * F + f] > 0;
    }
    gm_k_gaussian_topk_fwd_cpu(&k, go, g, N, F, 1.6448536f);
    gm_check_close("gaussian_topk_fwd", go, gr, (size_t)(N * F), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    /* a uniform draw keeps the values above mean + 1.645 sd: none of the top 5% of a normal, all
     * of uniform's top ~2% (sd 1/sqrt(3) of the range): some, and far from all */
    CHECK(kept > 0 && kept < N * F / 10, "gaussian top-k keeps %lld of %lld gate values", (long long)kept, (long long)(N * F));
    /* per-channel scale, and RMSNorm without a weight */
    float *sc = rnd(C, 2.0f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = t[n * C + c] * sc[c];
    gm_k_mul_cols_fwd_cpu(&k, out, t, sc, N, C);
    gm_check_close("mul_cols_fwd", out, ref, (size_t)(N * C), 0, 0);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) ss += (double)t[n * C + c] * t[n * C + c];
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = (float)(t[n * C + c] / sqrt(ss / (double)C + 1e-6));
    }
    gm_k_rmsnorm_fwd_cpu(&k, out, NULL, t, NULL, N, C, 1e-6f);
    gm_check_close("rmsnorm_fwd without weight", out, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_free(x), gm_free(cf), gm_free(out), gm_free(ref), gm_free(act), gm_free(cc), gm_free(t), gm_free(g), gm_free(go);
    gm_free(gr), gm_free(sc);
}

/* audio_attention_fwd against transformers' block formulation written out literally
 * (Gemma3nAudioAttention.forward, Gemma3nAudioRelativePositionEmbedding): queries cut into blocks of
 * W, each block's context of W + L + R keys taken from the zero-padded sequence, term_bd shifted
 * by the pad / reshape / slice of _relative_shift, the local causal mask and the validity mask,
 * masked logits at -FLT_MAX (finfo.min) and a softmax over the whole context - so a query that
 * sees no key averages its context. Clip 1's last frames are padding: some queries see nothing. */
static void test_audio_attention(void) {
    int64_t B = 2, T = 23, H = 3, D = 8, W = 4, L = 3, R = 2, Cx = W + L + R, F = L + R + 1;
    float cap = 5.0f;
    gm_kctx k = make_ctx(2, 0);
    float *q = rnd(B * T * H * D, 1.5f), *kk = rnd(B * T * H * D, 1.5f), *v = rnd(B * T * H * D, 1.0f);
    float *pos = rnd(F * H * D, 1.0f), *out = gm_malloc((size_t)(B * T * H * D) * 4), *ref = gm_malloc((size_t)(B * T * H * D) * 4);
    uint8_t valid[2 * 23];
    for (int64_t t = 0; t < T; t++) valid[t] = t != 5, valid[T + t] = t < 9;
    int64_t U = (T + W - 1) / W, blind = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t u = 0; u < U; u++)
                for (int64_t w = 0; w < W; w++) {
                    int64_t t = u * W + w;
                    if (t >= T) continue;
                    const float *qr = q + ((b * T + t) * H + h) * D;
                    double logit[16], bd_row[16][16]; /* bd for rows w of the block: [w'][f] */
                    for (int64_t w2 = 0; w2 < W; w2++)
                        for (int64_t f = 0; f < F; f++) {
                            int64_t t2 = u * W + w2;
                            double a = 0;
                            for (int64_t d = 0; d < D; d++)
                                a += (t2 < T ? (double)q[((b * T + t2) * H + h) * D + d] : 0.0) * pos[(f * H + h) * D + d];
                            bd_row[w2][f] = a;
                        }
                    double m = -INFINITY;
                    int any = 0;
                    for (int64_t c = 0; c < Cx; c++) {
                        int64_t s_abs = u * W - L + c; /* the context's key c */
                        double ac = 0;
                        if (s_abs >= 0 && s_abs < T)
                            for (int64_t d = 0; d < D; d++) ac += (double)qr[d] * kk[((b * T + s_abs) * H + h) * D + d];
                        /* _relative_shift: row w of the result is the padded (W, Cx + 1) array's flat
                         * elements w Cx .. w Cx + Cx - 1 */
                        int64_t flat = w * Cx + c, r0 = flat / (Cx + 1), c0 = flat % (Cx + 1);
                        double bd = c0 < F ? bd_row[r0][c0] : 0.0;
                        double l = cap * tanh((ac + bd) / cap);
                        bool causal = c >= w && c <= w + L + R; /* local_causal_valid_mask */
                        bool ok = causal && s_abs >= 0 && s_abs < T && valid[b * T + s_abs];
                        logit[c] = ok ? l : -FLT_MAX;
                        any |= ok;
                        if (logit[c] > m) m = logit[c];
                    }
                    blind += !any;
                    double z = 0, o[8] = {0};
                    for (int64_t c = 0; c < Cx; c++) z += exp(logit[c] - m);
                    for (int64_t c = 0; c < Cx; c++) {
                        int64_t s_abs = u * W - L + c;
                        double p = exp(logit[c] - m) / z;
                        if (s_abs >= 0 && s_abs < T)
                            for (int64_t d = 0; d < D; d++) o[d] += p * v[((b * T + s_abs) * H + h) * D + d];
                    }
                    for (int64_t d = 0; d < D; d++) ref[((b * T + t) * H + h) * D + d] = (float)o[d];
                }
    gm_k_audio_attention_fwd_cpu(&k, out, q, kk, v, pos, valid, B, T, H, D, W, L, R, cap);
    gm_check_close("audio_attention_fwd vs the block formulation", out, ref, (size_t)(B * T * H * D), TOL_KERNEL_F32_ABS,
                   TOL_KERNEL_F32_REL);
    CHECK(blind > 0, "%lld queries see no key (the all-masked rule is exercised)", (long long)blind);
    /* the light convolution's causal depthwise taps, GLU, SiLU, clamp */
    int64_t C = 6, K = 3, N = B * T;
    float *w = rnd(C * K, 1.0f), *x2 = rnd(N * 2 * C, 3.0f);
    gm_k_conv1d_causal_fwd_cpu(&k, out, v, w, B, T, C, K); /* v read as (B, T, C = 6) of its first B T C values */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) {
                double a = 0;
                for (int64_t j = 0; j < K; j++)
                    if (t - K + 1 + j >= 0) a += (double)w[c * K + j] * v[(b * T + t - K + 1 + j) * C + c];
                ref[(b * T + t) * C + c] = (float)a;
            }
    gm_check_close("conv1d_causal_fwd", out, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_k_glu_fwd_cpu(&k, out, x2, N, C);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) ref[n * C + c] = (float)(x2[n * 2 * C + c] / (1.0 + exp(-(double)x2[n * 2 * C + C + c])));
    gm_check_close("glu_fwd", out, ref, (size_t)(N * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_k_silu_fwd_cpu(&k, out, x2, N * 2 * C);
    for (int64_t i = 0; i < N * 2 * C; i++) ref[i] = (float)(x2[i] / (1.0 + exp(-(double)x2[i])));
    gm_check_close("silu_fwd", out, ref, (size_t)(N * 2 * C), TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_k_clamp_fwd_cpu(&k, out, x2, N * 2 * C, 1.25f);
    for (int64_t i = 0; i < N * 2 * C; i++) ref[i] = x2[i] > 1.25f ? 1.25f : x2[i] < -1.25f ? -1.25f : x2[i];
    gm_check_close("clamp_fwd", out, ref, (size_t)(N * 2 * C), 0, 0);
    gm_free(q), gm_free(kk), gm_free(v), gm_free(pos), gm_free(out), gm_free(ref), gm_free(w), gm_free(x2);
}

/* Gemma 4's vision tower (kernels.h clip_*, rope2d_*): the clipped linears' clamp against a plain
 * loop, asymmetric bounds and infinite ones (the identity), in place too; the 2-D RoPE against
 * rope_fwd applied to each half-head apart (head width D/2, n_rot D/4, pos_scale 1) at its own
 * position - x for the first half, y for the second. */
static void test_vision4(void) {
    gm_kctx k = make_ctx(2, 0);
    int64_t n = 300;
    float *x = rnd(n, 2.0f), *out = gm_malloc((size_t)n * 4), *ref = gm_malloc((size_t)n * 4);
    x[0] = -0.7f, x[1] = 1.3f, x[2] = -5.0f, x[3] = 5.0f;
    const float bounds[2][2] = {{-0.7f, 1.3f}, {-INFINITY, INFINITY}};
    for (int b = 0; b < 2; b++) {
        const float lo = bounds[b][0], hi = bounds[b][1];
        gm_k_clip_fwd_cpu(&k, out, x, n, &lo, &hi);
        int64_t below = 0, above = 0;
        for (int64_t i = 0; i < n; i++) {
            ref[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
            below += x[i] < lo, above += x[i] > hi;
        }
        gm_check_close(b ? "clip_fwd (-inf, inf): the identity" : "clip_fwd [-0.7, 1.3]", out, ref, (size_t)n, 0, 0);
        if (!b) CHECK(below > 0 && above > 0, "clip_fwd: values on both sides of [-0.7, 1.3] (%lld below, %lld above)",
                      (long long)below, (long long)above);
        memcpy(out, x, (size_t)n * 4);
        gm_k_clip_fwd_cpu(&k, out, out, n, &lo, &hi);
        gm_check_close(b ? "clip_fwd (-inf, inf) in place" : "clip_fwd [-0.7, 1.3] in place", out, ref, (size_t)n, 0, 0);
    }
    gm_free(x), gm_free(out), gm_free(ref);

    enum { N = 7, NH = 3, D = 16, HD = D / 2 };
    const float theta = 100.0f;
    const int32_t px[N] = {0, 1, 2, 3, 0, 5, 11}, py[N] = {0, 0, 4, 1, 6, 2, 9};
    float *xr = rnd(N * NH * D, 1.0f), *o = gm_malloc(N * NH * D * 4), *want = gm_malloc(N * NH * D * 4);
    float *hx = gm_malloc(N * NH * HD * 4), *ho = gm_malloc(N * NH * HD * 4);
    for (int part = 0; part < 2; part++) {
        for (int r = 0; r < N * NH; r++) memcpy(hx + r * HD, xr + r * D + part * HD, HD * 4);
        /* (N NH, 1, D/2): row r = n NH + h sits at the position of token n */
        int32_t pos[N * NH];
        for (int r = 0; r < N * NH; r++) pos[r] = part ? py[r / NH] : px[r / NH];
        gm_k_rope_fwd_cpu(&k, ho, hx, pos, N * NH, 1, HD, HD / 2, theta, 1.0f);
        for (int r = 0; r < N * NH; r++) memcpy(want + r * D + part * HD, ho + r * HD, HD * 4);
    }
    gm_k_rope2d_fwd_cpu(&k, o, xr, px, py, N, NH, D, theta);
    gm_check_close("rope2d_fwd vs rope_fwd on each half-head", o, want, N * NH * D, 1e-6, 0);
    memcpy(o, xr, N * NH * D * 4);
    gm_k_rope2d_fwd_cpu(&k, o, o, px, py, N, NH, D, theta);
    gm_check_close("rope2d_fwd in place", o, want, N * NH * D, 1e-6, 0);
    /* the backward undoes the forward (the rotation is orthogonal) */
    gm_k_rope2d_bwd_cpu(&k, o, o, px, py, N, NH, D, theta);
    gm_check_close("rope2d_bwd(rope2d_fwd(x)) = x", o, xr, N * NH * D, TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_free(xr), gm_free(o), gm_free(want), gm_free(hx), gm_free(ho);
}

/* Gemma 4's vision pooler (kernels.h pool_gather_*): a non-square 6 x 9 patch grid pooled 3 x 3
 * (2 x 3 soft tokens of 9 patches) whose rows sit scattered among N = 70 rows, 16 of them padding
 * (a (y, x) -> row map), against a plain double loop over the cells; the padding rows hold 1000 so
 * that naming one shows. Then a square grid (B = 2, 6 x 6, 3 x 3) against avgpool_fwd, and the
 * backward: padding rows 0, every grid row dout / 9 of its cell, whatever dx held before. */
static void test_pool_gather(void) {
    gm_kctx k = make_ctx(2, 0);
    enum { GH = 6, GW = 9, PK = 3, CH = GH / PK, CW = GW / PK, R = CH * CW, KK = PK * PK, NR = 70, C = 5 };
    const float scale = 1.0f / 9.0f;
    int32_t map[GH * GW], src[R * KK];
    bool used[NR] = {false};
    for (int i = 0; i < GH * GW; i++) map[i] = (int32_t)((i * 23 + 11) % NR), used[map[i]] = true; /* 23 prime to 70 */
    int pad = 0;
    for (int i = 0; i < NR; i++) pad += !used[i];
    CHECK(pad == NR - GH * GW, "pool_gather: %d padding rows, want %d", pad, NR - GH * GW);
    for (int cy = 0; cy < CH; cy++)
        for (int cx = 0; cx < CW; cx++)
            for (int dy = 0; dy < PK; dy++)
                for (int dx = 0; dx < PK; dx++)
                    src[(cy * CW + cx) * KK + dy * PK + dx] = map[(cy * PK + dy) * GW + cx * PK + dx];
    float *x = rnd(NR * C, 1.0f), *out = gm_malloc(R * C * 4), *ref = gm_malloc(R * C * 4);
    for (int i = 0; i < NR; i++)
        if (!used[i])
            for (int c = 0; c < C; c++) x[i * C + c] = 1000.0f;
    for (int cy = 0; cy < CH; cy++)
        for (int cx = 0; cx < CW; cx++)
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int y = cy * PK; y < cy * PK + PK; y++)
                    for (int xx = cx * PK; xx < cx * PK + PK; xx++) acc += x[map[y * GW + xx] * C + c];
                ref[(cy * CW + cx) * C + c] = (float)(acc / 9.0);
            }
    gm_k_pool_gather_fwd_cpu(&k, out, x, src, R, KK, C, scale);
    gm_check_close("pool_gather_fwd: 6 x 9 grid among padding rows, 3 x 3 cells", out, ref, R * C, TOL_KERNEL_F32_ABS,
                   TOL_KERNEL_F32_REL);

    /* the backward: dx filled with garbage first (assigned) */
    float *dout = rnd(R * C, 1.0f), *dx = rnd(NR * C, 5.0f), *want = gm_malloc(NR * C * 4);
    for (int i = 0; i < NR * C; i++) want[i] = 0.0f;
    for (int y = 0; y < GH; y++)
        for (int xx = 0; xx < GW; xx++)
            for (int c = 0; c < C; c++)
                want[map[y * GW + xx] * C + c] = (float)(dout[((y / PK) * CW + xx / PK) * C + c] / 9.0);
    gm_k_pool_gather_bwd_cpu(&k, dx, dout, src, R, KK, NR, C, scale);
    int pad_nonzero = 0;
    for (int i = 0; i < NR; i++)
        if (!used[i])
            for (int c = 0; c < C; c++) pad_nonzero += dx[i * C + c] != 0.0f;
    CHECK(pad_nonzero == 0, "pool_gather_bwd: %d values of padding rows not 0", pad_nonzero);
    gm_check_close("pool_gather_bwd: dout / 9 of each patch's cell, 0 on padding", dx, want, NR * C, 1e-7, 1e-6);
    gm_free(x), gm_free(out), gm_free(ref), gm_free(dout), gm_free(dx), gm_free(want);

    /* a square grid, two images: the same numbers as avgpool_fwd (B, P, K, C) */
    enum { B = 2, P = 6, Q = P / PK, SR = B * Q * Q };
    int32_t sq[SR * KK];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Q; i++)
            for (int j = 0; j < Q; j++)
                for (int dy = 0; dy < PK; dy++)
                    for (int dx2 = 0; dx2 < PK; dx2++)
                        sq[((b * Q + i) * Q + j) * KK + dy * PK + dx2] = (int32_t)((b * P + i * PK + dy) * P + j * PK + dx2);
    float *xs = rnd(B * P * P * C, 1.0f), *o1 = gm_malloc(SR * C * 4), *o2 = gm_malloc(SR * C * 4);
    gm_k_pool_gather_fwd_cpu(&k, o1, xs, sq, SR, KK, C, scale);
    gm_k_avgpool_fwd_cpu(&k, o2, xs, B, P, PK, C);
    gm_check_close("pool_gather_fwd vs avgpool_fwd (2 images, 6 x 6, 3 x 3)", o1, o2, SR * C, 1e-6, 0);
    gm_free(xs), gm_free(o1), gm_free(o2);
}

/* Gemma 4's routing and combination (kernels.h moe_*) against a double-precision reference:
 * softmax, the K largest (largest first), renormalized and scaled weights; the weighted and plain
 * sums of a token's slots. */
static void test_moe(void) {
    enum { N = 9, E = 8, K = 3, C = 20 };
    gm_kctx k = make_ctx(2, 0);
    float *z = rnd(N * E, 3.0f), *pes = rnd(E, 1.0f), *probs = gm_malloc(N * E * 4), *w = gm_malloc(N * K * 4);
    float *rp = gm_malloc(N * E * 4), *rw = gm_malloc(N * K * 4);
    int32_t idx[N * K];
    memcpy(probs, z, N * E * 4);
    gm_k_moe_route_fwd_cpu(&k, idx, w, probs, pes, N, E, K);
    int bad_idx = 0;
    for (int n = 0; n < N; n++) {
        double mx = z[n * E], sum = 0;
        for (int e = 1; e < E; e++) mx = fmax(mx, z[n * E + e]);
        for (int e = 0; e < E; e++) sum += exp((double)z[n * E + e] - mx);
        for (int e = 0; e < E; e++) rp[n * E + e] = (float)(exp((double)z[n * E + e] - mx) / sum);
        int chosen[K];
        double s = 0;
        for (int j = 0; j < K; j++) { /* the j-th largest */
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken = taken || chosen[i] == e;
                if (!taken && (best < 0 || z[n * E + e] > z[n * E + best])) best = e;
            }
            chosen[j] = best;
            s += exp((double)z[n * E + best] - mx) / sum;
            bad_idx += idx[n * K + j] != best;
        }
        for (int j = 0; j < K; j++) rw[n * K + j] = (float)(exp((double)z[n * E + chosen[j]] - mx) / sum / s * pes[chosen[j]]);
    }
    CHECK(bad_idx == 0, "moe_route_fwd: %d choices differ from the reference's top %d", bad_idx, K);
    gm_check_close("moe_route_fwd probabilities", probs, rp, N * E, TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    gm_check_close("moe_route_fwd weights", w, rw, N * K, TOL_KERNEL_F32_ABS, TOL_KERNEL_F32_REL);
    int32_t slot[N * K];
    for (int i = 0; i < N * K; i++) slot[i] = (i * 5 + 2) % (N * K); /* 5 is prime to 27 */
    float *ys = rnd(N * K * C, 1.0f), *y = gm_malloc(N * C * 4), *ry = gm_malloc(N * C * 4);
    for (int weighted = 0; weighted < 2; weighted++) {
        gm_k_moe_combine_fwd_cpu(&k, y, ys, weighted ? w : NULL, slot, N, K, C);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                double a = 0;
                for (int j = 0; j < K; j++) a += (weighted ? (double)w[n * K + j] : 1.0) * ys[slot[n * K + j] * C + c];
                ry[n * C + c] = (float)a;
            }
        gm_check_close(weighted ? "moe_combine_fwd weighted" : "moe_combine_fwd sum", y, ry, N * C, TOL_KERNEL_F32_ABS,
                       TOL_KERNEL_F32_REL);
    }
    gm_free(z), gm_free(pes), gm_free(probs), gm_free(w), gm_free(rp), gm_free(rw), gm_free(ys), gm_free(y), gm_free(ry);
}

int main(void) {
    test_vision4();
    test_pool_gather();
    test_moe();
    test_audio_attention();
    test_gemma3n_kernels();
    test_movement();
    test_rmsnorm();
    test_rope();
    test_attention();
    test_vmath();
    test_geglu_add_softcap();
    test_matmul();
    test_embed();
    test_threads_deterministic();
    test_fused_gemv();
    test_quantize_x_q8();
    test_matmul_fwd_multi();
    test_int8_gemv();
    return gm_test_finish();
}
