/*
 * test_backend.c - the backend interface and the one model definition run through it, on the tiny
 * Gemma 3 (tests/ref/tiny_gemma3):
 *   - the strict backend really keeps its memory from the host: a child that reads a block of it
 *     directly dies with SIGSEGV, while the copy functions and kernels work;
 *   - LoRA training (all-linear, dropout 0.1, with and without activation checkpointing) on the
 *     strict backend - where the model code can reach its memory only through kernels and the
 *     backend's copies, so any stray host access crashes the test - gives the CPU backend's numbers
 *     bit for bit: losses, gradient norms, adapters after 3 steps, evaluation, label scoring, choice
 *     logits, full logits; its checkpoint (staged through host memory) loads into a CPU trainer;
 *   - generation equals training-time evaluation: with the trained adapters attached, the logits of
 *     a sequence computed token by token through the KV cache (gm_decoder_forward, T = 1 per call)
 *     equal the logits of the whole sequence through the training forward (gm_trainer_logits),
 *     within TOL_GEN_VS_TRAIN_ABS, on both backends; and the same on the strict backend bit for bit
 *     as on the CPU one;
 *   - soft tokens: input embeddings given for some rows (the tokens' own scaled embeddings) give
 *     the logits of the token ids.
 */
#include "gm_alloc.h"
#include "gm_backend.h"
#include "gm_decoder.h"
#include "gm_model.h"
#include "gm_plan.h"
#include "gm_train.h"
#include "test_util.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define B_ 2
#define T_ 24
#define STEPS 3

static int32_t ids[B_ * T_], targets[B_ * T_];

static void make_data(int64_t V) {
    uint64_t st = 4242;
    for (int64_t i = 0; i < B_ * T_; i++) ids[i] = (int32_t)(4 + (int64_t)((gm_test_rand(&st) + 1.0f) * 0.5f * (float)(V - 5)));
    for (int64_t i = 0; i < B_ * T_; i++) targets[i] = (i % T_) >= T_ / 3 && (i % T_) + 1 < T_ ? ids[i + 1] : -1;
}

static gm_train_opts opts(bool ckpt) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.dropout = 0.1f;
    o.lora.seed = 3;
    o.batch = B_;
    o.max_length = T_;
    o.lr = 5e-3f;
    o.max_grad_norm = 1.0f;
    o.total_steps = STEPS;
    o.checkpointing = ckpt;
    o.n_threads = 2;
    return o;
}

/* ---- the strict backend keeps its memory from the host ------------------------------------ */

static void test_strict_faults(void) {
    gm_error err = {0};
    gm_backend *be = NULL;
    CHECK_OK(gm_backend_strict_new(1, &be, &err), &err);
    gm_arena a;
    gm_backend_arena(be, &a, "probe");
    gm_arena_alloc(&a, 4096, GM_MEM_WORKSPACE);
    CHECK_OK(gm_arena_commit(&a, &err), &err);
    float *p = gm_arena_alloc(&a, 4096, GM_MEM_WORKSPACE);
    /* through the backend: fine */
    float in[4] = {1, 2, 3, 4}, out[4] = {0};
    gm_backend_upload(be, p, in, sizeof in);
    gm_kctx kc = gm_backend_kctx(be, NULL, 0);
    be->k->scale_fwd(&kc, p, p, 4, 2.0f);
    gm_backend_download(be, out, p, sizeof out);
    CHECK(out[0] == 2 && out[3] == 8, "strict backend: upload, kernel, download (%g %g)", (double)out[0], (double)out[3]);
    CHECK(gm_backend_host_ptr(be, p) == NULL, "strict memory is not host-visible");
    /* directly from the host: the process dies */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* the kernel's default, not a sanitizer's handler that exits 1 */
        volatile float v = p[0];
        (void)v;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a host read of strict memory must fault (status %d)", status);
    gm_arena_free(&a);
    gm_backend_free(be);
}

/* ---- training on the strict backend == on the CPU one ------------------------------------- */

typedef struct run_result {
    double loss[STEPS], norm[STEPS], eval_loss, score[B_];
    float choice[B_ * 3];
    float *adapters; /* every A then B, concatenated */
    size_t n_adapter_floats;
} run_result;

static void run(const gm_model *m, gm_backend *be, bool ckpt, run_result *r, const char *ckpt_path) {
    gm_error err = {0};
    gm_trainer *tr = NULL;
    gm_train_opts o = opts(ckpt);
    memset(r, 0, sizeof *r);
    CHECK_OK(gm_trainer_new_on(m, &o, be, &tr, &err), &err);
    if (!tr) return;
    gm_batch b = {.B = B_, .T = T_, .ids = ids, .targets = targets, .example_index = NULL};
    for (int s = 0; s < STEPS; s++) {
        gm_step_stats st;
        CHECK_OK(gm_trainer_step(tr, &b, 1, &st, &err), &err);
        r->loss[s] = st.loss, r->norm[s] = st.grad_norm;
    }
    int64_t n_tok;
    CHECK_OK(gm_trainer_eval(tr, &b, &r->eval_loss, &n_tok, &err), &err);
    CHECK_OK(gm_trainer_score(tr, &b, r->score, &err), &err);
    int64_t pos[B_] = {5, 17};
    int32_t cand[3] = {7, 100, 4};
    CHECK_OK(gm_trainer_choice_logits(tr, &b, pos, cand, 3, r->choice, &err), &err);
    int n;
    gm_lora_adapter *ad = gm_trainer_adapters(tr, &n);
    int64_t rank = o.lora.rank;
    for (int i = 0; i < n; i++) r->n_adapter_floats += (size_t)(rank * (ad[i].in + ad[i].out));
    r->adapters = gm_malloc(r->n_adapter_floats * sizeof(float));
    float *p = r->adapters;
    for (int i = 0; i < n; i++) {
        gm_trainer_read_adapter(tr, i, 'A', p);
        p += rank * ad[i].in;
        gm_trainer_read_adapter(tr, i, 'B', p);
        p += ad[i].out * rank;
    }
    if (ckpt_path) CHECK_OK(gm_trainer_save(tr, ckpt_path, 0, 7, r->loss[STEPS - 1], "{\"alpha\": 8}", &err), &err);
    gm_trainer_free(tr);
}

static void test_strict_training(const gm_model *m) {
    gm_error err = {0};
    gm_backend *cpu = NULL, *strict = NULL;
    CHECK_OK(gm_backend_cpu_new(2, &cpu, &err), &err);
    CHECK_OK(gm_backend_strict_new(2, &strict, &err), &err);
    char ckpt[256];
    snprintf(ckpt, sizeof ckpt, "/tmp/gm_test_backend_%d.h5", (int)getpid());
    for (int ck = 0; ck < 2; ck++) {
        run_result a, b;
        run(m, cpu, ck, &a, NULL);
        run(m, strict, ck, &b, ck ? ckpt : NULL);
        bool same = memcmp(a.loss, b.loss, sizeof a.loss) == 0 && memcmp(a.norm, b.norm, sizeof a.norm) == 0 &&
                    a.eval_loss == b.eval_loss && memcmp(a.score, b.score, sizeof a.score) == 0 &&
                    memcmp(a.choice, b.choice, sizeof a.choice) == 0 && a.n_adapter_floats == b.n_adapter_floats &&
                    a.n_adapter_floats > 0 && memcmp(a.adapters, b.adapters, a.n_adapter_floats * sizeof(float)) == 0;
        CHECK(same, "checkpointing %s: the strict backend's run differs from the CPU one (loss %.9g vs %.9g)", ck ? "on" : "off",
              a.loss[STEPS - 1], b.loss[STEPS - 1]);
        CHECK(a.loss[STEPS - 1] < a.loss[0], "the loss falls (%.6g -> %.6g)", a.loss[0], a.loss[STEPS - 1]);
        printf("strict == cpu, checkpointing %-3s: loss %.6f -> %.6f, eval %.6f, %zu adapter values identical\n",
               ck ? "on" : "off", a.loss[0], a.loss[STEPS - 1], a.eval_loss, a.n_adapter_floats);
        if (ck) {
            /* the strict run's checkpoint, loaded by a CPU trainer: the same adapters */
            gm_trainer *tr = NULL;
            gm_train_opts o = opts(true);
            CHECK_OK(gm_trainer_new_on(m, &o, cpu, &tr, &err), &err);
            int64_t epoch = -1, pos = -1;
            if (tr) CHECK_OK(gm_trainer_load(tr, ckpt, &epoch, &pos, &err), &err);
            int n;
            gm_lora_adapter *ad = tr ? gm_trainer_adapters(tr, &n) : NULL;
            bool ok = tr && pos == 7 && gm_trainer_step_count(tr) == STEPS;
            const float *p = b.adapters;
            for (int i = 0; ok && i < n; i++) {
                ok = memcmp(ad[i].A, p, (size_t)(4 * ad[i].in) * 4) == 0;
                p += 4 * ad[i].in;
                ok = ok && memcmp(ad[i].B, p, (size_t)(ad[i].out * 4) * 4) == 0;
                p += ad[i].out * 4;
            }
            CHECK(ok, "the strict run's checkpoint loads into a CPU trainer with the same adapters");
            gm_trainer_free(tr);
            unlink(ckpt);
        }
        gm_free(a.adapters), gm_free(b.adapters);
    }
    gm_backend_free(cpu);
    gm_backend_free(strict);
}

/* ---- generation with the adapters == the training forward ---------------------------------- */

/* Logits of sequence 0 (all T_ positions), token by token through the KV cache. */
static void generate_logits(const gm_model *m, gm_backend *be, const gm_lora *lora, float *out) {
    gm_test_cached_logits(m, be, lora, ids, T_, out);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void test_generation_equals_training(const gm_model *m) {
    gm_error err = {0};
    int64_t V = m->cfg.vocab_size;
    float *train_l = gm_malloc((size_t)(T_ * V) * 4), *gen_l[2];
    gm_backend *be[2] = {NULL, NULL};
    CHECK_OK(gm_backend_cpu_new(2, &be[0], &err), &err);
    CHECK_OK(gm_backend_strict_new(2, &be[1], &err), &err);
    for (int k = 0; k < 2; k++) {
        gen_l[k] = gm_malloc((size_t)(T_ * V) * 4);
        gm_trainer *tr = NULL;
        gm_train_opts o = opts(false);
        CHECK_OK(gm_trainer_new_on(m, &o, be[k], &tr, &err), &err);
        if (!tr) continue;
        gm_batch b = {.B = B_, .T = T_, .ids = ids, .targets = targets, .example_index = NULL};
        for (int s = 0; s < STEPS; s++) CHECK_OK(gm_trainer_step(tr, &b, 1, NULL, &err), &err);
        /* the whole sequence through the training forward (dropout off) */
        int64_t rows[T_];
        for (int64_t t = 0; t < T_; t++) rows[t] = t;
        gm_batch one = {.B = 1, .T = T_, .ids = ids, .targets = targets, .example_index = NULL};
        CHECK_OK(gm_trainer_logits(tr, &one, rows, T_, train_l, &err), &err);
        generate_logits(m, be[k], gm_trainer_lora(tr), gen_l[k]);
        double d = max_abs_diff(gen_l[k], train_l, (size_t)(T_ * V));
        CHECK(d <= TOL_GEN_VS_TRAIN_ABS, "%s backend: generation with adapters vs training forward: max |diff| %.3g (tol %.3g)",
              be[k]->name, d, TOL_GEN_VS_TRAIN_ABS);
        /* the adapters matter: without them the logits move by much more than the tolerance */
        float *base = gm_malloc((size_t)(T_ * V) * 4);
        generate_logits(m, be[k], NULL, base);
        double moved = max_abs_diff(base, train_l, (size_t)(T_ * V));
        CHECK(moved > 100 * TOL_GEN_VS_TRAIN_ABS, "%s backend: the adapters move the logits by %.3g", be[k]->name, moved);
        printf("%s backend: KV-cache generation with the trained adapters vs the training forward: max |diff| %.2e "
               "(adapters move the logits by %.2e)\n", be[k]->name, d, moved);
        gm_free(base);
        gm_trainer_free(tr);
    }
    CHECK(memcmp(gen_l[0], gen_l[1], (size_t)(T_ * V) * 4) == 0, "generation on the strict backend == on the CPU one");
    gm_free(train_l), gm_free(gen_l[0]), gm_free(gen_l[1]);
    gm_backend_free(be[0]);
    gm_backend_free(be[1]);
}

/* ---- the device plan == a trainer on memory the host cannot read ----------------------------- */

/* gm_plan_on_device(CUDA) says the GPU holds the trainer's arenas with the base weights uploaded
 * into them (the CUDA backend cannot read the file's pages in place) plus cuBLAS's workspace, and
 * the host the rest. The strict backend is such a backend on the CPU: its trainer's arena is what
 * the GPU would hold, byte for byte, and its host staging what the host would. */
static void test_device_plan(const gm_model *m) {
    gm_error err = {0};
    gm_backend *be = NULL;
    CHECK_OK(gm_backend_strict_new(1, &be, &err), &err);
    for (int ck = 0; ck < 2; ck++) {
        gm_train_opts o = opts(ck);
        gm_trainer *tr = NULL;
        CHECK_OK(gm_trainer_new_on(m, &o, be, &tr, &err), &err);
        if (!tr) break;
        size_t arena = gm_trainer_arena(tr)->used, host = gm_trainer_host_bytes(tr);
        gm_dtype lin = GM_F32, emb = GM_F32;
        CHECK_OK(gm_model_stored_dtypes(gm_test_path("tests/ref/tiny_gemma3"), &lin, &emb, &err), &err);
        gm_plan p;
        CHECK_OK(gm_plan_training(&m->cfg, &o, lin, emb, NULL, &p, &err), &err);
        size_t cpu_total = p.total;
        gm_plan_on_device(&p, GM_DEVICE_CUDA);
        CHECK(p.device_arenas == arena + GM_CUDA_LIBRARY_BYTES,
              "checkpointing %d: planned GPU arenas %zu bytes = the strict trainer's arena %zu + cuBLAS workspace and bf16 "
              "staging %zu", ck, p.device_arenas, arena, GM_CUDA_LIBRARY_BYTES);
        CHECK(p.host_total == gm_plan_runtime_bytes(&m->cfg) + host + gm_plan_checkpoint_bytes(p.n_trainable),
              "checkpointing %d: planned host %zu = runtime + the strict trainer's host staging %zu + a checkpoint save", ck,
              p.host_total, host);
        CHECK(p.device_total == p.device_arenas + p.cuda_context && p.device_arenas + p.host_total == cpu_total + GM_CUDA_LIBRARY_BYTES,
              "checkpointing %d: the device and host parts add up to the plan (+ workspace)", ck);
        printf("device plan, checkpointing %s: GPU arenas %zu = strict trainer arena %zu + workspace; host %zu\n",
               ck ? "on" : "off", p.device_arenas, arena, p.host_total);
        gm_trainer_free(tr);
    }
    gm_backend_free(be);
}

/* ---- soft tokens ---------------------------------------------------------------------------- */

static void test_soft_tokens(const gm_model *m) {
    gm_error err = {0};
    int64_t V = m->cfg.vocab_size, C = m->cfg.hidden_size, T = 10;
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .ctx = T, .max_tokens = T, .logit_rows = T, .n_threads = 2};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) return;
    float *want = gm_malloc((size_t)(T * V) * 4);
    CHECK_OK(gm_decoder_forward(st, ids, T, true, &err), &err);
    memcpy(want, st->logits, (size_t)(T * V) * 4);
    /* rows 2, 3 and 7 as soft tokens: their token's embedding row times sqrt(C), in f32 as the
     * graph scales it; the ids there are replaced by 0 to show they are not read */
    int64_t rows[3] = {2, 3, 7};
    float *emb = gm_malloc((size_t)(3 * C) * 4);
    gm_wview E = gm_wview_of(&m->global[GM_GLOBAL_EMBED]);
    int32_t ids2[10];
    memcpy(ids2, ids, sizeof ids2);
    for (int i = 0; i < 3; i++) {
        gm_dequant_wrow(&E, ids[rows[i]], emb + i * C);
        for (int64_t c = 0; c < C; c++) emb[i * C + c] *= m->arch->embed_scale(&m->cfg);
        ids2[rows[i]] = 0;
    }
    gm_infer_reset(st);
    gm_graph_input in = {.B = 1, .T = T, .ids = ids2, .embeds = emb, .embed_rows = rows, .n_embeds = 3};
    CHECK_OK(gm_decoder_forward_input(st, &in, true, &err), &err);
    CHECK(memcmp(want, st->logits, (size_t)(T * V) * 4) == 0, "soft tokens equal to the scaled embeddings give the same logits");
    /* different soft tokens change the logits from their row on, and only from there */
    for (int64_t c = 0; c < C; c++) emb[2 * C + c] += 0.5f;
    gm_infer_reset(st);
    CHECK_OK(gm_decoder_forward_input(st, &in, true, &err), &err);
    CHECK(memcmp(want, st->logits, (size_t)(7 * V) * 4) == 0 && memcmp(want + 7 * V, st->logits + 7 * V, (size_t)V * 4) != 0,
          "a changed soft token at row 7 changes the logits from row 7 on (causal)");
    /* a soft row outside the input is refused, state unchanged */
    int64_t bad_row = T;
    gm_graph_input bad = {.B = 1, .T = T, .ids = ids2, .embeds = emb, .embed_rows = &bad_row, .n_embeds = 1};
    gm_infer_reset(st);
    CHECK(gm_decoder_forward_input(st, &bad, true, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "outside the input") &&
              st->n_past == 0,
          "soft row outside the input: %s", err.msg);
    gm_free(want), gm_free(emb);
    gm_infer_free(st);
}

int main(void) {
    test_strict_faults();
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &m, &err), &err);
    if (!m) return gm_test_finish();
    make_data(m->cfg.vocab_size);
    test_strict_training(m);
    test_generation_equals_training(m);
    test_device_plan(m);
    test_soft_tokens(m);
    gm_model_free(m);
    return gm_test_finish();
}
