/*
 * gm_generate.c - prefill + token-by-token decoding with greedy or top-k/top-p sampling.
 */
#define _POSIX_C_SOURCE 200809L
#include "gm_generate.h"
#include "gm_mm_embed.h"

#include "gm_vision.h" /* gm_mm_kv_end */

#include "gm_alloc.h"
#include "gm_rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Greedy unless the temperature is a positive number (NaN counts as greedy, never as sampling
 * with a missing work buffer). */
static bool sampling(const gm_sample_opts *o) { return o->temperature > 0; }

gm_status gm_generate_check(const gm_config *cfg, int64_t n_prompt, int64_t max_new_tokens, gm_error *err) {
    if (n_prompt < 1) return gm_error_set(err, GM_ERR_INVALID, "empty prompt");
    if (max_new_tokens < 1) return gm_error_set(err, GM_ERR_INVALID, "max new tokens must be >= 1");
    if (n_prompt >= cfg->max_position_embeddings)
        return gm_error_set(err, GM_ERR_INVALID,
                            "the prompt (%lld tokens) fills the model's context of %lld positions: no room for a new token\n"
                            "  hint: shorten the prompt to at most %lld tokens",
                            (long long)n_prompt, (long long)cfg->max_position_embeddings,
                            (long long)(cfg->max_position_embeddings - 1));
    if (max_new_tokens > cfg->max_position_embeddings - n_prompt)
        return gm_error_set(err, GM_ERR_INVALID,
                            "prompt (%lld tokens) + max new tokens (%lld) exceed the model's context of %lld positions\n"
                            "  hint: lower --max-tokens to at most %lld",
                            (long long)n_prompt, (long long)max_new_tokens, (long long)cfg->max_position_embeddings,
                            (long long)(cfg->max_position_embeddings > n_prompt ? cfg->max_position_embeddings - n_prompt : 0));
    return GM_OK;
}

int32_t gm_sample_token(const float *logits, int64_t V, const gm_sample_opts *o, uint64_t step,
                        float *work) {
    if (!sampling(o)) return argmax(logits, V);
    cand *c = (cand *)work; /* caller provides V * sizeof(cand) bytes */
    for (int64_t i = 0; i < V; i++) {
        c[i].logit = logits[i] / o->temperature;
        c[i].id = (int32_t)i;
    }
    int64_t n = V;
    if (o->top_k > 0 && o->top_k < V) {
        /* partial order: sort only the top_k (qsort of all V is fine at 262k, but cheaper: select) */
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
        n = o->top_k;
    } else {
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
    }
    double mx = c[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)c[i].logit - mx);
    if (o->top_p > 0 && o->top_p < 1) {
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - mx) / sum;
            if (cum >= o->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (int64_t i = 0; i < n; i++) sum += exp((double)c[i].logit - mx);
    }
    gm_rng r = gm_rng_seed(o->seed, step);
    double u = (double)gm_rng_uniform(&r) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += exp((double)c[i].logit - mx);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

static bool is_stop(const gm_sample_opts *o, int32_t t) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop_ids[i] == t) return true;
    return false;
}

static gm_status generate(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_prompt_media *pi,
                          const gm_sample_opts *o, gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                          gm_generate_stats *stats, gm_error *err);

gm_status gm_generate(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_sample_opts *o,
                      gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                      gm_generate_stats *stats, gm_error *err) {
    return generate(st, prompt, n_prompt, NULL, o, cb, user, out_ids, n_out, stats, err);
}

gm_status gm_generate_images(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const float *soft,
                             const int64_t *soft_rows, int64_t n_soft, int32_t image_token_id, const gm_sample_opts *o,
                             gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out, gm_generate_stats *stats,
                             gm_error *err) {
    *n_out = 0;
    if (n_prompt > st->T_max)
        return gm_error_set(err, GM_ERR_INVALID, "a prompt with images is prefilled in one call: %lld tokens, the state was "
                            "planned for %lld per call", (long long)n_prompt, (long long)st->T_max);
    gm_prompt_media pm = {soft, soft_rows, n_soft, image_token_id, NULL};
    return generate(st, prompt, n_prompt, &pm, o, cb, user, out_ids, n_out, stats, err);
}

gm_status gm_generate_media(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_prompt_media *pm,
                            const gm_sample_opts *o, gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                            gm_generate_stats *stats, gm_error *err) {
    *n_out = 0;
    if (n_prompt > st->T_max)
        return gm_error_set(err, GM_ERR_INVALID, "a prompt with images or audio is prefilled in one call: %lld tokens, the "
                            "state was planned for %lld per call", (long long)n_prompt, (long long)st->T_max);
    return generate(st, prompt, n_prompt, pm, o, cb, user, out_ids, n_out, stats, err);
}

static gm_status generate(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_prompt_media *pi,
                          const gm_sample_opts *o, gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                          gm_generate_stats *stats, gm_error *err) {
    *n_out = 0;
    if (st->B != 1) return gm_error_set(err, GM_ERR_INVALID, "generation needs a state planned for batch 1");
    GM_TRY(gm_generate_check(&st->model->cfg, n_prompt, o->max_new_tokens, err));
    if (o->max_new_tokens > st->ctx_max - n_prompt)
        return gm_error_set(err, GM_ERR_INVALID,
                            "prompt (%lld tokens) + max new tokens (%lld) exceed the planned context (%lld)",
                            (long long)n_prompt, (long long)o->max_new_tokens, (long long)st->ctx_max);
    int64_t V = st->model->cfg.vocab_size;
    void *work = NULL;
    if (sampling(o)) {
        work = gm_malloc((size_t)V * sizeof(cand));
        if (!work) return gm_error_set(err, GM_ERR_NOMEM, "out of memory for the sampler");
    }
    gm_infer_reset(st);
    gm_status s = GM_OK;
    double t0 = now_s();
    /* prefill in chunks of at most T_max tokens; with images in one call, their tokens seeing the
     * whole image */
    if (pi) {
        int32_t *kv_end = pi->image_token_id >= 0 ? gm_malloc((size_t)n_prompt * sizeof *kv_end) : NULL;
        const float **hptr = pi->hard ? gm_malloc((size_t)n_prompt * sizeof *hptr) : NULL;
        int64_t *hrows = pi->hard ? gm_malloc((size_t)n_prompt * sizeof *hrows) : NULL;
        if ((pi->image_token_id >= 0 && !kv_end) || (pi->hard && (!hptr || !hrows)))
            s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        if (s == GM_OK) {
            if (kv_end) gm_mm_kv_end(prompt, 1, n_prompt, pi->image_token_id, 0, kv_end);
            gm_graph_input in = {.B = 1, .T = n_prompt, .ids = prompt, .embeds = pi->soft, .embed_rows = pi->soft_rows,
                                 .n_embeds = pi->n_soft, .kv_end = kv_end};
            if (pi->hard) {
                in.ptr_embeds = hptr, in.ptr_rows = hrows;
                in.n_ptr_embeds = gm_mm_hard_place(pi->hard, prompt, n_prompt, hptr, hrows, n_prompt);
            }
            s = gm_decoder_forward_input(st, &in, false, err);
        }
        gm_free(kv_end), gm_free(hptr), gm_free(hrows);
    }
    for (int64_t p = 0; !pi && p < n_prompt && s == GM_OK; p += st->T_max) {
        if (o->interrupt && *o->interrupt) s = gm_error_set(err, GM_ERR_INTERRUPTED, "interrupted during the prompt");
        int64_t n = n_prompt - p < st->T_max ? n_prompt - p : st->T_max;
        if (s == GM_OK) s = gm_decoder_forward(st, prompt + p, n, false, err);
    }
    double t1 = now_s();
    int64_t produced = 0;
    while (s == GM_OK && produced < o->max_new_tokens) {
        for (int64_t v = 0; v < V; v++)
            if (!isfinite(st->logits[v])) {
                s = gm_error_set(err, GM_ERR_NONFINITE,
                                 "the model produced a non-finite logit (%g for token %lld) at position %lld\n"
                                 "  hint: the weights may be corrupt; `gemmarun fetch` re-checks the default model",
                                 (double)st->logits[v], (long long)v, (long long)st->n_past);
                break;
            }
        if (s != GM_OK) break;
        if (o->interrupt && *o->interrupt) {
            s = gm_error_set(err, GM_ERR_INTERRUPTED, "interrupted after %lld tokens", (long long)produced);
            break;
        }
        int32_t tok = gm_sample_token(st->logits, V, o, (uint64_t)produced, work);
        out_ids[produced++] = tok;
        if (cb && !cb(tok, user)) break;
        if (is_stop(o, tok) || produced == o->max_new_tokens) break;
        s = gm_decoder_forward(st, &tok, 1, false, err);
    }
    double t2 = now_s();
    gm_free(work);
    *n_out = produced;
    if (stats) {
        stats->n_prompt = n_prompt;
        stats->n_generated = produced;
        stats->prefill_seconds = t1 - t0;
        stats->decode_seconds = t2 - t1;
    }
    return s;
}
