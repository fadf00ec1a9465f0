/*
 * test_decoder.c - the Gemma 3 decoder against Hugging Face transformers on tiny random models
 * (tests/ref/make_ref.py writes the fixtures):
 *   - tiny_gemma3: f32 safetensors, new-style config.json (layer_types, rope_parameters),
 *     GQA 4:2, sliding window 4, query_pre_attn_scalar 24 != head_dim;
 *   - tiny_gemma3_legacy: bf16 safetensors, old-style config (rope_theta, rope_local_base_freq,
 *     sliding_window_pattern, linear RoPE scaling x8 on global layers).
 * Checks the residual stream after the embedding and after every layer, the logits of every
 * position, the KV-cache path (prefill in chunks smaller than the window, then token by token)
 * against the full forward, and greedy continuations token for token.
 */
#include "gm_alloc.h"
#include "gm_decoder.h"
#include "gm_generate.h"
#include "gm_model.h"
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_variant(const char *dir, const char *group) {
    char ref[4096], ds[128];
    snprintf(ref, sizeof ref, "%s", gm_test_path("tests/ref/tiny_gemma3_ref.h5"));
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path(dir), NULL, &m, &err), &err);
    if (!m) return;
    const gm_config *c = &m->cfg;
    int64_t B = 2, T = 12, C = c->hidden_size, V = c->vocab_size, L = c->n_layers;
    size_t n;
    snprintf(ds, sizeof ds, "/%s/input_ids", group);
    int32_t *ids = gm_test_h5_read(ref, ds, 1, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/logits", group);
    float *want_logits = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/hidden_states", group);
    float *want_hs = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/layer_out", group);
    float *want_lo = gm_test_h5_read(ref, ds, 0, &n, NULL, NULL);
    snprintf(ds, sizeof ds, "/%s/greedy", group);
    int32_t *want_greedy = gm_test_h5_read(ref, ds, 1, &n, NULL, NULL);
    if (!ids || !want_logits || !want_hs || !want_lo || !want_greedy) goto done;

    /* 1. full forward of both sequences at once, every position's logits and residual streams */
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = B, .ctx = T, .max_tokens = T, .logit_rows = B * T, .n_threads = 2};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) goto done;
    float *cap = gm_malloc((size_t)((L + 1) * B * T * C) * sizeof(float));
    st->capture_hidden = cap;
    CHECK_OK(gm_decoder_forward(st, ids, T, true, &err), &err);
    char what[128];
    snprintf(what, sizeof what, "%s: embedding * sqrt(C)", group);
    gm_check_close(what, cap, want_hs, (size_t)(B * T * C), TOL_TINY_LOGITS_ABS, 0);
    for (int64_t l = 0; l < L; l++) {
        snprintf(what, sizeof what, "%s: residual after layer %lld", group, (long long)l);
        gm_check_close(what, cap + (l + 1) * B * T * C, want_lo + l * B * T * C, (size_t)(B * T * C),
                       TOL_TINY_LOGITS_ABS, 0);
    }
    snprintf(what, sizeof what, "%s: logits (2 x 12 positions)", group);
    gm_check_close(what, st->logits, want_logits, (size_t)(B * T * V), TOL_TINY_LOGITS_ABS, 0);
    gm_free(cap);
    gm_infer_free(st);

    /* 2. KV cache: prefill in chunks of 3 (< window 4 + chunk) then one token at a time; each
     * step's last-position logits must equal the full forward's logits at that position. */
    st = NULL;
    io = (gm_infer_opts){.batch = B, .ctx = T, .max_tokens = 3, .logit_rows = B, .n_threads = 2};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) goto done;
    int32_t chunk[2 * 3];
    double worst = 0;
    for (int64_t p = 0; p < T;) {
        int64_t tn = p < 6 ? 3 : 1; /* two chunks of 3, then single tokens */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < tn; t++) chunk[b * tn + t] = ids[b * T + p + t];
        CHECK_OK(gm_decoder_forward(st, chunk, tn, false, &err), &err);
        for (int64_t b = 0; b < B; b++)
            for (int64_t v = 0; v < V; v++) {
                double d = fabs((double)st->logits[b * V + v] - want_logits[(b * T + p + tn - 1) * V + v]);
                if (d > worst) worst = d;
            }
        p += tn;
    }
    CHECK(worst <= TOL_TINY_LOGITS_ABS, "%s: cached decoding differs from the reference by %g", group, worst);
    gm_infer_free(st);

    /* 3. greedy continuation of the 4-token prefix, 8 new tokens, sequence by sequence */
    io = (gm_infer_opts){.batch = 1, .ctx = 12, .max_tokens = 4, .n_threads = 2};
    st = NULL;
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) goto done;
    for (int64_t b = 0; b < B; b++) {
        gm_sample_opts so = {.max_new_tokens = 8, .temperature = 0};
        int32_t out[8];
        int64_t n_out = 0;
        CHECK_OK(gm_generate(st, ids + b * T, 4, &so, NULL, NULL, out, &n_out, NULL, &err), &err);
        CHECK(n_out == 8 && memcmp(out, want_greedy + b * 8, sizeof out) == 0,
              "%s: greedy continuation of sequence %lld differs", group, (long long)b);
    }
    gm_infer_free(st);
done:
    gm_free(ids), gm_free(want_logits), gm_free(want_hs), gm_free(want_lo), gm_free(want_greedy);
    gm_model_free(m);
}

static void test_bad_inputs(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &m, &err), &err);
    if (!m) return;
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .ctx = 8, .max_tokens = 4, .n_threads = 1};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    int32_t bad[2] = {3, 512};
    gm_status s = gm_decoder_forward(st, bad, 2, false, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "outside the vocabulary"), "bad id: %s", err.msg);
    CHECK(st->n_past == 0, "a rejected call must leave the state unchanged");
    int32_t ok[5] = {1, 2, 3, 4, 5};
    s = gm_decoder_forward(st, ok, 5, false, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "per call"), "too many tokens: %s", err.msg);
    CHECK_OK(gm_decoder_forward(st, ok, 4, false, &err), &err);
    CHECK_OK(gm_decoder_forward(st, ok, 4, false, &err), &err);
    s = gm_decoder_forward(st, ok, 1, false, &err);
    CHECK(s == GM_ERR_INVALID && strstr(err.msg, "context"), "past the context: %s", err.msg);
    gm_infer_free(st);
    gm_model_free(m);

    /* a config that does not match the weights */
    s = gm_model_load(gm_test_path("tests/ref/bad/shape_mismatch"), NULL, &m, &err);
    CHECK(s == GM_ERR_FORMAT && strstr(err.msg, "shape") && strstr(err.msg, "config"), "shape mismatch: %s", err.msg);
    s = gm_model_load(gm_test_path("tests/ref/bad/missing_key"), NULL, &m, &err);
    CHECK(s == GM_ERR_NOT_FOUND && strstr(err.msg, "missing key 'head_dim'") && strstr(err.msg, "config.json"),
          "missing key: %s", err.msg);
    s = gm_model_load(gm_test_path("tests/ref/no_such_model"), NULL, &m, &err);
    CHECK(s == GM_ERR_IO && strstr(err.msg, "no_such_model"), "missing path: %s", err.msg);
}

/* A Gemma 3n / 4 fixture (tests/ref/make_gemma3n_ref.py, make_gemma4_ref.py: every part of the
 * architecture at toy sizes, KV-shared layers): the logits of a whole-sequence forward, then of a
 * 7-token prompt and one token at a time through the KV caches (the shared layers reading their
 * source layers' caches), against transformers' uncached and cached logits. mm_dir, when not NULL:
 * the same decoder in the multimodal layout (model.language_model., stand-in towers beside it). */
static void check_fixture(const char *label, const char *dir, const char *ref_path, const char *mm_dir) {
    const char *ref = gm_test_path(ref_path);
    gm_error err = {0};
    gm_model *m = NULL;
    size_t n;
    int32_t *ids = gm_test_h5_read(ref, "/ids", 1, &n, NULL, NULL);
    float *want = gm_test_h5_read(ref, "/logits", 0, &n, NULL, NULL);
    float *want_cached = gm_test_h5_read(ref, "/logits_cached", 0, &n, NULL, NULL);
    char what[160];
    CHECK_OK(gm_model_load(gm_test_path(dir), NULL, &m, &err), &err);
    if (!m || !ids || !want || !want_cached) goto done;
    int64_t B = 2, T = 20, V = m->cfg.vocab_size, PROMPT = 7;
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = B, .ctx = T, .max_tokens = T, .logit_rows = B * T, .n_threads = 2};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) goto done;
    CHECK_OK(gm_decoder_forward(st, ids, T, true, &err), &err);
    snprintf(what, sizeof what, "%s: logits of 2 x 20 positions in one call", label);
    gm_check_close(what, st->logits, want, (size_t)(B * T * V), TOL_TINY_LOGITS_ABS, 0);
    gm_infer_free(st);
    if (mm_dir) {
        gm_model *mm = NULL;
        CHECK_OK(gm_model_load(gm_test_path(mm_dir), NULL, &mm, &err), &err);
        if (mm) {
            CHECK(mm->vision == NULL && gm_model_no_images(mm) && strstr(gm_model_no_images(mm), "MobileNet-V5"),
                  "%s multimodal: no tower loaded, images refused naming the vision encoder", label);
            CHECK(strcmp(mm->prefix, "model.language_model.") == 0, "%s multimodal: text prefix %s", label, mm->prefix);
            st = NULL;
            io = (gm_infer_opts){.batch = B, .ctx = T, .max_tokens = T, .logit_rows = B * T, .n_threads = 2};
            CHECK_OK(gm_infer_new(mm, &io, &st, &err), &err);
            if (st) {
                CHECK_OK(gm_decoder_forward(st, ids, T, true, &err), &err);
                snprintf(what, sizeof what, "%s in the multimodal layout: logits", label);
                gm_check_close(what, st->logits, want, (size_t)(B * T * V), TOL_TINY_LOGITS_ABS, 0);
                gm_infer_free(st);
            }
            gm_model_free(mm);
        }
    }
    st = NULL;
    io = (gm_infer_opts){.batch = B, .ctx = T, .max_tokens = PROMPT, .logit_rows = B * PROMPT, .n_threads = 2};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) goto done;
    int32_t chunk[2 * 7];
    double worst = 0, worst_c = 0;
    for (int64_t p = 0; p < T;) {
        int64_t tn = p == 0 ? PROMPT : 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < tn; t++) chunk[b * tn + t] = ids[b * T + p + t];
        CHECK_OK(gm_decoder_forward(st, chunk, tn, true, &err), &err);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < tn; t++)
                for (int64_t v = 0; v < V; v++) {
                    size_t at = (size_t)((b * T + p + t) * V + v);
                    double got = st->logits[(b * tn + t) * V + v];
                    if (fabs(got - want[at]) > worst) worst = fabs(got - want[at]);
                    if (fabs(got - want_cached[at]) > worst_c) worst_c = fabs(got - want_cached[at]);
                }
        p += tn;
    }
    CHECK(worst <= TOL_TINY_LOGITS_ABS && worst_c <= TOL_TINY_LOGITS_ABS,
          "%s: a 7-token prompt then single tokens through the KV caches: %g from transformers' uncached logits, "
          "%g from its cached ones (bound %g)", label, worst, worst_c, TOL_TINY_LOGITS_ABS);
    printf("%s: cached decoding %.3g from transformers' uncached logits, %.3g from its cached ones\n", label, worst, worst_c);
    gm_infer_free(st);
done:
    gm_free(ids), gm_free(want), gm_free(want_cached);
    gm_model_free(m);
}

int main(void) {
    check_fixture("gemma3n", "tests/ref/tiny_gemma3n", "tests/ref/tiny_gemma3n_ref.h5", "tests/ref/tiny_gemma3n_mm");
    /* Gemma 4 (make_gemma4_ref.py): the E family (per-layer inputs, KV sharing with double-wide
     * MLPs, wide full-layer heads with proportional RoPE, layer scalars) and the 31B family (keys
     * as values on full layers, one global kv head) */
    check_fixture("gemma4", "tests/ref/tiny_gemma4", "tests/ref/tiny_gemma4_ref.h5", NULL);
    check_fixture("gemma4 k_eq_v", "tests/ref/tiny_gemma4_kv", "tests/ref/tiny_gemma4_kv_ref.h5", NULL);
    /* ... and the 26B-A4B family: a mixture of experts beside every MLP */
    check_fixture("gemma4 moe", "tests/ref/tiny_gemma4_moe", "tests/ref/tiny_gemma4_moe_ref.h5", NULL);
    check_variant("tests/ref/tiny_gemma3", "tiny");
    check_variant("tests/ref/tiny_gemma3_legacy", "tiny_legacy");
    test_bad_inputs();
    return gm_test_finish();
}
