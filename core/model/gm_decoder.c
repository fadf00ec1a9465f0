/*
 * gm_decoder.c - generation-time forward: the architecture's layer (core/arch) in the graph's
 * inference mode, then the LM head on the wanted rows. See gm_decoder.h.
 */
#include "gm_decoder.h"

#include "gm_alloc.h"

#include <string.h>

static gm_infer_opts resolve_opts(const gm_config *c, const gm_infer_opts *o) {
    gm_infer_opts r = {.batch = 1, .max_tokens = 0, .ctx = 0, .logit_rows = 0, .n_threads = 2};
    if (o) r = *o;
    if (r.batch <= 0) r.batch = 1;
    if (r.ctx <= 0) r.ctx = c->max_position_embeddings < 4096 ? c->max_position_embeddings : 4096;
    if (r.max_tokens <= 0 || r.max_tokens > r.ctx) r.max_tokens = r.ctx;
    if (r.logit_rows <= 0) r.logit_rows = r.batch;
    if (r.n_threads <= 0) r.n_threads = 2;
    return r;
}

static gm_graph_opts graph_opts(const gm_infer_opts *o) {
    gm_graph_opts go = {.mode = GM_GRAPH_INFER, .batch = o->batch, .max_tokens = o->max_tokens, .ctx = o->ctx,
                        .checkpointing = false, .lm_rows = 0, .rank = o->adapter ? o->adapter->cfg.rank : 0,
                        .n_threads = o->n_threads};
    return go;
}

/* The one layout: weights (when not aliased), the graph's buffers, the head's. */
static gm_status layout(gm_infer *st, const gm_model *m, gm_dtype wdt, gm_error *err) {
    const gm_config *c = st->w.cfg;
    int64_t C = c->hidden_size, V = c->vocab_size, R = st->logit_rows;
    GM_TRY(gm_weights_layout(&st->w, m, wdt, wdt, st->be, &st->arena, st->g.o.n_threads, err));
    gm_graph_layout(&st->g, &st->arena, &st->host);
    st->logit_sel = (int32_t *)gm_arena_alloc(&st->arena, (size_t)R * sizeof(int32_t), GM_MEM_TRANSIENT);
    st->logit_in = (float *)gm_arena_alloc(&st->arena, (size_t)(R * C) * sizeof(float), GM_MEM_TRANSIENT);
    st->logits_dev = (float *)gm_arena_alloc(&st->arena, (size_t)(R * V) * sizeof(float), GM_MEM_TRANSIENT);
    st->host_sel = (int32_t *)gm_arena_alloc(&st->host, (size_t)R * sizeof(int32_t), GM_MEM_TRANSIENT);
    st->logits = (float *)gm_arena_alloc(&st->host, (size_t)(R * V) * sizeof(float), GM_MEM_TRANSIENT);
    return GM_OK;
}

/* Sets up weights and graph for config c (m may be NULL: a plan). */
static gm_status setup(gm_infer *st, const gm_config *c, const gm_infer_opts *o, gm_error *err) {
    st->B = o->batch;
    st->T_max = o->max_tokens;
    st->ctx_max = o->ctx;
    st->logit_rows = o->logit_rows;
    GM_TRY(gm_weights_init(&st->w, c, GM_QUANT_STORED, err));
    gm_graph_opts go = graph_opts(o);
    go.lm_rows = c->vocab_size; /* the LM head in one call */
    return gm_graph_init(&st->g, c, &st->w, o->adapter, st->be, &go, err);
}

size_t gm_infer_plan_bytes(const gm_config *cfg, const gm_infer_opts *opts, gm_dtype weight_dtype,
                           size_t by_kind[GM_MEM_KIND_COUNT]) {
    gm_infer_opts o = resolve_opts(cfg, opts);
    o.adapter = NULL;
    gm_infer tmp;
    memset(&tmp, 0, sizeof tmp);
    size_t total = 0;
    if (setup(&tmp, cfg, &o, NULL) == GM_OK) {
        gm_arena_init(&tmp.arena, "inference", GM_DEVICE_CPU);
        gm_arena_init(&tmp.host, "inference host", GM_DEVICE_CPU);
        if (layout(&tmp, NULL, weight_dtype, NULL) == GM_OK) {
            total = tmp.arena.used + tmp.host.used;
            if (by_kind)
                for (int k = 0; k < GM_MEM_KIND_COUNT; k++) by_kind[k] = tmp.arena.by_kind[k] + tmp.host.by_kind[k];
        }
    }
    gm_graph_free(&tmp.g);
    gm_weights_free(&tmp.w);
    return total;
}

gm_status gm_infer_new(const gm_model *m, const gm_infer_opts *opts, gm_infer **out, gm_error *err) {
    *out = NULL;
    const gm_config *c = &m->cfg;
    if (opts && (opts->ctx < 0 || opts->max_tokens < 0 || opts->batch < 0 || opts->logit_rows < 0))
        return gm_error_set(err, GM_ERR_INVALID, "negative sizes in the inference options");
    gm_infer_opts o = resolve_opts(c, opts);
    if (o.ctx > c->max_position_embeddings)
        return gm_error_set(err, GM_ERR_INVALID, "a context of %lld positions exceeds the model's max_position_embeddings (%lld)",
                            (long long)o.ctx, (long long)c->max_position_embeddings);
    gm_infer *st = gm_calloc(1, sizeof *st);
    if (!st) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    st->model = m;
    gm_status s = GM_OK;
    if (o.backend) {
        st->be = o.backend;
    } else {
        s = gm_backend_cpu_new(o.n_threads, &st->owned_be, err);
        st->be = st->owned_be;
    }
    if (s == GM_OK) s = setup(st, c, &o, err);
    if (s == GM_OK) {
        gm_backend_arena(st->be, &st->arena, "inference");
        gm_arena_init(&st->host, "inference host", GM_DEVICE_CPU);
        s = layout(st, m, GM_F32, err);
    }
    if (s == GM_OK) s = gm_arena_commit(&st->arena, err);
    if (s == GM_OK) s = gm_arena_commit(&st->host, err);
    if (s == GM_OK) s = layout(st, m, GM_F32, err); /* pass 2: hand out, upload the weights */
    st->g.kc.int8_dot = o.int8_dot; /* a CUDA backend's kernels ignore it */
    if (s == GM_OK) s = gm_backend_status(st->be, err);
    if (s != GM_OK) {
        gm_infer_free(st);
        return s;
    }
    *out = st;
    return GM_OK;
}

void gm_infer_free(gm_infer *st) {
    if (!st) return;
    gm_arena_free(&st->arena);
    gm_arena_free(&st->host);
    gm_graph_free(&st->g);
    gm_weights_free(&st->w);
    gm_backend_free(st->owned_be);
    gm_free(st);
}

bool gm_dot_from_name(const char *name, bool *int8_dot) {
    bool int8 = name && strcmp(name, "int8") == 0;
    if (!int8 && !(name && strcmp(name, "f32") == 0)) return false;
    *int8_dot = int8;
    return true;
}

void gm_infer_set_int8_dot(gm_infer *st, bool int8_dot) { st->g.kc.int8_dot = int8_dot; }

bool gm_infer_int8_dots(const gm_infer *st) {
    if (!st->g.kc.int8_dot || st->be->device != GM_DEVICE_CPU) return false;
    const gm_weights *w = &st->w;
    if (gm_int8_dot_supports(w->global[GM_GLOBAL_LM_HEAD].type)) return true;
    for (int64_t i = 0; i < w->n_layers * w->n_slots; i++)
        if (w->layer[i].rows > 0 && gm_int8_dot_supports(w->layer[i].type)) return true;
    return false;
}

void gm_infer_reset(gm_infer *st) { st->n_past = 0; }

gm_status gm_decoder_forward_input(gm_infer *st, const gm_graph_input *in_arg, bool all_logits, gm_error *err) {
    const gm_config *c = &st->model->cfg;
    gm_graph *g = &st->g;
    int64_t B = st->B, T = in_arg->T, N = B * T, C = c->hidden_size, V = c->vocab_size;
    if (T <= 0 || T > st->T_max)
        return gm_error_set(err, GM_ERR_INVALID, "forward of %lld tokens: this state was planned for 1..%lld per call",
                            (long long)T, (long long)st->T_max);
    if (st->n_past + T > st->ctx_max)
        return gm_error_set(err, GM_ERR_INVALID,
                            "forward would reach position %lld, past the planned context of %lld positions",
                            (long long)(st->n_past + T), (long long)st->ctx_max);
    if (all_logits && N > st->logit_rows)
        return gm_error_set(err, GM_ERR_INVALID, "logits for %lld positions requested, %lld planned",
                            (long long)N, (long long)st->logit_rows);
    gm_graph_input in = *in_arg;
    in.B = B;
    in.pos0 = st->n_past;
    GM_TRY(gm_graph_begin(g, &in, err));
    int64_t L = c->n_layers;
    if (st->capture_hidden) gm_backend_download(st->be, st->capture_hidden, g->X[0], (size_t)(N * C) * sizeof(float));
    for (int64_t l = 0; l < L; l++) {
        g->arch->layer_fwd(g, l);
        if (st->capture_hidden)
            gm_backend_download(st->be, st->capture_hidden + (l + 1) * N * C, g->X[l + 1], (size_t)(N * C) * sizeof(float));
    }
    /* final norm only on the rows whose logits are wanted, then the LM head */
    int64_t rows = all_logits ? N : B;
    for (int64_t r = 0; r < rows; r++) st->host_sel[r] = (int32_t)(all_logits ? r : r * T + (T - 1));
    gm_backend_upload(st->be, st->logit_sel, st->host_sel, (size_t)rows * sizeof(int32_t));
    gm_graph_hidden_rows(g, st->logit_in, st->logit_sel, rows);
    gm_graph_final_norm(g, st->logit_in, NULL, st->logit_in, rows);
    gm_graph_lm_head(g, st->logits_dev, st->logit_in, rows, 0, V);
    if (c->final_logit_softcap > 0) g->k->softcap_fwd(&g->kc, st->logits_dev, st->logits_dev, rows * V, c->final_logit_softcap);
    gm_backend_download(st->be, st->logits, st->logits_dev, (size_t)(rows * V) * sizeof(float));
    GM_TRY(gm_backend_status(st->be, err));
    st->n_logit_rows = rows;
    st->n_past += T;
    return GM_OK;
}

gm_status gm_decoder_forward(gm_infer *st, const int32_t *ids, int64_t T, bool all_logits, gm_error *err) {
    gm_graph_input in = {.B = st->B, .T = T, .ids = ids};
    return gm_decoder_forward_input(st, &in, all_logits, err);
}
