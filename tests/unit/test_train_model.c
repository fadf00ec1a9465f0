/*
 * test_train_model.c - LoRA on the real Gemma 3 270M with real text (Debian's fortunes):
 *   - the trainer's loss at initialization (LoRA B = 0: the base model) equals an independent
 *     cross-entropy: the decoder's logits (checked against transformers in test_decoder_model)
 *     through a double-precision log-softmax over the whole vocabulary (TOL_REAL_LOSS_F64_REL);
 *   - the loss of the training examples falls (stored Q4_K_M base, then NF4 and bf16 bases);
 *   - activation checkpointing on and off give bit-identical losses;
 *   - the same seed and thread count give bit-identical losses twice;
 *   - generation equals training-time evaluation on the real model: after training, the logits of
 *     a training example computed token by token through the KV cache with the trained adapters
 *     equal those of the whole sequence through the training forward (TOL_GEN_VS_TRAIN_REAL_ABS),
 *     and differ from the base model's by far more.
 * Examples: "Tell me a fortune about <topic>." -> a fortune of that topic, loss on the response
 * tokens only (the chat template's model turn).
 */
#include "gm_alloc.h"
#include "gm_data.h"
#include "gm_decoder.h"
#include "gm_model.h"
#include "gm_train.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_LEN 64
#define N_EX 8
#define BATCH 4

typedef struct collect {
    gm_dataset *ds;
    const gm_tokenizer *tok;
    const char *topic;
    int taken;
} collect;

static void add_fortune(const char *text, size_t len, void *user) {
    collect *c = user;
    if (c->taken >= N_EX / 2) return;
    char prompt[128], resp[1024];
    snprintf(prompt, sizeof prompt, "Tell me a fortune about %s.", c->topic);
    snprintf(resp, sizeof resp, "%.*s", (int)(len < sizeof resp - 1 ? len : sizeof resp - 1), text);
    gm_chat_msg msgs[2] = {{"user", prompt}, {"assistant", resp}};
    if (gm_dataset_add_chat(c->ds, c->tok, msgs, 2, MAX_LEN, -1, NULL) == GM_OK) c->taken++;
}

static int32_t ids[2][BATCH * MAX_LEN], tgts[2][BATCH * MAX_LEN];
static gm_batch batches[2];

static void make_batches(const gm_dataset *ds, int32_t pad) {
    for (int b = 0; b < 2; b++) {
        int64_t idx[BATCH];
        for (int i = 0; i < BATCH; i++) idx[i] = b * BATCH + i;
        int64_t T = gm_batch_collate(ds, idx, BATCH, pad, ids[b], tgts[b]);
        batches[b] = (gm_batch){.B = BATCH, .T = T, .ids = ids[b], .targets = tgts[b], .example_index = NULL};
    }
}

static double eval_loss(gm_trainer *tr) {
    double sum = 0;
    int64_t n = 0;
    gm_error err = {0};
    for (int b = 0; b < 2; b++) {
        double s;
        int64_t k;
        CHECK_OK(gm_trainer_eval(tr, &batches[b], &s, &k, &err), &err);
        sum += s, n += k;
    }
    return sum / (double)n;
}

/* The mean cross-entropy of the 8 examples from the decoder's logits (the inference forward, one
 * prefill per sequence), log-softmax in double over all V logits of each supervised position. */
static double reference_loss(const gm_model *m) {
    gm_error err = {0};
    int64_t V = m->cfg.vocab_size;
    double sum = 0;
    int64_t n = 0;
    for (int b = 0; b < 2; b++) {
        int64_t T = batches[b].T;
        gm_infer *st = NULL;
        gm_infer_opts io = {.batch = 1, .ctx = T, .max_tokens = T, .logit_rows = T, .n_threads = 2};
        CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
        if (!st) return NAN;
        for (int i = 0; i < BATCH; i++) {
            const int32_t *row_ids = batches[b].ids + i * T, *row_tg = batches[b].targets + i * T;
            gm_infer_reset(st);
            CHECK_OK(gm_decoder_forward(st, row_ids, T, true, &err), &err);
            for (int64_t t = 0; t < T; t++) {
                if (row_tg[t] < 0) continue;
                const float *l = st->logits + t * V;
                sum += gm_test_lse(l, V) - (double)l[row_tg[t]];
                n++;
            }
        }
        gm_infer_free(st);
    }
    return sum / (double)n;
}

/* Generation with the trainer's adapters vs its training forward, on example 0 (the first
 * sequence of batch 0, all its positions). */
static void check_generation_equals_training(const gm_model *m, gm_trainer *tr) {
    gm_error err = {0};
    int64_t T = batches[0].T, V = m->cfg.vocab_size;
    float *train_l = gm_malloc((size_t)(T * V) * 4), *gen_l = gm_malloc((size_t)(T * V) * 4);
    int64_t rows[MAX_LEN];
    for (int64_t t = 0; t < T; t++) rows[t] = t;
    gm_batch one = {.B = 1, .T = T, .ids = batches[0].ids, .targets = batches[0].targets, .example_index = NULL};
    CHECK_OK(gm_trainer_logits(tr, &one, rows, T, train_l, &err), &err);
    gm_test_cached_logits(m, gm_trainer_backend(tr), gm_trainer_lora(tr), one.ids, T, gen_l);
    double d = 0, moved = 0;
    for (int64_t i = 0; i < T * V; i++) d = fmax(d, fabs((double)gen_l[i] - train_l[i]));
    gm_test_cached_logits(m, gm_trainer_backend(tr), NULL, one.ids, T, gen_l);
    for (int64_t i = 0; i < T * V; i++) moved = fmax(moved, fabs((double)gen_l[i] - train_l[i]));
    CHECK(d <= TOL_GEN_VS_TRAIN_REAL_ABS, "generation with adapters vs the training forward: max |diff| %.3g over %lld x %lld logits",
          d, (long long)T, (long long)V);
    CHECK(moved > 100 * TOL_GEN_VS_TRAIN_REAL_ABS, "the trained adapters move the logits by only %.3g", moved);
    printf("generation (KV cache, token by token) with the trained adapters vs the training forward: max |diff| %.2e over "
           "%lld positions x %lld logits; the adapters move them by %.2f\n", d, (long long)T, (long long)V, moved);
    gm_free(train_l), gm_free(gen_l);
}

/* Trains `steps` steps alternating the two batches; returns eval loss before/after and the
 * per-step losses; with `gen_check`, compares generation with the trained adapters to the training
 * forward at the end. */
static void run_checked(const gm_model *m, gm_quant q, bool ckpt, int steps, double *before, double *after, double *losses,
                        bool gen_check) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 8;
    o.lora.alpha = 16;
    o.lora.seed = 7;
    o.quant = q;
    o.compute = GM_COMPUTE_F32; /* checked against the f32 / f64 forward (compute = "auto" may be bf16 here) */
    o.batch = BATCH;
    o.max_length = MAX_LEN;
    o.lr = 2e-3f;
    /* the optimizer this curve was recorded with (before the schema's defaults: TrainingArguments'
     * weight decay 0, clipping at 1, linear decay): its numbers stay comparable across versions */
    o.weight_decay = 0.01f;
    o.max_grad_norm = 0.0f;
    o.schedule = GM_SCHED_CONSTANT;
    o.checkpointing = ckpt;
    o.total_steps = steps;
    gm_trainer *tr = NULL;
    gm_error err = {0};
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) return;
    *before = eval_loss(tr);
    if (gen_check) {
        double want = reference_loss(m), d = fabs(*before - want) / want;
        CHECK(d <= TOL_REAL_LOSS_F64_REL, "loss at initialization %.9f, from the decoder's logits in double %.9f "
              "(relative difference %.3g)", *before, want, d);
        printf("loss at initialization %.9f; from the decoder's logits, log-softmax in double: %.9f (relative "
               "difference %.2e)\n", *before, want, d);
    }
    for (int s = 0; s < steps; s++) {
        gm_step_stats st;
        CHECK_OK(gm_trainer_step(tr, &batches[s % 2], 1, &st, &err), &err);
        losses[s] = st.loss;
    }
    *after = eval_loss(tr);
    printf("%-6s ckpt %-3s: loss on the 8 examples %.4f -> %.4f; step losses", gm_quant_name(q), ckpt ? "on" : "off",
           *before, *after);
    for (int s = 0; s < steps; s++) printf(" %.4f", losses[s]);
    printf("\n");
    if (gen_check) check_generation_equals_training(m, tr);
    gm_trainer_free(tr);
}

static void run(const gm_model *m, gm_quant q, bool ckpt, int steps, double *before, double *after, double *losses) {
    run_checked(m, q, ckpt, steps, before, after, losses, false);
}

int main(void) {
    const char *path = gm_test_real_model();
    CHECK(path != NULL, "the real model is required");
    if (!path) return gm_test_finish();
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(path, NULL, &m, &err), &err);
    if (!m) return gm_test_finish();
    gm_dataset ds;
    gm_dataset_init(&ds);
    const char *topics[2] = {"science", "food"};
    for (int t = 0; t < 2; t++) {
        collect c = {&ds, m->tok, topics[t], 0};
        CHECK_OK(gm_fortunes_read(GM_FORTUNES_DIR, topics[t], 200, add_fortune, &c, NULL, &err), &err);
    }
    CHECK(ds.n == N_EX, "expected %d fortune examples, got %lld", N_EX, (long long)ds.n);
    if (ds.n != N_EX) return gm_test_finish();
    make_batches(&ds, m->cfg.pad_id);

    double b0, a0, l0[6], b1, a1, l1[6], b2, a2, l2[6];
    run_checked(m, GM_QUANT_STORED, false, 6, &b0, &a0, l0, true);
    CHECK(a0 < 0.6 * b0, "stored base: training loss did not fall enough (%.4f -> %.4f)", b0, a0);
    run(m, GM_QUANT_STORED, true, 6, &b1, &a1, l1);
    CHECK(memcmp(l0, l1, sizeof l0) == 0 && a0 == a1, "checkpointing on/off: losses differ");
    run(m, GM_QUANT_STORED, false, 6, &b2, &a2, l2);
    CHECK(memcmp(l0, l2, sizeof l0) == 0, "same seed and threads: the loss curve is not bit-identical");
    run(m, GM_QUANT_NF4, false, 6, &b1, &a1, l1);
    CHECK(a1 < 0.6 * b1, "NF4 base: training loss did not fall enough (%.4f -> %.4f)", b1, a1);
    run(m, GM_QUANT_BF16, false, 6, &b1, &a1, l1);
    CHECK(a1 < 0.6 * b1, "bf16 base: training loss did not fall enough (%.4f -> %.4f)", b1, a1);
    /* the NF4 and bf16 trainers dropped the mapped pages of the stored weights as they re-encoded
     * them (gm_mmap_release), and the runner drops them before every trial: the stored base read
     * again from the page cache / file gives the same run, bit for bit */
    gm_model_release_linear_pages(m);
    run(m, GM_QUANT_STORED, false, 6, &b2, &a2, l2);
    CHECK(memcmp(l0, l2, sizeof l0) == 0, "stored base after its pages were released: the loss curve differs");
    gm_dataset_free(&ds);
    gm_model_free(m);
    return gm_test_finish();
}
