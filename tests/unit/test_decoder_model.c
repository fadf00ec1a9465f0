/*
 * test_decoder_model.c - the real Gemma 3 270M (GGUF Q4_K_M, dequantized, f32 compute) against
 * Hugging Face transformers run on the same dequantized weights (tests/ref/gemma3_270m_ref.h5,
 * written by tests/ref/make_ref.py). For five prompts (6 to 129 tokens):
 *   - prefill: logits at 1,024 probe ids for every position, and the reference's top-32 logits;
 *     log-sum-exp over the full 262,144-entry vocabulary at every position;
 *   - decode: the greedy continuation through the KV cache, all 48 tokens identical, and at every
 *     one of those 48 steps the logits of the reference's top-32 ids and the log-sum-exp of the
 *     whole row (the reference's greedy_top_logits / greedy_lse, transformers' cached decode);
 * each logit within TOL_REAL_LOGITS_ABS, each log-sum-exp within TOL_REAL_LSE_ABS (absolute, no
 * relative escape). Prints the measured worst differences (the basis of the tolerance table in
 * test_util.h).
 */
#include "gm_alloc.h"
#include "gm_decoder.h"
#include "gm_generate.h"
#include "gm_model.h"
#include "gm_tokenizer.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define N_PROMPTS 5
#define N_GREEDY 48
#define N_TOP 32

/* The decode path's check, run after each generated token while st->logits still holds the row
 * it was picked from: that row against the reference's step (top-32 logits, log-sum-exp). */
typedef struct decode_check {
    const gm_infer *st;
    int64_t V;
    const int32_t *top_ids;   /* (N_GREEDY, N_TOP) */
    const float *top_logits;  /* (N_GREEDY, N_TOP) */
    const double *lse;        /* (N_GREEDY) */
    int step;
    size_t bad;
    double worst_logit, worst_lse;
} decode_check;

static bool on_token(int32_t token, void *user) {
    decode_check *c = user;
    (void)token;
    if (c->step >= N_GREEDY) return false;
    const float *row = c->st->logits;
    for (int k = 0; k < N_TOP; k++) {
        double d = fabs((double)row[c->top_ids[c->step * N_TOP + k]] - c->top_logits[c->step * N_TOP + k]);
        c->worst_logit = d > c->worst_logit ? d : c->worst_logit;
        if (d > TOL_REAL_LOGITS_ABS) c->bad++;
    }
    double dl = fabs(gm_test_lse(row, c->V) - c->lse[c->step]);
    c->worst_lse = dl > c->worst_lse ? dl : c->worst_lse;
    if (dl > TOL_REAL_LSE_ABS) c->bad++;
    c->step++;
    return true;
}

int main(void) {
    const char *path = gm_test_real_model();
    CHECK(path != NULL, "the real model is required for this test");
    if (!path) return gm_test_finish();
    char ref[4096];
    snprintf(ref, sizeof ref, "%s", gm_test_path("tests/ref/gemma3_270m_ref.h5"));
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(path, NULL, &m, &err), &err);
    if (!m) return gm_test_finish();
    int64_t V = m->cfg.vocab_size;
    size_t n_probe;
    int32_t *probe = gm_test_h5_read(ref, "/probe_ids", 1, &n_probe, NULL, NULL);
    double worst_probe = 0, worst_lse = 0, worst_dec_logit = 0, worst_dec_lse = 0;
    for (int p = 0; p < N_PROMPTS && probe; p++) {
        char ds[64];
        size_t T, n;
        snprintf(ds, sizeof ds, "/p%d/input_ids", p);
        int32_t *ids = gm_test_h5_read(ref, ds, 1, &T, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/probe_logits", p);
        float *want_probe = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/lse", p);
        float *want_lse = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/top_ids", p);
        int32_t *top_ids = gm_test_h5_read(ref, ds, 1, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/top_logits", p);
        float *top_logits = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/greedy", p);
        int32_t *greedy = gm_test_h5_read(ref, ds, 1, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/greedy_top_ids", p);
        int32_t *g_top_ids = gm_test_h5_read(ref, ds, 1, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/greedy_top_logits", p);
        float *g_top_logits = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
        snprintf(ds, sizeof ds, "/p%d/greedy_lse", p);
        double *g_lse = gm_test_h5_read(ref, ds, 2, &n, NULL, NULL);
        if (!ids || !want_probe || !want_lse || !top_ids || !top_logits || !greedy || !g_top_ids ||
            !g_top_logits || !g_lse)
            break;

        gm_infer *st = NULL;
        gm_infer_opts io = {.batch = 1, .ctx = (int64_t)T + N_GREEDY, .max_tokens = (int64_t)T,
                            .logit_rows = (int64_t)T, .n_threads = 2};
        CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
        if (!st) break;
        CHECK_OK(gm_decoder_forward(st, ids, (int64_t)T, true, &err), &err);
        size_t bad = 0;
        for (size_t t = 0; t < T; t++) {
            const float *row = st->logits + t * (size_t)V;
            double dl = fabs(gm_test_lse(row, V) - want_lse[t]);
            worst_lse = dl > worst_lse ? dl : worst_lse;
            if (dl > TOL_REAL_LSE_ABS) bad++;
            for (size_t k = 0; k < n_probe; k++) {
                double d = fabs((double)row[probe[k]] - want_probe[t * n_probe + k]);
                worst_probe = d > worst_probe ? d : worst_probe;
                if (d > TOL_REAL_LOGITS_ABS) bad++;
            }
            for (int k = 0; k < N_TOP; k++) {
                double d = fabs((double)row[top_ids[t * N_TOP + k]] - top_logits[t * N_TOP + k]);
                worst_probe = d > worst_probe ? d : worst_probe;
                if (d > TOL_REAL_LOGITS_ABS) bad++;
            }
        }
        CHECK(bad == 0, "prompt %d, prefill: %zu logits or log-sum-exps outside tolerance", p, bad);
        gm_infer_free(st);

        /* greedy continuation through the KV cache */
        st = NULL;
        io = (gm_infer_opts){.batch = 1, .ctx = (int64_t)T + N_GREEDY, .max_tokens = 64, .n_threads = 2};
        CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
        gm_sample_opts so = {.max_new_tokens = N_GREEDY, .temperature = 0};
        int32_t out[N_GREEDY];
        int64_t n_out = 0;
        decode_check dc = {.st = st, .V = V, .top_ids = g_top_ids, .top_logits = g_top_logits, .lse = g_lse};
        CHECK_OK(gm_generate(st, ids, (int64_t)T, &so, on_token, &dc, out, &n_out, NULL, &err), &err);
        int first_diff = n_out < N_GREEDY ? (int)n_out : -1;
        for (int i = 0; i < N_GREEDY && i < n_out; i++)
            if (out[i] != greedy[i]) {
                first_diff = i;
                break;
            }
        printf("prompt %d: %zu tokens, greedy %s", p, T, first_diff < 0 ? "identical for 48 tokens\n" : "");
        if (first_diff >= 0) printf("first differs at step %d\n", first_diff);
        CHECK(first_diff < 0, "prompt %d: greedy continuation differs from transformers' at step %d of %d", p,
              first_diff, N_GREEDY);
        CHECK(dc.step == N_GREEDY && dc.bad == 0,
              "prompt %d, decode: %zu logits or log-sum-exps outside tolerance over %d steps", p, dc.bad, dc.step);
        worst_dec_logit = dc.worst_logit > worst_dec_logit ? dc.worst_logit : worst_dec_logit;
        worst_dec_lse = dc.worst_lse > worst_dec_lse ? dc.worst_lse : worst_dec_lse;
        gm_infer_free(st);
        gm_free(ids), gm_free(want_probe), gm_free(want_lse), gm_free(top_ids), gm_free(top_logits);
        gm_free(greedy), gm_free(g_top_ids), gm_free(g_top_logits), gm_free(g_lse);
    }
    printf("measured: prefill worst |logit diff| %.3g, |lse diff| %.3g; decode worst |logit diff| %.3g, "
           "|lse diff| %.3g (bounds %.3g, %.3g)\n",
           worst_probe, worst_lse, worst_dec_logit, worst_dec_lse, TOL_REAL_LOGITS_ABS, TOL_REAL_LSE_ABS);
    gm_free(probe);
    gm_model_free(m);
    return gm_test_finish();
}
