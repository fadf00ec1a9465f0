/*
 * test_train.c - LoRA / QLoRA training of the tiny Gemma 3 against Hugging Face PEFT
 * (tests/ref/lora_ref.h5, written by tests/ref/make_lora_ref.py with peft 0.21 + bitsandbytes
 * 0.50 on CPU), plus the properties the issue asks for:
 *   - loss and every LoRA gradient (A and B, 6 layers x 7 modules) at random adapter weights,
 *     for an f32 base, an NF4 base (our quantizer must give bitsandbytes' bytes) and rsLoRA, on
 *     tests/ref/tiny_gemma3_lora (not saturated: loss 6.6 nats against ln 512 = 6.24, largest
 *     probability of any target's row 0.034, so every term of the softmax counts);
 *   - the same plus 3 AdamW steps on a vocabulary (9,000) and a supervised row count (560) above
 *     one LM-head chunk (8,192 x 512): the multi-chunk online log-sum-exp against PEFT;
 *   - 10 AdamW steps (linear schedule with warmup, clipping) match PEFT's loss, lr, grad-norm
 *     trajectory and final adapter weights; the same with gradient accumulation 2 x 2;
 *   - batch 4 x accumulation 1 == batch 1 x accumulation 4; checkpointing on == off;
 *     two runs bit-identical; resume from a checkpoint == never stopped;
 *   - a NaN stops the step with a reason and leaves the adapters untouched; an example with no
 *     supervised token is named.
 */
#include "gm_alloc.h"
#include "gm_model.h"
#include "gm_quant.h"
#include "gm_train.h"
#include "kernels.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* the fixture file the helpers read (check_lora_fixture switches it) */
static const char *REF = "tests/ref/lora_ref.h5";
#define B_ 4
#define T_ 16

/* Tolerances: TOL_PEFT_* in tests/unit/test_util.h. */
#define TOL_LOSS_REL TOL_PEFT_LOSS_REL
#define TOL_GRAD_REL TOL_PEFT_GRAD_REL
#define TOL_WEIGHT_ABS TOL_PEFT_WEIGHT_ABS

static int32_t ids[B_ * T_], targets[B_ * T_];

/* Reads <group>/input_ids and <group>/labels (B, T) into ids and next-token targets (-1: no
 * loss); returns the number of supervised targets. HF shifts: logits at t predict labels[t + 1];
 * -100 = no loss. */
static int64_t load_hf_batch(const char *group, int B, int T, int32_t *out_ids, int32_t *out_tg) {
    size_t n;
    char ds[128];
    snprintf(ds, sizeof ds, "%s/input_ids", group);
    int32_t *in = gm_test_h5_read(gm_test_path(REF), ds, 1, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "%s/labels", group);
    int32_t *lab = gm_test_h5_read(gm_test_path(REF), ds, 1, &n, NULL, NULL);
    int64_t n_sup = 0;
    for (int i = 0; in && lab && i < B * T; i++) {
        out_ids[i] = in[i];
        int32_t l = i % T + 1 < T ? lab[i + 1] : -100;
        out_tg[i] = l == -100 ? -1 : l;
        n_sup += out_tg[i] >= 0;
    }
    gm_free(in), gm_free(lab);
    return n_sup;
}

static void load_batch(void) { load_hf_batch("", B_, T_, ids, targets); }

static gm_batch batch(int b0, int nb) {
    gm_batch b = {.B = nb, .T = T_, .ids = ids + b0 * T_, .targets = targets + b0 * T_, .example_index = NULL};
    return b;
}

static gm_train_opts ref_opts(gm_quant q, int64_t batch_size) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.quant = q;
    o.batch = batch_size;
    o.max_length = T_;
    o.lr = 2e-3f;
    o.weight_decay = 0.01f;
    o.max_grad_norm = 1.0f;
    o.schedule = GM_SCHED_LINEAR;
    o.warmup_steps = 2;
    o.total_steps = 10;
    o.n_threads = 2;
    o.compute = GM_COMPUTE_F32; /* PEFT's f32 numbers (compute = "auto" may be bf16 on this CPU) */
    return o;
}

/* Loads /<group>/<key> for every adapter into A or B (which = 0) or compares with it. */
static void set_adapters(gm_trainer *tr, const char *group) {
    int n;
    gm_lora_adapter *ad = gm_trainer_adapters(tr, &n);
    int64_t r = gm_trainer_opts(tr)->lora.rank;
    for (int i = 0; i < n; i++) {
        char ds[256];
        size_t cnt;
        snprintf(ds, sizeof ds, "%s/%s", group, ad[i].name_A);
        float *a = gm_test_h5_read(gm_test_path(REF), ds, 0, &cnt, NULL, NULL);
        snprintf(ds, sizeof ds, "%s/%s", group, ad[i].name_B);
        float *b = gm_test_h5_read(gm_test_path(REF), ds, 0, &cnt, NULL, NULL);
        if (a) memcpy(ad[i].A, a, (size_t)(r * ad[i].in) * 4);
        if (b) memcpy(ad[i].B, b, (size_t)(ad[i].out * r) * 4);
        gm_free(a), gm_free(b);
    }
}

/* Compares every adapter's gradients (grads = true) or weights with /<group>/<key>. Returns the
 * worst error relative to each tensor's largest reference value. */
static double compare_adapters(gm_trainer *tr, const char *group, bool grads, double tol, const char *what) {
    int n;
    gm_lora_adapter *ad = gm_trainer_adapters(tr, &n);
    int64_t r = gm_trainer_opts(tr)->lora.rank;
    double worst = 0;
    const char *wname = "";
    for (int i = 0; i < n; i++) {
        for (int ab = 0; ab < 2; ab++) {
            const char *name = ab ? ad[i].name_B : ad[i].name_A;
            const float *got = ab ? (grads ? ad[i].dB : ad[i].B) : (grads ? ad[i].dA : ad[i].A);
            size_t cnt;
            char ds[256];
            snprintf(ds, sizeof ds, "%s/%s", group, name);
            float *want = gm_test_h5_read(gm_test_path(REF), ds, 0, &cnt, NULL, NULL);
            if (!want) continue;
            size_t expect = (size_t)(ab ? ad[i].out * r : r * ad[i].in);
            CHECK(cnt == expect, "%s: %zu elements, expected %zu", ds, cnt, expect);
            double mx = 1e-12, e = 0;
            for (size_t j = 0; j < cnt; j++) mx = fmax(mx, fabs(want[j]));
            for (size_t j = 0; j < cnt && j < expect; j++) e = fmax(e, fabs((double)got[j] - want[j]));
            double rel = grads ? e / mx : e;
            if (rel > worst) worst = rel, wname = name;
            gm_free(want);
        }
    }
    CHECK(worst <= tol, "%s: worst %s %.3g at %s (tolerance %.3g)", what, grads ? "relative gradient error" : "|weight diff|",
          worst, wname, tol);
    printf("%-44s worst %s %.2e\n", what, grads ? "rel. grad error" : "|weight diff|", worst);
    return worst;
}

static double h5_scalar(const char *ds) {
    size_t n;
    float *v = gm_test_h5_read(gm_test_path(REF), ds, 0, &n, NULL, NULL);
    double x = v && n ? v[0] : NAN;
    gm_free(v);
    return x;
}

static gm_model *load_tiny(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path(GM_TEST_LORA_MODEL), NULL, &m, &err), &err);
    return m;
}

/* /multichunk: tests/ref/tiny_gemma3_v9k (V = 9000 > GM_LM_VOCAB), 2 x 300 tokens with 560
 * supervised targets (> GM_LM_ROWS): loss and all gradients at random A/B, then 3 AdamW steps
 * from there (linear schedule, no warmup) against PEFT's losses, lrs, grad norms and weights. */
#define MC_B 2
#define MC_T 300
static void test_multichunk(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3_v9k"), NULL, &m, &err), &err);
    if (!m) return;
    CHECK(m->cfg.vocab_size > GM_LM_VOCAB, "vocabulary %lld must exceed one LM chunk (%d)", (long long)m->cfg.vocab_size,
          GM_LM_VOCAB);
    static int32_t mids[MC_B * MC_T], mtg[MC_B * MC_T];
    int64_t n_sup = load_hf_batch("/multichunk", MC_B, MC_T, mids, mtg);
    size_t n;
    CHECK(n_sup > GM_LM_ROWS, "%lld supervised rows must exceed one LM chunk (%d)", (long long)n_sup, GM_LM_ROWS);
    gm_train_opts o = ref_opts(GM_QUANT_STORED, MC_B);
    o.max_length = MC_T;
    o.warmup_steps = 0;
    o.total_steps = 3;
    gm_trainer *tr = NULL;
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) {
        gm_model_free(m);
        return;
    }
    set_adapters(tr, "/multichunk/grad/weights");
    gm_trainer_zero_grad(tr);
    gm_batch b = {.B = MC_B, .T = MC_T, .ids = mids, .targets = mtg, .example_index = NULL};
    double loss_sum = 0;
    CHECK_OK(gm_trainer_forward_backward(tr, &b, (float)(1.0 / (double)n_sup), &loss_sum, &err), &err);
    double want = h5_scalar("/multichunk/grad/loss"), got = loss_sum / (double)n_sup;
    CHECK(fabs(got - want) <= TOL_LOSS_REL * fabs(want), "multichunk loss %.9g vs PEFT %.9g", got, want);
    printf("multichunk (V %lld, %lld rows): loss %.9g, PEFT %.9g\n", (long long)m->cfg.vocab_size, (long long)n_sup, got,
           want);
    compare_adapters(tr, "/multichunk/grad/grads", true, TOL_GRAD_REL, "multichunk: all 28 LoRA gradients vs PEFT");
    /* 3 steps from the same weights */
    set_adapters(tr, "/multichunk/grad/weights");
    float *loss = gm_test_h5_read(gm_test_path(REF), "/multichunk/steps/loss", 0, &n, NULL, NULL);
    float *lr = gm_test_h5_read(gm_test_path(REF), "/multichunk/steps/lr", 0, &n, NULL, NULL);
    float *gn = gm_test_h5_read(gm_test_path(REF), "/multichunk/steps/grad_norm", 0, &n, NULL, NULL);
    double wl = 0, wg = 0;
    for (int s = 0; s < 3 && loss && lr && gn; s++) {
        gm_step_stats st;
        CHECK_OK(gm_trainer_step(tr, &b, 1, &st, &err), &err);
        wl = fmax(wl, fabs(st.loss - loss[s]) / fabs(loss[s]));
        wg = fmax(wg, fabs(st.grad_norm - gn[s]) / fabs(gn[s]));
        CHECK(fabs(st.lr - lr[s]) <= TOL_LR_ABS + TOL_LR_REL * lr[s], "multichunk step %d lr %.9g vs %.9g", s, st.lr,
              (double)lr[s]);
    }
    CHECK(wl <= TOL_LOSS_REL && wg <= TOL_GRAD_REL, "multichunk: 3-step losses differ by %.3g, grad norms by %.3g "
          "(relative)", wl, wg);
    compare_adapters(tr, "/multichunk/steps/final", false, TOL_WEIGHT_ABS, "multichunk: weights after 3 steps vs PEFT");
    gm_free(loss), gm_free(lr), gm_free(gn);
    gm_trainer_free(tr);
    gm_model_free(m);
}

/* Loss and every gradient at the fixture's random adapter weights. */
static void test_grads(gm_model *m, gm_quant q, const char *base, bool rslora) {
    gm_error err = {0};
    gm_trainer *tr = NULL;
    gm_train_opts o = ref_opts(q, 4);
    if (rslora) o.lora.rank = 8, o.lora.alpha = 16, o.lora.rslora = true;
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) return;
    char grp[64], what[96];
    snprintf(grp, sizeof grp, rslora ? "/%s/rslora/weights" : "/%s/grad/weights", base);
    set_adapters(tr, grp);
    gm_trainer_zero_grad(tr);
    gm_batch b = batch(0, 4);
    int64_t n_sup = 0;
    for (int i = 0; i < B_ * T_; i++) n_sup += targets[i] >= 0;
    double loss_sum = 0;
    CHECK_OK(gm_trainer_forward_backward(tr, &b, (float)(1.0 / (double)n_sup), &loss_sum, &err), &err);
    snprintf(grp, sizeof grp, rslora ? "/%s/rslora/loss" : "/%s/grad/loss", base);
    double want = h5_scalar(grp), got = loss_sum / (double)n_sup;
    CHECK(fabs(got - want) <= TOL_LOSS_REL * fabs(want), "%s%s loss %.9g vs PEFT %.9g", base, rslora ? " rslora" : "", got, want);
    printf("%s%s loss %.9g, PEFT %.9g\n", base, rslora ? " rslora" : "", got, want);
    snprintf(grp, sizeof grp, rslora ? "/%s/rslora/grads" : "/%s/grad/grads", base);
    snprintf(what, sizeof what, "%s%s: all 84 LoRA gradients vs PEFT", base, rslora ? " rslora" : "");
    compare_adapters(tr, grp, true, TOL_GRAD_REL, what);
    gm_trainer_free(tr);
}

/* 10 steps from PEFT's init; n_micro micro-batches of 4 / n_micro sequences. Returns the trainer. */
static gm_trainer *run_steps(gm_model *m, gm_quant q, int n_micro, bool ckpt, int steps, double *losses) {
    gm_error err = {0};
    gm_trainer *tr = NULL;
    gm_train_opts o = ref_opts(q, 4 / n_micro);
    o.checkpointing = ckpt;
    o.grad_accum = n_micro;
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) return NULL;
    set_adapters(tr, q == GM_QUANT_NF4 ? "/nf4/init" : "/f32/init");
    gm_batch mb[4];
    for (int i = 0; i < n_micro; i++) mb[i] = batch(i * (4 / n_micro), 4 / n_micro);
    for (int s = 0; s < steps; s++) {
        gm_step_stats st;
        CHECK_OK(gm_trainer_step(tr, mb, n_micro, &st, &err), &err);
        losses[3 * s] = st.loss, losses[3 * s + 1] = st.lr, losses[3 * s + 2] = st.grad_norm;
    }
    return tr;
}

static void test_steps(gm_model *m, gm_quant q, const char *base) {
    double got[30], got_acc[30];
    gm_trainer *tr = run_steps(m, q, 1, false, 10, got);
    if (!tr) return;
    char ds[64];
    size_t n;
    snprintf(ds, sizeof ds, "/%s/steps/loss", base);
    float *loss = gm_test_h5_read(gm_test_path(REF), ds, 0, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/steps/lr", base);
    float *lr = gm_test_h5_read(gm_test_path(REF), ds, 0, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/steps/grad_norm", base);
    float *gn = gm_test_h5_read(gm_test_path(REF), ds, 0, &n, NULL, NULL);
    if (loss && lr && gn) {
        double wl = 0, wg = 0;
        for (int s = 0; s < 10; s++) {
            wl = fmax(wl, fabs(got[3 * s] - loss[s]) / fabs(loss[s]));
            wg = fmax(wg, fabs(got[3 * s + 2] - gn[s]) / fabs(gn[s]));
            CHECK(fabs(got[3 * s + 1] - lr[s]) <= TOL_LR_ABS + TOL_LR_REL * lr[s], "%s step %d lr %.9g vs %.9g", base, s, got[3 * s + 1], (double)lr[s]);
        }
        CHECK(wl <= TOL_LOSS_REL, "%s: 10-step loss trajectory differs from PEFT by %.3g (relative)", base, wl);
        CHECK(wg <= TOL_GRAD_REL, "%s: grad norms differ from PEFT by %.3g (relative)", base, wg);
        printf("%s: 10 AdamW steps, loss %.6f -> %.6f (PEFT %.6f -> %.6f), worst rel. loss diff %.2e, grad norm %.2e\n",
               base, got[0], got[27], (double)loss[0], (double)loss[9], wl, wg);
    }
    snprintf(ds, sizeof ds, "/%s/steps/final", base);
    char what[96];
    snprintf(what, sizeof what, "%s: adapter weights after 10 steps vs PEFT", base);
    compare_adapters(tr, ds, false, TOL_WEIGHT_ABS, what);
    gm_trainer_free(tr);

    /* batch 2 x accumulation 2 */
    tr = run_steps(m, q, 2, false, 10, got_acc);
    if (!tr) return;
    snprintf(ds, sizeof ds, "/%s/accum/final", base);
    snprintf(what, sizeof what, "%s: 2 x 2 accumulation, weights vs PEFT", base);
    compare_adapters(tr, ds, false, TOL_WEIGHT_ABS, what);
    double d = 0;
    for (int s = 0; s < 10; s++) d = fmax(d, fabs(got_acc[3 * s] - got[3 * s]) / got[3 * s]);
    CHECK(d <= TOL_ACCUM_EQUIV_REL, "%s: batch 2 x accumulation 2 vs batch 4: loss differs by %.3g", base, d);
    gm_trainer_free(tr);
    gm_free(loss), gm_free(lr), gm_free(gn);
}

/* compute on the CPU (gm_train.h, gm_compute): 3 steps on the PEFT fixture's batch with a bf16 base
 * (multiplied as stored) and an NF4 one (panels dequantized, rounded to bf16). Where the CPU has native
 * bf16: compute = "bf16" losses within TOL_BF16_LOSS_REL of f32's and not equal (the bf16 GEMMs
 * ran), "auto" bit for bit the run gm_k_cpu_bf16_auto picks. Elsewhere: "bf16" refused, naming the
 * option, and "auto" bit for bit f32. */
static void test_compute(gm_model *m) {
    const gm_quant qs[2] = {GM_QUANT_BF16, GM_QUANT_NF4};
    for (int qi = 0; qi < 2; qi++) {
        double loss[3][3] = {{0}}; /* [f32, bf16, auto][step] */
        bool ran[3] = {false, false, false};
        for (int c = 0; c < 3; c++) {
            gm_error err = {0};
            gm_train_opts o = ref_opts(qs[qi], 4);
            o.compute = c == 0 ? GM_COMPUTE_F32 : c == 1 ? GM_COMPUTE_BF16 : GM_COMPUTE_AUTO;
            gm_trainer *tr = NULL;
            gm_status s = gm_trainer_new(m, &o, &tr, &err);
            if (c == 1 && !gm_k_cpu_bf16_native()) {
                CHECK(s == GM_ERR_UNSUPPORTED && strstr(err.msg, "compute = \"bf16\"") && strstr(err.msg, "hint"),
                      "compute = bf16 on a CPU without bf16: status %d, %s", (int)s, err.msg);
                gm_trainer_free(tr);
                continue;
            }
            CHECK_OK(s, &err);
            if (!tr) continue;
            set_adapters(tr, qs[qi] == GM_QUANT_NF4 ? "/nf4/init" : "/f32/init");
            gm_batch b = batch(0, 4);
            for (int st = 0; st < 3; st++) {
                gm_step_stats ss;
                CHECK_OK(gm_trainer_step(tr, &b, 1, &ss, &err), &err);
                loss[c][st] = ss.loss;
            }
            ran[c] = true;
            gm_trainer_free(tr);
        }
        const char *q = qs[qi] == GM_QUANT_NF4 ? "nf4" : "bf16";
        if (ran[0] && ran[1])
            for (int st = 0; st < 3; st++)
                CHECK(fabs(loss[1][st] - loss[0][st]) <= TOL_BF16_LOSS_REL * fabs(loss[0][st]) && loss[1][st] != loss[0][st],
                      "%s base, step %d: loss with bf16 GEMMs %.9g, with f32 ones %.9g (want close, not equal)", q, st + 1,
                      loss[1][st], loss[0][st]);
        int pick = gm_k_cpu_bf16_auto() ? 1 : 0;
        if (ran[0] && ran[2] && ran[pick])
            CHECK(memcmp(loss[2], loss[pick], sizeof loss[2]) == 0, "%s base: compute = auto did not run as %s", q,
                  pick ? "bf16" : "f32");
        printf("compute on the CPU, %s base, 3 steps: f32 %.6f %.6f %.6f, bf16 %.6f %.6f %.6f, auto = %s\n", q, loss[0][0],
               loss[0][1], loss[0][2], loss[1][0], loss[1][1], loss[1][2], pick ? "bf16" : "f32");
    }
}

static void test_properties(gm_model *m) {
    gm_error err = {0};
    double a[30], b[30], c[30];
    /* batch 4 x 1 vs batch 1 x 4 */
    gm_trainer *t1 = run_steps(m, GM_QUANT_STORED, 1, false, 5, a);
    gm_trainer *t4 = run_steps(m, GM_QUANT_STORED, 4, false, 5, b);
    double d = 0;
    for (int s = 0; s < 5; s++) d = fmax(d, fabs(a[3 * s] - b[3 * s]) / a[3 * s]);
    CHECK(d <= TOL_ACCUM_EQUIV_REL, "batch 4 x 1 vs batch 1 x 4: losses differ by %.3g (relative)", d);
    printf("batch 4 x 1 vs 1 x 4: worst relative loss difference %.2e\n", d);
    gm_trainer_free(t4);
    /* checkpointing on == off, bit for bit */
    gm_trainer *tc = run_steps(m, GM_QUANT_STORED, 1, true, 5, c);
    CHECK(memcmp(a, c, sizeof(double) * 15) == 0, "activation checkpointing changes the losses");
    gm_trainer_free(tc);
    /* two runs bit-identical */
    gm_trainer *t2 = run_steps(m, GM_QUANT_STORED, 1, false, 5, b);
    CHECK(memcmp(a, b, sizeof(double) * 15) == 0, "two identical runs give different losses");
    gm_trainer_free(t2);

    /* resume: 5 steps, save, a fresh trainer loads and continues to 10 == 10 straight steps */
    char path[256];
    snprintf(path, sizeof path, "/tmp/gm_test_train_%d.h5", (int)getpid());
    CHECK_OK(gm_trainer_save(t1, path, 0, 5, a[12], "{\"test\":1}", &err), &err);
    gm_trainer_free(t1);
    double full[30];
    gm_trainer *tf = run_steps(m, GM_QUANT_STORED, 1, false, 10, full);
    gm_trainer *tr = NULL;
    gm_train_opts o = ref_opts(GM_QUANT_STORED, 4);
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    int64_t epoch = -1, pos = -1;
    CHECK_OK(gm_trainer_load(tr, path, &epoch, &pos, &err), &err);
    CHECK(gm_trainer_step_count(tr) == 5 && pos == 5, "resume: step %lld, data position %lld", (long long)gm_trainer_step_count(tr),
          (long long)pos);
    gm_batch bt = batch(0, 4);
    bool same = true;
    for (int s = 5; s < 10; s++) {
        gm_step_stats st;
        CHECK_OK(gm_trainer_step(tr, &bt, 1, &st, &err), &err);
        same = same && st.loss == full[3 * s];
    }
    CHECK(same, "resumed run's losses differ from the uninterrupted run");
    int n1, n2;
    gm_lora_adapter *x1 = gm_trainer_adapters(tr, &n1), *x2 = gm_trainer_adapters(tf, &n2);
    bool wsame = n1 == n2;
    for (int i = 0; wsame && i < n1; i++)
        wsame = memcmp(x1[i].B, x2[i].B, (size_t)(x1[i].out * 4) * 4) == 0 && memcmp(x1[i].A, x2[i].A, (size_t)(4 * x1[i].in) * 4) == 0;
    CHECK(wsame, "resumed run's adapter weights differ from the uninterrupted run");
    unlink(path);

    /* a NaN stops the step, names the tensor, and leaves the adapters as they were */
    int n;
    gm_lora_adapter *ad = gm_trainer_adapters(tr, &n);
    float keep = ad[3].B[0];
    ad[3].B[0] = NAN;
    float a0 = ad[0].A[0];
    gm_step_stats st;
    gm_status s = gm_trainer_step(tr, &bt, 1, &st, &err);
    CHECK(s == GM_ERR_NONFINITE && strstr(err.msg, "step 11"), "NaN: %s", err.msg);
    CHECK(ad[0].A[0] == a0 && gm_trainer_step_count(tr) == 10, "a failed step must not update anything");
    ad[3].B[0] = keep;
    CHECK_OK(gm_trainer_step(tr, &bt, 1, &st, &err), &err);

    /* an example without any supervised token is named */
    int32_t none[T_];
    for (int i = 0; i < T_; i++) none[i] = -1;
    int64_t idx = 41;
    gm_batch bad = {.B = 1, .T = T_, .ids = ids, .targets = none, .example_index = &idx};
    s = gm_trainer_step(tr, &bad, 1, &st, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "example 41 has no supervised token"), "zero tokens: %s", err.msg);
    gm_trainer_free(tr);
    gm_trainer_free(tf);

    /* option validation names the field */
    o.lora.rank = 0;
    s = gm_trainer_new(m, &o, &tr, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "rank = 0"), "rank 0: %s", err.msg);
}

/* A Gemma 3n / 4 fixture (tests/ref/make_gemma3n_ref.py, make_gemma4_ref.py, /lora): the loss of
 * two 20-token sequences and every LoRA gradient at PEFT's drawn A and B, f32 base, against PEFT's
 * f32 and f64 numbers; then the same under activation checkpointing, bit for bit. Gemma 3n: the
 * backward through AltUp, LAuReL, the per-layer inputs, the gaussian top-k, the soft-capped head
 * and the KV-shared layers' keys and values into their source layers; Gemma 4: the per-layer
 * inputs, layer scalars, proportional RoPE on wide full-layer heads, KV sharing with double-wide
 * MLPs, keys as values. n_modules: the adapted linears (none on absent k / v). */
static void check_lora_fixture(const char *label, const char *dir, const char *ref, int n_modules, double tol) {
    REF = ref;
    gm_error err = {0};
    gm_model *m = NULL;
    gm_trainer *tr = NULL;
    CHECK_OK(gm_model_load(gm_test_path(dir), NULL, &m, &err), &err);
    size_t n;
    int32_t *in = gm_test_h5_read(gm_test_path(REF), "/ids", 1, &n, NULL, NULL);
    int32_t *lab = gm_test_h5_read(gm_test_path(REF), "/lora/labels", 1, &n, NULL, NULL);
    int32_t gids[2 * 20], gtg[2 * 20];
    int64_t n_sup = 0;
    for (int i = 0; in && lab && i < 2 * 20; i++) {
        gids[i] = in[i];
        int32_t l = i % 20 + 1 < 20 ? lab[i + 1] : -100;
        gtg[i] = l == -100 ? -1 : l;
        n_sup += gtg[i] >= 0;
    }
    if (!m || !in || !lab) goto done;
    gm_train_opts o = ref_opts(GM_QUANT_STORED, 2);
    o.max_length = 20;
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) goto done;
    int n_ad;
    gm_trainer_adapters(tr, &n_ad);
    CHECK(n_ad == n_modules, "%s: %d adapters, expected %d (6 layers x 7 linears less the absent k / v)", label, n_ad,
          n_modules);
    set_adapters(tr, "/lora/weights");
    gm_trainer_zero_grad(tr);
    gm_batch b = {.B = 2, .T = 20, .ids = gids, .targets = gtg, .example_index = NULL};
    double loss_sum = 0;
    CHECK_OK(gm_trainer_forward_backward(tr, &b, (float)(1.0 / (double)n_sup), &loss_sum, &err), &err);
    double want = h5_scalar("/lora/loss"), got = loss_sum / (double)n_sup;
    CHECK(fabs(got - want) <= TOL_LOSS_REL * fabs(want), "%s loss %.9g vs PEFT %.9g", label, got, want);
    printf("%s loss %.9g, PEFT %.9g\n", label, got, want);
    double want64 = h5_scalar("/lora/loss64");
    CHECK(fabs(got - want64) <= TOL_LOSS_REL * fabs(want64), "%s loss %.9g vs PEFT in float64 %.9g", label, got, want64);
    char what[160];
    snprintf(what, sizeof what, "%s: all %d LoRA gradients vs PEFT", label, 2 * n_modules);
    compare_adapters(tr, "/lora/grads", true, tol, what);
    snprintf(what, sizeof what, "%s: ... vs PEFT in float64", label);
    compare_adapters(tr, "/lora/grads64", true, tol, what);
    /* activation checkpointing: the KV-shared layers read their source's keys and values from the
     * copies it keeps; the same loss and gradients, bit for bit */
    {
        int n0;
        gm_lora_adapter *ad0 = gm_trainer_adapters(tr, &n0);
        size_t tot = 0;
        for (int i = 0; i < n0; i++) tot += (size_t)(4 * ad0[i].in + ad0[i].out * 4);
        float *keep = gm_malloc(tot * sizeof(float)), *p = keep;
        for (int i = 0; i < n0; i++) {
            memcpy(p, ad0[i].dA, (size_t)(4 * ad0[i].in) * 4), p += 4 * ad0[i].in;
            memcpy(p, ad0[i].dB, (size_t)(ad0[i].out * 4) * 4), p += ad0[i].out * 4;
        }
        gm_trainer *tc = NULL;
        gm_train_opts oc = o;
        oc.checkpointing = true;
        CHECK_OK(gm_trainer_new(m, &oc, &tc, &err), &err);
        if (tc && keep) {
            set_adapters(tc, "/lora/weights");
            gm_trainer_zero_grad(tc);
            double ls = 0;
            CHECK_OK(gm_trainer_forward_backward(tc, &b, (float)(1.0 / (double)n_sup), &ls, &err), &err);
            int n1;
            gm_lora_adapter *ad1 = gm_trainer_adapters(tc, &n1);
            bool same = n1 == n0 && ls == loss_sum;
            p = keep;
            for (int i = 0; same && i < n1; i++) {
                same = memcmp(p, ad1[i].dA, (size_t)(4 * ad1[i].in) * 4) == 0;
                p += 4 * ad1[i].in;
                same = same && memcmp(p, ad1[i].dB, (size_t)(ad1[i].out * 4) * 4) == 0;
                p += ad1[i].out * 4;
            }
            CHECK(same, "%s: checkpointing on gives another loss (%.9g vs %.9g) or other gradients", label, ls, loss_sum);
        }
        gm_trainer_free(tc);
        gm_free(keep);
    }
done:
    gm_trainer_free(tr);
    gm_model_free(m);
    gm_free(in), gm_free(lab);
    REF = "tests/ref/lora_ref.h5";
}

/* The router load statistics of a step (gm_step_stats) on the tiny mixture of experts: with fresh
 * adapters (B = 0: the base model's routing) the per-layer expert counts are transformers' top-k
 * choices for the same two sequences (tests/ref/tiny_gemma4_moe_ref.h5 /router_counts), and the two
 * statistics are their max share and coefficient of variation. */
static void test_router_stats(void) {
    const char *ref = gm_test_path("tests/ref/tiny_gemma4_moe_ref.h5");
    gm_error err = {0};
    gm_model *m = NULL;
    gm_trainer *tr = NULL;
    size_t n;
    int32_t *in = gm_test_h5_read(ref, "/ids", 1, &n, NULL, NULL), *want = gm_test_h5_read(ref, "/router_counts", 1, &n, NULL, NULL);
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma4_moe"), NULL, &m, &err), &err);
    if (!m || !in || !want) goto done;
    int64_t L = m->cfg.n_layers, E = m->cfg.n_experts;
    CHECK(n == (size_t)(L * E), "router_counts: %zu values for %lld layers x %lld experts", n, (long long)L, (long long)E);
    gm_train_opts o = ref_opts(GM_QUANT_STORED, 2);
    o.max_length = 20;
    CHECK_OK(gm_trainer_new(m, &o, &tr, &err), &err);
    if (!tr) goto done;
    int32_t tg[2 * 20];
    for (int i = 0; i < 2 * 20; i++) tg[i] = i % 20 < 19 ? in[i + 1] : -1;
    gm_batch b = {.B = 2, .T = 20, .ids = in, .targets = tg, .example_index = NULL};
    gm_step_stats st;
    CHECK_OK(gm_trainer_step(tr, &b, 1, &st, &err), &err);
    double max_load = 0, cv = 0;
    for (int64_t l = 0; l < L; l++) {
        double sum = 0, sq = 0, mx = 0;
        for (int64_t e = 0; e < E; e++) {
            double v = want[l * E + e];
            sum += v, sq += v * v, mx = v > mx ? v : mx;
        }
        double mean = sum / (double)E;
        cv += sqrt(sq / (double)E - mean * mean) / mean / (double)L;
        if (mx / mean > max_load) max_load = mx / mean;
    }
    CHECK(fabs(st.router_max_load - max_load) < 1e-12 && fabs(st.router_load_cv - cv) < 1e-12,
          "router load of the step: max %.6f cv %.6f, from transformers' choices %.6f %.6f", st.router_max_load,
          st.router_load_cv, max_load, cv);
    printf("gemma4 moe: router max load %.4f, load cv %.4f (transformers' choices: %.4f, %.4f)\n", st.router_max_load,
           st.router_load_cv, max_load, cv);
done:
    gm_trainer_free(tr);
    gm_model_free(m);
    gm_free(in), gm_free(want);
}

int main(void) {
    test_router_stats();
    check_lora_fixture("gemma3n", "tests/ref/tiny_gemma3n", "tests/ref/tiny_gemma3n_ref.h5", 38, TOL_GEMMA3N_GRAD_REL);
    check_lora_fixture("gemma4", "tests/ref/tiny_gemma4", "tests/ref/tiny_gemma4_ref.h5", 38, TOL_GEMMA4_GRAD_REL);
    check_lora_fixture("gemma4 k_eq_v", "tests/ref/tiny_gemma4_kv", "tests/ref/tiny_gemma4_kv_ref.h5", 40,
                       TOL_GEMMA4_GRAD_REL);
    check_lora_fixture("gemma4 moe", "tests/ref/tiny_gemma4_moe", "tests/ref/tiny_gemma4_moe_ref.h5", 40,
                       TOL_GEMMA4_GRAD_REL);
    gm_model *m = load_tiny();
    if (!m) return gm_test_finish();
    load_batch();
    test_grads(m, GM_QUANT_STORED, "f32", false);
    test_grads(m, GM_QUANT_STORED, "f32", true);
    test_grads(m, GM_QUANT_NF4, "nf4", false);
    test_steps(m, GM_QUANT_STORED, "f32");
    test_steps(m, GM_QUANT_NF4, "nf4");
    test_properties(m);
    test_compute(m);
    gm_model_free(m);
    test_multichunk();
    return gm_test_finish();
}
