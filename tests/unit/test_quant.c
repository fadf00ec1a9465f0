/*
 * test_quant.c - core/quant: NF4 against bitsandbytes bit for bit, int8 vector-wise bounds, the
 * format parser, and gm_quant_layout on the tiny random Gemma 3 (every format, through the kernels).
 *
 * Reference: tests/ref/nf4_ref.h5, written by tests/ref/make_quant_ref.py from bitsandbytes 0.50.2
 * on CPU (1 torch thread). Tensors too big to store are regenerated here with the generator the
 * script documents (splitmix64, exact in f32) and compared through FNV-1a checksums.
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_model.h"
#include "gm_quant.h"
#include "gm_weights.h"
#include "kernels.h"
#include "nf4_tables.h"

#include <hdf5.h>
#include <omp.h>
#include <string.h>

/* The reconstructions below must round like bitsandbytes (no FMA contraction), see dequant.c. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

static char REF[1024];

/* ---- reference file helpers ---- */

/* Reads a dataset converted to `mem_type` (elem bytes each) into a gm_malloc'd buffer. */
static void *h5_get(const char *path, hid_t mem_type, size_t elem, size_t *n) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    *n = 0;
    hid_t f = H5Fopen(REF, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        CHECK(0, "cannot open %s (regenerate with tests/ref/make_quant_ref.py)", REF);
        return NULL;
    }
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0) {
        H5Fclose(f);
        CHECK(0, "%s: no dataset %s", REF, path);
        return NULL;
    }
    hid_t sp = H5Dget_space(d);
    hssize_t cnt = H5Sget_simple_extent_npoints(sp);
    void *buf = gm_malloc((size_t)cnt * elem + 8);
    herr_t rc = H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Sclose(sp), H5Dclose(d), H5Fclose(f);
    if (rc < 0) {
        gm_free(buf);
        CHECK(0, "%s: cannot read %s", REF, path);
        return NULL;
    }
    *n = (size_t)cnt;
    return buf;
}

static double attr(const char *obj, const char *name) {
    double v = 0;
    bool ok = gm_test_h5_attr_double(REF, obj, name, &v);
    CHECK(ok, "%s: no attribute %s on %s", REF, name, obj);
    return v;
}

/* ---- the generator of make_quant_ref.py ---- */

static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1): ((z >> 40) - 2^23) * 2^-23 with z = splitmix64(seed * 2^32 + i). */
static float gen_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = splitmix64((seed << 32) + i);
    return (float)((int64_t)(z >> 40) - (1 << 23)) * 0x1p-23f;
}

static void gen_bell(uint64_t seed, int64_t n, float scale, float *x) {
    for (int64_t i = 0; i < n; i++) {
        float a0 = gen_uniform(seed, (uint64_t)(4 * i)), a1 = gen_uniform(seed, (uint64_t)(4 * i + 1));
        float a2 = gen_uniform(seed, (uint64_t)(4 * i + 2)), a3 = gen_uniform(seed, (uint64_t)(4 * i + 3));
        float s = (a0 + a1) + (a2 + a3);
        x[i] = s * scale;
    }
}

static uint64_t fnv1a64(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Index of the first bitwise difference of two float arrays, or -1. */
static int64_t first_float_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!same_bits(a[i], b[i])) return (int64_t)i;
    return -1;
}

/* ---- tables ---- */

static void test_tables(void) {
    size_t n = 0;
    float *code = h5_get("/tables/nf4_code", H5T_NATIVE_FLOAT, 4, &n);
    CHECK(code && n == 16, "nf4_code: %zu values", n);
    if (code && n == 16) {
        int64_t d = first_float_diff(code, GM_NF4_CODE, 16);
        CHECK(d < 0, "GM_NF4_CODE[%lld] = %.9g, bitsandbytes %.9g", (long long)d, d < 0 ? 0.0 : (double)GM_NF4_CODE[d],
              d < 0 ? 0.0 : (double)code[d]);
    }
    float *dyn = h5_get("/tables/dynamic_map", H5T_NATIVE_FLOAT, 4, &n);
    CHECK(dyn && n == 256, "dynamic_map: %zu values", n);
    if (dyn && n == 256) {
        int64_t d = first_float_diff(dyn, GM_DYNAMIC_MAP_SIGNED, 256);
        CHECK(d < 0, "GM_DYNAMIC_MAP_SIGNED[%lld] = %.9g, bitsandbytes %.9g", (long long)d,
              d < 0 ? 0.0 : (double)GM_DYNAMIC_MAP_SIGNED[d], d < 0 ? 0.0 : (double)dyn[d]);
        bool sorted = true;
        for (int i = 0; i < 255; i++) sorted = sorted && dyn[i] < dyn[i + 1];
        CHECK(sorted, "the dynamic map must be strictly increasing (the code table assumes it)");
    }
    gm_free(code), gm_free(dyn);
}

/* ---- NF4 against bitsandbytes ---- */

static const char *const TENSORS[] = {"n64",  "n4096", "n16448", "w640x1024", "n1000",     "n999", "n100",
                                      "n10",  "outliers", "zero_blocks", "tail_zero", "ties"};

static void test_nf4_tensor(const char *name) {
    char g[128], p[192];
    snprintf(g, sizeof g, "/tensors/%s", name);
    int64_t n = (int64_t)attr(g, "n");
    if (n <= 0) return;
    size_t cnt = 0;
    float *x = NULL;
    snprintf(p, sizeof p, "%s/x", g);
    if (gm_test_h5_exists(REF, p)) {
        x = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
        CHECK(x && (int64_t)cnt == n, "%s: x has %zu values, n = %lld", name, cnt, (long long)n);
        if (!x || (int64_t)cnt != n) {
            gm_free(x);
            return;
        }
    } else {
        x = gm_malloc((size_t)n * 4);
        gen_bell((uint64_t)attr(g, "seed"), n, (float)attr(g, "scale"), x);
    }
    gm_nf4_sizes sz = gm_nf4_sizes_of(n);
    CHECK(sz.packed_bytes == (size_t)(n + 1) / 2 && sz.n_blocks == (n + 63) / 64 &&
              sz.n_groups == (sz.n_blocks + 255) / 256, "%s: sizes", name);
    uint8_t *packed = gm_malloc(sz.packed_bytes), *codes = gm_malloc((size_t)sz.n_blocks);
    float *absmax2 = gm_malloc((size_t)sz.n_groups * 4), *absmax = gm_malloc((size_t)sz.n_blocks * 4);
    float offset = 0;
    gm_nf4_quantize(x, n, packed, codes, absmax2, &offset, absmax, 2);

    /* the same with 1 and 3 threads: identical bytes */
    {
        uint8_t *p1 = gm_malloc(sz.packed_bytes), *c1 = gm_malloc((size_t)sz.n_blocks);
        float *a21 = gm_malloc((size_t)sz.n_groups * 4), *a1 = gm_malloc((size_t)sz.n_blocks * 4), off1 = 0;
        for (int t = 1; t <= 3; t += 2) {
            gm_nf4_quantize(x, n, p1, c1, a21, &off1, a1, t);
            CHECK(memcmp(p1, packed, sz.packed_bytes) == 0 && memcmp(c1, codes, (size_t)sz.n_blocks) == 0 &&
                      memcmp(a21, absmax2, (size_t)sz.n_groups * 4) == 0 && same_bits(off1, offset),
                  "%s: result depends on the thread count (%d)", name, t);
        }
        gm_free(p1), gm_free(c1), gm_free(a21), gm_free(a1);
    }

    /* packed nibbles: in full, or the first 4096 bytes, plus the checksum of all */
    snprintf(p, sizeof p, "%s/packed", g);
    int32_t *ref_pk = h5_get(p, H5T_NATIVE_INT32, 4, &cnt);
    if (ref_pk) {
        CHECK(cnt == sz.packed_bytes || cnt == 4096, "%s: packed has %zu bytes", name, cnt);
        int64_t d = -1;
        for (size_t i = 0; i < cnt && i < sz.packed_bytes && d < 0; i++)
            if (packed[i] != (uint8_t)ref_pk[i]) d = (int64_t)i;
        CHECK(d < 0, "%s: packed byte %lld: ours 0x%02x, bitsandbytes 0x%02x (x[%lld] = %.9g, x[%lld] = %.9g)", name,
              (long long)d, d < 0 ? 0 : packed[d], d < 0 ? 0 : (unsigned)ref_pk[d], (long long)(2 * d),
              d < 0 ? 0.0 : (double)x[2 * d], (long long)(2 * d + 1),
              d < 0 || 2 * d + 1 >= n ? 0.0 : (double)x[2 * d + 1]);
    }
    gm_free(ref_pk);
    snprintf(p, sizeof p, "%s/packed_fnv", g);
    uint64_t *fnv = h5_get(p, H5T_NATIVE_UINT64, 8, &cnt);
    if (fnv) CHECK(fnv1a64(packed, sz.packed_bytes) == fnv[0], "%s: packed checksum differs from bitsandbytes", name);
    gm_free(fnv);

    /* first-level absmax (small tensors) */
    snprintf(p, sizeof p, "%s/absmax", g);
    if (gm_test_h5_exists(REF, p)) {
        float *ra = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
        if (ra) {
            int64_t d = (int64_t)cnt == sz.n_blocks ? first_float_diff(absmax, ra, cnt) : 0;
            CHECK(d < 0, "%s: first-level absmax[%lld] ours %.9g, bitsandbytes %.9g", name, (long long)d,
                  d < 0 ? 0.0 : (double)absmax[d], d < 0 ? 0.0 : (double)ra[d]);
        }
        gm_free(ra);
    }

    /* nested statistics */
    snprintf(p, sizeof p, "%s/offset", g);
    float *roff = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
    if (roff) CHECK(same_bits(offset, roff[0]), "%s: offset ours %.9g, bitsandbytes %.9g", name, (double)offset, (double)roff[0]);
    gm_free(roff);
    snprintf(p, sizeof p, "%s/absmax2", g);
    float *ra2 = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
    if (ra2) {
        int64_t d = (int64_t)cnt == sz.n_groups ? first_float_diff(absmax2, ra2, cnt) : 0;
        CHECK(d < 0, "%s: absmax2[%lld] ours %.9g, bitsandbytes %.9g", name, (long long)d, d < 0 ? 0.0 : (double)absmax2[d],
              d < 0 ? 0.0 : (double)ra2[d]);
    }
    gm_free(ra2);
    snprintf(p, sizeof p, "%s/absmax_code", g);
    int32_t *rc = h5_get(p, H5T_NATIVE_INT32, 4, &cnt);
    if (rc) {
        int64_t d = (int64_t)cnt == sz.n_blocks ? -1 : 0;
        for (size_t i = 0; i < cnt && d < 0; i++)
            if (codes[i] != (uint8_t)rc[i]) d = (int64_t)i;
        CHECK(d < 0, "%s: absmax_code[%lld] ours %d, bitsandbytes %d (absmax %.9g)", name, (long long)d, d < 0 ? 0 : codes[d],
              d < 0 ? 0 : rc[d], d < 0 ? 0.0 : (double)absmax[d]);
    }
    gm_free(rc);

    /* reconstructed absmax */
    snprintf(p, sizeof p, "%s/absmax_deq", g);
    if (gm_test_h5_exists(REF, p)) {
        float *rd = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
        if (rd && (int64_t)cnt == sz.n_blocks) {
            int64_t d = -1;
            for (int64_t b = 0; b < sz.n_blocks && d < 0; b++) {
                float A = GM_DYNAMIC_MAP_SIGNED[codes[b]] * absmax2[b / 256];
                A = A + offset;
                if (!same_bits(A, rd[b])) d = b;
            }
            CHECK(d < 0, "%s: reconstructed absmax[%lld] differs from bitsandbytes %.9g", name, (long long)d,
                  d < 0 ? 0.0 : (double)rd[d]);
        }
        gm_free(rd);
    }

    /* dequantization: ours, the kernels', bitsandbytes' */
    float *deq = gm_malloc((size_t)n * 4), *kdeq = gm_malloc((size_t)n * 4);
    gm_nf4_dequantize(packed, codes, absmax2, offset, n, deq);
    gm_wview w = {GM_NF4, packed, sz.packed_bytes, 1, n, codes, absmax2, offset, NULL};
    gm_dequant_wrow(&w, 0, kdeq);
    int64_t d = first_float_diff(deq, kdeq, (size_t)n);
    CHECK(d < 0, "%s: gm_nf4_dequantize[%lld] %.9g vs gm_dequant_wrow %.9g", name, (long long)d, d < 0 ? 0.0 : (double)deq[d],
          d < 0 ? 0.0 : (double)kdeq[d]);
    /* the same tensor viewed as rows that cross block boundaries (row starts on odd elements) */
    for (int64_t K = 125; K <= 1000; K += 875) {
        if (n % K != 0) continue;
        gm_wview w2 = {GM_NF4, packed, (size_t)K / 2, n / K, K, codes, absmax2, offset, NULL};
        bool ok = true;
        for (int64_t r = 0; r < n / K; r++) {
            gm_dequant_wrow(&w2, r, kdeq + r * K);
        }
        ok = first_float_diff(deq, kdeq, (size_t)n) < 0;
        CHECK(ok, "%s: gm_dequant_wrow over (%lld, %lld) rows differs from the flat dequantization", name,
              (long long)(n / K), (long long)K);
    }
    snprintf(p, sizeof p, "%s/deq", g);
    if (gm_test_h5_exists(REF, p)) {
        float *rdq = h5_get(p, H5T_NATIVE_FLOAT, 4, &cnt);
        if (rdq) {
            d = (int64_t)cnt == n ? first_float_diff(deq, rdq, cnt) : 0;
            CHECK(d < 0, "%s: dequantized[%lld] ours %.9g, bitsandbytes %.9g (x %.9g)", name, (long long)d,
                  d < 0 ? 0.0 : (double)deq[d], d < 0 ? 0.0 : (double)rdq[d], d < 0 ? 0.0 : (double)x[d]);
        }
        gm_free(rdq);
    }
    snprintf(p, sizeof p, "%s/deq_fnv", g);
    fnv = h5_get(p, H5T_NATIVE_UINT64, 8, &cnt);
    if (fnv) CHECK(fnv1a64(deq, (size_t)n * 4) == fnv[0], "%s: dequantized checksum differs from bitsandbytes", name);
    gm_free(fnv);

    /* the error bound of test_util.h holds against the input */
    double worst = 0;
    for (int64_t e = 0; e < n; e++) {
        double A = absmax[e / 64], bound = TOL_QUANT_NF4_CODE * A + TOL_QUANT_NF4_ABSMAX2 * absmax2[e / 64 / 256];
        double r = bound > 0 ? fabs((double)x[e] - deq[e]) / bound : (x[e] == deq[e] ? 0 : 2);
        if (r > worst) worst = r;
    }
    CHECK(worst <= 1.0, "%s: NF4 error reaches %.3f of its bound", name, worst);
    printf("nf4 %-12s n=%-7lld blocks=%-6lld offset=%.9g  bit-exact; worst error %.2f of bound\n", name, (long long)n,
           (long long)sz.n_blocks, (double)offset, worst);
    gm_free(x), gm_free(packed), gm_free(codes), gm_free(absmax2), gm_free(absmax), gm_free(deq), gm_free(kdeq);
}

/* ---- torch.mean ---- */

static void test_mean(void) {
    size_t nl = 0, ns = 0, nv = 0;
    int64_t *len = h5_get("/mean/lengths", H5T_NATIVE_INT64, 8, &nl);
    int64_t *seed = h5_get("/mean/seeds", H5T_NATIVE_INT64, 8, &ns);
    float *val = h5_get("/mean/values", H5T_NATIVE_FLOAT, 4, &nv);
    if (len && seed && val && nl == ns && nl == nv) {
        int bad = 0, dbl_ok = 0;
        for (size_t i = 0; i < nl; i++) {
            int64_t n = len[i];
            float *v = gm_malloc((size_t)n * 4);
            double ds = 0;
            for (int64_t k = 0; k < n; k++) {
                float a = gen_uniform((uint64_t)seed[i], (uint64_t)k);
                float u = (a + 1.0f) * 0.5f;
                v[k] = u * u * 0.125f;
                ds += v[k];
            }
            float m = gm_nf4_torch_mean(v, n);
            if (!same_bits(m, val[i])) {
                if (bad++ < 5) CHECK(0, "torch.mean of %lld values: ours %.9g, torch %.9g", (long long)n, (double)m, (double)val[i]);
            } else {
                gm_test_passed++;
            }
            dbl_ok += same_bits((float)(ds / (double)n), val[i]);
            gm_free(v);
        }
        printf("torch.mean emulation: %zu lengths (1 .. %lld), %d mismatches; rounding a double sum would match %d\n", nl,
               (long long)len[nl - 1], bad, dbl_ok);
    } else {
        CHECK(0, "mean references missing or inconsistent");
    }
    gm_free(len), gm_free(seed), gm_free(val);
}

/* ---- int8 ---- */

static void test_int8(void) {
    enum { R = 37, K = 300 };
    float *x = gm_malloc(R * K * 4);
    int8_t *q = gm_malloc(R * K);
    float *s = gm_malloc(R * 4), *row = gm_malloc(K * 4);
    uint64_t st = 12345;
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) x[r * K + k] = gm_test_rand(&st) * (float)(r + 1) * 0.01f;
    for (int k = 0; k < K; k++) x[5 * K + k] = 0.0f;       /* a zero row */
    x[7 * K + 3] = 50.0f;                                   /* an outlier dominating its row */
    x[9 * K + 0] = -x[9 * K + 0] - 10.0f;                   /* a negative absmax */
    gm_int8_quantize(x, R, K, q, s, 2);
    gm_wview w = {GM_I8, q, K, R, K, NULL, NULL, 0.0f, s};
    double worst = 0;
    bool has127 = true, zero_ok = true, view_ok = true;
    for (int r = 0; r < R; r++) {
        gm_dequant_wrow(&w, r, row);
        int qmax = 0;
        for (int k = 0; k < K; k++) {
            int a = q[r * K + k] < 0 ? -q[r * K + k] : q[r * K + k];
            qmax = a > qmax ? a : qmax;
            view_ok = view_ok && same_bits(row[k], (float)q[r * K + k] * s[r]);
            if (s[r] > 0) {
                double e = fabs((double)x[r * K + k] - (double)row[k]) / s[r];
                if (e > worst) worst = e;
            }
        }
        if (r == 5) zero_ok = s[r] == 0.0f && qmax == 0;
        else has127 = has127 && qmax == 127;
    }
    CHECK(worst <= TOL_QUANT_INT8_STEPS, "int8: error reaches %.5f steps", worst);
    CHECK(has127, "int8: every non-zero row must use the full range (max |q| = 127)");
    CHECK(zero_ok, "int8: a zero row gives zero codes and scale 0");
    CHECK(view_ok, "int8: the GM_I8 view decodes q * row_scale");
    CHECK(q[9 * K] == -127, "int8: negative absmax -> -127 (got %d)", q[9 * K]);
    /* rounding: half to even, computed as x * ((1/a) * 127) */
    float t[4] = {1.0f, 0.5f / 127.0f, 1.5f / 127.0f, -2.5f / 127.0f};
    int8_t tq[4];
    float ts;
    gm_int8_quantize(t, 1, 4, tq, &ts, 1);
    float mul = (1.0f / 1.0f) * 127.0f;
    CHECK(tq[0] == 127 && tq[1] == (int8_t)rintf(t[1] * mul) && tq[2] == (int8_t)rintf(t[2] * mul) &&
              tq[3] == (int8_t)rintf(t[3] * mul),
          "int8 rounding: %d %d %d %d", tq[0], tq[1], tq[2], tq[3]);
    printf("int8: worst error %.4f of a step (bound %.4f)\n", worst, TOL_QUANT_INT8_STEPS);
    gm_free(x), gm_free(q), gm_free(s), gm_free(row);
}

/* A stack of expert matrices cut by rows (kernels.h gm_wview_rows: Gemma 4's experts): E = 3
 * matrices of 128 x 128 (each GM_NF4_ROWS_ALIGN elements) quantized as one NF4 tensor; expert e's
 * view decodes its rows bit for bit as the whole tensor does (data, block absmax codes and the
 * double-quantized groups all offset), and likewise an int8 stack's rows (row scales offset). */
static void test_stack_rows(void) {
    enum { E = 3, R = 128, K = 128 };
    gm_wview f = {0}, q = {0};
    float *x = gm_malloc(E * R * K * 4), *a = gm_malloc(K * 4), *b = gm_malloc(K * 4);
    uint64_t st = 99;
    for (int i = 0; i < E * R * K; i++) x[i] = gm_test_rand(&st) * (1.0f + (float)(i / (R * K)));
    f = gm_wview_f32(x, E * R, K);
    for (int qi = 0; qi < 2; qi++) {
        gm_quant fmt = qi ? GM_QUANT_INT8 : GM_QUANT_NF4;
        gm_arena ar;
        gm_error err = {0};
        gm_arena_init(&ar, "stack", GM_DEVICE_CPU);
        gm_quant_reserve(fmt, E * R, K, &ar, &q);
        CHECK_OK(gm_arena_commit(&ar, &err), &err);
        gm_quant_reserve(fmt, E * R, K, &ar, &q);
        gm_quant_work work;
        gm_quant_work_init(&work, fmt, 1);
        gm_quant_work_size(&work, E * R, K);
        CHECK_OK(gm_quant_work_alloc(&work, &err), &err);
        gm_quant_encode(&f, &q, &work);
        bool same = true;
        for (int e = 0; e < E; e++) {
            gm_wview v = gm_wview_rows(&q, (int64_t)e * R, R);
            for (int r = 0; r < R; r += 17) {
                gm_dequant_wrow(&v, r, a);
                gm_dequant_wrow(&q, (int64_t)e * R + r, b);
                same = same && memcmp(a, b, K * 4) == 0;
            }
        }
        CHECK(same, "%s stack: an expert's rows decode as the whole tensor's", qi ? "int8" : "nf4");
        gm_quant_work_free(&work);
        gm_arena_free(&ar);
    }
    gm_free(x), gm_free(a), gm_free(b);
}

/* ---- names ---- */

static void test_names(void) {
    gm_error err = {0};
    gm_quant q = GM_QUANT_COUNT;
    const char *names[] = {"stored", "f32", "bf16", "nf4", "int8"};
    for (int i = 0; i < GM_QUANT_COUNT; i++) {
        CHECK_OK(gm_quant_from_name(names[i], &q, &err), &err);
        CHECK(q == (gm_quant)i && strcmp(gm_quant_name(q), names[i]) == 0, "%s round trip", names[i]);
    }
    CHECK_OK(gm_quant_from_name("gguf", &q, &err), &err);
    CHECK(q == GM_QUANT_STORED, "gguf means stored");
    gm_status s = gm_quant_from_name("nf5", &q, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "'nf5'") && strstr(err.msg, "nf4") && strstr(err.msg, "int8") &&
              strstr(err.msg, "gguf"),
          "bad name: %s", err.msg);
    s = gm_quant_from_name(NULL, &q, &err);
    CHECK(s == GM_ERR_INVALID, "NULL name");
    CHECK(strcmp(gm_quant_name(GM_QUANT_COUNT), "?") == 0, "out-of-range name");
}

/* ---- gm_quant_layout on the tiny model ---- */

/* Per-element bound of format q for weight row r of original view src and encoded view v. */
static double elem_bound(gm_quant q, const gm_wview *v, int64_t r, int64_t k, float w) {
    switch (q) {
    case GM_QUANT_BF16: return TOL_QUANT_BF16_REL * fabs(w);
    case GM_QUANT_INT8: return TOL_QUANT_INT8_STEPS * v->row_scale[r];
    case GM_QUANT_NF4: return 0; /* computed by the caller from the block absmax */
    default: return 0;
    }
    (void)k;
}

/* Builds m's weights in format q on a host arena (both passes); returns the arena bytes. */
static size_t build_weights(const gm_model *m, gm_quant q, int threads, gm_backend *be, gm_weights *w, gm_arena *a) {
    gm_error err = {0};
    CHECK_OK(gm_weights_init(w, &m->cfg, q, &err), &err);
    if (be) gm_backend_arena(be, a, "quant-test");
    else gm_arena_init(a, "quant-test", GM_DEVICE_CPU);
    CHECK_OK(gm_weights_layout(w, m, GM_F32, GM_F32, be, a, threads, &err), &err);
    size_t measured = a->used;
    CHECK_OK(gm_arena_commit(a, &err), &err);
    CHECK_OK(gm_weights_layout(w, m, GM_F32, GM_F32, be, a, threads, &err), &err);
    CHECK(a->used == measured, "%s: the committed pass used %zu bytes, measured %zu", gm_quant_name(q), a->used, measured);
    return measured;
}

static size_t align64(size_t b) { return (b + 63) / 64 * 64; }

static void test_layout_tiny(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), &mo, &m, &err), &err);
    if (!m) return;
    const gm_config *cfg = &m->cfg;
    const gm_arch_def *ar = m->arch;
    const int64_t L = cfg->n_layers;
    const size_t MAXW = 1 << 20; /* floats: far above the tiny model's largest linear (128 x 64) */
    float *worig = gm_malloc(MAXW * 4), *wq = gm_malloc(MAXW * 4), *absmax = gm_malloc(MAXW / 64 * 4);

    for (int qi = 0; qi < GM_QUANT_COUNT; qi++) {
        gm_quant q = (gm_quant)qi;
        gm_weights v, v1, plan;
        gm_arena a, a1, pa;
        size_t measured = build_weights(m, q, 2, NULL, &v, &a);
        /* the plan from the config alone reserves the same bytes */
        CHECK_OK(gm_weights_init(&plan, cfg, q, &err), &err);
        gm_arena_init(&pa, "plan", GM_DEVICE_CPU);
        CHECK_OK(gm_weights_layout(&plan, NULL, GM_F32, GM_F32, NULL, &pa, 2, &err), &err);
        CHECK(pa.used == measured && v.alias_bytes == plan.alias_bytes, "%s: built %zu / %zu aliased bytes, planned %zu / %zu",
              gm_quant_name(q), measured, v.alias_bytes, pa.used, plan.alias_bytes);
        gm_weights_free(&plan);
        const gm_wview emb = gm_wview_of(&m->global[GM_GLOBAL_EMBED]);
        CHECK(memcmp(&v.global[GM_GLOBAL_EMBED], &emb, sizeof emb) == 0 &&
                  memcmp(&v.global[GM_GLOBAL_LM_HEAD], &emb, sizeof emb) == 0,
              "%s: embedding / LM head must be the model's views", gm_quant_name(q));

        /* a second build with 1 thread: identical bytes */
        build_weights(m, q, 1, NULL, &v1, &a1);

        double worst_w = 0, worst_mm = 0;
        bool types_ok = true, det_ok = true, nf4_exact = true;
        size_t by_hand = 0;
        uint64_t st = 99;
        for (int64_t l = 0; l < L; l++)
            for (int wi = 0; wi < ar->n_layer; wi++) {
                if (ar->layer[wi].kind != GM_W_LINEAR) continue;
                const gm_wview srcv = gm_wview_of(gm_model_weight(m, l, wi));
                const gm_wview *src = &srcv, *dst = gm_weights_at(&v, l, wi), *d1 = gm_weights_at(&v1, l, wi);
                int64_t N = src->rows, K = src->cols;
                gm_dtype want_t = q == GM_QUANT_STORED || q == GM_QUANT_F32 ? GM_F32
                                  : q == GM_QUANT_BF16                     ? GM_BF16
                                  : q == GM_QUANT_NF4                      ? GM_NF4
                                                                           : GM_I8;
                types_ok = types_ok && dst->type == want_t && dst->rows == N && dst->cols == K;
                if (gm_quant_is_alias(q, GM_F32)) types_ok = types_ok && dst->data == src->data;
                size_t nk = (size_t)(N * K);
                gm_nf4_sizes ns = gm_nf4_sizes_of(N * K);
                by_hand += q == GM_QUANT_BF16   ? align64(2 * nk)
                           : q == GM_QUANT_INT8 ? align64(nk) + align64((size_t)N * 4)
                           : q == GM_QUANT_NF4  ? align64(ns.packed_bytes) + align64((size_t)ns.n_blocks) + align64((size_t)ns.n_groups * 4)
                                                : 0;
                for (int64_t r = 0; r < N; r++) gm_dequant_wrow(src, r, worig + r * K);
                for (int64_t r = 0; r < N; r++) gm_dequant_wrow(dst, r, wq + r * K);
                /* thread independence */
                {
                    size_t nb = q == GM_QUANT_NF4 ? gm_nf4_sizes_of(N * K).packed_bytes
                                : q == GM_QUANT_INT8 ? (size_t)(N * K)
                                : q == GM_QUANT_BF16 ? (size_t)(N * K) * 2
                                                     : (size_t)(N * K) * 4;
                    bool same = memcmp(dst->data, d1->data, nb) == 0;
                    if (q == GM_QUANT_NF4)
                        same = same && memcmp(dst->absmax_code, d1->absmax_code, (size_t)(N * K / 64)) == 0 &&
                               memcmp(dst->absmax2, d1->absmax2, (size_t)gm_nf4_sizes_of(N * K).n_groups * 4) == 0 &&
                               same_bits(dst->absmax_offset, d1->absmax_offset);
                    if (q == GM_QUANT_INT8) same = same && memcmp(dst->row_scale, d1->row_scale, (size_t)N * 4) == 0;
                    det_ok = det_ok && same;
                }
                /* NF4: equal to gm_nf4_quantize of the flattened matrix (the bnb-exact path) */
                if (q == GM_QUANT_NF4) {
                    gm_nf4_sizes sz = gm_nf4_sizes_of(N * K);
                    uint8_t *pk = gm_malloc(sz.packed_bytes), *cd = gm_malloc((size_t)sz.n_blocks);
                    float *a2 = gm_malloc((size_t)sz.n_groups * 4), off = 0;
                    gm_nf4_quantize(worig, N * K, pk, cd, a2, &off, absmax, 1);
                    nf4_exact = nf4_exact && memcmp(pk, dst->data, sz.packed_bytes) == 0 &&
                                memcmp(cd, dst->absmax_code, (size_t)sz.n_blocks) == 0 &&
                                memcmp(a2, dst->absmax2, (size_t)sz.n_groups * 4) == 0 && same_bits(off, dst->absmax_offset);
                    gm_free(pk), gm_free(cd), gm_free(a2);
                }
                /* per-element bound */
                for (int64_t e = 0; e < N * K; e++) {
                    int64_t r = e / K, k = e % K;
                    double b = q == GM_QUANT_NF4
                                   ? TOL_QUANT_NF4_CODE * absmax[e / 64] + TOL_QUANT_NF4_ABSMAX2 * dst->absmax2[e / 64 / 256]
                                   : elem_bound(q, dst, r, k, worig[e]);
                    double err_e = fabs((double)worig[e] - wq[e]);
                    double ratio = b > 0 ? err_e / b : (err_e == 0 ? 0 : 1e9);
                    if (ratio > worst_w) worst_w = ratio;
                }
                /* matmul through the view, M = 8 (panel path) and M = 3 (row-by-row path) */
                for (int64_t M = 3; M <= 8; M += 5) {
                    float *x = gm_malloc((size_t)(M * K) * 4), *y = gm_malloc((size_t)(M * N) * 4);
                    for (int64_t i = 0; i < M * K; i++) x[i] = gm_test_rand(&st);
                    size_t sf = gm_k_matmul_scratch_floats(dst->type, N, K, 2);
                    float *scratch = gm_malloc((sf ? sf : 1) * 4);
                    gm_kctx ctx = {.n_threads = 2, .scratch = scratch, .scratch_floats = sf};
                    gm_k_matmul_fwd_cpu(&ctx, y, x, dst, M, 0.0f);
                    for (int64_t mi = 0; mi < M; mi++)
                        for (int64_t n = 0; n < N; n++) {
                            double ref = 0, bound = 0, mag = 0;
                            for (int64_t k = 0; k < K; k++) {
                                int64_t e = n * K + k;
                                double xv = x[mi * K + k];
                                ref += xv * worig[e];
                                double b = q == GM_QUANT_NF4 ? TOL_QUANT_NF4_CODE * absmax[e / 64] +
                                                                    TOL_QUANT_NF4_ABSMAX2 * dst->absmax2[e / 64 / 256]
                                                              : elem_bound(q, dst, n, k, worig[e]);
                                bound += fabs(xv) * b;
                                mag += fabs(xv) * (fabs(worig[e]) + b);
                            }
                            bound += TOL_KERNEL_F32_REL * mag + 1e-7;
                            double r = fabs(y[mi * N + n] - ref) / bound;
                            if (r > worst_mm) worst_mm = r;
                        }
                    gm_free(x), gm_free(y), gm_free(scratch);
                }
            }
        CHECK(types_ok, "%s: view types/shapes (or aliasing) wrong", gm_quant_name(q));
        CHECK(det_ok, "%s: bytes depend on the thread count", gm_quant_name(q));
        CHECK(nf4_exact, "%s: layout differs from gm_nf4_quantize of the flattened matrix", gm_quant_name(q));
        CHECK(measured == by_hand, "%s: %zu arena bytes, by hand %zu", gm_quant_name(q), measured, by_hand);
        CHECK(worst_w <= 1.0, "%s: weight error reaches %.3f of its bound", gm_quant_name(q), worst_w);
        CHECK(worst_mm <= 1.0, "%s: matmul error reaches %.3f of its bound", gm_quant_name(q), worst_mm);
        printf("layout %-6s (tiny): %8zu arena bytes; worst weight error %.3f, matmul %.3f of bound\n", gm_quant_name(q),
               measured, worst_w, worst_mm);

        /* on a backend the host cannot address, every weight is uploaded: same bytes, read back */
        gm_backend *sb = NULL;
        CHECK_OK(gm_backend_strict_new(2, &sb, &err), &err);
        gm_weights vs;
        gm_arena as;
        build_weights(m, q, 2, sb, &vs, &as);
        bool same_up = true;
        for (int64_t l = 0; l < L; l++)
            for (int wi = 0; wi < ar->n_layer; wi++) {
                const gm_wview *h = gm_weights_at(&v, l, wi), *d = gm_weights_at(&vs, l, wi);
                size_t nb = h->type == GM_NF4 ? gm_nf4_sizes_of(h->rows * h->cols).packed_bytes : (size_t)h->rows * h->row_bytes;
                uint8_t *tmp = gm_malloc(nb);
                gm_backend_download(sb, tmp, d->data, nb);
                same_up = same_up && d->type == h->type && d->data != h->data && memcmp(tmp, h->data, nb) == 0;
                gm_free(tmp);
            }
        CHECK(same_up, "%s: weights uploaded to the strict backend differ from the host build", gm_quant_name(q));
        gm_arena_free(&as);
        gm_weights_free(&vs);
        gm_backend_free(sb);

        gm_arena_free(&a);
        gm_arena_free(&a1);
        gm_arena_free(&pa);
        gm_weights_free(&v);
        gm_weights_free(&v1);
    }

    /* failures */
    gm_weights v;
    gm_status s = gm_weights_init(&v, cfg, GM_QUANT_COUNT, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "nf4"), "invalid format: %s", err.msg);
    gm_free(worig), gm_free(wq), gm_free(absmax);
    gm_model_free(m);
}

/* The bf16 tiny model: bf16 aliases, f32 is an exact widening, nf4 matches gm_nf4_quantize. */
static void test_layout_bf16_model(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3_legacy"), &mo, &m, &err), &err);
    if (!m) return;
    int down = gm_arch_slot(m->arch, "mlp.down_proj.weight");
    const gm_wview srcv = gm_wview_of(gm_model_weight(m, 1, down)), *src = &srcv;
    CHECK(src->type == GM_BF16, "the legacy tiny model stores bf16 (got %s)", gm_dtype_name(src->type));
    const gm_quant qs[] = {GM_QUANT_BF16, GM_QUANT_F32, GM_QUANT_NF4};
    for (int i = 0; i < 3; i++) {
        gm_arena a;
        gm_weights v;
        size_t used = build_weights(m, qs[i], 2, NULL, &v, &a);
        CHECK(gm_quant_is_alias(qs[i], GM_BF16) == (used == 0), "bf16 model, %s: %zu arena bytes", gm_quant_name(qs[i]), used);
        const gm_wview *d = gm_weights_at(&v, 1, down);
        int64_t N = src->rows, K = src->cols;
        float *w = gm_malloc((size_t)(N * K) * 4), *wq = gm_malloc((size_t)(N * K) * 4);
        for (int64_t r = 0; r < N; r++) gm_dequant_wrow(src, r, w + r * K), gm_dequant_wrow(d, r, wq + r * K);
        if (qs[i] == GM_QUANT_BF16) {
            CHECK(d->data == src->data, "bf16 of a bf16 model aliases the model's weights");
        } else if (qs[i] == GM_QUANT_F32) {
            CHECK(d->type == GM_F32 && first_float_diff(w, wq, (size_t)(N * K)) < 0, "f32 of bf16 is exact");
        } else {
            gm_nf4_sizes sz = gm_nf4_sizes_of(N * K);
            uint8_t *pk = gm_malloc(sz.packed_bytes), *cd = gm_malloc((size_t)sz.n_blocks);
            float *a2 = gm_malloc((size_t)sz.n_groups * 4), *am = gm_malloc((size_t)sz.n_blocks * 4), off = 0;
            gm_nf4_quantize(w, N * K, pk, cd, a2, &off, am, 1);
            CHECK(memcmp(pk, d->data, sz.packed_bytes) == 0 && memcmp(cd, d->absmax_code, (size_t)sz.n_blocks) == 0 &&
                      same_bits(off, d->absmax_offset),
                  "nf4 of a bf16 model equals gm_nf4_quantize of the widened matrix");
            gm_free(pk), gm_free(cd), gm_free(a2), gm_free(am);
        }
        gm_free(w), gm_free(wq);
        gm_arena_free(&a);
        gm_weights_free(&v);
    }
    gm_model_free(m);
}

/* The NF4 bytes training uses (gm_weights_layout with quant nf4, the trainer's path) for every
 * linear of the tiny model that the PEFT fixture was made from, against what bitsandbytes put in
 * its Linear4bit modules there (tests/ref/lora_ref.h5:/nf4/quant/<module>/: packed nibbles,
 * 8-bit absmax codes, nested absmax2, offset), byte for byte. */
static void test_nf4_model_vs_bnb(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    CHECK_OK(gm_model_load(gm_test_path(GM_TEST_LORA_MODEL), &mo, &m, &err), &err);
    if (!m) return;
    char lref[1024];
    snprintf(lref, sizeof lref, "%s", gm_test_path("tests/ref/lora_ref.h5"));
    gm_weights w;
    gm_arena a;
    build_weights(m, GM_QUANT_NF4, 2, NULL, &w, &a);
    const gm_arch_def *ar = m->arch;
    int n_linear = 0, n_equal = 0;
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int wi = 0; wi < ar->n_layer; wi++) {
            if (ar->layer[wi].kind != GM_W_LINEAR) continue;
            const gm_wview *q = gm_weights_at(&w, l, wi);
            char mod[256], ds[320];
            size_t hl = strlen(ar->layer[wi].hf) - strlen(".weight");
            snprintf(mod, sizeof mod, "/nf4/quant/model.layers.%lld.%.*s", (long long)l, (int)hl, ar->layer[wi].hf);
            gm_nf4_sizes sz = gm_nf4_sizes_of(q->rows * q->cols);
            size_t n_pk, n_cd, n_a2, n_off;
            snprintf(ds, sizeof ds, "%s/packed", mod);
            int32_t *pk = gm_test_h5_read(lref, ds, 1, &n_pk, NULL, NULL);
            snprintf(ds, sizeof ds, "%s/absmax_code", mod);
            int32_t *cd = gm_test_h5_read(lref, ds, 1, &n_cd, NULL, NULL);
            snprintf(ds, sizeof ds, "%s/absmax2", mod);
            float *a2 = gm_test_h5_read(lref, ds, 0, &n_a2, NULL, NULL);
            snprintf(ds, sizeof ds, "%s/offset", mod);
            float *off = gm_test_h5_read(lref, ds, 0, &n_off, NULL, NULL);
            n_linear++;
            bool eq = pk && cd && a2 && off && q->type == GM_NF4 && n_pk == sz.packed_bytes &&
                      n_cd == (size_t)sz.n_blocks && n_a2 == (size_t)sz.n_groups && n_off == 1;
            const uint8_t *qp = q->data, *qc = q->absmax_code;
            for (size_t i = 0; eq && i < n_pk; i++) eq = qp[i] == (uint8_t)pk[i];
            for (size_t i = 0; eq && i < n_cd; i++) eq = qc[i] == (uint8_t)cd[i];
            for (size_t i = 0; eq && i < n_a2; i++) eq = same_bits(q->absmax2[i], a2[i]);
            eq = eq && same_bits(q->absmax_offset, off[0]);
            CHECK(eq, "%s: our NF4 bytes differ from bitsandbytes'", mod + 11);
            n_equal += eq;
            gm_free(pk), gm_free(cd), gm_free(a2), gm_free(off);
        }
    CHECK(n_linear == 42, "the tiny model has %d linears, expected 42", n_linear);
    printf("nf4: %d of %d linears of the tiny model byte-identical to bitsandbytes' Linear4bit (packed, absmax "
           "codes, absmax2, offset)\n", n_equal, n_linear);
    gm_weights_free(&w);
    gm_arena_free(&a);
    gm_model_free(m);
}

int main(void) {
    test_stack_rows();
    snprintf(REF, sizeof REF, "%s", gm_test_path("tests/ref/nf4_ref.h5"));
    test_nf4_model_vs_bnb();
    test_tables();
    for (size_t i = 0; i < sizeof TENSORS / sizeof TENSORS[0]; i++) test_nf4_tensor(TENSORS[i]);
    test_mean();
    test_int8();
    test_names();
    test_layout_tiny();
    test_layout_bf16_model();
    return gm_test_finish();
}
