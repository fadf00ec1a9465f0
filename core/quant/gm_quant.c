/*
 * gm_quant.c - NF4 (bitsandbytes), int8 vector-wise and bf16/f32 re-encoding of frozen weights.
 *
 * Design. NF4 is written to be *bit-identical* with bitsandbytes 0.50.2 on CPU, so a QLoRA run
 * here starts from exactly the base weights a PyTorch/PEFT run would hold. That pins down three
 * pieces of arithmetic which a "nearest code" reimplementation would get wrong in the last bit:
 *   1. First level (bitsandbytes/backends/default/ops.py quantize_4bit, torch ops): scale by the
 *      f32 *reciprocal* of the clamped block absmax (x * (1/A)), except in a short last block,
 *      where bnb divides (x / A) and stores the clamped absmax; code = torch.bucketize against the
 *      15 f32 midpoints (ties go to the lower code).
 *   2. The nested offset is torch's f32 mean: ATen's cascade sum (SumKernel.cpp, 8-lane vectors,
 *      4-way ILP, 4 levels) then sum / n. Summing in double and rounding does NOT match (it did in
 *      ~2/3 of the sizes tried); the cascade below matched torch 2.15 on every length tested.
 *   3. Second level (csrc/cpu_ops.cpp quantize_cpu_impl, the native library): not nearest-code
 *      but a 65,536-bin lookup table, indexed with fma((c+1)*0.5, 65535, 0.5) - the shipped
 *      binary was built with FMA contraction (vfmadd213ss in its disassembly), so the index uses
 *      fmaf explicitly and every other expression here must NOT be contracted (pragma below).
 * The table itself is not stored: entry j is "how many dynamic-map midpoints lie below the bin
 * value" (the build loop walks sorted midpoints), computed per value by binary search.
 *
 * Model re-encoding streams each matrix: every OpenMP thread takes whole panels of rows (a panel is
 * whole 64-blocks, ~16K elements), dequantizes them (gm_dequant_wrow, any stored type) into its own
 * buffer and NF4-encodes them; then the matrix's absmax vector is double-quantized. One parallel
 * region per matrix: on a shared 2-core machine, a barrier per panel cost 3x in libgomp spinning.
 * Rejected: dequantizing whole matrices (27B's down_proj is 460 MB in f32); a per-row NF4 (bnb
 * flattens the whole Linear weight, and blocks cross rows when K is not a multiple of 64).
 * The NF4 bucketize is a count of the 15 bounds below each value over a whole block, which the
 * compiler vectorizes (2x faster than a per-value search; same result).
 */
#include "gm_quant.h"

#include "gm_alloc.h"
#include "gm_omp.h"
#include "kernels.h"    /* gm_wview, gm_dequant_wrow */
#include "nf4_tables.h" /* GM_NF4_CODE, GM_DYNAMIC_MAP_SIGNED */

#include <math.h>
#include <omp.h>
#include <string.h>

/* Bit-exactness needs every a*b+c below rounded twice, as bnb/torch do, except the one fmaf. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ---- names ----------------------------------------------------------------------------------- */

static const char *const quant_names[GM_QUANT_COUNT] = {"stored", "f32", "bf16", "nf4", "int8"};

const char *gm_quant_name(gm_quant q) { return (unsigned)q < GM_QUANT_COUNT ? quant_names[q] : "?"; }

gm_status gm_quant_from_name(const char *name, gm_quant *out, gm_error *err) {
    if (name) {
        if (strcmp(name, "gguf") == 0) {
            *out = GM_QUANT_STORED;
            return GM_OK;
        }
        for (int i = 0; i < GM_QUANT_COUNT; i++)
            if (strcmp(name, quant_names[i]) == 0) {
                *out = (gm_quant)i;
                return GM_OK;
            }
    }
    return gm_error_set(err, GM_ERR_INVALID,
                        "unknown base-weight format '%s'; allowed: stored (or gguf: as stored in the file), "
                        "f32, bf16, nf4, int8",
                        name ? name : "(null)");
}

static int threads_or_default(int n_threads) { return n_threads >= 1 ? n_threads : omp_get_max_threads(); }

/* ---- NF4 first level ------------------------------------------------------------------------- */

gm_nf4_sizes gm_nf4_sizes_of(int64_t n) {
    GM_ASSERT(n >= 0);
    gm_nf4_sizes s;
    s.packed_bytes = (size_t)((n + 1) / 2);
    s.n_blocks = (n + GM_NF4_BLOCK - 1) / GM_NF4_BLOCK;
    s.n_groups = (s.n_blocks + GM_NF4_BLOCK2 - 1) / GM_NF4_BLOCK2;
    return s;
}

/* The 15 decision bounds of bnb's bucketize: (code[i] + code[i+1]) / 2 in f32. */
static void nf4_bounds(float b[15]) {
    for (int i = 0; i < 15; i++) b[i] = (GM_NF4_CODE[i] + GM_NF4_CODE[i + 1]) * 0.5f;
}

static inline float clamp1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }

/* bnb clamps the absmax it divides by to 1e-38 (a subnormal in f32) so zero blocks stay finite. */
#define NF4_ABSMAX_MIN 1e-38f

/* Blocks b0 .. b1-1 of x (n elements in all; the span starts at block 0 of x). */
static void nf4_blocks(const float *x, int64_t n, int64_t b0, int64_t b1, uint8_t *packed, float *absmax) {
    float bnd[15];
    nf4_bounds(bnd);
    for (int64_t b = b0; b < b1; b++) {
        const float *xb = x + b * GM_NF4_BLOCK;
        int64_t len = n - b * GM_NF4_BLOCK < GM_NF4_BLOCK ? n - b * GM_NF4_BLOCK : GM_NF4_BLOCK;
        float A = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            float a = fabsf(xb[i]);
            A = a > A ? a : A;
        }
        float Ac = A > NF4_ABSMAX_MIN ? A : NF4_ABSMAX_MIN;
        float sc[GM_NF4_BLOCK];
        int code[GM_NF4_BLOCK];
        if (len == GM_NF4_BLOCK) {
            /* full block: x * (1 / A) (torch: reciprocal, then multiply); absmax stored unclamped */
            float inv = 1.0f / Ac;
            for (int i = 0; i < GM_NF4_BLOCK; i++) sc[i] = clamp1(xb[i] * inv);
            absmax[b] = A;
        } else {
            /* short last block: x / A, and the clamped absmax is what bnb keeps; bnb pads an odd
             * tensor with 0.0, whose code is 7 */
            for (int i = 0; i < GM_NF4_BLOCK; i++) sc[i] = i < len ? clamp1(xb[i] / Ac) : 0.0f;
            absmax[b] = Ac;
        }
        /* bucketize as a count of bounds below each value (vectorizes over the block) */
        for (int i = 0; i < GM_NF4_BLOCK; i++) code[i] = 0;
        for (int j = 0; j < 15; j++)
            for (int i = 0; i < GM_NF4_BLOCK; i++) code[i] += bnd[j] < sc[i];
        uint8_t *pb = packed + b * (GM_NF4_BLOCK / 2);
        for (int64_t i = 0; i < len; i += 2) pb[i / 2] = (uint8_t)((code[i] << 4) | code[i + 1]);
    }
}

void gm_nf4_quantize_blocks(const float *x, int64_t n, uint8_t *packed, float *absmax, int n_threads) {
    GM_ASSERT(n >= 1);
    int64_t nb = (n + GM_NF4_BLOCK - 1) / GM_NF4_BLOCK;
    int nt = threads_or_default(n_threads);
    if (nt == 1 || nb <= 64) {
        nf4_blocks(x, n, 0, nb, packed, absmax);
        return;
    }
    GM_OMP_PARALLEL(nt, 1, {
        /* one contiguous range of blocks per thread */
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        nf4_blocks(x, n, nb * t / T, nb * (t + 1) / T, packed, absmax);
    });
}

/* ---- torch.mean (the nested offset) ---------------------------------------------------------- */

/* utils::CeilLog2 of ATen: 1 for x <= 2, else ceil(log2(x)). */
static int64_t ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t r = 0;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) r++;
    return r;
}

enum { SUM_LANES = 8, SUM_ILP = 4, SUM_LEVELS = 4 };

/* ATen row_sum over n_vec "vectors" of `lanes` floats (lanes = 8: Vectorized<float>; lanes = 1:
 * the scalar path), result per lane in out[lanes]: multi_row_sum treats the row as (n_vec/4, 4)
 * and keeps 4 levels of partial sums, each level flushed into the next every 2^level_power rows;
 * the n_vec % 4 leftover vectors go into partial 0, then partials 1..3 are added to it. */
static void aten_row_sum(const float *x, int64_t n_vec, int lanes, float *out) {
    float acc[SUM_LEVELS][SUM_ILP][SUM_LANES];
    memset(acc, 0, sizeof acc);
    int64_t size = n_vec / SUM_ILP;
    int64_t lp = ceil_log2(size) / SUM_LEVELS;
    if (lp < 4) lp = 4;
    int64_t step = (int64_t)1 << lp, mask = step - 1;
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < lanes; l++) acc[0][k][l] += x[(i * SUM_ILP + k) * lanes + l];
        for (int j = 1; j < SUM_LEVELS; j++) {
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * lp))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += x[(i * SUM_ILP + k) * lanes + l];
    for (int j = 1; j < SUM_LEVELS; j++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t r = size * SUM_ILP; r < n_vec; r++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += x[r * lanes + l];
    for (int k = 1; k < SUM_ILP; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    for (int l = 0; l < lanes; l++) out[l] = acc[0][0][l];
}

float gm_nf4_torch_mean(const float *v, int64_t n) {
    GM_ASSERT(n >= 1);
    float sum;
    if (n < SUM_LANES) {
        /* fewer values than one vector: the scalar row_sum */
        aten_row_sum(v, n, 1, &sum);
    } else {
        /* vectorized_inner_sum: vectors, then the scalar tail, then the 8 lanes in order */
        float lanes[SUM_LANES];
        int64_t n_vec = n / SUM_LANES;
        aten_row_sum(v, n_vec, SUM_LANES, lanes);
        float fin = 0.0f;
        for (int64_t k = n_vec * SUM_LANES; k < n; k++) fin += v[k];
        for (int l = 0; l < SUM_LANES; l++) fin += lanes[l];
        sum = fin;
    }
    sum = 0.0f + sum; /* the output starts at 0 and accumulates (CastStoreAccumulate) */
    return sum / (float)n; /* mean_out: sum_out(...).div_(numel) */
}

/* ---- NF4 second level (double quantization) -------------------------------------------------- */

#define LUT_SIZE 65536

/* Number of dynamic-map midpoints strictly below the value of LUT bin j: the entry bnb's
 * build_quantize_lut stores (its loop advances over sorted midpoints while midpoint < value). */
static int dyn_lut_entry(const float mid[255], int j) {
    float val = (float)(2 * j) / (float)(LUT_SIZE - 1) - 1.0f;
    int lo = 0, hi = 255; /* first midpoint >= val */
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (mid[m] < val) lo = m + 1;
        else hi = m;
    }
    return lo;
}

void gm_nf4_quantize_absmax(const float *absmax, int64_t n_blocks, uint8_t *absmax_code, float *absmax2,
                            float *offset, int n_threads) {
    GM_ASSERT(n_blocks >= 1);
    float mid[255];
    for (int i = 0; i < 255; i++) mid[i] = 0.5f * (GM_DYNAMIC_MAP_SIGNED[i] + GM_DYNAMIC_MAP_SIGNED[i + 1]);
    const float off = gm_nf4_torch_mean(absmax, n_blocks);
    *offset = off;
    int64_t ng = (n_blocks + GM_NF4_BLOCK2 - 1) / GM_NF4_BLOCK2;
    GM_OMP_FOR(threads_or_default(n_threads), ng > 8, schedule(static),
    for (int64_t g = 0; g < ng; g++) {
        int64_t b0 = g * GM_NF4_BLOCK2;
        int64_t b1 = b0 + GM_NF4_BLOCK2 < n_blocks ? b0 + GM_NF4_BLOCK2 : n_blocks;
        float A2 = 0.0f;
        for (int64_t b = b0; b < b1; b++) {
            float d = fabsf(absmax[b] - off);
            A2 = d > A2 ? d : A2;
        }
        absmax2[g] = A2;
        if (A2 == 0.0f) {
            memset(absmax_code + b0, 0, (size_t)(b1 - b0));
            continue;
        }
        float inv = 1.0f / A2;
        for (int64_t b = b0; b < b1; b++) {
            float c = clamp1((absmax[b] - off) * inv);
            float t = fmaf((c + 1.0f) * 0.5f, (float)(LUT_SIZE - 1), 0.5f);
            int j = (int)(uint16_t)(int32_t)t; /* cvttss2si, then the low 16 bits */
            absmax_code[b] = (uint8_t)dyn_lut_entry(mid, j);
        }
    });
}

void gm_nf4_quantize(const float *x, int64_t n, uint8_t *packed, uint8_t *absmax_code, float *absmax2,
                     float *offset, float *scratch, int n_threads) {
    gm_nf4_quantize_blocks(x, n, packed, scratch, n_threads);
    gm_nf4_quantize_absmax(scratch, gm_nf4_sizes_of(n).n_blocks, absmax_code, absmax2, offset, n_threads);
}

void gm_nf4_dequantize(const uint8_t *packed, const uint8_t *absmax_code, const float *absmax2, float offset,
                       int64_t n, float *out) {
    int64_t nb = gm_nf4_sizes_of(n).n_blocks;
    for (int64_t b = 0; b < nb; b++) {
        /* bnb: dequantize_blockwise (code * absmax2, native f32) then `absmax += offset` (torch) */
        float A = GM_DYNAMIC_MAP_SIGNED[absmax_code[b]] * absmax2[b / GM_NF4_BLOCK2];
        A = A + offset;
        int64_t e1 = (b + 1) * GM_NF4_BLOCK < n ? (b + 1) * GM_NF4_BLOCK : n;
        for (int64_t e = b * GM_NF4_BLOCK; e < e1; e++) {
            uint8_t byte = packed[e / 2];
            out[e] = GM_NF4_CODE[(e & 1) ? (byte & 0xF) : (byte >> 4)] * A;
        }
    }
}

/* ---- int8 vector-wise ------------------------------------------------------------------------ */

static void int8_row(const float *x, int64_t cols, int8_t *q, float *scale) {
    float a = 0.0f;
    for (int64_t k = 0; k < cols; k++) {
        float v = fabsf(x[k]);
        a = v > a ? v : a;
    }
    if (a == 0.0f) { /* bnb would produce 0 * inf = NaN here; we define the row as zeros */
        memset(q, 0, (size_t)cols);
        *scale = 0.0f;
        return;
    }
    float mul = (1.0f / a) * 127.0f; /* torch: 127.0 / row_stats = row_stats.reciprocal() * 127 */
    for (int64_t k = 0; k < cols; k++) {
        float r = rintf(x[k] * mul); /* torch.round: half to even */
        q[k] = (int8_t)(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
    }
    *scale = a / 127.0f;
}

void gm_int8_quantize(const float *x, int64_t rows, int64_t cols, int8_t *q, float *row_scale, int n_threads) {
    GM_OMP_FOR(threads_or_default(n_threads), rows * cols > 65536, schedule(static),
        for (int64_t r = 0; r < rows; r++) int8_row(x + r * cols, cols, q + r * cols, row_scale + r);
    );
}

/* ---- model re-encoding ----------------------------------------------------------------------- */

bool gm_quant_is_alias(gm_quant q, gm_dtype stored) {
    return q == GM_QUANT_STORED || (q == GM_QUANT_F32 && stored == GM_F32) ||
           (q == GM_QUANT_BF16 && stored == GM_BF16);
}

/* Rows per NF4 panel for K columns: a multiple of 64/gcd(K, 64) (so a panel is whole 64-blocks)
 * near 2^14 elements (64 KiB of f32 per thread, in cache; enough panels to balance the threads). */
static int64_t nf4_panel_rows(int64_t K, int64_t N) {
    int64_t g = K, b = GM_NF4_BLOCK;
    while (b) {
        int64_t t = g % b;
        g = b, b = t;
    }
    int64_t unit = GM_NF4_BLOCK / g;
    int64_t per = ((int64_t)1 << 14) / (unit * K);
    int64_t R = unit * (per > 1 ? per : 1);
    return R < N ? R : N;
}

static void encode_f32(const gm_wview *src, float *dst, int nt) {
    int64_t K = src->cols;
    GM_OMP_FOR(nt, 1, schedule(static),
        for (int64_t r = 0; r < src->rows; r++) gm_dequant_wrow(src, r, dst + r * K);
    );
}

static void encode_bf16(const gm_wview *src, uint16_t *dst, gm_quant_work *w) {
    int64_t K = src->cols;
    GM_OMP_PARALLEL(w->n_threads, 1, {
        float *row = w->rows + (size_t)omp_get_thread_num() * (size_t)K;
        GM_PRAGMA(omp for schedule(static))
        for (int64_t r = 0; r < src->rows; r++) {
            gm_dequant_wrow(src, r, row);
            for (int64_t k = 0; k < K; k++) dst[r * K + k] = gm_f32_to_bf16(row[k]);
        }
    });
}

static void encode_int8(const gm_wview *src, int8_t *q, float *scale, gm_quant_work *w) {
    int64_t K = src->cols;
    GM_OMP_PARALLEL(w->n_threads, 1, {
        float *row = w->rows + (size_t)omp_get_thread_num() * (size_t)K;
        GM_PRAGMA(omp for schedule(static))
        for (int64_t r = 0; r < src->rows; r++) {
            gm_dequant_wrow(src, r, row);
            int8_row(row, K, q + r * K, scale + r);
        }
    });
}

/* Each thread takes whole panels: dequantizes the rows into its own buffer, NF4-encodes them (blocks
 * never straddle panels), then the matrix's absmax vector is double-quantized. */
static void encode_nf4(const gm_wview *src, gm_wview *dst, gm_quant_work *w) {
    int64_t N = src->rows, K = src->cols, n = N * K;
    int64_t R = nf4_panel_rows(K, N), n_panels = (N + R - 1) / R;
    uint8_t *packed = (uint8_t *)dst->data;
    GM_OMP_PARALLEL(w->n_threads, 1, {
        float *panel = w->panel + (size_t)omp_get_thread_num() * (size_t)(R * K);
        GM_PRAGMA(omp for schedule(static))
        for (int64_t p = 0; p < n_panels; p++) {
            int64_t r0 = p * R, rr = N - r0 < R ? N - r0 : R;
            for (int64_t r = 0; r < rr; r++) gm_dequant_wrow(src, r0 + r, panel + r * K);
            int64_t e0 = r0 * K; /* a multiple of 64 by the choice of R */
            int64_t len = rr * K;
            nf4_blocks(panel, len, 0, (len + GM_NF4_BLOCK - 1) / GM_NF4_BLOCK, packed + e0 / 2,
                       w->absmax + e0 / GM_NF4_BLOCK);
        }
    });
    float offset = 0.0f;
    gm_nf4_quantize_absmax(w->absmax, gm_nf4_sizes_of(n).n_blocks, (uint8_t *)dst->absmax_code,
                           (float *)dst->absmax2, &offset, w->n_threads);
    dst->absmax_offset = offset;
}

void gm_quant_reserve(gm_quant q, int64_t N, int64_t K, gm_arena *a, gm_wview *dst) {
    size_t nk = (size_t)N * (size_t)K;
    memset(dst, 0, sizeof *dst);
    dst->rows = N;
    dst->cols = K;
    switch (q) {
    case GM_QUANT_F32:
        dst->type = GM_F32;
        dst->row_bytes = (size_t)K * 4;
        dst->data = gm_arena_alloc(a, nk * 4, GM_MEM_WEIGHTS);
        return;
    case GM_QUANT_BF16:
        dst->type = GM_BF16;
        dst->row_bytes = (size_t)K * 2;
        dst->data = gm_arena_alloc(a, nk * 2, GM_MEM_WEIGHTS);
        return;
    case GM_QUANT_INT8:
        dst->type = GM_I8;
        dst->row_bytes = (size_t)K;
        dst->data = gm_arena_alloc(a, nk, GM_MEM_WEIGHTS);
        dst->row_scale = gm_arena_alloc(a, (size_t)N * 4, GM_MEM_WEIGHTS);
        return;
    case GM_QUANT_NF4: {
        gm_nf4_sizes s = gm_nf4_sizes_of((int64_t)nk);
        dst->type = GM_NF4;
        dst->row_bytes = (size_t)K / 2; /* informative: NF4 is addressed as one flat tensor */
        dst->data = gm_arena_alloc(a, s.packed_bytes, GM_MEM_WEIGHTS);
        dst->absmax_code = gm_arena_alloc(a, (size_t)s.n_blocks, GM_MEM_WEIGHTS);
        dst->absmax2 = gm_arena_alloc(a, (size_t)s.n_groups * 4, GM_MEM_WEIGHTS);
        return;
    }
    default: GM_ASSERT(!"gm_quant_reserve: format aliases or is invalid");
    }
}

void gm_quant_work_init(gm_quant_work *w, gm_quant q, int n_threads) {
    memset(w, 0, sizeof *w);
    w->q = q;
    w->n_threads = threads_or_default(n_threads);
}

void gm_quant_work_size(gm_quant_work *w, int64_t N, int64_t K) {
    if (K > w->k_max) w->k_max = K;
    if (w->q == GM_QUANT_NF4) {
        int64_t p = nf4_panel_rows(K, N) * K, nb = gm_nf4_sizes_of(N * K).n_blocks;
        if (p > w->panel_max) w->panel_max = p;
        if (nb > w->nb_max) w->nb_max = nb;
    }
}

gm_status gm_quant_work_alloc(gm_quant_work *w, gm_error *err) {
    size_t row_floats = (size_t)w->n_threads * (size_t)w->k_max, panel = (size_t)w->n_threads * (size_t)w->panel_max;
    w->rows = gm_malloc((row_floats ? row_floats : 1) * sizeof(float));
    w->panel = gm_malloc((panel ? panel : 1) * sizeof(float));
    w->absmax = gm_malloc((size_t)(w->nb_max ? w->nb_max : 1) * sizeof(float));
    if (!w->rows || !w->panel || !w->absmax) {
        gm_quant_work_free(w);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory: cannot allocate %.1f MiB of transient buffers to re-encode weights to %s",
                            (double)(row_floats + panel + (size_t)w->nb_max) * 4.0 / 1048576.0, gm_quant_name(w->q));
    }
    return GM_OK;
}

void gm_quant_work_free(gm_quant_work *w) {
    gm_free(w->rows);
    gm_free(w->panel);
    gm_free(w->absmax);
    w->rows = w->panel = w->absmax = NULL;
}

void gm_quant_encode(const gm_wview *src, gm_wview *dst, gm_quant_work *w) {
    switch (w->q) {
    case GM_QUANT_F32: encode_f32(src, (float *)dst->data, w->n_threads); return;
    case GM_QUANT_BF16: encode_bf16(src, (uint16_t *)dst->data, w); return;
    case GM_QUANT_INT8: encode_int8(src, (int8_t *)dst->data, (float *)dst->row_scale, w); return;
    case GM_QUANT_NF4: encode_nf4(src, dst, w); return;
    default: GM_ASSERT(!"gm_quant_encode: format aliases or is invalid");
    }
}

void gm_q8_0_quantize_row(const float *x, int64_t n, void *dst) {
    uint8_t *b = dst;
    for (int64_t k = 0; k < n; k += 32, b += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[k + j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = gm_f32_to_f16(d);
        memcpy(b, &dh, 2); /* little-endian, as the file stores it */
        for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[k + j] * id);
    }
}
