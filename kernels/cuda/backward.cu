/*
 * backward.cu - CUDA twins of the training kernels in kernels/cpu/{norm,elementwise,xent,optim}.c:
 * rmsnorm_bwd, geglu_bwd, scale, dropout, the chunked cross-entropy halves, AdamW and the sum of
 * squares (rope_bwd sits beside rope_fwd in rope.cu). Formulas are documented once, in
 * kernels/kernels.h.
 */
#include "common.cuh"
#include "gm_philox.h"

#define GELU_C 0.7978845608028654f

__global__ static void rmsnorm_bwd_k(float *dx, const float *dy, const float *x, const float *w, const float *rstd,
                                     int64_t C, float beta) {
    int64_t n = blockIdx.x;
    float r = rstd[n];
    const float *xr = x + n * C, *dyr = dy + n * C;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += (dyr[c] * (w ? w[c] : 1.0f)) * (xr[c] * r);
    float mean = gm_block_sum(dot) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float g = r * (dyr[c] * (w ? w[c] : 1.0f) - xr[c] * r * mean);
        dx[n * C + c] = beta != 0.0f ? dx[n * C + c] + g : g;
    }
}

__global__ static void rmsnorm_dw_k(float *dw, const float *dy, const float *x, const float *rstd, int64_t N,
                                    int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int64_t n = 0; n < N; n++) s += dy[n * C + c] * (x[n * C + c] * rstd[n]);
    dw[c] += s;
}

extern "C" void gm_k_rmsnorm_bwd_cuda(const gm_kctx *ctx, float *dx, float *dw, const float *dy, const float *x,
                                      const float *w, const float *rstd, int64_t N, int64_t C, float beta) {
    if (N == 0) return;
    rmsnorm_bwd_k<<<(unsigned)N, 256, 0, gm_stream(ctx)>>>(dx, dy, x, w, rstd, C, beta);
    if (dw) rmsnorm_dw_k<<<gm_blocks(C, 256), 256, 0, gm_stream(ctx)>>>(dw, dy, x, rstd, N, C);
}

__global__ static void geglu_bwd_k(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                                   int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float z = gate[i], u = up[i], g = dh[i];
    float t = tanhf(GELU_C * (z + 0.044715f * z * z * z));
    float gelu = 0.5f * z * (1.0f + t);
    float dgelu = 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * 0.044715f * z * z);
    dgate[i] = g * u * dgelu;
    dup[i] = g * gelu;
}

extern "C" void gm_k_geglu_bwd_cuda(const gm_kctx *ctx, float *dgate, float *dup, const float *dh, const float *gate,
                                    const float *up, int64_t n) {
    if (n) geglu_bwd_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dgate, dup, dh, gate, up, n);
}

__global__ static void scale_k(float *out, const float *x, int64_t n, float s) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = s * x[i];
}

extern "C" void gm_k_scale_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n, float s) {
    if (n) scale_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n, s);
}

__global__ static void dropout_k(float *out, const float *x, int64_t n, float p, uint64_t key) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gm_philox_uniform(key, (uint64_t)i) >= p ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
}

extern "C" void gm_k_dropout_fwd_cuda(const gm_kctx *ctx, float *out, const float *x, int64_t n, float p,
                                      uint64_t key) {
    if (n) dropout_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(out, x, n, p, key);
}

static __device__ __forceinline__ float capped(float l, float c) { return c > 0.0f ? c * tanhf(l / c) : l; }

/* One block per row. */
__global__ static void xent_lse_k(float *run_max, float *run_sum, float *tgt_logit, const float *logits,
                                  const int32_t *targets, int64_t Vc, int64_t v0, float softcap) {
    int64_t r = blockIdx.x;
    const float *row = logits + r * Vc;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) mx = fmaxf(mx, capped(row[j], softcap));
    __shared__ float smax[32];
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (threadIdx.x % 32 == 0) smax[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = run_max[r];
    for (int i = 0; i < (int)(blockDim.x / 32); i++) mx = fmaxf(mx, smax[i]);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) s += expf(capped(row[j], softcap) - mx);
    s = gm_block_sum(s);
    if (threadIdx.x == 0) {
        float old = run_max[r] == -INFINITY ? 0.0f : run_sum[r] * expf(run_max[r] - mx);
        run_max[r] = mx;
        run_sum[r] = old + s;
        int32_t t = targets[r];
        if (t >= v0 && t < v0 + Vc) tgt_logit[r] = capped(row[t - v0], softcap);
    }
}

extern "C" void gm_k_xent_lse_update_cuda(const gm_kctx *ctx, float *run_max, float *run_sum, float *tgt_logit,
                                          const float *logits, const int32_t *targets, int64_t R, int64_t Vc,
                                          int64_t v0, float softcap) {
    if (R) xent_lse_k<<<(unsigned)R, 256, 0, gm_stream(ctx)>>>(run_max, run_sum, tgt_logit, logits, targets, Vc, v0,
                                                                softcap);
}

/* One block per row: xent_lse_k's statistics, then the row's weights and dh rescaled. */
__global__ static void xent_grad_update_k(float *run_max, float *run_sum, float *tgt_logit, float *logits, float *dh,
                                          const int32_t *targets, int64_t Vc, int64_t v0, int64_t C, float softcap) {
    int64_t r = blockIdx.x;
    float *row = logits + r * Vc, *d = dh + r * C;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) mx = fmaxf(mx, capped(row[j], softcap));
    __shared__ float s_alpha;
    float old = run_max[r];
    mx = fmaxf(old, gm_block_max(mx));
    int32_t t = targets[r];
    float zt = 0.0f;
    if (threadIdx.x == 0 && t >= v0 && t < v0 + Vc) zt = capped(row[t - v0], softcap); /* before row is overwritten */
    __syncthreads();
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < Vc; j += blockDim.x) {
        float z = capped(row[j], softcap), e = expf(z - mx);
        s += e;
        row[j] = v0 + j == t ? 0.0f : softcap > 0.0f ? e * (1.0f - (z / softcap) * (z / softcap)) : e;
    }
    s = gm_block_sum(s);
    if (threadIdx.x == 0) {
        float alpha = old == -INFINITY ? 0.0f : expf(old - mx);
        run_max[r] = mx;
        run_sum[r] = run_sum[r] * alpha + s;
        if (t >= v0 && t < v0 + Vc) tgt_logit[r] = zt;
        s_alpha = alpha;
    }
    __syncthreads();
    float alpha = s_alpha;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = alpha == 0.0f ? 0.0f : d[c] * alpha;
}

extern "C" void gm_k_xent_grad_update_cuda(const gm_kctx *ctx, float *run_max, float *run_sum, float *tgt_logit,
                                           float *logits, float *dh, const int32_t *targets, int64_t R, int64_t Vc,
                                           int64_t v0, int64_t C, float softcap) {
    if (R) xent_grad_update_k<<<(unsigned)R, 256, 0, gm_stream(ctx)>>>(run_max, run_sum, tgt_logit, logits, dh, targets,
                                                                        Vc, v0, C, softcap);
}

__global__ static void xent_grad_finish_k(float *dh, const float *e_tgt, const float *run_sum, const float *lse,
                                          const float *tgt_logit, const int32_t *targets, int64_t R, int64_t C,
                                          float softcap, float grad_scale) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * C) return;
    int64_t r = i / C;
    if (targets[r] < 0) {
        dh[i] = 0.0f;
        return;
    }
    float z = tgt_logit[r], dz = softcap > 0.0f ? 1.0f - (z / softcap) * (z / softcap) : 1.0f;
    dh[i] = grad_scale / run_sum[r] * dh[i] + grad_scale * dz * (expf(z - lse[r]) - 1.0f) * e_tgt[i];
}

extern "C" void gm_k_xent_grad_finish_cuda(const gm_kctx *ctx, float *dh, const float *e_tgt, const float *run_sum,
                                           const float *lse, const float *tgt_logit, const int32_t *targets, int64_t R,
                                           int64_t C, float softcap, float grad_scale) {
    int64_t n = R * C;
    if (n) xent_grad_finish_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(dh, e_tgt, run_sum, lse, tgt_logit, targets,
                                                                             R, C, softcap, grad_scale);
}

__global__ static void adamw_k(float *p, const float *g, float *m, float *v, int64_t n, float beta1, float beta2,
                               float eps, float decay, float step_size, float bc2_sqrt) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    p[i] *= decay;
    m[i] += (1.0f - beta1) * (gi - m[i]);
    v[i] = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    p[i] += -step_size * m[i] / denom;
}

extern "C" void gm_k_adamw_cuda(const gm_kctx *ctx, float *p, const float *g, float *m, float *v, int64_t n,
                                float beta1, float beta2, float eps, float decay, float step_size, float bc2_sqrt) {
    if (n) adamw_k<<<gm_blocks(n, 256), 256, 0, gm_stream(ctx)>>>(p, g, m, v, n, beta1, beta2, eps, decay, step_size,
                                                                 bc2_sqrt);
}

/* One block of 1024 threads, double accumulation: deterministic and plenty for gradient norms. */
__global__ static void sumsq_k(double *out, const float *x, int64_t n) {
    __shared__ double part[1024];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i] * (double)x[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int stride = 512; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) part[threadIdx.x] += part[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = part[0];
}

extern "C" void gm_k_sumsq_cuda(const gm_kctx *ctx, double *out, const float *x, int64_t n) {
    sumsq_k<<<1, 1024, 0, gm_stream(ctx)>>>(out, x, n);
}
