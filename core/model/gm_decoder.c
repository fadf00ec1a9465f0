/*
 * gm_decoder.c - Gemma 3 text decoder forward with KV cache; see gm_decoder.h.
 */
#include "gm_decoder.h"

#include "gm_alloc.h"

#include <math.h>
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

static int64_t max_ffn(const gm_config *c) {
    int64_t f = 0;
    for (int64_t l = 0; l < c->n_layers; l++)
        if (c->ffn_dim[l] > f) f = c->ffn_dim[l];
    return f;
}

static int64_t sliding_slots(const gm_config *c, const gm_infer_opts *o, int64_t l) {
    if (c->layer_type[l] == GM_LAYER_FULL) return o->ctx;
    int64_t s = c->sliding_window + o->max_tokens - 1;
    return s < o->ctx ? s : o->ctx;
}

/* Largest dequantization workspace over every matrix the forward multiplies by. */
static size_t scratch_floats(const gm_config *c, const gm_model *m, gm_dtype wdt, int n_threads) {
    int64_t C = c->hidden_size, QW = c->n_heads * c->head_dim, F = max_ffn(c);
    size_t s = 0, t;
#define CONSIDER(dt, N, K)                                                                   \
    t = gm_k_matmul_scratch_floats((dt), (N), (K), n_threads);                               \
    if (t > s) s = t
    if (m) {
        CONSIDER(m->lm_head.dtype, c->vocab_size, C);
        for (int64_t l = 0; l < c->n_layers; l++) {
            for (int w = 0; w < GM_LIN_COUNT; w++) {
                const gm_tensor *tw = gm_layer_linear(&m->layers[l], (gm_linear)w);
                CONSIDER(tw->dtype, tw->shape[0], tw->shape[1]);
            }
        }
    } else {
        CONSIDER(wdt, c->vocab_size, C);
        CONSIDER(wdt, QW, C);
        CONSIDER(wdt, C, QW);
        CONSIDER(wdt, F, C);
        CONSIDER(wdt, C, F);
    }
#undef CONSIDER
    return s;
}

/* The one layout function, run on a measuring arena and again on the committed one. */
static void layout(gm_infer *st, const gm_config *c, const gm_infer_opts *o, size_t scratch) {
    gm_arena *a = &st->arena;
    int64_t N = o->batch * o->max_tokens, C = c->hidden_size;
    int64_t QW = c->n_heads * c->head_dim, KW = c->n_kv_heads * c->head_dim, F = max_ffn(c);
#define F32(n, kind) (float *)gm_arena_alloc(a, (size_t)(n) * sizeof(float), kind)
    st->x = F32(N * C, GM_MEM_ACTIVATIONS);
    st->xn = F32(N * C, GM_MEM_ACTIVATIONS);
    st->tmp = F32(N * C, GM_MEM_ACTIVATIONS);
    st->q = F32(N * QW, GM_MEM_ACTIVATIONS);
    st->att = F32(N * QW, GM_MEM_ACTIVATIONS);
    st->kx = F32(N * KW, GM_MEM_ACTIVATIONS);
    st->vx = F32(N * KW, GM_MEM_ACTIVATIONS);
    st->gate = F32(N * F, GM_MEM_ACTIVATIONS);
    st->up = F32(N * F, GM_MEM_ACTIVATIONS);
    st->pos = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    st->ids = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->kv_source[l] != l) { /* shares an earlier layer's cache */
            st->k_cache[l] = st->v_cache[l] = NULL;
            st->cache_slots[l] = 0;
            continue;
        }
        int64_t S = sliding_slots(c, o, l);
        st->cache_slots[l] = S;
        st->k_cache[l] = F32(o->batch * S * KW, GM_MEM_KV_CACHE);
        st->v_cache[l] = F32(o->batch * S * KW, GM_MEM_KV_CACHE);
    }
    st->logit_in = F32(o->logit_rows * C, GM_MEM_TRANSIENT);
    st->logits = F32(o->logit_rows * c->vocab_size, GM_MEM_TRANSIENT);
    st->kctx.scratch = F32(scratch ? scratch : 1, GM_MEM_WORKSPACE);
    st->kctx.scratch_floats = scratch;
#undef F32
}

size_t gm_infer_plan_bytes(const gm_config *cfg, const gm_infer_opts *opts, gm_dtype weight_dtype,
                           size_t by_kind[GM_MEM_KIND_COUNT]) {
    gm_infer_opts o = resolve_opts(cfg, opts);
    gm_infer tmp;
    memset(&tmp, 0, sizeof tmp);
    gm_arena_init(&tmp.arena, "inference", GM_DEVICE_CPU);
    layout(&tmp, cfg, &o, scratch_floats(cfg, NULL, weight_dtype, o.n_threads));
    if (by_kind) memcpy(by_kind, tmp.arena.by_kind, sizeof tmp.arena.by_kind);
    return tmp.arena.used;
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
    st->k = &gm_kernels_cpu;
    st->kctx.n_threads = o.n_threads;
    st->B = o.batch;
    st->T_max = o.max_tokens;
    st->ctx_max = o.ctx;
    st->logit_rows = o.logit_rows;
    size_t scratch = scratch_floats(c, m, GM_F32, o.n_threads);
    gm_arena_init(&st->arena, "inference", GM_DEVICE_CPU);
    layout(st, c, &o, scratch);
    gm_status s = gm_arena_commit(&st->arena, err);
    if (s != GM_OK) {
        gm_free(st);
        return s;
    }
    layout(st, c, &o, scratch);
    *out = st;
    return GM_OK;
}

void gm_infer_free(gm_infer *st) {
    if (!st) return;
    gm_arena_free(&st->arena);
    gm_free(st);
}

void gm_infer_reset(gm_infer *st) { st->n_past = 0; }

/* out (N, n) = x (N, K) . W^T for a weight view. */
static void linear(gm_infer *st, float *out, const float *x, const gm_wview *w, int64_t N, float beta) {
    st->k->matmul_fwd(&st->kctx, out, x, w, N, beta);
}

static void capture(gm_infer *st, int64_t layer_index, int64_t N) {
    if (!st->capture_hidden) return;
    int64_t C = st->model->cfg.hidden_size;
    memcpy(st->capture_hidden + layer_index * N * C, st->x, (size_t)(N * C) * sizeof(float));
}

/* Attention sub-block of layer l: st->x (N, C) -> st->tmp (N, C), before the post-norm. */
static void attention_block(gm_infer *st, int64_t l, int64_t T) {
    const gm_config *c = &st->model->cfg;
    const gm_layer_weights *lw = &st->model->layers[l];
    const gm_wview *lin = st->model->views->lin[l];
    const gm_kctx *kc = &st->kctx;
    int64_t B = st->B, N = B * T, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    int64_t src = c->kv_source[l];

    st->k->rmsnorm_fwd(kc, st->xn, NULL, st->x, (const float *)lw->attn_norm.data, N, C, c->rms_norm_eps);
    linear(st, st->q, st->xn, &lin[GM_LIN_Q], N, 0.0f);
    st->k->rmsnorm_fwd(kc, st->q, NULL, st->q, (const float *)lw->q_norm.data, N * H, D, c->rms_norm_eps);
    st->k->rope_fwd(kc, st->q, st->q, st->pos, N, H, D, c->rope_theta[l], c->rope_pos_scale[l]);
    if (src == l) {
        linear(st, st->kx, st->xn, &lin[GM_LIN_K], N, 0.0f);
        linear(st, st->vx, st->xn, &lin[GM_LIN_V], N, 0.0f);
        st->k->rmsnorm_fwd(kc, st->kx, NULL, st->kx, (const float *)lw->k_norm.data, N * KVH, D, c->rms_norm_eps);
        st->k->rope_fwd(kc, st->kx, st->kx, st->pos, N, KVH, D, c->rope_theta[l], c->rope_pos_scale[l]);
        /* append to the cache: position p of sequence b goes to slot p % S */
        int64_t S = st->cache_slots[l], KW = KVH * D;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t t = 0; t < T; t++) {
                int64_t slot = (st->n_past + t) % S;
                memcpy(st->k_cache[l] + (b * S + slot) * KW, st->kx + (b * T + t) * KW, (size_t)KW * sizeof(float));
                memcpy(st->v_cache[l] + (b * S + slot) * KW, st->vx + (b * T + t) * KW, (size_t)KW * sizeof(float));
            }
        }
    }
    int64_t window = c->layer_type[l] == GM_LAYER_SLIDING ? c->sliding_window : 0;
    float scale = 1.0f / sqrtf(c->query_pre_attn_scalar);
    st->k->attention_fwd(kc, st->att, st->q, st->k_cache[src], st->v_cache[src], B, T, H, KVH, D,
                         st->cache_slots[src], st->n_past, window, scale);
    linear(st, st->tmp, st->att, &lin[GM_LIN_O], N, 0.0f);
}

/* MLP sub-block: st->x (N, C) -> st->tmp (N, C), before the post-norm. */
static void mlp_block(gm_infer *st, int64_t l, int64_t N) {
    const gm_config *c = &st->model->cfg;
    const gm_layer_weights *lw = &st->model->layers[l];
    const gm_wview *lin = st->model->views->lin[l];
    const gm_kctx *kc = &st->kctx;
    int64_t C = c->hidden_size, F = c->ffn_dim[l];
    st->k->rmsnorm_fwd(kc, st->xn, NULL, st->x, (const float *)lw->ffn_norm.data, N, C, c->rms_norm_eps);
    linear(st, st->gate, st->xn, &lin[GM_LIN_GATE], N, 0.0f);
    linear(st, st->up, st->xn, &lin[GM_LIN_UP], N, 0.0f);
    st->k->geglu_fwd(kc, st->gate, st->gate, st->up, N * F);
    linear(st, st->tmp, st->gate, &lin[GM_LIN_DOWN], N, 0.0f);
}

gm_status gm_decoder_forward(gm_infer *st, const int32_t *ids, int64_t T, bool all_logits, gm_error *err) {
    const gm_model *m = st->model;
    const gm_config *c = &m->cfg;
    const gm_kctx *kc = &st->kctx;
    int64_t B = st->B, N = B * T, C = c->hidden_size, V = c->vocab_size;
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
    for (int64_t i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return gm_error_set(err, GM_ERR_INVALID, "token id %d at index %lld is outside the vocabulary (0..%lld)",
                                ids[i], (long long)i, (long long)(V - 1));
    memcpy(st->ids, ids, (size_t)N * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) st->pos[b * T + t] = (int32_t)(st->n_past + t);

    st->k->embed_fwd(kc, st->x, st->ids, &m->views->embed, N, gm_model_embed_scale(m));
    capture(st, 0, N);
    for (int64_t l = 0; l < c->n_layers; l++) {
        const gm_layer_weights *lw = &m->layers[l];
        attention_block(st, l, T);
        st->k->rmsnorm_fwd(kc, st->tmp, NULL, st->tmp, (const float *)lw->post_attn_norm.data, N, C, c->rms_norm_eps);
        st->k->add_fwd(kc, st->x, st->tmp, N * C);
        mlp_block(st, l, N);
        st->k->rmsnorm_fwd(kc, st->tmp, NULL, st->tmp, (const float *)lw->post_ffw_norm.data, N, C, c->rms_norm_eps);
        st->k->add_fwd(kc, st->x, st->tmp, N * C);
        capture(st, l + 1, N);
    }
    /* Final norm only on the rows whose logits are wanted, then the tied LM head. */
    int64_t rows = all_logits ? N : B;
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = all_logits ? r : r * T + (T - 1);
        memcpy(st->logit_in + r * C, st->x + src * C, (size_t)C * sizeof(float));
    }
    st->k->rmsnorm_fwd(kc, st->logit_in, NULL, st->logit_in, (const float *)m->final_norm.data, rows, C, c->rms_norm_eps);
    linear(st, st->logits, st->logit_in, &m->views->lm_head, rows, 0.0f);
    if (c->final_logit_softcap > 0)
        st->k->softcap_fwd(kc, st->logits, st->logits, rows * V, c->final_logit_softcap);
    st->n_logit_rows = rows;
    st->n_past += T;
    return GM_OK;
}
