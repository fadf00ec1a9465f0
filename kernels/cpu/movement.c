/*
 * movement.c - data movement inside backend memory: fill, row gather / scatter, KV-cache store,
 * and the last step of the chunked log-sum-exp.
 *
 * These exist so that model code (core/arch, core/train, core/model) never reads or writes
 * backend memory from the host: on a CUDA backend the same calls run on the device
 * (kernels/cuda/movement.cu). Shapes and contracts: kernels.h.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

void gm_k_fill_cpu(const gm_kctx *ctx, float *out, int64_t n, float value) {
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = value;
}

void gm_k_gather_rows_cpu(const gm_kctx *ctx, float *out, const float *x, const int32_t *rows, int64_t R,
                          int64_t C) {
    (void)ctx;
    for (int64_t i = 0; i < R; i++) memcpy(out + i * C, x + (int64_t)rows[i] * C, (size_t)C * sizeof(float));
}

void gm_k_scatter_rows_cpu(const gm_kctx *ctx, float *out, const float *x, const int32_t *rows, int64_t R,
                           int64_t C) {
    (void)ctx;
    for (int64_t i = 0; i < R; i++) memcpy(out + (int64_t)rows[i] * C, x + i * C, (size_t)C * sizeof(float));
}

void gm_k_kv_store_cpu(const gm_kctx *ctx, float *cache, const float *x, int64_t B, int64_t T, int64_t S,
                       int64_t W, int64_t pos0) {
    (void)ctx;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            memcpy(cache + (b * S + (pos0 + t) % S) * W, x + (b * T + t) * W, (size_t)W * sizeof(float));
}

void gm_k_xent_lse_finish_cpu(const gm_kctx *ctx, float *lse, const float *run_max, const float *run_sum,
                              int64_t R) {
    (void)ctx;
    for (int64_t i = 0; i < R; i++) lse[i] = run_max[i] + logf(run_sum[i]);
}
