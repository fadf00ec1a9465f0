/*
 * vmath.h - exp, tanh and GELU (tanh form) as straight-line float code that GCC vectorizes, for
 * the CPU kernels' element loops (libm's scalar expf / tanhf / expm1f took 7% of a 128-token
 * training step of the 270M in one perf profile, 2026-12-04; docs/benchmarks.md).
 *
 * Both follow Cephes (S. L. Moshier, cephes/single/expf.c and tanhf.c, public domain; the method
 * in Moshier, "Methods and Programs for Mathematical Functions", 1989): exp by x = n ln2 + r, ln2
 * split in two, e^r by a polynomial, 2^n from the exponent bits; tanh by an odd polynomial below
 * 0.625 and 1 - 2 / (e^2x + 1) above. Only multiplies, adds and a divide, no FMA, so the
 * baseline and AVX2 clones (GM_CPU_CLONES) compute the same bits. Accuracy is what the kernels'
 * tests assert against double references (test_grad: finite differences, losses; test_train /
 * test_gemma*: PEFT's gradients at their tolerances in tests/unit/test_util.h).
 *
 * Header-only (static inline) so each caller's loop is vectorized in place; no state, no errors.
 */
#ifndef GM_VMATH_H
#define GM_VMATH_H

#include <stdint.h>
#include <string.h>

/* e^x for x in [-87.3, 88.3]: below, 0 (where expf goes subnormal); above, e^88.3 (2^n must stay
 * a finite float: n <= 127); NaN stays NaN. The clamp is written so that NaN clamps too (every
 * comparison with NaN is false): the integer exponent below is then always in range, as C requires
 * of a float-to-int conversion and a shift (UBSan caught (int)NaN << 23 in a diverging run). */
static inline float gm_vexpf(float x) {
    float xc = x > -87.3f ? (x < 88.3f ? x : 88.3f) : -87.3f;
    float t = xc * 1.44269504088896341f + 12582912.0f; /* round to nearest through 1.5 * 2^23 */
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n in [-126, 127] */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.3f ? 0.0f : x == x ? p * two_n : x;
}

/* tanh(x); exactly +-1 from |x| = 9.1 (where 1 - tanh is under half a float ulp of 1, as libm's
 * tanhf rounds it; the GELU's gradient needs 1 - t^2 = 0 there). */
static inline float gm_vtanhf(float x) {
    float a = x < 0.0f ? -x : x;
    float ac = a > 9.1f ? 9.1f : a;
    float big = a >= 9.1f ? 1.0f : 1.0f - 2.0f / (gm_vexpf(ac + ac) + 1.0f);
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = p * z * x + x;
    float r = x < 0.0f ? -big : big;
    return a < 0.625f ? small : r;
}

#define GM_GELU_C 0.7978845608028654f /* sqrt(2/pi) */

/* gelu_tanh(z) = 0.5 z (1 + tanh(c (z + 0.044715 z^3))) (gemma_architecture.md §1.6; PyTorch's
 * gelu(approximate="tanh")). */
static inline float gm_gelu_tanh(float z) {
    return 0.5f * z * (1.0f + gm_vtanhf(GM_GELU_C * (z + 0.044715f * z * z * z)));
}

/* d gelu_tanh / dz = 0.5 (1 + t) + 0.5 z (1 - t^2) c (1 + 3 * 0.044715 z^2), t = tanh(c (z +
 * 0.044715 z^3)); *gelu (not NULL) gets gelu_tanh(z) from the same t. */
static inline float gm_gelu_tanh_grad(float z, float *gelu) {
    float t = gm_vtanhf(GM_GELU_C * (z + 0.044715f * z * z * z));
    *gelu = 0.5f * z * (1.0f + t);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GM_GELU_C * (1.0f + 3.0f * 0.044715f * z * z);
}

#endif /* GM_VMATH_H */
