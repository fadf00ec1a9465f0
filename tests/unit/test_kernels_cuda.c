/*
 * test_kernels_cuda.c - the CUDA backend as a whole against the CPU one: LoRA training steps (loss,
 * gradient norm, every trained tensor after the AdamW updates) and generation with the trained
 * adapters, on the tiny fixture and - when GM_PARITY_MODEL names one, as the GPU script does with a
 * random-weight checkpoint of the real 270M shapes (tests/device/make_checkpoints.py) - on a model
 * of real size; and NCCL (data-parallel training's device all-reduce, kernels/cuda/dist_nccl.cu) on
 * a world of one process. Each kernel against its CPU twin is test_kernel_parity (cuda).
 * Skips (exit 77) in a CPU-only build or without a GPU, so the suite passes on machines without
 * one; the GPU script (tests/device/run.sh) sets GM_REQUIRE_GPU=1: then no device (or no CUDA
 * build) fails. This program links the CUDA backend, so a kernel without its CUDA twin fails to
 * link here.
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

#include <math.h>
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

/* Model `path` trained 3 steps (LoRA rank 8 on every linear, batch 2 x 16 tokens, dropout on) on
 * the CUDA backend and on the CPU one: the losses and gradient norms of each step, every trained
 * tensor after the three AdamW updates, and the logits of generation with the trained adapters. */
static void test_training(const char *path) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(path, NULL, &m, &err), &err);
    if (!m) return;
    gm_backend *be[2] = {NULL, NULL};
    CHECK_OK(gm_backend_cpu_new(4, &be[0], &err), &err);
    CHECK_OK(gm_backend_cuda_new(0, &be[1], &err), &err);
    if (!be[1]) {
        gm_backend_free(be[0]);
        gm_model_free(m);
        return;
    }
    be[1]->bf16_gemm = false; /* f32 GEMMs: the CPU's numbers (bf16 ones: test_training_bf16) */
    int64_t V = m->cfg.vocab_size;
    int32_t ids[32], tg[32];
    uint64_t st = 5;
    for (int i = 0; i < 32; i++) ids[i] = 4 + (int32_t)((gm_test_rand(&st) + 1.0f) * 0.45f * (float)(V - 8));
    for (int i = 0; i < 32; i++) tg[i] = i % 16 >= 6 && i % 16 < 15 ? ids[i + 1] : -1;
    double loss[2][3], norm[2][3];
    float *logits[2] = {gm_malloc((size_t)V * 4), gm_malloc((size_t)V * 4)};
    float *params[2] = {NULL, NULL};
    size_t n_params = 0;
    for (int k = 0; k < 2; k++) {
        gm_train_opts o = gm_train_opts_default();
        o.lora.rank = 8, o.lora.alpha = 16, o.lora.dropout = 0.1f, o.batch = 2, o.max_length = 16, o.lr = 1e-2f;
        snprintf(o.lora.targets, sizeof o.lora.targets, "all-linear");
        gm_trainer *tr = NULL;
        CHECK_OK(gm_trainer_new_on(m, &o, be[k], &tr, &err), &err);
        if (!tr) continue;
        gm_batch b = {.B = 2, .T = 16, .ids = ids, .targets = tg, .example_index = NULL};
        for (int s = 0; s < 3; s++) {
            gm_step_stats ss;
            CHECK_OK(gm_trainer_step(tr, &b, 1, &ss, &err), &err);
            loss[k][s] = ss.loss, norm[k][s] = ss.grad_norm;
        }
        /* every trained tensor, in the trainer's order, on the host */
        int np = 0;
        const gm_train_param *pp = gm_trainer_params(tr, &np);
        size_t total = 0;
        for (int i = 0; i < np; i++) total += (size_t)pp[i].n;
        params[k] = gm_malloc(total * sizeof(float));
        for (size_t i = 0, off = 0; i < (size_t)np; off += (size_t)pp[i].n, i++)
            gm_backend_download(be[k], params[k] + off, pp[i].p, (size_t)pp[i].n * sizeof(float));
        CHECK(k == 0 || total == n_params, "the CUDA trainer trains %zu values, the CPU one %zu", total, n_params);
        n_params = total;
        gm_infer *inf = NULL;
        gm_infer_opts io = {.batch = 1, .ctx = 16, .max_tokens = 16, .n_threads = 4, .adapter = gm_trainer_lora(tr),
                            .backend = be[k]};
        CHECK_OK(gm_infer_new(m, &io, &inf, &err), &err);
        if (inf) {
            CHECK_OK(gm_decoder_forward(inf, ids, 16, false, &err), &err);
            memcpy(logits[k], inf->logits, (size_t)V * 4);
        }
        gm_infer_free(inf);
        gm_trainer_free(tr);
    }
    char what[600];
    for (int s = 0; s < 3; s++) {
        CHECK(fabs(loss[1][s] - loss[0][s]) <= TOL_CUDA_VS_CPU_REL * fabs(loss[0][s]) + TOL_CUDA_VS_CPU_ABS,
              "%s: step %d loss %.9g on CUDA vs %.9g on the CPU", path, s + 1, loss[1][s], loss[0][s]);
        CHECK(fabs(norm[1][s] - norm[0][s]) <= TOL_CUDA_VS_CPU_REL * fabs(norm[0][s]) + TOL_CUDA_VS_CPU_ABS,
              "%s: step %d gradient norm %.9g on CUDA vs %.9g on the CPU", path, s + 1, norm[1][s], norm[0][s]);
    }
    if (params[0] && params[1]) {
        snprintf(what, sizeof what, "%s: the trained tensors after 3 AdamW steps, CUDA vs CPU", path);
        gm_check_close(what, params[1], params[0], n_params, TOL_CUDA_VS_CPU_ABS, TOL_CUDA_VS_CPU_REL);
    }
    snprintf(what, sizeof what, "%s: logits of generation with the trained adapters, CUDA vs CPU", path);
    gm_check_close(what, logits[1], logits[0], (size_t)V, TOL_CUDA_VS_CPU_GEMM_ABS, TOL_CUDA_VS_CPU_REL);
    printf("%s: 3 LoRA steps on CUDA and CPU: losses %.6f %.6f %.6f vs %.6f %.6f %.6f, %zu trained values compared\n", path,
           loss[1][0], loss[1][1], loss[1][2], loss[0][0], loss[0][1], loss[0][2], n_params);
    gm_free(logits[0]), gm_free(logits[1]), gm_free(params[0]), gm_free(params[1]);
    gm_backend_free(be[1]);
    gm_backend_free(be[0]);
    gm_model_free(m);
}

/* The CUDA backend's default bf16 GEMMs (gm_kctx.bf16_gemm) in training: 3 LoRA steps on a bf16
 * base (quant = bf16, so the base GEMMs take the bf16 path) with compute auto (bf16) and f32, the
 * losses within TOL_CUDA_BF16_LOSS_REL of each other and not identical (the bf16 path ran). */
static void test_training_bf16(const char *path) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(path, NULL, &m, &err), &err);
    gm_backend *be = NULL;
    if (m) CHECK_OK(gm_backend_cuda_new(0, &be, &err), &err);
    if (!be) {
        gm_model_free(m);
        return;
    }
    int64_t V = m->cfg.vocab_size;
    int32_t ids[32], tg[32];
    uint64_t st = 9;
    for (int i = 0; i < 32; i++) ids[i] = 4 + (int32_t)((gm_test_rand(&st) + 1.0f) * 0.45f * (float)(V - 8));
    for (int i = 0; i < 32; i++) tg[i] = i % 16 >= 6 && i % 16 < 15 ? ids[i + 1] : -1;
    double loss[2][3] = {{0}};
    for (int f32 = 0; f32 <= 1; f32++) {
        gm_train_opts o = gm_train_opts_default();
        o.lora.rank = 8, o.lora.alpha = 16, o.batch = 2, o.max_length = 16, o.lr = 1e-2f;
        o.quant = GM_QUANT_BF16, o.compute = f32 ? GM_COMPUTE_F32 : GM_COMPUTE_AUTO;
        gm_trainer *tr = NULL;
        CHECK_OK(gm_trainer_new_on(m, &o, be, &tr, &err), &err);
        gm_batch b = {.B = 2, .T = 16, .ids = ids, .targets = tg, .example_index = NULL};
        for (int s = 0; tr && s < 3; s++) {
            gm_step_stats ss;
            CHECK_OK(gm_trainer_step(tr, &b, 1, &ss, &err), &err);
            loss[f32][s] = ss.loss;
        }
        gm_trainer_free(tr);
    }
    for (int s = 0; s < 3; s++)
        CHECK(fabs(loss[0][s] - loss[1][s]) <= TOL_CUDA_BF16_LOSS_REL * fabs(loss[1][s]) && loss[0][s] != loss[1][s],
              "%s: step %d loss with bf16 GEMMs %.9g, with f32 ones %.9g (want close, not equal)", path, s + 1, loss[0][s],
              loss[1][s]);
    printf("%s: bf16 base, 3 LoRA steps on CUDA: losses with bf16 GEMMs %.6f %.6f %.6f, f32 GEMMs %.6f %.6f %.6f\n", path,
           loss[0][0], loss[0][1], loss[0][2], loss[1][0], loss[1][1], loss[1][2]);
    gm_backend_free(be);
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
    test_training(gm_test_path("tests/ref/tiny_gemma3"));
    test_training_bf16(gm_test_path("tests/ref/tiny_gemma3"));
    const char *big = getenv("GM_PARITY_MODEL"); /* e.g. the 270M shapes, random weights */
    if (big && *big) test_training(big);
    test_nccl();
    return gm_test_finish();
}
#endif
