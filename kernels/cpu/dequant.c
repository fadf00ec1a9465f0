/*
 * dequant.c - block-format dequantization to f32 (CPU reference).
 *
 * Layouts and formulas are formats.md §1.5 (ggml-common.h block structs,
 * ggml-quants.c dequantize_row_*), restated per format below. All scales d/dmin/m are IEEE
 * half unless noted; multi-byte fields are little-endian. Checked against ggml's own output
 * (formats.md §1.7 test vectors) in tests/unit/test_dequant.c.
 */
#include "kernels.h"
#include "nf4_tables.h"

#include "gm_status.h"
#include "gm_omp.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static inline float h2f(const uint8_t *p) { return gm_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Q8_0 (34 B / 32): d, qs[32] int8.  w = d * q */
GM_CPU_CLONES static void dq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int e = 0; e < 32; e++) y[e] = d * (float)q[e];
}

/* Q4_0 (18 B / 32): d, qs[16]. Element e<16 = low nibble of qs[e], e>=16 = high nibble of
 * qs[e-16]. w = d * (nibble - 8) */
GM_CPU_CLONES static void dq_q4_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int l = 0; l < 16; l++) {
        y[l] = d * (float)((qs[l] & 0xF) - 8);
        y[l + 16] = d * (float)((qs[l] >> 4) - 8);
    }
}

/* Q4_1 (20 B / 32): d, m, qs[16] (Q4_0 nibble placement). w = d * nibble + m */
static void dq_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int l = 0; l < 16; l++) {
        y[l] = d * (float)(qs[l] & 0xF) + m;
        y[l + 16] = d * (float)(qs[l] >> 4) + m;
    }
}

/* Q5_0 (22 B / 32): d, qh (u32 LE), qs[16]. q = nibble | (bit e of qh) << 4; w = d * (q - 16) */
GM_CPU_CLONES static void dq_q5_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    uint32_t qh = le32(b + 2);
    const uint8_t *qs = b + 6;
    for (int l = 0; l < 16; l++) {
        int lo = (qs[l] & 0xF) | (int)(((qh >> l) & 1u) << 4);
        int hi = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
        y[l] = d * (float)(lo - 16);
        y[l + 16] = d * (float)(hi - 16);
    }
}

/* Q5_1 (24 B / 32): d, m, qh, qs[16]. w = d * q + m */
static void dq_q5_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = le32(b + 4);
    const uint8_t *qs = b + 8;
    for (int l = 0; l < 16; l++) {
        int lo = (qs[l] & 0xF) | (int)(((qh >> l) & 1u) << 4);
        int hi = (qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
        y[l] = d * (float)lo + m;
        y[l + 16] = d * (float)hi + m;
    }
}

/* Q2_K (84 B / 256): scales[16], qs[64], d, dmin (d/dmin last). For element e: h = e/128,
 * k = (e%128)/32, l = e%32; q = (qs[32h+l] >> 2k) & 3; sc = scales[e/16];
 * w = d * (sc & 0xF) * q - dmin * (sc >> 4) */
static void dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *qs = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int q = (qs[32 * h + l] >> (2 * k)) & 3;
        int sc = scales[e / 16];
        y[e] = d * (float)(sc & 0xF) * (float)q - dmin * (float)(sc >> 4);
    }
}

/* Q3_K (110 B / 256): hmask[32], qs[64], scales[12], d. Low 2 bits as Q2_K; high bit =
 * hmask[e%32] bit e/32, q = low2 - (high ? 0 : 4). 6-bit scale of sub-block j = e/16:
 * low4 = j<8 ? scales[j]&0xF : scales[j-8]>>4; high2 = (scales[8 + j%4] >> 2(j/4)) & 3;
 * S = (low4 | high2<<4) - 32; w = d * S * q */
static void dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    float d = h2f(b + 108);
    int S[16];
    for (int j = 0; j < 16; j++) {
        int low4 = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
        int high2 = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        S[j] = (low4 | (high2 << 4)) - 32;
    }
    for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int low2 = (qs[32 * h + l] >> (2 * k)) & 3;
        int hb = (hmask[e % 32] >> (e / 32)) & 1;
        int q = low2 - (hb ? 0 : 4);
        y[e] = d * (float)S[e / 16] * (float)q;
    }
}

/* 6-bit scale/min packing shared by Q4_K and Q5_K (ggml get_scale_min_k4, formats.md §1.5). */
static void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The two sub-blocks of chunk c (elements 64c .. 64c+63) of a Q4_K / Q5_K block, whose 12 scale
 * bytes start at s: f[0] = d * S_2c, f[1] = dmin * M_2c, f[2] = d * S_2c+1, f[3] = dmin * M_2c+1. */
static inline void k4_chunk_scales(const uint8_t *s, int c, float d, float dmin, float f[4]) {
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * c, s, &sc0, &m0);
    scale_min_k4(2 * c + 1, s, &sc1, &m1);
    f[0] = d * (float)sc0, f[1] = dmin * (float)m0, f[2] = d * (float)sc1, f[3] = dmin * (float)m1;
}

/* Q4_K (144 B / 256): d, dmin, scales[12], qs[128]. Chunk c of 64 uses qs[32c..32c+31]:
 * element 64c+l (l<32) = low nibble, 64c+32+l = high nibble. Sub-block j = e/32.
 * w = d * S_j * q - dmin * M_j */
GM_CPU_CLONES static void dq_q4_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        float f[4];
        k4_chunk_scales(s, c, d, dmin, f);
        float d0 = f[0], mm0 = f[1], d1 = f[2], mm1 = f[3];
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d0 * (float)(qs[32 * c + l] & 0xF) - mm0;
            y[64 * c + 32 + l] = d1 * (float)(qs[32 * c + l] >> 4) - mm1;
        }
    }
}

/* Q5_K (176 B / 256): d, dmin, scales[12], qh[32], qs[128]. Nibbles as Q4_K; fifth bit of
 * element e = qh[e%32] bit e/32. w = d * S_j * q - dmin * M_j */
GM_CPU_CLONES static void dq_q5_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        float f[4];
        k4_chunk_scales(s, c, d, dmin, f);
        float d0 = f[0], mm0 = f[1], d1 = f[2], mm1 = f[3];
        for (int l = 0; l < 32; l++) {
            int e0 = 64 * c + l, e1 = 64 * c + 32 + l;
            int q0 = (qs[32 * c + l] & 0xF) + 16 * ((qh[e0 % 32] >> (e0 / 32)) & 1);
            int q1 = (qs[32 * c + l] >> 4) + 16 * ((qh[e1 % 32] >> (e1 / 32)) & 1);
            y[e0] = d0 * (float)q0 - mm0;
            y[e1] = d1 * (float)q1 - mm1;
        }
    }
}

/* Q6_K (210 B / 256): ql[128], qh[64], scales[16] int8, d. Element e: h = e/128, r = e%128,
 * k = r/32, l = r%32; low4 = nibble (k<2: low, else high) of ql[64h + l + 32(k&1)];
 * high2 = (qh[32h + l] >> 2k) & 3; q = (low4 | high2<<4) - 32; w = d * scales[e/16] * q */
/* The 6-bit value, minus 32, of element 128h + 32k + l of a Q6_K block (layout above). */
static inline int q6_k_q(const uint8_t *ql, const uint8_t *qh, int h, int k, int l) {
    uint8_t byte = ql[64 * h + l + 32 * (k & 1)];
    int low4 = k < 2 ? (byte & 0xF) : (byte >> 4);
    int high2 = (qh[32 * h + l] >> (2 * k)) & 3;
    return (low4 | (high2 << 4)) - 32;
}

GM_CPU_CLONES static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    /* e = 128h + 32k + l, looped so that l runs over 16 contiguous elements of one scale */
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int half = 0; half < 2; half++) {
                int e0 = 128 * h + 32 * k + 16 * half;
                float ds = d * (float)sc[e0 / 16]; /* (d * scale) * q: the order of the formula */
                for (int i = 0; i < 16; i++) y[e0 + i] = ds * (float)q6_k_q(ql, qh, h, k, 16 * half + i);
            }
}

void gm_dequant_row(gm_dtype type, const void *src, float *dst, int64_t n) {
    const uint8_t *b = (const uint8_t *)src;
    const gm_dtype_info *in = gm_dtype_get(type);
    switch (type) {
    case GM_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case GM_F16: {
        const uint16_t *h = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = gm_f16_to_f32(h[i]);
        return;
    }
    case GM_BF16: {
        const uint16_t *h = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = gm_bf16_to_f32(h[i]);
        return;
    }
    case GM_F64: {
        const double *h = (const double *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)h[i];
        return;
    }
    default: break;
    }
    GM_ASSERT(in->is_quantized && n % in->block_size == 0);
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (type) {
    case GM_Q4_0: fn = dq_q4_0; break;
    case GM_Q4_1: fn = dq_q4_1; break;
    case GM_Q5_0: fn = dq_q5_0; break;
    case GM_Q5_1: fn = dq_q5_1; break;
    case GM_Q8_0: fn = dq_q8_0; break;
    case GM_Q2_K: fn = dq_q2_k; break;
    case GM_Q3_K: fn = dq_q3_k; break;
    case GM_Q4_K: fn = dq_q4_k; break;
    case GM_Q5_K: fn = dq_q5_k; break;
    case GM_Q6_K: fn = dq_q6_k; break;
    default: GM_ASSERT(!"dtype has no dequantizer");
    }
    int64_t nb = n / in->block_size;
    for (int64_t i = 0; i < nb; i++) fn(b + i * in->type_size, dst + i * in->block_size);
}

/* NF4 row r of a (N, K) tensor: elements r*K .. r*K+K-1 of the flattened tensor. The block
 * absmax is decoded exactly as bitsandbytes dequantizes the nested statistics:
 * dynmap[code] * absmax2 (f32 multiply), then + offset; the weight is nf4[nibble] * absmax.
 * Two roundings, as in bnb (native multiply, then a separate torch add): the multiply-add must not
 * be contracted into an FMA, which GCC does under -ffp-contract=fast (its default for gnu11) as
 * soon as the target has FMA (-march=native, x86-64-v3) - then about 1 block in 200 is off by an ulp
 * (tests/unit/test_quant.c, found with -march=native). Hence the local contraction switch. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
static void dequant_nf4_row(const gm_wview *w, int64_t r, float *dst) {
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
    const uint8_t *packed = (const uint8_t *)w->data;
    int64_t K = w->cols, e0 = r * K;
    int64_t b_prev = -1;
    float absmax = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        int64_t e = e0 + k, b = e / 64;
        if (b != b_prev) {
            absmax = GM_DYNAMIC_MAP_SIGNED[w->absmax_code[b]] * w->absmax2[b / 256] + w->absmax_offset;
            b_prev = b;
        }
        uint8_t byte = packed[e / 2];
        int nib = (e & 1) ? (byte & 0xF) : (byte >> 4);
        dst[k] = GM_NF4_CODE[nib] * absmax;
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

void gm_dequant_wrow(const gm_wview *w, int64_t r, float *dst) {
    switch (w->type) {
    case GM_NF4: dequant_nf4_row(w, r, dst); return;
    case GM_I8: {
        const int8_t *q = (const int8_t *)w->data + (size_t)r * w->row_bytes;
        float s = w->row_scale[r];
        for (int64_t k = 0; k < w->cols; k++) dst[k] = (float)q[k] * s;
        return;
    }
    default: gm_dequant_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, dst, w->cols);
    }
}

/* Q8_0 row . x without the dequantized row in memory: w = d * q rounded as dq_q8_0 does, then
 * x * w summed in matmul.c's dot() order (gm_lanes_sum32: a block of 32 is one round of the 32
 * lanes). The AVX2 twin does the same operations 8 lanes at a time: the same bits. */
static float dot_q8_0(const uint8_t *row, const float *x, int64_t K) {
    float s[32] = {0};
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        float d = h2f(blk);
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int e = 0; e < 32; e++) s[e] += x[32 * b + e] * (d * (float)q[e]);
    }
    return gm_lanes_sum32(s);
}

/* Q5_0 row . x, fused the same way (element layout: dq_q5_0). */
static float dot_q5_0(const uint8_t *row, const float *x, int64_t K) {
    float s[32] = {0};
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + 22 * b;
        float d = h2f(blk);
        uint32_t qh = le32(blk + 2);
        const uint8_t *qs = blk + 6;
        for (int e = 0; e < 32; e++) {
            int l = e & 15;
            int q = (e < 16 ? (qs[l] & 0xF) : (qs[l] >> 4)) | (int)(((qh >> e) & 1u) << 4);
            s[e] += x[32 * b + e] * (d * (float)(q - 16));
        }
    }
    return gm_lanes_sum32(s);
}

/* Q4_K row . x (layout and formula: dq_q4_k; each sub-block of 32 is one round of the lanes). */
static float dot_q4_k(const uint8_t *row, const float *x, int64_t K) {
    float s[32] = {0};
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + 144 * b, *sc = blk + 4, *qs = blk + 16;
        float d = h2f(blk), dmin = h2f(blk + 2);
        const float *xb = x + 256 * b;
        for (int c = 0; c < 4; c++) {
            float f[4];
            k4_chunk_scales(sc, c, d, dmin, f);
            float d0 = f[0], mm0 = f[1], d1 = f[2], mm1 = f[3];
            for (int l = 0; l < 32; l++) s[l] += xb[64 * c + l] * (d0 * (float)(qs[32 * c + l] & 0xF) - mm0);
            for (int l = 0; l < 32; l++) s[l] += xb[64 * c + 32 + l] * (d1 * (float)(qs[32 * c + l] >> 4) - mm1);
        }
    }
    return gm_lanes_sum32(s);
}

/* Q6_K row . x (layout and formula: dq_q6_k; e = 128h + 32k + l, one round of the lanes per (h, k)). */
static float dot_q6_k(const uint8_t *row, const float *x, int64_t K) {
    float s[32] = {0};
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + 210 * b, *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = h2f(blk + 208);
        const float *xb = x + 256 * b;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                int e0 = 128 * h + 32 * k;
                float ds0 = d * (float)sc[e0 / 16], ds1 = d * (float)sc[e0 / 16 + 1];
                for (int l = 0; l < 32; l++) s[l] += xb[e0 + l] * ((l < 16 ? ds0 : ds1) * (float)q6_k_q(ql, qh, h, k, l));
            }
    }
    return gm_lanes_sum32(s);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GM_HAVE_AVX2_DOTS 1
#define AVX2_F16C __attribute__((target("avx2,f16c")))
/* w = 4, 2, 1 of gm_lanes_sum32 on 8 lanes: s[k] += s[k + w] for k < w, lane by lane */
AVX2_F16C static inline float hsum8_avx2(__m256 s8) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* the 32 lanes as four 8-wide accumulators, reduced in gm_lanes_sum32's order */
AVX2_F16C static inline float lanes_sum_avx2(const __m256 acc[4]) {
    /* acc[j] lane i is s[8j + i]. Each step adds the same pairs as gm_lanes_sum32, a vector at a time
     * (one rounding per sum either way, so the same bits): w = 16: s[k] + s[k + 16] for k < 16 is
     * acc[0] + acc[2], acc[1] + acc[3]; w = 8: those two; w = 4, 2, 1 within the 8 lanes; in
     * registers rather than stored and summed one by one (once per row of every decoding GEMV). */
    __m256 s8 = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    return hsum8_avx2(s8);
}

/* f16 -> f32 in one instruction (F16C; every AVX2 CPU has it): exact, as gm_f16_to_f32 */
AVX2_F16C static inline float h2f_f16c(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8))); }

AVX2_F16C static float dot_q8_0_avx2(const uint8_t *row, const float *x, int64_t K) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + 34 * b;
        __m256 d = _mm256_set1_ps(h2f_f16c(blk));
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * j)));
            __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + 8 * j), w));
        }
    }
    return lanes_sum_avx2(acc);
}

AVX2_F16C static float dot_q5_0_avx2(const uint8_t *row, const float *x, int64_t K) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), mask4 = _mm256_set1_epi32(0xF);
    const __m256i one = _mm256_set1_epi32(1), sixteen = _mm256_set1_epi32(16);
    for (int64_t b = 0; b < K / 32; b++) {
        const uint8_t *blk = row + 22 * b;
        __m256 d = _mm256_set1_ps(h2f_f16c(blk));
        uint32_t qh32 = le32(blk + 2);
        __m256i qh = _mm256_set1_epi32((int)qh32);
        for (int j = 0; j < 4; j++) { /* elements 8j .. 8j+7 */
            int e0 = 8 * j, l = e0 & 15;
            __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 6 + l)));
            __m256i nib = e0 < 16 ? _mm256_and_si256(bytes, mask4) : _mm256_srli_epi32(bytes, 4);
            __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_add_epi32(lane, _mm256_set1_epi32(e0))), one);
            __m256i q = _mm256_sub_epi32(_mm256_or_si256(nib, _mm256_slli_epi32(hb, 4)), sixteen);
            __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
            acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(x + 32 * b + e0), w));
        }
    }
    return lanes_sum_avx2(acc);
}

/* 8 bytes at p widened to 8 x int32 */
AVX2_F16C static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

AVX2_F16C static float dot_q4_k_avx2(const uint8_t *row, const float *x, int64_t K) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i mask4 = _mm256_set1_epi32(0xF);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + 144 * b, *sc = blk + 4, *qs = blk + 16;
        float d = h2f_f16c(blk), dmin = h2f_f16c(blk + 2);
        const float *xb = x + 256 * b;
        for (int c = 0; c < 4; c++) {
            float f[4];
            k4_chunk_scales(sc, c, d, dmin, f);
            __m256 d0 = _mm256_set1_ps(f[0]), mm0 = _mm256_set1_ps(f[1]), d1 = _mm256_set1_ps(f[2]), mm1 = _mm256_set1_ps(f[3]);
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_and_si256(u8x8(qs + 32 * c + 8 * j), mask4);
                __m256 w = _mm256_sub_ps(_mm256_mul_ps(d0, _mm256_cvtepi32_ps(q)), mm0);
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(xb + 64 * c + 8 * j), w));
            }
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_srli_epi32(u8x8(qs + 32 * c + 8 * j), 4);
                __m256 w = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), mm1);
                acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(xb + 64 * c + 32 + 8 * j), w));
            }
        }
    }
    return lanes_sum_avx2(acc);
}

AVX2_F16C static float dot_q6_k_avx2(const uint8_t *row, const float *x, int64_t K) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i mask4 = _mm256_set1_epi32(0xF), three = _mm256_set1_epi32(3), k32 = _mm256_set1_epi32(32);
    for (int64_t b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + 210 * b, *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = h2f_f16c(blk + 208);
        const float *xb = x + 256 * b;
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                int e0 = 128 * h + 32 * k;
                __m256 ds0 = _mm256_set1_ps(d * (float)sc[e0 / 16]), ds1 = _mm256_set1_ps(d * (float)sc[e0 / 16 + 1]);
                __m128i shift = _mm_cvtsi32_si128(2 * k);
                for (int j = 0; j < 4; j++) {
                    int l = 8 * j;
                    __m256i lo = u8x8(ql + 64 * h + l + 32 * (k & 1));
                    lo = k < 2 ? _mm256_and_si256(lo, mask4) : _mm256_srli_epi32(lo, 4);
                    __m256i hi = _mm256_and_si256(_mm256_srl_epi32(u8x8(qh + 32 * h + l), shift), three);
                    __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), k32);
                    __m256 w = _mm256_mul_ps(j < 2 ? ds0 : ds1, _mm256_cvtepi32_ps(q));
                    acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_loadu_ps(xb + e0 + l), w));
                }
            }
    }
    return lanes_sum_avx2(acc);
}
#endif

bool gm_cpu_simd = true;

bool gm_dot_wrow(const gm_wview *w, int64_t r, const float *x, float *out) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
#ifdef GM_HAVE_AVX2_DOTS
    /* __builtin_cpu_supports reads what libgcc's constructor found: a load, no cpuid */
    bool avx2 = gm_cpu_simd && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    if (avx2 && w->type == GM_Q8_0) return *out = dot_q8_0_avx2(row, x, w->cols), true;
    if (avx2 && w->type == GM_Q5_0) return *out = dot_q5_0_avx2(row, x, w->cols), true;
    if (avx2 && w->type == GM_Q4_K) return *out = dot_q4_k_avx2(row, x, w->cols), true;
    if (avx2 && w->type == GM_Q6_K) return *out = dot_q6_k_avx2(row, x, w->cols), true;
#endif
    switch (w->type) {
    case GM_Q8_0: *out = dot_q8_0(row, x, w->cols); return true;
    case GM_Q5_0: *out = dot_q5_0(row, x, w->cols); return true;
    case GM_Q4_K: *out = dot_q4_k(row, x, w->cols); return true;
    case GM_Q6_K: *out = dot_q6_k(row, x, w->cols); return true;
    default: return false;
    }
}

/* ---- int8 dots for decoding (gm_kctx.int8_dot; kernels.h) ---------------------------------- */

/* One block of the quantized x: its scale, the sum of its integers (for Q4_K's min term, as
 * llama.cpp's block_q8_K keeps bsums) and 32 int8 values (40 bytes). */
typedef struct xq8_block {
    float d;
    int32_t sum;
    int8_t q[32];
} xq8_block;

#ifdef GM_HAVE_AVX2_DOTS
/* The same blocks as the scalar loop below, bit for bit: max is exact in any order (and
 * max_ps(|v|, amax) keeps amax for a NaN |v|, as fmaxf does), the same 1/d and products, and
 * cvtps_epi32 rounds by MXCSR, to nearest with ties to even as nearbyintf does. Scalar, this ran on
 * the calling thread before each decoding GEMV, calling fmaxf and nearbyintf per element. */
AVX2_F16C static void quantize_x_q8_avx2(const float *x, int64_t K, xq8_block *xb) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < K / 32; b++) {
        const float *v = x + 32 * b;
        __m256 x4[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            x4[j] = _mm256_loadu_ps(v + 8 * j);
            m = _mm256_max_ps(_mm256_and_ps(x4[j], absmask), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x4[j], idv));
        /* int32 -> int8 in element order: packs interleave 128-bit lanes, the permute undoes it */
        __m256i q16a = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i q8 = _mm256_packs_epi16(q16a, q16b);
        q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xb[b].d = d;
        xb[b].sum = _mm_cvtsi128_si32(s4);
        _mm256_storeu_si256((__m256i *)xb[b].q, q8);
    }
}
#endif

void gm_quantize_x_q8(const float *x, int64_t K, void *out) {
    xq8_block *xb = out;
#ifdef GM_HAVE_AVX2_DOTS
    if (gm_cpu_simd && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        quantize_x_q8_avx2(x, K, xb);
        return;
    }
#endif
    for (int64_t b = 0; b < K / 32; b++) {
        const float *v = x + 32 * b;
        float amax = 0.0f;
        for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(v[e]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        xb[b].d = d;
        for (int e = 0; e < 32; e++) sum += xb[b].q[e] = (int8_t)nearbyintf(v[e] * id);
        xb[b].sum = sum;
    }
}

/* The weight side of one block of 32 (global block b of the row) for the shared arithmetic:
 * q[32] its integers, ws[8] the weight scale of each lane (lane j: elements 4j..4j+3), wm the
 * weight's min scale (Q4_K's dmin * m; 0 for the others):
 *   Q8_0 q, d | Q5_0 q - 16, d (layouts: dq_q8_0, dq_q5_0)
 *   Q4_K q (0..15), d * S_j, dmin * M_j of the block's sub-block j (dq_q4_k)
 *   Q6_K q - 32 (q6_k_q), d * scale of elements 0-15 for lanes 0-3, of 16-31 for lanes 4-7 (dq_q6_k) */
static void block_w(gm_dtype type, const uint8_t *row, int64_t b, int32_t q[32], float ws[8], float *wm) {
    *wm = 0.0f;
    if (type == GM_Q8_0 || type == GM_Q5_0) {
        const uint8_t *blk = row + (type == GM_Q8_0 ? 34 : 22) * (size_t)b;
        float d = h2f(blk);
        for (int j = 0; j < 8; j++) ws[j] = d;
        if (type == GM_Q8_0) {
            for (int e = 0; e < 32; e++) q[e] = ((const int8_t *)(blk + 2))[e];
            return;
        }
        uint32_t qh = le32(blk + 2);
        const uint8_t *qs = blk + 6;
        for (int e = 0; e < 32; e++)
            q[e] = ((e < 16 ? (qs[e & 15] & 0xF) : (qs[e & 15] >> 4)) | (int)(((qh >> e) & 1u) << 4)) - 16;
        return;
    }
    int64_t sb = b % 8; /* the sub-block of 32 within its super-block of 256 */
    if (type == GM_Q4_K) {
        const uint8_t *blk = row + 144 * (size_t)(b / 8), *qs = blk + 16;
        float f[4];
        k4_chunk_scales(blk + 4, (int)(sb / 2), h2f(blk), h2f(blk + 2), f);
        int hi = (int)(sb % 2);
        for (int j = 0; j < 8; j++) ws[j] = f[2 * hi];
        *wm = f[2 * hi + 1];
        for (int l = 0; l < 32; l++) q[l] = hi ? qs[32 * (sb / 2) + l] >> 4 : qs[32 * (sb / 2) + l] & 0xF;
        return;
    }
    const uint8_t *blk = row + 210 * (size_t)(b / 8), *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    float d = h2f(blk + 208);
    int h = (int)(sb / 4), k = (int)(sb % 4), e0 = 128 * h + 32 * k;
    float ds0 = d * (float)sc[e0 / 16], ds1 = d * (float)sc[e0 / 16 + 1];
    for (int j = 0; j < 8; j++) ws[j] = j < 4 ? ds0 : ds1;
    for (int l = 0; l < 32; l++) q[l] = q6_k_q(ql, qh, h, k, l);
}

/* The arithmetic both twins share (kernels.h): lane j (0..7) of block b is the exact integer dot of
 * elements 4j..4j+3; accumulator acc[b % 2][j] += fl(fl(ws_j * d_x) * lane); at the end the two
 * accumulators are added lane by lane and the 8 lanes halved (j + 4, j + 2, j + 1); Q4_K's min
 * terms, fl(fl(wm * d_x) * sum_x) in block order, are summed apart and subtracted last. Two
 * accumulators and eight lanes keep the float adds independent (one chain made it latency
 * bound: no faster than the f32 dots). */
static float q8_lanes_sum(float acc[2][8]) {
    float s[8];
    for (int j = 0; j < 8; j++) s[j] = acc[0][j] + acc[1][j];
    for (int w = 4; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

static float dot_q8_scalar(gm_dtype type, const uint8_t *row, const xq8_block *xb, int64_t K) {
    float acc[2][8] = {{0}}, macc = 0.0f;
    for (int64_t b = 0; b < K / 32; b++) {
        int32_t q[32];
        float ws[8], wm;
        block_w(type, row, b, q, ws, &wm);
        for (int j = 0; j < 8; j++) {
            int32_t lane = 0;
            for (int e = 4 * j; e < 4 * j + 4; e++) lane += q[e] * (int32_t)xb[b].q[e];
            acc[b % 2][j] += (ws[j] * xb[b].d) * (float)lane;
        }
        if (type == GM_Q4_K) macc += (wm * xb[b].d) * (float)xb[b].sum;
    }
    return q8_lanes_sum(acc) - macc;
}

#ifdef GM_HAVE_AVX2_DOTS
/* a Q5_0 block's 32 weights as int8 (q - 16): low / high nibbles of qs for elements 0-15 / 16-31,
 * bit e of qh as the fifth bit of element e (byte e/8 of qh spread over 8 lanes, each lane
 * testing its own bit) */
AVX2_F16C static inline __m256i q5_0_ints(const uint8_t *blk) {
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 6)), m4 = _mm_set1_epi8(0x0F);
    __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)le32(blk + 2)),
                                         _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                                          2, 3, 3, 3, 3, 3, 3, 3, 3));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    __m256i q = _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
}

/* lane j = the integer dot of elements 4j..4j+3 of w and x (int8 each), exact: |w| as unsigned
 * times x with w's sign (llama.cpp's maddubs trick) pairs into int16 - at most 2 x 128 x 127 =
 * 32512, no saturation, because x is within -127..127 (gm_quantize_x_q8) - then pairs of those
 * into int32 */
AVX2_F16C static inline __m256i lanes_i8x32(__m256i w, __m256i x) {
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* the same for unsigned weights (Q4_K's 0..15): no sign trick needed */
AVX2_F16C static inline __m256i lanes_u8x32(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

#define XQ(xb) _mm256_loadu_si256((const __m256i *)(xb)->q)

/* block b's lanes scaled by fl(d_w * d_x), to be added to its accumulator (Q8_0, Q5_0) */
AVX2_F16C static inline __attribute__((always_inline)) __m256 q8_block_avx2(gm_dtype type, const uint8_t *blk,
                                                                            const xq8_block *x) {
    __m256i qw = type == GM_Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + 2)) : q5_0_ints(blk);
    return _mm256_mul_ps(_mm256_set1_ps(h2f_f16c(blk) * x->d), _mm256_cvtepi32_ps(lanes_i8x32(qw, XQ(x))));
}

AVX2_F16C static inline __attribute__((always_inline)) float dot_q8_avx2(gm_dtype type, const uint8_t *row,
                                                                           const xq8_block *xb, int64_t K) {
    size_t bytes = type == GM_Q8_0 ? 34 : 22;
    int64_t nb = K / 32, b = 0;
    /* even blocks into acc0, odd into acc1, in registers (an indexed pair lived on the stack) */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; b + 2 <= nb; b += 2) {
        acc0 = _mm256_add_ps(acc0, q8_block_avx2(type, row + bytes * (size_t)b, xb + b));
        acc1 = _mm256_add_ps(acc1, q8_block_avx2(type, row + bytes * (size_t)(b + 1), xb + b + 1));
    }
    if (b < nb) acc0 = _mm256_add_ps(acc0, q8_block_avx2(type, row + bytes * (size_t)b, xb + b));
    return hsum8_avx2(_mm256_add_ps(acc0, acc1)); /* q8_lanes_sum's adds */
}

/* Q4_K: per chunk c of a super-block, its 32 bytes are sub-block 2c (low nibbles, even: acc0) and
 * 2c + 1 (high nibbles, odd: acc1); the min terms in block order */
AVX2_F16C static float dot_q4_k_q8_avx2(const uint8_t *row, const xq8_block *xb, int64_t K) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float macc = 0.0f;
    for (int64_t s = 0; s < K / 256; s++) {
        const uint8_t *blk = row + 144 * (size_t)s, *qs = blk + 16;
        float d = h2f_f16c(blk), dmin = h2f_f16c(blk + 2);
        for (int c = 0; c < 4; c++) {
            const xq8_block *x0 = xb + 8 * s + 2 * c, *x1 = x0 + 1;
            float f[4];
            k4_chunk_scales(blk + 4, c, d, dmin, f);
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_set1_ps(f[0] * x0->d), _mm256_cvtepi32_ps(lanes_u8x32(lo, XQ(x0)))));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_set1_ps(f[2] * x1->d), _mm256_cvtepi32_ps(lanes_u8x32(hi, XQ(x1)))));
            macc += (f[1] * x0->d) * (float)x0->sum;
            macc += (f[3] * x1->d) * (float)x1->sum;
        }
    }
    return hsum8_avx2(_mm256_add_ps(acc0, acc1)) - macc; /* q8_lanes_sum's adds */
}

/* Q6_K: sub-block (h, k) of a super-block is global block 8s + 4h + k (parity k's); its 6-bit
 * values from 32 bytes of ql (low or high nibbles) and 2 bits of 32 bytes of qh, minus 32; lanes
 * 0-3 scaled by the first 16 elements' scale, 4-7 by the second's */
AVX2_F16C static float dot_q6_k_q8_avx2(const uint8_t *row, const xq8_block *xb, int64_t K) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi8(32);
    for (int64_t s = 0; s < K / 256; s++) {
        const uint8_t *blk = row + 210 * (size_t)s, *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = h2f_f16c(blk + 208);
        for (int h = 0; h < 2; h++) {
            __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            for (int k = 0; k < 4; k++) {
                const xq8_block *x = xb + 8 * s + 4 * h + k;
                int e0 = 128 * h + 32 * k;
                __m256i lv = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (k & 1)));
                __m256i lo = k < 2 ? _mm256_and_si256(lv, m4) : _mm256_and_si256(_mm256_srli_epi16(lv, 4), m4);
                __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(2 * k)), m2), 4);
                __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, hi), k32);
                float a0 = (d * (float)sc[e0 / 16]) * x->d, a1 = (d * (float)sc[e0 / 16 + 1]) * x->d;
                __m256 sv = _mm256_set_m128(_mm_set1_ps(a1), _mm_set1_ps(a0));
                acc[k & 1] = _mm256_add_ps(acc[k & 1], _mm256_mul_ps(sv, _mm256_cvtepi32_ps(lanes_i8x32(q, XQ(x)))));
            }
        }
    }
    return hsum8_avx2(_mm256_add_ps(acc[0], acc[1])); /* q8_lanes_sum's adds */
}

/* one loop per weight type, the type a constant inside (a per-block branch cost a third) */
AVX2_F16C static void rows_q8_avx2(gm_dtype type, const uint8_t *row, size_t rb, int64_t n, const xq8_block *xq, int64_t K,
                                   float *out) {
    switch (type) {
    case GM_Q8_0: for (int64_t i = 0; i < n; i++, row += rb) out[i] = dot_q8_avx2(GM_Q8_0, row, xq, K); break;
    case GM_Q5_0: for (int64_t i = 0; i < n; i++, row += rb) out[i] = dot_q8_avx2(GM_Q5_0, row, xq, K); break;
    case GM_Q4_K: for (int64_t i = 0; i < n; i++, row += rb) out[i] = dot_q4_k_q8_avx2(row, xq, K); break;
    default: for (int64_t i = 0; i < n; i++, row += rb) out[i] = dot_q6_k_q8_avx2(row, xq, K); break;
    }
}
#endif

bool gm_dot_rows_q8(const gm_wview *w, int64_t r0, int64_t n, const void *xq, float *out) {
    if (!gm_int8_dot_supports(w->type) || w->cols % gm_dtype_get(w->type)->block_size != 0) return false;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
#ifdef GM_HAVE_AVX2_DOTS
    if (gm_cpu_simd && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
        rows_q8_avx2(w->type, row, w->row_bytes, n, xq, w->cols, out);
        return true;
    }
#endif
    for (int64_t i = 0; i < n; i++, row += w->row_bytes) out[i] = dot_q8_scalar(w->type, row, xq, w->cols);
    return true;
}

bool gm_int8_dot_supports(gm_dtype type) {
    return type == GM_Q8_0 || type == GM_Q5_0 || type == GM_Q4_K || type == GM_Q6_K;
}

void gm_k_dequant_rows_cpu(const gm_kctx *ctx, float *out, const gm_wview *w, int64_t row0, int64_t rows) {
    int64_t K = w->cols;
    GM_OMP_FOR(ctx->n_threads, rows * K > 65536, schedule(static),
        for (int64_t r = 0; r < rows; r++) gm_dequant_wrow(w, row0 + r, out + r * K);
    );
}
