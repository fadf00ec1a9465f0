/*
 * gm_dtype.h - element types: plain scalars and the quantized block formats we read.
 *
 * A closed enum; code switches on it (no type-generic macros). Block formats store
 * `block_size` logical elements in `type_size` bytes (formats.md §1.3); scalars have
 * block_size 1. GGUF's own type ids are mapped in core/formats/gm_gguf.c, never used here.
 * Block layouts (field order, nibble placement) are documented where they are decoded:
 * kernels/cpu/dequant.c. NF4 follows bitsandbytes (formats.md §5.1) and is added by the
 * QLoRA work. GM_I8 as a matrix dtype means LLM.int8-style vector-wise quantization: int8 rows
 * with one f32 scale per row (held beside the rows, gm_wview.row_scale).
 *
 * Ownership: nothing here allocates. Errors: none (lookups of invalid values assert).
 */
#ifndef GM_DTYPE_H
#define GM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_dtype {
    GM_F32 = 0,
    GM_F16,
    GM_BF16,
    GM_F64,
    GM_I8,
    GM_U8,
    GM_I16,
    GM_I32,
    GM_I64,
    /* GGML block formats (formats.md §1.5) */
    GM_Q4_0,
    GM_Q4_1,
    GM_Q5_0,
    GM_Q5_1,
    GM_Q8_0,
    GM_Q2_K,
    GM_Q3_K,
    GM_Q4_K,
    GM_Q5_K,
    GM_Q6_K,
    /* bitsandbytes NF4 (formats.md §5.1): 64-element blocks of 4-bit codes, two per byte (even
     * element in the high nibble); the per-block absmax lives outside the rows, double-quantized
     * (see gm_wview in kernels/kernels.h). type_size counts only the packed nibbles. */
    GM_NF4,
    GM_DTYPE_COUNT
} gm_dtype;

typedef struct gm_dtype_info {
    const char *name;     /* "f32", "q4_k", ... */
    int32_t block_size;   /* logical elements per block (1 for scalars) */
    int32_t type_size;    /* bytes per block */
    bool is_float;        /* f32/f16/bf16/f64 */
    bool is_quantized;    /* a block format that dequantizes to f32 */
} gm_dtype_info;

const gm_dtype_info *gm_dtype_get(gm_dtype t);
static inline const char *gm_dtype_name(gm_dtype t) { return gm_dtype_get(t)->name; }

/* Parses a name as printed by gm_dtype_name ("bf16", "q8_0"); returns false if unknown. */
bool gm_dtype_from_name(const char *name, gm_dtype *out);

/* Bytes needed for `n` elements (n must be a multiple of the block size). */
size_t gm_dtype_row_bytes(gm_dtype t, int64_t n);

/* ---- scalar conversions (formats.md §1.4) ---- */
float gm_f16_to_f32(uint16_t h);
uint16_t gm_f32_to_f16(float f); /* round to nearest even, overflow to inf */
static inline float gm_bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}
/* Round to nearest even; NaN stays a (quiet) NaN, as ggml_compute_fp32_to_bf16 does. */
static inline uint16_t gm_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
/* f32 -> bf16 -> f32 in one step: the value a bf16 tensor would hold. */
static inline float gm_round_bf16(float f) { return gm_bf16_to_f32(gm_f32_to_bf16(f)); }
/* The double with the fewest significant digits (6 to 9) that rounds to the same float: 1e-6f
 * gives 1e-06, not 9.99999997e-07 - a float as the user or the config wrote it, for JSON. */
double gm_f32_shortest(float v);

#ifdef __cplusplus
}
#endif
#endif /* GM_DTYPE_H */
