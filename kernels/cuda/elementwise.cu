/*
 * elementwise.cu - CUDA twins of kernels/cpu/elementwise.c and kernels/cpu/embed.c.
 */
#include "common.cuh"

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */

__global__ static void geglu_k(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float z = gate[i];
    out[i] = 0.5f * z * (1.0f + tanhf(GELU_C * (z + 0.044715f * z * z * z))) * up[i];
}

__global__ static void add_k(float *y, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ static void softcap_k(float *out, const float *x, int64_t n, float cap) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cap * tanhf(x[i] / cap);
}

__global__ static void embed_k(float *out, const int32_t *ids, gm_wview table, int64_t N, float scale) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * table.cols) return;
    out[i] = gm_dq_welem(table, ids[i / table.cols], i % table.cols) * scale;
}

extern "C" void gm_k_geglu_fwd_cuda(const gm_kctx *ctx, float *out, const float *gate, const float *up, int64_t n) {
    if (n) geglu_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, gate, up, n);
}

extern "C" void gm_k_add_fwd_cuda(const gm_kctx *ctx, float *y, const float *x, int64_t n) {
    if (n) add_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(y, x, n);
}

extern "C" void gm_k_softcap_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n, float cap) {
    if (n) softcap_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n, cap);
}

extern "C" void gm_k_embed_fwd_cuda(const gm_kctx *ctx, float *out, const int32_t *ids, const gm_wview *table,
                                    int64_t N, float scale) {
    int64_t n = N * table->cols;
    if (n) embed_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, ids, *table, N, scale);
}
