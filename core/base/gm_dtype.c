/*
 * gm_dtype.c - dtype table and IEEE half conversion.
 */
#include "gm_dtype.h"

#include "gm_status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const gm_dtype_info infos[GM_DTYPE_COUNT] = {
    [GM_F32] = {"f32", 1, 4, true, false},
    [GM_F16] = {"f16", 1, 2, true, false},
    [GM_BF16] = {"bf16", 1, 2, true, false},
    [GM_F64] = {"f64", 1, 8, true, false},
    [GM_I8] = {"i8", 1, 1, false, false},
    [GM_U8] = {"u8", 1, 1, false, false},
    [GM_I16] = {"i16", 1, 2, false, false},
    [GM_I32] = {"i32", 1, 4, false, false},
    [GM_I64] = {"i64", 1, 8, false, false},
    /* sizes: ggml-common.h block structs, formats.md §1.3 */
    [GM_Q4_0] = {"q4_0", 32, 18, false, true},
    [GM_Q4_1] = {"q4_1", 32, 20, false, true},
    [GM_Q5_0] = {"q5_0", 32, 22, false, true},
    [GM_Q5_1] = {"q5_1", 32, 24, false, true},
    [GM_Q8_0] = {"q8_0", 32, 34, false, true},
    [GM_Q2_K] = {"q2_k", 256, 84, false, true},
    [GM_Q3_K] = {"q3_k", 256, 110, false, true},
    [GM_Q4_K] = {"q4_k", 256, 144, false, true},
    [GM_Q5_K] = {"q5_k", 256, 176, false, true},
    [GM_Q6_K] = {"q6_k", 256, 210, false, true},
    [GM_NF4] = {"nf4", 64, 32, false, true},
};

const gm_dtype_info *gm_dtype_get(gm_dtype t) {
    GM_ASSERT((unsigned)t < GM_DTYPE_COUNT);
    return &infos[t];
}

bool gm_dtype_from_name(const char *name, gm_dtype *out) {
    for (int i = 0; i < GM_DTYPE_COUNT; i++) {
        if (strcmp(infos[i].name, name) == 0) {
            *out = (gm_dtype)i;
            return true;
        }
    }
    return false;
}

size_t gm_dtype_row_bytes(gm_dtype t, int64_t n) {
    const gm_dtype_info *in = gm_dtype_get(t);
    GM_ASSERT(n % in->block_size == 0);
    return (size_t)(n / in->block_size) * (size_t)in->type_size;
}

float gm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v;
    v.u = bits;
    return v.f;
}

uint16_t gm_f32_to_f16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t x = v.u;
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (absx < 0x38800000u) { /* result is a half subnormal (or zero) */
        /* Scale by 2^24 so one unit is the smallest half subnormal; the product is exact
         * (power-of-two scale, no overflow), then round half to even by hand. */
        float scaled = (v.f < 0 ? -v.f : v.f) * 16777216.0f;
        uint32_t n = (uint32_t)scaled;
        float frac = scaled - (float)n;
        if (frac > 0.5f || (frac == 0.5f && (n & 1u))) n++;
        return (uint16_t)(sign | n);
    }
    uint32_t e = ((absx >> 23) - 112u) << 10;
    uint32_t m = (absx >> 13) & 0x3ffu;
    uint32_t h = e | m;
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

double gm_f32_shortest(float v) {
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if ((float)strtod(buf, NULL) == v) return strtod(buf, NULL);
    }
    return (double)v;
}
