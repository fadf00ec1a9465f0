/*
 * gm_quant.h - quantizers for the frozen base weights: bitsandbytes NF4 with double quantization
 * (QLoRA), LLM.int8-style vector-wise int8, bf16/f32 copies, and the re-encoding of one weight
 * matrix into one of those formats (core/model/gm_weights.c walks a model's linears with it).
 *
 * NF4 reproduces bitsandbytes 0.50.2 `quantize_4bit(x, blocksize=64, compress_statistics=True,
 * quant_type="nf4")` on CPU bit for bit (formats.md §5.1; the arithmetic is restated at each
 * function and in gm_quant.c): packed nibbles, uint8 codes of the nested absmax, the f32 second-level
 * absmax and the f32 offset all equal bitsandbytes' bytes (tests/unit/test_quant.c against
 * tests/ref/nf4_ref.h5). Int8 is LLM.int8's vector-wise quantization without the outlier
 * decomposition (formats.md §5.2).
 *
 * gm_quant_reserve follows the two-pass arena protocol of gm_arena.h: on a measuring arena it only
 * reserves bytes (kind GM_MEM_WEIGHTS); on the committed arena it hands out the buffers that
 * gm_quant_encode fills.
 *
 * Ownership: nothing here keeps state. The array functions write into caller buffers of the sizes
 * given by gm_nf4_sizes_of (or documented per function). Views set up by gm_quant_reserve borrow
 * the arena; gm_quant_work owns its transient buffers until gm_quant_work_free.
 * Errors: gm_quant_from_name returns GM_ERR_INVALID listing the allowed names; gm_quant_work_alloc
 * returns GM_ERR_NOMEM. The array functions cannot fail (misuse asserts).
 * Thread-safety: all functions are reentrant; they use OpenMP with the thread count passed in, and
 * their results do not depend on it.
 */
#ifndef GM_QUANT_H
#define GM_QUANT_H

#include "gm_arena.h"  /* gm_arena, GM_MEM_WEIGHTS */
#include "gm_config.h"
#include "gm_dtype.h"
#include "kernels.h"  /* gm_wview */
#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- formats ------------------------------------------------------------------------------- */

/* The formats a session can hold its frozen linear weights in. */
typedef enum gm_quant {
    GM_QUANT_STORED = 0, /* as stored in the file (GGUF blocks, bf16, f32): no copy */
    GM_QUANT_F32,        /* f32 copy (free when already f32) */
    GM_QUANT_BF16,       /* bf16 copy, round to nearest even (free when already bf16) */
    GM_QUANT_NF4,        /* bitsandbytes NF4, blocksize 64, double-quantized absmax (QLoRA) */
    GM_QUANT_INT8,       /* vector-wise int8, one f32 scale per row (LLM.int8 without outliers) */
    GM_QUANT_COUNT
} gm_quant;

/* "stored", "f32", "bf16", "nf4", "int8". Never NULL ("?" for out-of-range values). */
const char *gm_quant_name(gm_quant q);

/* Parses a format name: "stored" or "gguf" (both mean: as stored in the file), "f32", "bf16",
 * "nf4", "int8". Unknown names (or NULL) -> GM_ERR_INVALID naming the value and listing these. */
gm_status gm_quant_from_name(const char *name, gm_quant *out, gm_error *err);

/* ---- NF4 (bitsandbytes, formats.md §5.1) ---------------------------------------------------- */

#define GM_NF4_BLOCK 64     /* first-level block: elements per absmax */
#define GM_NF4_BLOCK2 256   /* second-level block: absmax values per absmax2 */

/* Buffer sizes for an NF4 tensor of n elements (flattened row-major). */
typedef struct gm_nf4_sizes {
    size_t packed_bytes; /* ceil(n/2): two codes per byte, even element in the high nibble */
    int64_t n_blocks;    /* ceil(n/64): absmax codes (uint8) and first-level absmax scratch (f32) */
    int64_t n_groups;    /* ceil(n_blocks/256): second-level absmax (f32) */
} gm_nf4_sizes;

gm_nf4_sizes gm_nf4_sizes_of(int64_t n);

/* Quantizes x (n) to NF4 exactly as bitsandbytes' quantize_4bit(blocksize=64, nf4,
 * compress_statistics=True) on CPU:
 *   packed (ceil(n/2) bytes): codes of the flattened tensor, element 2i in the high nibble of byte
 *     i; when n is odd the last low nibble is 7 (bnb pads with 0.0, whose code is 7);
 *   absmax_code (n_blocks), absmax2 (n_groups), *offset: the nested statistics, decoded as
 *     absmax[b] = GM_DYNAMIC_MAP_SIGNED[absmax_code[b]] * absmax2[b/256] + *offset (two f32 ops);
 *   scratch (n_blocks floats): receives the first-level absmax (bnb's unnested statistics).
 * This is gm_nf4_quantize_blocks followed by gm_nf4_quantize_absmax. n >= 1. x must be finite. */
void gm_nf4_quantize(const float *x, int64_t n, uint8_t *packed, uint8_t *absmax_code, float *absmax2,
                     float *offset, float *scratch, int n_threads);

/* First level only, for a span of a larger tensor that starts on a block boundary: x (n) ->
 * packed (ceil(n/2) bytes) and absmax (ceil(n/64) floats). Blocks are independent, so a tensor may
 * be encoded span by span; n may be a non-multiple of 64 only for the span that ends the tensor
 * (its last block is then short).
 * Per block of 64 (bnb backends/default quantize_4bit):
 *   A = max|x|; full block: s = clamp(x * fl(1/max(A, 1e-38f)), -1, 1), stores A;
 *   short last block: A' = max(A, 1e-38f); s = clamp(x / A', -1, 1), stores A' (bnb divides there
 *   and keeps the clamped value);
 *   code = number of NF4 midpoints fl((c[i]+c[i+1])/2) strictly below s (torch.bucketize: a value
 *   exactly on a midpoint takes the lower code). */
void gm_nf4_quantize_blocks(const float *x, int64_t n, uint8_t *packed, float *absmax, int n_threads);

/* Second level (QLoRA double quantization) of the first-level absmax (n_blocks floats):
 *   *offset = torch.mean(absmax) in f32 (gm_nf4_torch_mean);
 *   d[b] = fl(absmax[b] - offset); per group of 256: absmax2 = max|d|, and each d is coded as
 *   bitsandbytes' native CPU blockwise quantizer does: c = clamp(d * fl(1/absmax2), -1, 1),
 *   j = (uint16) trunc(fma((c + 1) * 0.5, 65535, 0.5)) indexes a 65,536-entry table whose entry j
 *   is the number of dynamic-map midpoints below fl(fl(2j)/65535) - 1 (capped at 255) - a binned
 *   nearest-code rule, not exact nearest; a group whose absmax2 is 0 gets code 0.
 * absmax_code (n_blocks), absmax2 (ceil(n_blocks/256)). */
void gm_nf4_quantize_absmax(const float *absmax, int64_t n_blocks, uint8_t *absmax_code, float *absmax2,
                            float *offset, int n_threads);

/* torch.mean of a contiguous f32 vector on CPU, bit for bit (torch 2.15 on x86, 1 torch thread or
 * fewer than 32,768 values): ATen's cascade sum (SumKernel.cpp: 8-lane vectors, 4-way ILP, 4 levels
 * of 16-step partial sums, scalar tail, lanes added in order) then one f32 division by n. The sum
 * kernel runs with 8 lanes even where torch reports AVX512 (measured: 16 lanes mismatch).
 * bitsandbytes takes the nested offset this way; rounding an exact (double) sum matches only ~60%
 * of lengths. With several torch threads and >= 32,768 values torch splits the sum per thread and
 * may differ in the last bit (bnb's own result then depends on torch.get_num_threads()). n >= 1. */
float gm_nf4_torch_mean(const float *v, int64_t n);

/* Dequantizes an NF4 tensor (n elements) into out (n) the way bitsandbytes does: absmax from the
 * nested statistics (dynmap[code] * absmax2, then + offset, each in f32), w = nf4[nibble] * absmax.
 * Equal bit for bit to the kernels' gm_dequant_wrow and to bnb's dequantize_4bit (f32). */
void gm_nf4_dequantize(const uint8_t *packed, const uint8_t *absmax_code, const float *absmax2, float offset,
                       int64_t n, float *out);

/* ---- int8 vector-wise (LLM.int8 without the outlier decomposition, formats.md §5.2) --------- */

/* Quantizes x (rows, cols) row by row: a = max|row|, q = round_half_even(x * fl(fl(1/a) * 127))
 * (bnb's int8_vectorwise_quant arithmetic: torch.round after A * (127 / row_stats)), clamped to
 * [-127, 127]; row_scale[r] = fl(a / 127), so w ~ q * row_scale (the GM_I8 view of kernels.h).
 * An all-zero row gives q = 0 and scale 0. q (rows*cols), row_scale (rows). */
void gm_int8_quantize(const float *x, int64_t rows, int64_t cols, int8_t *q, float *row_scale, int n_threads);

/* ---- GGML Q8_0 (formats.md §1.5), for writing GGUF files ---------------------------------- */

/* Encodes n floats (n % 32 == 0) as Q8_0 blocks into dst (n / 32 * 34 bytes): per 32 values
 * d = max|x| / 127 (stored as f16), q = round(x / d) (half away from zero), as llama.cpp's
 * quantize_row_q8_0_ref (ggml/src/ggml-quants.c); an all-zero block gives d = 0, q = 0. So
 * gm_dequant_row(GM_Q8_0) gives back x within d / 2 per element (plus d's f16 rounding). */
void gm_q8_0_quantize_row(const float *x, int64_t n, void *dst);

/* ---- matrix re-encoding (the model-level walk is core/model/gm_weights.c) ------------------ */

/* True when format q for a matrix stored as `stored` aliases the stored bytes (STORED always;
 * F32 of f32; BF16 of bf16): nothing is re-encoded or reserved for it. */
bool gm_quant_is_alias(gm_quant q, gm_dtype stored);

/* Reserves (measuring arena) or allocates (committed arena) the buffers of one (N, K) matrix in
 * format q (one that does not alias): dst gets type, shape, row_bytes and, committed, its
 * uninitialized buffers. Bytes, each buffer rounded to GM_ARENA_ALIGN: f32 4NK, bf16 2NK,
 * int8 NK + 4N (codes, row scales), nf4 NK/2 + NK/64 + 4 ceil(NK/16384) (packed codes, absmax
 * codes, second-level absmax). All kind GM_MEM_WEIGHTS. */
void gm_quant_reserve(gm_quant q, int64_t N, int64_t K, gm_arena *a, gm_wview *dst);

/* Transient host buffers for re-encoding a set of matrices: size it with gm_quant_work_size for
 * every matrix, allocate, encode, free. */
typedef struct gm_quant_work {
    gm_quant q;
    int n_threads;              /* OpenMP threads (< 1: OpenMP's default) */
    int64_t k_max, panel_max, nb_max;
    float *rows;                /* n_threads * k_max: one dequantized row per thread (bf16, int8) */
    float *panel;               /* NF4: n_threads panels of whole 64-blocks, panel_max floats each */
    float *absmax;              /* NF4: first-level absmax of one matrix (nb_max) */
} gm_quant_work;

void gm_quant_work_init(gm_quant_work *w, gm_quant q, int n_threads);
/* Grows the work's sizes for one (N, K) matrix. */
void gm_quant_work_size(gm_quant_work *w, int64_t N, int64_t K);
/* Allocates the buffers (gm_malloc): GM_ERR_NOMEM naming the size. */
gm_status gm_quant_work_alloc(gm_quant_work *w, gm_error *err);
void gm_quant_work_free(gm_quant_work *w);

/* Re-encodes src (any storage gm_dequant_wrow reads: GGUF blocks, bf16, f16, f32) into dst, which
 * gm_quant_reserve set up on a committed HOST arena for the work's format. Row by row, or for
 * NF4 panel by panel of the (N, K) matrix flattened row-major as bitsandbytes flattens a Linear
 * weight; the bytes do not depend on the thread count. Time on 2 threads for Gemma 3 270M's
 * linears (100 M weights from Q4_K_M): nf4 ~1.9 s, bf16 ~0.5 s, int8 ~0.5 s. */
void gm_quant_encode(const gm_wview *src, gm_wview *dst, gm_quant_work *w);

#ifdef __cplusplus
}
#endif
#endif /* GM_QUANT_H */
