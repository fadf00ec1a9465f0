/*
 * test_grad.c - gradient checks of every backward kernel (style guide §4.7 rule 27).
 *
 * For each kernel the test writes the forward function again in double precision, straight from
 * the formulas of gemma_architecture.md §1.4-1.7, takes the scalar L = sum(dy * f(inputs)) for a
 * random upstream gradient dy, and compares the kernel's f32 gradients with central finite
 * differences of the double-precision L (step 1e-4: truncation error ~1e-8, far below the f32
 * rounding of the analytic side). Inputs are drawn at several magnitudes. Also: AdamW against a
 * double-precision transcription of torch.optim.AdamW, dropout masks, the chunked cross-entropy
 * against a direct double computation.
 */
#include "gm_alloc.h"
#include "gm_philox.h"
#include "kernels.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t seed = 777;

static float *rnd(int64_t n, float scale) {
    float *p = gm_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = gm_test_rand(&seed) * scale;
    return p;
}

static gm_kctx ctx_with(size_t scratch) {
    gm_kctx c = {.n_threads = 2, .scratch = scratch ? gm_malloc(scratch * sizeof(float)) : NULL,
                 .scratch_floats = scratch};
    return c;
}

/* A double-precision forward: L(inputs), reading the double copies of the inputs. */
typedef double (*loss_fn)(void *user);

/* f32 inputs for the kernel and their exact double copies for the finite differences. */
static float *rnd2(int64_t n, float scale, double **dcopy) {
    float *p = rnd(n, scale);
    *dcopy = gm_malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) (*dcopy)[i] = p[i];
    return p;
}

/* Checks analytic[i] against the 4th-order central difference of L in the double variable
 * var[i] (step 1e-3 * max(1, |x|): truncation ~h^4, rounding ~1e-13). The error is measured
 * relative to the largest gradient, since f32 analytic gradients carry ~1e-6 relative rounding
 * of their largest terms. */
static void fd_check(const char *what, double *var, int64_t n, const float *analytic, loss_fn L, void *user) {
    double worst = 0, gmax = 1e-12, wfd = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(analytic[i]));
    for (int64_t i = 0; i < n; i++) {
        double keep = var[i], h = 1e-3 * fmax(1.0, fabs(keep));
        var[i] = keep + h;
        double lp = L(user);
        var[i] = keep - h;
        double lm = L(user);
        var[i] = keep + 2 * h;
        double lpp = L(user);
        var[i] = keep - 2 * h;
        double lmm = L(user);
        var[i] = keep;
        double fd = (8.0 * (lp - lm) - (lpp - lmm)) / (12.0 * h);
        double err = fabs(fd - analytic[i]) / gmax;
        if (err > worst) worst = err, wi = i, wfd = fd;
    }
    CHECK(worst < TOL_GRAD_FD_REL, "%s: worst relative gradient error %.3g at [%lld]: analytic %.7g, finite difference %.7g",
          what, worst, (long long)wi, (double)analytic[wi], wfd);
    printf("grad %-40s worst error %.2e of max |grad| %.3g\n", what, worst, gmax);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */
typedef struct { int64_t N, C; double *x, *w, *dy; } rms_case;

static double rms_loss(void *u) {
    rms_case *c = u;
    double L = 0;
    for (int64_t n = 0; n < c->N; n++) {
        double ss = 0;
        for (int64_t k = 0; k < c->C; k++) ss += (double)c->x[n * c->C + k] * c->x[n * c->C + k];
        double r = 1.0 / sqrt(ss / (double)c->C + 1e-6);
        for (int64_t k = 0; k < c->C; k++) L += (double)c->dy[n * c->C + k] * c->x[n * c->C + k] * r * c->w[k];
    }
    return L;
}

static void test_rmsnorm(float mag) {
    rms_case c = {5, 24, NULL, NULL, NULL};
    float *x = rnd2(5 * 24, mag, &c.x), *w = rnd2(24, 2.0f, &c.w), *dyf = rnd2(5 * 24, 1.0f, &c.dy);
    float *y = gm_malloc(5 * 24 * 4), *rstd = gm_malloc(5 * 4), *dx = gm_malloc(5 * 24 * 4), *dw = gm_calloc(24, 4);
    gm_kctx k = ctx_with(0);
    gm_k_rmsnorm_fwd_cpu(&k, y, rstd, x, w, c.N, c.C, 1e-6f);
    gm_k_rmsnorm_bwd_cpu(&k, dx, dw, dyf, x, w, rstd, c.N, c.C, 0.0f);
    char what[64];
    snprintf(what, sizeof what, "rmsnorm dx (|x| ~ %g)", (double)mag);
    fd_check(what, c.x, c.N * c.C, dx, rms_loss, &c);
    snprintf(what, sizeof what, "rmsnorm dw (|x| ~ %g)", (double)mag);
    fd_check(what, c.w, c.C, dw, rms_loss, &c);
    /* beta = 1 accumulates on top of what is there (residual stream) */
    float *dx2 = gm_malloc(5 * 24 * 4);
    for (int i = 0; i < 5 * 24; i++) dx2[i] = 1.0f;
    gm_k_rmsnorm_bwd_cpu(&k, dx2, NULL, dyf, x, w, rstd, c.N, c.C, 1.0f);
    double d = 0;
    for (int i = 0; i < 5 * 24; i++) d = fmax(d, fabs((double)dx2[i] - 1.0 - dx[i]));
    CHECK(d < TOL_GRAD_ACCUM_ABS, "rmsnorm beta=1 must add to dx (diff %g)", d);
    gm_free(c.x), gm_free(c.w), gm_free(c.dy), gm_free(x), gm_free(w), gm_free(dyf);
    gm_free(y), gm_free(rstd), gm_free(dx), gm_free(dw), gm_free(dx2);
}

/* ---- RoPE --------------------------------------------------------------------------------- */
typedef struct { int64_t N, NH, D, n_rot; double *x, *dy; int32_t *pos; float theta, ps; } rope_case;

static double rope_loss(void *u) {
    rope_case *c = u;
    double L = 0;
    int64_t half = c->D / 2;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t h = 0; h < c->NH; h++)
            for (int64_t i = 0; i < half; i++) {
                float inv = i < c->n_rot ? 1.0f / powf(c->theta, (float)(2 * i) / (float)c->D) : 0.0f;
                double a = (double)(((float)c->pos[n] * c->ps) * inv);
                const double *x = c->x + (n * c->NH + h) * c->D;
                const double *g = c->dy + (n * c->NH + h) * c->D;
                L += g[i] * (x[i] * cos(a) - x[i + half] * sin(a)) + g[i + half] * (x[i + half] * cos(a) + x[i] * sin(a));
            }
    return L;
}

static void test_rope(void) {
    int32_t pos[3] = {0, 5, 300};
    rope_case c = {3, 2, 8, 4, NULL, NULL, pos, 10000.0f, 0.125f};
    float *x = rnd2(48, 1.0f, &c.x), *dy = rnd2(48, 1.0f, &c.dy);
    float *dx = gm_malloc(48 * 4);
    gm_kctx k = ctx_with(0);
    gm_k_rope_bwd_cpu(&k, dx, dy, pos, c.N, c.NH, c.D, c.n_rot, c.theta, c.ps);
    fd_check("rope", c.x, 48, dx, rope_loss, &c);
    c.n_rot = 1; /* proportional RoPE: 1 of 4 pairs rotates */
    gm_k_rope_bwd_cpu(&k, dx, dy, pos, c.N, c.NH, c.D, c.n_rot, c.theta, c.ps);
    fd_check("rope, 1 of 4 pairs", c.x, 48, dx, rope_loss, &c);
    gm_free(c.x), gm_free(c.dy), gm_free(x), gm_free(dy), gm_free(dx);
}

/* ---- GeGLU -------------------------------------------------------------------------------- */
typedef struct { int64_t n; double *gate, *up, *dh; } geglu_case;

static double geglu_loss(void *u) {
    geglu_case *c = u;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double z = c->gate[i];
        double g = 0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
        L += c->dh[i] * g * c->up[i];
    }
    return L;
}

static void test_geglu(float mag) {
    geglu_case c = {64, NULL, NULL, NULL};
    float *gate = rnd2(64, mag, &c.gate), *up = rnd2(64, 1.0f, &c.up), *dh = rnd2(64, 1.0f, &c.dh);
    float *dg = gm_malloc(64 * 4), *du = gm_malloc(64 * 4);
    gm_kctx k = ctx_with(0);
    gm_k_geglu_bwd_cpu(&k, dg, du, dh, gate, up, c.n);
    char what[64];
    snprintf(what, sizeof what, "geglu dgate (|z| ~ %g)", (double)mag);
    fd_check(what, c.gate, 64, dg, geglu_loss, &c);
    fd_check("geglu dup", c.up, 64, du, geglu_loss, &c);
    gm_free(c.gate), gm_free(c.up), gm_free(c.dh), gm_free(gate), gm_free(up), gm_free(dh), gm_free(dg), gm_free(du);
}

/* ---- attention ---------------------------------------------------------------------------- */
typedef struct { int64_t B, T, H, KVH, D, W; float scale; double *q, *k, *v, *dout; const int32_t *kv_end; } att_case;

static double att_loss(void *u) {
    att_case *c = u;
    double L = 0;
    double sc[64];
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t h = 0; h < c->H; h++) {
                int64_t kvh = h / (c->H / c->KVH), lo = (c->W > 0 && t - c->W + 1 > 0) ? t - c->W + 1 : 0;
                /* keys lo .. hi: causal, or up to the end of the query's image (kv_end) */
                int64_t hi = c->kv_end && c->kv_end[b * c->T + t] - 1 > t ? c->kv_end[b * c->T + t] - 1 : t;
                double mx = -1e300, z = 0;
                for (int64_t j = lo; j <= hi; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < c->D; d++)
                        s += (double)c->q[((b * c->T + t) * c->H + h) * c->D + d] * c->k[((b * c->T + j) * c->KVH + kvh) * c->D + d];
                    sc[j] = s * c->scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int64_t j = lo; j <= hi; j++) z += exp(sc[j] - mx);
                for (int64_t d = 0; d < c->D; d++) {
                    double o = 0;
                    for (int64_t j = lo; j <= hi; j++) o += exp(sc[j] - mx) / z * c->v[((b * c->T + j) * c->KVH + kvh) * c->D + d];
                    L += o * c->dout[((b * c->T + t) * c->H + h) * c->D + d];
                }
            }
    return L;
}

/* kv_end of the image-block cases: sequence 0 = text, image (3 tokens), text, image (2 tokens);
 * sequence 1 = all one image (an encoder: everything visible) */
static const int32_t KV_END_IMAGES[14] = {1, 4, 4, 4, 5, 7, 7, 7, 7, 7, 7, 7, 7, 7};

static void test_attention(int64_t W, float mag, const int32_t *kv_end) {
    att_case c = {2, 7, 4, 2, 8, W, 0.35f, NULL, NULL, NULL, NULL, kv_end};
    int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.KVH * c.D;
    float *q = rnd2(nq, mag, &c.q), *kk = rnd2(nk, mag, &c.k), *v = rnd2(nk, 1.0f, &c.v), *dout = rnd2(nq, 1.0f, &c.dout);
    float *out = gm_malloc((size_t)nq * 4), *lse = gm_malloc((size_t)(c.B * c.H * c.T) * 4);
    float *dq = gm_malloc((size_t)nq * 4), *dk = gm_malloc((size_t)nk * 4), *dv = gm_malloc((size_t)nk * 4);
    gm_kctx k = ctx_with(gm_k_attention_scratch_floats(c.B, c.T, c.H, c.D, 2));
    gm_k_attention_train_fwd_cpu(&k, out, lse, q, kk, v, kv_end, c.B, c.T, c.H, c.KVH, c.D, c.W, c.scale);
    /* the forward itself: L computed from `out` must equal the double forward */
    double Lk = 0;
    for (int64_t i = 0; i < nq; i++) Lk += (double)out[i] * c.dout[i];
    double Lr = att_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "attention_train_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_attention_bwd_cpu(&k, dq, dk, dv, dout, q, kk, v, out, lse, kv_end, c.B, c.T, c.H, c.KVH, c.D, c.W, c.scale);
    char what[80];
    const char *m = kv_end ? ", images" : "";
    snprintf(what, sizeof what, "attention dq (W=%lld, |qk| ~ %g%s)", (long long)W, (double)mag, m);
    fd_check(what, c.q, nq, dq, att_loss, &c);
    snprintf(what, sizeof what, "attention dk (W=%lld, GQA 4:2%s)", (long long)W, m);
    fd_check(what, c.k, nk, dk, att_loss, &c);
    snprintf(what, sizeof what, "attention dv (W=%lld%s)", (long long)W, m);
    fd_check(what, c.v, nk, dv, att_loss, &c);
    gm_free(c.q), gm_free(c.k), gm_free(c.v), gm_free(c.dout), gm_free(q), gm_free(kk), gm_free(v), gm_free(dout);
    gm_free(out), gm_free(lse);
    gm_free(dq), gm_free(dk), gm_free(dv), gm_free(k.scratch);
}

/* ---- LayerNorm (vision towers) ------------------------------------------------------------ */
typedef struct { int64_t N, C; double *x, *w, *b, *dy; } ln_case;

static double ln_loss(void *u) {
    ln_case *c = u;
    double L = 0;
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = c->x + n * c->C;
        double mu = 0, var = 0;
        for (int64_t k = 0; k < c->C; k++) mu += x[k];
        mu /= (double)c->C;
        for (int64_t k = 0; k < c->C; k++) var += (x[k] - mu) * (x[k] - mu);
        double r = 1.0 / sqrt(var / (double)c->C + 1e-6);
        for (int64_t k = 0; k < c->C; k++) L += c->dy[n * c->C + k] * ((x[k] - mu) * r * c->w[k] + c->b[k]);
    }
    return L;
}

static void test_layernorm(float mag) {
    ln_case c = {5, 24, NULL, NULL, NULL, NULL};
    float *x = rnd2(5 * 24, mag, &c.x), *w = rnd2(24, 2.0f, &c.w), *b = rnd2(24, 1.0f, &c.b), *dyf = rnd2(5 * 24, 1.0f, &c.dy);
    for (int i = 0; i < 5 * 24; i++) c.x[i] = x[i] += 0.5f * mag; /* a mean to remove */
    float *y = gm_malloc(5 * 24 * 4), *mean = gm_malloc(5 * 4), *rstd = gm_malloc(5 * 4), *dx = gm_malloc(5 * 24 * 4);
    float *dw = gm_calloc(24, 4), *db = gm_calloc(24, 4);
    gm_kctx k = ctx_with(0);
    gm_k_layernorm_fwd_cpu(&k, y, mean, rstd, x, w, b, c.N, c.C, 1e-6f);
    double Lk = 0;
    for (int i = 0; i < 5 * 24; i++) Lk += (double)y[i] * c.dy[i];
    double Lr = ln_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "layernorm_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_layernorm_bwd_cpu(&k, dx, dw, db, dyf, x, w, mean, rstd, c.N, c.C, 0.0f);
    char what[64];
    snprintf(what, sizeof what, "layernorm dx (|x| ~ %g)", (double)mag);
    fd_check(what, c.x, c.N * c.C, dx, ln_loss, &c);
    fd_check("layernorm dw", c.w, c.C, dw, ln_loss, &c);
    fd_check("layernorm db", c.b, c.C, db, ln_loss, &c);
    gm_free(c.x), gm_free(c.w), gm_free(c.b), gm_free(c.dy), gm_free(x), gm_free(w), gm_free(b), gm_free(dyf);
    gm_free(y), gm_free(mean), gm_free(rstd), gm_free(dx), gm_free(dw), gm_free(db);
}

/* ---- GELU and average pooling (vision towers) --------------------------------------------- */
typedef struct { int64_t n; double *x, *dy; } gelu_case;

static double gelu_loss(void *u) {
    gelu_case *c = u;
    double L = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double z = c->x[i];
        L += c->dy[i] * 0.5 * z * (1.0 + tanh(sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    }
    return L;
}

static void test_gelu(void) {
    gelu_case c = {64, NULL, NULL};
    float *x = rnd2(64, 3.0f, &c.x), *dy = rnd2(64, 1.0f, &c.dy), *y = gm_malloc(64 * 4), *dx = gm_malloc(64 * 4);
    gm_kctx k = ctx_with(0);
    gm_k_gelu_fwd_cpu(&k, y, x, c.n);
    double Lk = 0;
    for (int i = 0; i < 64; i++) Lk += (double)y[i] * c.dy[i];
    double Lr = gelu_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "gelu_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_gelu_bwd_cpu(&k, dx, dy, x, c.n);
    fd_check("gelu dx", c.x, 64, dx, gelu_loss, &c);
    gm_free(c.x), gm_free(c.dy), gm_free(x), gm_free(dy), gm_free(y), gm_free(dx);
}

typedef struct { int64_t B, P, K, C; double *x, *dy; } pool_case;

static double pool_loss(void *u) {
    pool_case *c = u;
    int64_t Q = c->P / c->K;
    double L = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t y = 0; y < c->P; y++)
            for (int64_t x = 0; x < c->P; x++)
                for (int64_t ch = 0; ch < c->C; ch++)
                    L += c->x[((b * c->P + y) * c->P + x) * c->C + ch] / (double)(c->K * c->K) *
                         c->dy[((b * Q + y / c->K) * Q + x / c->K) * c->C + ch];
    return L;
}

static void test_avgpool(void) {
    pool_case c = {2, 6, 3, 5, NULL, NULL}; /* 6 x 6 patches -> 2 x 2 tokens */
    int64_t nx = 2 * 36 * 5, ny = 2 * 4 * 5;
    float *x = rnd2(nx, 1.0f, &c.x), *dy = rnd2(ny, 1.0f, &c.dy), *y = gm_malloc((size_t)ny * 4), *dx = gm_malloc((size_t)nx * 4);
    gm_kctx k = ctx_with(0);
    gm_k_avgpool_fwd_cpu(&k, y, x, c.B, c.P, c.K, c.C);
    double Lk = 0;
    for (int64_t i = 0; i < ny; i++) Lk += (double)y[i] * c.dy[i];
    double Lr = pool_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "avgpool_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_avgpool_bwd_cpu(&k, dx, dy, c.B, c.P, c.K, c.C);
    fd_check("avgpool dx", c.x, nx, dx, pool_loss, &c);
    gm_free(c.x), gm_free(c.dy), gm_free(x), gm_free(dy), gm_free(y), gm_free(dx);
}

/* ---- matmul ------------------------------------------------------------------------------- */
typedef struct { int64_t M, N, K; double *x, *w, *dy; } mm_case;

static double mm_loss(void *u) {
    mm_case *c = u;
    double L = 0;
    for (int64_t m = 0; m < c->M; m++)
        for (int64_t n = 0; n < c->N; n++) {
            double s = 0;
            for (int64_t k = 0; k < c->K; k++) s += (double)c->x[m * c->K + k] * c->w[n * c->K + k];
            L += s * c->dy[m * c->N + n];
        }
    return L;
}

static void test_matmul(void) {
    mm_case c = {6, 10, 12, NULL, NULL, NULL};
    float *xf = rnd2(72, 1.0f, &c.x), *wf = rnd2(120, 1.0f, &c.w), *dyf = rnd2(60, 1.0f, &c.dy);
    float *dx = gm_malloc(72 * 4), *dw = gm_malloc(120 * 4);
    gm_kctx k = ctx_with(0);
    gm_wview wv = gm_wview_f32(wf, c.N, c.K);
    gm_k_matmul_bwd_input_cpu(&k, dx, dyf, &wv, c.M, 0.0f);
    gm_k_matmul_bwd_weight_cpu(&k, dw, dyf, xf, c.M, c.N, c.K, 0.0f);
    fd_check("matmul dx (f32 W)", c.x, 72, dx, mm_loss, &c);
    fd_check("matmul dW (LoRA weights)", c.w, 120, dw, mm_loss, &c);
    /* quantized W: the backward uses the dequantized values; compare with the f32 path on them */
    int64_t N = 600, K = 64, M = 7;
    size_t rb = gm_dtype_row_bytes(GM_Q8_0, K);
    uint8_t *q = gm_malloc((size_t)N * rb);
    for (size_t i = 0; i < (size_t)N * rb; i++) q[i] = (uint8_t)(gm_test_rand(&seed) * 127 + 128);
    for (int64_t b = 0; b < N * K / 32; b++) {
        uint16_t h = gm_f32_to_f16(0.01f);
        memcpy(q + b * 34, &h, 2);
    }
    float *wd = gm_malloc((size_t)(N * K) * 4), *dy = rnd(M * N, 1.0f), *r1 = gm_malloc((size_t)(M * K) * 4),
          *r2 = gm_malloc((size_t)(M * K) * 4);
    for (int64_t n = 0; n < N; n++) gm_dequant_row(GM_Q8_0, q + n * rb, wd + n * K, K);
    gm_wview qv = {GM_Q8_0, q, rb, N, K, 0, 0, 0.0f, 0}, fv = gm_wview_f32(wd, N, K);
    gm_kctx kq = ctx_with(gm_k_matmul_scratch_floats(GM_Q8_0, N, K, 2));
    gm_k_matmul_bwd_input_cpu(&kq, r1, dy, &qv, M, 0.0f);
    gm_k_matmul_bwd_input_cpu(&k, r2, dy, &fv, M, 0.0f);
    gm_check_close("matmul_bwd_input q8_0 (2 panels) vs f32", r1, r2, (size_t)(M * K), 1e-4, 1e-5);
    gm_free(c.x), gm_free(c.w), gm_free(c.dy), gm_free(xf), gm_free(wf), gm_free(dyf), gm_free(dx), gm_free(dw);
    gm_free(q), gm_free(wd), gm_free(dy), gm_free(r1), gm_free(r2), gm_free(kq.scratch);
}

/* ---- chunked cross-entropy through the LM head ------------------------------------------- */
/* loss(h) = scale * sum over rows with a target of lse(z) - z_t, z = softcap(h E^T), in double. */
typedef struct { int64_t R, V, C; double *h, *E; int32_t *t; float cap, scale; } xent_case;

static double xent_logit(const xent_case *c, int64_t r, int64_t j) {
    double l = 0;
    for (int64_t k = 0; k < c->C; k++) l += c->h[r * c->C + k] * c->E[j * c->C + k];
    return c->cap > 0 ? c->cap * tanh(l / c->cap) : l;
}

static double xent_loss(void *u) {
    xent_case *c = u;
    double L = 0;
    for (int64_t r = 0; r < c->R; r++) {
        if (c->t[r] < 0) continue;
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < c->V; j++) mx = fmax(mx, xent_logit(c, r, j));
        for (int64_t j = 0; j < c->V; j++) z += exp(xent_logit(c, r, j) - mx);
        L += c->scale * (mx + log(z) - xent_logit(c, r, c->t[r]));
    }
    return L;
}

/* The trainer's one pass (gm_train.c lm_loss): per chunk, logits = h E_chunk^T, xent_grad_update,
 * dh += weights E_chunk; then xent_grad_finish with the targets' rows. The loss from its running
 * statistics and from xent_lse_update's (the pass without a gradient) against double; dL/dh
 * against finite differences. */
static void test_xent(float cap) {
    int64_t R = 4, V = 50, Vc = 16, C = 8;
    int32_t t[4] = {3, -1, 49, 17};
    xent_case c = {R, V, C, NULL, NULL, t, cap, 1.0f / 3.0f};
    float *h = rnd2(R * C, 2.0f, &c.h), *E = rnd2(V * C, 1.0f, &c.E);
    /* row 2's target, the last entry, along its h: its logit (~2 |h|^2, ~20) is the row's max,
     * found in the last chunk (dh rescaled), and p_target ~ 1, where p - 1 loses digits if formed late */
    for (int64_t k = 0; k < C; k++) E[(V - 1) * C + k] = 2.0f * h[2 * C + k], c.E[(V - 1) * C + k] = E[(V - 1) * C + k];
    float mx[4], sm[4], tl[4] = {0}, mx2[4], sm2[4], tl2[4] = {0}, lse[4];
    for (int i = 0; i < 4; i++) mx[i] = mx2[i] = -INFINITY, sm[i] = sm2[i] = 0;
    gm_kctx k = ctx_with(0);
    float *chunk = gm_malloc((size_t)(R * Vc) * 4), *dh = gm_malloc((size_t)(R * C) * 4);
    float *et = gm_calloc((size_t)(R * C), 4);
    for (int64_t i = 0; i < R * C; i++) dh[i] = NAN; /* the first chunk must not read it */
    for (int64_t v0 = 0; v0 < V; v0 += Vc) { /* last chunk short */
        int64_t n = V - v0 < Vc ? V - v0 : Vc;
        gm_wview Ec = gm_wview_f32(E + v0 * C, n, C);
        gm_k_matmul_fwd_cpu(&k, chunk, h, &Ec, R, 0.0f);
        gm_k_xent_lse_update_cpu(&k, mx2, sm2, tl2, chunk, t, R, n, v0, cap);
        gm_k_xent_grad_update_cpu(&k, mx, sm, tl, chunk, dh, t, R, n, v0, C, cap);
        gm_k_matmul_bwd_input_cpu(&k, dh, chunk, &Ec, R, 1.0f);
    }
    gm_k_xent_lse_finish_cpu(&k, lse, mx, sm, R);
    double Lk = 0, Lk2 = 0;
    for (int r = 0; r < 4; r++)
        if (t[r] >= 0) {
            Lk += c.scale * (lse[r] - tl[r]);
            Lk2 += c.scale * (mx2[r] + log(sm2[r]) - tl2[r]);
            memcpy(et + r * C, E + t[r] * C, (size_t)C * 4);
        }
    double Lr = xent_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_XENT_LOSS_REL * fmax(1.0, fabs(Lr)), "xent loss %.9g vs %.9g (cap %g)", Lk, Lr, (double)cap);
    CHECK(fabs(Lk2 - Lr) < TOL_GRAD_XENT_LOSS_REL * fmax(1.0, fabs(Lr)), "xent loss without gradient %.9g vs %.9g (cap %g)",
          Lk2, Lr, (double)cap);
    gm_k_xent_grad_finish_cpu(&k, dh, et, sm, lse, tl, t, R, C, cap, c.scale);
    fd_check(cap > 0 ? "cross-entropy dL/dh (soft-cap 30)" : "cross-entropy dL/dh", c.h, R * C, dh, xent_loss, &c);
    gm_free(c.h), gm_free(c.E), gm_free(h), gm_free(E), gm_free(chunk), gm_free(dh), gm_free(et);
}

/* ---- AdamW vs torch.optim.AdamW (single tensor) transcribed in double ---------------------- */
static void test_adamw(void) {
    int64_t n = 1000;
    float *p = rnd(n, 1.0f), *m = gm_calloc((size_t)n, 4), *v = gm_calloc((size_t)n, 4);
    double *pd = malloc((size_t)n * 8), *md = calloc((size_t)n, 8), *vd = calloc((size_t)n, 8);
    for (int64_t i = 0; i < n; i++) pd[i] = p[i];
    gm_kctx k = ctx_with(0);
    double lr = 2e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
    for (int step = 1; step <= 10; step++) {
        float *g = rnd(n, step == 3 ? 1e-4f : 1.0f);
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        gm_k_adamw_cpu(&k, p, g, m, v, n, (float)b1, (float)b2, (float)eps, (float)(1 - lr * wd), (float)(lr / bc1),
                       (float)sqrt(bc2));
        for (int64_t i = 0; i < n; i++) {
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + eps);
        }
        gm_free(g);
    }
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(p[i] - pd[i]));
    CHECK(worst < TOL_ADAMW_ABS, "adamw: 10 steps differ from the double transcription by %g", worst);
    float *g = rnd(n, 1.0f);
    double ss = 0, ref = 0;
    gm_k_sumsq_cpu(&k, &ss, g, n);
    for (int64_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    CHECK(fabs(ss - ref) < TOL_SUMSQ_REL * ref, "sumsq %.12g vs %.12g", ss, ref);
    gm_free(g), gm_free(p), gm_free(m), gm_free(v), free(pd), free(md), free(vd);
}

/* ---- dropout ------------------------------------------------------------------------------ */
static void test_dropout(void) {
    int64_t n = 200000;
    float *x = rnd(n, 1.0f), *y = gm_malloc((size_t)n * 4), *y2 = gm_malloc((size_t)n * 4);
    gm_kctx k = ctx_with(0);
    gm_k_dropout_fwd_cpu(&k, y, x, n, 0.1f, 42);
    int64_t kept = 0;
    bool scaled = true;
    for (int64_t i = 0; i < n; i++)
        if (y[i] != 0.0f) kept++, scaled = scaled && fabsf(y[i] - x[i] / 0.9f) <= (float)TOL_DROPOUT_SCALE_REL * fabsf(x[i]);
    double rate = (double)kept / (double)n;
    /* binomial: sd of the keep rate = sqrt(0.9 * 0.1 / 200000) = 6.7e-4, so 0.005 is 7.5 sd */
    CHECK(fabs(rate - 0.9) < 0.005 && scaled, "dropout keep rate %.4f (want 0.9), kept values scaled by 1/0.9: %d", rate, scaled);
    gm_kctx k1 = {.n_threads = 1};
    gm_k_dropout_fwd_cpu(&k1, y2, x, n, 0.1f, 42);
    CHECK(memcmp(y, y2, (size_t)n * 4) == 0, "dropout mask depends on the thread count");
    gm_k_dropout_fwd_cpu(&k, y2, x, n, 0.1f, 43);
    CHECK(memcmp(y, y2, (size_t)n * 4) != 0, "different keys must give different masks");
    gm_free(x), gm_free(y), gm_free(y2);
}

/* ---- Gemma 3n: AltUp predict / correct, magnitude matching, gaussian top-k, tanh ------------ */
typedef struct { int64_t S, N, C; double *x, *cf, *act, *t, *dy; float z; int which; } g3n_case;

static double g3n_loss(void *u) {
    g3n_case *c = u;
    int64_t S = c->S, N = c->N, C = c->C;
    double L = 0;
    if (c->which == 0) { /* predict */
        for (int64_t j = 0; j < S; j++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < C; k++) {
                    double v = c->x[(j * N + n) * C + k];
                    for (int64_t i = 0; i < S; i++) v += c->cf[n * S * S + j * S + i] * c->x[(i * N + n) * C + k];
                    L += c->dy[(j * N + n) * C + k] * v;
                }
    } else if (c->which == 1) { /* correct: x holds pred */
        for (int64_t j = 0; j < S; j++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < C; k++) {
                    int64_t e = (j * N + n) * C + k;
                    L += c->dy[e] * (c->x[e] + (c->cf[n * S + j] + 1.0) * (c->act[n * C + k] - c->x[n * C + k]));
                }
    } else if (c->which == 2) { /* rms_match of x to t */
        for (int64_t n = 0; n < N; n++) {
            double sx = 0, st = 0;
            for (int64_t k = 0; k < C; k++) sx += c->x[n * C + k] * c->x[n * C + k], st += c->t[n * C + k] * c->t[n * C + k];
            double f = sqrt(st / (double)C) / sqrt(fmax(sx / (double)C, 1e-5));
            for (int64_t k = 0; k < C; k++) L += c->dy[n * C + k] * c->x[n * C + k] * f;
        }
    } else if (c->which == 3) { /* gaussian top-k, rows of C */
        for (int64_t n = 0; n < N; n++) {
            double m = 0, v = 0;
            for (int64_t k = 0; k < C; k++) m += c->x[n * C + k];
            m /= (double)C;
            for (int64_t k = 0; k < C; k++) v += (c->x[n * C + k] - m) * (c->x[n * C + k] - m);
            double cut = m + (double)c->z * sqrt(v / (double)C);
            for (int64_t k = 0; k < C; k++) L += c->dy[n * C + k] * fmax(c->x[n * C + k] - cut, 0.0);
        }
    } else { /* tanh */
        for (int64_t i = 0; i < N * C; i++) L += c->dy[i] * tanh(c->x[i]);
    }
    return L;
}

static void test_gemma3n_grads(void) {
    gm_kctx k = ctx_with(0);
    int64_t S = 4, N = 3, C = 24;
    g3n_case c = {S, N, C, NULL, NULL, NULL, NULL, NULL, 1.6448536f, 0};
    float *x = rnd2(S * N * C, 1.0f, &c.x), *cf = rnd2(N * S * S, 0.5f, &c.cf), *dy = rnd2(S * N * C, 1.0f, &c.dy);
    float *dx = gm_malloc((size_t)(S * N * C) * 4), *dcf = gm_malloc((size_t)(N * S * S) * 4);
    gm_k_altup_predict_bwd_cpu(&k, dx, dcf, dy, x, cf, S, N, C);
    fd_check("altup_predict dx", c.x, S * N * C, dx, g3n_loss, &c);
    fd_check("altup_predict dcoef", c.cf, N * S * S, dcf, g3n_loss, &c);
    c.which = 1;
    float *act = rnd2(N * C, 1.0f, &c.act), *cc = rnd(N * S, 0.5f), *da = gm_malloc((size_t)(N * C) * 4);
    for (int64_t i = 0; i < N * S; i++) c.cf[i] = cc[i];
    gm_k_altup_correct_bwd_cpu(&k, dx, da, dcf, dy, x, act, cc, S, N, C);
    fd_check("altup_correct dpred", c.x, S * N * C, dx, g3n_loss, &c);
    fd_check("altup_correct dact", c.act, N * C, da, g3n_loss, &c);
    fd_check("altup_correct dcoef", c.cf, N * S, dcf, g3n_loss, &c);
    /* magnitude matching: rows of x at ordinary size (the floor's branch has no x gradient term) */
    c.which = 2;
    float *t = rnd2(N * C, 2.0f, &c.t), *dt = gm_malloc((size_t)(N * C) * 4);
    memset(dt, 0, (size_t)(N * C) * 4);
    gm_k_rms_match_bwd_cpu(&k, dx, dt, dy, x, t, N, C, 1e-5f);
    fd_check("rms_match dx", c.x, N * C, dx, g3n_loss, &c);
    fd_check("rms_match dtarget", c.t, N * C, dt, g3n_loss, &c);
    /* gaussian top-k on rows of 24 at z = 1 (several values kept per row); a value within the
     * finite-difference step of the cut would show as a failure, not pass unseen */
    c.which = 3;
    gm_k_gaussian_topk_bwd_cpu(&k, dx, dy, x, N, C, 1.0f);
    c.z = 1.0f; /* a lower cut: several kept values per row of 24 */
    fd_check("gaussian_topk dx (z = 1)", c.x, N * C, dx, g3n_loss, &c);
    c.which = 4;
    float *y = gm_malloc((size_t)(N * C) * 4);
    for (int64_t i = 0; i < N * C; i++) y[i] = tanhf(x[i]);
    gm_k_tanh_bwd_cpu(&k, dx, dy, y, N * C);
    fd_check("tanh", c.x, N * C, dx, g3n_loss, &c);
    gm_free(x), gm_free(cf), gm_free(dy), gm_free(dx), gm_free(dcf), gm_free(act), gm_free(cc), gm_free(da);
    gm_free(t), gm_free(dt), gm_free(y);
    gm_free(c.x), gm_free(c.cf), gm_free(c.dy), gm_free(c.act), gm_free(c.t);
}

/* ---- Gemma 3n's audio encoder: the backward kernels LoRA on its conformer runs ------------ */

typedef struct {
    int which; /* 0 attention, 1 causal convolution, 2 GLU, 3 SiLU, 4 clamp */
    int64_t B, T, H, D, W, Lc, R, C, K, n;
    double cap, limit;
    double *q, *k, *v, *pos, *x, *w, *dy;
    const uint8_t *valid;
} audio_case;

static double audio_loss(void *u) {
    audio_case *c = u;
    double L = 0;
    if (c->which == 0) { /* kernels.h audio_attention_fwd, in double */
        int64_t B = c->B, T = c->T, H = c->H, D = c->D, Cx = c->W + c->Lc + c->R;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < H; h++) {
                    const double *qr = c->q + ((b * T + t) * H + h) * D, *dyr = c->dy + ((b * T + t) * H + h) * D;
                    double lg[64], m = -INFINITY, z = 0;
                    int64_t lo = t - c->Lc, hi = t + c->R, any = 0;
                    for (int64_t s = lo; s <= hi; s++) {
                        lg[s - lo] = -INFINITY;
                        if (s < 0 || s >= T || !c->valid[b * T + s]) continue;
                        double a = 0;
                        for (int64_t d = 0; d < D; d++)
                            a += qr[d] * (c->k[((b * T + s) * H + h) * D + d] + c->pos[((s - t + c->Lc) * H + h) * D + d]);
                        lg[s - lo] = c->cap * tanh(a / c->cap);
                        m = fmax(m, lg[s - lo]), any = 1;
                    }
                    if (!any) { /* the block context's plain average */
                        int64_t u0 = (t / c->W) * c->W - c->Lc;
                        for (int64_t s = u0 < 0 ? 0 : u0; s <= u0 + Cx - 1 && s < T; s++)
                            for (int64_t d = 0; d < D; d++) L += dyr[d] * c->v[((b * T + s) * H + h) * D + d] / (double)Cx;
                        continue;
                    }
                    for (int64_t s = lo; s <= hi; s++)
                        if (lg[s - lo] != -INFINITY) z += exp(lg[s - lo] - m);
                    for (int64_t s = lo; s <= hi; s++) {
                        if (lg[s - lo] == -INFINITY) continue;
                        double p = exp(lg[s - lo] - m) / z;
                        for (int64_t d = 0; d < D; d++) L += dyr[d] * p * c->v[((b * T + s) * H + h) * D + d];
                    }
                }
    } else if (c->which == 1) {
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t t = 0; t < c->T; t++)
                for (int64_t ch = 0; ch < c->C; ch++) {
                    double acc = 0;
                    for (int64_t j = 0; j < c->K; j++) {
                        int64_t ti = t - c->K + 1 + j;
                        if (ti >= 0) acc += c->w[ch * c->K + j] * c->x[(b * c->T + ti) * c->C + ch];
                    }
                    L += c->dy[(b * c->T + t) * c->C + ch] * acc;
                }
    } else if (c->which == 2) {
        for (int64_t n = 0; n < c->n; n++)
            for (int64_t ch = 0; ch < c->C; ch++)
                L += c->dy[n * c->C + ch] * c->x[n * 2 * c->C + ch] / (1.0 + exp(-c->x[n * 2 * c->C + c->C + ch]));
    } else if (c->which == 3) {
        for (int64_t i = 0; i < c->n; i++) L += c->dy[i] * c->x[i] / (1.0 + exp(-c->x[i]));
    } else {
        for (int64_t i = 0; i < c->n; i++) L += c->dy[i] * fmin(fmax(c->x[i], -c->limit), c->limit);
    }
    return L;
}

static void test_audio_grads(void) {
    gm_kctx k = ctx_with(0);
    /* the chunked attention: 2 clips of 20 frames, blocks of 4, 5 frames back, 1 ahead, a logit cap
     * of 2 (its tanh curved at these magnitudes); the second clip's frames 6.. are padding, so its
     * later queries see no key and average their block's context */
    int64_t B = 2, T = 20, H = 2, D = 4;
    uint8_t valid[40];
    for (int64_t t = 0; t < T; t++) valid[t] = t != 3, valid[T + t] = t < 6;
    audio_case c = {.which = 0, .B = B, .T = T, .H = H, .D = D, .W = 4, .Lc = 5, .R = 1, .cap = 2.0, .valid = valid};
    int64_t n = B * T * H * D, span = c.Lc + c.R + 1;
    float *q = rnd2(n, 1.0f, &c.q), *kk = rnd2(n, 1.0f, &c.k), *v = rnd2(n, 1.0f, &c.v), *pos = rnd2(span * H * D, 0.5f, &c.pos);
    float *dy = rnd2(n, 1.0f, &c.dy), *dq = gm_malloc((size_t)n * 4), *dk = gm_malloc((size_t)n * 4), *dv = gm_malloc((size_t)n * 4);
    float *work = gm_malloc((size_t)(B * T * H * 2) * 4), *out = gm_malloc((size_t)n * 4);
    gm_k_audio_attention_fwd_cpu(&k, out, q, kk, v, pos, valid, B, T, H, D, c.W, c.Lc, c.R, (float)c.cap);
    double Lk = 0, Lr = audio_loss(&c);
    for (int64_t i = 0; i < n; i++) Lk += (double)out[i] * c.dy[i];
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "audio_attention_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_audio_attention_bwd_cpu(&k, dq, dk, dv, dy, q, kk, v, pos, valid, work, B, T, H, D, c.W, c.Lc, c.R, (float)c.cap);
    fd_check("audio_attention dq", c.q, n, dq, audio_loss, &c);
    fd_check("audio_attention dk", c.k, n, dk, audio_loss, &c);
    fd_check("audio_attention dv (averaging queries too)", c.v, n, dv, audio_loss, &c);
    /* the causal depthwise convolution */
    audio_case cv = {.which = 1, .B = 2, .T = 9, .C = 6, .K = 5};
    int64_t nx = cv.B * cv.T * cv.C;
    float *x = rnd2(nx, 1.0f, &cv.x), *w = rnd2(cv.C * cv.K, 1.0f, &cv.w), *dyc = rnd2(nx, 1.0f, &cv.dy), *dx = gm_malloc((size_t)nx * 4);
    gm_k_conv1d_causal_bwd_cpu(&k, dx, dyc, w, cv.B, cv.T, cv.C, cv.K);
    fd_check("conv1d_causal dx", cv.x, nx, dx, audio_loss, &cv);
    /* GLU, SiLU, clamp (no value within the step of the clamp's bounds) */
    audio_case g = {.which = 2, .n = 5, .C = 8};
    float *gx = rnd2(5 * 16, 3.0f, &g.x), *gdy = rnd2(5 * 8, 1.0f, &g.dy), *gdx = gm_malloc(5 * 16 * 4);
    gm_k_glu_bwd_cpu(&k, gdx, gdy, gx, g.n, g.C);
    fd_check("glu dx", g.x, 5 * 16, gdx, audio_loss, &g);
    audio_case si = {.which = 3, .n = 64};
    float *sx = rnd2(64, 4.0f, &si.x), *sdy = rnd2(64, 1.0f, &si.dy), *sdx = gm_malloc(64 * 4);
    gm_k_silu_bwd_cpu(&k, sdx, sdy, sx, si.n);
    fd_check("silu dx", si.x, 64, sdx, audio_loss, &si);
    audio_case cl = {.which = 4, .n = 64, .limit = 0.5};
    float *cx = rnd2(64, 1.0f, &cl.x), *cdy = rnd2(64, 1.0f, &cl.dy), *cdx = gm_malloc(64 * 4);
    for (int i = 0; i < 64; i++)
        if (fabs(fabs(cx[i]) - 0.5) < 0.01) cx[i] *= 1.1f, cl.x[i] = cx[i];
    gm_k_clamp_bwd_cpu(&k, cdx, cdy, cx, cl.n, (float)cl.limit);
    fd_check("clamp dx", cl.x, 64, cdx, audio_loss, &cl);
    gm_free(q), gm_free(kk), gm_free(v), gm_free(pos), gm_free(dy), gm_free(dq), gm_free(dk), gm_free(dv), gm_free(work);
    gm_free(out), gm_free(c.q), gm_free(c.k), gm_free(c.v), gm_free(c.pos), gm_free(c.dy);
    gm_free(x), gm_free(w), gm_free(dyc), gm_free(dx), gm_free(cv.x), gm_free(cv.w), gm_free(cv.dy);
    gm_free(gx), gm_free(gdy), gm_free(gdx), gm_free(g.x), gm_free(g.dy);
    gm_free(sx), gm_free(sdy), gm_free(sdx), gm_free(si.x), gm_free(si.dy);
    gm_free(cx), gm_free(cdy), gm_free(cdx), gm_free(cl.x), gm_free(cl.dy);
}

/* ---- Gemma 4's vision tower (kernels.h clip_*, rope2d_*) ------------------------------------ */
/* which 0: L = sum dy clamp(x, lo, hi); which 1: L = sum dy rope2d(x), the angles in f32 as the
 * kernel computes them (a half-head: rope of width D/2 at pos_x, then at pos_y) */
typedef struct {
    int which;
    int64_t n, N, NH, D;
    double lo, hi, *x, *dy;
    const int32_t *px, *py;
    float theta;
} vis4_case;

static double vis4_loss(void *u) {
    vis4_case *c = u;
    double L = 0;
    if (c->which == 0) {
        for (int64_t i = 0; i < c->n; i++) L += c->dy[i] * fmin(fmax(c->x[i], c->lo), c->hi);
        return L;
    }
    int64_t half = c->D / 2, q = c->D / 4;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t h = 0; h < c->NH; h++)
            for (int64_t part = 0; part < 2; part++)
                for (int64_t i = 0; i < q; i++) {
                    float inv = 1.0f / powf(c->theta, (float)(2 * i) / (float)half);
                    double a = (double)((float)(part ? c->py[n] : c->px[n]) * inv);
                    const double *x = c->x + (n * c->NH + h) * c->D + part * half;
                    const double *g = c->dy + (n * c->NH + h) * c->D + part * half;
                    L += g[i] * (x[i] * cos(a) - x[i + q] * sin(a)) + g[i + q] * (x[i + q] * cos(a) + x[i] * sin(a));
                }
    return L;
}

static void test_vision4_grads(void) {
    gm_kctx k = ctx_with(0);
    /* the clamp between asymmetric bounds, no value within the differences' steps of a bound */
    vis4_case cl = {.which = 0, .n = 64, .lo = -0.7, .hi = 1.3};
    const float lo = -0.7f, hi = 1.3f;
    cl.lo = lo, cl.hi = hi; /* the f32 bounds the kernel compares with */
    float *x = rnd2(64, 2.0f, &cl.x), *dy = rnd2(64, 1.0f, &cl.dy), *dx = gm_malloc(64 * 4);
    int inside = 0;
    for (int i = 0; i < 64; i++) {
        if (fabs(x[i] - cl.lo) < 0.01 || fabs(x[i] - cl.hi) < 0.01) x[i] += 0.05f, cl.x[i] = x[i];
        inside += x[i] >= lo && x[i] <= hi;
    }
    CHECK(inside > 0 && inside < 64, "clip: values inside and outside the bounds (%d of 64 inside)", inside);
    gm_k_clip_bwd_cpu(&k, dx, dy, x, cl.n, &lo, &hi);
    fd_check("clip dx [-0.7, 1.3]", cl.x, 64, dx, vis4_loss, &cl);
    /* the 2-D RoPE: 5 tokens on a grid, 2 heads of 12 */
    const int32_t px[5] = {0, 1, 2, 0, 7}, py[5] = {0, 0, 3, 5, 2};
    vis4_case r = {.which = 1, .N = 5, .NH = 2, .D = 12, .px = px, .py = py, .theta = 100.0f};
    int64_t nr = r.N * r.NH * r.D;
    float *rx = rnd2(nr, 1.0f, &r.x), *rdy = rnd2(nr, 1.0f, &r.dy), *rdx = gm_malloc((size_t)nr * 4);
    gm_k_rope2d_bwd_cpu(&k, rdx, rdy, px, py, r.N, r.NH, r.D, r.theta);
    fd_check("rope2d dx", r.x, nr, rdx, vis4_loss, &r);
    gm_free(x), gm_free(dy), gm_free(dx), gm_free(cl.x), gm_free(cl.dy);
    gm_free(rx), gm_free(rdy), gm_free(rdx), gm_free(r.x), gm_free(r.dy);
}

/* ---- Gemma 4's vision pooler (kernels.h pool_gather_*) --------------------------------------- */
/* L = sum_r dout[r] . scale sum_j x[src[r K + j]]: a 6 x 9 grid pooled 3 x 3 (6 tokens of 9
 * patches), its rows scattered among 60 rows of x, 6 of them padding (their gradient 0) */
typedef struct { int64_t R, K, N, C; const int32_t *src; double scale, *x, *dout; } gather_case;

static double gather_loss(void *u) {
    gather_case *c = u;
    double L = 0;
    for (int64_t r = 0; r < c->R; r++)
        for (int64_t ch = 0; ch < c->C; ch++) {
            double acc = 0;
            for (int64_t j = 0; j < c->K; j++) acc += c->x[(int64_t)c->src[r * c->K + j] * c->C + ch];
            L += c->dout[r * c->C + ch] * c->scale * acc;
        }
    return L;
}

static void test_pool_gather_grads(void) {
    enum { GH = 6, GW = 9, PK = 3, CW = GW / PK, R = (GH / PK) * CW, K = PK * PK, N = 60, C = 4 };
    int32_t src[R * K];
    for (int y = 0; y < GH; y++)
        for (int x = 0; x < GW; x++) /* (y, x) -> row (y GW + x) 7 + 3 mod 60: distinct, 6 rows left over */
            src[((y / PK) * CW + x / PK) * K + (y % PK) * PK + x % PK] = (int32_t)(((y * GW + x) * 7 + 3) % N);
    const float scale = 1.0f / 9.0f;
    gather_case c = {R, K, N, C, src, scale, NULL, NULL};
    gm_kctx k = ctx_with(0);
    float *x = rnd2(N * C, 1.0f, &c.x), *dout = rnd2(R * C, 1.0f, &c.dout), *y = gm_malloc(R * C * 4);
    float *dx = rnd(N * C, 3.0f); /* garbage: the backward assigns */
    gm_k_pool_gather_fwd_cpu(&k, y, x, src, R, K, C, scale);
    double Lk = 0;
    for (int64_t i = 0; i < R * C; i++) Lk += (double)y[i] * c.dout[i];
    double Lr = gather_loss(&c);
    CHECK(fabs(Lk - Lr) < TOL_GRAD_ATTN_LOSS_REL * fmax(1.0, fabs(Lr)), "pool_gather_fwd: L %.9g vs reference %.9g", Lk, Lr);
    gm_k_pool_gather_bwd_cpu(&k, dx, dout, src, R, K, N, C, scale);
    fd_check("pool_gather dx (padding rows 0)", c.x, N * C, dx, gather_loss, &c);
    gm_free(x), gm_free(dout), gm_free(y), gm_free(dx), gm_free(c.x), gm_free(c.dout);
}

/* ---- mixture of experts (kernels.h moe_*) --------------------------------------------------- */
/* routing: L = sum dw[n, k] w[n, k](z), the choice held (logits spread 3: no choice flips within
 * the differences' steps); combination: L = sum dy[n] . sum_k w[n, k] ys[slot[n K + k]] */
enum { MG_N = 5, MG_E = 6, MG_K = 3, MG_C = 7 };
typedef struct { double *z, *dw, *pes; int32_t idx[MG_N * MG_K]; } route_case;

static double route_loss(void *u) {
    route_case *c = u;
    double L = 0;
    for (int64_t n = 0; n < MG_N; n++) {
        double mx = c->z[n * MG_E], sum = 0, s = 0;
        for (int64_t e = 1; e < MG_E; e++) mx = fmax(mx, c->z[n * MG_E + e]);
        for (int64_t e = 0; e < MG_E; e++) sum += exp(c->z[n * MG_E + e] - mx);
        for (int64_t k = 0; k < MG_K; k++) s += exp(c->z[n * MG_E + c->idx[n * MG_K + k]] - mx) / sum;
        for (int64_t k = 0; k < MG_K; k++) {
            int32_t e = c->idx[n * MG_K + k];
            L += c->dw[n * MG_K + k] * exp(c->z[n * MG_E + e] - mx) / sum / s * c->pes[e];
        }
    }
    return L;
}

typedef struct { double *ys, *w, *dy; int32_t slot[MG_N * MG_K]; } combine_case;

static double combine_loss(void *u) {
    combine_case *c = u;
    double L = 0;
    for (int64_t n = 0; n < MG_N; n++)
        for (int64_t k = 0; k < MG_K; k++)
            for (int64_t j = 0; j < MG_C; j++)
                L += c->dy[n * MG_C + j] * c->w[n * MG_K + k] * c->ys[(int64_t)c->slot[n * MG_K + k] * MG_C + j];
    return L;
}

static void test_moe(void) {
    gm_kctx k = ctx_with(0);
    route_case r;
    float *z = rnd2(MG_N * MG_E, 3.0f, &r.z), *dw = rnd2(MG_N * MG_K, 1.0f, &r.dw), *pes = rnd2(MG_E, 1.0f, &r.pes);
    float *probs = gm_malloc(MG_N * MG_E * 4), *w = gm_malloc(MG_N * MG_K * 4), *dz = gm_malloc(MG_N * MG_E * 4);
    memcpy(probs, z, MG_N * MG_E * 4);
    gm_k_moe_route_fwd_cpu(&k, r.idx, w, probs, pes, MG_N, MG_E, MG_K);
    gm_k_moe_route_bwd_cpu(&k, dz, dw, probs, r.idx, pes, MG_N, MG_E, MG_K);
    fd_check("moe_route (softmax, top-k renormalized, scaled)", r.z, MG_N * MG_E, dz, route_loss, &r);
    combine_case c;
    for (int64_t i = 0; i < MG_N * MG_K; i++) c.slot[i] = (int32_t)((i * 4 + 1) % (MG_N * MG_K)); /* 4 is prime to 15 */
    float *ys = rnd2(MG_N * MG_K * MG_C, 1.0f, &c.ys), *cw = rnd2(MG_N * MG_K, 1.0f, &c.w), *dy = rnd2(MG_N * MG_C, 1.0f, &c.dy);
    float *dys = gm_malloc(MG_N * MG_K * MG_C * 4), *dcw = gm_malloc(MG_N * MG_K * 4);
    gm_k_moe_combine_bwd_cpu(&k, dys, dcw, dy, ys, cw, c.slot, MG_N, MG_K, MG_C);
    fd_check("moe_combine: the slots' outputs", c.ys, MG_N * MG_K * MG_C, dys, combine_loss, &c);
    fd_check("moe_combine: the routing weights", c.w, MG_N * MG_K, dcw, combine_loss, &c);
    gm_free(z), gm_free(dw), gm_free(pes), gm_free(probs), gm_free(w), gm_free(dz), gm_free(ys), gm_free(cw), gm_free(dy),
        gm_free(dys), gm_free(dcw);
    gm_free(r.z), gm_free(r.dw), gm_free(r.pes), gm_free(c.ys), gm_free(c.w), gm_free(c.dy);
}

int main(void) {
    test_vision4_grads();
    test_pool_gather_grads();
    test_moe();
    test_audio_grads();
    test_gemma3n_grads();
    test_rmsnorm(1.0f);
    test_rmsnorm(100.0f);
    test_rope();
    test_geglu(1.0f);
    test_geglu(5.0f);
    test_attention(0, 1.0f, NULL);
    test_attention(3, 1.0f, NULL);
    test_attention(0, 3.0f, NULL);
    test_attention(0, 1.0f, KV_END_IMAGES);
    test_attention(2, 1.0f, KV_END_IMAGES);
    test_layernorm(1.0f);
    test_layernorm(30.0f);
    test_gelu();
    test_avgpool();
    test_matmul();
    test_xent(0.0f);
    test_xent(30.0f);
    test_adamw();
    test_dropout();
    return gm_test_finish();
}
