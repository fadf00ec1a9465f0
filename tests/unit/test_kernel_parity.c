/*
 * test_kernel_parity.c - every kernel of kernels/kernels.def, run by a backend on its own memory,
 * against the CPU reference (gm_kernels_cpu) on the same random inputs.
 *
 * The list of cases is generated from kernels.def: each kernel needs a function parity_<name>
 * here, so a kernel added without its parity case does not compile. Weight views run over every
 * stored type (f32, f16, bf16, the GGUF blocks, NF4 and int8), strided (rows further apart than
 * their bytes, as views of a wider matrix) and contiguous.
 *
 *   test_kernel_parity strict   the strict backend (core/backend/gm_backend.c): the CPU kernels on
 *                               memory the host cannot touch between calls. Results must be equal
 *                               bit for bit (it is the same code): a difference or a crash is a bug
 *                               of this harness - a buffer sized wrong, an input never uploaded, a
 *                               host read of device memory - found on every machine, before the
 *                               harness ever meets a GPU.
 *   test_kernel_parity cuda     the CUDA backend (kernels/cuda), TOL_CUDA_VS_CPU_* and
 *                               TOL_CUDA_VS_CPU_GEMM_ABS (tests/unit/test_util.h). Skips (77)
 *                               without a GPU or in a build without CUDA, unless GM_REQUIRE_GPU=1
 *                               (the GPU script, tests/device/run.sh): then it fails.
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_backend.h"
#include "gm_quant.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the backend under test -------------------------------------------------------------- */

typedef struct dev {
    gm_backend *be;
    gm_kctx ctx;  /* its context; scratch in its memory */
    bool exact;   /* strict: the CPU code itself, compared bit for bit */
} dev;

static gm_kctx hc; /* the CPU reference's context (host scratch) */
static const gm_kernel_table *cpu = &gm_kernels_cpu;
static uint64_t seed = 20261205;

#define SCRATCH_FLOATS ((size_t)4 << 20)

static float *host_rand(size_t n, float scale) {
    float *p = gm_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = gm_test_rand(&seed) * scale;
    return p;
}

static void *dalloc(dev *d, size_t bytes) {
    gm_error err = {0};
    void *p = d->be->iface.alloc(d->be, bytes ? bytes : 4, &err);
    CHECK(p != NULL, "%s: cannot allocate %zu bytes: %s", d->be->name, bytes, err.msg);
    return p;
}

static void *up(dev *d, const void *h, size_t bytes) {
    void *p = dalloc(d, bytes);
    if (p && bytes) gm_backend_upload(d->be, p, h, bytes);
    return p;
}

/* (a download waits for the kernels before it on the backend's stream) */
static void down(dev *d, void *h, const void *p, size_t bytes) { gm_backend_download(d->be, h, p, bytes); }

static void dfree(dev *d, void *p) {
    if (p) d->be->iface.free(d->be, p);
}

/* got (the backend's, device memory) against want (the CPU's, host), n floats */
static void cmp_tol(dev *d, const char *what, const float *got_dev, const float *want, size_t n, double abs_tol) {
    float *got = gm_malloc((n ? n : 1) * sizeof(float));
    down(d, got, got_dev, n * sizeof(float));
    char label[160];
    snprintf(label, sizeof label, "%s: %s", d->be->name, what);
    if (d->exact) {
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0) bad = i;
        CHECK(bad == n, "%s: element %zu is %.9g, the CPU's %.9g (want bit for bit)", label, bad, bad < n ? (double)got[bad] : 0.0,
              bad < n ? (double)want[bad] : 0.0);
    } else {
        gm_check_close(label, got, want, n, abs_tol, TOL_CUDA_VS_CPU_REL);
    }
    gm_free(got);
}

/* A bf16 GEMM's result (gm_kctx.bf16_gemm) against the CPU's f32 one: within
 * TOL_CUDA_BF16_GEMM_REL_MAX of the largest |want| (bit for bit on the strict backend, whose CPU
 * kernels compute in f32 whatever the flag says). */
static void cmp_bf16(dev *d, const char *what, const float *got_dev, const float *want, size_t n) {
    double amax = 0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(want[i]));
    if (d->exact) {
        cmp_tol(d, what, got_dev, want, n, 0.0);
        return;
    }
    float *got = gm_malloc((n ? n : 1) * sizeof(float));
    down(d, got, got_dev, n * sizeof(float));
    char label[200];
    snprintf(label, sizeof label, "%s: %s (bf16 GEMM)", d->be->name, what);
    gm_check_close(label, got, want, n, TOL_CUDA_BF16_GEMM_REL_MAX * amax, 0.0);
    gm_free(got);
}

static void cmp(dev *d, const char *what, const float *got_dev, const float *want, size_t n) {
    cmp_tol(d, what, got_dev, want, n, TOL_CUDA_VS_CPU_ABS);
}

/* ---- weight views of every stored type ----------------------------------------------------- */

static const gm_dtype WEIGHT_TYPES[] = {GM_F32,  GM_F16,  GM_BF16, GM_Q8_0, GM_Q4_0, GM_Q4_1, GM_Q5_0, GM_Q5_1,
                                        GM_Q2_K, GM_Q3_K, GM_Q4_K, GM_Q5_K, GM_Q6_K, GM_NF4,  GM_I8};
#define N_WEIGHT_TYPES (sizeof WEIGHT_TYPES / sizeof WEIGHT_TYPES[0])

/* A weight (N, K) of `type` in host memory and the same on the backend. Row-self-contained
 * formats get `pad` extra bytes between rows (a strided view); NF4 is one flattened tensor and
 * int8 has per-row scales, so they stay contiguous. Random bytes with sane f16 block scales are
 * valid encodings of the GGUF blocks; NF4 and int8 come from their quantizers. */
typedef struct weight {
    gm_wview host, dev;
    void *h_data, *h_code, *h_scale; /* host buffers (freed) */
    void *d_data, *d_code, *d_scale; /* backend buffers */
} weight;

static void weight_make(dev *d, weight *w, gm_dtype type, int64_t N, int64_t K, size_t pad) {
    memset(w, 0, sizeof *w);
    w->host = (gm_wview){type, NULL, 0, N, K, NULL, NULL, 0.0f, NULL};
    if (type == GM_NF4) {
        gm_nf4_sizes sz = gm_nf4_sizes_of(N * K);
        float *x = host_rand((size_t)(N * K), 0.05f), *scratch = gm_malloc((size_t)sz.n_blocks * sizeof(float));
        w->h_data = gm_malloc(sz.packed_bytes);
        w->h_code = gm_malloc((size_t)sz.n_blocks);
        w->h_scale = gm_malloc((size_t)sz.n_groups * sizeof(float));
        gm_nf4_quantize(x, N * K, w->h_data, w->h_code, w->h_scale, &w->host.absmax_offset, scratch, 1);
        w->host.data = w->h_data, w->host.absmax_code = w->h_code, w->host.absmax2 = w->h_scale;
        w->host.row_bytes = (size_t)K / 2;
        w->dev = w->host;
        w->d_data = up(d, w->h_data, sz.packed_bytes);
        w->d_code = up(d, w->h_code, (size_t)sz.n_blocks);
        w->d_scale = up(d, w->h_scale, (size_t)sz.n_groups * sizeof(float));
        w->dev.data = w->d_data, w->dev.absmax_code = w->d_code, w->dev.absmax2 = w->d_scale;
        gm_free(x), gm_free(scratch);
        return;
    }
    if (type == GM_I8) {
        float *x = host_rand((size_t)(N * K), 0.05f);
        w->h_data = gm_malloc((size_t)(N * K));
        w->h_scale = gm_malloc((size_t)N * sizeof(float));
        gm_int8_quantize(x, N, K, w->h_data, w->h_scale, 1);
        w->host.data = w->h_data, w->host.row_scale = w->h_scale, w->host.row_bytes = (size_t)K;
        w->dev = w->host;
        w->d_data = up(d, w->h_data, (size_t)(N * K));
        w->d_scale = up(d, w->h_scale, (size_t)N * sizeof(float));
        w->dev.data = w->d_data, w->dev.row_scale = w->d_scale;
        gm_free(x);
        return;
    }
    size_t packed = gm_dtype_row_bytes(type, K), rb = packed + pad;
    uint8_t *p = gm_malloc((size_t)N * rb);
    const gm_dtype_info *in = gm_dtype_get(type);
    for (size_t i = 0; i < (size_t)N * rb; i++) p[i] = (uint8_t)(gm_test_rand(&seed) * 127 + 128);
    for (int64_t n = 0; n < N; n++) {
        uint8_t *row = p + (size_t)n * rb;
        if (type == GM_F32 || type == GM_F16 || type == GM_BF16) {
            for (int64_t k = 0; k < K; k++) {
                float v = gm_test_rand(&seed);
                if (type == GM_F32) memcpy(row + 4 * k, &v, 4);
                else {
                    uint16_t h = type == GM_F16 ? gm_f32_to_f16(v) : gm_f32_to_bf16(v);
                    memcpy(row + 2 * k, &h, 2);
                }
            }
            continue;
        }
        /* the f16 scale(s) of each block (ggml's block layouts, formats.md §1) */
        int off[2] = {0, -1};
        if (type == GM_Q4_1 || type == GM_Q5_1 || type == GM_Q4_K || type == GM_Q5_K) off[1] = 2;
        if (type == GM_Q2_K) off[0] = 80, off[1] = 82;
        if (type == GM_Q3_K) off[0] = 108;
        if (type == GM_Q6_K) off[0] = 208;
        for (int64_t b = 0; b < K / in->block_size; b++)
            for (int j = 0; j < 2; j++)
                if (off[j] >= 0) {
                    uint16_t h = gm_f32_to_f16(0.001f + 0.002f * (gm_test_rand(&seed) + 1));
                    memcpy(row + (size_t)b * in->type_size + off[j], &h, 2);
                }
    }
    w->h_data = p;
    w->host.data = p, w->host.row_bytes = rb;
    w->dev = w->host;
    w->d_data = up(d, p, (size_t)N * rb);
    w->dev.data = w->d_data;
}

static void weight_free(dev *d, weight *w) {
    gm_free(w->h_data), gm_free(w->h_code), gm_free(w->h_scale);
    dfree(d, w->d_data), dfree(d, w->d_code), dfree(d, w->d_scale);
}

static const char *wname(const weight *w, size_t pad) {
    static char buf[64];
    snprintf(buf, sizeof buf, "%s%s", gm_dtype_name(w->host.type), pad ? " strided" : "");
    return buf;
}

/* ---- one case per kernel (the names of kernels.def) ----------------------------------------- */

#define GM_KERNEL(name, params, args) static void parity_##name(dev *d);
#include "kernels.def"
#undef GM_KERNEL

static void parity_dequant_rows(dev *d) {
    int64_t N = 40, K = 256, row0 = 3, rows = 20;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++)
        for (size_t pad = 0; pad <= 16; pad += 16) {
            if (pad && (WEIGHT_TYPES[t] == GM_NF4 || WEIGHT_TYPES[t] == GM_I8)) continue;
            weight w;
            weight_make(d, &w, WEIGHT_TYPES[t], N, K, pad);
            float *r = gm_malloc((size_t)(rows * K) * 4), *o = dalloc(d, (size_t)(rows * K) * 4);
            cpu->dequant_rows(&hc, r, &w.host, row0, rows);
            d->be->k->dequant_rows(&d->ctx, o, &w.dev, row0, rows);
            char what[80];
            snprintf(what, sizeof what, "dequant_rows %s", wname(&w, pad));
            cmp(d, what, o, r, (size_t)(rows * K));
            gm_free(r), dfree(d, o), weight_free(d, &w);
        }
}

/* q / k / v-like weights of three types sharing x, M = 1 (the CPU's one-region GEMV) and 9 (GEMMs):
 * each output as the CPU computes it, f32 GEMMs. */
static void parity_matmul_fwd_multi(dev *d) {
    int64_t K = 512, Ns[3] = {700, 256, 128}, Ms[2] = {1, 9};
    gm_dtype types[3] = {GM_Q5_0, GM_Q8_0, GM_Q4_K};
    weight w[3];
    const gm_wview *hw[3], *dw[3];
    for (int i = 0; i < 3; i++) {
        weight_make(d, &w[i], types[i], Ns[i], K, 0);
        hw[i] = &w[i].host, dw[i] = &w[i].dev;
    }
    for (int mi = 0; mi < 2; mi++) {
        int64_t M = Ms[mi];
        float *x = host_rand((size_t)(M * K), 1), *dx = up(d, x, (size_t)(M * K) * 4), *r[3], *o[3];
        for (int i = 0; i < 3; i++) r[i] = gm_malloc((size_t)(M * Ns[i]) * 4), o[i] = dalloc(d, (size_t)(M * Ns[i]) * 4);
        cpu->matmul_fwd_multi(&hc, r, x, hw, 3, M);
        d->be->k->matmul_fwd_multi(&d->ctx, o, dx, dw, 3, M);
        for (int i = 0; i < 3; i++) {
            char what[96];
            snprintf(what, sizeof what, "matmul_fwd_multi %s (%d of 3) M=%lld", gm_dtype_name(types[i]), i, (long long)M);
            cmp_tol(d, what, o[i], r[i], (size_t)(M * Ns[i]), TOL_CUDA_VS_CPU_GEMM_ABS);
            gm_free(r[i]), dfree(d, o[i]);
        }
        gm_free(x), dfree(d, dx);
    }
    for (int i = 0; i < 3; i++) weight_free(d, &w[i]);
}

/* M = 1 and 3 take the CPU's GEMV path (fused row dots for Q8_0 / Q5_0 / Q4_K / Q6_K at M = 1),
 * M = 9 its GEMM path; beta = 1 accumulates onto what out held. Each case twice: f32 GEMMs
 * (gm_kctx.bf16_gemm off: the CPU's numbers) and bf16 ones (on; TOL_CUDA_BF16_GEMM_REL_MAX). N =
 * 700 spans two of the bf16 path's weight panels (GM_MATMUL_PANEL_ROWS). */
static void parity_matmul_fwd(dev *d) {
    int64_t N = 700, K = 512, Ms[3] = {1, 3, 9};
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++)
        for (size_t pad = 0; pad <= 32; pad += 32) {
            if (pad && (WEIGHT_TYPES[t] == GM_NF4 || WEIGHT_TYPES[t] == GM_I8)) continue;
            weight w;
            weight_make(d, &w, WEIGHT_TYPES[t], N, K, pad);
            for (int mi = 0; mi < 3; mi++)
                for (int beta = 0; beta <= 1; beta++)
                    for (int bf = 0; bf <= 1; bf++) {
                        int64_t M = Ms[mi];
                        float *x = host_rand((size_t)(M * K), 1), *r = host_rand((size_t)(M * N), 1);
                        float *dx = up(d, x, (size_t)(M * K) * 4), *o = up(d, r, (size_t)(M * N) * 4);
                        cpu->matmul_fwd(&hc, r, x, &w.host, M, (float)beta);
                        d->ctx.bf16_gemm = bf;
                        d->be->k->matmul_fwd(&d->ctx, o, dx, &w.dev, M, (float)beta);
                        d->ctx.bf16_gemm = false;
                        char what[96];
                        snprintf(what, sizeof what, "matmul_fwd %s M=%lld beta=%d", wname(&w, pad), (long long)M, beta);
                        if (bf) cmp_bf16(d, what, o, r, (size_t)(M * N));
                        else cmp_tol(d, what, o, r, (size_t)(M * N), TOL_CUDA_VS_CPU_GEMM_ABS);
                        gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o);
                    }
            weight_free(d, &w);
        }
}

/* f32 and bf16 GEMMs as parity_matmul_fwd; N = 700: two panels, the second's dy columns strided. */
static void parity_matmul_bwd_input(dev *d) {
    int64_t N = 700, K = 256, M = 6;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        weight w;
        weight_make(d, &w, WEIGHT_TYPES[t], N, K, 0);
        for (int beta = 0; beta <= 1; beta++)
            for (int bf = 0; bf <= 1; bf++) {
                float *dy = host_rand((size_t)(M * N), 1), *r = host_rand((size_t)(M * K), 1);
                float *ddy = up(d, dy, (size_t)(M * N) * 4), *o = up(d, r, (size_t)(M * K) * 4);
                cpu->matmul_bwd_input(&hc, r, dy, &w.host, M, (float)beta);
                d->ctx.bf16_gemm = bf;
                d->be->k->matmul_bwd_input(&d->ctx, o, ddy, &w.dev, M, (float)beta);
                d->ctx.bf16_gemm = false;
                char what[96];
                snprintf(what, sizeof what, "matmul_bwd_input %s beta=%d", wname(&w, 0), beta);
                if (bf) cmp_bf16(d, what, o, r, (size_t)(M * K));
                else cmp_tol(d, what, o, r, (size_t)(M * K), TOL_CUDA_VS_CPU_GEMM_ABS);
                gm_free(dy), gm_free(r), dfree(d, ddy), dfree(d, o);
            }
        weight_free(d, &w);
    }
}

static void parity_matmul_bwd_weight(dev *d) {
    int64_t M = 37, N = 48, K = 80;
    for (int beta = 0; beta <= 1; beta++) {
        float *dy = host_rand((size_t)(M * N), 1), *x = host_rand((size_t)(M * K), 1), *r = host_rand((size_t)(N * K), 1);
        float *ddy = up(d, dy, (size_t)(M * N) * 4), *dx = up(d, x, (size_t)(M * K) * 4), *o = up(d, r, (size_t)(N * K) * 4);
        cpu->matmul_bwd_weight(&hc, r, dy, x, M, N, K, (float)beta);
        d->be->k->matmul_bwd_weight(&d->ctx, o, ddy, dx, M, N, K, (float)beta);
        cmp_tol(d, beta ? "matmul_bwd_weight beta=1" : "matmul_bwd_weight beta=0", o, r, (size_t)(N * K), TOL_CUDA_VS_CPU_GEMM_ABS);
        gm_free(dy), gm_free(x), gm_free(r), dfree(d, ddy), dfree(d, dx), dfree(d, o);
    }
}

static void parity_embed_fwd(dev *d) {
    int64_t V = 70, C = 256, N = 6;
    int32_t ids[6] = {0, 69, 3, 3, 41, 12};
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++)
        for (size_t pad = 0; pad <= 16; pad += 16) {
            if (pad && (WEIGHT_TYPES[t] == GM_NF4 || WEIGHT_TYPES[t] == GM_I8)) continue;
            weight w;
            weight_make(d, &w, WEIGHT_TYPES[t], V, C, pad);
            float *r = gm_malloc((size_t)(N * C) * 4), *o = dalloc(d, (size_t)(N * C) * 4);
            int32_t *dids = up(d, ids, sizeof ids);
            cpu->embed_fwd(&hc, r, ids, &w.host, N, 25.3f);
            d->be->k->embed_fwd(&d->ctx, o, dids, &w.dev, N, 25.3f);
            char what[80];
            snprintf(what, sizeof what, "embed_fwd %s", wname(&w, pad));
            cmp(d, what, o, r, (size_t)(N * C));
            gm_free(r), dfree(d, o), dfree(d, dids), weight_free(d, &w);
        }
}

static void parity_rmsnorm_fwd(dev *d) {
    int64_t N = 13, C = 640;
    float *x = host_rand((size_t)(N * C), 3), *w = host_rand((size_t)C, 1);
    float *r = gm_malloc((size_t)(N * C) * 4), *rs = gm_malloc((size_t)N * 4);
    float *dx = up(d, x, (size_t)(N * C) * 4), *dw = up(d, w, (size_t)C * 4);
    float *o = dalloc(d, (size_t)(N * C) * 4), *ors = dalloc(d, (size_t)N * 4);
    cpu->rmsnorm_fwd(&hc, r, rs, x, w, N, C, 1e-6f);
    d->be->k->rmsnorm_fwd(&d->ctx, o, ors, dx, dw, N, C, 1e-6f);
    cmp(d, "rmsnorm_fwd out", o, r, (size_t)(N * C));
    cmp(d, "rmsnorm_fwd rstd", ors, rs, (size_t)N);
    gm_free(x), gm_free(w), gm_free(r), gm_free(rs), dfree(d, dx), dfree(d, dw), dfree(d, o), dfree(d, ors);
}

static void parity_rmsnorm_bwd(dev *d) {
    int64_t N = 13, C = 640;
    float *x = host_rand((size_t)(N * C), 3), *w = host_rand((size_t)C, 1), *dy = host_rand((size_t)(N * C), 1);
    float *rs = gm_malloc((size_t)N * 4), *tmp = gm_malloc((size_t)(N * C) * 4);
    cpu->rmsnorm_fwd(&hc, tmp, rs, x, w, N, C, 1e-6f);
    for (int beta = 0; beta <= 1; beta++) {
        float *r = host_rand((size_t)(N * C), 1), *rw = host_rand((size_t)C, 1);
        float *o = up(d, r, (size_t)(N * C) * 4), *ow = up(d, rw, (size_t)C * 4);
        float *dx = up(d, x, (size_t)(N * C) * 4), *dw = up(d, w, (size_t)C * 4), *ddy = up(d, dy, (size_t)(N * C) * 4);
        float *drs = up(d, rs, (size_t)N * 4);
        cpu->rmsnorm_bwd(&hc, r, rw, dy, x, w, rs, N, C, (float)beta);
        d->be->k->rmsnorm_bwd(&d->ctx, o, ow, ddy, dx, dw, drs, N, C, (float)beta);
        cmp(d, beta ? "rmsnorm_bwd dx beta=1" : "rmsnorm_bwd dx beta=0", o, r, (size_t)(N * C));
        cmp_tol(d, "rmsnorm_bwd dw (+=)", ow, rw, (size_t)C, TOL_CUDA_VS_CPU_GEMM_ABS);
        gm_free(r), gm_free(rw), dfree(d, o), dfree(d, ow), dfree(d, dx), dfree(d, dw), dfree(d, ddy), dfree(d, drs);
    }
    gm_free(x), gm_free(w), gm_free(dy), gm_free(rs), gm_free(tmp);
}

static void rope_case(dev *d, bool bwd) {
    int64_t N = 9, NH = 4, D = 64;
    size_t n = (size_t)(N * NH * D);
    int32_t pos[9] = {0, 1, 2, 7, 100, 1000, 4095, 31999, 5};
    float *x = host_rand(n, 1), *r = gm_malloc(n * 4);
    float *dx = up(d, x, n * 4), *o = dalloc(d, n * 4);
    int32_t *dpos = up(d, pos, sizeof pos);
    /* local (10k), global (1M, linear scaling 1/8) and Gemma 4 proportional (1M, 8 of 32 pairs) */
    static const char *names[2][3] = {{"rope_fwd local", "rope_fwd global", "rope_fwd partial"},
                                      {"rope_bwd local", "rope_bwd global", "rope_bwd partial"}};
    for (int k = 0; k < 3; k++) {
        float theta = k ? 1e6f : 1e4f, ps = k == 1 ? 0.125f : 1.0f;
        int64_t n_rot = k == 2 ? 8 : D / 2;
        (bwd ? cpu->rope_bwd : cpu->rope_fwd)(&hc, r, x, pos, N, NH, D, n_rot, theta, ps);
        (bwd ? d->be->k->rope_bwd : d->be->k->rope_fwd)(&d->ctx, o, dx, dpos, N, NH, D, n_rot, theta, ps);
        cmp(d, names[bwd][k], o, r, n);
    }
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o), dfree(d, dpos);
}
static void parity_rope_fwd(dev *d) { rope_case(d, false); }
static void parity_rope_bwd(dev *d) { rope_case(d, true); }

/* the KV-cache attention of generation: a full layer and a sliding one over a ring buffer, and
 * an image block seen whole (kv_end) */
static void parity_attention_fwd(dev *d) {
    int64_t B = 2, T = 7, H = 4, KVH = 2, D = 64, pos0 = 9;
    size_t nq = (size_t)(B * T * H * D);
    float *q = host_rand(nq, 1), *r = gm_malloc(nq * 4);
    float *dq = up(d, q, nq * 4), *o = dalloc(d, nq * 4);
    int32_t kv_end[14];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) kv_end[b * T + t] = (int32_t)(t >= 2 && t < 5 ? pos0 + 5 : pos0 + t + 1);
    int32_t *dend = up(d, kv_end, sizeof kv_end);
    for (int pass = 0; pass < 3; pass++) {
        int64_t window = pass == 1 ? 5 : 0, S = pass == 1 ? 11 : pos0 + T;
        size_t nk = (size_t)(B * S * KVH * D);
        float *k = host_rand(nk, 1), *v = host_rand(nk, 1);
        float *dk = up(d, k, nk * 4), *dv = up(d, v, nk * 4);
        const int32_t *he = pass == 2 ? kv_end : NULL, *de = pass == 2 ? dend : NULL;
        cpu->attention_fwd(&hc, r, q, k, v, he, B, T, H, KVH, D, S, pos0, window, 0.125f);
        d->be->k->attention_fwd(&d->ctx, o, dq, dk, dv, de, B, T, H, KVH, D, S, pos0, window, 0.125f);
        cmp(d, pass == 0 ? "attention_fwd full" : pass == 1 ? "attention_fwd sliding ring" : "attention_fwd image block",
            o, r, nq);
        gm_free(k), gm_free(v), dfree(d, dk), dfree(d, dv);
    }
    gm_free(q), gm_free(r), dfree(d, dq), dfree(d, o), dfree(d, dend);
}

/* training attention: causal, sliding and with an image block, forward (out, lse) and backward */
typedef struct attn_case {
    int64_t B, T, H, KVH, D, window;
    bool image;
} attn_case;

static void attention_train(dev *d, bool bwd) {
    attn_case cs[3] = {{2, 19, 4, 2, 64, 0, false}, {2, 19, 4, 2, 64, 6, false}, {1, 24, 2, 1, 32, 0, true}};
    for (int c = 0; c < 3; c++) {
        int64_t B = cs[c].B, T = cs[c].T, H = cs[c].H, KVH = cs[c].KVH, D = cs[c].D, W = cs[c].window;
        size_t nq = (size_t)(B * T * H * D), nk = (size_t)(B * T * KVH * D), nl = (size_t)(B * H * T);
        float *q = host_rand(nq, 1), *k = host_rand(nk, 1), *v = host_rand(nk, 1), *dout = host_rand(nq, 1);
        float *out = gm_malloc(nq * 4), *lse = gm_malloc(nl * 4);
        int32_t *end = gm_malloc((size_t)(B * T) * 4);
        for (int64_t i = 0; i < B * T; i++) { int64_t t = i % T; end[i] = (int32_t)(t >= 4 && t < 12 ? 12 : t + 1); }
        const int32_t *he = cs[c].image ? end : NULL;
        float *dq_ = up(d, q, nq * 4), *dk_ = up(d, k, nk * 4), *dv_ = up(d, v, nk * 4);
        int32_t *dend = up(d, end, (size_t)(B * T) * 4);
        const int32_t *de = cs[c].image ? dend : NULL;
        float *o = dalloc(d, nq * 4), *ol = dalloc(d, nl * 4);
        cpu->attention_train_fwd(&hc, out, lse, q, k, v, he, B, T, H, KVH, D, W, 0.125f);
        d->be->k->attention_train_fwd(&d->ctx, o, ol, dq_, dk_, dv_, de, B, T, H, KVH, D, W, 0.125f);
        const char *name = c == 0 ? "causal" : c == 1 ? "sliding" : "image block";
        char what[80];
        if (!bwd) {
            snprintf(what, sizeof what, "attention_train_fwd %s out", name);
            cmp(d, what, o, out, nq);
            snprintf(what, sizeof what, "attention_train_fwd %s lse", name);
            cmp(d, what, ol, lse, nl);
        } else {
            /* the backward of both from the CPU's forward results, so only the backward differs */
            gm_backend_upload(d->be, o, out, nq * 4);
            gm_backend_upload(d->be, ol, lse, nl * 4);
            float *gq = gm_malloc(nq * 4), *gk = gm_malloc(nk * 4), *gv = gm_malloc(nk * 4);
            float *ddout = up(d, dout, nq * 4), *ogq = dalloc(d, nq * 4), *ogk = dalloc(d, nk * 4), *ogv = dalloc(d, nk * 4);
            cpu->attention_bwd(&hc, gq, gk, gv, dout, q, k, v, out, lse, he, B, T, H, KVH, D, W, 0.125f);
            d->be->k->attention_bwd(&d->ctx, ogq, ogk, ogv, ddout, dq_, dk_, dv_, o, ol, de, B, T, H, KVH, D, W, 0.125f);
            snprintf(what, sizeof what, "attention_bwd %s dq", name);
            cmp_tol(d, what, ogq, gq, nq, TOL_CUDA_VS_CPU_GEMM_ABS);
            snprintf(what, sizeof what, "attention_bwd %s dk", name);
            cmp_tol(d, what, ogk, gk, nk, TOL_CUDA_VS_CPU_GEMM_ABS);
            snprintf(what, sizeof what, "attention_bwd %s dv", name);
            cmp_tol(d, what, ogv, gv, nk, TOL_CUDA_VS_CPU_GEMM_ABS);
            gm_free(gq), gm_free(gk), gm_free(gv), dfree(d, ddout), dfree(d, ogq), dfree(d, ogk), dfree(d, ogv);
        }
        gm_free(q), gm_free(k), gm_free(v), gm_free(dout), gm_free(out), gm_free(lse), gm_free(end);
        dfree(d, dq_), dfree(d, dk_), dfree(d, dv_), dfree(d, dend), dfree(d, o), dfree(d, ol);
    }
}
static void parity_attention_train_fwd(dev *d) { attention_train(d, false); }
static void parity_attention_bwd(dev *d) { attention_train(d, true); }

/* ---- elementwise -------------------------------------------------------------------------- */

#define EW_N 10007

/* out = f(a, b) for the two-input kernels: geglu_fwd (gate, up), gelu_bwd (dy, x) */
static void binary_case(dev *d, const char *name) {
    bool geglu = strcmp(name, "geglu_fwd") == 0;
    float *a = host_rand(EW_N, geglu ? 4 : 1), *b = host_rand(EW_N, geglu ? 2 : 4), *r = gm_malloc(EW_N * 4);
    float *da = up(d, a, EW_N * 4), *db = up(d, b, EW_N * 4), *o = dalloc(d, EW_N * 4);
    if (geglu) {
        cpu->geglu_fwd(&hc, r, a, b, EW_N);
        d->be->k->geglu_fwd(&d->ctx, o, da, db, EW_N);
    } else {
        cpu->gelu_bwd(&hc, r, a, b, EW_N);
        d->be->k->gelu_bwd(&d->ctx, o, da, db, EW_N);
    }
    cmp(d, name, o, r, EW_N);
    gm_free(a), gm_free(b), gm_free(r), dfree(d, da), dfree(d, db), dfree(d, o);
}
static void parity_geglu_fwd(dev *d) { binary_case(d, "geglu_fwd"); }
static void parity_gelu_bwd(dev *d) { binary_case(d, "gelu_bwd"); }

static void parity_geglu_bwd(dev *d) {
    float *g = host_rand(EW_N, 4), *u = host_rand(EW_N, 2), *dh = host_rand(EW_N, 1);
    float *rg = gm_malloc(EW_N * 4), *ru = gm_malloc(EW_N * 4);
    float *dg = up(d, g, EW_N * 4), *du = up(d, u, EW_N * 4), *ddh = up(d, dh, EW_N * 4);
    float *og = dalloc(d, EW_N * 4), *ou = dalloc(d, EW_N * 4);
    cpu->geglu_bwd(&hc, rg, ru, dh, g, u, EW_N);
    d->be->k->geglu_bwd(&d->ctx, og, ou, ddh, dg, du, EW_N);
    cmp(d, "geglu_bwd dgate", og, rg, EW_N);
    cmp(d, "geglu_bwd dup", ou, ru, EW_N);
    gm_free(g), gm_free(u), gm_free(dh), gm_free(rg), gm_free(ru);
    dfree(d, dg), dfree(d, du), dfree(d, ddh), dfree(d, og), dfree(d, ou);
}

static void parity_add_fwd(dev *d) {
    float *y = host_rand(EW_N, 1), *x = host_rand(EW_N, 1);
    float *dy = up(d, y, EW_N * 4), *dx = up(d, x, EW_N * 4);
    cpu->add_fwd(&hc, y, x, EW_N);
    d->be->k->add_fwd(&d->ctx, dy, dx, EW_N);
    cmp(d, "add_fwd", dy, y, EW_N);
    gm_free(y), gm_free(x), dfree(d, dy), dfree(d, dx);
}

/* out = f(x) for the one-input kernels: soft-cap (cap 30, inputs up to 80), scale (0.37), tanh GELU */
static void unary_case(dev *d, const char *name) {
    bool softcap = strcmp(name, "softcap_fwd") == 0, scale = strcmp(name, "scale_fwd") == 0;
    float *x = host_rand(EW_N, softcap ? 80 : 4), *r = gm_malloc(EW_N * 4);
    float *dx = up(d, x, EW_N * 4), *o = dalloc(d, EW_N * 4);
    if (softcap) {
        cpu->softcap_fwd(&hc, r, x, EW_N, 30.0f);
        d->be->k->softcap_fwd(&d->ctx, o, dx, EW_N, 30.0f);
    } else if (scale) {
        cpu->scale_fwd(&hc, r, x, EW_N, 0.37f);
        d->be->k->scale_fwd(&d->ctx, o, dx, EW_N, 0.37f);
    } else {
        cpu->gelu_fwd(&hc, r, x, EW_N);
        d->be->k->gelu_fwd(&d->ctx, o, dx, EW_N);
    }
    cmp(d, name, o, r, EW_N);
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o);
}
static void parity_softcap_fwd(dev *d) { unary_case(d, "softcap_fwd"); }
static void parity_scale_fwd(dev *d) { unary_case(d, "scale_fwd"); }
static void parity_gelu_fwd(dev *d) { unary_case(d, "gelu_fwd"); }

/* the mask is Philox of (key, index): the same on every device, so compared exactly */
static void parity_dropout_fwd(dev *d) {
    float *x = host_rand(EW_N, 1), *r = gm_malloc(EW_N * 4), *got = gm_malloc(EW_N * 4);
    float *dx = up(d, x, EW_N * 4), *o = dalloc(d, EW_N * 4);
    cpu->dropout_fwd(&hc, r, x, EW_N, 0.1f, 0x5eedULL);
    d->be->k->dropout_fwd(&d->ctx, o, dx, EW_N, 0.1f, 0x5eedULL);
    down(d, got, o, EW_N * 4);
    size_t same_mask = 0, dropped = 0;
    for (int i = 0; i < EW_N; i++) same_mask += (got[i] == 0) == (r[i] == 0), dropped += r[i] == 0;
    CHECK(same_mask == EW_N && dropped > EW_N / 20 && dropped < EW_N / 5, "%s: dropout_fwd drops the same %zu of %d elements "
          "(%zu agree)", d->be->name, dropped, EW_N, same_mask);
    cmp(d, "dropout_fwd", o, r, EW_N);
    gm_free(x), gm_free(r), gm_free(got), dfree(d, dx), dfree(d, o);
}

/* ---- Gemma 3n: AltUp, magnitude matching, gaussian top-k, per-channel scale --------------- */

static void parity_altup_predict_fwd(dev *d) {
    int64_t S = 4, N = 13, C = 200;
    float *x = host_rand((size_t)(S * N * C), 2), *cf = host_rand((size_t)(N * S * S), 1), *r = gm_malloc((size_t)(S * N * C) * 4);
    float *dx = up(d, x, (size_t)(S * N * C) * 4), *dcf = up(d, cf, (size_t)(N * S * S) * 4), *o = dalloc(d, (size_t)(S * N * C) * 4);
    cpu->altup_predict_fwd(&hc, r, x, cf, S, N, C);
    d->be->k->altup_predict_fwd(&d->ctx, o, dx, dcf, S, N, C);
    cmp(d, "altup_predict_fwd", o, r, (size_t)(S * N * C));
    gm_free(x), gm_free(cf), gm_free(r), dfree(d, dx), dfree(d, dcf), dfree(d, o);
}

static void parity_altup_correct_fwd(dev *d) {
    int64_t S = 4, N = 13, C = 200;
    float *p = host_rand((size_t)(S * N * C), 2), *act = host_rand((size_t)(N * C), 2), *cf = host_rand((size_t)(N * S), 1);
    float *r = gm_malloc((size_t)(S * N * C) * 4);
    float *dp = up(d, p, (size_t)(S * N * C) * 4), *da = up(d, act, (size_t)(N * C) * 4), *dcf = up(d, cf, (size_t)(N * S) * 4);
    cpu->altup_correct_fwd(&hc, r, p, act, cf, S, N, C);
    d->be->k->altup_correct_fwd(&d->ctx, dp, dp, da, dcf, S, N, C); /* in place, as the layer runs it at inference */
    cmp(d, "altup_correct_fwd (in place)", dp, r, (size_t)(S * N * C));
    gm_free(p), gm_free(act), gm_free(cf), gm_free(r), dfree(d, dp), dfree(d, da), dfree(d, dcf);
}

static void parity_rms_match_fwd(dev *d) {
    int64_t N = 13, C = 640;
    float *x = host_rand((size_t)(N * C), 3), *t = host_rand((size_t)(N * C), 7), *r = gm_malloc((size_t)(N * C) * 4);
    for (int64_t c = 0; c < C; c++) x[c] *= 1e-4f; /* row 0 below the magnitude floor */
    float *dx = up(d, x, (size_t)(N * C) * 4), *dt = up(d, t, (size_t)(N * C) * 4);
    cpu->rms_match_fwd(&hc, r, x, t, N, C, 1e-5f);
    d->be->k->rms_match_fwd(&d->ctx, dx, dx, dt, N, C, 1e-5f);
    cmp(d, "rms_match_fwd (in place, one row at the floor)", dx, r, (size_t)(N * C));
    gm_free(x), gm_free(t), gm_free(r), dfree(d, dx), dfree(d, dt);
}

static void parity_gaussian_topk_fwd(dev *d) {
    int64_t N = 13, F = 2048;
    float *x = host_rand((size_t)(N * F), 2), *r = gm_malloc((size_t)(N * F) * 4);
    float *dx = up(d, x, (size_t)(N * F) * 4), *o = dalloc(d, (size_t)(N * F) * 4);
    cpu->gaussian_topk_fwd(&hc, r, x, N, F, 1.6448536f);
    d->be->k->gaussian_topk_fwd(&d->ctx, o, dx, N, F, 1.6448536f);
    cmp(d, "gaussian_topk_fwd", o, r, (size_t)(N * F));
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o);
}

static void parity_mul_cols_fwd(dev *d) {
    int64_t N = 13, C = 640;
    float *x = host_rand((size_t)(N * C), 3), *sc = host_rand((size_t)C, 2), *r = gm_malloc((size_t)(N * C) * 4);
    float *dx = up(d, x, (size_t)(N * C) * 4), *ds = up(d, sc, (size_t)C * 4);
    cpu->mul_cols_fwd(&hc, r, x, sc, N, C);
    d->be->k->mul_cols_fwd(&d->ctx, dx, dx, ds, N, C);
    cmp(d, "mul_cols_fwd (in place)", dx, r, (size_t)(N * C));
    /* the weightless RMSNorm (Gemma 3n's v_norm) rides here: rmsnorm_fwd with w NULL */
    float *r2 = gm_malloc((size_t)(N * C) * 4), *o2 = dalloc(d, (size_t)(N * C) * 4), *dx2 = up(d, x, (size_t)(N * C) * 4);
    cpu->rmsnorm_fwd(&hc, r2, NULL, x, NULL, N, C, 1e-6f);
    d->be->k->rmsnorm_fwd(&d->ctx, o2, NULL, dx2, NULL, N, C, 1e-6f);
    cmp(d, "rmsnorm_fwd without weight", o2, r2, (size_t)(N * C));
    gm_free(x), gm_free(sc), gm_free(r), gm_free(r2), dfree(d, dx), dfree(d, ds), dfree(d, o2), dfree(d, dx2);
}

static void parity_altup_predict_bwd(dev *d) {
    int64_t S = 4, N = 13, C = 200;
    size_t nx = (size_t)(S * N * C), nc = (size_t)(N * S * S);
    float *x = host_rand(nx, 2), *dp = host_rand(nx, 1), *cf = host_rand(nc, 1);
    float *rx = gm_malloc(nx * 4), *rc = gm_malloc(nc * 4);
    float *dx = up(d, x, nx * 4), *ddp = up(d, dp, nx * 4), *dcf = up(d, cf, nc * 4), *ox = dalloc(d, nx * 4), *oc = dalloc(d, nc * 4);
    cpu->altup_predict_bwd(&hc, rx, rc, dp, x, cf, S, N, C);
    d->be->k->altup_predict_bwd(&d->ctx, ox, oc, ddp, dx, dcf, S, N, C);
    cmp(d, "altup_predict_bwd dx", ox, rx, nx);
    cmp_tol(d, "altup_predict_bwd dcoef", oc, rc, nc, TOL_CUDA_VS_CPU_GEMM_ABS);
    gm_free(x), gm_free(dp), gm_free(cf), gm_free(rx), gm_free(rc);
    dfree(d, dx), dfree(d, ddp), dfree(d, dcf), dfree(d, ox), dfree(d, oc);
}

static void parity_altup_correct_bwd(dev *d) {
    int64_t S = 4, N = 13, C = 200;
    size_t nx = (size_t)(S * N * C), nc = (size_t)(N * C), ns = (size_t)(N * S);
    float *p = host_rand(nx, 2), *dy = host_rand(nx, 1), *act = host_rand(nc, 2), *cf = host_rand(ns, 1);
    float *rp = gm_malloc(nx * 4), *ra = gm_malloc(nc * 4), *rc = gm_malloc(ns * 4);
    float *dp = up(d, p, nx * 4), *ddy = up(d, dy, nx * 4), *da = up(d, act, nc * 4), *dcf = up(d, cf, ns * 4);
    float *op = dalloc(d, nx * 4), *oa = dalloc(d, nc * 4), *oc = dalloc(d, ns * 4);
    cpu->altup_correct_bwd(&hc, rp, ra, rc, dy, p, act, cf, S, N, C);
    d->be->k->altup_correct_bwd(&d->ctx, op, oa, oc, ddy, dp, da, dcf, S, N, C);
    cmp(d, "altup_correct_bwd dpred", op, rp, nx);
    cmp(d, "altup_correct_bwd dact", oa, ra, nc);
    cmp_tol(d, "altup_correct_bwd dcoef", oc, rc, ns, TOL_CUDA_VS_CPU_GEMM_ABS);
    gm_free(p), gm_free(dy), gm_free(act), gm_free(cf), gm_free(rp), gm_free(ra), gm_free(rc);
    dfree(d, dp), dfree(d, ddy), dfree(d, da), dfree(d, dcf), dfree(d, op), dfree(d, oa), dfree(d, oc);
}

static void parity_rms_match_bwd(dev *d) {
    int64_t N = 13, C = 640;
    size_t n = (size_t)(N * C);
    float *x = host_rand(n, 3), *t = host_rand(n, 7), *dy = host_rand(n, 1), *dt0 = host_rand(n, 1);
    for (int64_t c = 0; c < C; c++) x[c] *= 1e-4f; /* row 0 at the floor */
    float *rx = gm_malloc(n * 4), *rt = gm_malloc(n * 4);
    memcpy(rt, dt0, n * 4);
    float *dx = up(d, x, n * 4), *dt = up(d, t, n * 4), *ddy = up(d, dy, n * 4), *ot = up(d, dt0, n * 4), *ox = dalloc(d, n * 4);
    cpu->rms_match_bwd(&hc, rx, rt, dy, x, t, N, C, 1e-5f);
    d->be->k->rms_match_bwd(&d->ctx, ox, ot, ddy, dx, dt, N, C, 1e-5f);
    cmp(d, "rms_match_bwd dx", ox, rx, n);
    cmp(d, "rms_match_bwd dtarget (+=)", ot, rt, n);
    gm_free(x), gm_free(t), gm_free(dy), gm_free(dt0), gm_free(rx), gm_free(rt);
    dfree(d, dx), dfree(d, dt), dfree(d, ddy), dfree(d, ot), dfree(d, ox);
}

static void parity_gaussian_topk_bwd(dev *d) {
    int64_t N = 13, F = 2048;
    size_t n = (size_t)(N * F);
    float *x = host_rand(n, 2), *dy = host_rand(n, 1), *r = gm_malloc(n * 4);
    float *dx = up(d, x, n * 4), *ddy = up(d, dy, n * 4), *o = dalloc(d, n * 4);
    cpu->gaussian_topk_bwd(&hc, r, dy, x, N, F, 1.6448536f);
    d->be->k->gaussian_topk_bwd(&d->ctx, o, ddy, dx, N, F, 1.6448536f);
    cmp(d, "gaussian_topk_bwd", o, r, n);
    gm_free(x), gm_free(dy), gm_free(r), dfree(d, dx), dfree(d, ddy), dfree(d, o);
}

static void parity_tanh_bwd(dev *d) {
    float *y = host_rand(EW_N, 1), *dy = host_rand(EW_N, 1), *r = gm_malloc(EW_N * 4);
    float *dyy = up(d, y, EW_N * 4), *ddy = up(d, dy, EW_N * 4);
    cpu->tanh_bwd(&hc, r, dy, y, EW_N);
    d->be->k->tanh_bwd(&d->ctx, ddy, ddy, dyy, EW_N); /* in place */
    cmp(d, "tanh_bwd (in place)", ddy, r, EW_N);
    gm_free(y), gm_free(dy), gm_free(r), dfree(d, dyy), dfree(d, ddy);
}

/* ---- Gemma 3n's audio encoder (forward) ----------------------------------------------------- */

static void parity_conv2d_fwd(dev *d) {
    int64_t B = 2, T = 37, F = 128, Ci = 3, Co = 8, KT = 3, KF = 3, ST = 2, SF = 2, PF = 1;
    int64_t To = (T - 1) / ST + 1, Fo = (F + 2 * PF - KF) / SF + 1;
    size_t nx = (size_t)(B * T * F * Ci), nw = (size_t)(Co * Ci * KT * KF), no = (size_t)(B * To * Fo * Co);
    float *x = host_rand(nx, 2), *w = host_rand(nw, 1), *r = gm_malloc(no * 4);
    float *dx = up(d, x, nx * 4), *dw = up(d, w, nw * 4), *o = dalloc(d, no * 4);
    for (int64_t PT = 0; PT < 2; PT++) { /* Gemma 3n's padding after the frames; Gemma 4's on both sides */
        cpu->conv2d_fwd(&hc, r, x, w, B, T, F, Ci, Co, KT, KF, ST, SF, PT, PF);
        d->be->k->conv2d_fwd(&d->ctx, o, dx, dw, B, T, F, Ci, Co, KT, KF, ST, SF, PT, PF);
        cmp(d, PT ? "conv2d_fwd (time padded on both sides)" : "conv2d_fwd", o, r, no);
    }
    gm_free(x), gm_free(w), gm_free(r), dfree(d, dx), dfree(d, dw), dfree(d, o);
}

static void parity_cumulative_group_norm_fwd(dev *d) {
    int64_t B = 3, T = 41, C = 8, G = 64 * C;
    size_t n = (size_t)(B * T * G);
    float *x = host_rand(n, 3), *w = host_rand((size_t)C, 1), *r = gm_malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] += 2.0f; /* a mean the statistics must carry */
    float *dx = up(d, x, n * 4), *dw = up(d, w, (size_t)C * 4);
    cpu->cumulative_group_norm_fwd(&hc, r, x, w, B, T, G, C, 1e-3f, 1);
    d->be->k->cumulative_group_norm_fwd(&d->ctx, dx, dx, dw, B, T, G, C, 1e-3f, 1);
    cmp(d, "cumulative_group_norm_fwd (relu, in place)", dx, r, n);
    gm_free(x), gm_free(w), gm_free(r), dfree(d, dx), dfree(d, dw);
}

static void parity_audio_attention_fwd(dev *d) {
    int64_t B = 2, T = 50, H = 8, D = 16, W = 12, L = 12, R = 2;
    size_t n = (size_t)(B * T * H * D), np = (size_t)((L + R + 1) * H * D);
    float *q = host_rand(n, 1), *k = host_rand(n, 1), *v = host_rand(n, 1), *pos = host_rand(np, 1);
    float *r = gm_malloc(n * 4);
    uint8_t valid[2 * 50];
    for (int64_t t = 0; t < T; t++) valid[t] = 1, valid[T + t] = t < 29; /* the second clip ends at 29 */
    valid[7] = 0; /* a masked frame inside a clip */
    float *dq = up(d, q, n * 4), *dk = up(d, k, n * 4), *dv = up(d, v, n * 4), *dp = up(d, pos, np * 4), *o = dalloc(d, n * 4);
    uint8_t *dval = up(d, valid, sizeof valid);
    cpu->audio_attention_fwd(&hc, r, q, k, v, pos, valid, B, T, H, D, W, L, R, 50.0f);
    d->be->k->audio_attention_fwd(&d->ctx, o, dq, dk, dv, dp, dval, B, T, H, D, W, L, R, 50.0f);
    cmp(d, "audio_attention_fwd", o, r, n);
    gm_free(q), gm_free(k), gm_free(v), gm_free(pos), gm_free(r);
    dfree(d, dq), dfree(d, dk), dfree(d, dv), dfree(d, dp), dfree(d, o), dfree(d, dval);
}

static void parity_conv1d_causal_fwd(dev *d) {
    int64_t B = 2, T = 33, C = 96, K = 5;
    size_t n = (size_t)(B * T * C);
    float *x = host_rand(n, 2), *w = host_rand((size_t)(C * K), 1), *r = gm_malloc(n * 4);
    float *dx = up(d, x, n * 4), *dw = up(d, w, (size_t)(C * K) * 4), *o = dalloc(d, n * 4);
    cpu->conv1d_causal_fwd(&hc, r, x, w, B, T, C, K);
    d->be->k->conv1d_causal_fwd(&d->ctx, o, dx, dw, B, T, C, K);
    cmp(d, "conv1d_causal_fwd", o, r, n);
    gm_free(x), gm_free(w), gm_free(r), dfree(d, dx), dfree(d, dw), dfree(d, o);
}

static void parity_glu_fwd(dev *d) {
    int64_t N = 13, C = 320;
    float *x = host_rand((size_t)(N * 2 * C), 4), *r = gm_malloc((size_t)(N * C) * 4);
    float *dx = up(d, x, (size_t)(N * 2 * C) * 4), *o = dalloc(d, (size_t)(N * C) * 4);
    cpu->glu_fwd(&hc, r, x, N, C);
    d->be->k->glu_fwd(&d->ctx, o, dx, N, C);
    cmp(d, "glu_fwd", o, r, (size_t)(N * C));
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o);
}

static void parity_silu_fwd(dev *d) {
    float *x = host_rand(EW_N, 6), *r = gm_malloc(EW_N * 4), *dx = up(d, x, EW_N * 4);
    cpu->silu_fwd(&hc, r, x, EW_N);
    d->be->k->silu_fwd(&d->ctx, dx, dx, EW_N);
    cmp(d, "silu_fwd (in place)", dx, r, EW_N);
    gm_free(x), gm_free(r), dfree(d, dx);
}

static void parity_clamp_fwd(dev *d) {
    float *x = host_rand(EW_N, 6), *r = gm_malloc(EW_N * 4), *dx = up(d, x, EW_N * 4);
    cpu->clamp_fwd(&hc, r, x, EW_N, 2.5f);
    d->be->k->clamp_fwd(&d->ctx, dx, dx, EW_N, 2.5f);
    cmp(d, "clamp_fwd (in place)", dx, r, EW_N);
    gm_free(x), gm_free(r), dfree(d, dx);
}

static void parity_mask_rows_fwd(dev *d) {
    int64_t N = 9, C = 70;
    float *x = host_rand((size_t)(N * C), 1), *fill = host_rand((size_t)C, 1);
    uint8_t keep[9] = {1, 0, 1, 1, 0, 0, 1, 0, 1};
    float *dx = up(d, x, (size_t)(N * C) * 4), *dx2 = up(d, x, (size_t)(N * C) * 4), *df = up(d, fill, (size_t)C * 4);
    uint8_t *dk = up(d, keep, sizeof keep);
    float *r2 = gm_malloc((size_t)(N * C) * 4);
    for (int64_t i = 0; i < N * C; i++) r2[i] = x[i];
    cpu->mask_rows_fwd(&hc, x, keep, fill, N, C);
    cpu->mask_rows_fwd(&hc, r2, keep, NULL, N, C);
    d->be->k->mask_rows_fwd(&d->ctx, dx, dk, df, N, C);
    d->be->k->mask_rows_fwd(&d->ctx, dx2, dk, NULL, N, C);
    cmp(d, "mask_rows_fwd (fill)", dx, x, (size_t)(N * C));
    cmp(d, "mask_rows_fwd (zero)", dx2, r2, (size_t)(N * C));
    gm_free(x), gm_free(fill), gm_free(r2), dfree(d, dx), dfree(d, dx2), dfree(d, df), dfree(d, dk);
}

/* ---- Gemma 3n's audio encoder (backward) ------------------------------------------------- */

static void parity_audio_attention_bwd(dev *d) {
    int64_t B = 2, T = 50, H = 4, D = 16, W = 12, L = 12, R = 2;
    size_t n = (size_t)(B * T * H * D), np = (size_t)((L + R + 1) * H * D), nw = (size_t)(B * T * H * 2);
    float *q = host_rand(n, 1), *k = host_rand(n, 1), *v = host_rand(n, 1), *pos = host_rand(np, 1), *dout = host_rand(n, 1);
    float *rq = gm_malloc(n * 4), *rk = gm_malloc(n * 4), *rv = gm_malloc(n * 4), *rw = gm_malloc(nw * 4);
    uint8_t valid[2 * 50];
    for (int64_t t = 0; t < T; t++) valid[t] = 1, valid[T + t] = t < 29;
    valid[7] = 0;
    for (int64_t t = 13; t < 26; t++) valid[T + t] = 0; /* a whole block of the second clip sees nothing */
    float *dq_ = up(d, q, n * 4), *dk_ = up(d, k, n * 4), *dv_ = up(d, v, n * 4), *dp = up(d, pos, np * 4), *ddo = up(d, dout, n * 4);
    float *oq = dalloc(d, n * 4), *ok = dalloc(d, n * 4), *ov = dalloc(d, n * 4), *ow = dalloc(d, nw * 4);
    uint8_t *dval = up(d, valid, sizeof valid);
    cpu->audio_attention_bwd(&hc, rq, rk, rv, dout, q, k, v, pos, valid, rw, B, T, H, D, W, L, R, 50.0f);
    d->be->k->audio_attention_bwd(&d->ctx, oq, ok, ov, ddo, dq_, dk_, dv_, dp, dval, ow, B, T, H, D, W, L, R, 50.0f);
    cmp(d, "audio_attention_bwd dq", oq, rq, n);
    cmp(d, "audio_attention_bwd dk", ok, rk, n);
    cmp(d, "audio_attention_bwd dv", ov, rv, n);
    gm_free(q), gm_free(k), gm_free(v), gm_free(pos), gm_free(dout), gm_free(rq), gm_free(rk), gm_free(rv), gm_free(rw);
    dfree(d, dq_), dfree(d, dk_), dfree(d, dv_), dfree(d, dp), dfree(d, ddo), dfree(d, oq), dfree(d, ok), dfree(d, ov);
    dfree(d, ow), dfree(d, dval);
}

static void parity_conv1d_causal_bwd(dev *d) {
    int64_t B = 2, T = 33, C = 96, K = 5;
    size_t n = (size_t)(B * T * C);
    float *dy = host_rand(n, 2), *w = host_rand((size_t)(C * K), 1), *r = gm_malloc(n * 4);
    float *ddy = up(d, dy, n * 4), *dw = up(d, w, (size_t)(C * K) * 4), *o = dalloc(d, n * 4);
    cpu->conv1d_causal_bwd(&hc, r, dy, w, B, T, C, K);
    d->be->k->conv1d_causal_bwd(&d->ctx, o, ddy, dw, B, T, C, K);
    cmp(d, "conv1d_causal_bwd", o, r, n);
    gm_free(dy), gm_free(w), gm_free(r), dfree(d, ddy), dfree(d, dw), dfree(d, o);
}

static void parity_glu_bwd(dev *d) {
    int64_t N = 13, C = 320;
    float *x = host_rand((size_t)(N * 2 * C), 4), *dy = host_rand((size_t)(N * C), 1), *r = gm_malloc((size_t)(N * 2 * C) * 4);
    float *dx = up(d, x, (size_t)(N * 2 * C) * 4), *ddy = up(d, dy, (size_t)(N * C) * 4), *o = dalloc(d, (size_t)(N * 2 * C) * 4);
    cpu->glu_bwd(&hc, r, dy, x, N, C);
    d->be->k->glu_bwd(&d->ctx, o, ddy, dx, N, C);
    cmp(d, "glu_bwd", o, r, (size_t)(N * 2 * C));
    gm_free(x), gm_free(dy), gm_free(r), dfree(d, dx), dfree(d, ddy), dfree(d, o);
}

static void parity_silu_bwd(dev *d) {
    float *x = host_rand(EW_N, 6), *dy = host_rand(EW_N, 1), *r = gm_malloc(EW_N * 4);
    float *dx = up(d, x, EW_N * 4), *ddy = up(d, dy, EW_N * 4);
    cpu->silu_bwd(&hc, r, dy, x, EW_N);
    d->be->k->silu_bwd(&d->ctx, ddy, ddy, dx, EW_N);
    cmp(d, "silu_bwd (in place)", ddy, r, EW_N);
    gm_free(x), gm_free(dy), gm_free(r), dfree(d, dx), dfree(d, ddy);
}

static void parity_clamp_bwd(dev *d) {
    float *x = host_rand(EW_N, 6), *dy = host_rand(EW_N, 1), *r = gm_malloc(EW_N * 4);
    x[0] = 2.5f, x[1] = -2.5f; /* the bounds pass the gradient, as torch.clamp's does */
    float *dx = up(d, x, EW_N * 4), *ddy = up(d, dy, EW_N * 4);
    cpu->clamp_bwd(&hc, r, dy, x, EW_N, 2.5f);
    d->be->k->clamp_bwd(&d->ctx, ddy, ddy, dx, EW_N, 2.5f);
    cmp(d, "clamp_bwd (in place)", ddy, r, EW_N);
    gm_free(x), gm_free(dy), gm_free(r), dfree(d, dx), dfree(d, ddy);
}

/* ---- vision: LayerNorm, bias, pooling ------------------------------------------------------ */

static void parity_layernorm_fwd(dev *d) {
    int64_t N = 11, C = 1152;
    float *x = host_rand((size_t)(N * C), 5), *w = host_rand((size_t)C, 1), *b = host_rand((size_t)C, 1);
    for (int64_t i = 0; i < N * C; i++) x[i] += 30; /* a large mean: the statistics' precision matters */
    float *r = gm_malloc((size_t)(N * C) * 4), *rm = gm_malloc((size_t)N * 4), *rr = gm_malloc((size_t)N * 4);
    float *dx = up(d, x, (size_t)(N * C) * 4), *dw = up(d, w, (size_t)C * 4), *db = up(d, b, (size_t)C * 4);
    float *o = dalloc(d, (size_t)(N * C) * 4), *om = dalloc(d, (size_t)N * 4), *orr = dalloc(d, (size_t)N * 4);
    cpu->layernorm_fwd(&hc, r, rm, rr, x, w, b, N, C, 1e-6f);
    d->be->k->layernorm_fwd(&d->ctx, o, om, orr, dx, dw, db, N, C, 1e-6f);
    cmp(d, "layernorm_fwd out", o, r, (size_t)(N * C));
    cmp(d, "layernorm_fwd mean", om, rm, (size_t)N);
    cmp(d, "layernorm_fwd rstd", orr, rr, (size_t)N);
    gm_free(x), gm_free(w), gm_free(b), gm_free(r), gm_free(rm), gm_free(rr);
    dfree(d, dx), dfree(d, dw), dfree(d, db), dfree(d, o), dfree(d, om), dfree(d, orr);
}

static void parity_layernorm_bwd(dev *d) {
    int64_t N = 11, C = 1152;
    float *x = host_rand((size_t)(N * C), 2), *w = host_rand((size_t)C, 1), *b = host_rand((size_t)C, 1);
    float *dy = host_rand((size_t)(N * C), 1), *tmp = gm_malloc((size_t)(N * C) * 4);
    float *mean = gm_malloc((size_t)N * 4), *rstd = gm_malloc((size_t)N * 4);
    cpu->layernorm_fwd(&hc, tmp, mean, rstd, x, w, b, N, C, 1e-6f);
    float *dx = up(d, x, (size_t)(N * C) * 4), *dw = up(d, w, (size_t)C * 4), *ddy = up(d, dy, (size_t)(N * C) * 4);
    float *dmean = up(d, mean, (size_t)N * 4), *drstd = up(d, rstd, (size_t)N * 4);
    for (int beta = 0; beta <= 1; beta++) {
        float *r = host_rand((size_t)(N * C), 1), *rw = host_rand((size_t)C, 1), *rb = host_rand((size_t)C, 1);
        float *o = up(d, r, (size_t)(N * C) * 4), *ow = up(d, rw, (size_t)C * 4), *ob = up(d, rb, (size_t)C * 4);
        cpu->layernorm_bwd(&hc, r, rw, rb, dy, x, w, mean, rstd, N, C, (float)beta);
        d->be->k->layernorm_bwd(&d->ctx, o, ow, ob, ddy, dx, dw, dmean, drstd, N, C, (float)beta);
        cmp(d, beta ? "layernorm_bwd dx beta=1" : "layernorm_bwd dx beta=0", o, r, (size_t)(N * C));
        cmp_tol(d, "layernorm_bwd dw (+=)", ow, rw, (size_t)C, TOL_CUDA_VS_CPU_GEMM_ABS);
        cmp_tol(d, "layernorm_bwd db (+=)", ob, rb, (size_t)C, TOL_CUDA_VS_CPU_GEMM_ABS);
        gm_free(r), gm_free(rw), gm_free(rb), dfree(d, o), dfree(d, ow), dfree(d, ob);
    }
    gm_free(x), gm_free(w), gm_free(b), gm_free(dy), gm_free(tmp), gm_free(mean), gm_free(rstd);
    dfree(d, dx), dfree(d, dw), dfree(d, ddy), dfree(d, dmean), dfree(d, drstd);
}

static void parity_bias_fwd(dev *d) {
    int64_t N = 37, C = 200;
    float *y = host_rand((size_t)(N * C), 1), *b = host_rand((size_t)C, 1);
    float *dy = up(d, y, (size_t)(N * C) * 4), *db = up(d, b, (size_t)C * 4);
    cpu->bias_fwd(&hc, y, b, N, C);
    d->be->k->bias_fwd(&d->ctx, dy, db, N, C);
    cmp(d, "bias_fwd", dy, y, (size_t)(N * C));
    gm_free(y), gm_free(b), dfree(d, dy), dfree(d, db);
}

static void avgpool_case(dev *d, bool bwd) {
    int64_t B = 2, P = 16, K = 4, C = 48, Q = (P / K) * (P / K);
    size_t nx = (size_t)(B * P * P * C), ny = (size_t)(B * Q * C);
    float *in = host_rand(bwd ? ny : nx, 1), *r = gm_malloc((bwd ? nx : ny) * 4);
    float *din = up(d, in, (bwd ? ny : nx) * 4), *o = dalloc(d, (bwd ? nx : ny) * 4);
    if (bwd) {
        cpu->avgpool_bwd(&hc, r, in, B, P, K, C);
        d->be->k->avgpool_bwd(&d->ctx, o, din, B, P, K, C);
    } else {
        cpu->avgpool_fwd(&hc, r, in, B, P, K, C);
        d->be->k->avgpool_fwd(&d->ctx, o, din, B, P, K, C);
    }
    cmp(d, bwd ? "avgpool_bwd" : "avgpool_fwd", o, r, bwd ? nx : ny);
    gm_free(in), gm_free(r), dfree(d, din), dfree(d, o);
}
static void parity_avgpool_fwd(dev *d) { avgpool_case(d, false); }
static void parity_avgpool_bwd(dev *d) { avgpool_case(d, true); }

/* ---- Gemma 4's vision tower: clipped linears' clamps, 2-D RoPE, pooling by positions --------- */

/* the bounds are one float each in the backend's memory: asymmetric, then infinite (the identity);
 * the backward with values exactly on the bounds (they pass the gradient) */
static void clip_case(dev *d, bool bwd) {
    static const float bounds[2][2] = {{-0.7f, 1.3f}, {-INFINITY, INFINITY}};
    float *x = host_rand(EW_N, 3), *dy = host_rand(EW_N, 1), *r = gm_malloc(EW_N * 4);
    x[0] = -0.7f, x[1] = 1.3f;
    float *dx = up(d, x, EW_N * 4), *o = dalloc(d, EW_N * 4);
    for (int b = 0; b < 2; b++) {
        const float *lo = &bounds[b][0], *hi = &bounds[b][1];
        float *dlo = up(d, lo, 4), *dhi = up(d, hi, 4);
        gm_backend_upload(d->be, o, bwd ? dy : x, EW_N * 4); /* in place */
        if (bwd) {
            cpu->clip_bwd(&hc, r, dy, x, EW_N, lo, hi);
            d->be->k->clip_bwd(&d->ctx, o, o, dx, EW_N, dlo, dhi);
        } else {
            cpu->clip_fwd(&hc, r, x, EW_N, lo, hi);
            d->be->k->clip_fwd(&d->ctx, o, o, EW_N, dlo, dhi);
        }
        cmp(d, bwd ? (b ? "clip_bwd (-inf, inf), in place" : "clip_bwd [-0.7, 1.3], in place")
                   : (b ? "clip_fwd (-inf, inf), in place" : "clip_fwd [-0.7, 1.3], in place"),
            o, r, EW_N);
        dfree(d, dlo), dfree(d, dhi);
    }
    gm_free(x), gm_free(dy), gm_free(r), dfree(d, dx), dfree(d, o);
}
static void parity_clip_fwd(dev *d) { clip_case(d, false); }
static void parity_clip_bwd(dev *d) { clip_case(d, true); }

/* heads of 72 (18 pairs a half), theta 100, a patch grid's positions, the larger ones past a full turn */
static void rope2d_case(dev *d, bool bwd) {
    int64_t N = 9, NH = 4, D = 72;
    size_t n = (size_t)(N * NH * D);
    int32_t px[9] = {0, 1, 2, 0, 1, 2, 47, 0, 63}, py[9] = {0, 0, 0, 1, 1, 1, 3, 47, 63};
    float *x = host_rand(n, 1), *r = gm_malloc(n * 4);
    float *dx = up(d, x, n * 4), *o = dalloc(d, n * 4);
    int32_t *dpx = up(d, px, sizeof px), *dpy = up(d, py, sizeof py);
    (bwd ? cpu->rope2d_bwd : cpu->rope2d_fwd)(&hc, r, x, px, py, N, NH, D, 100.0f);
    (bwd ? d->be->k->rope2d_bwd : d->be->k->rope2d_fwd)(&d->ctx, o, dx, dpx, dpy, N, NH, D, 100.0f);
    cmp(d, bwd ? "rope2d_bwd" : "rope2d_fwd", o, r, n);
    (bwd ? d->be->k->rope2d_bwd : d->be->k->rope2d_fwd)(&d->ctx, dx, dx, dpx, dpy, N, NH, D, 100.0f);
    cmp(d, bwd ? "rope2d_bwd (in place)" : "rope2d_fwd (in place)", dx, r, n);
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o), dfree(d, dpx), dfree(d, dpy);
}
static void parity_rope2d_fwd(dev *d) { rope2d_case(d, false); }
static void parity_rope2d_bwd(dev *d) { rope2d_case(d, true); }

/* the vision pooler on a 12 x 20 grid pooled 4 x 4 (3 x 5 tokens of 16 patches) whose rows sit
 * scattered among 257 rows, 17 of them padding; the backward over garbage (it assigns: the padding
 * rows 0) and exact (one product per element) */
static void pool_gather_case(dev *d, bool bwd) {
    enum { GH = 12, GW = 20, PK = 4, CW = GW / PK, R = (GH / PK) * CW, K = PK * PK, N = 257 };
    int64_t C = 72;
    int32_t src[R * K];
    for (int y = 0; y < GH; y++)
        for (int x = 0; x < GW; x++) /* 257 is prime: distinct rows */
            src[((y / PK) * CW + x / PK) * K + (y % PK) * PK + x % PK] = (int32_t)(((y * GW + x) * 101 + 7) % N);
    const float scale = 1.0f / 16;
    size_t nx = (size_t)(N * C), ny = (size_t)(R * C);
    float *in = host_rand(bwd ? ny : nx, 1), *r = host_rand(bwd ? nx : ny, 3);
    float *din = up(d, in, (bwd ? ny : nx) * 4), *o = up(d, r, (bwd ? nx : ny) * 4); /* o: garbage */
    int32_t *dsrc = up(d, src, sizeof src);
    if (bwd) {
        cpu->pool_gather_bwd(&hc, r, in, src, R, K, N, C, scale);
        d->be->k->pool_gather_bwd(&d->ctx, o, din, dsrc, R, K, N, C, scale);
        bool e = d->exact;
        d->exact = true;
        cmp(d, "pool_gather_bwd", o, r, nx);
        d->exact = e;
    } else {
        cpu->pool_gather_fwd(&hc, r, in, src, R, K, C, scale);
        d->be->k->pool_gather_fwd(&d->ctx, o, din, dsrc, R, K, C, scale);
        cmp(d, "pool_gather_fwd", o, r, ny);
    }
    gm_free(in), gm_free(r), dfree(d, din), dfree(d, o), dfree(d, dsrc);
}
static void parity_pool_gather_fwd(dev *d) { pool_gather_case(d, false); }
static void parity_pool_gather_bwd(dev *d) { pool_gather_case(d, true); }

/* ---- loss and optimizer --------------------------------------------------------------------- */

/* the chunked cross-entropy over two vocabulary chunks, soft-capped and not: running statistics,
 * the target logits, the finished log-sum-exp, the one-pass gradient's weights and rescaled dh,
 * and its finish (a row without a target gets 0) */
static void xent_cmp_stats(dev *d, const char *kernel, int cap, const float *dmx, const float *mx, const float *dsm,
                           const float *sm, const float *dtl, const float *tl, int64_t R) {
    const char *part[3] = {"max", "sum", "target"};
    const float *got[3] = {dmx, dsm, dtl}, *want[3] = {mx, sm, tl};
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s%s", kernel, part[i], cap ? " softcap" : "");
        cmp(d, what, got[i], want[i], (size_t)R);
    }
}

static void xent_case(dev *d, int which) {
    int64_t R = 9, Vc = 1000, V = 2 * Vc;
    int32_t tg[9] = {5, 1500, -1, 999, 1000, 0, 1999, 77, 1234};
    float *logits = host_rand((size_t)(R * V), 8);
    int32_t *dtg = up(d, tg, sizeof tg);
    for (int cap = 0; cap <= 1; cap++) {
        float softcap = cap ? 30.0f : 0.0f;
        float mx[9], sm[9], tl[9], lse[9];
        for (int i = 0; i < R; i++) mx[i] = -INFINITY, sm[i] = 0, tl[i] = 0;
        float *dmx = up(d, mx, sizeof mx), *dsm = up(d, sm, sizeof sm), *dtl = up(d, tl, sizeof tl);
        float *dlse = dalloc(d, sizeof lse);
        for (int64_t c = 0; c < 2; c++) {
            float *chunk = gm_malloc((size_t)(R * Vc) * 4);
            for (int64_t r = 0; r < R; r++) memcpy(chunk + r * Vc, logits + r * V + c * Vc, (size_t)Vc * 4);
            float *dchunk = up(d, chunk, (size_t)(R * Vc) * 4);
            cpu->xent_lse_update(&hc, mx, sm, tl, chunk, tg, R, Vc, c * Vc, softcap);
            d->be->k->xent_lse_update(&d->ctx, dmx, dsm, dtl, dchunk, dtg, R, Vc, c * Vc, softcap);
            gm_free(chunk), dfree(d, dchunk);
        }
        cpu->xent_lse_finish(&hc, lse, mx, sm, R);
        d->be->k->xent_lse_finish(&d->ctx, dlse, dmx, dsm, R);
        char what[64];
        if (which == 0) {
            xent_cmp_stats(d, "xent_lse_update", cap, dmx, mx, dsm, sm, dtl, tl, R);
        } else if (which == 1) {
            snprintf(what, sizeof what, "xent_lse_finish%s", cap ? " softcap" : "");
            cmp(d, what, dlse, lse, (size_t)R);
        } else if (which == 2) {
            /* the one-pass gradient: both chunks again from the start; dh is garbage before the
             * first (which zeroes it) and a random accumulation before the second (rescaled) */
            int64_t C = 64;
            float *dh = gm_malloc((size_t)(R * C) * sizeof(float));
            for (int64_t i = 0; i < R * C; i++) dh[i] = NAN; /* never read before the first chunk */
            float *ddh = up(d, dh, (size_t)(R * C) * 4);
            for (int i = 0; i < R; i++) mx[i] = -INFINITY, sm[i] = 0, tl[i] = 0;
            gm_backend_upload(d->be, dmx, mx, sizeof mx), gm_backend_upload(d->be, dsm, sm, sizeof sm);
            gm_backend_upload(d->be, dtl, tl, sizeof tl);
            for (int64_t c = 0; c < 2; c++) {
                float *chunk = gm_malloc((size_t)(R * Vc) * 4);
                for (int64_t r = 0; r < R; r++) memcpy(chunk + r * Vc, logits + r * V + c * Vc, (size_t)Vc * 4);
                float *dchunk = up(d, chunk, (size_t)(R * Vc) * 4);
                if (c == 1) {
                    gm_free(dh), dh = host_rand((size_t)(R * C), 1);
                    gm_backend_upload(d->be, ddh, dh, (size_t)(R * C) * 4);
                }
                cpu->xent_grad_update(&hc, mx, sm, tl, chunk, dh, tg, R, Vc, c * Vc, C, softcap);
                d->be->k->xent_grad_update(&d->ctx, dmx, dsm, dtl, dchunk, ddh, dtg, R, Vc, c * Vc, C, softcap);
                snprintf(what, sizeof what, "xent_grad_update chunk %lld weights%s", (long long)c, cap ? " softcap" : "");
                cmp(d, what, dchunk, chunk, (size_t)(R * Vc));
                snprintf(what, sizeof what, "xent_grad_update chunk %lld dh%s", (long long)c, cap ? " softcap" : "");
                cmp(d, what, ddh, dh, (size_t)(R * C));
                gm_free(chunk), dfree(d, dchunk);
            }
            xent_cmp_stats(d, "xent_grad_update", cap, dmx, mx, dsm, sm, dtl, tl, R);
            gm_free(dh), dfree(d, ddh);
        } else {
            /* finish from the CPU's statistics: dh and the targets' rows random */
            int64_t C = 64;
            float *dh = host_rand((size_t)(R * C), 1), *et = host_rand((size_t)(R * C), 1);
            float *ddh = up(d, dh, (size_t)(R * C) * 4), *det = up(d, et, (size_t)(R * C) * 4);
            gm_backend_upload(d->be, dsm, sm, sizeof sm), gm_backend_upload(d->be, dtl, tl, sizeof tl);
            gm_backend_upload(d->be, dlse, lse, sizeof lse);
            cpu->xent_grad_finish(&hc, dh, et, sm, lse, tl, tg, R, C, softcap, 1.0f / 8);
            d->be->k->xent_grad_finish(&d->ctx, ddh, det, dsm, dlse, dtl, dtg, R, C, softcap, 1.0f / 8);
            snprintf(what, sizeof what, "xent_grad_finish%s", cap ? " softcap" : "");
            cmp(d, what, ddh, dh, (size_t)(R * C));
            gm_free(dh), gm_free(et), dfree(d, ddh), dfree(d, det);
        }
        dfree(d, dmx), dfree(d, dsm), dfree(d, dtl), dfree(d, dlse);
    }
    gm_free(logits), dfree(d, dtg);
}
static void parity_xent_lse_update(dev *d) { xent_case(d, 0); }
static void parity_xent_lse_finish(dev *d) { xent_case(d, 1); }
static void parity_xent_grad_update(dev *d) { xent_case(d, 2); }
static void parity_xent_grad_finish(dev *d) { xent_case(d, 3); }

static void parity_adamw(dev *d) {
    float *p = host_rand(EW_N, 0.1f), *g = host_rand(EW_N, 0.01f), *m = host_rand(EW_N, 0.001f), *v = host_rand(EW_N, 0.001f);
    for (int i = 0; i < EW_N; i++) v[i] = v[i] * v[i];
    float *dp = up(d, p, EW_N * 4), *dg = up(d, g, EW_N * 4), *dm = up(d, m, EW_N * 4), *dv = up(d, v, EW_N * 4);
    for (int step = 0; step < 3; step++) { /* three steps: the moments carry over */
        cpu->adamw(&hc, p, g, m, v, EW_N, 0.9f, 0.999f, 1e-8f, 0.9999f, 1e-3f, 0.0447f);
        d->be->k->adamw(&d->ctx, dp, dg, dm, dv, EW_N, 0.9f, 0.999f, 1e-8f, 0.9999f, 1e-3f, 0.0447f);
    }
    cmp(d, "adamw p", dp, p, EW_N);
    cmp(d, "adamw m", dm, m, EW_N);
    cmp(d, "adamw v", dv, v, EW_N);
    gm_free(p), gm_free(g), gm_free(m), gm_free(v), dfree(d, dp), dfree(d, dg), dfree(d, dm), dfree(d, dv);
}

static void parity_sumsq(dev *d) {
    int64_t n = 300007;
    float *x = host_rand((size_t)n, 2);
    double want = 0, got = 0;
    float *dx = up(d, x, (size_t)n * 4);
    double *dout = dalloc(d, sizeof(double));
    cpu->sumsq(&hc, &want, x, n);
    d->be->k->sumsq(&d->ctx, dout, dx, n);
    gm_backend_download(d->be, &got, dout, sizeof got);
    if (d->exact) CHECK(memcmp(&got, &want, sizeof got) == 0, "%s: sumsq %.17g, the CPU's %.17g", d->be->name, got, want);
    else CHECK(fabs(got - want) <= TOL_CUDA_VS_CPU_REL * want, "%s: sumsq %.17g, the CPU's %.17g", d->be->name, got, want);
    gm_free(x), dfree(d, dx), dfree(d, dout);
}

/* ---- data movement: exact on every device --------------------------------------------------- */

static void parity_fill(dev *d) {
    float *r = gm_malloc(EW_N * 4), *o = dalloc(d, EW_N * 4);
    cpu->fill(&hc, r, EW_N, -0.75f);
    d->be->k->fill(&d->ctx, o, EW_N, -0.75f);
    bool e = d->exact;
    d->exact = true;
    cmp(d, "fill", o, r, EW_N);
    d->exact = e;
    gm_free(r), dfree(d, o);
}

static void rows_case(dev *d, bool scatter) {
    int64_t R = 37, C = 96, rows_in = 80;
    int32_t rows[37];
    for (int i = 0; i < R; i++) rows[i] = (int32_t)((i * 13 + 5) % rows_in); /* distinct */
    float *x = host_rand((size_t)(rows_in * C), 1), *r = host_rand((size_t)(rows_in * C), 1);
    float *dx = up(d, x, (size_t)(rows_in * C) * 4), *o = up(d, r, (size_t)(rows_in * C) * 4);
    int32_t *drows = up(d, rows, sizeof rows);
    if (scatter) {
        cpu->scatter_rows(&hc, r, x, rows, R, C);
        d->be->k->scatter_rows(&d->ctx, o, dx, drows, R, C);
    } else {
        cpu->gather_rows(&hc, r, x, rows, R, C);
        d->be->k->gather_rows(&d->ctx, o, dx, drows, R, C);
    }
    bool e = d->exact;
    d->exact = true;
    cmp(d, scatter ? "scatter_rows" : "gather_rows", o, r, (size_t)((scatter ? rows_in : R) * C));
    d->exact = e;
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o), dfree(d, drows);
}
static void parity_gather_rows(dev *d) { rows_case(d, false); }
static void parity_scatter_rows(dev *d) { rows_case(d, true); }

static void parity_kv_store(dev *d) {
    int64_t B = 2, T = 5, S = 7, W = 48;
    float *x = host_rand((size_t)(B * T * W), 1), *r = host_rand((size_t)(B * S * W), 1);
    float *dx = up(d, x, (size_t)(B * T * W) * 4), *o = up(d, r, (size_t)(B * S * W) * 4);
    cpu->kv_store(&hc, r, x, B, T, S, W, 4); /* positions 4..8: the ring wraps */
    d->be->k->kv_store(&d->ctx, o, dx, B, T, S, W, 4);
    bool e = d->exact;
    d->exact = true;
    cmp(d, "kv_store", o, r, (size_t)(B * S * W));
    d->exact = e;
    gm_free(x), gm_free(r), dfree(d, dx), dfree(d, o);
}

/* Gemma 4's mixture of experts: N tokens, E experts, K choices; a routing made on the CPU feeds
 * both sides of the combination cases (the same slots). */
enum { MOE_N = 37, MOE_E = 12, MOE_K = 4, MOE_C = 72 };

static void moe_case_route(dev *d, bool bwd) {
    int64_t N = MOE_N, E = MOE_E, K = MOE_K;
    float *logits = host_rand((size_t)(N * E), 3), *pes = host_rand((size_t)E, 1), *w = gm_malloc((size_t)(N * K) * 4);
    int32_t *idx = gm_malloc((size_t)(N * K) * 4);
    float *dl = up(d, logits, (size_t)(N * E) * 4), *dpes = up(d, pes, (size_t)E * 4), *dw = dalloc(d, (size_t)(N * K) * 4);
    int32_t *didx = dalloc(d, (size_t)(N * K) * 4);
    cpu->moe_route_fwd(&hc, idx, w, logits, pes, N, E, K);
    d->be->k->moe_route_fwd(&d->ctx, didx, dw, dl, dpes, N, E, K);
    if (!bwd) {
        int32_t *got = gm_malloc((size_t)(N * K) * 4);
        down(d, got, didx, (size_t)(N * K) * 4);
        CHECK(memcmp(got, idx, (size_t)(N * K) * 4) == 0, "%s: moe_route_fwd: the same experts chosen", d->be->name);
        gm_free(got);
        cmp(d, "moe_route_fwd probs", dl, logits, (size_t)(N * E));
        cmp(d, "moe_route_fwd weights", dw, w, (size_t)(N * K));
    } else {
        float *dwin = host_rand((size_t)(N * K), 1), *r = gm_malloc((size_t)(N * E) * 4);
        float *ddwin = up(d, dwin, (size_t)(N * K) * 4), *o = dalloc(d, (size_t)(N * E) * 4);
        cpu->moe_route_bwd(&hc, r, dwin, logits, idx, pes, N, E, K);
        d->be->k->moe_route_bwd(&d->ctx, o, ddwin, dl, didx, dpes, N, E, K);
        cmp(d, "moe_route_bwd", o, r, (size_t)(N * E));
        gm_free(dwin), gm_free(r), dfree(d, ddwin), dfree(d, o);
    }
    gm_free(logits), gm_free(pes), gm_free(w), gm_free(idx);
    dfree(d, dl), dfree(d, dpes), dfree(d, dw), dfree(d, didx);
}
static void parity_moe_route_fwd(dev *d) { moe_case_route(d, false); }
static void parity_moe_route_bwd(dev *d) { moe_case_route(d, true); }

/* a permutation of the N K slots (as grouping by expert makes one) */
static void moe_slots(int32_t *slot) {
    int64_t n = MOE_N * MOE_K;
    for (int64_t i = 0; i < n; i++) slot[i] = (int32_t)((i * 7 + 3) % n); /* 7 is prime to n = 148 */
}

static void moe_case_combine(dev *d, bool bwd) {
    int64_t N = MOE_N, K = MOE_K, C = MOE_C, S = N * K;
    int32_t slot[MOE_N * MOE_K];
    moe_slots(slot);
    float *ys = host_rand((size_t)(S * C), 1), *w = host_rand((size_t)S, 1), *dy = host_rand((size_t)(N * C), 1);
    float *dys = up(d, ys, (size_t)(S * C) * 4), *dw = up(d, w, (size_t)S * 4), *ddy = up(d, dy, (size_t)(N * C) * 4);
    int32_t *dslot = up(d, slot, sizeof slot);
    if (!bwd) {
        float *r = gm_malloc((size_t)(N * C) * 4), *o = dalloc(d, (size_t)(N * C) * 4);
        for (int weighted = 0; weighted < 2; weighted++) {
            cpu->moe_combine_fwd(&hc, r, ys, weighted ? w : NULL, slot, N, K, C);
            d->be->k->moe_combine_fwd(&d->ctx, o, dys, weighted ? dw : NULL, dslot, N, K, C);
            cmp(d, weighted ? "moe_combine_fwd weighted" : "moe_combine_fwd sum", o, r, (size_t)(N * C));
        }
        gm_free(r), dfree(d, o);
    } else {
        /* in place (dys aliases ys), as the layer calls it */
        float *rdw = gm_malloc((size_t)S * 4), *odw = dalloc(d, (size_t)S * 4);
        cpu->moe_combine_bwd(&hc, ys, rdw, dy, ys, w, slot, N, K, C);
        d->be->k->moe_combine_bwd(&d->ctx, dys, odw, ddy, dys, dw, dslot, N, K, C);
        cmp(d, "moe_combine_bwd dw", odw, rdw, (size_t)S);
        cmp(d, "moe_combine_bwd dys", dys, ys, (size_t)(S * C));
        gm_free(rdw), dfree(d, odw);
    }
    gm_free(ys), gm_free(w), gm_free(dy);
    dfree(d, dys), dfree(d, dw), dfree(d, ddy), dfree(d, dslot);
}
static void parity_moe_combine_fwd(dev *d) { moe_case_combine(d, false); }
static void parity_moe_combine_bwd(dev *d) { moe_case_combine(d, true); }

/* ---- the list, from kernels.def ------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*run)(dev *d);
} CASES[] = {
#define GM_KERNEL(name, params, args) {#name, parity_##name},
#include "kernels.def"
#undef GM_KERNEL
};

/* ---- the CPU's bf16 GEMMs (gm_kctx.bf16_gemm with bf16_staging) ---------------------------------
 * Against the products of bf16-rounded x (dy) and bf16-rounded dequantized weights summed in double
 * (TOL_CPU_BF16_GEMM_REL), for a bf16 base multiplied as stored (contiguous and strided) and panels
 * of other types; with the full staging and with one that fits 4 activation rows (M in chunks).
 * Where the CPU has no native bf16, oneDNN may still run bf16 (AVX-512) or refuse and the kernel
 * computes in f32 (in the same row chunks): then the result must be the f32 one, within the same
 * tolerance. */
static void cpu_bf16_case(dev *d, const weight *w, int64_t M, bool fwd, float beta, size_t staging_elems,
                          uint16_t *staging) {
    int64_t N = w->host.rows, K = w->host.cols, in = fwd ? K : N, outw = fwd ? N : K;
    float *x = host_rand((size_t)(M * in), 1), *init = host_rand((size_t)(M * outw), 1);
    float *got = gm_malloc((size_t)(M * outw) * 4), *f32 = gm_malloc((size_t)(M * outw) * 4);
    double *ref = gm_malloc((size_t)(M * outw) * sizeof(double));
    float *wrow = gm_malloc((size_t)K * 4), *wr = gm_malloc((size_t)(N * K) * 4);
    for (int64_t n = 0; n < N; n++) {
        gm_dequant_wrow(&w->host, n, wrow);
        for (int64_t k = 0; k < K; k++) wr[n * K + k] = gm_round_bf16(wrow[k]);
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t o = 0; o < outw; o++) {
            double s = beta != 0.0f ? init[m * outw + o] : 0.0;
            for (int64_t i = 0; i < in; i++) {
                double xv = gm_round_bf16(x[m * in + i]);
                s += xv * (fwd ? wr[o * K + i] : wr[i * K + o]);
            }
            ref[m * outw + o] = s;
        }
    gm_kctx c = d->ctx;
    memcpy(got, init, (size_t)(M * outw) * 4), memcpy(f32, init, (size_t)(M * outw) * 4);
    c.bf16_gemm = false;
    if (fwd) cpu->matmul_fwd(&c, f32, x, &w->host, M, beta);
    else cpu->matmul_bwd_input(&c, f32, x, &w->host, M, beta);
    c.bf16_gemm = true, c.bf16_staging = staging, c.bf16_staging_elems = staging_elems;
    if (fwd) cpu->matmul_fwd(&c, got, x, &w->host, M, beta);
    else cpu->matmul_bwd_input(&c, got, x, &w->host, M, beta);
    double amax = 0, err = 0, err_f32 = 0, got_vs_f32 = 0;
    for (int64_t i = 0; i < M * outw; i++) {
        amax = fmax(amax, fabs(ref[i]));
        err = fmax(err, fabs(got[i] - ref[i]));
        err_f32 = fmax(err_f32, fabs(f32[i] - ref[i]));
        got_vs_f32 = fmax(got_vs_f32, fabs(got[i] - f32[i]));
    }
    char what[128];
    snprintf(what, sizeof what, "cpu bf16 %s %s%s M=%lld beta=%g staging %zu", fwd ? "matmul_fwd" : "matmul_bwd_input",
             gm_dtype_name(w->host.type), w->host.row_bytes != (size_t)K * gm_dtype_get(w->host.type)->type_size ? " strided" : "",
             (long long)M, beta, staging_elems);
    CHECK(err_f32 > TOL_CPU_BF16_GEMM_DISTINCT * amax, "%s: the f32 GEMM is within %.2g of the bf16 reference: saturated fixture",
          what, err_f32 / amax);
    if (gm_k_cpu_bf16_native())
        CHECK(err <= TOL_CPU_BF16_GEMM_REL * amax, "%s: %.3g of the largest output off the bf16 reference (tolerance %g)", what,
              err / amax, TOL_CPU_BF16_GEMM_REL);
    else
        CHECK(err <= TOL_CPU_BF16_GEMM_REL * amax || got_vs_f32 <= TOL_CPU_BF16_GEMM_REL * amax,
              "%s: neither bf16 (%.3g off) nor the f32 result (no native bf16 here)", what, err / amax);
    gm_free(x), gm_free(init), gm_free(got), gm_free(f32), gm_free(ref), gm_free(wrow), gm_free(wr);
}

static void cpu_bf16_gemms(void) {
    gm_error err = {0};
    gm_backend *be = NULL;
    CHECK_OK(gm_backend_cpu_new(2, &be, &err), &err);
    if (!be) return;
    dev d = {be, {0}, false};
    float *scratch = gm_malloc(SCRATCH_FLOATS * sizeof(float));
    d.ctx = gm_backend_kctx(be, scratch, SCRATCH_FLOATS);
    int64_t N = 700, K = 512;
    size_t full = GM_CPU_BF16_STAGING_BYTES / 2;
    uint16_t *staging = gm_malloc(full * 2);
    const gm_dtype types[] = {GM_BF16, GM_BF16, GM_F16, GM_Q8_0, GM_Q4_K, GM_NF4};
    int before = gm_test_failed;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        weight w;
        weight_make(&d, &w, types[t], N, K, t == 1 ? 32 : 0);
        int64_t prow = types[t] == GM_BF16 ? 0 : GM_MATMUL_PANEL_ROWS;
        for (int fwd = 0; fwd <= 1; fwd++)
            for (int beta = 0; beta <= 1; beta++) {
                size_t small = (size_t)(prow * K + 4 * (fwd ? K : N)); /* 4 activation rows: M = 9 in 3 chunks */
                cpu_bf16_case(&d, &w, 9, fwd, (float)beta, full, staging);
                cpu_bf16_case(&d, &w, 9, fwd, (float)beta, small, staging);
            }
        weight_free(&d, &w);
    }
    printf("%-4s cpu bf16 GEMMs (%s)\n", gm_test_failed == before ? "ok" : "FAIL",
           gm_k_cpu_bf16_native() ? "native" : "no native bf16 on this CPU");
    gm_free(staging), gm_free(scratch);
    gm_backend_free(be);
}

static void run_all(gm_backend *be, bool exact) {
    dev d = {be, {0}, exact};
    float *scratch = dalloc(&d, SCRATCH_FLOATS * sizeof(float));
    d.ctx = gm_backend_kctx(be, scratch, SCRATCH_FLOATS);
    d.ctx.bf16_gemm = false; /* f32 parity; the GEMM cases turn bf16 on for their second run */
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        int before = gm_test_failed;
        CASES[i].run(&d);
        gm_error err = {0};
        CHECK(gm_backend_status(be, &err) == GM_OK, "%s: %s left the backend in error: %s", be->name, CASES[i].name, err.msg);
        printf("%-4s %s %s\n", gm_test_failed == before ? "ok" : "FAIL", be->name, CASES[i].name);
    }
    dfree(&d, scratch);
}

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "strict";
    size_t need = gm_k_matmul_scratch_floats(GM_Q8_0, 700, 512, 2);
    size_t attn = gm_k_attention_scratch_floats(2, 24, 4, 64, 2);
    GM_ASSERT(need <= SCRATCH_FLOATS && attn <= SCRATCH_FLOATS);
    hc = (gm_kctx){.n_threads = 2, .scratch = gm_malloc(SCRATCH_FLOATS * sizeof(float)), .scratch_floats = SCRATCH_FLOATS};
    gm_kernels_set_threads(2);
    gm_error err = {0};
    gm_backend *be = NULL;
    if (strcmp(which, "strict") == 0) {
        CHECK_OK(gm_backend_strict_new(2, &be, &err), &err);
    } else if (strcmp(which, "cuda") == 0) {
        const char *req = getenv("GM_REQUIRE_GPU");
        bool required = req && strcmp(req, "1") == 0;
#ifdef GM_HAVE_CUDA
        if (gm_backend_cuda_new(0, &be, &err) != GM_OK) {
            gm_free(hc.scratch);
            if (required) {
                CHECK(0, "GM_REQUIRE_GPU=1 but no CUDA backend: %s", err.msg);
                return gm_test_finish();
            }
            return gm_test_skip(err.msg);
        }
#else
        gm_free(hc.scratch);
        if (required) {
            CHECK(0, "GM_REQUIRE_GPU=1 but this build has no CUDA (nvcc not found when it was configured)");
            return gm_test_finish();
        }
        return gm_test_skip("built without CUDA");
#endif
    } else {
        fprintf(stderr, "usage: test_kernel_parity strict|cuda\n");
        return 2;
    }
    if (be) {
        run_all(be, strcmp(which, "strict") == 0);
        gm_backend_free(be);
    }
    if (strcmp(which, "strict") == 0) cpu_bf16_gemms();
    gm_free(hc.scratch);
    return gm_test_finish();
}
