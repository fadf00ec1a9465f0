/*
 * test_kernels_cuda.c - every CUDA kernel against its CPU twin on identical random inputs
 * (style guide §4.7 rule 26). Skips (exit 77) in a CPU-only build or without a GPU, so the suite
 * passes on machines without one; on a GPU machine it is part of the GPU script
 * (tests/device/run.sh), which sets GM_REQUIRE_GPU=1: then no device (or no CUDA build) fails. Also the CUDA backend (kernels/cuda/backend.cu): a tiny-model
 * LoRA run and generation on it against the CPU backend - this is the program that links the
 * CUDA backend, so a kernel without its CUDA twin fails to link here. And NCCL (data-parallel
 * training's device all-reduce, kernels/cuda/dist_nccl.cu) on a world of one process.
 */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#ifndef GM_HAVE_CUDA
int main(void) {
    const char *req = getenv("GM_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) { /* the GPU script must not pass on a CPU-only build */
        CHECK(0, "built without CUDA, and GM_REQUIRE_GPU=1 asks for a GPU run");
        return gm_test_finish();
    }
    return gm_test_skip_unless_ci("built without CUDA (nvcc not found at configure time)");
}
#else
#include "gm_alloc.h"
#include "gm_backend.h"
#include "gm_cuda.h"
#include "gm_decoder.h"
#include "gm_dist.h"
#include "gm_model.h"
#include "gm_train.h"
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

/* The vision tower's kernels (kernels/cpu/vision.c) and attention over image blocks (kv_end). */
static void test_vision(gm_kctx *hc, gm_kctx *dc) {
    int64_t N = 2 * 36, C = 96, B = 2, P = 6, K = 3;
    size_t n = (size_t)(N * C);
    float *x = host_rand(n, 3), *w = host_rand((size_t)C, 2), *b = host_rand((size_t)C, 1), *dy = host_rand(n, 1);
    float *o = gm_malloc(n * 4), *r = gm_malloc(n * 4), *st = gm_malloc((size_t)N * 8), *dst = gm_malloc((size_t)N * 8);
    float *dx = to_dev(x, n * 4), *dw = to_dev(w, (size_t)C * 4), *db = to_dev(b, (size_t)C * 4), *ddy = to_dev(dy, n * 4);
    float *dout = gm_cuda_malloc(n * 4), *dstat = gm_cuda_malloc((size_t)N * 8);
    gm_k_layernorm_fwd_cpu(hc, r, st, st + N, x, w, b, N, C, 1e-6f);
    gm_k_layernorm_fwd_cuda(dc, dout, dstat, dstat + N, dx, dw, db, N, C, 1e-6f);
    from_dev(o, dout, n * 4);
    cmp("cuda layernorm", o, r, n);
    from_dev(dst, dstat, (size_t)N * 8);
    cmp("cuda layernorm mean, rstd", dst, st, (size_t)(2 * N));
    gm_k_layernorm_bwd_cpu(hc, r, NULL, NULL, dy, x, w, st, st + N, N, C, 0.0f);
    gm_k_layernorm_bwd_cuda(dc, dout, NULL, NULL, ddy, dx, dw, dstat, dstat + N, N, C, 0.0f);
    from_dev(o, dout, n * 4);
    cmp("cuda layernorm_bwd", o, r, n);
    gm_k_gelu_fwd_cpu(hc, r, x, (int64_t)n);
    gm_k_gelu_fwd_cuda(dc, dout, dx, (int64_t)n);
    from_dev(o, dout, n * 4);
    cmp("cuda gelu", o, r, n);
    gm_k_gelu_bwd_cpu(hc, r, dy, x, (int64_t)n);
    gm_k_gelu_bwd_cuda(dc, dout, ddy, dx, (int64_t)n);
    from_dev(o, dout, n * 4);
    cmp("cuda gelu_bwd", o, r, n);
    gm_k_avgpool_fwd_cpu(hc, r, x, B, P, K, C);
    gm_k_avgpool_fwd_cuda(dc, dout, dx, B, P, K, C);
    from_dev(o, dout, (size_t)(B * 4 * C) * 4);
    cmp("cuda avgpool", o, r, (size_t)(B * 4 * C));
    gm_k_avgpool_bwd_cpu(hc, r, dy, B, P, K, C);
    gm_k_avgpool_bwd_cuda(dc, dout, ddy, B, P, K, C);
    from_dev(o, dout, n * 4);
    cmp("cuda avgpool_bwd", o, r, n);
    memcpy(r, x, n * 4);
    gm_k_bias_fwd_cpu(hc, r, b, N, C);
    gm_k_bias_fwd_cuda(dc, dx, db, N, C);
    from_dev(o, dx, n * 4);
    cmp("cuda bias", o, r, n);
    /* attention over an image block (kv_end), training kernel: T = 36, H = 4, KVH = 2, D = 12 */
    int64_t T = 36, H = 4, KVH = 2, D = 12;
    int32_t ends[72];
    for (int t = 0; t < 36; t++) ends[t] = t >= 4 && t < 20 ? 20 : t + 1, ends[36 + t] = 36;
    int32_t *dends = to_dev(ends, sizeof ends);
    size_t nq = (size_t)(B * T * H * D), nk = (size_t)(B * T * KVH * D), sc = gm_k_attention_scratch_floats(B, T, H, D, 1);
    float *q = host_rand(nq, 1), *k = host_rand(nk, 1), *v = host_rand(nk, 1), *lse = gm_malloc((size_t)(B * H * T) * 4);
    float *ao = gm_malloc(nq * 4), *ar = gm_malloc(nq * 4);
    float *dq = to_dev(q, nq * 4), *dk = to_dev(k, nk * 4), *dv = to_dev(v, nk * 4), *dao = gm_cuda_malloc(nq * 4);
    float *dlse = gm_cuda_malloc((size_t)(B * H * T) * 4);
    gm_kctx hs = *hc, ds = *dc;
    hs.scratch = gm_malloc(gm_k_attention_scratch_floats(B, T, H, D, hc->n_threads) * 4);
    ds.scratch = gm_cuda_malloc(sc * 4);
    gm_k_attention_train_fwd_cpu(&hs, ar, lse, q, k, v, ends, B, T, H, KVH, D, 0, 0.3f);
    gm_k_attention_train_fwd_cuda(&ds, dao, dlse, dq, dk, dv, dends, B, T, H, KVH, D, 0, 0.3f);
    from_dev(ao, dao, nq * 4);
    cmp("cuda attention_train_fwd, image blocks", ao, ar, nq);
    gm_free(hs.scratch), gm_cuda_free(ds.scratch);
    gm_cuda_free(dq), gm_cuda_free(dk), gm_cuda_free(dv), gm_cuda_free(dao), gm_cuda_free(dlse), gm_cuda_free(dends);
    gm_free(q), gm_free(k), gm_free(v), gm_free(lse), gm_free(ao), gm_free(ar);
    gm_cuda_free(dx), gm_cuda_free(dw), gm_cuda_free(db), gm_cuda_free(ddy), gm_cuda_free(dout), gm_cuda_free(dstat);
    gm_free(x), gm_free(w), gm_free(b), gm_free(dy), gm_free(o), gm_free(r), gm_free(st), gm_free(dst);
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
        gm_k_attention_fwd_cpu(hc, r, q, k, v, NULL, B, T, H, KVH, D, s, pos0, window, 0.125f);
        gm_k_attention_fwd_cuda(dc, dout, dq, dk, dv, NULL, B, T, H, KVH, D, s, pos0, window, 0.125f);
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

/* fill, gather / scatter rows, KV-cache store, log-sum-exp finish: exact on both sides */
static void test_movement(gm_kctx *hc, gm_kctx *dc) {
    int64_t R = 37, C = 96, rows_in = 80, B = 2, T = 5, S = 7, W = 48;
    float *x = host_rand((size_t)(rows_in * C), 1), *o = gm_malloc((size_t)(rows_in * C) * 4), *r = gm_malloc((size_t)(rows_in * C) * 4);
    int32_t rows[37];
    for (int i = 0; i < R; i++) rows[i] = (int32_t)((i * 13 + 5) % rows_in); /* distinct */
    float *dx = to_dev(x, (size_t)(rows_in * C) * 4), *dout = gm_cuda_malloc((size_t)(rows_in * C) * 4);
    int32_t *drows = to_dev(rows, sizeof rows);
    gm_k_gather_rows_cpu(hc, r, x, rows, R, C);
    gm_k_gather_rows_cuda(dc, dout, dx, drows, R, C);
    from_dev(o, dout, (size_t)(R * C) * 4);
    gm_check_close("cuda gather_rows", o, r, (size_t)(R * C), 0, 0);
    gm_k_fill_cpu(hc, r, rows_in * C, 0.5f);
    gm_k_fill_cuda(dc, dout, rows_in * C, 0.5f);
    gm_k_scatter_rows_cpu(hc, r, x, rows, R, C);
    gm_k_scatter_rows_cuda(dc, dout, dx, drows, R, C);
    from_dev(o, dout, (size_t)(rows_in * C) * 4);
    gm_check_close("cuda fill + scatter_rows", o, r, (size_t)(rows_in * C), 0, 0);
    gm_k_fill_cpu(hc, r, B * S * W, -1.0f);
    gm_k_fill_cuda(dc, dout, B * S * W, -1.0f);
    gm_k_kv_store_cpu(hc, r, x, B, T, S, W, 4);
    gm_k_kv_store_cuda(dc, dout, dx, B, T, S, W, 4);
    from_dev(o, dout, (size_t)(B * S * W) * 4);
    gm_check_close("cuda kv_store", o, r, (size_t)(B * S * W), 0, 0);
    float mx[3] = {1, -2, 30}, sm[3] = {1.5f, 2, 1000}, lse[3], got[3];
    float *dmx = to_dev(mx, sizeof mx), *dsm = to_dev(sm, sizeof sm);
    gm_k_xent_lse_finish_cpu(hc, lse, mx, sm, 3);
    gm_k_xent_lse_finish_cuda(dc, dout, dmx, dsm, 3);
    from_dev(got, dout, sizeof got);
    cmp("cuda xent_lse_finish", got, lse, 3);
    gm_cuda_free(dx), gm_cuda_free(dout), gm_cuda_free(drows), gm_cuda_free(dmx), gm_cuda_free(dsm);
    gm_free(x), gm_free(o), gm_free(r);
}

/* The tiny model trained 3 steps and its generation, on the CUDA backend and on the CPU one. */
static void test_backend(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &m, &err), &err);
    if (!m) return;
    gm_backend *be[2] = {NULL, NULL};
    CHECK_OK(gm_backend_cpu_new(2, &be[0], &err), &err);
    CHECK_OK(gm_backend_cuda_new(0, &be[1], &err), &err);
    if (!be[1]) return;
    int32_t ids[32], tg[32];
    uint64_t st = 5;
    for (int i = 0; i < 32; i++) ids[i] = 4 + (int32_t)((gm_test_rand(&st) + 1.0f) * 100.0f);
    for (int i = 0; i < 32; i++) tg[i] = i % 16 >= 6 && i % 16 < 15 ? ids[i + 1] : -1;
    double loss[2][3];
    int64_t V = m->cfg.vocab_size;
    float *logits[2] = {gm_malloc((size_t)V * 4), gm_malloc((size_t)V * 4)};
    for (int k = 0; k < 2; k++) {
        gm_train_opts o = gm_train_opts_default();
        o.lora.rank = 4, o.batch = 2, o.max_length = 16, o.lr = 1e-2f;
        gm_trainer *tr = NULL;
        CHECK_OK(gm_trainer_new_on(m, &o, be[k], &tr, &err), &err);
        if (!tr) continue;
        gm_batch b = {.B = 2, .T = 16, .ids = ids, .targets = tg, .example_index = NULL};
        for (int s = 0; s < 3; s++) {
            gm_step_stats ss;
            CHECK_OK(gm_trainer_step(tr, &b, 1, &ss, &err), &err);
            loss[k][s] = ss.loss;
        }
        gm_infer *inf = NULL;
        gm_infer_opts io = {.batch = 1, .ctx = 16, .max_tokens = 16, .n_threads = 2, .adapter = gm_trainer_lora(tr),
                            .backend = be[k]};
        CHECK_OK(gm_infer_new(m, &io, &inf, &err), &err);
        if (inf) {
            CHECK_OK(gm_decoder_forward(inf, ids, 16, false, &err), &err);
            memcpy(logits[k], inf->logits, (size_t)V * 4);
        }
        gm_infer_free(inf);
        gm_trainer_free(tr);
    }
    for (int s = 0; s < 3; s++)
        CHECK(fabs(loss[1][s] - loss[0][s]) <= TOL_CUDA_VS_CPU_REL * fabs(loss[0][s]) + TOL_CUDA_VS_CPU_ABS,
              "cuda backend: step %d loss %.9g vs cpu %.9g", s + 1, loss[1][s], loss[0][s]);
    cmp("cuda backend: logits after training, with the adapters", logits[1], logits[0], (size_t)V);
    gm_free(logits[0]), gm_free(logits[1]);
    gm_backend_free(be[1]);
    gm_backend_free(be[0]);
    gm_model_free(m);
}

/* NCCL on a world of one process (no launcher in the environment): a communicator bound to the
 * CUDA backend's stream; the sum all-reduce of one rank, of one buffer and of a group of two,
 * gives back the same floats (the data path of gm_dist_allreduce_many on a device). */
static void test_nccl(void) {
#ifdef GM_HAVE_NCCL
    gm_error err = {0};
    gm_dist *d = NULL;
    gm_backend *be = NULL;
    CHECK_OK(gm_dist_new(&d, &err), &err);
    CHECK_OK(gm_backend_cuda_new(0, &be, &err), &err);
    if (!d || !be) return;
    CHECK(gm_dist_world_size(d) == 1, "nccl: world of one without a launcher (got %d)", gm_dist_world_size(d));
    CHECK_OK(gm_dist_nccl_attach(d, be, &err), &err);
    size_t n[2] = {10007, 33};
    float *h[2] = {host_rand(n[0], 3), host_rand(n[1], 3)}, *o = gm_malloc(n[0] * 4);
    float *dv[2] = {to_dev(h[0], n[0] * 4), to_dev(h[1], n[1] * 4)};
    CHECK_OK(gm_dist_allreduce_backend(d, be, dv[0], n[0], &err), &err);
    from_dev(o, dv[0], n[0] * 4);
    CHECK(memcmp(o, h[0], n[0] * 4) == 0, "nccl: all-reduce over one rank gives the buffer back");
    CHECK_OK(gm_dist_allreduce_many(d, be, dv, n, 2, NULL, &err), &err);
    from_dev(o, dv[1], n[1] * 4);
    CHECK(memcmp(o, h[1], n[1] * 4) == 0, "nccl: a group of two all-reduces gives the buffers back");
    gm_cuda_free(dv[0]), gm_cuda_free(dv[1]);
    gm_free(h[0]), gm_free(h[1]), gm_free(o);
    gm_dist_free(d); /* destroys the communicator before the backend's stream goes */
    gm_backend_free(be);
#else
    CHECK(0, "nccl: this CUDA build has no NCCL (CMake did not find nccl.h / libnccl beside the CUDA toolkit)");
#endif
}

/* GM_REQUIRE_GPU=1 (set by the GPU script, tests/device/run.sh): no device is a failure, not a
 * skip, like gm_test_skip_unless_ci under CI, so a GPU run that found no GPU cannot pass. */
static int skip_unless_gpu_required(const char *why) {
    const char *req = getenv("GM_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) {
        CHECK(0, "%s (GM_REQUIRE_GPU=1: a GPU run without a GPU is a failure)", why);
        return gm_test_finish();
    }
    return gm_test_skip(why); /* CI has no GPU: the one test that may skip there */
}

int main(void) {
    if (gm_cuda_device_count() <= 0) return skip_unless_gpu_required("no CUDA device");
    printf("device: %s\n", gm_cuda_device_name());
    size_t scratch = gm_k_matmul_scratch_floats(GM_Q8_0, 4096, 4096, 1);
    gm_kctx hc = {.n_threads = 2, .scratch = gm_malloc(scratch * 4), .scratch_floats = scratch};
    gm_kctx dc = {.n_threads = 1, .stream = NULL, .scratch = gm_cuda_malloc(scratch * 4), .scratch_floats = scratch};
    test_elementwise(&hc, &dc);
    test_norm_rope(&hc, &dc);
    test_attention(&hc, &dc);
    test_vision(&hc, &dc);
    test_matmul_embed(&hc, &dc);
    test_movement(&hc, &dc);
    test_backend();
    test_nccl();
    gm_cuda_free(dc.scratch);
    gm_free(hc.scratch);
    return gm_test_finish();
}
#endif
