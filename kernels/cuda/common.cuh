/*
 * common.cuh - shared device helpers for kernels/cuda/*.cu (internal).
 *
 * GM_CUDA_CHECK logs and records the first CUDA error; kernels are launched asynchronously on
 * ctx->stream and their errors surface at gm_cuda_sync (style guide §4.4, rule 15).
 */
#ifndef GM_CUDA_COMMON_CUH
#define GM_CUDA_COMMON_CUH

#include "kernels.h"
#include "nf4_tables.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define GM_CUDA_CHECK(call) gm_cuda_check((call), #call, __FILE__, __LINE__)

void gm_cuda_check(cudaError_t e, const char *what, const char *file, int line);

static inline cudaStream_t gm_stream(const gm_kctx *ctx) { return (cudaStream_t)ctx->stream; }

/* The process's cuBLAS handle bound to stream s (created on first use; matmul.cu). */
cublasHandle_t gm_cuda_blas(cudaStream_t s);

/* Row-major C (M x N) = alpha op(A) op(B) + beta C with op(A) M x K, op(B) K x N and leading
 * dimensions counted in row-major terms. cuBLAS is column-major, so this computes
 * C^T = op(B)^T op(A)^T with the operands swapped; the transpose flags pass through unchanged. */
void gm_cuda_sgemm_rm(cudaStream_t s, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

static inline unsigned gm_blocks(int64_t n, unsigned threads) {
    return (unsigned)((n + threads - 1) / threads);
}

static __device__ __forceinline__ float gm_h2f(const uint8_t *p) {
    unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

/* 6-bit scale/min of sub-block j for Q4_K/Q5_K (ggml get_scale_min_k4). */
static __device__ __forceinline__ void gm_scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element e of a row of `type` starting at `row` (one f32 value): the device twin of
 * gm_dequant_row, element-wise so any thread can decode any element. Formulas: formats.md §1.5
 * (kernels/cpu/dequant.c is the commented CPU reference). */
static __device__ __forceinline__ float gm_dq_elem(gm_dtype type, const uint8_t *row, int64_t e) {
    switch (type) {
    case GM_F32: return ((const float *)row)[e];
    case GM_F16: return gm_h2f(row + 2 * e);
    case GM_BF16: return __uint_as_float((unsigned)(row[2 * e] | (row[2 * e + 1] << 8)) << 16);
    case GM_Q8_0: {
        const uint8_t *b = row + (e / 32) * 34;
        return gm_h2f(b) * (float)((const int8_t *)(b + 2))[e % 32];
    }
    case GM_Q4_0: {
        const uint8_t *b = row + (e / 32) * 18;
        int l = (int)(e % 32);
        int q = l < 16 ? (b[2 + l] & 0xF) : (b[2 + l - 16] >> 4);
        return gm_h2f(b) * (float)(q - 8);
    }
    case GM_Q4_1: {
        const uint8_t *b = row + (e / 32) * 20;
        int l = (int)(e % 32);
        int q = l < 16 ? (b[4 + l] & 0xF) : (b[4 + l - 16] >> 4);
        return gm_h2f(b) * (float)q + gm_h2f(b + 2);
    }
    case GM_Q5_0:
    case GM_Q5_1: {
        bool one = type == GM_Q5_1;
        const uint8_t *b = row + (e / 32) * (one ? 24 : 22);
        const uint8_t *qhp = b + (one ? 4 : 2), *qs = qhp + 4;
        unsigned qh = qhp[0] | (qhp[1] << 8) | (qhp[2] << 16) | ((unsigned)qhp[3] << 24);
        int l = (int)(e % 32);
        int nib = l < 16 ? (qs[l] & 0xF) : (qs[l - 16] >> 4);
        int q = nib | (int)(((qh >> l) & 1u) << 4);
        return one ? gm_h2f(b) * (float)q + gm_h2f(b + 2) : gm_h2f(b) * (float)(q - 16);
    }
    case GM_Q2_K: {
        const uint8_t *b = row + (e / 256) * 84;
        int i = (int)(e % 256), h = i / 128, k = (i % 128) / 32, l = i % 32;
        int q = (b[16 + 32 * h + l] >> (2 * k)) & 3;
        int sc = b[i / 16];
        return gm_h2f(b + 80) * (float)(sc & 0xF) * (float)q - gm_h2f(b + 82) * (float)(sc >> 4);
    }
    case GM_Q3_K: {
        const uint8_t *b = row + (e / 256) * 110;
        const uint8_t *sc = b + 96;
        int i = (int)(e % 256), h = i / 128, k = (i % 128) / 32, l = i % 32, j = i / 16;
        int low4 = j < 8 ? (sc[j] & 0xF) : (sc[j - 8] >> 4);
        int high2 = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        int S = (low4 | (high2 << 4)) - 32;
        int low2 = (b[32 + 32 * h + l] >> (2 * k)) & 3;
        int hb = (b[i % 32] >> (i / 32)) & 1;
        return gm_h2f(b + 108) * (float)S * (float)(low2 - (hb ? 0 : 4));
    }
    case GM_Q4_K:
    case GM_Q5_K: {
        bool five = type == GM_Q5_K;
        const uint8_t *b = row + (e / 256) * (five ? 176 : 144);
        int i = (int)(e % 256), c = i / 64, l = i % 32, hi = (i % 64) >= 32;
        int sc, m;
        gm_scale_min_k4(i / 32, b + 4, &sc, &m);
        const uint8_t *qs = b + (five ? 48 : 16);
        int q = hi ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 0xF);
        if (five) q += 16 * ((b[16 + i % 32] >> (i / 32)) & 1);
        return gm_h2f(b) * (float)sc * (float)q - gm_h2f(b + 2) * (float)m;
    }
    case GM_Q6_K: {
        const uint8_t *b = row + (e / 256) * 210;
        int i = (int)(e % 256), h = i / 128, r = i % 128, k = r / 32, l = r % 32;
        uint8_t byte = b[64 * h + l + 32 * (k & 1)];
        int low4 = k < 2 ? (byte & 0xF) : (byte >> 4);
        int high2 = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        int q = (low4 | (high2 << 4)) - 32;
        return gm_h2f(b + 208) * (float)((const int8_t *)(b + 192))[i / 16] * (float)q;
    }
    default: return 0.0f; /* unreachable: the CPU side validates dtypes */
    }
}

/* Element (r, k) of any weight view (NF4 and int8 included); w is passed by value, its pointers
 * are device pointers. */
static __device__ __forceinline__ float gm_dq_welem(const gm_wview &w, int64_t r, int64_t k) {
    if (w.type == GM_NF4) {
        int64_t e = r * w.cols + k, b = e / 64;
        /* multiply then add, each rounded (no FMA), as bitsandbytes computes it */
        float absmax = __fadd_rn(__fmul_rn(GM_DYNAMIC_MAP_SIGNED[w.absmax_code[b]], w.absmax2[b / 256]), w.absmax_offset);
        uint8_t byte = ((const uint8_t *)w.data)[e / 2];
        int nib = (e & 1) ? (byte & 0xF) : (byte >> 4);
        return GM_NF4_CODE[nib] * absmax;
    }
    if (w.type == GM_I8)
        return (float)((const int8_t *)w.data)[(size_t)r * w.row_bytes + (size_t)k] * w.row_scale[r];
    return gm_dq_elem(w.type, (const uint8_t *)w.data + (size_t)r * w.row_bytes, k);
}

/* Block-wide sum of v over blockDim.x threads (blockDim.x a multiple of 32, <= 1024). */
static __device__ __forceinline__ float gm_block_sum(float v) {
    __shared__ float warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    __syncthreads(); /* warp_sums may still be read by a previous call */
    if (lane == 0) warp_sums[w] = v;
    __syncthreads();
    int nw = (int)(blockDim.x / 32);
    float t = lane < nw ? warp_sums[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* The block's maximum of v, returned to every thread (as gm_block_sum). */
static __device__ __forceinline__ float gm_block_max(float v) {
    __shared__ float warp_max[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    __syncthreads(); /* warp_max may still be read by a previous call */
    if (lane == 0) warp_max[w] = v;
    __syncthreads();
    int nw = (int)(blockDim.x / 32);
    float t = lane < nw ? warp_max[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
    return t;
}

#endif /* GM_CUDA_COMMON_CUH */
