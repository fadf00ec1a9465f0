/*
 * test_kernels_cuda.c - every CUDA kernel against its CPU twin on identical random inputs
 * (style guide §4.7 rule 26). Skips (exit 77) in a CPU-only build or without a GPU, so the suite
 * passes on machines without one; on a GPU machine it is part of the device check script
 * (tests/cuda/device_check.sh).
 */
#include "test_util.h"

#ifndef GM_HAVE_CUDA
int main(void) { return gm_test_skip("built without CUDA (nvcc not found at configure time)"); }
#else
#include "gm_alloc.h"
#include "gm_cuda.h"
#include "kernels.h"

#include <string.h>

static uint64_t seed = 99;

static float *host_rand(size_t n, float scale) {
    float *p = gm_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = gm_test_rand(&seed) * scale;
    return p;
}

static void *to_dev(const void *h, size_t bytes) {
    void *d = gm_cuda_malloc(bytes ? bytes : 4);
    gm_cuda_memcpy(d, 1, h, 0, bytes);
    return d;
}

static void from_dev(void *h, const void *d, size_t bytes) {
    gm_cuda_sync();
    gm_cuda_memcpy(h, 0, d, 1, bytes);
}

static void cmp(const char *what, const float *gpu, const float *cpu, size_t n) {
    gm_check_close(what, gpu, cpu, n, TOL_CUDA_VS_CPU_ABS, TOL_CUDA_VS_CPU_REL);
}

static void test_elementwise(gm_kctx *hc, gm_kctx *dc) {
    int64_t n = 10007;
    float *g = host_rand((size_t)n, 4), *u = host_rand((size_t)n, 2), *o = gm_malloc((size_t)n * 4), *r = gm_malloc((size_t)n * 4);
    float *dg = to_dev(g, (size_t)n * 4), *du = to_dev(u, (size_t)n * 4), *dout = gm_cuda_malloc((size_t)n * 4);
    gm_k_geglu_fwd_cpu(hc, r, g, u, n);
    gm_k_geglu_fwd_cuda(dc, dout, dg, du, n);
    from_dev(o, dout, (size_t)n * 4);
    cmp("cuda geglu", o, r, (size_t)n);
    gm_k_softcap_fwd_cpu(hc, r, g, n, 30.0f);
    gm_k_softcap_fwd_cuda(dc, dout, dg, n, 30.0f);
    from_dev(o, dout, (size_t)n * 4);
    cmp("cuda softcap", o, r, (size_t)n);
    memcpy(r, g, (size_t)n * 4);
    gm_k_add_fwd_cpu(hc, r, u, n);
    gm_k_add_fwd_cuda(dc, dg, du, n);
    from_dev(o, dg, (size_t)n * 4);
    cmp("cuda add", o, r, (size_t)n);
    gm_cuda_free(dg), gm_cuda_free(du), gm_cuda_free(dout);
    gm_free(g), gm_free(u), gm_free(o), gm_free(r);
}

static void test_norm_rope(gm_kctx *hc, gm_kctx *dc) {
    int64_t N = 33, C = 640, NH = 4, D = 160;
    float *x = host_rand((size_t)(N * C), 3), *w = host_rand((size_t)C, 2);
    float *o = gm_malloc((size_t)(N * C) * 4), *r = gm_malloc((size_t)(N * C) * 4);
    float *dx = to_dev(x, (size_t)(N * C) * 4), *dw = to_dev(w, (size_t)C * 4), *dout = gm_cuda_malloc((size_t)(N * C) * 4);
    gm_k_rmsnorm_fwd_cpu(hc, r, NULL, x, w, N, C, 1e-6f);
    gm_k_rmsnorm_fwd_cuda(dc, dout, NULL, dx, dw, N, C, 1e-6f);
    from_dev(o, dout, (size_t)(N * C) * 4);
    cmp("cuda rmsnorm", o, r, (size_t)(N * C));
    int32_t pos[33];
    for (int i = 0; i < 33; i++) pos[i] = i * 97;
    int32_t *dpos = to_dev(pos, sizeof pos);
    gm_k_rope_fwd_cpu(hc, r, x, pos, N, NH, D, 1e6f, 0.125f);
    gm_k_rope_fwd_cuda(dc, dout, dx, dpos, N, NH, D, 1e6f, 0.125f);
    from_dev(o, dout, (size_t)(N * C) * 4);
    cmp("cuda rope", o, r, (size_t)(N * C));
    gm_cuda_free(dx), gm_cuda_free(dw), gm_cuda_free(dout), gm_cuda_free(dpos);
    gm_free(x), gm_free(w), gm_free(o), gm_free(r);
}

static void test_attention(gm_kctx *hc, gm_kctx *dc) {
    int64_t B = 2, T = 7, H = 4, KVH = 2, D = 64, S = 11, pos0 = 9, W = 5;
    size_t nq = (size_t)(B * T * H * D), nk = (size_t)(B * S * KVH * D);
    float *q = host_rand(nq, 1), *k = host_rand(nk, 1), *v = host_rand(nk, 1);
    float *o = gm_malloc(nq * 4), *r = gm_malloc(nq * 4);
    float *dq = to_dev(q, nq * 4), *dk = to_dev(k, nk * 4), *dv = to_dev(v, nk * 4), *dout = gm_cuda_malloc(nq * 4);
    for (int pass = 0; pass < 2; pass++) {
        int64_t window = pass ? W : 0, s = pass ? S : pos0 + T;
        if (!pass) { /* full layer: needs all positions; use a fresh cache of pos0+T slots */
            gm_cuda_free(dk), gm_cuda_free(dv), gm_free(k), gm_free(v);
            nk = (size_t)(B * s * KVH * D);
            k = host_rand(nk, 1), v = host_rand(nk, 1);
            dk = to_dev(k, nk * 4), dv = to_dev(v, nk * 4);
        }
        gm_k_attention_fwd_cpu(hc, r, q, k, v, B, T, H, KVH, D, s, pos0, window, 0.125f);
        gm_k_attention_fwd_cuda(dc, dout, dq, dk, dv, B, T, H, KVH, D, s, pos0, window, 0.125f);
        from_dev(o, dout, nq * 4);
        cmp(pass ? "cuda attention sliding ring" : "cuda attention full", o, r, nq);
        if (!pass) { /* sliding pass uses S slots */
            gm_cuda_free(dk), gm_cuda_free(dv), gm_free(k), gm_free(v);
            nk = (size_t)(B * S * KVH * D);
            k = host_rand(nk, 1), v = host_rand(nk, 1);
            dk = to_dev(k, nk * 4), dv = to_dev(v, nk * 4);
        }
    }
    gm_cuda_free(dq), gm_cuda_free(dk), gm_cuda_free(dv), gm_cuda_free(dout);
    gm_free(q), gm_free(k), gm_free(v), gm_free(o), gm_free(r);
}

/* matmul and embedding over every stored dtype: random bytes with sane f16 scales are valid
 * encodings; both sides dequantize the same bytes. */
static void *rand_weight(gm_dtype type, int64_t N, int64_t K, size_t *rb) {
    *rb = gm_dtype_row_bytes(type, K);
    uint8_t *w = gm_malloc((size_t)N * *rb);
    const gm_dtype_info *in = gm_dtype_get(type);
    if (type == GM_F32) {
        for (int64_t i = 0; i < N * K; i++) ((float *)w)[i] = gm_test_rand(&seed);
        return w;
    }
    for (size_t i = 0; i < (size_t)N * *rb; i++) w[i] = (uint8_t)(gm_test_rand(&seed) * 127 + 128);
    if (type == GM_F16 || type == GM_BF16) {
        for (int64_t i = 0; i < N * K; i++)
            ((uint16_t *)w)[i] = type == GM_F16 ? gm_f32_to_f16(gm_test_rand(&seed)) : gm_f32_to_bf16(gm_test_rand(&seed));
        return w;
    }
    int off[2] = {0, -1};
    if (type == GM_Q4_1 || type == GM_Q5_1 || type == GM_Q4_K || type == GM_Q5_K) off[1] = 2;
    if (type == GM_Q2_K) off[0] = 80, off[1] = 82;
    if (type == GM_Q3_K) off[0] = 108;
    if (type == GM_Q6_K) off[0] = 208;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < K / in->block_size; b++)
            for (int j = 0; j < 2; j++)
                if (off[j] >= 0) {
                    uint16_t h = gm_f32_to_f16(0.001f + 0.002f * (gm_test_rand(&seed) + 1));
                    memcpy(w + (size_t)n * *rb + (size_t)b * in->type_size + off[j], &h, 2);
                }
    return w;
}

static void test_matmul_embed(gm_kctx *hc, gm_kctx *dc) {
    gm_dtype types[] = {GM_F32, GM_F16, GM_BF16, GM_Q8_0, GM_Q4_0, GM_Q4_1, GM_Q5_0, GM_Q5_1,
                        GM_Q2_K, GM_Q3_K, GM_Q4_K, GM_Q5_K, GM_Q6_K};
    int64_t M = 5, N = 700, K = 512;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb;
        void *w = rand_weight(types[t], N, K, &rb);
        float *x = host_rand((size_t)(M * K), 1), *o = gm_malloc((size_t)(M * N) * 4), *r = gm_malloc((size_t)(M * N) * 4);
        void *dw = to_dev(w, (size_t)N * rb);
        float *dx = to_dev(x, (size_t)(M * K) * 4), *dout = gm_cuda_malloc((size_t)(M * N) * 4);
        gm_wview hw = {types[t], w, rb, N, K, 0, 0, 0.0f, 0}, dwv = {types[t], dw, rb, N, K, 0, 0, 0.0f, 0};
        gm_k_matmul_fwd_cpu(hc, r, x, &hw, M, 0.0f);
        gm_k_matmul_fwd_cuda(dc, dout, dx, &dwv, M, 0.0f);
        from_dev(o, dout, (size_t)(M * N) * 4);
        char what[64];
        snprintf(what, sizeof what, "cuda matmul %s", gm_dtype_name(types[t]));
        gm_check_close(what, o, r, (size_t)(M * N), 1e-3, 1e-4);
        int32_t ids[5] = {0, 699, 3, 3, 250};
        int32_t *dids = to_dev(ids, sizeof ids);
        gm_k_embed_fwd_cpu(hc, r, ids, &hw, 5, 25.3f);
        gm_k_embed_fwd_cuda(dc, dout, dids, &dwv, 5, 25.3f);
        from_dev(o, dout, (size_t)(5 * K) * 4);
        snprintf(what, sizeof what, "cuda embed %s", gm_dtype_name(types[t]));
        cmp(what, o, r, (size_t)(5 * K));
        gm_cuda_free(dw), gm_cuda_free(dx), gm_cuda_free(dout), gm_cuda_free(dids);
        gm_free(w), gm_free(x), gm_free(o), gm_free(r);
    }
}

int main(void) {
    if (gm_cuda_device_count() <= 0) return gm_test_skip("no CUDA device");
    printf("device: %s\n", gm_cuda_device_name());
    size_t scratch = gm_k_matmul_scratch_floats(GM_Q8_0, 4096, 4096, 1);
    gm_kctx hc = {.n_threads = 2, .scratch = gm_malloc(scratch * 4), .scratch_floats = scratch};
    gm_kctx dc = {.n_threads = 1, .stream = NULL, .scratch = gm_cuda_malloc(scratch * 4), .scratch_floats = scratch};
    test_elementwise(&hc, &dc);
    test_norm_rope(&hc, &dc);
    test_attention(&hc, &dc);
    test_matmul_embed(&hc, &dc);
    gm_cuda_free(dc.scratch);
    gm_free(hc.scratch);
    return gm_test_finish();
}
#endif
