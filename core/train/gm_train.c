/*
 * gm_train.c - training on the architecture's one forward / backward: chunked cross-entropy,
 * gradient accumulation, clipping, AdamW, checkpoints. See gm_train.h.
 *
 * Memory: one layout function (layout()) reserves every buffer: the base weights in the run's
 * format (core/model/gm_weights.c), the adapters with gradients and moments (gm_lora_layout), the
 * graph's activations and workspace (core/arch/gm_graph.c, a walk over the architecture's spec)
 * and the loss's buffers. It runs on measuring arenas (the plan, also gm_train_plan without a
 * model), then again after the single allocation per arena. Backend memory is only touched
 * through kernels and the backend's copies; host staging holds what crosses.
 */
#include "gm_train.h"

#include "gm_vision.h"

#include "gm_alloc.h"
#include "gm_checkpoint.h"
#include "gm_dist.h"
#include "gm_graph.h"
#include "gm_weights.h"
#include "gm_audio_encoder.h"
#include "gm_mm_embed.h"
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

struct gm_trainer {
    const gm_model *m;
    const gm_config *cfg;
    gm_train_opts o;
    gm_backend *be, *owned_be;
    gm_weights w;             /* base weights as trained on (re-encoded or as stored) */
    gm_lora lora;             /* the adapters, with gradients and moments */
    gm_graph g;               /* the forward / backward in training mode */
    gm_vision vis;            /* the image path (o.max_images > 0): tower + projector */
    bool has_vis;
    bool vis_trains;          /* the tower's adapters or the projector learn */
    gm_train_param *params;   /* [n_params]: every trained tensor (gm_trainer_params) */
    int n_params, cap_params;
    int32_t *img_rows;        /* (N) backend: rows of X[0] the images' soft tokens replace */
    int32_t *h_img_rows, *h_ids, *h_kv_end; /* (N) host staging */
    int64_t *h_uniq, *h_of;   /* (max_images): a batch's distinct images, each image's among them */
    gm_audio_encoder aud;     /* the audio path (o.max_audio > 0): Gemma 3n's encoder, frozen */
    bool has_aud;
    int32_t *aud_rows;        /* (N) backend: rows of X[0] the clips' soft tokens replace */
    bool media_kept;          /* the encoders' soft tokens are those of the last forward without
                                 dropout, with no training step since (gm_batch.same_media) */
    int64_t kept_n_run;       /* that forward's distinct images */
    int32_t *h_aud_rows;      /* (N) host staging */
    gm_mm_hard hard;          /* Gemma 3n's hard multimodal tokens (a loaded model's; n = 0 otherwise) */
    bool has_hard;            /* the config has embedders: the rows below are planned */
    const float **h_hard_ptr; /* (N) host: the hard tokens' rows of a batch */
    int64_t *h_hard_rows;     /* (N) host */
    gm_arena arena;           /* backend memory: weights, adapters, activations, loss */
    gm_arena host;            /* host staging */
    int64_t step;             /* optimizer steps done */
    int64_t micro;            /* micro-batch counter within the current step (dropout keys) */
    /* loss, backend memory (N = batch * max_length rows) */
    int32_t *sup_rows, *sup_tgt; /* (N): supervised row indices and their targets */
    float *xs, *hs, *rstd_s, *dhs; /* (N, C), (N, C), (N), (N, C) gathered rows */
    float *logits;            /* (GM_LM_ROWS, GM_LM_VOCAB) */
    float *head_f32;          /* (GM_LM_VOCAB, C): a chunk of a non-f32 LM head dequantized once for its
                                 two GEMMs (f32 compute); NULL: the GEMMs read the head as stored */
    float *e_tgt;             /* (GM_LM_ROWS, C): the targets' rows of the LM head */
    float *run_max, *run_sum, *tgt_logit, *lse; /* (N) */
    double *sumsq, *h_sumsq;  /* (cap_params): each trained tensor's squared gradient norm, backend
                                 and host (one download a step) */
    /* host staging */
    int32_t *h_rows, *h_tgt;  /* (N) */
    float *h_lse, *h_tgt_logit; /* (N) */
    double *h_row_loss;       /* (N) */
    /* data parallel (gm_trainer_set_dist): the world (borrowed) and the gradients as runs of
     * buffers adjacent in memory, one all-reduce each */
    gm_dist *dist;
    float **dist_bufs;        /* (n_dist_runs) */
    size_t *dist_n;           /* (n_dist_runs) floats per run */
    int n_dist_runs;
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

bool gm_compute_from_name(const char *name, gm_compute *out) {
    static const char *const names[] = {"auto", "bf16", "f32"};
    for (int c = 0; c < 3; c++)
        if (strcmp(name, names[c]) == 0) {
            *out = (gm_compute)c;
            return true;
        }
    return false;
}

const char *gm_compute_effective(gm_compute c, const char *device) {
    int index = -1;
    gm_error err = {0};
    bool gpu = device && gm_backend_parse_device(device, &index, &err) == GM_OK && index >= 0;
    bool bf16 = c == GM_COMPUTE_BF16 ? gpu || gm_k_cpu_bf16_native() : c == GM_COMPUTE_AUTO && (gpu || gm_k_cpu_bf16_auto());
    return bf16 ? "bf16" : "f32";
}

/* ---- the options' schema (gm_train_opts.def) ------------------------------------------------ */

static const gm_opt_spec opt_specs[] = {
#define GM_TRAIN_OPT(name, kind, def, def_text, min, max, gt, lt, values, doc, source, assign)                       \
    {#name, GM_OPT_##kind, def, def_text, min, max, gt, lt, values, doc, source},
#include "gm_train_opts.def"
#undef GM_TRAIN_OPT
};
#define N_OPTS ((int)(sizeof opt_specs / sizeof opt_specs[0]))

const char *gm_opt_kind_name(gm_opt_kind k) {
    static const char *const names[] = {"integer", "number", "boolean", "enum", "targets", "layers"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

const gm_opt_spec *gm_train_opt_specs(int *n) {
    *n = N_OPTS;
    return opt_specs;
}

const gm_opt_spec *gm_train_opt_find(const char *name) {
    for (int i = 0; i < N_OPTS; i++)
        if (strcmp(opt_specs[i].name, name) == 0) return &opt_specs[i];
    return NULL;
}

/* Stores an already checked value (the table's assign statements). */
static void assign(gm_train_opts *o, const gm_opt_spec *s, gm_opt_value v) {
    int id = (int)(s - opt_specs), i = 0;
#define GM_TRAIN_OPT(name, kind, def, def_text, min, max, gt, lt, values, doc, source, stmt)                           \
    if (id == i++) {                                                                         \
        stmt;                                                                                \
        return;                                                                              \
    }
#include "gm_train_opts.def"
#undef GM_TRAIN_OPT
}

const char *gm_opt_describe_range(const gm_opt_spec *s, char *buf, size_t cap) {
    char lo[48] = "", hi[48] = "";
    bool integer = s->kind == GM_OPT_INT;
    const char *what = integer ? "an integer" : "a number";
    switch (s->kind) {
    case GM_OPT_BOOL: snprintf(buf, cap, "true or false"); return buf;
    case GM_OPT_ENUM: { /* "a, b, c" */
        size_t k = 0;
        for (const char *p = s->values; *p && k + 2 < cap; p++) {
            buf[k++] = *p;
            if (*p == ',' && k + 1 < cap) buf[k++] = ' ';
        }
        buf[k] = '\0';
        return buf;
    }
    case GM_OPT_TARGETS: snprintf(buf, cap, "all-linear, module names or a regular expression"); return buf;
    case GM_OPT_LAYERS: snprintf(buf, cap, "a list of 0-based layer indices"); return buf;
    default: break;
    }
    if (!isnan(s->min)) snprintf(lo, sizeof lo, ">= %g", s->min);
    if (!isnan(s->gt)) snprintf(lo, sizeof lo, "> %g", s->gt);
    if (!isnan(s->max)) snprintf(hi, sizeof hi, "<= %g", s->max);
    if (!isnan(s->lt)) snprintf(hi, sizeof hi, "< %g", s->lt);
    if (integer && !isnan(s->min) && !isnan(s->max))
        snprintf(buf, cap, "%s %lld..%lld", what, (long long)s->min, (long long)s->max);
    else if (lo[0] && hi[0]) snprintf(buf, cap, "%s %s and %s", what, lo, hi);
    else if (lo[0] || hi[0]) snprintf(buf, cap, "%s %s", what, lo[0] ? lo : hi);
    else snprintf(buf, cap, "%s", what);
    return buf;
}

gm_status gm_train_opt_set(gm_train_opts *o, const gm_opt_spec *s, gm_opt_value v, gm_error *err) {
    char range[160];
    gm_opt_describe_range(s, range, sizeof range);
    switch (s->kind) {
    case GM_OPT_INT:
    case GM_OPT_NUM:
        if (!isfinite(v.num) || (s->kind == GM_OPT_INT && v.num != floor(v.num)) || (!isnan(s->min) && v.num < s->min) ||
            (!isnan(s->max) && v.num > s->max) || (!isnan(s->gt) && !(v.num > s->gt)) || (!isnan(s->lt) && !(v.num < s->lt)))
            return isfinite(v.num) && v.num == floor(v.num) && fabs(v.num) < 1e18
                       ? gm_error_set(err, GM_ERR_INVALID, "%s = %lld: must be %s", s->name, (long long)v.num, range)
                       : gm_error_set(err, GM_ERR_INVALID, "%s = %g: must be %s", s->name, v.num, range);
        break;
    case GM_OPT_BOOL: break;
    case GM_OPT_ENUM: {
        bool ok = false;
        size_t n = v.text ? strlen(v.text) : 0;
        for (const char *p = s->values; v.text && *p && !ok;) {
            const char *e = strchr(p, ',');
            size_t k = e ? (size_t)(e - p) : strlen(p);
            ok = k == n && strncmp(p, v.text, n) == 0;
            p = e ? e + 1 : p + k;
        }
        if (!ok) return gm_error_set(err, GM_ERR_INVALID, "%s = %s: allowed values are %s", s->name, v.text ? v.text : "?", range);
        break;
    }
    case GM_OPT_TARGETS:
        if (!v.text || !v.text[0] || strlen(v.text) >= GM_LORA_TARGETS_MAX)
            return gm_error_set(err, GM_ERR_INVALID, "%s: must be %s (1..%d characters)", s->name, range, GM_LORA_TARGETS_MAX - 1);
        break;
    case GM_OPT_LAYERS: break;
    }
    assign(o, s, v);
    return GM_OK;
}

gm_status gm_train_opt_targets_check(const gm_opt_spec *s, const char *text, gm_error *err) {
    bool vision = strcmp(s->name, "vision_targets") == 0, audio = strcmp(s->name, "audio_targets") == 0;
    if ((vision || audio) && strcmp(text, "none") == 0) return GM_OK;
    gm_status st = gm_lora_targets_check(text, gm_arch_get(vision ? GM_ARCH_SIGLIP : audio ? GM_ARCH_GEMMA3N_AUDIO : GM_ARCH_GEMMA3),
                                         vision ? GM_VISION_TOWER_PREFIX : audio ? GM_AUDIO_TOWER_PREFIX : NULL, err);
    /* the model is not known yet: a vision target may name Gemma 4's tower's modules instead
     * (q_proj.linear); the trainer checks them against the model's own tower */
    if (st != GM_OK && audio) { /* or Gemma 4's audio tower's (q_proj.linear, linear_start.linear, ...) */
        gm_error e4 = {0};
        if (gm_lora_targets_check(text, gm_arch_get(GM_ARCH_GEMMA4_AUDIO), GM_AUDIO_TOWER_PREFIX, &e4) == GM_OK) st = GM_OK;
        else if (strstr(err->msg, "unknown target module")) { /* name both towers' modules */
            gm_error e3 = *err;
            gm_error_set(err, GM_ERR_INVALID, "%s (Gemma 3n's audio encoder); on Gemma 4's: ffw_layer_1.linear, "
                         "ffw_layer_2.linear, q_proj.linear, k_proj.linear, v_proj.linear, post.linear, "
                         "linear_start.linear, linear_end.linear (its linears sit inside clamping wrappers: target the "
                         "inner one)", e3.msg);
        }
    }
    if (st != GM_OK && vision) {
        gm_error e4 = {0};
        gm_status s4 = gm_lora_targets_check(text, gm_arch_get(GM_ARCH_GEMMA4_VISION), GM_VISION_TOWER_PREFIX, &e4);
        if (s4 == GM_OK) st = GM_OK;
        else if (strstr(err->msg, "unknown target module")) { /* name both towers' modules */
            gm_error e3 = *err;
            gm_error_set(err, GM_ERR_INVALID, "%s; on Gemma 4's tower: q_proj.linear, k_proj.linear, v_proj.linear, "
                         "o_proj.linear, gate_proj.linear, up_proj.linear, down_proj.linear (its linears sit inside "
                         "clamping wrappers: target the inner one)", e3.msg);
        }
    }
    if (st != GM_OK) gm_error_prefix(err, "%s", s->name);
    return st;
}

gm_status gm_train_opt_parse(gm_train_opts *o, const gm_opt_spec *s, const char *text, gm_error *err) {
    gm_opt_value v = {0, text, NULL};
    char range[160];
    gm_opt_describe_range(s, range, sizeof range);
    if (s->kind == GM_OPT_INT || s->kind == GM_OPT_NUM) {
        char *end;
        v.num = strtod(text, &end);
        if (end == text || *end)
            return gm_error_set(err, GM_ERR_INVALID, "%s = %s: must be %s", s->name, text, range);
    } else if (s->kind == GM_OPT_BOOL) {
        if (!strcmp(text, "true") || !strcmp(text, "on") || !strcmp(text, "1") || !strcmp(text, "yes")) v.num = 1;
        else if (!strcmp(text, "false") || !strcmp(text, "off") || !strcmp(text, "0") || !strcmp(text, "no")) v.num = 0;
        else return gm_error_set(err, GM_ERR_INVALID, "%s = %s: must be on/off, true/false, yes/no or 1/0", s->name, text);
    } else if (s->kind == GM_OPT_LAYERS) { /* "0,1,5": comma-separated layer indices */
        static bool layers[GM_MAX_LAYERS];
        for (int i = 0; i < GM_MAX_LAYERS; i++) layers[i] = false;
        const char *p = text;
        int n = 0;
        while (*p) {
            char *end;
            long l = strtol(p, &end, 10);
            if (end == p || l < 0 || l >= GM_MAX_LAYERS || (*end && *end != ','))
                return gm_error_set(err, GM_ERR_INVALID, "%s = %s: must be %s, comma-separated (0,1,5)", s->name, text, range);
            if (layers[l]) return gm_error_set(err, GM_ERR_INVALID, "%s: %ld is listed twice", s->name, l);
            layers[l] = true, n++;
            p = *end ? end + 1 : end;
        }
        if (n == 0) return gm_error_set(err, GM_ERR_INVALID, "%s is empty: list at least one layer (0-based)", s->name);
        v.layers = layers;
    }
    return gm_train_opt_set(o, s, v, err);
}

/* Edit distance counting a swap of neighbours as one edit (optimal string alignment), for "did
 * you mean": the same rule as lua/prelude.lua's. */
static int osa_distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > 40 || m > 40) return 99;
    int d[41][41];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int c = a[i - 1] == b[j - 1] ? 0 : 1, v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + c < v) v = d[i - 1][j - 1] + c;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v) v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[n][m];
}

const gm_opt_spec *gm_train_opt_closest(const char *name) {
    const gm_opt_spec *best = NULL;
    int bd = 99, len = (int)strlen(name);
    for (int i = 0; i < N_OPTS; i++) {
        int d = osa_distance(name, opt_specs[i].name);
        if (d < bd) bd = d, best = &opt_specs[i];
    }
    int limit = len / 3 > 1 ? (len / 3 < 3 ? len / 3 : 3) : 1;
    return bd <= limit ? best : NULL;
}

const gm_lora_config *gm_train_audio_selection(const gm_train_opts *o, gm_lora_config *al) {
    *al = o->lora;
    snprintf(al->targets, sizeof al->targets, "%s", o->audio_targets);
    return strcmp(o->audio_targets, "none") != 0 ? al : NULL;
}

gm_vision_train gm_train_vision_selection(const gm_train_opts *o, gm_lora_config *vl) {
    *vl = o->lora;
    snprintf(vl->targets, sizeof vl->targets, "%s", o->vision_targets);
    return (gm_vision_train){.lora = strcmp(o->vision_targets, "none") != 0 ? vl : NULL, .projector = o->train_projector};
}

gm_train_opts gm_train_opts_default(void) {
    gm_train_opts o;
    memset(&o, 0, sizeof o);
    o.lora = gm_lora_config_default();
    for (int i = 0; i < N_OPTS; i++) {
        const gm_opt_spec *s = &opt_specs[i];
        if (s->kind == GM_OPT_INT || s->kind == GM_OPT_NUM || s->kind == GM_OPT_BOOL) {
            if (isnan(s->def)) continue; /* no default: stays 0 ("none") */
            assign(&o, s, (gm_opt_value){s->def, NULL, NULL});
        } else {
            assign(&o, s, (gm_opt_value){0, s->def_text, NULL});
        }
    }
    o.total_steps = 1;
    o.n_threads = 2;
    gm_train_opts_resolve(&o);
    return o;
}

void gm_train_opts_resolve(gm_train_opts *o) {
    o->warmup_steps = o->warmup < 1 ? (int64_t)floor(o->warmup * (double)o->total_steps + 0.5) : (int64_t)o->warmup;
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

/* ---- layout (plan, then allocate once) --------------------------------------------------- */

static gm_graph_opts graph_opts(const gm_train_opts *o) {
    gm_graph_opts go = {.mode = GM_GRAPH_TRAIN, .batch = o->batch, .max_tokens = o->max_length, .ctx = o->max_length,
                        .checkpointing = o->checkpointing, .lm_rows = GM_LM_VOCAB, .rank = o->lora.rank,
                        .n_threads = o->n_threads};
    return go;
}

/* Describes weights, adapters and graph for config c (no buffers). */
static gm_status setup(gm_trainer *tr, const gm_config *c, const char *prefix, gm_error *err) {
    tr->cfg = c;
    if (tr->o.max_images > 0) {
        if (c->vision.hidden_size <= 0 && tr->m)
            return gm_error_set(err, GM_ERR_INVALID, "%s: the data has images, but the model has no vision tower\n"
                                "  hint: use a multimodal checkpoint (Gemma3ForConditionalGeneration, e.g. gemma-3-4b)",
                                tr->m->path);
        gm_lora_config vl;
        gm_vision_train vt = gm_train_vision_selection(&tr->o, &vl);
        GM_TRY(gm_vision_init_train(&tr->vis, c, tr->m ? tr->m->vision : NULL, tr->o.max_images, &vt, tr->o.checkpointing,
                                    tr->o.n_threads, tr->be, err));
        tr->has_vis = true;
        tr->vis_trains = tr->vis.train_tower || tr->vis.train_proj;
    } else if (strcmp(tr->o.vision_targets, "none") != 0 || tr->o.train_projector) {
        return gm_error_set(err, GM_ERR_INVALID, "%s is set, but the data has no images: the vision tower and projector "
                            "only learn from images\n  hint: leave vision_targets and modules_to_save out for text-only data "
                            "(gemmarun plan: give images=N)",
                            tr->o.train_projector ? "modules_to_save" : "vision_targets");
    }
    if (tr->o.max_audio > 0) {
        if (!gm_config_has_audio(c))
            return gm_error_set(err, GM_ERR_INVALID, "%s: the data has audio, but the model has no audio encoder\n"
                                "  hint: use a Gemma 3n or Gemma 4 E checkpoint of ...ForConditionalGeneration (e.g. "
                                "gemma-3n-E2B-it, gemma-4-E2B-it)",
                                tr->m ? tr->m->path : c->name);
        gm_lora_config al;
        const gm_lora_config *alp = gm_train_audio_selection(&tr->o, &al);
        GM_TRY(gm_audio_encoder_init_train(&tr->aud, c, tr->m, tr->m ? &tr->hard : NULL, tr->o.max_audio,
                                           tr->o.max_audio_frames, alp, tr->o.checkpointing, tr->o.n_threads, tr->be, err));
        tr->has_aud = true;
    } else if (strcmp(tr->o.audio_targets, "none") != 0 && !gm_config_has_audio(c)) {
        return gm_error_set(err, GM_ERR_INVALID, "audio_targets is set, but %s has no audio encoder to train\n  hint: "
                            "audio_targets is for checkpoints with an audio tower (Gemma 3n, Gemma 4 E2B / E4B); leave it out",
                            tr->m ? tr->m->path : c->name);
    } else if (strcmp(tr->o.audio_targets, "none") != 0) {
        return gm_error_set(err, GM_ERR_INVALID, "audio_targets is set, but the data has no audio: the audio encoder only "
                            "learns from audio\n  hint: leave audio_targets out for data without audio (gemmarun plan: "
                            "give audio_seconds=S)");
    }
    tr->has_hard = c->arch == GM_ARCH_GEMMA3N && (c->audio.vocab_size > 0 || c->vision.hard_vocab > 0);
    GM_TRY(gm_weights_init(&tr->w, c, tr->o.quant, err));
    tr->w.row_table_resident = tr->o.ple_resident > 0 ? (size_t)tr->o.ple_resident : 0;
    GM_TRY(gm_lora_describe(&tr->lora, &tr->o.lora, tr->w.arch, c, prefix, err));
    tr->cap_params = 2 * tr->lora.n + (tr->has_vis ? 2 * tr->vis.lora.n + (tr->vis.train_proj ? GM_VISION_PROJ_PARAMS : 0) : 0) +
                     (tr->has_aud ? 2 * tr->aud.lora.n : 0);
    tr->params = gm_calloc((size_t)tr->cap_params, sizeof *tr->params);
    if (!tr->params) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_graph_opts go = graph_opts(&tr->o);
    GM_TRY(gm_graph_init(&tr->g, c, &tr->w, &tr->lora, tr->be, &go, err));
    /* the clips' or images' soft tokens learn upstream: the front's share of their gradient */
    tr->g.front_grad = (tr->has_aud && tr->aud.train_tower) || tr->vis_trains;
    return GM_OK;
}

/* Adds the A and B of each adapter of lo to the trained list. */
static void add_adapters(gm_trainer *tr, const gm_lora *lo) {
    int64_t r = lo->cfg.rank;
    for (int i = 0; i < lo->n; i++) {
        const gm_lora_adapter *ad = &lo->ad[i];
        tr->params[tr->n_params++] = (gm_train_param){ad->name_A, ad->A, ad->dA, ad->mA, ad->vA, r * ad->in, 2, {r, ad->in}, true};
        tr->params[tr->n_params++] = (gm_train_param){ad->name_B, ad->B, ad->dB, ad->mB, ad->vB, ad->out * r, 2, {ad->out, r}, true};
    }
}

/* The trained list (gm_trainer_params) from the buffers the layout handed out. */
static void collect_params(gm_trainer *tr) {
    tr->n_params = 0;
    add_adapters(tr, &tr->lora);
    if (tr->has_vis && tr->vis.train_tower) add_adapters(tr, &tr->vis.lora);
    if (tr->has_aud && tr->aud.train_tower) add_adapters(tr, &tr->aud.lora);
    for (int i = 0; tr->has_vis && tr->vis.train_proj && i < GM_VISION_PROJ_PARAMS; i++) {
        gm_vision_param *q = &tr->vis.proj[i];
        tr->params[tr->n_params++] = (gm_train_param){q->name, q->p, q->d, q->m, q->v, q->n, q->ndim,
                                                      {q->shape[0], q->shape[1]}, q->decay};
    }
}

/* Whether a trainer with option c on backend be (NULL: a plan, the CPU) multiplies its base weights
 * in bf16: CUDA as its backend's bf16_gemm says (on unless a test turned it off) unless c is F32;
 * the CPU where native (BF16) or native and faster (AUTO; kernels.h, gm_k_cpu_bf16_auto). */
static bool trainer_bf16(const gm_backend *be, gm_compute c) {
    if (c == GM_COMPUTE_F32) return false;
    if (be && be->device != GM_DEVICE_CPU) return be->bf16_gemm;
    return c == GM_COMPUTE_BF16 ? gm_k_cpu_bf16_native() : gm_k_cpu_bf16_auto();
}

/* Reserves (or, on committed arenas, hands out) every buffer. m == NULL: a plan. */
static gm_status layout(gm_trainer *tr, const gm_model *m, gm_dtype stored, gm_dtype stored_embed, gm_error *err) {
    const gm_config *c = tr->cfg;
    gm_arena *a = &tr->arena, *h = &tr->host;
    int64_t N = tr->o.batch * tr->o.max_length, C = c->hidden_size;
    GM_TRY(gm_weights_layout(&tr->w, m, stored, stored_embed, tr->be, a, tr->o.n_threads, err));
    gm_lora_layout(&tr->lora, a, true);
    gm_graph_layout(&tr->g, a, h);
    bool bf16 = trainer_bf16(tr->be, tr->o.compute);
    tr->g.kc.bf16_gemm = bf16;
    if (tr->has_vis) {
        GM_TRY(gm_vision_layout(&tr->vis, a, h, err));
        tr->vis.g.kc.bf16_gemm = bf16;
        tr->img_rows = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
        tr->h_img_rows = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
        tr->h_ids = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
        tr->h_kv_end = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
        tr->h_uniq = (int64_t *)gm_arena_alloc(h, (size_t)tr->o.max_images * sizeof(int64_t), GM_MEM_WORKSPACE);
        tr->h_of = (int64_t *)gm_arena_alloc(h, (size_t)tr->o.max_images * sizeof(int64_t), GM_MEM_WORKSPACE);
    }
    /* compute: the CPU's bf16 GEMMs go through a staging buffer of their own (kernels.h), shared by
     * the decoder's and the vision tower's graphs, which run one after the other: what their largest
     * GEMM needs (the LM head's chunk: GM_LM_ROWS rows by GM_LM_VOCAB), at most
     * GM_CPU_BF16_STAGING_BYTES (larger ones go in row chunks) */
    if (bf16 && (!tr->be || tr->be->device == GM_DEVICE_CPU)) { /* a plan (no backend): the CPU's layout */
        size_t elems = gm_weights_bf16_staging_elems(&tr->w, N, GM_LM_VOCAB, N < GM_LM_ROWS ? N : GM_LM_ROWS), t;
        if (tr->has_vis && (t = gm_weights_bf16_staging_elems(tr->vis.g.w, tr->vis.g.o.batch * tr->vis.g.o.max_tokens, 0, 0)) > elems)
            elems = t;
        if (elems > GM_CPU_BF16_STAGING_BYTES / 2) elems = GM_CPU_BF16_STAGING_BYTES / 2;
        uint16_t *staging = elems ? (uint16_t *)gm_arena_alloc(a, elems * sizeof(uint16_t), GM_MEM_WORKSPACE) : NULL;
        /* the size also in a plan, whose measuring arena hands out no memory (cpu_bf16_gemms) */
        tr->g.kc.bf16_staging = staging, tr->g.kc.bf16_staging_elems = elems;
        tr->vis.g.kc.bf16_staging = staging, tr->vis.g.kc.bf16_staging_elems = elems;
    }
    if (tr->has_aud) {
        GM_TRY(gm_audio_encoder_layout(&tr->aud, a, h, err));
        tr->aud_rows = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
        tr->h_aud_rows = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    }
    if (tr->has_hard) {
        tr->h_hard_ptr = (const float **)gm_arena_alloc(h, (size_t)N * sizeof(float *), GM_MEM_WORKSPACE);
        tr->h_hard_rows = (int64_t *)gm_arena_alloc(h, (size_t)N * sizeof(int64_t), GM_MEM_WORKSPACE);
    }
#define F32(n, kind) (float *)gm_arena_alloc(a, (size_t)(n) * sizeof(float), kind)
    tr->sup_rows = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->sup_tgt = (int32_t *)gm_arena_alloc(a, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->xs = F32(N * C, GM_MEM_WORKSPACE), tr->hs = F32(N * C, GM_MEM_WORKSPACE);
    tr->dhs = F32(N * C, GM_MEM_WORKSPACE), tr->rstd_s = F32(N, GM_MEM_WORKSPACE);
    int64_t rows = N < GM_LM_ROWS ? N : GM_LM_ROWS, vc = c->vocab_size < GM_LM_VOCAB ? c->vocab_size : GM_LM_VOCAB;
    tr->logits = F32(rows * vc, GM_MEM_TRANSIENT);
    tr->e_tgt = F32(rows * C, GM_MEM_WORKSPACE);
    tr->head_f32 = tr->w.global[GM_GLOBAL_LM_HEAD].type != GM_F32 && !bf16 ? F32(vc * C, GM_MEM_TRANSIENT) : NULL;
    tr->run_max = F32(N, GM_MEM_WORKSPACE), tr->run_sum = F32(N, GM_MEM_WORKSPACE);
    tr->tgt_logit = F32(N, GM_MEM_WORKSPACE), tr->lse = F32(N, GM_MEM_WORKSPACE);
    tr->sumsq = (double *)gm_arena_alloc(a, (size_t)tr->cap_params * sizeof(double), GM_MEM_WORKSPACE);
    tr->h_sumsq = (double *)gm_arena_alloc(h, (size_t)tr->cap_params * sizeof(double), GM_MEM_WORKSPACE);
#undef F32
    tr->h_rows = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->h_tgt = (int32_t *)gm_arena_alloc(h, (size_t)N * sizeof(int32_t), GM_MEM_WORKSPACE);
    tr->h_lse = (float *)gm_arena_alloc(h, (size_t)N * sizeof(float), GM_MEM_WORKSPACE);
    tr->h_tgt_logit = (float *)gm_arena_alloc(h, (size_t)N * sizeof(float), GM_MEM_WORKSPACE);
    tr->h_row_loss = (double *)gm_arena_alloc(h, (size_t)N * sizeof(double), GM_MEM_WORKSPACE);
    collect_params(tr);
    return GM_OK;
}

gm_status gm_train_opts_check(const gm_config *c, const gm_train_opts *o, gm_error *err) {
    GM_TRY(gm_lora_config_validate(&o->lora, c, err));
#define NEED(cond, ...)                                                                      \
    if (!(cond)) return gm_error_set(err, GM_ERR_INVALID, __VA_ARGS__)
    NEED(o->batch >= 1, "batch = %lld: must be >= 1", (long long)o->batch);
    NEED(o->max_length >= 2, "max_length = %lld: must be >= 2", (long long)o->max_length);
    NEED(o->max_length <= c->max_position_embeddings, "max_length = %lld: the model has %lld positions; use at most %lld",
         (long long)o->max_length, (long long)c->max_position_embeddings, (long long)c->max_position_embeddings);
    NEED(o->grad_accum >= 1, "gradient accumulation = %lld: must be >= 1", (long long)o->grad_accum);
    NEED(o->lr >= 0 && isfinite(o->lr), "lr = %g: must be >= 0", (double)o->lr);
    NEED(o->weight_decay >= 0, "weight_decay = %g: must be >= 0", (double)o->weight_decay);
    NEED(o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1, "AdamW betas must be in [0, 1)");
    NEED(o->eps > 0, "AdamW eps must be > 0");
    NEED(o->max_grad_norm >= 0, "max_grad_norm = %g: must be >= 0 (0 = no clipping)", (double)o->max_grad_norm);
    NEED(o->warmup_steps >= 0 && o->total_steps >= 1, "warmup must be >= 0 steps and total steps >= 1");
    NEED(o->n_threads >= 1, "threads must be >= 1");
#undef NEED
    /* the forward reads shared keys and values in training too; an architecture's backward must
     * send their gradients back to the source layer (Gemma 3n's does, and keeps them apart under
     * activation checkpointing, where one record serves every layer) */
    const gm_arch_def *ar = gm_arch_get(c->arch);
    for (int64_t l = 0; l < c->n_layers; l++) {
        if (c->kv_source[l] == l) continue;
        if (!ar || !ar->kv_sharing_bwd)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "training models with KV sharing between layers (layer %lld) is not "
                                "supported yet for %s", (long long)l, gm_arch_name(c->arch));
    }
    return GM_OK;
}

static void trainer_release(gm_trainer *tr) {
    gm_arena_free(&tr->arena);
    gm_arena_free(&tr->host);
    if (tr->has_vis) gm_vision_release(&tr->vis);
    if (tr->has_aud) gm_audio_encoder_release(&tr->aud);
    gm_mm_hard_free(&tr->hard);
    gm_graph_free(&tr->g);
    gm_lora_free(&tr->lora);
    gm_weights_free(&tr->w);
    gm_free(tr->params);
    tr->params = NULL;
}

gm_status gm_train_plan(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                        gm_train_plan_info *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    gm_trainer *tr = gm_calloc(1, sizeof *tr);
    if (!tr) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    tr->o = *o;
    gm_arena_init(&tr->arena, "training", GM_DEVICE_CPU);
    gm_arena_init(&tr->host, "training host", GM_DEVICE_CPU);
    /* the module names a loaded model of this config gets (gm_model.peft_prefix): a regular
     * expression over them (a model_adapter's targets) selects the same modules in the plan */
    gm_status s = setup(tr, cfg, cfg->vision.hidden_size > 0 ? GM_PEFT_PREFIX_MULTIMODAL : NULL, err);
    if (s == GM_OK && tr->has_aud) tr->aud.stored = stored;
    if (s == GM_OK) s = layout(tr, NULL, stored, stored_embed, err);
    if (s == GM_OK) {
        out->total = tr->arena.used + tr->host.used;
        out->host_bytes = tr->host.used;
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->by_kind[k] = tr->arena.by_kind[k] + tr->host.by_kind[k];
        out->alias_bytes = tr->w.alias_bytes + (tr->has_aud ? tr->aud.alias_bytes : 0);
        out->audio_alias_bytes = tr->has_aud ? tr->aud.alias_bytes : 0;
        memcpy(out->weight_bytes, tr->w.kind_bytes, sizeof out->weight_bytes);
        out->n_trainable = 0;
        for (int i = 0; i < tr->n_params; i++) out->n_trainable += tr->params[i].n;
        out->scratch_floats = tr->g.scratch_floats;
        out->cpu_bf16 = tr->g.kc.bf16_gemm;
        out->cpu_bf16_gemms = tr->g.kc.bf16_staging_elems > 0;
    }
    trainer_release(tr);
    gm_free(tr);
    return s;
}

/* PEFT's initial adapters (A uniform, B zero), zero gradients and moments, uploaded. */
static gm_status init_adapters(gm_trainer *tr, gm_error *err) {
    GM_TRY(gm_lora_init_train(&tr->lora, tr->be, err));
    if (tr->vis_trains) GM_TRY(gm_vision_init_params(&tr->vis, err));
    if (tr->has_aud && tr->aud.train_tower) GM_TRY(gm_audio_encoder_init_params(&tr->aud, err));
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_new_on(const gm_model *m, const gm_train_opts *o, gm_backend *be, gm_trainer **out, gm_error *err) {
    *out = NULL;
    const gm_config *c = &m->cfg;
    GM_TRY(gm_train_opts_check(c, o, err));
    gm_trainer *tr = gm_calloc(1, sizeof *tr);
    if (!tr) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    tr->m = m;
    tr->o = *o;
    gm_status s = GM_OK;
    if (be) tr->be = be;
    else s = gm_backend_cpu_new(o->n_threads, &tr->owned_be, err), tr->be = tr->owned_be;
    /* compute = "bf16" where the backend has no bf16 GEMMs (CUDA has; a CPU where native - asked
     * only here, so that an f32 run never loads oneDNN: kernels/cpu/gemm_bf16.c) */
    if (s == GM_OK && o->compute == GM_COMPUTE_BF16 &&
        !(tr->be->device == GM_DEVICE_CPU ? gm_k_cpu_bf16_native() : tr->be->device == GM_DEVICE_CUDA))
        s = gm_error_set(err, GM_ERR_UNSUPPORTED, "compute = \"bf16\": the %s backend computes in f32 only here (bf16 GEMMs run "
                         "on a GPU, or on a CPU with AVX512-BF16 / AMX and oneDNN)\n  hint: use compute = \"auto\" (bf16 "
                         "where native) or \"f32\"", tr->be->name);
    /* Gemma 3n's hard multimodal tokens (<end_of_audio>, ...): their embedders' tables */
    if (s == GM_OK && c->arch == GM_ARCH_GEMMA3N) s = gm_mm_hard_load(m, &tr->hard, err);
    if (s == GM_OK) s = setup(tr, c, m->peft_prefix, err);
    /* pass 1: measure; pass 2: allocate, re-encode / upload the base weights, hand out buffers
     * (the re-encoding releases each source tensor's mapped pages as it goes: the file's own
     * linear weights are not read again) */
    if (s == GM_OK) {
        gm_backend_arena(tr->be, &tr->arena, "training");
        gm_arena_init(&tr->host, "training host", GM_DEVICE_CPU);
        s = layout(tr, m, GM_F32, GM_F32, err);
    }
    if (s == GM_OK) s = gm_arena_commit(&tr->arena, err);
    if (s == GM_OK) s = gm_arena_commit(&tr->host, err);
    if (s == GM_OK) s = layout(tr, m, GM_F32, GM_F32, err);
    if (s == GM_OK) s = init_adapters(tr, err);
    if (s != GM_OK) {
        gm_trainer_free(tr);
        return s;
    }
    *out = tr;
    return GM_OK;
}

gm_status gm_trainer_new(const gm_model *m, const gm_train_opts *o, gm_trainer **out, gm_error *err) {
    return gm_trainer_new_on(m, o, NULL, out, err);
}

void gm_trainer_free(gm_trainer *tr) {
    if (!tr) return;
    gm_free(tr->dist_bufs), gm_free(tr->dist_n);
    trainer_release(tr);
    gm_backend_free(tr->owned_be);
    gm_free(tr);
}

gm_lora_adapter *gm_trainer_adapters(gm_trainer *tr, int *n) {
    *n = tr->lora.n;
    return tr->lora.ad;
}

const gm_lora *gm_trainer_lora(const gm_trainer *tr) { return &tr->lora; }
const gm_train_param *gm_trainer_params(const gm_trainer *tr, int *n) {
    *n = tr->n_params;
    return tr->params;
}
bool gm_trainer_trains_vision(const gm_trainer *tr) { return tr->vis_trains; }
int64_t gm_trainer_images_encoded(const gm_trainer *tr) { return tr->has_vis ? tr->vis.n_encoded : 0; }
int64_t gm_trainer_clips_encoded(const gm_trainer *tr) { return tr->has_aud ? tr->aud.n_encoded : 0; }
gm_backend *gm_trainer_backend(const gm_trainer *tr) { return tr->be; }
const gm_train_opts *gm_trainer_opts(const gm_trainer *tr) { return &tr->o; }
const gm_config *gm_trainer_config(const gm_trainer *tr) { return tr->cfg; }
int64_t gm_trainer_step_count(const gm_trainer *tr) { return tr->step; }
void gm_trainer_set_step(gm_trainer *tr, int64_t step) { tr->step = step; }
const gm_arena *gm_trainer_arena(const gm_trainer *tr) { return &tr->arena; }
size_t gm_trainer_host_bytes(const gm_trainer *tr) { return tr->host.capacity; }

void gm_trainer_read_adapter(gm_trainer *tr, int i, char which, float *dst) {
    const gm_lora_adapter *ad = &tr->lora.ad[i];
    int64_t r = tr->o.lora.rank;
    if (which == 'A') gm_backend_download(tr->be, dst, ad->A, (size_t)(r * ad->in) * sizeof(float));
    else gm_backend_download(tr->be, dst, ad->B, (size_t)(ad->out * r) * sizeof(float));
}

void gm_trainer_write_adapter(gm_trainer *tr, int i, char which, const float *src) {
    const gm_lora_adapter *ad = &tr->lora.ad[i];
    int64_t r = tr->o.lora.rank;
    if (which == 'A') gm_backend_upload(tr->be, ad->A, src, (size_t)(r * ad->in) * sizeof(float));
    else gm_backend_upload(tr->be, ad->B, src, (size_t)(ad->out * r) * sizeof(float));
    tr->media_kept = false;
}

void gm_trainer_write_param(gm_trainer *tr, int i, const float *src) {
    gm_backend_upload(tr->be, tr->params[i].p, src, (size_t)tr->params[i].n * sizeof(float));
    if (tr->vis_trains) gm_vision_params_updated(&tr->vis);
    tr->media_kept = false; /* an encoder's parameters may have changed */
}

void gm_trainer_zero_grad(gm_trainer *tr) {
    for (int i = 0; i < tr->n_params; i++)
        gm_backend_memset(tr->be, tr->params[i].d, 0, (size_t)tr->params[i].n * sizeof(float));
}

/* ---- loss --------------------------------------------------------------------------------- */

/* Chunked cross-entropy of the final residual X[L] at the n_sup supervised rows (tr->sup_rows,
 * uploaded). Returns the sum of token losses (per-row losses into row_loss when not NULL); with
 * want_grad, writes grad_scale * dL/dX[L] into the graph's residual gradient (zero on other
 * rows). With the gradient it is one pass over the vocabulary: each chunk's logits are computed
 * once, folded into the online log-sum-exp and multiplied back into dh as softmax weights
 * relative to the running max (kernels.h: xent_grad_update); transformers computes the full
 * logits once forward and once back, as this does, chunk by chunk. */
static double lm_loss(gm_trainer *tr, int64_t N, int64_t n_sup, bool want_grad, float grad_scale, double *row_loss) {
    const gm_config *c = tr->cfg;
    gm_graph *g = &tr->g;
    const gm_kernel_table *k = g->k;
    const gm_kctx *kc = &g->kc;
    int64_t C = c->hidden_size, V = c->vocab_size;
    float cap = c->final_logit_softcap;
    const gm_wview *E = &tr->w.global[GM_GLOBAL_LM_HEAD];
    gm_graph_hidden_rows(g, tr->xs, tr->sup_rows, n_sup);
    gm_graph_final_norm(g, tr->hs, tr->rstd_s, tr->xs, n_sup);
    double total = 0;
    for (int64_t r0 = 0; r0 < n_sup; r0 += GM_LM_ROWS) {
        int64_t R = n_sup - r0 < GM_LM_ROWS ? n_sup - r0 : GM_LM_ROWS;
        const int32_t *tg = tr->sup_tgt + r0;
        const float *h = tr->hs + r0 * C;
        float *dh = tr->dhs + r0 * C;
        k->fill(kc, tr->run_max, R, -INFINITY);
        k->fill(kc, tr->run_sum, R, 0.0f);
        for (int64_t v0 = 0; v0 < V; v0 += GM_LM_VOCAB) {
            int64_t vc = V - v0 < GM_LM_VOCAB ? V - v0 : GM_LM_VOCAB;
            if (!want_grad) {
                gm_graph_lm_head(g, tr->logits, h, R, v0, vc);
                k->xent_lse_update(kc, tr->run_max, tr->run_sum, tr->tgt_logit, tr->logits, tg, R, vc, v0, cap);
                continue;
            }
            gm_wview Ec = gm_wview_rows(E, v0, vc); /* dequantized once for both GEMMs where planned */
            if (tr->head_f32) {
                k->dequant_rows(kc, tr->head_f32, E, v0, vc);
                Ec = gm_wview_f32(tr->head_f32, vc, C);
            }
            k->matmul_fwd(kc, tr->logits, h, &Ec, R, 0.0f);
            k->xent_grad_update(kc, tr->run_max, tr->run_sum, tr->tgt_logit, tr->logits, dh, tg, R, vc, v0, C, cap);
            k->matmul_bwd_input(kc, dh, tr->logits, &Ec, R, 1.0f);
        }
        k->xent_lse_finish(kc, tr->lse, tr->run_max, tr->run_sum, R);
        gm_backend_download(tr->be, tr->h_lse, tr->lse, (size_t)R * sizeof(float));
        gm_backend_download(tr->be, tr->h_tgt_logit, tr->tgt_logit, (size_t)R * sizeof(float));
        for (int64_t i = 0; i < R; i++) {
            double li = (double)tr->h_lse[i] - (double)tr->h_tgt_logit[i];
            total += li;
            if (row_loss) row_loss[r0 + i] = li;
        }
        if (!want_grad) continue;
        /* the target's term; supervised rows' targets are >= 0 (forward_all) */
        k->embed_fwd(kc, tr->e_tgt, tg, E, R, 1.0f);
        k->xent_grad_finish(kc, dh, tr->e_tgt, tr->run_sum, tr->lse, tr->tgt_logit, tg, R, C, cap, grad_scale);
    }
    if (want_grad) {
        /* final norm backward on the gathered rows (in place), scattered into g (zero elsewhere) */
        k->rmsnorm_bwd(kc, tr->dhs, NULL, tr->dhs, tr->xs, (const float *)tr->w.global[GM_GLOBAL_FINAL_NORM].data,
                       tr->rstd_s, n_sup, C, 0.0f);
        /* an architecture with a head (Gemma 3n's AltUp streams) takes the (N, C) gradient back to
         * its residual stream; its head output buffer holds that gradient meanwhile */
        float *dst = g->arch->head_bwd ? g->head_out : g->g;
        k->fill(kc, dst, N * C, 0.0f);
        k->scatter_rows(kc, dst, tr->dhs, tr->sup_rows, n_sup, C);
        if (g->arch->head_bwd) g->arch->head_bwd(g, dst);
    }
    return total;
}

/* ---- steps -------------------------------------------------------------------------------- */

static gm_status check_batch(const gm_trainer *tr, const gm_batch *b, int64_t *n_sup, gm_error *err) {
    const gm_config *c = tr->cfg;
    if (b->B < 1 || b->B > tr->o.batch || b->T < 1 || b->T > tr->o.max_length)
        return gm_error_set(err, GM_ERR_INVALID, "batch of %lld x %lld tokens does not fit the plan (batch %lld, max_length %lld)",
                            (long long)b->B, (long long)b->T, (long long)tr->o.batch, (long long)tr->o.max_length);
    /* images: as many as the batch's soft-token runs say, within the plan */
    int64_t img_tokens = 0;
    int32_t img = c->vision.hidden_size > 0 ? c->vision.image_token_id : -1;
    for (int64_t i = 0; img >= 0 && i < b->B * b->T; i++) img_tokens += b->ids[i] == img;
    if (b->image_hw && img >= 0) { /* Gemma 4: image j's run is its grid's cells, in order */
        int64_t cell = c->vision.patch_size * c->vision.pool, j = 0;
        for (int64_t i = 0; i < b->B * b->T;) {
            if (b->ids[i] != img) {
                i++;
                continue;
            }
            int64_t end = i;
            while (end < b->B * b->T && b->ids[end] == img && (end == i || end % b->T != 0)) end++;
            int64_t want = j < b->n_images ? (b->image_hw[2 * j] / cell) * (b->image_hw[2 * j + 1] / cell) : -1;
            if (end - i != want)
                return gm_error_set(err, GM_ERR_INVALID, "batch's image run %lld has %lld tokens; its image (%lld of %lld) "
                                    "fills %lld", (long long)(j + 1), (long long)(end - i), (long long)(j + 1),
                                    (long long)b->n_images, (long long)want);
            j++, i = end;
        }
        if (j != b->n_images || !b->pixels)
            return gm_error_set(err, GM_ERR_INVALID, "batch has %lld image runs but %lld images", (long long)j,
                                (long long)b->n_images);
    } else if (img_tokens != b->n_images * (img >= 0 ? c->vision.tokens : 0) || (b->n_images > 0 && !b->pixels))
        return gm_error_set(err, GM_ERR_INVALID, "batch has %lld image tokens but %lld images (each fills %lld tokens)",
                            (long long)img_tokens, (long long)b->n_images, (long long)c->vision.tokens);
    if (b->n_images > (tr->has_vis ? tr->o.max_images : 0))
        return gm_error_set(err, GM_ERR_INVALID, "batch has %lld images; the run was planned for %lld per micro-batch",
                            (long long)b->n_images, (long long)(tr->has_vis ? tr->o.max_images : 0));
    /* audio: as many clips as the batch's soft-token runs say, within the plan */
    int32_t aud = gm_config_has_audio(c) ? c->audio.audio_token_id : -1;
    int64_t aud_tokens = 0;
    for (int64_t i = 0; aud >= 0 && i < b->B * b->T; i++) aud_tokens += b->ids[i] == aud;
    if (b->n_audio > 0 && (!b->audio_features || !b->audio_valid))
        return gm_error_set(err, GM_ERR_INVALID, "batch has %lld clips but no features", (long long)b->n_audio);
    if (aud >= 0 && c->arch == GM_ARCH_GEMMA4) {
        /* each clip fills one run of tokens, one per valid frame after the sub-sampling (frame 4 t
         * of its features: Gemma4Processor.replace_audio_token) */
        int64_t j = 0, T2 = 0;
        gm_audio_encoder_frames(&c->audio, b->audio_frames, &T2, NULL);
        for (int64_t i = 0; i < b->B * b->T;) {
            if (b->ids[i] != aud) {
                i++;
                continue;
            }
            int64_t end = i, want = -1;
            while (end < b->B * b->T && b->ids[end] == aud && (end == i || end % b->T != 0)) end++;
            if (j < b->n_audio) {
                want = 0;
                for (int64_t t = 0; t < T2; t++) want += b->audio_valid[j * b->audio_frames + 4 * t] != 0;
            }
            if (end - i != want)
                return gm_error_set(err, GM_ERR_INVALID, "batch's audio run %lld has %lld tokens; its clip (%lld of %lld) "
                                    "fills %lld", (long long)(j + 1), (long long)(end - i), (long long)(j + 1),
                                    (long long)b->n_audio, (long long)want);
            j++, i = end;
        }
        if (j != b->n_audio)
            return gm_error_set(err, GM_ERR_INVALID, "batch has %lld audio runs but %lld clips", (long long)j,
                                (long long)b->n_audio);
    } else if (aud_tokens != b->n_audio * (aud >= 0 ? c->audio.soft_tokens : 0)) {
        return gm_error_set(err, GM_ERR_INVALID, "batch has %lld audio tokens but %lld clips (each fills %lld tokens)",
                            (long long)aud_tokens, (long long)b->n_audio, (long long)c->audio.soft_tokens);
    }
    if (b->n_audio > (tr->has_aud ? tr->o.max_audio : 0) || (b->n_audio > 0 && b->audio_frames > tr->o.max_audio_frames))
        return gm_error_set(err, GM_ERR_INVALID, "batch has %lld clips of %lld frames; the run was planned for %lld of %lld "
                            "frames per micro-batch", (long long)b->n_audio, (long long)b->audio_frames,
                            (long long)(tr->has_aud ? tr->o.max_audio : 0), (long long)tr->o.max_audio_frames);
    *n_sup = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t here = 0;
        for (int64_t t = 0; t < b->T; t++) {
            int32_t id = b->ids[s * b->T + t], tg = b->targets[s * b->T + t];
            /* a soft token's id is never embedded, and no position learns to predict one (an image
             * in an answer is given, not generated: as Hugging Face recipes mask image tokens) */
            bool id_ok = id == img || (id >= 0 && id < c->vocab_size), tg_ok = tg == img || tg < c->vocab_size;
            if (tg == aud) tg = -1; /* nor to predict an audio soft token */
            if (!id_ok || !tg_ok)
                return gm_error_set(err, GM_ERR_INVALID, "example %lld: token id %d at position %lld is outside the vocabulary",
                                    (long long)(b->example_index ? b->example_index[s] : s), tg_ok ? id : tg, (long long)t);
            here += tg >= 0 && tg != img;
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

/* Forward of the whole stack on batch b (ids and positions uploaded), with the supervised-row
 * lists uploaded too; returns their count. */
static gm_status forward_all(gm_trainer *tr, const gm_batch *b, bool dropout, int64_t *n_sup_out, gm_error *err) {
    int64_t N = b->B * b->T, n_sup = 0;
    int32_t img = tr->cfg->vision.hidden_size > 0 ? tr->cfg->vision.image_token_id : -1;
    int32_t aud = gm_config_has_audio(tr->cfg) ? tr->cfg->audio.audio_token_id : -1;
    for (int64_t i = 0; i < N; i++)
        if (b->targets[i] >= 0 && b->targets[i] != img && b->targets[i] != aud) { /* as check_batch counts them */
            tr->h_rows[n_sup] = (int32_t)i;
            tr->h_tgt[n_sup++] = b->targets[i];
        }
    gm_backend_upload(tr->be, tr->sup_rows, tr->h_rows, (size_t)n_sup * sizeof(int32_t));
    gm_backend_upload(tr->be, tr->sup_tgt, tr->h_tgt, (size_t)n_sup * sizeof(int32_t));
    gm_graph *g = &tr->g;
    g->dropout = dropout;
    g->dropout_step = (uint64_t)tr->step;
    g->dropout_micro = (uint64_t)tr->micro;
    gm_graph_input in = {.B = b->B, .T = b->T, .ids = b->ids, .pos0 = 0};
    int64_t R = 0, n_run = 0;
    /* the encoders' soft tokens of the previous call, when its media were these and nothing has
     * trained since (generation); a training forward always encodes (its backward needs it) */
    bool reuse = b->same_media && tr->media_kept && !dropout;
    tr->media_kept = false;
    if (b->n_images > 0) { /* the images' soft tokens, and their tokens' attention ends */
        for (int64_t i = 0; i < N; i++) {
            tr->h_ids[i] = b->ids[i] == img ? 0 : b->ids[i]; /* replaced below, as Hugging Face does */
            if (b->ids[i] == img) tr->h_img_rows[R++] = (int32_t)i;
        }
        tr->vis.g.dropout = dropout;
        tr->vis.g.dropout_step = (uint64_t)tr->step;
        tr->vis.g.dropout_micro = (uint64_t)tr->micro;
        /* one tower pass per distinct image: label scoring repeats an example's image once per
         * candidate; a training step through a learning tower keeps every pass (its backward
         * runs per occurrence) */
        n_run = b->n_images;
        /* each image's pixels and size (packed when each has its own: Gemma 4) */
        const float *img_px[GM_VISION_MAX_IMAGES];
        int64_t img_hw[2 * GM_VISION_MAX_IMAGES];
        if (b->n_images > GM_VISION_MAX_IMAGES)
            return gm_error_set(err, GM_ERR_INVALID, "%lld images in one micro-batch: at most %d", (long long)b->n_images,
                                GM_VISION_MAX_IMAGES);
        for (int64_t j = 0, off = 0; j < b->n_images; j++) {
            int64_t h = b->image_hw ? b->image_hw[2 * j] : tr->vis.image_size, w = b->image_hw ? b->image_hw[2 * j + 1] : h;
            img_px[j] = b->pixels + off, img_hw[2 * j] = h, img_hw[2 * j + 1] = w, off += 3 * h * w;
        }
        if (reuse) {
            n_run = tr->kept_n_run;
        } else if (!(dropout && tr->vis_trains)) {
            n_run = 0;
            for (int64_t j = 0; j < b->n_images; j++) {
                int64_t u = -1;
                size_t px = (size_t)(3 * img_hw[2 * j] * img_hw[2 * j + 1]);
                for (int64_t k = 0; k < n_run && u < 0; k++) {
                    int64_t q = tr->h_uniq[k];
                    if (img_hw[2 * q] == img_hw[2 * j] && img_hw[2 * q + 1] == img_hw[2 * j + 1] &&
                        memcmp(img_px[q], img_px[j], px * sizeof(float)) == 0)
                        u = k;
                }
                if (u < 0) tr->h_uniq[u = n_run++] = j;
                tr->h_of[j] = u;
            }
        }
        if (!reuse && b->image_hw) { /* the distinct images, each at its own size */
            const float *run_px[GM_VISION_MAX_IMAGES];
            int64_t run_hw[2 * GM_VISION_MAX_IMAGES];
            for (int64_t k = 0; k < n_run; k++) {
                int64_t q = n_run < b->n_images ? tr->h_uniq[k] : k;
                run_px[k] = img_px[q], run_hw[2 * k] = img_hw[2 * q], run_hw[2 * k + 1] = img_hw[2 * q + 1];
            }
            GM_TRY(gm_vision_run_images(&tr->vis, run_px, run_hw, n_run, err));
        } else if (!reuse) {
            GM_TRY(gm_vision_run_some(&tr->vis, b->pixels, n_run < b->n_images ? tr->h_uniq : NULL, n_run, err));
        }
        tr->kept_n_run = n_run;
        gm_mm_kv_end(b->ids, b->B, b->T, img, 0, tr->h_kv_end);
        gm_backend_upload(tr->be, tr->img_rows, tr->h_img_rows, (size_t)R * sizeof(int32_t));
        in.ids = tr->h_ids;
        in.kv_end = tr->h_kv_end;
        in.late_rows = true; /* the soft tokens are scattered below, before the front */
    }
    if (tr->has_hard && tr->hard.n > 0) { /* Gemma 3n's hard multimodal tokens, from their embedders */
        in.ptr_embeds = tr->h_hard_ptr, in.ptr_rows = tr->h_hard_rows;
        in.n_ptr_embeds = gm_mm_hard_place(&tr->hard, b->ids, N, tr->h_hard_ptr, tr->h_hard_rows, N);
    }
    if (b->n_audio > 0) { /* the clips through the encoder; their soft tokens in order */
        tr->aud.g.dropout = dropout;
        tr->aud.g.dropout_step = (uint64_t)tr->step;
        tr->aud.g.dropout_micro = (uint64_t)tr->micro;
        if (!reuse)
            GM_TRY(gm_audio_encoder_run(&tr->aud, b->audio_features, b->audio_valid, b->n_audio, b->audio_frames, NULL, NULL,
                                        err));
        int64_t R2 = 0;
        for (int64_t i = 0; i < N; i++)
            if (b->ids[i] == aud) tr->h_aud_rows[R2++] = (int32_t)i;
        gm_backend_upload(tr->be, tr->aud_rows, tr->h_aud_rows, (size_t)R2 * sizeof(int32_t));
        in.dev_embeds = tr->aud.soft, in.dev_rows = tr->aud_rows, in.n_dev_embeds = R2;
    }
    GM_TRY(gm_graph_begin(g, &in, err));
    tr->media_kept = !dropout;
    int64_t C = tr->cfg->hidden_size;
    if (R > 0 && n_run == b->n_images) g->k->scatter_rows(&g->kc, g->X[0], tr->vis.head.out, tr->img_rows, R, C);
    for (int64_t j = 0, row = 0; R > 0 && n_run < b->n_images && j < b->n_images; j++) { /* image j's run of rows */
        int64_t u = tr->h_of[j], tok = tr->vis.soft_off[u + 1] - tr->vis.soft_off[u];
        g->k->scatter_rows(&g->kc, g->X[0], tr->vis.head.out + tr->vis.soft_off[u] * C, tr->img_rows + row, tok, C);
        row += tok;
    }
    if (in.late_rows) gm_graph_front(g);
    gm_graph_forward(g);
    *n_sup_out = n_sup;
    return GM_OK;
}

gm_status gm_trainer_forward_backward(gm_trainer *tr, const gm_batch *b, float grad_scale, double *loss_sum,
                                      gm_error *err) {
    int64_t n_sup;
    gm_graph *g = &tr->g;
    if (!g->arch->layer_bwd)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "training a %s model: its backward is not written yet (its forward "
                            "runs: generation, evaluation, label scoring)", gm_arch_name(tr->cfg->arch));
    GM_TRY(check_batch(tr, b, &n_sup, err));
    int64_t N = b->B * b->T;
    GM_TRY(forward_all(tr, b, true, &n_sup, err));
    *loss_sum = lm_loss(tr, N, n_sup, true, grad_scale, NULL);
    gm_graph_backward(g);
    if (tr->vis_trains && b->n_images > 0) {
        /* the soft tokens replaced rows of X[0] unscaled: their gradient is dL/dX[0] there */
        int64_t R = tr->vis.n_soft;
        g->k->gather_rows(&g->kc, tr->vis.dsoft, g->g, tr->img_rows, R, tr->cfg->hidden_size);
        gm_vision_backward(&tr->vis);
    }
    if (tr->has_aud && tr->aud.train_tower && b->n_audio > 0) {
        /* the clips' soft tokens, in the order they were placed: dL/d(input rows) there */
        int64_t R2 = tr->aud.n_soft; /* Gemma 3n: 188 a clip; Gemma 4: each clip's own */
        g->k->gather_rows(&g->kc, tr->aud.dsoft, g->g, tr->aud_rows, R2, tr->cfg->hidden_size);
        gm_audio_encoder_backward(&tr->aud);
    }
    tr->micro++;
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_eval(gm_trainer *tr, const gm_batch *b, double *loss_sum, int64_t *n_tokens, gm_error *err) {
    int64_t n_sup;
    GM_TRY(check_batch(tr, b, &n_sup, err));
    GM_TRY(forward_all(tr, b, false, &n_sup, err));
    *loss_sum = lm_loss(tr, b->B * b->T, n_sup, false, 0.0f, NULL);
    *n_tokens = n_sup;
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_score(gm_trainer *tr, const gm_batch *b, double *seq_logprob, gm_error *err) {
    int64_t n_sup;
    GM_TRY(check_batch(tr, b, &n_sup, err));
    GM_TRY(forward_all(tr, b, false, &n_sup, err));
    lm_loss(tr, b->B * b->T, n_sup, false, 0.0f, tr->h_row_loss);
    for (int64_t s = 0; s < b->B; s++) seq_logprob[s] = 0;
    for (int64_t i = 0; i < n_sup; i++) seq_logprob[tr->h_rows[i] / b->T] -= tr->h_row_loss[i];
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_logits(gm_trainer *tr, const gm_batch *b, const int64_t *rows, int64_t n_rows, float *out,
                            gm_error *err) {
    const gm_config *c = tr->cfg;
    gm_graph *g = &tr->g;
    int64_t V = c->vocab_size, N = b->B * b->T;
    if (b->B < 1 || b->B > tr->o.batch || b->T < 1 || b->T > tr->o.max_length)
        return gm_error_set(err, GM_ERR_INVALID, "batch of %lld x %lld tokens does not fit the plan (batch %lld, max_length %lld)",
                            (long long)b->B, (long long)b->T, (long long)tr->o.batch, (long long)tr->o.max_length);
    if (n_rows < 1 || n_rows > GM_LM_ROWS || n_rows > N)
        return gm_error_set(err, GM_ERR_INVALID, "logits of %lld rows: 1..%lld at a time", (long long)n_rows,
                            (long long)(N < GM_LM_ROWS ? N : GM_LM_ROWS));
    for (int64_t i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= N)
            return gm_error_set(err, GM_ERR_INVALID, "row %lld is outside the batch (%lld rows)", (long long)rows[i], (long long)N);
    int64_t n_sup;
    GM_TRY(forward_all(tr, b, false, &n_sup, err));
    for (int64_t i = 0; i < n_rows; i++) tr->h_rows[i] = (int32_t)rows[i];
    gm_backend_upload(tr->be, tr->sup_rows, tr->h_rows, (size_t)n_rows * sizeof(int32_t));
    gm_graph_hidden_rows(g, tr->xs, tr->sup_rows, n_rows);
    gm_graph_final_norm(g, tr->hs, tr->rstd_s, tr->xs, n_rows);
    for (int64_t v0 = 0; v0 < V; v0 += GM_LM_VOCAB) { /* chunk by chunk through the loss's logits block */
        int64_t vc = V - v0 < GM_LM_VOCAB ? V - v0 : GM_LM_VOCAB;
        gm_graph_lm_head(g, tr->logits, tr->hs, n_rows, v0, vc);
        if (c->final_logit_softcap > 0) g->k->softcap_fwd(&g->kc, tr->logits, tr->logits, n_rows * vc, c->final_logit_softcap);
        for (int64_t i = 0; i < n_rows; i++)
            gm_backend_download(tr->be, out + i * V + v0, tr->logits + i * vc, (size_t)vc * sizeof(float));
    }
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_choice_logits(gm_trainer *tr, const gm_batch *b, const int64_t *pos, const int32_t *cand,
                                   int64_t K, float *out, gm_error *err) {
    const gm_config *c = tr->cfg;
    gm_graph *g = &tr->g;
    int64_t C = c->hidden_size, N = tr->o.batch * tr->o.max_length;
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
    if (K > N || b->B * K > GM_LM_ROWS * GM_LM_VOCAB)
        return gm_error_set(err, GM_ERR_INVALID, "%lld candidates: at most batch x max_length = %lld", (long long)K, (long long)N);
    int64_t n_sup;
    GM_TRY(forward_all(tr, b, false, &n_sup, err)); /* checks the ids */
    /* the hidden state at pos[b] of each sequence, final-normed */
    for (int64_t s = 0; s < b->B; s++) tr->h_rows[s] = (int32_t)(s * b->T + pos[s]);
    gm_backend_upload(tr->be, tr->sup_rows, tr->h_rows, (size_t)b->B * sizeof(int32_t));
    gm_graph_hidden_rows(g, tr->xs, tr->sup_rows, b->B);
    gm_graph_final_norm(g, tr->hs, tr->rstd_s, tr->xs, b->B);
    /* the K candidate rows of the LM head, gathered (dequantized) like an embedding lookup */
    for (int64_t k = 0; k < K; k++) tr->h_tgt[k] = cand[k];
    gm_backend_upload(tr->be, tr->sup_tgt, tr->h_tgt, (size_t)K * sizeof(int32_t));
    g->k->embed_fwd(&g->kc, tr->dhs, tr->sup_tgt, &tr->w.global[GM_GLOBAL_LM_HEAD], K, 1.0f);
    gm_wview cv = gm_wview_f32(tr->dhs, K, C);
    g->k->matmul_fwd(&g->kc, tr->logits, tr->hs, &cv, b->B, 0.0f);
    if (c->final_logit_softcap > 0) g->k->softcap_fwd(&g->kc, tr->logits, tr->logits, b->B * K, c->final_logit_softcap);
    gm_backend_download(tr->be, out, tr->logits, (size_t)(b->B * K) * sizeof(float));
    return gm_backend_status(tr->be, err);
}

gm_status gm_trainer_set_dist(gm_trainer *tr, gm_dist *d, gm_error *err) {
    gm_free(tr->dist_bufs), gm_free(tr->dist_n);
    tr->dist = NULL, tr->dist_bufs = NULL, tr->dist_n = NULL, tr->n_dist_runs = 0;
    if (gm_dist_world_size(d) == 1) return GM_OK;
    if (!tr->be->host_visible) {
        /* device memory: NCCL must serve this backend (a one-float all-reduce says whether it does) */
        float *probe = tr->params[0].d;
        GM_TRY(gm_dist_allreduce_backend(d, tr->be, probe, 0, err));
    }
    tr->dist_bufs = gm_malloc((size_t)tr->n_params * sizeof *tr->dist_bufs);
    tr->dist_n = gm_malloc((size_t)tr->n_params * sizeof *tr->dist_n);
    if (!tr->dist_bufs || !tr->dist_n) {
        gm_free(tr->dist_bufs), gm_free(tr->dist_n);
        tr->dist_bufs = NULL, tr->dist_n = NULL;
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < tr->n_params; i++) {
        const gm_train_param *q = &tr->params[i];
        int k = tr->n_dist_runs;
        if (k > 0 && tr->dist_bufs[k - 1] + tr->dist_n[k - 1] == q->d) tr->dist_n[k - 1] += (size_t)q->n;
        else tr->dist_bufs[k] = q->d, tr->dist_n[k] = (size_t)q->n, tr->n_dist_runs++;
    }
    tr->dist = d;
    return GM_OK;
}

/* The step's router load statistics (gm_step_stats) from the graph's per-layer expert counts. */
static void router_load(const gm_trainer *tr, double *max_load, double *cv) {
    *max_load = *cv = 0.0;
    const int64_t *load = tr->g.moe_load;
    int64_t L = tr->cfg->n_layers, E = tr->cfg->n_experts;
    if (!load || E < 1) return;
    double cv_sum = 0.0;
    for (int64_t l = 0; l < L; l++) {
        double sum = 0.0, sq = 0.0, mx = 0.0;
        for (int64_t e = 0; e < E; e++) {
            double v = (double)load[l * E + e];
            sum += v, sq += v * v, mx = v > mx ? v : mx;
        }
        if (sum <= 0) continue;
        double mean = sum / (double)E, var = sq / (double)E - mean * mean;
        cv_sum += sqrt(var > 0 ? var : 0) / mean;
        if (mx / mean > *max_load) *max_load = mx / mean;
    }
    *cv = cv_sum / (double)L;
}

gm_status gm_trainer_step(gm_trainer *tr, const gm_batch *micro, int n_micro, gm_step_stats *st, gm_error *err) {
    /* Data parallel (tr->dist): this rank's micro-batches are the step's rank*A .. rank*A+A-1
     * (A = grad_accum), possibly none in a short last step. Every rank runs every collective
     * below whatever happened locally, so a rank that fails here makes the others fail the
     * same step instead of blocking in the next all-reduce. */
    bool dist = tr->dist != NULL;
    int64_t total = 0;
    tr->media_kept = false; /* the adapters change */
    gm_status local = GM_OK;
    for (int i = 0; i < n_micro; i++) {
        int64_t n;
        gm_status s = check_batch(tr, &micro[i], &n, err);
        if (s != GM_OK) {
            gm_error_prefix(err, "step %lld, micro-batch %d", (long long)tr->step + 1, i);
            if (!dist) return s;
            local = s;
            break;
        }
        total += n;
    }
    if (dist) { /* the supervised tokens of the whole step, and whether any rank refused its share */
        int64_t v[2] = {total, local != GM_OK};
        GM_TRY(gm_dist_allreduce_i64(tr->dist, v, 2, GM_DIST_SUM, err));
        if (local != GM_OK) return local;
        if (v[1] > 0)
            return gm_error_set(err, GM_ERR_INVALID, "step %lld: %lld other rank(s) refused their micro-batches (the "
                                "reason is in their messages)", (long long)tr->step + 1, (long long)v[1]);
        total = v[0];
    }
    if ((n_micro < 1 && !dist) || total == 0)
        return gm_error_set(err, GM_ERR_INVALID, "step %lld has no supervised token", (long long)tr->step + 1);
    gm_trainer_zero_grad(tr);
    if (tr->g.moe_load) memset(tr->g.moe_load, 0, (size_t)(tr->cfg->n_layers * tr->cfg->n_experts) * sizeof(int64_t));
    /* dropout keys: the micro-batch's index in the whole step, as in one process */
    tr->micro = dist ? (int64_t)gm_dist_rank(tr->dist) * tr->o.grad_accum : 0;
    double loss_sum = 0;
    for (int i = 0; i < n_micro && local == GM_OK; i++) {
        double ls = 0;
        local = gm_trainer_forward_backward(tr, &micro[i], (float)(1.0 / (double)total), &ls, err);
        loss_sum += ls;
    }
    if (!dist && local != GM_OK) return local;
    if (dist) { /* the loss of the whole step, whether any rank failed, then the gradients' sum */
        double v[2] = {loss_sum, local != GM_OK};
        GM_TRY(gm_dist_allreduce_f64(tr->dist, v, 2, GM_DIST_SUM, err));
        if (local != GM_OK) return local;
        if (v[1] > 0)
            return gm_error_set(err, GM_ERR_RUNTIME, "step %lld: %g other rank(s) failed in the forward / backward (the "
                                "reason is in their messages)", (long long)tr->step + 1, v[1]);
        loss_sum = v[0];
        GM_TRY(gm_dist_allreduce_many(tr->dist, tr->be, tr->dist_bufs, tr->dist_n, tr->n_dist_runs, NULL, err));
    }
    double loss = loss_sum / (double)total;
    if (!isfinite(loss))
        return gm_error_set(err, GM_ERR_NONFINITE, "step %lld: the loss is %g (non-finite); the adapters were not updated",
                            (long long)tr->step + 1, loss);
    /* gradient norm (and a non-finite check per tensor) */
    const gm_kctx *kc = &tr->g.kc;
    double sq = 0;
    for (int i = 0; i < tr->n_params; i++) tr->g.k->sumsq(kc, tr->sumsq + i, tr->params[i].d, tr->params[i].n);
    gm_backend_download(tr->be, tr->h_sumsq, tr->sumsq, (size_t)tr->n_params * sizeof(double));
    for (int i = 0; i < tr->n_params; i++) {
        if (!isfinite(tr->h_sumsq[i]))
            return gm_error_set(err, GM_ERR_NONFINITE, "step %lld: gradient of %s is non-finite; the adapters were not updated",
                                (long long)tr->step + 1, tr->params[i].name);
        sq += tr->h_sumsq[i];
    }
    double norm = sqrt(sq);
    if (tr->o.max_grad_norm > 0) {
        /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1 */
        double coef = (double)tr->o.max_grad_norm / (norm + 1e-6);
        if (coef < 1.0)
            for (int i = 0; i < tr->n_params; i++) tr->g.k->scale_fwd(kc, tr->params[i].d, tr->params[i].d, tr->params[i].n, (float)coef);
    }
    double lr = gm_train_lr_at(&tr->o, tr->step);
    int64_t t = tr->step + 1;
    double bc1 = 1.0 - pow((double)tr->o.beta1, (double)t), bc2 = 1.0 - pow((double)tr->o.beta2, (double)t);
    float decay = (float)(1.0 - lr * (double)tr->o.weight_decay), step_size = (float)(lr / bc1), bc2s = (float)sqrt(bc2);
    for (int i = 0; i < tr->n_params; i++) {
        const gm_train_param *q = &tr->params[i];
        tr->g.k->adamw(kc, q->p, q->d, q->m, q->v, q->n, tr->o.beta1, tr->o.beta2, tr->o.eps, q->decay ? decay : 1.0f,
                       step_size, bc2s);
    }
    if (tr->vis_trains) gm_vision_params_updated(&tr->vis);
    GM_TRY(gm_backend_status(tr->be, err));
    tr->step = t;
    if (st) {
        st->loss = loss;
        st->n_tokens = total;
        st->grad_norm = norm;
        st->lr = lr;
        st->step = t;
        router_load(tr, &st->router_max_load, &st->router_load_cv);
    }
    return GM_OK;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

/* The checkpoint's tensor list: each trained tensor with its two AdamW moments. On a
 * host-visible backend they point at the trainer's own buffers; otherwise at *stage, a host
 * block of 3 x the trained parameters (gm_free'd by the caller) that save fills by download
 * and load empties by upload. */
static gm_ckpt_tensor *ckpt_tensors(gm_trainer *tr, int *n, float **stage) {
    *stage = NULL;
    gm_ckpt_tensor *t = gm_calloc((size_t)tr->n_params + 1, sizeof *t);
    if (!t) return NULL;
    bool host = tr->be->host_visible;
    int64_t total = 0;
    for (int i = 0; i < tr->n_params; i++) total += tr->params[i].n;
    if (!host && !(*stage = gm_malloc((size_t)(3 * total) * sizeof(float)))) {
        gm_free(t);
        return NULL;
    }
    float *p = *stage;
    for (int i = 0; i < tr->n_params; i++) {
        const gm_train_param *q = &tr->params[i];
        float *d = q->p, *m = q->m, *v = q->v;
        if (!host) d = p, m = p + q->n, v = p + 2 * q->n, p += 3 * q->n;
        t[i] = (gm_ckpt_tensor){q->name, d, m, v, q->ndim, {q->shape[0], q->shape[1], 0, 0}};
    }
    *n = tr->n_params;
    return t;
}

/* Moves the staged values of each tensor of the list (data, m, v) across. */
static void ckpt_stage(gm_trainer *tr, const gm_ckpt_tensor *t, int n, bool to_host) {
    for (int j = 0; j < n; j++) {
        const gm_train_param *q = &tr->params[j];
        size_t bytes = (size_t)q->n * sizeof(float);
        float *dev[3] = {q->p, q->m, q->v};
        float *hst[3] = {t[j].data, t[j].m, t[j].v};
        for (int k = 0; k < 3; k++) {
            if (to_host) gm_backend_download(tr->be, hst[k], dev[k], bytes);
            else gm_backend_upload(tr->be, dev[k], hst[k], bytes);
        }
    }
}

gm_status gm_trainer_save(gm_trainer *tr, const char *path, int64_t epoch, int64_t data_pos, double loss,
                          const char *config_json, gm_error *err) {
    int n;
    float *stage;
    gm_ckpt_tensor *t = ckpt_tensors(tr, &n, &stage);
    if (!t) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (stage) ckpt_stage(tr, t, n, true);
    gm_ckpt c = {.step = tr->step, .epoch = epoch, .data_pos = data_pos, .rng_seed = tr->o.lora.seed,
                 .rng_counter = (uint64_t)tr->step, .loss = loss, .config_json = config_json,
                 .lora_alpha = tr->o.lora.alpha, .lora_rslora = tr->o.lora.rslora, .n_tensors = n, .tensors = t};
    gm_status s = gm_backend_status(tr->be, err);
    if (s == GM_OK) s = gm_ckpt_save(path, &c, err);
    gm_free(stage);
    gm_free(t);
    return s;
}

gm_status gm_trainer_load(gm_trainer *tr, const char *path, int64_t *epoch, int64_t *data_pos, gm_error *err) {
    int n;
    float *stage;
    gm_ckpt_tensor *t = ckpt_tensors(tr, &n, &stage);
    if (!t) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_ckpt c = {.n_tensors = n, .tensors = t};
    tr->media_kept = false;
    gm_status s = gm_ckpt_load(path, &c, err);
    if (s == GM_OK && c.rng_seed != tr->o.lora.seed)
        s = gm_error_set(err, GM_ERR_INVALID, "%s: checkpoint was made with seed %llu, this run uses seed %llu", path,
                         (unsigned long long)c.rng_seed, (unsigned long long)tr->o.lora.seed);
    if (s == GM_OK && stage) ckpt_stage(tr, t, n, false);
    gm_free(stage);
    gm_free(t);
    if (s != GM_OK) return s;
    if (tr->vis_trains) gm_vision_params_updated(&tr->vis);
    GM_TRY(gm_backend_status(tr->be, err));
    tr->step = c.step;
    if (epoch) *epoch = c.epoch;
    if (data_pos) *data_pos = c.data_pos;
    return GM_OK;
}
