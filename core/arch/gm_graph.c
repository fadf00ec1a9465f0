/*
 * gm_graph.c - buffers and shared calls of the one forward / backward (see gm_graph.h).
 *
 * Layout order (both passes walk it identically): block inputs X[0..L] (training) or one
 * residual buffer (inference), the records (the arch's activation spec, then one LoRA
 * intermediate per adapted slot), ids and positions, the backward workspace (training), the
 * LoRA temporaries, the KV caches (inference), the kernel scratch. Widths come from the spec per
 * layer; a record shared by several layers (checkpointing, inference) takes the widest.
 */
#include "gm_graph.h"

#include "gm_alloc.h"
#include "gm_rng.h"

#include <math.h>
#include <string.h>

/* ---- create ------------------------------------------------------------------------------- */

static int64_t sliding_slots(const gm_config *c, const gm_graph_opts *o, int64_t l) {
    if (c->layer_type[l] == GM_LAYER_FULL) return o->ctx;
    /* a ring buffer big enough for every query of a chunk to see its whole window */
    int64_t s = c->sliding_window + o->max_tokens - 1;
    return s < o->ctx ? s : o->ctx;
}

static size_t scratch_floats(const gm_graph *g) {
    const gm_config *c = g->cfg;
    int nt = g->o.n_threads > 0 ? g->o.n_threads : 2;
    size_t s = gm_weights_scratch_floats(g->w, g->o.lm_rows, nt);
    if ((g->o.mode == GM_GRAPH_TRAIN || g->arch->encoder) && !g->arch->own_attention) {
        for (int64_t l = 0; l < c->n_layers; l++) {
            size_t t = gm_k_attention_scratch_floats(g->o.batch, g->o.max_tokens, c->n_heads,
                                                     gm_dim_value(c, l, GM_DIM_D, 0), nt);
            if (t > s) s = t;
        }
    }
    return s;
}

gm_status gm_graph_init(gm_graph *g, const gm_config *cfg, const gm_weights *w, const gm_lora *lora, gm_backend *be,
                        const gm_graph_opts *o, gm_error *err) {
    memset(g, 0, sizeof *g);
    g->arch = gm_arch_get(cfg->arch);
    if (!g->arch)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s models have no forward in gemmarun yet (presets and memory plans only)",
                            gm_arch_name(cfg->arch));
    if (o->batch < 1 || o->max_tokens < 1 || (o->mode == GM_GRAPH_INFER && o->ctx < o->max_tokens))
        return gm_error_set(err, GM_ERR_INVALID, "graph sizes: batch %lld, tokens %lld, context %lld", (long long)o->batch,
                            (long long)o->max_tokens, (long long)o->ctx);
    g->cfg = cfg;
    g->w = w;
    g->lora = lora && lora->n > 0 ? lora : NULL;
    g->be = be;
    g->k = be ? be->k : NULL;
    g->o = *o;
    if (g->o.lm_rows < 1) g->o.lm_rows = 1;
    g->n_rec = o->mode == GM_GRAPH_TRAIN && !o->checkpointing ? cfg->n_layers : 1;
    g->rec = gm_calloc((size_t)(g->n_rec * g->arch->n_acts), sizeof *g->rec);
    g->lora_u = gm_calloc((size_t)(g->n_rec * g->arch->n_layer), sizeof *g->lora_u);
    g->grad = gm_calloc((size_t)(g->arch->n_grads > 0 ? g->arch->n_grads : 1), sizeof *g->grad);
    g->mrec = gm_calloc((size_t)(g->arch->n_model_acts > 0 ? g->arch->n_model_acts : 1), sizeof *g->mrec);
    if (!g->rec || !g->lora_u || !g->grad || !g->mrec) {
        gm_graph_free(g);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    return GM_OK;
}

void gm_graph_free(gm_graph *g) {
    if (!g) return;
    gm_free(g->rec);
    gm_free(g->lora_u);
    gm_free(g->grad);
    gm_free(g->mrec);
    g->rec = g->lora_u = g->grad = g->mrec = NULL;
}

/* ---- layout ------------------------------------------------------------------------------- */

/* Width of activation `s` in a record used by layers [l0, l1): the widest among them (0 when no
 * layer has it, or it is training-only at inference). */
static int64_t record_width(const gm_graph *g, const gm_act_spec *s, int64_t l0, int64_t l1) {
    if (s->use == GM_ACT_TRAIN && g->o.mode != GM_GRAPH_TRAIN) return 0;
    int64_t w = 0;
    if (l0 < 0) { /* a model-level activation */
        gm_weight_spec cond = {.when = s->when};
        return gm_weight_present(&cond, g->cfg, -1) ? gm_dim_value(g->cfg, -1, s->width, g->o.rank) : 0;
    }
    for (int64_t l = l0; l < l1; l++) {
        gm_weight_spec cond = {.when = s->when};
        if (!gm_weight_present(&cond, g->cfg, l)) continue;
        int64_t v = gm_dim_value(g->cfg, l, s->width, g->o.rank);
        if (v > w) w = v;
    }
    return w;
}

void gm_graph_layout(gm_graph *g, gm_arena *a, gm_arena *host) {
    const gm_config *c = g->cfg;
    const gm_arch_def *ar = g->arch;
    bool train = g->o.mode == GM_GRAPH_TRAIN;
    int64_t L = c->n_layers, N = g->o.batch * g->o.max_tokens, C = c->hidden_size, r = g->o.rank;
    int64_t RW = GM_GRAPH_RW(g);
#define F32(n, kind) (float *)gm_arena_alloc(a, (size_t)(n) * sizeof(float), kind)
    /* the residual stream: every block input kept for the backward, or one buffer in place */
    if (train) {
        for (int64_t l = 0; l <= L; l++) g->X[l] = F32(N * RW, GM_MEM_ACTIVATIONS);
    } else {
        float *x = F32(N * RW, GM_MEM_ACTIVATIONS);
        for (int64_t l = 0; l <= L; l++) g->X[l] = x;
    }
    /* the model-level activations and the head's output (one set: both modes) */
    for (int s = 0; s < ar->n_model_acts; s++) {
        int64_t w = record_width(g, &ar->model_acts[s], -1, 0);
        g->mrec[s] = w > 0 ? F32(N * w, GM_MEM_ACTIVATIONS) : NULL;
    }
    g->head_out = ar->head ? F32(N * C, GM_MEM_ACTIVATIONS) : NULL;
    bool ple = ar->front && c->ple_dim > 0;
    g->ple_ids = ple ? (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS) : NULL;
    g->ple_sel = ple ? (int32_t *)gm_arena_alloc(a, (size_t)(N * L) * sizeof(int32_t), GM_MEM_ACTIVATIONS) : NULL;
    /* the records */
    for (int64_t i = 0; i < g->n_rec; i++) {
        int64_t l0 = g->n_rec == 1 ? 0 : i, l1 = g->n_rec == 1 ? L : i + 1;
        float **rec = g->rec + i * ar->n_acts;
        for (int s = 0; s < ar->n_acts; s++) {
            int64_t w = record_width(g, &ar->acts[s], l0, l1);
            rec[s] = w > 0 ? F32(N * w, GM_MEM_ACTIVATIONS) : NULL;
        }
        for (int s = 0; s < ar->n_layer; s++)
            g->lora_u[i * ar->n_layer + s] = g->lora && g->lora->slot_used[s] ? F32(N * r, GM_MEM_ACTIVATIONS) : NULL;
    }
    g->ids = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    g->pos = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    g->kv_end = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    /* the backward's workspace, one layer at a time */
    if (train) {
        g->g = F32(N * RW, GM_MEM_WORKSPACE);
        for (int s = 0; s < ar->n_grads; s++) {
            int64_t w = record_width(g, &ar->grads[s], 0, L);
            g->grad[s] = w > 0 ? F32(N * w, GM_MEM_WORKSPACE) : NULL;
        }
    }
    if (g->lora && train) { /* inference needs none: no dropout, no backward */
        g->lora_dv = F32(N * r, GM_MEM_WORKSPACE);
        g->lora_x = F32(N * g->lora->in_max, GM_MEM_WORKSPACE);
        g->lora_t = F32(N * g->lora->in_max, GM_MEM_WORKSPACE);
    }
    /* KV caches (inference): one per layer that computes its own keys and values */
    if (!train && !ar->encoder) { /* an encoder sees whole sequences: no cache */
        for (int64_t l = 0; l < L; l++) {
            g->k_cache[l] = g->v_cache[l] = NULL;
            g->cache_slots[l] = 0;
            if (c->kv_source[l] != l) continue;
            int64_t S = sliding_slots(c, &g->o, l), KW = gm_dim_value(c, l, GM_DIM_KW, 0);
            g->cache_slots[l] = S;
            g->k_cache[l] = F32(g->o.batch * S * KW, GM_MEM_KV_CACHE);
            g->v_cache[l] = F32(g->o.batch * S * KW, GM_MEM_KV_CACHE);
        }
    }
    /* the weights are laid out (types known) before the graph in every pass */
    g->scratch_floats = scratch_floats(g);
    g->scratch = F32(g->scratch_floats ? g->scratch_floats : 1, GM_MEM_TRANSIENT);
#undef F32
    g->host_ids = (int32_t *)gm_arena_alloc(host, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    g->host_pos = (int32_t *)gm_arena_alloc(host, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    g->host_kv_end = (int32_t *)gm_arena_alloc(host, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    g->host_ple_ids = ple ? (int32_t *)gm_arena_alloc(host, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE) : NULL;
    g->host_ple_sel = ple ? (int32_t *)gm_arena_alloc(host, (size_t)(N * L) * sizeof(int32_t), GM_MEM_WORKSPACE) : NULL;
    int64_t E = c->n_experts, K = c->experts_top_k;
    g->host_moe = E > 0 ? (int32_t *)gm_arena_alloc(host, (size_t)(3 * N * K) * sizeof(int32_t), GM_MEM_WORKSPACE) : NULL;
    g->moe_off = E > 0 ? (int64_t *)gm_arena_alloc(host, (size_t)(L * (E + 1)) * sizeof(int64_t), GM_MEM_WORKSPACE) : NULL;
    g->moe_load = E > 0 ? (int64_t *)gm_arena_alloc(host, (size_t)(L * E) * sizeof(int64_t), GM_MEM_WORKSPACE) : NULL;
    if (g->moe_load && host->committed) memset(g->moe_load, 0, (size_t)(L * E) * sizeof(int64_t));
    if (g->be) g->kc = gm_backend_kctx(g->be, g->scratch, g->scratch_floats);
}

float **gm_graph_record(const gm_graph *g, int64_t l) { return g->rec + (g->n_rec == 1 ? 0 : l) * g->arch->n_acts; }

static float *lora_u(const gm_graph *g, int64_t l, int slot) {
    return g->lora_u[(g->n_rec == 1 ? 0 : l) * g->arch->n_layer + slot];
}

const gm_wview *gm_graph_weight(const gm_graph *g, int64_t l, int slot) { return gm_weights_at(g->w, l, slot); }

const float *gm_graph_norm(const gm_graph *g, int64_t l, int slot) {
    return (const float *)gm_weights_at(g->w, l, slot)->data;
}

/* ---- forward ------------------------------------------------------------------------------ */

gm_status gm_graph_begin(gm_graph *g, const gm_graph_input *in, gm_error *err) {
    const gm_config *c = g->cfg;
    int64_t B = in->B, T = in->T, N = B * T, V = c->vocab_size;
    if (B < 1 || B > g->o.batch || T < 1 || T > g->o.max_tokens)
        return gm_error_set(err, GM_ERR_INVALID, "input of %lld x %lld tokens does not fit the plan (batch %lld, %lld tokens)",
                            (long long)B, (long long)T, (long long)g->o.batch, (long long)g->o.max_tokens);
    if (g->o.mode == GM_GRAPH_INFER && (B != g->o.batch || in->pos0 < 0 || in->pos0 + T > g->o.ctx))
        return gm_error_set(err, GM_ERR_INVALID,
                            "forward would reach position %lld, past the planned context of %lld positions",
                            (long long)(in->pos0 + T), (long long)g->o.ctx);
    for (int64_t i = 0; i < in->n_embeds; i++)
        if (in->embed_rows[i] < 0 || in->embed_rows[i] >= N)
            return gm_error_set(err, GM_ERR_INVALID, "soft token %lld is placed at row %lld, outside the input (%lld rows)",
                                (long long)i, (long long)in->embed_rows[i], (long long)N);
    for (int64_t i = 0; i < in->n_ptr_embeds; i++)
        if (in->ptr_rows[i] < 0 || in->ptr_rows[i] >= N)
            return gm_error_set(err, GM_ERR_INVALID, "multimodal token %lld is placed at row %lld, outside the input (%lld rows)",
                                (long long)i, (long long)in->ptr_rows[i], (long long)N);
    if (in->n_dev_embeds < 0 || in->n_dev_embeds > N)
        return gm_error_set(err, GM_ERR_INVALID, "%lld soft tokens for an input of %lld rows", (long long)in->n_dev_embeds,
                            (long long)N);
    for (int64_t i = 0; i < N; i++) {
        g->host_ids[i] = in->ids[i];
        g->host_pos[i] = (int32_t)(in->pos0 + i % T);
    }
    /* a soft token's own id is never embedded (an image token may lie outside a text-only
     * vocabulary): row 0 stands in, then the soft token replaces it, as Hugging Face does */
    for (int64_t i = 0; i < in->n_embeds; i++) g->host_ids[in->embed_rows[i]] = 0;
    for (int64_t i = 0; i < N; i++)
        if (g->host_ids[i] < 0 || g->host_ids[i] >= V)
            return gm_error_set(err, GM_ERR_INVALID, "token id %d at index %lld is outside the vocabulary (0..%lld)",
                                in->ids[i], (long long)i, (long long)(V - 1));
    g->B = B, g->T = T, g->N = N, g->pos0 = in->pos0;
    gm_backend_upload(g->be, g->ids, g->host_ids, (size_t)N * sizeof(int32_t));
    gm_backend_upload(g->be, g->pos, g->host_pos, (size_t)N * sizeof(int32_t));
    g->has_kv_end = in->kv_end != NULL;
    if (g->has_kv_end) {
        memcpy(g->host_kv_end, in->kv_end, (size_t)N * sizeof(int32_t));
        gm_backend_upload(g->be, g->kv_end, g->host_kv_end, (size_t)N * sizeof(int32_t));
    }
    if (g->ple_ids) {
        /* the per-layer table's row comes from the token's own id, soft-token placeholders' too
         * (get_per_layer_inputs runs on the input ids before any merge): ids past the table (every
         * multimodal id of the published models) take row 0 */
        for (int64_t i = 0; i < N; i++) g->host_ple_ids[i] = in->ids[i] >= 0 && in->ids[i] < c->ple_vocab ? in->ids[i] : 0;
        /* Gemma 4 (Gemma4Model.forward) puts the pad id in the media tokens' place first: its image
         * and audio ids lie inside the table */
        if (c->arch == GM_ARCH_GEMMA4)
            for (int64_t i = 0; i < N; i++)
                if ((c->vision.hidden_size > 0 && in->ids[i] == c->vision.image_token_id) ||
                    (c->audio.hidden_size > 0 && in->ids[i] == c->audio.audio_token_id))
                    g->host_ple_ids[i] = c->pad_id;
        gm_backend_upload(g->be, g->ple_ids, g->host_ple_ids, (size_t)N * sizeof(int32_t));
        int64_t L = c->n_layers;
        for (int64_t l = 0; l < L; l++)
            for (int64_t n = 0; n < N; n++) g->host_ple_sel[l * N + n] = (int32_t)(n * L + l);
        gm_backend_upload(g->be, g->ple_sel, g->host_ple_sel, (size_t)(N * L) * sizeof(int32_t));
    }
    g->k->embed_fwd(&g->kc, g->X[0], g->ids, &g->w->global[GM_GLOBAL_EMBED], N, g->arch->embed_scale(c));
    int64_t C = c->hidden_size;
    for (int64_t i = 0; i < in->n_embeds; i++)
        gm_backend_upload(g->be, g->X[0] + in->embed_rows[i] * C, in->embeds + i * C, (size_t)C * sizeof(float));
    for (int64_t i = 0; i < in->n_ptr_embeds; i++)
        gm_backend_upload(g->be, g->X[0] + in->ptr_rows[i] * C, in->ptr_embeds[i], (size_t)C * sizeof(float));
    if (in->n_dev_embeds > 0) g->k->scatter_rows(&g->kc, g->X[0], in->dev_embeds, in->dev_rows, in->n_dev_embeds, C);
    if (!in->late_rows) gm_graph_front(g);
    return GM_OK;
}

void gm_graph_front(gm_graph *g) {
    if (g->arch->front) g->arch->front(g);
}

gm_status gm_graph_begin_encoder(gm_graph *g, int64_t B, int64_t T, gm_error *err) {
    return gm_graph_begin_encoder_lens(g, B, T, NULL, err);
}

gm_status gm_graph_begin_encoder_lens(gm_graph *g, int64_t B, int64_t T, const int64_t *lens, gm_error *err) {
    if (!g->arch->encoder || B < 1 || B > g->o.batch || T < 1 || T > g->o.max_tokens)
        return gm_error_set(err, GM_ERR_INVALID, "encoder input of %lld x %lld positions does not fit the plan (batch %lld, "
                            "%lld positions)", (long long)B, (long long)T, (long long)g->o.batch, (long long)g->o.max_tokens);
    for (int64_t b = 0; lens && b < B; b++)
        if (lens[b] < 1 || lens[b] > T)
            return gm_error_set(err, GM_ERR_INVALID, "encoder item %lld of %lld positions in a call of %lld", (long long)b,
                                (long long)lens[b], (long long)T);
    int64_t N = B * T;
    g->B = B, g->T = T, g->N = N, g->pos0 = 0;
    for (int64_t i = 0; i < N; i++) {
        g->host_pos[i] = (int32_t)(i % T);
        g->host_kv_end[i] = (int32_t)(lens ? lens[i / T] : T); /* every key of the item visible */
    }
    g->has_kv_end = true;
    gm_backend_upload(g->be, g->pos, g->host_pos, (size_t)N * sizeof(int32_t));
    gm_backend_upload(g->be, g->kv_end, g->host_kv_end, (size_t)N * sizeof(int32_t));
    return GM_OK;
}

void gm_graph_forward(gm_graph *g) {
    for (int64_t l = 0; l < g->cfg->n_layers; l++) g->arch->layer_fwd(g, l);
}

void gm_graph_hidden_rows(gm_graph *g, float *out, const int32_t *rows, int64_t R) {
    const float *x = g->X[g->cfg->n_layers];
    if (g->arch->head) {
        g->arch->head(g, g->head_out);
        x = g->head_out;
    }
    g->k->gather_rows(&g->kc, out, x, rows, R, g->cfg->hidden_size);
}

/* ---- backward ----------------------------------------------------------------------------- */

void gm_graph_backward(gm_graph *g) {
    for (int64_t l = g->cfg->n_layers - 1; l >= 0; l--) {
        if (g->o.checkpointing) { /* recompute this layer's record */
            g->recomputing = true;
            g->arch->layer_fwd(g, l);
            g->recomputing = false;
        }
        g->arch->layer_bwd(g, l);
    }
    if (g->front_grad && g->arch->front_bwd) g->arch->front_bwd(g);
}

/* ---- mixture of experts ------------------------------------------------------------------- */

void gm_graph_moe_group(gm_graph *g, int64_t l, const int32_t *idx, int32_t *slot, int32_t *sel) {
    const gm_config *c = g->cfg;
    int64_t N = g->N, E = c->n_experts, K = c->experts_top_k, NK = N * K;
    int32_t *hi = g->host_moe, *hs = hi + NK, *hn = hs + NK;
    int64_t *off = g->moe_off + l * (E + 1);
    gm_backend_download(g->be, hi, idx, (size_t)NK * sizeof(int32_t));
    for (int64_t e = 0; e <= E; e++) off[e] = 0;
    for (int64_t i = 0; i < NK; i++) off[hi[i] + 1]++;
    if (g->o.mode == GM_GRAPH_TRAIN && !g->recomputing)
        for (int64_t e = 0; e < E; e++) g->moe_load[l * E + e] += off[e + 1];
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
    /* tokens in order within an expert: a stable counting sort */
    for (int64_t i = 0; i < NK; i++) {
        int64_t s = off[hi[i]]++;
        hs[i] = (int32_t)s;
        hn[s] = (int32_t)(i / K);
    }
    for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];
    off[0] = 0;
    gm_backend_upload(g->be, slot, hs, (size_t)NK * sizeof(int32_t));
    gm_backend_upload(g->be, sel, hn, (size_t)NK * sizeof(int32_t));
}

/* ---- linear with adapter ------------------------------------------------------------------ */

/* Dropout key of one adapter in one micro-batch of one step: the same in the forward, in a
 * checkpointing recompute and in the backward. */
static uint64_t dropout_key(const gm_graph *g, int layer, int lora_id) {
    uint64_t stream = (g->dropout_step << 24) ^ (g->dropout_micro << 12) ^ ((uint64_t)layer << 4) ^ (uint64_t)lora_id;
    return gm_rng_seed(g->lora->cfg.seed ^ 0x6c6f7261ull, stream).key;
}

/* y += the adapter's scaling * B (A dropout(x)) for layer l's linear in `slot`, if one is attached. */
static void lora_fwd(gm_graph *g, int64_t l, int slot, float *y, const float *x) {
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N;
    gm_lora_adapter *ad = gm_lora_at(g->lora, l, slot);
    if (!ad) return;
    int64_t r = g->lora->cfg.rank;
    float *u = lora_u(g, l, slot);
    const float *xin = x;
    if (g->lora->cfg.dropout > 0 && g->dropout) {
        g->k->dropout_fwd(kc, g->lora_x, x, N * ad->in, g->lora->cfg.dropout, dropout_key(g, ad->layer, ad->lora_id));
        xin = g->lora_x;
    }
    gm_wview A = gm_wview_f32(ad->A, r, ad->in), Bv = gm_wview_f32(ad->B, ad->out, r);
    g->k->matmul_fwd(kc, u, xin, &A, N, 0.0f);
    g->k->scale_fwd(kc, u, u, N * r, g->lora->scaling);
    g->k->matmul_fwd(kc, y, u, &Bv, N, 1.0f);
}

void gm_graph_linear(gm_graph *g, int64_t l, int slot, float *y, const float *x) {
    g->k->matmul_fwd(&g->kc, y, x, gm_weights_at(g->w, l, slot), g->N, 0.0f);
    lora_fwd(g, l, slot, y, x);
}

void gm_graph_linear_multi(gm_graph *g, int64_t l, int n, const int *slots, float *const *y, const float *x) {
    const gm_wview *w[GM_MATMUL_MULTI_MAX];
    GM_ASSERT(n >= 1 && n <= GM_MATMUL_MULTI_MAX);
    for (int i = 0; i < n; i++) w[i] = gm_weights_at(g->w, l, slots[i]);
    g->k->matmul_fwd_multi(&g->kc, y, x, w, n, g->N);
    for (int i = 0; i < n; i++) lora_fwd(g, l, slots[i], y[i], x);
}

void gm_graph_linear_bwd(gm_graph *g, int64_t l, int slot, float *dx, const float *dy, const float *x, float beta) {
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N;
    g->k->matmul_bwd_input(kc, dx, dy, gm_weights_at(g->w, l, slot), N, beta);
    gm_lora_adapter *ad = gm_lora_at(g->lora, l, slot);
    if (!ad) return;
    int64_t r = g->lora->cfg.rank;
    const float *u = lora_u(g, l, slot);
    /* dB += dy^T u ; dv = scaling * dy B ; dA += dv^T dropout(x) ; dx += dropout(dv A) */
    g->k->matmul_bwd_weight(kc, ad->dB, dy, u, N, ad->out, r, 1.0f);
    gm_wview Bv = gm_wview_f32(ad->B, ad->out, r), A = gm_wview_f32(ad->A, r, ad->in);
    g->k->matmul_bwd_input(kc, g->lora_dv, dy, &Bv, N, 0.0f);
    g->k->scale_fwd(kc, g->lora_dv, g->lora_dv, N * r, g->lora->scaling);
    if (g->lora->cfg.dropout > 0) {
        uint64_t key = dropout_key(g, ad->layer, ad->lora_id);
        g->k->dropout_fwd(kc, g->lora_x, x, N * ad->in, g->lora->cfg.dropout, key);
        g->k->matmul_bwd_weight(kc, ad->dA, g->lora_dv, g->lora_x, N, r, ad->in, 1.0f);
        g->k->matmul_bwd_input(kc, g->lora_t, g->lora_dv, &A, N, 0.0f);
        g->k->dropout_fwd(kc, g->lora_t, g->lora_t, N * ad->in, g->lora->cfg.dropout, key);
        g->k->add_fwd(kc, dx, g->lora_t, N * ad->in);
    } else {
        g->k->matmul_bwd_weight(kc, ad->dA, g->lora_dv, x, N, r, ad->in, 1.0f);
        g->k->matmul_bwd_input(kc, dx, g->lora_dv, &A, N, 1.0f);
    }
}

void gm_graph_linear_clipped(gm_graph *g, int64_t l, int slot, int clip0, float *out, float *raw, float *cin,
                             const float *in, int64_t n_in, int64_t n_out) {
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N;
    g->k->clip_fwd(kc, cin, in, N * n_in, gm_graph_norm(g, l, clip0), gm_graph_norm(g, l, clip0 + 1));
    gm_graph_linear(g, l, slot, out, cin);
    if (raw) g->k->scale_fwd(kc, raw, out, N * n_out, 1.0f);
    g->k->clip_fwd(kc, out, out, N * n_out, gm_graph_norm(g, l, clip0 + 2), gm_graph_norm(g, l, clip0 + 3));
}

void gm_graph_linear_clipped_bwd(gm_graph *g, int64_t l, int slot, int clip0, float *dx, const float *dy, float *dyc,
                                 const float *raw, const float *cin, const float *in, float *tmp, int64_t n_in,
                                 int64_t n_out, float beta) {
    const gm_kctx *kc = &g->kc;
    int64_t N = g->N;
    g->k->clip_bwd(kc, dyc, dy, raw, N * n_out, gm_graph_norm(g, l, clip0 + 2), gm_graph_norm(g, l, clip0 + 3));
    gm_graph_linear_bwd(g, l, slot, tmp, dyc, cin, 0.0f);
    g->k->clip_bwd(kc, tmp, tmp, in, N * n_in, gm_graph_norm(g, l, clip0), gm_graph_norm(g, l, clip0 + 1));
    if (beta == 0.0f) g->k->scale_fwd(kc, dx, tmp, N * n_in, 1.0f);
    else g->k->add_fwd(kc, dx, tmp, N * n_in);
}

/* ---- attention ---------------------------------------------------------------------------- */

const int32_t *gm_graph_kv_end(const gm_graph *g, int64_t l) {
    if (!g->has_kv_end) return NULL;
    if (g->arch->encoder) return g->kv_end;
    const gm_config *c = g->cfg;
    switch (c->image_mask) {
    case GM_IMAGE_MASK_ALL: return g->kv_end;
    case GM_IMAGE_MASK_SLIDING: return c->layer_type[l] == GM_LAYER_SLIDING ? g->kv_end : NULL;
    default: return NULL;
    }
}

void gm_graph_attention(gm_graph *g, int64_t l, float *out, float *lse, const float *q, const float *k,
                        const float *v, float scale) {
    const gm_config *c = g->cfg;
    int64_t B = g->B, T = g->T, H = c->n_heads, KVH = gm_dim_value(c, l, GM_DIM_KVH, 0), D = gm_dim_value(c, l, GM_DIM_D, 0);
    int64_t window = c->layer_type[l] == GM_LAYER_SLIDING ? c->sliding_window : 0;
    int64_t src = c->kv_source[l];
    const int32_t *kv_end = gm_graph_kv_end(g, l);
    if (g->o.mode == GM_GRAPH_INFER && !g->arch->encoder) {
        if (src == l) {
            int64_t S = g->cache_slots[l], KW = KVH * D;
            g->k->kv_store(&g->kc, g->k_cache[l], k, B, T, S, KW, g->pos0);
            g->k->kv_store(&g->kc, g->v_cache[l], v, B, T, S, KW, g->pos0);
        }
        g->k->attention_fwd(&g->kc, out, q, g->k_cache[src], g->v_cache[src], kv_end, B, T, H, KVH, D,
                            g->cache_slots[src], g->pos0, window, scale);
        return;
    }
    g->k->attention_train_fwd(&g->kc, out, lse, q, k, v, kv_end, B, T, H, KVH, D, window, scale);
}

/* ---- head --------------------------------------------------------------------------------- */

void gm_graph_final_norm(gm_graph *g, float *out, float *rstd, const float *x, int64_t R) {
    const gm_config *c = g->cfg;
    g->k->rmsnorm_fwd(&g->kc, out, rstd, x, (const float *)g->w->global[GM_GLOBAL_FINAL_NORM].data, R, c->hidden_size,
                      c->rms_norm_eps);
}

void gm_graph_lm_head(gm_graph *g, float *out, const float *h, int64_t R, int64_t v0, int64_t Vc) {
    gm_wview Ec = gm_wview_rows(&g->w->global[GM_GLOBAL_LM_HEAD], v0, Vc);
    g->k->matmul_fwd(&g->kc, out, h, &Ec, R, 0.0f);
}
