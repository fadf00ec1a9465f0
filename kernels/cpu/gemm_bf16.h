/*
 * gemm_bf16.h - the CPU kernels' bf16 GEMM (gemm_bf16.c, oneDNN), private to kernels/cpu.
 *
 * Ownership: every buffer is the caller's; nothing is kept but oneDNN's cached primitives.
 * Errors: gm_cpu_gemm_bf16 returns false (nothing written) when oneDNN is missing or fails; the
 * caller then computes in f32.
 */
#ifndef GM_GEMM_BF16_H
#define GM_GEMM_BF16_H

#include <stdbool.h>
#include <stdint.h>

/* dst (rows, cols) bf16, row stride ld_dst <- src (rows, cols) f32, row stride ld_src; rounded to
 * nearest even (gm_f32_to_bf16), n_threads threads for large copies. */
void gm_cpu_to_bf16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols,
                    int n_threads);

/* c (M, N) f32, row stride ldc, = (accumulate: c +) a (M, K) . B, every product of bf16 inputs
 * summed in f32. a: bf16, row stride lda. B: bf16, b_nk ? stored as N rows of K (row stride ldb:
 * the product is a . b^T, a weight's layout) : stored as K rows of N (row stride ldb). Threads:
 * omp_get_max_threads() (gm_kernels_set_threads). */
bool gm_cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      bool b_nk, float *c, int64_t ldc, bool accumulate);

#endif
