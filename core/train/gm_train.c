/*
 * gm_train.c - the training graph: forward with saved activations, backward into LoRA
 * adapters, chunked cross-entropy, gradient accumulation, clipping, AdamW. See gm_train.h.
 *
 * Memory: one layout function (layout()) reserves every buffer in one arena; it runs on a
 * measuring arena (the plan, also used by gm_train_plan without a model), then again after the
 * single allocation. Per decoder layer the forward keeps a `layer_acts` record (shapes in the
 * struct); with activation checkpointing every layer's record points at the same memory and the
 * backward recomputes a layer's record from its saved input just before using it.
 */
#include "gm_train.h"

#include "gm_alloc.h"
#include "gm_checkpoint.h"
#include "gm_rng.h"
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* LM-head chunking: rows of supervised positions x vocabulary entries per logits chunk. */
#define LM_ROWS 512
#define LM_VOCAB 8192

/* Activations one decoder layer saves for its backward. N = B*T rows. */
typedef struct layer_acts {
    float *xn1, *rstd1;        /* (N, C), (N): input RMSNorm output and 1/rms */
    float *q_pre, *rstd_q;     /* (N, H*D), (N*H): q projection before QK-norm */
    float *k_pre, *rstd_k;     /* (N, KVH*D), (N*KVH) */
    float *q, *k, *v;          /* (N, H*D), (N, KVH*D) x2: after norm + RoPE (v: projection) */
    float *att, *lse;          /* (N, H*D), (B, H, T) */
    float *o_pre, *rstd_pa;    /* (N, C), (N): o_proj output before the post-attention norm */
    float *x_mid;              /* (N, C): residual after the attention block */
    float *xn2, *rstd2;        /* (N, C), (N) */
    float *gate, *up, *h;      /* (N, F) x3: gate/up pre-activations, gelu(gate) * up */
    float *d_pre, *rstd_pf;    /* (N, C), (N): down_proj output before the post-FFN norm */
    float *lora_u[GM_LIN_COUNT]; /* (N, r): scaling * dropout(x) A^T per adapted linear */
} layer_acts;

struct gm_trainer {
    const gm_model *m;
    gm_train_opts o;
    const gm_kernel_table *k;
    gm_kctx kctx;
    gm_arena arena;
    gm_weights_view wv;       /* base weights as trained on (requantized or as stored) */
    float scaling;            /* LoRA alpha / r (or / sqrt(r)) */
    int n_adapters;
    gm_lora_adapter *adapters;
    gm_lora_adapter *ad[GM_MAX_LAYERS][GM_LIN_COUNT]; /* NULL where not adapted */
    int64_t step;             /* optimizer steps done */
    int64_t micro;            /* micro-batch counter within the current step (dropout keys) */
    bool training;            /* dropout on (forward_backward) or off (eval) */
    /* activations */
    float *X[GM_MAX_LAYERS + 1]; /* (N, C): input of layer l; X[L] the final residual */
    layer_acts acts[GM_MAX_LAYERS];
    int32_t *ids, *pos;       /* (N) */
    /* backward workspace (one layer at a time) */
    float *g;                 /* (N, C) gradient of the residual stream */
    float *dtmp, *dxn;        /* (N, C) */
    float *dq, *dk, *dv, *datt; /* (N, H*D), (N, KVH*D) x2, (N, H*D) */
    float *dgate, *dup, *dh;  /* (N, F) */
    float *lora_dv;           /* (N, r) */
    float *lora_x, *lora_t;   /* (N, max in): dropout(x) and dv A before dropout */
    /* loss */
    int32_t *sup_rows, *sup_tgt; /* (N): supervised row indices and their targets */
    float *xs, *hs, *rstd_s, *dhs; /* (N, C), (N, C), (N), (N, C) gathered rows */
    float *logits;            /* (LM_ROWS, LM_VOCAB) */
    float *run_max, *run_sum, *tgt_logit, *lse; /* (N) */
    int64_t Fmax, Imax;       /* widest FFN, widest adapter input */
};

const char *gm_schedule_name(gm_schedule s) {
    switch (s) {
    case GM_SCHED_CONSTANT: return "constant";
    case GM_SCHED_LINEAR: return "linear";
    case GM_SCHED_COSINE: return "cosine";
    }
    return "?";
}

bool gm_schedule_from_name(const char *name, gm_schedule *out) {
    for (int s = 0; s <= GM_SCHED_COSINE; s++)
        if (strcmp(name, gm_schedule_name((gm_schedule)s)) == 0) {
            *out = (gm_schedule)s;
            return true;
        }
    return false;
}

gm_train_opts gm_train_opts_default(void) {
    gm_train_opts o;
    memset(&o, 0, sizeof o);
    o.lora = gm_lora_config_default();
    o.quant = GM_QUANT_STORED;
    o.batch = 1;
    o.max_length = 256;
    o.grad_accum = 1;
    o.lr = 2e-4f;
    o.weight_decay = 0.01f;
    o.beta1 = 0.9f;
    o.beta2 = 0.999f;
    o.eps = 1e-8f;
    o.schedule = GM_SCHED_CONSTANT;
    o.total_steps = 1;
    o.n_threads = 2;
    return o;
}

double gm_train_lr_at(const gm_train_opts *o, int64_t step) {
    double w = (double)o->warmup_steps, s = (double)step;
    if (step < o->warmup_steps) return o->lr * s / (w > 1 ? w : 1);
    double rest = (double)(o->total_steps - o->warmup_steps);
    double progress = (s - w) / (rest > 1 ? rest : 1);
    switch (o->schedule) {
    case GM_SCHED_LINEAR: return o->lr * fmax(0.0, (double)(o->total_steps - step) / (rest > 1 ? rest : 1));
    case GM_SCHED_COSINE: return o->lr * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));
    default: return o->lr;
    }
}

static int64_t max_ffn(const gm_config *c) {
    int64_t f = 0;
    for (int64_t l = 0; l < c->n_layers; l++) f = c->ffn_dim[l] > f ? c->ffn_dim[l] : f;
    return f;
}

/* ---- layout (plan, then allocate once) --------------------------------------------------- */

static size_t scratch_floats(const gm_config *c, const gm_train_opts *o, const gm_weights_view *wv, gm_dtype stored) {
    int64_t B = o->batch, T = o->max_length, H = c->n_heads, D = c->head_dim;
    size_t s = gm_k_attention_scratch_floats(B, T, H, D, o->n_threads), t;
    gm_dtype emb = wv ? wv->embed.type : stored;
    t = gm_k_matmul_scratch_floats(emb, LM_VOCAB, c->hidden_size, o->n_threads);
    if (t > s) s = t;
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int w = 0; w < GM_LIN_COUNT; w++) {
            int64_t in, out;
            gm_lora_linear_shape(c, (int)l, (gm_linear)w, &in, &out);
            gm_dtype dt = wv ? wv->lin[l][w].type : stored;
            if (!wv && o->quant == GM_QUANT_NF4) dt = GM_NF4;
            if (!wv && o->quant == GM_QUANT_BF16) dt = GM_BF16;
            if (!wv && o->quant == GM_QUANT_INT8) dt = GM_I8;
            if (!wv && o->quant == GM_QUANT_F32) dt = GM_F32;
            t = gm_k_matmul_scratch_floats(dt, out, in, o->n_threads);
            if (t > s) s = t;
        }
    return s;
}

/* Reserves (or, on a committed arena, hands out) every buffer. tr->adapters must be sized. */
static void layout(gm_trainer *tr, const gm_config *c, size_t scratch) {
    gm_arena *a = &tr->arena;
    const gm_train_opts *o = &tr->o;
    int64_t N = o->batch * o->max_length, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    int64_t QW = H * D, KW = KVH * D, F = max_ffn(c), L = c->n_layers, r = o->lora.rank;
#define F32(n, kind) (float *)gm_arena_alloc(a, (size_t)(n) * sizeof(float), kind)
    /* adapters: parameters, gradients, AdamW moments */
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        int64_t na = r * ad->in, nb = ad->out * r;
        ad->A = F32(na, GM_MEM_ADAPTERS), ad->B = F32(nb, GM_MEM_ADAPTERS);
        ad->dA = F32(na, GM_MEM_GRADS), ad->dB = F32(nb, GM_MEM_GRADS);
        ad->mA = F32(na, GM_MEM_OPTIMIZER), ad->vA = F32(na, GM_MEM_OPTIMIZER);
        ad->mB = F32(nb, GM_MEM_OPTIMIZER), ad->vB = F32(nb, GM_MEM_OPTIMIZER);
    }
    /* saved activations */
    for (int64_t l = 0; l <= L; l++) tr->X[l] = F32(N * C, GM_MEM_ACTIVATIONS);
    int64_t n_records = o->checkpointing ? 1 : L;
    for (int64_t l = 0; l < n_records; l++) {
        layer_acts *s = &tr->acts[l];
        s->xn1 = F32(N * C, GM_MEM_ACTIVATIONS), s->rstd1 = F32(N, GM_MEM_ACTIVATIONS);
        s->q_pre = F32(N * QW, GM_MEM_ACTIVATIONS), s->rstd_q = F32(N * H, GM_MEM_ACTIVATIONS);
        s->k_pre = F32(N * KW, GM_MEM_ACTIVATIONS), s->rstd_k = F32(N * KVH, GM_MEM_ACTIVATIONS);
        s->q = F32(N * QW, GM_MEM_ACTIVATIONS), s->k = F32(N * KW, GM_MEM_ACTIVATIONS);
        s->v = F32(N * KW, GM_MEM_ACTIVATIONS);
        s->att = F32(N * QW, GM_MEM_ACTIVATIONS), s->lse = F32(N * H, GM_MEM_ACTIVATIONS);
        s->o_pre = F32(N * C, GM_MEM_ACTIVATIONS), s->rstd_pa = F32(N, GM_MEM_ACTIVATIONS);
        s->x_mid = F32(N * C, GM_MEM_ACTIVATIONS);
        s->xn2 = F32(N * C, GM_MEM_ACTIVATIONS), s->rstd2 = F32(N, GM_MEM_ACTIVATIONS);
        s->gate = F32(N * F, GM_MEM_ACTIVATIONS), s->up = F32(N * F, GM_MEM_ACTIVATIONS);
        s->h = F32(N * F, GM_MEM_ACTIVATIONS);
        s->d_pre = F32(N * C, GM_MEM_ACTIVATIONS), s->rstd_pf = F32(N, GM_MEM_ACTIVATIONS);
        for (int w = 0; w < GM_LIN_COUNT; w++)
            s->lora_u[w] = (o->lora.targets & (1u << w)) ? F32(N * r, GM_MEM_ACTIVATIONS) : NULL;
    }
    for (int64_t l = n_records; l < L; l++) tr->acts[l] = tr->acts[0]; /* checkpointing: shared record */
    tr->ids = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    tr->pos = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    /* backward workspace */
    tr->g = F32(N * C, GM_MEM_WORKSPACE);
    tr->dtmp = F32(N * C, GM_MEM_WORKSPACE), tr->dxn = F32(N * C, GM_MEM_WORKSPACE);
    tr->dq = F32(N * QW, GM_MEM_WORKSPACE), tr->datt = F32(N * QW, GM_MEM_WORKSPACE);
    tr->dk = F32(N * KW, GM_MEM_WORKSPACE), tr->dv = F32(N * KW, GM_MEM_WORKSPACE);
    tr->dgate = F32(N * F, GM_MEM_WORKSPACE), tr->dup = F32(N * F, GM_MEM_WORKSPACE);
    tr->dh = F32(N * F, GM_MEM_WORKSPACE);
    tr->lora_dv = F32(N * r, GM_MEM_WORKSPACE);
    tr->lora_x = F32(N * tr->Imax, GM_MEM_WORKSPACE), tr->lora_t = F32(N * tr->Imax, GM_MEM_WORKSPACE);
    /* loss */
    tr->sup_rows = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->sup_tgt = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->xs = F32(N * C, GM_MEM_WORKSPACE), tr->hs = F32(N * C, GM_MEM_WORKSPACE);
    tr->dhs = F32(N * C, GM_MEM_WORKSPACE), tr->rstd_s = F32(N, GM_MEM_WORKSPACE);
    int64_t rows = N < LM_ROWS ? N : LM_ROWS, vc = c->vocab_size < LM_VOCAB ? c->vocab_size : LM_VOCAB;
    tr->logits = F32(rows * vc, GM_MEM_TRANSIENT);
    tr->run_max = F32(N, GM_MEM_WORKSPACE), tr->run_sum = F32(N, GM_MEM_WORKSPACE);
    tr->tgt_logit = F32(N, GM_MEM_WORKSPACE), tr->lse = F32(N, GM_MEM_WORKSPACE);
    tr->kctx.scratch = F32(scratch, GM_MEM_TRANSIENT);
    tr->kctx.scratch_floats = scratch;
#undef F32
}

static gm_status validate_opts(const gm_config *c, const gm_train_opts *o, gm_error *err) {
    GM_TRY(gm_lora_config_validate(&o->lora, c, err));
#define NEED(cond, ...)                                                                      \
    if (!(cond)) return gm_error_set(err, GM_ERR_INVALID, __VA_ARGS__)
    NEED(o->batch >= 1, "batch = %lld: must be >= 1", (long long)o->batch);
    NEED(o->max_length >= 2 && o->max_length <= c->max_position_embeddings,
         "max_length = %lld: must be in 2..%lld (the model's max_position_embeddings)", (long long)o->max_length,
         (long long)c->max_position_embeddings);
    NEED(o->grad_accum >= 1, "gradient accumulation = %lld: must be >= 1", (long long)o->grad_accum);
    NEED(o->lr >= 0 && isfinite(o->lr), "lr = %g: must be >= 0", (double)o->lr);
    NEED(o->weight_decay >= 0, "weight_decay = %g: must be >= 0", (double)o->weight_decay);
    NEED(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1, "AdamW betas must be in [0, 1)");
    NEED(o->eps > 0, "AdamW eps must be > 0");
    NEED(o->max_grad_norm >= 0, "max_grad_norm = %g: must be >= 0 (0 = no clipping)", (double)o->max_grad_norm);
    NEED(o->warmup_steps >= 0 && o->total_steps >= 1, "warmup must be >= 0 steps and total steps >= 1");
    NEED(o->n_threads >= 1, "threads must be >= 1");
#undef NEED
    for (int64_t l = 0; l < c->n_layers; l++)
        if (c->kv_source[l] != l)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "training models with KV sharing between layers (layer %lld) is not supported yet",
                                (long long)l);
    return GM_OK;
}

/* Describes the adapters the options give (shapes, names); buffers come from layout(). */
static void describe_adapters(gm_trainer *tr, const gm_config *c) {
    int i = 0;
    tr->Imax = 1;
    for (int64_t l = 0; l < c->n_layers; l++) {
        for (int w = 0; w < GM_LIN_COUNT; w++) {
            tr->ad[l][w] = NULL;
            if (!tr->o.lora.layers[l] || !(tr->o.lora.targets & (1u << w))) continue;
            gm_lora_adapter *ad = &tr->adapters[i++];
            memset(ad, 0, sizeof *ad);
            ad->layer = (int)l;
            ad->which = (gm_linear)w;
            gm_lora_linear_shape(c, (int)l, (gm_linear)w, &ad->in, &ad->out);
            gm_lora_peft_name((int)l, (gm_linear)w, 'A', ad->name_A, sizeof ad->name_A);
            gm_lora_peft_name((int)l, (gm_linear)w, 'B', ad->name_B, sizeof ad->name_B);
            if (ad->in > tr->Imax) tr->Imax = ad->in;
            tr->ad[l][w] = ad;
        }
    }
    tr->n_adapters = i;
}

size_t gm_train_plan(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, size_t by_kind[GM_MEM_KIND_COUNT]) {
    gm_trainer *tr = gm_calloc(1, sizeof *tr);
    if (!tr) return 0;
    tr->o = *o;
    int64_t n_params;
    int64_t n = gm_lora_count(&o->lora, cfg, &n_params);
    tr->adapters = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *tr->adapters);
    describe_adapters(tr, cfg);
    gm_arena_init(&tr->arena, "training", GM_DEVICE_CPU);
    gm_weights_view *wv = gm_calloc(1, sizeof *wv);
    /* base weights: nothing when the trained-on weights are the file's own (memory-mapped) */
    if (!gm_quant_is_alias(o->quant, stored)) gm_arena_alloc(&tr->arena, gm_quant_bytes(cfg, o->quant, stored), GM_MEM_WEIGHTS);
    layout(tr, cfg, scratch_floats(cfg, o, NULL, stored));
    size_t total = tr->arena.used;
    if (by_kind) memcpy(by_kind, tr->arena.by_kind, sizeof tr->arena.by_kind);
    gm_free(wv);
    gm_free(tr->adapters);
    gm_free(tr);
    return total;
}

gm_status gm_trainer_new(const gm_model *m, const gm_train_opts *o, gm_trainer **out, gm_error *err) {
    *out = NULL;
    const gm_config *c = &m->cfg;
    GM_TRY(validate_opts(c, o, err));
    gm_trainer *tr = gm_calloc(1, sizeof *tr);
    if (!tr) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    tr->m = m;
    tr->o = *o;
    tr->k = &gm_kernels_cpu;
    tr->kctx.n_threads = o->n_threads;
    tr->scaling = gm_lora_scaling(&o->lora);
    int64_t n = gm_lora_count(&o->lora, c, NULL);
    tr->adapters = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *tr->adapters);
    if (!tr->adapters) {
        gm_free(tr);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    describe_adapters(tr, c);
    /* pass 1: measure (base weights in the chosen precision, then our buffers) */
    gm_arena_init(&tr->arena, "training", GM_DEVICE_CPU);
    gm_status s = gm_quant_layout(m, o->quant, &tr->arena, &tr->wv, o->n_threads, err);
    size_t scratch = 0;
    if (s == GM_OK) {
        scratch = scratch_floats(c, o, NULL, m->views->lin[0][0].type);
        layout(tr, c, scratch);
        s = gm_arena_commit(&tr->arena, err);
    }
    /* pass 2: allocate, requantize the base weights, hand out the buffers */
    if (s == GM_OK) s = gm_quant_layout(m, o->quant, &tr->arena, &tr->wv, o->n_threads, err);
    if (s != GM_OK) {
        gm_trainer_free(tr);
        return s;
    }
    layout(tr, c, scratch);
    /* trained on a re-encoded copy: gm_quant_layout released each source tensor's mapped pages
     * as it went (the file's own linear weights are not read again) */
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        gm_lora_init_adapter(&o->lora, ad);
        size_t na = (size_t)(o->lora.rank * ad->in) * sizeof(float), nb = (size_t)(ad->out * o->lora.rank) * sizeof(float);
        memset(ad->dA, 0, na), memset(ad->mA, 0, na), memset(ad->vA, 0, na);
        memset(ad->dB, 0, nb), memset(ad->mB, 0, nb), memset(ad->vB, 0, nb);
    }
    *out = tr;
    return GM_OK;
}

void gm_trainer_free(gm_trainer *tr) {
    if (!tr) return;
    gm_arena_free(&tr->arena);
    gm_free(tr->adapters);
    gm_free(tr);
}

gm_lora_adapter *gm_trainer_adapters(gm_trainer *tr, int *n) {
    *n = tr->n_adapters;
    return tr->adapters;
}

const gm_train_opts *gm_trainer_opts(const gm_trainer *tr) { return &tr->o; }
int64_t gm_trainer_step_count(const gm_trainer *tr) { return tr->step; }
void gm_trainer_set_step(gm_trainer *tr, int64_t step) { tr->step = step; }
const gm_arena *gm_trainer_arena(const gm_trainer *tr) { return &tr->arena; }

void gm_trainer_zero_grad(gm_trainer *tr) {
    int64_t r = tr->o.lora.rank;
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        memset(ad->dA, 0, (size_t)(r * ad->in) * sizeof(float));
        memset(ad->dB, 0, (size_t)(ad->out * r) * sizeof(float));
    }
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Dropout key of one adapter in one micro-batch of one step: the same in the forward, in a
 * checkpointing recompute and in the backward. */
static uint64_t dropout_key(const gm_trainer *tr, int layer, int which) {
    uint64_t stream = ((uint64_t)tr->step << 24) ^ ((uint64_t)tr->micro << 12) ^ ((uint64_t)layer << 4) ^ (uint64_t)which;
    return gm_rng_seed(tr->o.lora.seed ^ 0x6c6f7261ull, stream).key;
}

/* y (N, out) = x W^T (+ LoRA), saving the adapter's intermediate in `u` (N, r). */
static void linear_fwd(gm_trainer *tr, float *y, const float *x, int64_t N, int layer, gm_linear which, float *u) {
    const gm_kctx *kc = &tr->kctx;
    tr->k->matmul_fwd(kc, y, x, &tr->wv.lin[layer][which], N, 0.0f);
    gm_lora_adapter *ad = tr->ad[layer][which];
    if (!ad) return;
    int64_t r = tr->o.lora.rank;
    const float *xin = x;
    if (tr->o.lora.dropout > 0 && tr->training) {
        tr->k->dropout_fwd(kc, tr->lora_x, x, N * ad->in, tr->o.lora.dropout, dropout_key(tr, layer, which));
        xin = tr->lora_x;
    }
    gm_wview A = gm_wview_f32(ad->A, r, ad->in), Bv = gm_wview_f32(ad->B, ad->out, r);
    tr->k->matmul_fwd(kc, u, xin, &A, N, 0.0f);
    tr->k->scale_fwd(kc, u, u, N * r, tr->scaling);
    tr->k->matmul_fwd(kc, y, u, &Bv, N, 1.0f);
}

/* Runs decoder layer l on X[l] -> X[l+1], filling acts[l]. */
static void layer_fwd(gm_trainer *tr, int64_t l, int64_t B, int64_t T) {
    const gm_config *c = &tr->m->cfg;
    const gm_layer_weights *lw = &tr->m->layers[l];
    const gm_kctx *kc = &tr->kctx;
    layer_acts *s = &tr->acts[l];
    int64_t N = B * T, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim, F = c->ffn_dim[l];
    float eps = c->rms_norm_eps;
    const float *x = tr->X[l];
    int il = (int)l;
    /* attention block */
    tr->k->rmsnorm_fwd(kc, s->xn1, s->rstd1, x, (const float *)lw->attn_norm.data, N, C, eps);
    linear_fwd(tr, s->q_pre, s->xn1, N, il, GM_LIN_Q, s->lora_u[GM_LIN_Q]);
    linear_fwd(tr, s->k_pre, s->xn1, N, il, GM_LIN_K, s->lora_u[GM_LIN_K]);
    linear_fwd(tr, s->v, s->xn1, N, il, GM_LIN_V, s->lora_u[GM_LIN_V]);
    tr->k->rmsnorm_fwd(kc, s->q, s->rstd_q, s->q_pre, (const float *)lw->q_norm.data, N * H, D, eps);
    tr->k->rmsnorm_fwd(kc, s->k, s->rstd_k, s->k_pre, (const float *)lw->k_norm.data, N * KVH, D, eps);
    tr->k->rope_fwd(kc, s->q, s->q, tr->pos, N, H, D, c->rope_theta[l], c->rope_pos_scale[l]);
    tr->k->rope_fwd(kc, s->k, s->k, tr->pos, N, KVH, D, c->rope_theta[l], c->rope_pos_scale[l]);
    int64_t window = c->layer_type[l] == GM_LAYER_SLIDING ? c->sliding_window : 0;
    tr->k->attention_train_fwd(kc, s->att, s->lse, s->q, s->k, s->v, B, T, H, KVH, D, window,
                               1.0f / sqrtf(c->query_pre_attn_scalar));
    linear_fwd(tr, s->o_pre, s->att, N, il, GM_LIN_O, s->lora_u[GM_LIN_O]);
    tr->k->rmsnorm_fwd(kc, s->x_mid, s->rstd_pa, s->o_pre, (const float *)lw->post_attn_norm.data, N, C, eps);
    tr->k->add_fwd(kc, s->x_mid, x, N * C);
    /* MLP block */
    tr->k->rmsnorm_fwd(kc, s->xn2, s->rstd2, s->x_mid, (const float *)lw->ffn_norm.data, N, C, eps);
    linear_fwd(tr, s->gate, s->xn2, N, il, GM_LIN_GATE, s->lora_u[GM_LIN_GATE]);
    linear_fwd(tr, s->up, s->xn2, N, il, GM_LIN_UP, s->lora_u[GM_LIN_UP]);
    tr->k->geglu_fwd(kc, s->h, s->gate, s->up, N * F);
    linear_fwd(tr, s->d_pre, s->h, N, il, GM_LIN_DOWN, s->lora_u[GM_LIN_DOWN]);
    float *xo = tr->X[l + 1];
    tr->k->rmsnorm_fwd(kc, xo, s->rstd_pf, s->d_pre, (const float *)lw->post_ffw_norm.data, N, C, eps);
    tr->k->add_fwd(kc, xo, s->x_mid, N * C);
}

/* ---- backward ----------------------------------------------------------------------------- */

/* Backward of linear_fwd: dx (N, in) = (beta ? dx : 0) + dy W (+ LoRA input gradient); the
 * adapter's dA, dB accumulate. `x` is the forward input, `u` the saved intermediate. */
static void linear_bwd(gm_trainer *tr, float *dx, const float *dy, const float *x, int64_t N, int layer,
                       gm_linear which, const float *u, float beta) {
    const gm_kctx *kc = &tr->kctx;
    tr->k->matmul_bwd_input(kc, dx, dy, &tr->wv.lin[layer][which], N, beta);
    gm_lora_adapter *ad = tr->ad[layer][which];
    if (!ad) return;
    int64_t r = tr->o.lora.rank;
    /* dB += dy^T u ; dv = scaling * dy B ; dA += dv^T dropout(x) ; dx += dropout(dv A) */
    tr->k->matmul_bwd_weight(kc, ad->dB, dy, u, N, ad->out, r, 1.0f);
    gm_wview Bv = gm_wview_f32(ad->B, ad->out, r), A = gm_wview_f32(ad->A, r, ad->in);
    tr->k->matmul_bwd_input(kc, tr->lora_dv, dy, &Bv, N, 0.0f);
    tr->k->scale_fwd(kc, tr->lora_dv, tr->lora_dv, N * r, tr->scaling);
    const float *xin = x;
    if (tr->o.lora.dropout > 0) {
        uint64_t key = dropout_key(tr, layer, which);
        tr->k->dropout_fwd(kc, tr->lora_x, x, N * ad->in, tr->o.lora.dropout, key);
        xin = tr->lora_x;
        tr->k->matmul_bwd_weight(kc, ad->dA, tr->lora_dv, xin, N, r, ad->in, 1.0f);
        tr->k->matmul_bwd_input(kc, tr->lora_t, tr->lora_dv, &A, N, 0.0f);
        tr->k->dropout_fwd(kc, tr->lora_t, tr->lora_t, N * ad->in, tr->o.lora.dropout, key);
        tr->k->add_fwd(kc, dx, tr->lora_t, N * ad->in);
    } else {
        tr->k->matmul_bwd_weight(kc, ad->dA, tr->lora_dv, xin, N, r, ad->in, 1.0f);
        tr->k->matmul_bwd_input(kc, dx, tr->lora_dv, &A, N, 1.0f);
    }
}

/* Backward of layer l: tr->g holds dL/dX[l+1] on entry and dL/dX[l] on exit. */
static void layer_bwd(gm_trainer *tr, int64_t l, int64_t B, int64_t T) {
    const gm_config *c = &tr->m->cfg;
    const gm_layer_weights *lw = &tr->m->layers[l];
    const gm_kctx *kc = &tr->kctx;
    layer_acts *s = &tr->acts[l];
    int64_t N = B * T, C = c->hidden_size, H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim, F = c->ffn_dim[l];
    int il = (int)l;
    float *g = tr->g;
    /* MLP block: X[l+1] = x_mid + post_ffw_norm(d_pre) */
    tr->k->rmsnorm_bwd(kc, tr->dtmp, NULL, g, s->d_pre, (const float *)lw->post_ffw_norm.data, s->rstd_pf, N, C, 0.0f);
    linear_bwd(tr, tr->dh, tr->dtmp, s->h, N, il, GM_LIN_DOWN, s->lora_u[GM_LIN_DOWN], 0.0f);
    tr->k->geglu_bwd(kc, tr->dgate, tr->dup, tr->dh, s->gate, s->up, N * F);
    linear_bwd(tr, tr->dxn, tr->dgate, s->xn2, N, il, GM_LIN_GATE, s->lora_u[GM_LIN_GATE], 0.0f);
    linear_bwd(tr, tr->dxn, tr->dup, s->xn2, N, il, GM_LIN_UP, s->lora_u[GM_LIN_UP], 1.0f);
    tr->k->rmsnorm_bwd(kc, g, NULL, tr->dxn, s->x_mid, (const float *)lw->ffn_norm.data, s->rstd2, N, C, 1.0f);
    /* attention block: x_mid = X[l] + post_attn_norm(o_pre) */
    tr->k->rmsnorm_bwd(kc, tr->dtmp, NULL, g, s->o_pre, (const float *)lw->post_attn_norm.data, s->rstd_pa, N, C, 0.0f);
    linear_bwd(tr, tr->datt, tr->dtmp, s->att, N, il, GM_LIN_O, s->lora_u[GM_LIN_O], 0.0f);
    int64_t window = c->layer_type[l] == GM_LAYER_SLIDING ? c->sliding_window : 0;
    tr->k->attention_bwd(kc, tr->dq, tr->dk, tr->dv, tr->datt, s->q, s->k, s->v, s->att, s->lse, B, T, H, KVH, D,
                         window, 1.0f / sqrtf(c->query_pre_attn_scalar));
    tr->k->rope_bwd(kc, tr->dq, tr->dq, tr->pos, N, H, D, c->rope_theta[l], c->rope_pos_scale[l]);
    tr->k->rope_bwd(kc, tr->dk, tr->dk, tr->pos, N, KVH, D, c->rope_theta[l], c->rope_pos_scale[l]);
    /* QK-norm backward in place: dq_pre = rmsnorm_bwd(dq_normed) */
    tr->k->rmsnorm_bwd(kc, tr->dq, NULL, tr->dq, s->q_pre, (const float *)lw->q_norm.data, s->rstd_q, N * H, D, 0.0f);
    tr->k->rmsnorm_bwd(kc, tr->dk, NULL, tr->dk, s->k_pre, (const float *)lw->k_norm.data, s->rstd_k, N * KVH, D, 0.0f);
    linear_bwd(tr, tr->dxn, tr->dq, s->xn1, N, il, GM_LIN_Q, s->lora_u[GM_LIN_Q], 0.0f);
    linear_bwd(tr, tr->dxn, tr->dk, s->xn1, N, il, GM_LIN_K, s->lora_u[GM_LIN_K], 1.0f);
    linear_bwd(tr, tr->dxn, tr->dv, s->xn1, N, il, GM_LIN_V, s->lora_u[GM_LIN_V], 1.0f);
    tr->k->rmsnorm_bwd(kc, g, NULL, tr->dxn, tr->X[l], (const float *)lw->attn_norm.data, s->rstd1, N, C, 1.0f);
}

/* ---- loss --------------------------------------------------------------------------------- */

/* Chunked cross-entropy of the final residual X[L] at the supervised rows. Returns the sum of
 * token losses; with want_grad, writes grad_scale * dL/dX[L] into tr->g (zero on other rows). */
static double lm_loss(gm_trainer *tr, int64_t N, int64_t n_sup, bool want_grad, float grad_scale, double *row_loss) {
    const gm_config *c = &tr->m->cfg;
    const gm_kctx *kc = &tr->kctx;
    int64_t C = c->hidden_size, V = c->vocab_size;
    const gm_wview *E = &tr->wv.lm_head;
    float cap = c->final_logit_softcap;
    for (int64_t i = 0; i < n_sup; i++) memcpy(tr->xs + i * C, tr->X[c->n_layers] + (int64_t)tr->sup_rows[i] * C, (size_t)C * 4);
    tr->k->rmsnorm_fwd(kc, tr->hs, tr->rstd_s, tr->xs, (const float *)tr->m->final_norm.data, n_sup, C, c->rms_norm_eps);
    double total = 0;
    for (int64_t r0 = 0; r0 < n_sup; r0 += LM_ROWS) {
        int64_t R = n_sup - r0 < LM_ROWS ? n_sup - r0 : LM_ROWS;
        const int32_t *tg = tr->sup_tgt + r0;
        for (int64_t i = 0; i < R; i++) tr->run_max[i] = -INFINITY, tr->run_sum[i] = 0;
        for (int64_t v0 = 0; v0 < V; v0 += LM_VOCAB) { /* pass 1: log-sum-exp */
            int64_t vc = V - v0 < LM_VOCAB ? V - v0 : LM_VOCAB;
            gm_wview Ec = *E;
            Ec.data = (const uint8_t *)E->data + (size_t)v0 * E->row_bytes;
            Ec.rows = vc;
            tr->k->matmul_fwd(kc, tr->logits, tr->hs + r0 * C, &Ec, R, 0.0f);
            tr->k->xent_lse_update(kc, tr->run_max, tr->run_sum, tr->tgt_logit, tr->logits, tg, R, vc, v0, cap);
        }
        for (int64_t i = 0; i < R; i++) {
            tr->lse[i] = tr->run_max[i] + logf(tr->run_sum[i]);
            double li = (double)tr->lse[i] - (double)tr->tgt_logit[i];
            total += li;
            if (row_loss) row_loss[r0 + i] = li;
        }
        if (!want_grad) continue;
        for (int64_t v0 = 0; v0 < V; v0 += LM_VOCAB) { /* pass 2: gradient, dh += dlogits E */
            int64_t vc = V - v0 < LM_VOCAB ? V - v0 : LM_VOCAB;
            gm_wview Ec = *E;
            Ec.data = (const uint8_t *)E->data + (size_t)v0 * E->row_bytes;
            Ec.rows = vc;
            tr->k->matmul_fwd(kc, tr->logits, tr->hs + r0 * C, &Ec, R, 0.0f);
            tr->k->xent_grad(kc, tr->logits, tr->lse, tg, R, vc, v0, cap, grad_scale);
            tr->k->matmul_bwd_input(kc, tr->dhs + r0 * C, tr->logits, &Ec, R, v0 == 0 ? 0.0f : 1.0f);
        }
    }
    if (want_grad) {
        /* final norm backward on the gathered rows, scattered into g (zero elsewhere) */
        tr->k->rmsnorm_bwd(kc, tr->dxn, NULL, tr->dhs, tr->xs, (const float *)tr->m->final_norm.data, tr->rstd_s, n_sup, C, 0.0f);
        memset(tr->g, 0, (size_t)(N * C) * sizeof(float));
        for (int64_t i = 0; i < n_sup; i++) memcpy(tr->g + (int64_t)tr->sup_rows[i] * C, tr->dxn + i * C, (size_t)C * 4);
    }
    return total;
}

/* ---- steps -------------------------------------------------------------------------------- */

static gm_status check_batch(const gm_trainer *tr, const gm_batch *b, int64_t *n_sup, gm_error *err) {
    const gm_config *c = &tr->m->cfg;
    if (b->B < 1 || b->B > tr->o.batch || b->T < 1 || b->T > tr->o.max_length)
        return gm_error_set(err, GM_ERR_INVALID, "batch of %lld x %lld tokens does not fit the plan (batch %lld, max_length %lld)",
                            (long long)b->B, (long long)b->T, (long long)tr->o.batch, (long long)tr->o.max_length);
    *n_sup = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t here = 0;
        for (int64_t t = 0; t < b->T; t++) {
            int32_t id = b->ids[s * b->T + t], tg = b->targets[s * b->T + t];
            if (id < 0 || id >= c->vocab_size || tg >= c->vocab_size)
                return gm_error_set(err, GM_ERR_INVALID, "example %lld: token id %d at position %lld is outside the vocabulary",
                                    (long long)(b->example_index ? b->example_index[s] : s), tg >= c->vocab_size ? tg : id,
                                    (long long)t);
            here += tg >= 0;
        }
        if (here == 0)
            return gm_error_set(err, GM_ERR_INVALID,
                                "example %lld has no supervised token (its response is empty or was cut off by max_length = %lld)\n"
                                "  hint: drop the example or raise max_length",
                                (long long)(b->example_index ? b->example_index[s] : s), (long long)tr->o.max_length);
        *n_sup += here;
    }
    return GM_OK;
}

/* Forward of the whole stack on batch b (ids and positions copied in), returns n_sup and fills
 * the supervised-row lists. */
static void forward_all(gm_trainer *tr, const gm_batch *b, int64_t *n_sup_out) {
    const gm_config *c = &tr->m->cfg;
    int64_t B = b->B, T = b->T, N = B * T, n_sup = 0;
    memcpy(tr->ids, b->ids, (size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) {
        tr->pos[i] = (int32_t)(i % T);
        if (b->targets[i] >= 0) {
            tr->sup_rows[n_sup] = (int32_t)i;
            tr->sup_tgt[n_sup++] = b->targets[i];
        }
    }
    tr->k->embed_fwd(&tr->kctx, tr->X[0], tr->ids, &tr->wv.embed, N, sqrtf((float)c->hidden_size));
    for (int64_t l = 0; l < c->n_layers; l++) layer_fwd(tr, l, B, T);
    *n_sup_out = n_sup;
}

gm_status gm_trainer_forward_backward(gm_trainer *tr, const gm_batch *b, float grad_scale, double *loss_sum,
                                      gm_error *err) {
    int64_t n_sup;
    GM_TRY(check_batch(tr, b, &n_sup, err));
    const gm_config *c = &tr->m->cfg;
    int64_t B = b->B, T = b->T, N = B * T;
    tr->training = true;
    forward_all(tr, b, &n_sup);
    *loss_sum = lm_loss(tr, N, n_sup, true, grad_scale, NULL);
    for (int64_t l = c->n_layers - 1; l >= 0; l--) {
        if (tr->o.checkpointing) layer_fwd(tr, l, B, T); /* recompute this block's activations */
        layer_bwd(tr, l, B, T);
    }
    tr->micro++;
    return GM_OK;
}

gm_status gm_trainer_eval(gm_trainer *tr, const gm_batch *b, double *loss_sum, int64_t *n_tokens, gm_error *err) {
    int64_t n_sup;
    GM_TRY(check_batch(tr, b, &n_sup, err));
    tr->training = false;
    forward_all(tr, b, &n_sup);
    *loss_sum = lm_loss(tr, b->B * b->T, n_sup, false, 0.0f, NULL);
    *n_tokens = n_sup;
    return GM_OK;
}

gm_status gm_trainer_score(gm_trainer *tr, const gm_batch *b, double *seq_logprob, gm_error *err) {
    int64_t n_sup;
    GM_TRY(check_batch(tr, b, &n_sup, err));
    tr->training = false;
    forward_all(tr, b, &n_sup);
    /* per-row losses go into the (N)-sized lse-adjacent workspace: reuse dhs as doubles */
    double *row_loss = (double *)tr->dhs; /* N*C floats >= N doubles */
    lm_loss(tr, b->B * b->T, n_sup, false, 0.0f, row_loss);
    for (int64_t s = 0; s < b->B; s++) seq_logprob[s] = 0;
    for (int64_t i = 0; i < n_sup; i++) seq_logprob[tr->sup_rows[i] / b->T] -= row_loss[i];
    return GM_OK;
}

gm_status gm_trainer_choice_logits(gm_trainer *tr, const gm_batch *b, const int64_t *pos, const int32_t *cand,
                                   int64_t K, float *out, gm_error *err) {
    const gm_config *c = &tr->m->cfg;
    int64_t C = c->hidden_size;
    if (b->B < 1 || b->B > tr->o.batch || b->T < 1 || b->T > tr->o.max_length)
        return gm_error_set(err, GM_ERR_INVALID, "batch of %lld x %lld tokens does not fit the plan (batch %lld, max_length %lld)",
                            (long long)b->B, (long long)b->T, (long long)tr->o.batch, (long long)tr->o.max_length);
    for (int64_t k = 0; k < K; k++)
        if (cand[k] < 0 || cand[k] >= c->vocab_size)
            return gm_error_set(err, GM_ERR_INVALID, "candidate token %d is outside the vocabulary", cand[k]);
    for (int64_t s = 0; s < b->B; s++)
        if (pos[s] < 0 || pos[s] >= b->T)
            return gm_error_set(err, GM_ERR_INVALID, "position %lld is outside the sequence (T = %lld)", (long long)pos[s],
                                (long long)b->T);
    for (int64_t i = 0; i < b->B * b->T; i++)
        if (b->ids[i] < 0 || b->ids[i] >= c->vocab_size)
            return gm_error_set(err, GM_ERR_INVALID, "token id %d is outside the vocabulary", b->ids[i]);
    tr->training = false;
    int64_t n_sup;
    forward_all(tr, b, &n_sup);
    for (int64_t s = 0; s < b->B; s++) memcpy(tr->xs + s * C, tr->X[c->n_layers] + (s * b->T + pos[s]) * C, (size_t)C * 4);
    tr->k->rmsnorm_fwd(&tr->kctx, tr->hs, tr->rstd_s, tr->xs, (const float *)tr->m->final_norm.data, b->B, C, c->rms_norm_eps);
    /* the K candidate rows of the tied embedding, dequantized into the loss workspace */
    float *rows = tr->dxn; /* (N, C) >= (K, C) for K <= N */
    if (K > tr->o.batch * tr->o.max_length)
        return gm_error_set(err, GM_ERR_INVALID, "%lld candidates: at most batch x max_length = %lld", (long long)K,
                            (long long)(tr->o.batch * tr->o.max_length));
    for (int64_t k = 0; k < K; k++) gm_dequant_wrow(&tr->wv.lm_head, cand[k], rows + k * C);
    gm_wview cv = gm_wview_f32(rows, K, C);
    tr->k->matmul_fwd(&tr->kctx, out, tr->hs, &cv, b->B, 0.0f);
    if (c->final_logit_softcap > 0) tr->k->softcap_fwd(&tr->kctx, out, out, b->B * K, c->final_logit_softcap);
    return GM_OK;
}

gm_status gm_trainer_step(gm_trainer *tr, const gm_batch *micro, int n_micro, gm_step_stats *st, gm_error *err) {
    int64_t total = 0;
    for (int i = 0; i < n_micro; i++) {
        int64_t n;
        gm_status s = check_batch(tr, &micro[i], &n, err);
        if (s != GM_OK) {
            gm_error_prefix(err, "step %lld, micro-batch %d", (long long)tr->step + 1, i);
            return s;
        }
        total += n;
    }
    if (n_micro < 1 || total == 0)
        return gm_error_set(err, GM_ERR_INVALID, "step %lld has no supervised token", (long long)tr->step + 1);
    gm_trainer_zero_grad(tr);
    tr->micro = 0;
    double loss_sum = 0;
    for (int i = 0; i < n_micro; i++) {
        double ls = 0;
        GM_TRY(gm_trainer_forward_backward(tr, &micro[i], (float)(1.0 / (double)total), &ls, err));
        loss_sum += ls;
    }
    double loss = loss_sum / (double)total;
    if (!isfinite(loss))
        return gm_error_set(err, GM_ERR_NONFINITE, "step %lld: the loss is %g (non-finite); the adapters were not updated",
                            (long long)tr->step + 1, loss);
    /* gradient norm (and a non-finite check per tensor) */
    int64_t r = tr->o.lora.rank;
    double sq = 0;
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        double a = 0, b2 = 0;
        tr->k->sumsq(&tr->kctx, &a, ad->dA, r * ad->in);
        tr->k->sumsq(&tr->kctx, &b2, ad->dB, ad->out * r);
        if (!isfinite(a) || !isfinite(b2))
            return gm_error_set(err, GM_ERR_NONFINITE, "step %lld: gradient of %s is non-finite; the adapters were not updated",
                                (long long)tr->step + 1, isfinite(a) ? ad->name_B : ad->name_A);
        sq += a + b2;
    }
    double norm = sqrt(sq);
    if (tr->o.max_grad_norm > 0) {
        /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1 */
        double coef = (double)tr->o.max_grad_norm / (norm + 1e-6);
        if (coef < 1.0)
            for (int i = 0; i < tr->n_adapters; i++) {
                gm_lora_adapter *ad = &tr->adapters[i];
                tr->k->scale_fwd(&tr->kctx, ad->dA, ad->dA, r * ad->in, (float)coef);
                tr->k->scale_fwd(&tr->kctx, ad->dB, ad->dB, ad->out * r, (float)coef);
            }
    }
    double lr = gm_train_lr_at(&tr->o, tr->step);
    int64_t t = tr->step + 1;
    double bc1 = 1.0 - pow((double)tr->o.beta1, (double)t), bc2 = 1.0 - pow((double)tr->o.beta2, (double)t);
    float decay = (float)(1.0 - lr * (double)tr->o.weight_decay), step_size = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        tr->k->adamw(&tr->kctx, ad->A, ad->dA, ad->mA, ad->vA, r * ad->in, tr->o.beta1, tr->o.beta2, tr->o.eps, decay,
                     step_size, bc2s);
        tr->k->adamw(&tr->kctx, ad->B, ad->dB, ad->mB, ad->vB, ad->out * r, tr->o.beta1, tr->o.beta2, tr->o.eps, decay,
                     step_size, bc2s);
    }
    tr->step = t;
    if (st) {
        st->loss = loss;
        st->n_tokens = total;
        st->grad_norm = norm;
        st->lr = lr;
        st->step = t;
    }
    return GM_OK;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

static gm_ckpt_tensor *ckpt_tensors(gm_trainer *tr, int *n) {
    gm_ckpt_tensor *t = gm_calloc((size_t)(2 * tr->n_adapters + 1), sizeof *t);
    if (!t) return NULL;
    int64_t r = tr->o.lora.rank;
    for (int i = 0; i < tr->n_adapters; i++) {
        gm_lora_adapter *ad = &tr->adapters[i];
        t[2 * i] = (gm_ckpt_tensor){ad->name_A, ad->A, ad->mA, ad->vA, 2, {r, ad->in, 0, 0}};
        t[2 * i + 1] = (gm_ckpt_tensor){ad->name_B, ad->B, ad->mB, ad->vB, 2, {ad->out, r, 0, 0}};
    }
    *n = 2 * tr->n_adapters;
    return t;
}

gm_status gm_trainer_save(gm_trainer *tr, const char *path, int64_t epoch, int64_t data_pos, double loss,
                          const char *config_json, gm_error *err) {
    int n;
    gm_ckpt_tensor *t = ckpt_tensors(tr, &n);
    if (!t) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_ckpt c = {.step = tr->step, .epoch = epoch, .data_pos = data_pos, .rng_seed = tr->o.lora.seed,
                 .rng_counter = (uint64_t)tr->step, .loss = loss, .config_json = config_json, .n_tensors = n,
                 .tensors = t};
    gm_status s = gm_ckpt_save(path, &c, err);
    gm_free(t);
    return s;
}

gm_status gm_trainer_load(gm_trainer *tr, const char *path, int64_t *epoch, int64_t *data_pos, gm_error *err) {
    int n;
    gm_ckpt_tensor *t = ckpt_tensors(tr, &n);
    if (!t) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_ckpt c = {.n_tensors = n, .tensors = t};
    gm_status s = gm_ckpt_load(path, &c, err);
    gm_free(t);
    if (s != GM_OK) return s;
    if (c.rng_seed != tr->o.lora.seed)
        return gm_error_set(err, GM_ERR_INVALID, "%s: checkpoint was made with seed %llu, this run uses seed %llu", path,
                            (unsigned long long)c.rng_seed, (unsigned long long)tr->o.lora.seed);
    tr->step = c.step;
    if (epoch) *epoch = c.epoch;
    if (data_pos) *data_pos = c.data_pos;
    return GM_OK;
}
