/*
 * test_dequant.c - block dequantizers (kernels/cpu/dequant.c) against ggml's own output, and the
 * f16/bf16 scalar conversions (gm_dtype.h).
 *
 * Vectors: formats.md §1.7. The first block of a 512-float LCG row was quantized and
 * dequantized by ggml's reference code; we decode the same block bytes with gm_dequant_row and
 * compare the documented elements and the block sum. The doc prints 7 significant digits.
 */
#include "test_util.h"

#include "gm_dtype.h"
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

typedef struct ref_val {
    int i;
    double y;
} ref_val;

typedef struct vec {
    gm_dtype type;
    const char *hex;
    ref_val vals[16];
    int n_vals;
    double sum;
} vec;

/* formats.md §1.7, transcribed. */
static const vec vectors[] = {
    {GM_Q8_0, "f61b85840b23699cff0c19498a3f789233f6e576e8747f2aec00c9ec2da7965bd081",
     {{0, -0.4781227}, {1, -0.4820099}, {15, -0.03887177}, {16, -0.1049538}, {17, 0.4586868},
      {31, -0.4936714}},
     6, -0.2643280},
    {GM_Q5_0, "e6a763a4c5db3f1f3f1c03bd200e7d27afb8d15e6af1",
     {{0, -0.4627991}, {15, -0.03085327}, {16, -0.09255981}, {17, 0.4627991}, {31, -0.4627991}},
     5, -0.1851196},
    {GM_Q4_0, "e6abaf1fa716015e9887b6935fe4f02fb5f9",
     {{0, -0.4319458}, {15, -0.06170654}, {16, -0.1234131}, {17, 0.4319458}}, 4, 0.0},
    {GM_Q4_1, "362ce3b760e068eafea26778496ca02b1fd15b07",
     {{0, -0.4929199}, {15, -0.03234863}, {16, -0.09814453}, {17, 0.4282227}}, 4, -0.3771973},
    {GM_Q5_1, "1328e3b79c5b3a24c0e0d1e4fc53dff193d851573eb2a60e",
     {{0, -0.4929199}, {15, -0.04730225}, {16, -0.1109619}, {17, 0.4619751}}, 4, -0.2404785},
    {GM_Q4_K,
     "3b140e20fdfbf2febcfcf2fcf5ef5ffd704098fa0ec15758f99cb0abaf21fbc776cf56bf9fca763874b68ae261fd"
     "c5204bc5b55d2d41d066cfbc18b3d68f3ee56e3ba8cffa0fa50d5e108aeaf0495fe05e319b0915d44fec1a5686"
     "073424cf3500599a66adb020199829661648c44980d485daaac1b9fe70d205bc1de5289592e23a9acce425359e"
     "71579e8ab3945955",
     {{0, -0.4751587}, {15, -0.03414059}, {16, -0.09714317}, {17, 0.4698801}, {31, -0.4751587},
      {32, -0.0486002}, {33, -0.231411}, {63, -0.3532848}, {64, 0.1720905}, {100, -0.3470879},
      {127, 0.4213371}, {128, 0.3941517}, {160, -0.1656561}, {200, -0.289587},
      {255, -0.1839037}},
     15, 2.4838400},
    {GM_Q5_K,
     "23100020fefcf5fffffdf4fe16f949fc9488fbd785e2d9319f0fe64b8b4cb78a8457fccfbf2708d53412cfce98"
     "a75628e09021f40d9390a1f31951584f52e69eec7ead7e2f85ed60e95d05c5c3eb8a40868a6aba5a83b1cc8d68"
     "2176ab1d6bcacc66509ef40f4b0abb3004c3e192aed0ad6246023be88ff834cc3d0e7959ae7a00b344dc7b9140"
     "325143dc2d91b99320b81bb6578173fff0b50a6b1dcb312b34d466369ad85b6a2ef2bf3f16773895ba",
     {{0, -0.4921875}, {16, -0.1164894}, {32, -0.05238724}, {64, 0.1825457}, {128, 0.4079714},
      {255, -0.1589069}},
     6, 2.5751252},
    {GM_Q6_K,
     "f04043899b560083f63331b07ff4ad5d7723e633611695b08de57586daaa3ceffe52257e80f2d3845e131b2aa8"
     "5aacf1632f5dc01afc64e69383fe6428c0ae5bc5651109856a00ae1673814158aa6228302a1e9ccd52712966eb"
     "1c2dd6b44b71641c659107e7d0ea6607c3318e7a315f209586c80ccf97b537d789f411a211c224d4da7e330cc6"
     "56fefb28cbdbb03edd8ad05a0414c16ace8af655133b90823fe4a3d991f29ec47cf1268a02e212acb230d65a05"
     "2be8e042ba924551666dd6a878827a966094698089607f7985837b9b1c08",
     {{0, -0.4815674}, {15, -0.04514694}, {16, -0.11061}, {17, 0.4582415}, {31, -0.4898443},
      {32, -0.03059959}, {33, -0.2141972}, {63, -0.3589182}, {64, 0.1805878}, {100, -0.3160286},
      {127, 0.4334106}, {128, 0.4029365}, {160, -0.1911221}, {200, -0.2622285},
      {255, -0.1519947}},
     15, 2.9646492},
    {GM_Q3_K,
     "c6d8ab87d5b289e1cf5fb61bdb1ce7db4b98370070e8c71bfbdd0a91576899e7a0bcb0fd7799dcfcbda244a6f7"
     "39bef851a8c9883ccbd5dc52f9337337714a7fed1be663b5bdc83ee71c5000d975186920ede65f27d8d4c53585"
     "cf24a9dba99095ca50569897765cf0cf00cfe99c",
     {{0, -0.517868}, {15, 0.0}, {16, -0.1246719}, {17, 0.4986877}, {64, 0.2301636},
      {128, 0.3596306}, {255, -0.2013931}},
     7, 3.5195847},
    {GM_Q2_K,
     "dedeffacaaccbbeebdbcfddabcbdddbc64d4da7e3348c556fefa28cadbb03ed9756ba5fbeb3a95317509a6ecc4"
     "6f79c0d794eaa281adf74ec215b931d5259f85c026aab5df1c10b24e52b961969d665863253728",
     {{0, -0.4280701}, {16, -0.1334839}, {17, 0.4556885}, {32, -0.178299}, {64, 0.09155273},
      {128, 0.4584198}, {255, -0.1097107}},
     7, 2.1156311},
};

static size_t hexdecode(const char *hex, uint8_t *out, size_t cap) {
    size_t n = 0;
    for (const char *p = hex; p[0] && p[1] && n < cap; p += 2) {
        unsigned v;
        if (sscanf(p, "%2x", &v) != 1) break;
        out[n++] = (uint8_t)v;
    }
    return n;
}

static void test_vectors(void) {
    for (size_t k = 0; k < sizeof vectors / sizeof vectors[0]; k++) {
        const vec *v = &vectors[k];
        const gm_dtype_info *di = gm_dtype_get(v->type);
        uint8_t block[256];
        size_t n = hexdecode(v->hex, block, sizeof block);
        CHECK(n == (size_t)di->type_size, "%s: block is %zu bytes, want %d", di->name, n,
              (int)di->type_size);
        if (n != (size_t)di->type_size) continue;
        float y[256];
        /* Decode from an exact-size heap copy so ASan would catch an overread. */
        uint8_t *src = malloc(n);
        memcpy(src, block, n);
        gm_dequant_row(v->type, src, y, di->block_size);
        free(src);
        for (int i = 0; i < v->n_vals; i++)
            CHECK_NEAR(y[v->vals[i].i], v->vals[i].y, TOL_DEQUANT_ABS, "%s y[%d]", di->name,
                       v->vals[i].i);
        /* The sum is accumulated in double here; measured differences from the documented
         * sums are < 1e-7 (print precision), so the element tolerance covers them too. */
        double sum = 0;
        for (int i = 0; i < di->block_size; i++) sum += y[i];
        CHECK_NEAR(sum, v->sum, TOL_DEQUANT_ABS, "%s block sum", di->name);
    }
}

/* Two blocks in a row decode independently (block stride = type_size). */
static void test_two_blocks(void) {
    const vec *v = &vectors[0]; // q8_0
    uint8_t two[68];
    hexdecode(v->hex, two, 34);
    memcpy(two + 34, two, 34);
    two[34] = 0x00, two[35] = 0x40; // second block: d = 2.0
    float y[64];
    gm_dequant_row(GM_Q8_0, two, y, 64);
    CHECK_NEAR(y[0], v->vals[0].y, TOL_DEQUANT_ABS, "first block");
    CHECK(y[32] == 2.0f * (float)(int8_t)two[36], "second block uses its own scale: %g", y[32]);
}

static float f_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Reference f32 -> f16: the nearest half by exhaustive search over the 31,744 finite
 * non-negative halves (monotone in their bit patterns), ties to the even pattern. */
static uint16_t ref_f32_to_f16(float f) {
    if (f != f) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00; // 65520 is the midpoint of 65504 and 2^16
    int lo = 0, hi = 0x7bff;
    while (lo < hi) { // largest half <= a
        int mid = (lo + hi + 1) / 2;
        if ((double)gm_f16_to_f32((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    uint16_t h = (uint16_t)lo;
    if (h < 0x7bff) {
        double below = gm_f16_to_f32(h), above = gm_f16_to_f32((uint16_t)(h + 1));
        if (a - below > above - a || (a - below == above - a && (h & 1))) h++;
    }
    return sign | h;
}

static void test_f16(void) {
    CHECK(gm_f16_to_f32(0x3c00) == 1.0f, "1.0");
    CHECK(gm_f16_to_f32(0xc000) == -2.0f, "-2.0");
    CHECK(gm_f16_to_f32(0x7bff) == 65504.0f, "max half");
    CHECK(gm_f16_to_f32(0x0400) == ldexpf(1.0f, -14), "min normal");
    CHECK(gm_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "min subnormal");
    CHECK(gm_f16_to_f32(0x03ff) == 1023.0f * ldexpf(1.0f, -24), "max subnormal");
    CHECK(gm_f16_to_f32(0x8001) == -ldexpf(1.0f, -24), "negative subnormal");
    CHECK(isinf(gm_f16_to_f32(0x7c00)) && gm_f16_to_f32(0x7c00) > 0, "+inf");
    CHECK(isinf(gm_f16_to_f32(0xfc00)) && gm_f16_to_f32(0xfc00) < 0, "-inf");
    CHECK(isnan(gm_f16_to_f32(0x7e00)) && isnan(gm_f16_to_f32(0x7c01)), "nan");
    CHECK(gm_f16_to_f32(0x8000) == 0.0f && signbit(gm_f16_to_f32(0x8000)), "-0");

    /* Every half survives f16 -> f32 -> f16 (NaNs stay NaN). */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gm_f16_to_f32((uint16_t)h);
        uint16_t back = gm_f32_to_f16(f);
        bool ok = isnan(f) ? isnan(gm_f16_to_f32(back)) : back == h;
        if (!ok && bad++ < 5) fprintf(stderr, "half 0x%04x -> %g -> 0x%04x\n", h, f, back);
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);

    /* Round to nearest even at exact midpoints, normal and subnormal. */
    CHECK(gm_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00, "1 + half ulp -> 1 (even)");
    CHECK(gm_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02, "1 + 1.5 ulp -> 1 + 2 ulp (even)");
    CHECK(gm_f32_to_f16(nextafterf(1.0f + ldexpf(1.0f, -11), 2.0f)) == 0x3c01, "above midpoint");
    CHECK(gm_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000, "half the min subnormal -> 0 (even)");
    CHECK(gm_f32_to_f16(3 * ldexpf(1.0f, -25)) == 0x0002, "1.5 min subnormal -> 2 (even)");
    CHECK(gm_f32_to_f16(nextafterf(ldexpf(1.0f, -25), 1.0f)) == 0x0001, "above half -> 1");
    CHECK(gm_f32_to_f16(1023.5f * ldexpf(1.0f, -24)) == 0x0400, "subnormal rounds up to normal");
    CHECK(gm_f32_to_f16(-3 * ldexpf(1.0f, -25)) == 0x8002, "negative subnormal");
    CHECK(gm_f32_to_f16(1e-10f) == 0x0000 && gm_f32_to_f16(-1e-10f) == 0x8000, "underflow to +-0");
    CHECK(gm_f32_to_f16(65504.0f) == 0x7bff, "max half");
    CHECK(gm_f32_to_f16(65519.996f) == 0x7bff, "just below the overflow midpoint");
    CHECK(gm_f32_to_f16(65520.0f) == 0x7c00, "overflow midpoint -> inf");
    CHECK(gm_f32_to_f16(1e30f) == 0x7c00 && gm_f32_to_f16(-1e30f) == 0xfc00, "overflow -> inf");
    CHECK(gm_f32_to_f16(INFINITY) == 0x7c00 && gm_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    CHECK(isnan(gm_f16_to_f32(gm_f32_to_f16(NAN))), "nan stays nan");

    /* Random floats over the whole half range against the exhaustive-search reference. */
    uint64_t st = 42;
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float u = gm_test_rand(&st);
        int e = (int)((gm_test_rand(&st) + 1.0f) * 22.0f) - 28; // 2^-28 .. 2^16
        float f = ldexpf(u, e);
        uint16_t got = gm_f32_to_f16(f), want = ref_f32_to_f16(f);
        if (got != want && bad++ < 5)
            fprintf(stderr, "f32 %.9g (0x%08x) -> 0x%04x, want 0x%04x\n", f, bits_of(f), got, want);
    }
    CHECK(bad == 0, "%d of 200000 random floats round differently from the reference", bad);
}

static void test_bf16(void) {
    CHECK(gm_bf16_to_f32(0x3f80) == 1.0f && gm_bf16_to_f32(0xc040) == -3.0f, "bf16 -> f32");
    CHECK(gm_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(gm_f32_to_bf16(1.0f + ldexpf(1.0f, -8)) == 0x3f80, "midpoint -> even (down)");
    CHECK(gm_f32_to_bf16(1.0f + 3 * ldexpf(1.0f, -8)) == 0x3f82, "midpoint -> even (up)");
    CHECK(gm_f32_to_bf16(nextafterf(1.0f + ldexpf(1.0f, -8), 2.0f)) == 0x3f81, "above midpoint");
    CHECK(gm_f32_to_bf16(-1.0f - ldexpf(1.0f, -8)) == 0xbf80, "negative midpoint");
    CHECK(gm_f32_to_bf16(INFINITY) == 0x7f80 && gm_f32_to_bf16(-INFINITY) == 0xff80, "inf");
    CHECK(gm_f32_to_bf16(f_from_bits(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CHECK(gm_f32_to_bf16(f_from_bits(0x7f800001u)) == 0x7fc0, "signalling NaN made quiet");
    CHECK(gm_f32_to_bf16(f_from_bits(0xffc00000u)) == 0xffc0, "negative quiet NaN");
    CHECK(isnan(gm_bf16_to_f32(gm_f32_to_bf16(NAN))), "nan stays nan");
    CHECK(gm_f32_to_bf16(f_from_bits(0x00010000u)) == 0x0001, "f32 subnormal kept");
    CHECK(gm_f32_to_bf16(f_from_bits(0x00018000u)) == 0x0002, "subnormal midpoint -> even");
    CHECK(gm_round_bf16(3.14159265f) == 3.140625f, "round_bf16(pi)");
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = gm_bf16_to_f32((uint16_t)b);
        uint16_t back = gm_f32_to_bf16(f);
        bool ok = isnan(f) ? isnan(gm_bf16_to_f32(back)) : back == b;
        if (!ok) bad++;
    }
    CHECK(bad == 0, "%d bf16 values do not round-trip", bad);
}

/* gm_dequant_row on plain float types. */
static void test_scalar_rows(void) {
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    uint16_t bf[4] = {0x3f80, 0xc040, 0x0000, 0x4049};
    float f32[4] = {1.5f, -2.5f, 0.0f, 1e30f};
    double f64[2] = {0.25, -8.0};
    float y[4];
    gm_dequant_row(GM_F16, h, y, 4);
    CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == ldexpf(1.0f, -24) && y[3] == 65504.0f,
          "f16 row");
    gm_dequant_row(GM_BF16, bf, y, 4);
    CHECK(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0.0f && y[3] == 3.140625f, "bf16 row");
    gm_dequant_row(GM_F32, f32, y, 4);
    CHECK(memcmp(y, f32, sizeof f32) == 0, "f32 row");
    gm_dequant_row(GM_F64, f64, y, 2);
    CHECK(y[0] == 0.25f && y[1] == -8.0f, "f64 row");
}

int main(void) {
    test_vectors();
    test_two_blocks();
    test_f16();
    test_bf16();
    test_scalar_rows();
    return gm_test_finish();
}
