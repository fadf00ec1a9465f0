/*
 * gm_adapter.c - reading a trained adapter from a trial file, a results folder, a merged results
 * file or a checkpoint (see gm_adapter.h).
 */
#include "gm_adapter.h"

#include "gm_alloc.h"
#include "gm_audio_encoder.h"
#include "gm_file.h"
#include "gm_gguf.h"
#include "gm_h5.h"
#include "gm_mmap.h"
#include "gm_safetensors.h"
#include "gm_train.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define PEFT_PREFIX "base_model.model."
#define A_SUFFIX ".lora_A.weight"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool all_digits(const char *s) {
    if (!*s) return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return false;
    return true;
}

/* Does group `group` of f hold LoRA tensors (a failed or interrupted trial keeps an empty
 * /adapter group)? */
static bool has_lora(gm_h5_file *f, const char *group) {
    if (!gm_h5_exists(f, group)) return false;
    gm_h5_child *ch = NULL;
    int n = 0;
    if (gm_h5_list(f, group, &ch, &n, NULL) != GM_OK) return false;
    bool any = false;
    for (int i = 0; i < n && !any; i++) any = ch[i].kind == GM_H5_DATASET && ends_with(ch[i].name, A_SUFFIX);
    gm_h5_list_free(ch, n);
    return any;
}

/* ---- choosing a trial ----------------------------------------------------------------------- */

/* One trial a folder or a merged file holds. */
typedef struct cand {
    int64_t index;
    char id[64], status[24];
    bool has_adapter;
    char where[4096];   /* its trial file (folder) or its group (merged file) */
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* "1 (9ce98632d53c, completed), 2 (..., failed, no adapter), ..." of cands[0..n) */
static void listing(const cand *c, int n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++) {
        int w = snprintf(buf + k, cap - k, "%s%lld (%s, %s%s)", i ? ", " : "", (long long)c[i].index, c[i].id, c[i].status,
                         c[i].has_adapter ? "" : ", no adapter");
        if (w > 0) k += (size_t)w;
    }
}

/* Picks the candidate `trial` names (see gm_adapter.h): its index, or its id or an unambiguous
 * prefix of it (any case); without `trial`, the only one with an adapter. `label` names the
 * folder or file in messages. */
static gm_status choose(cand *c, int n, const char *trial, const char *label, int *pick, gm_error *err) {
    char list[1024];
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    listing(c, n, list, sizeof list);
    if (n == 0) return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trials in it", label);
    int hits[64], nh = 0;
    if (!trial || !*trial) {
        for (int i = 0; i < n && nh < 64; i++)
            if (c[i].has_adapter) hits[nh++] = i;
        if (nh == 1) return *pick = hits[0], GM_OK;
        if (nh == 0) return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial has an adapter (a trial stores it when it completes); "
                                         "trials: %s", label, list);
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: several trials have an adapter; choose one with --trial (its index or id): %s",
                            label, list);
    }
    if (all_digits(trial)) /* an index, as `gemmarun x.lua --trial N` takes */
        for (int i = 0; i < n && nh < 64; i++)
            if (c[i].index == strtoll(trial, NULL, 10)) hits[nh++] = i;
    if (nh > 1)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: several trials have index %s (the experiment's sweep changed between "
                            "runs); give the id instead: %s", label, trial, list);
    /* an id, or a prefix of one (a short number is an index only: "--trial 9" never means the
     * id 9c12cfed1d88) */
    if (nh == 0 && !(all_digits(trial) && strlen(trial) < 4)) {
        size_t k = strlen(trial);
        for (int i = 0; i < n && nh < 64; i++)
            if (strncasecmp(c[i].id, trial, k) == 0) hits[nh++] = i;
        if (nh > 1)
            return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: '%s' is the start of %d trial ids; give more of the id: %s", label, trial,
                                nh, list);
    }
    if (nh == 0) return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial %s (by index or id); trials: %s", label, trial, list);
    const cand *t = &c[hits[0]];
    if (!t->has_adapter)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: trial %lld (%s) is %s and has no adapter (a trial stores it when it "
                            "completes; its checkpoint trial-%s.ckpt.h5 in the results folder holds the latest one, while it is kept)",
                            label, (long long)t->index, t->id, t->status, t->id);
    *pick = hits[0];
    return GM_OK;
}

/* The trial files of results folder `dir` as candidates (*out gm_malloc'd). */
static gm_status folder_trials(const char *dir, cand **out, int *n_out, gm_error *err) {
    *out = NULL, *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return gm_error_set(err, GM_ERR_IO, "%s: cannot open the folder", dir);
    int n = 0, cap = 16;
    cand *c = gm_malloc((size_t)cap * sizeof *c);
    struct dirent *e;
    while (c && (e = readdir(d))) {
        const char *name = e->d_name;
        /* trial-<id>.h5 only: not checkpoints (trial-<id>.ckpt.h5) nor saves in flight */
        if (strncmp(name, "trial-", 6) != 0 || !ends_with(name, ".h5") || strchr(name + 6, '.') != name + strlen(name) - 3)
            continue;
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p) continue;
        gm_h5_file *f = NULL;
        if (gm_h5_open(p, false, &f, NULL) != GM_OK) continue;
        if (n == cap) {
            cand *g = gm_realloc(c, (size_t)(cap *= 2) * sizeof *c);
            if (!g) break;
            c = g;
        }
        cand *t = &c[n++];
        memset(t, 0, sizeof *t);
        char *id = NULL, *status = NULL;
        gm_h5_attr_get_str(f, "/", "trial_id", &id, NULL);
        gm_h5_attr_get_str(f, "/", "status", &status, NULL);
        gm_h5_attr_get_i64(f, "/", "trial_index", &t->index, NULL);
        snprintf(t->id, sizeof t->id, "%s", id ? id : "?");
        snprintf(t->status, sizeof t->status, "%s", status ? status : "?");
        t->has_adapter = has_lora(f, "/adapter");
        snprintf(t->where, sizeof t->where, "%s", p);
        gm_free(id), gm_free(status);
        gm_h5_close(&f, NULL);
    }
    closedir(d);
    if (!c) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (n == 0) {
        gm_free(c);
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial files (trial-<id>.h5) in this folder", dir);
    }
    *out = c, *n_out = n;
    return GM_OK;
}

/* The trials of a merged results file as candidates (groups /trial/trial-<id>). */
static gm_status merged_trials(gm_h5_file *f, cand **out, int *n_out, gm_error *err) {
    *out = NULL, *n_out = 0;
    gm_h5_child *ch = NULL;
    int n = 0;
    GM_TRY(gm_h5_list(f, "/trial", &ch, &n, err));
    cand *c = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *c);
    if (!c) {
        gm_h5_list_free(ch, n);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        cand *t = &c[i];
        snprintf(t->where, sizeof t->where, "/trial/%s", ch[i].name);
        snprintf(t->id, sizeof t->id, "%s", strncmp(ch[i].name, "trial-", 6) == 0 ? ch[i].name + 6 : ch[i].name);
        char *status = NULL;
        gm_h5_attr_get_i64(f, t->where, "trial_index", &t->index, NULL);
        gm_h5_attr_get_str(f, t->where, "status", &status, NULL);
        snprintf(t->status, sizeof t->status, "%s", status ? status : "?");
        gm_free(status);
        char ag[4200];
        snprintf(ag, sizeof ag, "%s/adapter", t->where);
        t->has_adapter = has_lora(f, ag);
    }
    gm_h5_list_free(ch, n);
    *out = c, *n_out = n;
    return GM_OK;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* LoRA alpha and rsLoRA: the trainer's own attributes lora_alpha / lora_rslora when the file has
 * them (checkpoints), else the stored configuration (the runner's trial config). */
static gm_status scaling_of(gm_h5_file *f, const char *obj, const char *config_json, const char *where, gm_lora_config *lc,
                            gm_error *err) {
    double alpha_attr = 0;
    int64_t rs_attr = 0;
    if (gm_h5_attr_get_f64(f, obj, "lora_alpha", &alpha_attr, NULL) == GM_OK && alpha_attr > 0) {
        gm_h5_attr_get_i64(f, obj, "lora_rslora", &rs_attr, NULL);
        lc->alpha = (float)alpha_attr;
        lc->rslora = rs_attr != 0;
        return GM_OK;
    }
    cJSON *j = config_json ? cJSON_Parse(config_json) : NULL;
    const cJSON *alpha = j ? cJSON_GetObjectItemCaseSensitive(j, "alpha") : NULL;
    const cJSON *rs = j ? cJSON_GetObjectItemCaseSensitive(j, "rslora") : NULL;
    gm_status s = GM_OK;
    if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0))
        s = gm_error_set(err, GM_ERR_FORMAT,
                         "%s: neither the file nor its stored configuration gives the LoRA alpha, so the adapter's "
                         "scaling is unknown\n  hint: it was saved by an older gemmarun without its configuration; "
                         "trainer:save(path) now stores the alpha", where);
    else lc->alpha = (float)alpha->valuedouble;
    lc->rslora = cJSON_IsTrue(rs);
    cJSON_Delete(j);
    return s;
}

/* The file key (PEFT key without ".lora_A.weight") of adapter module `module` among keys[n]:
 * the one with the same "<layer word>N.<module>" tail (gm_lora_layer_word of its architecture). */
static const char *file_key(const gm_arch_def *arch, const char *module, char (*keys)[192], int n) {
    const char *word = gm_lora_layer_word(arch), *tail = strstr(module, word);
    for (int i = 0; i < n; i++) {
        const char *t = strstr(keys[i], word);
        if (t && tail && strcmp(t, tail) == 0) return keys[i];
    }
    return NULL;
}

/* Fetches adapter tensor `name` (a PEFT key: "<module>.lora_A.weight", a projector's weight) of
 * the given shape (ndim 1 or 2) as f32 into dst. */
typedef gm_status (*fetch_fn)(void *ctx, const char *name, int ndim, const int64_t *shape, float *dst, gm_error *err);

/* A NaN or infinity in an adapter tensor is the adapter's fault: say so before any forward. */
static gm_status check_finite(const float *x, int64_t n, const char *source, const char *name, gm_error *err) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return gm_error_set(err, GM_ERR_FORMAT, "%s: tensor %s holds a non-finite value (%g at element %lld): the "
                                "adapter is corrupt or its training diverged", source, name, (double)x[i], (long long)i);
    return GM_OK;
}

/* The adapters of one part of the model (the text decoder's, or the vision tower's): modules[n]
 * (file keys keys[n]) on the part's architecture and config, named under `prefix`. */
typedef struct mod_set {
    gm_lora *lo;
    const gm_arch_def *arch;
    const gm_config *cfg;
    const char *prefix;
    const char **modules;
    char (*keys)[192];
    int n;
} mod_set;

/* What of the image path an adapter trained, for messages. */
static const char *image_parts(int tower_modules, bool projector) {
    return tower_modules > 0 && projector ? "LoRA on the vision tower and the projector"
           : tower_modules > 0            ? "LoRA on the vision tower"
                                          : "the projector";
}

/* The projector's trained tensors (PEFT's modules_to_save keys) in gm_adapter.vision's order. */
static const char *const proj_names[2] = {GM_VISION_PROJECTOR_PREFIX "mm_input_projection_weight",
                                          GM_VISION_PROJECTOR_PREFIX "mm_soft_emb_norm.weight"};

/* The buffers of a's adapters and projector (the arena protocol: measure, commit, hand out). */
static void adapter_layout(gm_adapter *a, const gm_model *m) {
    gm_lora_layout(&a->lora, &a->arena, false);
    gm_lora_layout(&a->vision_lora, &a->arena, false);
    gm_lora_layout(&a->audio_lora, &a->arena, false);
    if (a->has_proj) {
        int64_t C = m->vision->cfg.hidden_size, Ct = m->vision->cfg.vision.out_hidden_size;
        a->proj_C = C, a->proj_C_text = Ct;
        a->vision.proj_w = (float *)gm_arena_alloc(&a->arena, (size_t)(C * Ct) * sizeof(float), GM_MEM_ADAPTERS);
        a->vision.proj_norm_w = (float *)gm_arena_alloc(&a->arena, (size_t)C * sizeof(float), GM_MEM_ADAPTERS);
    }
}

/* Fills one tensor of `shape` through host staging (`stage` holds it). */
static gm_status fill_one(gm_backend *be, fetch_fn fetch, void *ctx, const char *source, const char *name, int ndim,
                          const int64_t *shape, float *stage, float *dst, gm_error *err) {
    int64_t n = shape[0] * (ndim > 1 ? shape[1] : 1);
    GM_TRY(fetch(ctx, name, ndim, shape, stage, err));
    GM_TRY(check_finite(stage, n, source, name, err));
    gm_backend_upload(be, dst, stage, (size_t)n * sizeof(float));
    return GM_OK;
}

/* Describes the adapters of sets[ns] with lc's rank and scaling (and a's projector when
 * a->has_proj), lays out and commits their buffers on be, and fills them through fetch. */
static gm_status load_modules(const gm_model *m, gm_backend *be, const gm_lora_config *lc, const mod_set *sets, int ns,
                              fetch_fn fetch, void *ctx, gm_adapter *a, gm_error *err) {
    gm_status s = GM_OK;
    for (int k = 0; k < ns && s == GM_OK; k++) {
        const mod_set *ms = &sets[k];
        if (ms->n == 0) continue;
        s = gm_lora_describe_modules(ms->lo, lc, ms->arch, ms->cfg, ms->prefix, ms->modules, ms->n, err);
        if (s == GM_OK && ms->lo->n != ms->n)
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: %d adapter modules listed, %d distinct", a->source, ms->n, ms->lo->n);
    }
    if (s == GM_OK) { /* buffers on the backend */
        gm_backend_arena(be, &a->arena, "adapter");
        adapter_layout(a, m);
        s = gm_arena_commit(&a->arena, err);
    }
    int64_t io_max = 1, rank = lc->rank;
    if (s == GM_OK) {
        adapter_layout(a, m);
        for (int k = 0; k < ns; k++)
            for (int i = 0; i < sets[k].lo->n; i++) {
                io_max = sets[k].lo->ad[i].in > io_max ? sets[k].lo->ad[i].in : io_max;
                io_max = sets[k].lo->ad[i].out > io_max ? sets[k].lo->ad[i].out : io_max;
            }
    }
    int64_t C = a->has_proj ? m->vision->cfg.hidden_size : 0, Ct = a->has_proj ? m->vision->cfg.vision.out_hidden_size : 0;
    size_t cap = (size_t)(rank * io_max) > (size_t)(C * Ct) ? (size_t)(rank * io_max) : (size_t)(C * Ct);
    float *stage = s == GM_OK ? gm_malloc(cap * sizeof(float)) : NULL;
    if (s == GM_OK && !stage) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* each tensor through host staging; the fetch checks the shapes this model needs */
    for (int k = 0; k < ns && s == GM_OK; k++)
        for (int i = 0; i < sets[k].lo->n && s == GM_OK; i++) {
            gm_lora_adapter *ad = &sets[k].lo->ad[i];
            const char *key = file_key(sets[k].arch, ad->module, sets[k].keys, sets[k].n);
            char name[400];
            int64_t shA[2] = {rank, ad->in}, shB[2] = {ad->out, rank};
            snprintf(name, sizeof name, "%s.lora_A.weight", key);
            s = fill_one(be, fetch, ctx, a->source, name, 2, shA, stage, ad->A, err);
            snprintf(name, sizeof name, "%s.lora_B.weight", key);
            if (s == GM_OK) s = fill_one(be, fetch, ctx, a->source, name, 2, shB, stage, ad->B, err);
            if (s != GM_OK) gm_error_prefix(err, "adapter of %s", ad->module);
        }
    if (s == GM_OK && a->has_proj) {
        int64_t shP[2] = {C, Ct}, shN[1] = {C};
        s = fill_one(be, fetch, ctx, a->source, proj_names[0], 2, shP, stage, (float *)a->vision.proj_w, err);
        if (s == GM_OK) s = fill_one(be, fetch, ctx, a->source, proj_names[1], 1, shN, stage, (float *)a->vision.proj_norm_w, err);
    }
    gm_free(stage);
    if (s == GM_OK && a->vision_lora.n > 0) a->vision.tower = &a->vision_lora;
    if (s == GM_OK) s = gm_backend_status(be, err);
    return s;
}

typedef struct h5_src {
    gm_h5_file *f;
    const char *group;
} h5_src;

static gm_status h5_fetch(void *ctx, const char *name, int ndim, const int64_t *shape, float *dst, gm_error *err) {
    const h5_src *h = ctx;
    char ds[400];
    snprintf(ds, sizeof ds, "%s/%s", h->group, name);
    gm_dtype dt;
    int nd = 0;
    int64_t sh[GM_H5_MAX_DIMS];
    if (gm_h5_dataset_info(h->f, ds, &dt, &nd, sh, NULL) == GM_OK &&
        (nd != ndim || sh[0] != shape[0] || (ndim > 1 && sh[1] != shape[1])))
        return gm_error_set(err, GM_ERR_INVALID, "%s: %s is %lld x %lld; this model needs %lld x %lld (an adapter for another base "
                            "model?)", gm_h5_path(h->f), ds, (long long)sh[0], (long long)(nd > 1 ? sh[1] : 1),
                            (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 1));
    return gm_h5_read(h->f, ds, GM_F32, ndim, shape, dst, err);
}

/* The audio encoder's set of adapters (ms: its modules) on model m: its architecture and the
 * conformer's config (into a->audio_cfg); GM_ERR_INVALID naming `source` when m has no audio
 * encoder. */
static gm_status audio_set(const gm_model *m, gm_adapter *a, mod_set *ms, const char *source, gm_error *err) {
    if (!gm_config_has_audio(&m->cfg))
        return gm_error_set(err, GM_ERR_INVALID, "%s trained the audio encoder (LoRA on %d of its modules, e.g. %s), which this "
                            "model lacks: %s has no audio encoder\n  hint: use the checkpoint the adapter was "
                            "trained on", source, ms->n, ms->modules[0], m->path);
    GM_TRY(gm_config_audio_tower(&m->cfg, &a->audio_cfg, err));
    ms->arch = gm_arch_get(a->audio_cfg.arch); /* Gemma 3n's conformer or Gemma 4's audio tower */
    ms->cfg = &a->audio_cfg;
    return GM_OK;
}

/* Reads the adapter group `group` of open file f (config from attribute config_json of
 * `config_obj`) into a: the text decoder's adapters and, when the run trained the image path, the
 * tower's adapters ("...vision_tower..." keys, the text adapters' rank and scaling, as the trainer
 * gives them) and the projector ("...multi_modal_projector..." keys). */
static gm_status read_adapter(const gm_model *m, gm_backend *be, gm_h5_file *f, const char *group, const char *config_obj,
                              gm_adapter *a, gm_error *err) {
    const char *path = gm_h5_path(f);
    gm_h5_child *ch = NULL;
    int n = 0;
    GM_TRY(gm_h5_list(f, group, &ch, &n, err));
    size_t cap = (size_t)(n > 0 ? n : 1);
    const char **modules = gm_calloc(3 * cap, sizeof *modules);
    char (*keys)[192] = gm_calloc(3 * cap, sizeof *keys);
    gm_status s = modules && keys ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* [0] the text decoder's modules, [1] the vision tower's (the same "layers.N.<module>" tails:
     * kept apart) */
    mod_set sets[3] = {{&a->lora, m->arch, &m->cfg, m->peft_prefix, modules, keys, 0},
                       {&a->vision_lora, NULL, NULL, GM_VISION_TOWER_PREFIX, modules + cap, keys + cap, 0},
                       {&a->audio_lora, NULL, NULL, GM_AUDIO_TOWER_PREFIX, modules + 2 * cap, keys + 2 * cap, 0}};
    int proj_seen[2] = {0, 0};
    int64_t rank = 0;
    /* the modules: every "<key>.lora_A.weight" (module = key without PEFT's "base_model.model.") */
    for (int i = 0; i < n && s == GM_OK; i++) {
        const char *name = ch[i].name;
        if (ch[i].kind != GM_H5_DATASET) continue;
        if (strstr(name, "multi_modal_projector.")) { /* the projector, trained fully */
            int k = strcmp(name, proj_names[0]) == 0 ? 0 : strcmp(name, proj_names[1]) == 0 ? 1 : -1;
            if (k < 0)
                s = gm_error_set(err, GM_ERR_FORMAT, "%s: %s/%s is not one of the projector's trained tensors (%s, %s)", path,
                                 group, name, proj_names[0], proj_names[1]);
            else proj_seen[k] = 1;
            continue;
        }
        if (!ends_with(name, A_SUFFIX)) continue;
        mod_set *ms = &sets[strstr(name, "vision_tower.") ? 1 : strstr(name, "audio_tower.") ? 2 : 0];
        snprintf(ms->keys[ms->n], sizeof ms->keys[0], "%.*s", (int)(strlen(name) - strlen(A_SUFFIX)), name);
        const char *key = ms->keys[ms->n];
        ms->modules[ms->n] = strncmp(key, PEFT_PREFIX, strlen(PEFT_PREFIX)) == 0 ? key + strlen(PEFT_PREFIX) : key;
        char ds[400];
        snprintf(ds, sizeof ds, "%s/%s", group, name);
        gm_dtype dt;
        int nd;
        int64_t sh[GM_H5_MAX_DIMS];
        s = gm_h5_dataset_info(f, ds, &dt, &nd, sh, err);
        if (s == GM_OK && (nd != 2 || sh[0] < 1 || (rank && sh[0] != rank)))
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: %s is not a (rank, in_features) matrix of the adapter's rank %lld", path, ds,
                             (long long)rank);
        if (s == GM_OK) rank = sh[0];
        ms->n++;
    }
    gm_h5_list_free(ch, n);
    a->has_proj = proj_seen[0] && proj_seen[1];
    if (s == GM_OK && proj_seen[0] != proj_seen[1])
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: %s holds %s but not %s (the projector trains both)", path, group,
                         proj_names[proj_seen[0] ? 0 : 1], proj_names[proj_seen[0] ? 1 : 0]);
    if (s == GM_OK && (sets[1].n > 0 || a->has_proj) && !m->vision)
        s = gm_error_set(err, GM_ERR_INVALID, "%s: %s trained the image path (%s), which this model lacks: %s has no vision "
                         "tower\n  hint: use the multimodal checkpoint the adapter was trained on", path, group,
                         image_parts(sets[1].n, a->has_proj), m->path);
    if (s == GM_OK && sets[2].n > 0) s = audio_set(m, a, &sets[2], path, err);
    if (s == GM_OK && sets[0].n + sets[1].n + sets[2].n == 0)
        s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: %s holds no LoRA tensors (*%s)", path, group, A_SUFFIX);
    if (s == GM_OK && m->vision) sets[1].arch = m->vision->arch, sets[1].cfg = &m->vision->cfg;
    gm_lora_config lc = gm_lora_config_default();
    lc.rank = (int)rank;
    char *cfg = NULL;
    if (s == GM_OK && gm_h5_attr_get_str(f, config_obj, "config_json", &cfg, err) != GM_OK) cfg = NULL;
    if (s == GM_OK) s = scaling_of(f, config_obj, cfg, path, &lc, err);
    gm_free(cfg);
    h5_src src = {f, group};
    if (s == GM_OK) s = load_modules(m, be, &lc, sets, 3, h5_fetch, &src, a, err);
    gm_free(modules), gm_free(keys);
    return s;
}

/* ---- PEFT adapter folders ------------------------------------------------------------------ */

#define PEFT_CONFIG "adapter_config.json"
#define PEFT_WEIGHTS "adapter_model.safetensors"

/* dir + "/" + name into out[cap]; GM_ERR_INVALID when it does not fit (never a cut path). */
static gm_status join_path(char *out, size_t cap, const char *dir, const char *name, gm_error *err) {
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap)
        return gm_error_set(err, GM_ERR_INVALID, "path too long (%zu bytes at most): %s/%s", cap - 1, dir, name);
    return GM_OK;
}

static bool has_file(const char *dir, const char *name) {
    char p[4096];
    struct stat st;
    return join_path(p, sizeof p, dir, name, NULL) == GM_OK && stat(p, &st) == 0;
}

static bool is_peft_dir(const char *path) { return is_dir(path) && has_file(path, PEFT_CONFIG); }

typedef struct st_src {
    const gm_safetensors *st;
    const char *file;
} st_src;

static gm_status st_fetch(void *ctx, const char *name, int ndim, const int64_t *shape, float *dst, gm_error *err) {
    const st_src *h = ctx;
    const gm_st_tensor *t = gm_safetensors_find(h->st, name);
    if (!t) return gm_error_set(err, GM_ERR_INVALID, "%s: missing tensor '%s'", h->file, name);
    if (t->ndim != ndim)
        return gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' has %d dimensions, not %d", h->file, name, t->ndim, ndim);
    if (t->shape[0] != shape[0] || (ndim > 1 && t->shape[1] != shape[1]))
        return gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' is %lld x %lld; this model needs %lld x %lld%s", h->file, name,
                            (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1), (long long)shape[0],
                            (long long)(ndim > 1 ? shape[1] : 1),
                            ends_with(name, A_SUFFIX) && t->shape[0] != shape[0] ? " (a rank other than the config's r)"
                                                                                : " (an adapter for another base model?)");
    int64_t n = shape[0] * (ndim > 1 ? shape[1] : 1);
    if (t->dtype == GM_F32) memcpy(dst, t->data, (size_t)n * sizeof(float));
    else if (t->dtype == GM_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = gm_bf16_to_f32(((const uint16_t *)t->data)[i]);
    else if (t->dtype == GM_F16)
        for (int64_t i = 0; i < n; i++) dst[i] = gm_f16_to_f32(((const uint16_t *)t->data)[i]);
    else
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; adapters are read as F32, BF16 or F16", h->file, name,
                            gm_dtype_name(t->dtype));
    return GM_OK;
}

/* A JSON field that must be absent, null, false, empty or equal to `ok` (a string) for us to apply
 * the adapter exactly; GM_ERR_UNSUPPORTED naming it otherwise. */
static gm_status peft_expect_off(const cJSON *j, const char *field, const char *ok, const char *why, const char *file,
                                 gm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, field);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return GM_OK;
    if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && cJSON_GetArraySize(v) == 0) return GM_OK;
    if (ok && cJSON_IsString(v) && strcmp(v->valuestring, ok) == 0) return GM_OK;
    char *txt = cJSON_PrintUnformatted(v);
    gm_status s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"%s\": %s: %s", file, field, txt ? txt : "?", why);
    cJSON_free(txt);
    return s;
}

/* Reads a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors, as PEFT's
 * save_pretrained writes it) into a. */
/* A LoraConfig field naming modules (target_modules, exclude_modules) as train.targets writes it:
 * a regular expression as it is, a list joined with ','; absent or null: "". */
static gm_status module_list(const cJSON *j, const char *key, char out[GM_LORA_TARGETS_MAX], const char *cfg_path, gm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    out[0] = '\0';
    if (cJSON_IsString(v)) {
        if (snprintf(out, GM_LORA_TARGETS_MAX, "%s", v->valuestring) >= GM_LORA_TARGETS_MAX)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"%s\" is longer than %d bytes", cfg_path, key, GM_LORA_TARGETS_MAX - 1);
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            size_t k = strlen(out);
            if (!cJSON_IsString(e) || snprintf(out + k, GM_LORA_TARGETS_MAX - k, "%s%s", k ? "," : "", e->valuestring) >= (int)(GM_LORA_TARGETS_MAX - k))
                return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"%s\" must be module names (at most %d bytes in all)", cfg_path, key,
                                    GM_LORA_TARGETS_MAX - 1);
        }
    }
    return GM_OK;
}

/* What of a PEFT config selects modules, for check_selected. */
typedef struct peft_sel {
    const char *cfg_path, *w_path;
    const gm_lora_config *lc;
    const char *targets, *exclude;
    const bool *layers;
    bool init_zero_b;
    bool multimodal;         /* the model has a vision tower: a name list may name either part's modules */
} peft_sel;

/* PEFT puts adapters on the modules its config selects and loads the tensors of those only: the
 * file's modules[nm] (of one part of the model: arch, mc, module prefix `prefix`) must be
 * selected, and a selected module without tensors keeps PEFT's initialization (harmless only
 * when that sets B = 0). */
static gm_status check_selected(const peft_sel *p, const gm_arch_def *arch, const gm_config *mc, const char *prefix,
                                const char *const *modules, int nm, gm_error *err) {
    const char *cfg_path = p->cfg_path, *w_path = p->w_path, *exclude = p->exclude;
    bool init_zero_b = p->init_zero_b;
    gm_lora_config sel = *p->lc;
    snprintf(sel.targets, sizeof sel.targets, "%s", p->targets);
    if (p->multimodal && gm_lora_targets_check(sel.targets, arch, prefix, NULL) != GM_OK) {
        /* a name list over the whole multimodal model ("q_proj,fc1"): this part's names only, as
         * PEFT matches each name wherever a module has it */
        char all[GM_LORA_TARGETS_MAX];
        snprintf(all, sizeof all, "%s", p->targets);
        sel.targets[0] = '\0';
        for (char *t = strtok(all, ","); t; t = strtok(NULL, ","))
            if (gm_lora_targets_check(t, arch, prefix, NULL) == GM_OK)
                snprintf(sel.targets + strlen(sel.targets), sizeof sel.targets - strlen(sel.targets), "%s%s",
                         sel.targets[0] ? "," : "", t);
    }
    for (int i = 0; i < GM_MAX_LAYERS; i++) sel.layers[i] = p->layers[i];
    gm_lora want;
    memset(&want, 0, sizeof want);
    gm_status s = sel.targets[0] ? gm_lora_describe(&want, &sel, arch, mc, prefix, err) : GM_OK; /* none: selects nothing */
    if (s != GM_OK) gm_error_prefix(err, "%s: target_modules / layers_to_transform", cfg_path);
    for (int i = 0; s == GM_OK && i < nm; i++) {
        bool found = false;
        for (int k = 0; k < want.n && !found; k++) found = strcmp(want.ad[k].module, modules[i]) == 0;
        if (found && exclude[0] && gm_lora_target_matches(exclude, modules[i])) {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: the file has an adapter on %s, which adapter_config.json's "
                             "exclude_modules leaves out (PEFT would ignore its tensors)", w_path, modules[i]);
            break;
        }
        int64_t layer;
        int slot = gm_lora_module_slot(arch, modules[i], &layer);
        char why[256] = "";
        if (!found && layer >= mc->n_layers)
            s = gm_error_set(err, GM_ERR_INVALID, "%s: the file has an adapter on %s, but this model has %lld layers (an adapter "
                             "for another base model?)", w_path, modules[i], (long long)mc->n_layers);
        else if (!found && slot >= 0 && gm_lora_absent_why(arch, mc, slot, layer, why, sizeof why))
            s = gm_error_set(err, GM_ERR_INVALID, "%s: the file has an adapter on %s, but %s (an adapter for another base "
                             "model?)", w_path, modules[i], why);
        else if (!found)
            s = gm_error_set(err, GM_ERR_INVALID, "%s: the file has an adapter on %s, which adapter_config.json's target_modules "
                             "/ layers_to_transform do not select (PEFT would ignore its tensors)", w_path, modules[i]);
    }
    for (int k = 0; s == GM_OK && !init_zero_b && k < want.n; k++) {
        if (exclude[0] && gm_lora_target_matches(exclude, want.ad[k].module)) continue; /* PEFT leaves it alone */
        bool found = false;
        for (int i = 0; i < nm && !found; i++) found = strcmp(want.ad[k].module, modules[i]) == 0;
        if (!found)
            s = gm_error_set(err, GM_ERR_INVALID, "%s: adapter_config.json selects %s but the file has no tensors for it, and "
                             "with init_lora_weights false PEFT would give it a random B", cfg_path, want.ad[k].module);
    }
    gm_lora_free(&want);
    return s;
}

static gm_status read_peft(const gm_model *m, gm_backend *be, const char *dir, gm_adapter *a, gm_error *err) {
    char cfg_path[4096], w_path[4096];
    GM_TRY(join_path(cfg_path, sizeof cfg_path, dir, PEFT_CONFIG, err));
    GM_TRY(join_path(w_path, sizeof w_path, dir, PEFT_WEIGHTS, err));
    snprintf(a->source, sizeof a->source, "%s", dir);
    char *text = NULL;
    size_t len = 0;
    GM_TRY(gm_read_file(cfg_path, &text, &len, err));
    cJSON *j = cJSON_ParseWithLength(text, len);
    gm_free(text);
    gm_status s = GM_OK;
    if (!cJSON_IsObject(j)) s = gm_error_set(err, GM_ERR_FORMAT, "%s: not a JSON object", cfg_path);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r"), *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout"), *rs = cJSON_GetObjectItemCaseSensitive(j, "use_rslora");
    if (s == GM_OK && (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0))
        s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"peft_type\" is %s; gemmarun applies LoRA adapters (\"LORA\")", cfg_path,
                         cJSON_IsString(pt) ? pt->valuestring : "missing");
    if (s == GM_OK && !(cJSON_IsNumber(r) && r->valuedouble >= 1 && r->valuedouble == (double)(int)r->valuedouble))
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: \"r\" (the LoRA rank) must be a positive integer", cfg_path);
    if (s == GM_OK && !(cJSON_IsNumber(al) && al->valuedouble > 0))
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: \"lora_alpha\" must be a positive number", cfg_path);
    /* what would change the forward and that we do not implement: refuse rather than apply a
     * different adapter */
    if (s == GM_OK) s = peft_expect_off(j, "use_dora", NULL, "DoRA adapters are not supported", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "bias", "none", "adapters with trained biases are not supported (bias \"none\" only)", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "lora_bias", NULL, "LoRA biases are not supported", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "fan_in_fan_out", NULL, "fan_in_fan_out (Conv1D layers) is not a Gemma layout", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "rank_pattern", NULL, "per-module ranks are not supported (one r for every module)", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "alpha_pattern", NULL, "per-module alphas are not supported (one lora_alpha)", cfg_path, err);
    /* modules_to_save: a multimodal model's projector only (PEFT saves it as "<module path>.<param>") */
    const cJSON *mts = cJSON_GetObjectItemCaseSensitive(j, "modules_to_save");
    bool save_proj = cJSON_IsArray(mts) && cJSON_GetArraySize(mts) == 1 && cJSON_IsString(cJSON_GetArrayItem(mts, 0)) &&
                     strcmp(cJSON_GetArrayItem(mts, 0)->valuestring, "multi_modal_projector") == 0;
    if (s == GM_OK && !save_proj)
        s = peft_expect_off(j, "modules_to_save", NULL, "fully trained modules are supported for [\"multi_modal_projector\"] "
                            "(a multimodal model's projector) only", cfg_path, err);
    if (s == GM_OK) s = peft_expect_off(j, "layer_replication", NULL, "layer replication is not supported", cfg_path, err);
    /* PEFT's LoRA variants that change the forward (peft/tuners/lora/config.py, PEFT 0.21) */
    static const char *const variants[][2] = {
        {"use_qalora", "QALoRA adapters are not supported"},
        {"use_bdlora", "block-diagonal LoRA is not supported"},
        {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
        {"trainable_token_indices", "trainable token embeddings are not supported"},
        {"target_parameters", "LoRA on parameters (target_parameters) is not supported"},
        {"kasa_config", "KaSA adapters are not supported"},
        {"monteclora_config", "MonteCLoRA adapters are not supported"},
    };
    for (size_t v = 0; s == GM_OK && v < sizeof variants / sizeof variants[0]; v++)
        s = peft_expect_off(j, variants[v][0], NULL, variants[v][1], cfg_path, err);
    if (s == GM_OK && rs && !cJSON_IsBool(rs) && !cJSON_IsNull(rs))
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: \"use_rslora\" must be true or false", cfg_path);
    /* initializations that change the base weights (PEFT subtracts the initial adapter from them,
     * or quantizes them): the adapter is meant for a base we do not have */
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(j, "init_lora_weights");
    if (s == GM_OK && cJSON_IsString(init) && strcmp(init->valuestring, "gaussian") != 0)
        s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"init_lora_weights\": \"%s\" initializes by changing the base weights "
                         "(PiSSA, OLoRA, CorDA, LoftQ, ...): the adapter applies to that changed base, which gemmarun does not "
                         "have\n  hint: convert it to a plain LoRA adapter first (PEFT's path_initial_model_for_weight_conversion)",
                         cfg_path, init->valuestring);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(j, "layers_pattern");
    if (s == GM_OK && lp && !cJSON_IsNull(lp) && !(cJSON_IsString(lp) && strcmp(lp->valuestring, "layers") == 0))
        s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: \"layers_pattern\" other than \"layers\" is not a Gemma layout", cfg_path);
    bool init_zero_b = !init || cJSON_IsTrue(init) || cJSON_IsNull(init) || cJSON_IsString(init); /* B = 0 unless false */
    /* PEFT's module selection, to compare with the tensors below: target_modules (a list or a
     * regular expression) and layers_to_transform */
    char targets[GM_LORA_TARGETS_MAX] = "";
    bool layers_sel[GM_MAX_LAYERS];
    for (int i = 0; i < GM_MAX_LAYERS; i++) layers_sel[i] = true;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layers_to_transform");
    if (s == GM_OK) s = module_list(j, "target_modules", targets, cfg_path, err);
    /* exclude_modules (PEFT >= 0.14): matched as target_modules is, and taken out of its selection */
    char exclude[GM_LORA_TARGETS_MAX] = "";
    if (s == GM_OK) s = module_list(j, "exclude_modules", exclude, cfg_path, err);
    if (s == GM_OK && cJSON_IsNumber(lt)) {
        for (int i = 0; i < GM_MAX_LAYERS; i++) layers_sel[i] = i == (int)lt->valuedouble;
    } else if (s == GM_OK && cJSON_IsArray(lt)) {
        for (int i = 0; i < GM_MAX_LAYERS; i++) layers_sel[i] = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < GM_MAX_LAYERS) layers_sel[(int)e->valuedouble] = true;
    }
    gm_lora_config lc = gm_lora_config_default();
    if (s == GM_OK) {
        lc.rank = (int)r->valuedouble;
        lc.alpha = (float)al->valuedouble;
        lc.dropout = cJSON_IsNumber(dr) && dr->valuedouble >= 0 && dr->valuedouble < 1 ? (float)dr->valuedouble : 0.0f;
        lc.rslora = cJSON_IsTrue(rs);
        s = gm_lora_config_validate(&lc, &m->cfg, err);
        if (s != GM_OK) gm_error_prefix(err, "%s", cfg_path);
    }
    cJSON_Delete(j);
    gm_safetensors *st = NULL;
    if (s == GM_OK) {
        if (!has_file(dir, PEFT_WEIGHTS) && has_file(dir, "adapter_model.bin"))
            s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: the weights are in adapter_model.bin (a PyTorch pickle, which gemmarun "
                             "does not read)\n  hint: save the adapter with save_pretrained(..., safe_serialization=True)", dir);
        else s = gm_safetensors_open(w_path, &st, err);
    }
    int64_t nt = s == GM_OK ? gm_safetensors_n_tensors(st) : 0;
    const char **modules = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *modules) : NULL;
    char (*keys)[192] = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *keys) : NULL;
    if (s == GM_OK && (!modules || !keys)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    int nm = 0, nv = 0, proj_seen[2] = {0, 0};
    /* the vision tower's modules apart (the same "layers.N.<module>" tails as the decoder's) */
    const char **vmodules = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *vmodules) : NULL;
    char (*vkeys)[192] = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *vkeys) : NULL;
    if (s == GM_OK && (!vmodules || !vkeys)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* and the audio encoder's ("conformer.N.<module>") */
    int na = 0;
    const char **amodules = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *amodules) : NULL;
    char (*akeys)[192] = s == GM_OK ? gm_calloc((size_t)(nt > 0 ? nt : 1), sizeof *akeys) : NULL;
    if (s == GM_OK && (!amodules || !akeys)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* every tensor must be a LoRA A or B under PEFT's prefix, in pairs, or the projector's */
    for (int64_t i = 0; i < nt && s == GM_OK; i++) {
        const char *name = gm_safetensors_tensor_at(st, i)->name;
        int pk = strcmp(name, proj_names[0]) == 0 ? 0 : strcmp(name, proj_names[1]) == 0 ? 1 : -1;
        if (pk >= 0) {
            if (!save_proj)
                s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' is the projector trained fully, but adapter_config.json's "
                                 "modules_to_save does not list multi_modal_projector (PEFT would ignore it)", w_path, name);
            proj_seen[pk] = 1;
            continue;
        }
        bool is_a = ends_with(name, A_SUFFIX), is_b = ends_with(name, ".lora_B.weight");
        if (strncmp(name, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0 || !(is_a || is_b) || strlen(name) >= sizeof keys[0] + strlen(A_SUFFIX)) {
            s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA matrix (base_model.model.<module>.lora_A.weight "
                             "or .lora_B.weight)%s", w_path, name,
                             strstr(name, "lora_embedding") ? ": LoRA on embeddings is not supported"
                             : strstr(name, "lora_magnitude") ? ": DoRA adapters are not supported" : "");
            break;
        }
        char other[400];
        snprintf(other, sizeof other, "%.*s%s", (int)(strlen(name) - strlen(A_SUFFIX)), name, is_a ? ".lora_B.weight" : A_SUFFIX);
        if (!gm_safetensors_find(st, other)) {
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' has no partner: missing key '%s'", w_path, name, other);
            break;
        }
        /* only the text decoder's modules, in one of its layouts, with canonical layer numbers:
         * PEFT would load nothing else onto this model (a vision tower's layers.0 is not ours) */
        const char *mod = name + strlen(PEFT_PREFIX), *tail = NULL;
        /* the audio tower's blocks: Gemma 3n's "conformer.N.", Gemma 4's "layers.N." */
        char aud[64];
        snprintf(aud, sizeof aud, "%s%s", GM_AUDIO_TOWER_PREFIX, m->cfg.arch == GM_ARCH_GEMMA4 ? "layers." : "conformer.");
        if (strncmp(mod, aud, strlen(aud)) == 0) {
            if (is_a) { /* the audio encoder's (its model and layer range checked below) */
                snprintf(akeys[na], sizeof akeys[na], "%.*s", (int)(strlen(name) - strlen(A_SUFFIX)), name);
                amodules[na] = akeys[na] + strlen(PEFT_PREFIX);
                na++;
            }
            continue;
        }
        if (strstr(mod, "audio_tower.")) {
            s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: tensor '%s' is LoRA on the audio encoder in another module layout than "
                             "transformers 5's for %s (%s<N>...)", w_path, name, m->path, aud);
            break;
        }
        static const char *const layouts[] = {"model.", "model.language_model.", "language_model.model."};
        for (int k = 0; k < 3 && !tail; k++) {
            size_t n = strlen(layouts[k]);
            if (strncmp(mod, layouts[k], n) == 0 && strncmp(mod + n, "layers.", 7) == 0) tail = mod + n;
        }
        bool tower = strncmp(mod, GM_VISION_TOWER_PREFIX, strlen(GM_VISION_TOWER_PREFIX)) == 0 &&
                     strncmp(mod + strlen(GM_VISION_TOWER_PREFIX), "layers.", 7) == 0;
        if (tower && !m->vision) {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' is LoRA on a vision tower, which this model lacks (%s has no "
                             "vision tower; it is not applied to the decoder's layer of that number)", w_path, name, m->path);
            break;
        }
        if (tower) tail = mod + strlen(GM_VISION_TOWER_PREFIX);
        else if (strstr(mod, "vision_tower.")) {
            s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: tensor '%s' is LoRA on the vision tower in another module layout than "
                             "transformers 5's (%slayers.<N>...)", w_path, name, GM_VISION_TOWER_PREFIX);
            break;
        }
        const char *d = tail ? tail + 7 : NULL;
        bool canon = d && isdigit((unsigned char)d[0]) && (d[0] != '0' || d[1] == '.');
        while (canon && isdigit((unsigned char)*d)) d++;
        if (!tail || !canon || *d != '.') {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' is not on a layer of the text decoder (keys are "
                             "base_model.model.model.layers.<N>.<module>...; also model.language_model. or language_model.model.)",
                             w_path, name);
            break;
        }
        if (tower) { /* the tower's (its model checked below) */
            if (is_a) {
                snprintf(vkeys[nv], sizeof vkeys[nv], "%.*s", (int)(strlen(name) - strlen(A_SUFFIX)), name);
                vmodules[nv] = vkeys[nv] + strlen(PEFT_PREFIX);
                nv++;
            }
            continue;
        }
        size_t plen = (size_t)(tail - mod);
        if (nm > 0 && !(plen == (size_t)(strstr(modules[0], "layers.") - modules[0]) && strncmp(mod, modules[0], plen) == 0)) {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' uses another module layout than '%s' (one adapter, one layout)",
                             w_path, name, modules[0]);
            break;
        }
        if (!is_a) continue;
        snprintf(keys[nm], sizeof keys[nm], "%.*s", (int)(strlen(name) - strlen(A_SUFFIX)), name);
        modules[nm] = keys[nm] + strlen(PEFT_PREFIX);
        nm++;
    }
    a->has_proj = save_proj;
    if (s == GM_OK && (nv > 0 || save_proj) && !m->vision)
        s = gm_error_set(err, GM_ERR_INVALID, "%s trained the image path (%s), which this model lacks: %s has no vision tower\n"
                         "  hint: use the multimodal checkpoint the adapter was trained on", dir, image_parts(nv, save_proj), m->path);
    if (s == GM_OK && save_proj && !(proj_seen[0] && proj_seen[1]))
        s = gm_error_set(err, GM_ERR_INVALID, "%s: modules_to_save lists multi_modal_projector but the file has no '%s' (PEFT "
                         "would fail to load it)", w_path, proj_names[proj_seen[0] ? 1 : 0]);
    /* PEFT puts adapters on the modules its config selects and loads the tensors of those only:
     * the file's modules must be selected, the decoder's and the tower's */
    mod_set aset = {&a->audio_lora, NULL, NULL, GM_AUDIO_TOWER_PREFIX, amodules, akeys, na};
    if (s == GM_OK && na > 0) s = audio_set(m, a, &aset, dir, err);
    peft_sel ps = {cfg_path, w_path, &lc, targets, exclude, layers_sel, init_zero_b, m->vision != NULL || na > 0};
    if (s == GM_OK && nm > 0 && targets[0]) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(strstr(modules[0], "layers.") - modules[0]), modules[0]);
        s = check_selected(&ps, m->arch, &m->cfg, prefix, modules, nm, err);
    }
    if (s == GM_OK && nv > 0 && targets[0])
        s = check_selected(&ps, m->vision->arch, &m->vision->cfg, GM_VISION_TOWER_PREFIX, vmodules, nv, err);
    if (s == GM_OK && na > 0 && targets[0]) s = check_selected(&ps, aset.arch, aset.cfg, GM_AUDIO_TOWER_PREFIX, amodules, na, err);
    if (s == GM_OK && nm + nv + na == 0) s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no LoRA tensors in it", w_path);
    st_src src = {st, w_path};
    mod_set sets[3] = {{&a->lora, m->arch, &m->cfg, m->peft_prefix, modules, keys, nm},
                       {&a->vision_lora, m->vision ? m->vision->arch : NULL, m->vision ? &m->vision->cfg : NULL,
                        GM_VISION_TOWER_PREFIX, vmodules, vkeys, nv},
                       aset};
    if (s == GM_OK) s = load_modules(m, be, &lc, sets, 3, st_fetch, &src, a, err);
    gm_free(modules), gm_free(keys), gm_free(vmodules), gm_free(vkeys), gm_free(amodules), gm_free(akeys);
    gm_safetensors_free(st);
    return s;
}

gm_status gm_adapter_load(const gm_model *m, gm_backend *be, const char *path, const char *trial, gm_adapter **out,
                          gm_error *err) {
    *out = NULL;
    if (!path || !*path) return gm_error_set(err, GM_ERR_INVALID, "no adapter path given");
    char file[4096];
    if (ends_with(path, ".safetensors") || ends_with(path, "/" PEFT_CONFIG) || strcmp(path, PEFT_CONFIG) == 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: give the PEFT adapter's folder (the one holding adapter_config.json and "
                            "adapter_model.safetensors), not one of its files", path);
    if (ends_with(path, ".gguf"))
        return gm_error_set(err, GM_ERR_INVALID, "%s is a GGUF file: gemmarun reads adapters from results folders, trial files, "
                            "checkpoints and PEFT adapter folders (`gemmarun export --format gguf` writes GGUF adapters for llama.cpp)",
                            path);
    if (is_dir(path) && !is_peft_dir(path) && has_file(path, PEFT_WEIGHTS))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: a PEFT adapter folder without adapter_config.json (its r and lora_alpha): "
                            "copy the adapter's config beside adapter_model.safetensors", path);
    if (is_peft_dir(path)) {
        if (trial && *trial)
            return gm_error_set(err, GM_ERR_INVALID, "%s is a PEFT adapter folder (one adapter); --trial picks a trial of a results "
                                "folder or a merged results file", path);
        gm_adapter *a = gm_calloc(1, sizeof *a);
        if (!a) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        a->step = -1;
        gm_status s = read_peft(m, be, path, a, err);
        if (s != GM_OK) {
            gm_adapter_free(a);
            return s;
        }
        *out = a;
        return GM_OK;
    }
    bool from_folder = is_dir(path);
    if (from_folder) {
        cand *c = NULL;
        int n = 0, pick = -1;
        GM_TRY(folder_trials(path, &c, &n, err));
        gm_status s = choose(c, n, trial, path, &pick, err);
        if (s == GM_OK && snprintf(file, sizeof file, "%s", c[pick].where) >= (int)sizeof file)
            s = gm_error_set(err, GM_ERR_INVALID, "path too long: %s", c[pick].where);
        gm_free(c);
        if (s != GM_OK) return s;
    } else if (snprintf(file, sizeof file, "%s", path) >= (int)sizeof file) {
        return gm_error_set(err, GM_ERR_INVALID, "path too long (%zu bytes at most): %s", sizeof file - 1, path);
    }
    gm_h5_file *f = NULL;
    GM_TRY(gm_h5_open(file, false, &f, err));
    gm_adapter *a = gm_calloc(1, sizeof *a);
    if (!a) {
        gm_h5_close(&f, NULL);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    snprintf(a->source, sizeof a->source, "%s", file);
    a->step = -1;
    char *format = NULL;
    gm_status s = gm_h5_attr_get_str(f, "/", "format", &format, err);
    if (s != GM_OK) {
        gm_error_prefix(err, "%s is not a gemmarun results or checkpoint file", file);
    } else if (strcmp(format, "gemmarun-results") == 0) {
        /* one trial's file: it must be the trial asked for, if one was */
        cand t;
        memset(&t, 0, sizeof t);
        char *id = NULL, *status = NULL;
        gm_h5_attr_get_str(f, "/", "trial_id", &id, NULL);
        gm_h5_attr_get_str(f, "/", "status", &status, NULL);
        gm_h5_attr_get_i64(f, "/", "trial_index", &t.index, NULL);
        snprintf(t.id, sizeof t.id, "%s", id ? id : "?");
        snprintf(t.status, sizeof t.status, "%s", status ? status : "?");
        gm_free(id), gm_free(status);
        t.has_adapter = has_lora(f, "/adapter");
        int pick;
        s = choose(&t, 1, from_folder ? NULL : trial, file, &pick, err);
        if (s == GM_OK) snprintf(a->trial_id, sizeof a->trial_id, "%s", t.id);
        if (s == GM_OK) s = read_adapter(m, be, f, "/adapter", "/", a, err);
    } else if (strcmp(format, "gemmarun-checkpoint") == 0) {
        gm_h5_attr_get_i64(f, "/", "step", &a->step, NULL);
        if (trial && *trial)
            s = gm_error_set(err, GM_ERR_INVALID, "%s is a checkpoint (one adapter); --trial picks a trial of a results folder "
                             "or a merged results file", file);
        else if (!has_lora(f, "/adapter"))
            s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: this checkpoint holds no adapter", file);
        else s = read_adapter(m, be, f, "/adapter", "/", a, err);
    } else if (strcmp(format, "gemmarun-results-merged") == 0) {
        cand *c = NULL;
        int n = 0, pick = -1;
        s = merged_trials(f, &c, &n, err);
        if (s == GM_OK) s = choose(c, n, trial, file, &pick, err);
        if (s == GM_OK) {
            char ag[4200];
            snprintf(ag, sizeof ag, "%s/adapter", c[pick].where);
            snprintf(a->trial_id, sizeof a->trial_id, "%s", c[pick].id);
            s = read_adapter(m, be, f, ag, c[pick].where, a, err);
        } else if (s == GM_ERR_NOT_FOUND && c) {
            bool any = false;
            for (int i = 0; i < n; i++) any = any || c[i].has_adapter;
            if (!any) /* the runner merges without adapters: say where they are */
                gm_error_prefix(err, "%s was merged without adapters (use a trial's file in the results folder, "
                                "results/<experiment>/trial-<id>.h5)", file);
        }
        gm_free(c);
    } else {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: format '%s' holds no adapter (expected a gemmarun results or checkpoint file)",
                         file, format);
    }
    gm_free(format);
    gm_h5_close(&f, NULL);
    if (s != GM_OK) {
        gm_adapter_free(a);
        return s;
    }
    *out = a;
    return GM_OK;
}

/* ---- writing a PEFT adapter folder --------------------------------------------------------- */

/* The module's name below "<layer word>N." ("self_attn.q_proj"). */
static const char *sub_name(const gm_arch_def *arch, const gm_lora_adapter *ad) {
    const char *word = gm_lora_layer_word(arch), *t = strstr(ad->module, word);
    t = t ? strchr(t + strlen(word), '.') : NULL;
    return t ? t + 1 : ad->module;
}

/* The name target_modules lists for the module: its last component ("q_proj") when no other
 * targetable weight of the architecture ends the same, else its name below the layer. */
static const char *target_name(const gm_arch_def *arch, const gm_lora_adapter *ad) {
    const char *sub = sub_name(arch, ad), *last = strrchr(sub, '.');
    last = last ? last + 1 : sub;
    int same = 0;
    for (int i = 0; i < arch->n_layer; i++) {
        if (arch->layer[i].lora_id < 0) continue;
        const char *h = arch->layer[i].hf, *e = strrchr(h, '.'); /* ".weight" */
        size_t n = e ? (size_t)(e - h) : strlen(h);
        const char *b = h + n;
        while (b > h && b[-1] != '.') b--;
        if ((size_t)(h + n - b) == strlen(last) && strncmp(b, last, strlen(last)) == 0) same++;
    }
    return same <= 1 ? last : sub;
}

/* Appends `s` to the regex in buf with '.' escaped. */
static void rx_append(char *buf, size_t cap, const char *s) {
    size_t k = strlen(buf);
    for (; *s && k + 3 < cap; s++) {
        if (*s == '.') buf[k++] = '\\';
        buf[k++] = *s;
    }
    buf[k] = '\0';
}

/* gm_adapter_targets for the adapters lo on a part of a model (architecture arch, n_model_layers
 * layers, PEFT module prefix `prefix`); allow_list false: a regular expression always. */
static gm_status targets_of(const gm_lora *lo, const gm_arch_def *arch, int64_t n_model_layers, const char *prefix,
                            bool allow_list, bool *list, char **out, bool layers[GM_MAX_LAYERS], int *n_layers, gm_error *err) {
    *out = NULL;
    /* which layers and which modules; is the set of adapters every module on every layer? */
    int n_layers_used = 0, n_slots_used = 0;
    for (int l = 0; l < GM_MAX_LAYERS; l++) layers[l] = false;
    for (int i = 0; i < lo->n; i++)
        if (!layers[lo->ad[i].layer]) layers[lo->ad[i].layer] = true, n_layers_used++;
    for (int sl = 0; sl < GM_MAX_LAYER_WEIGHTS; sl++) n_slots_used += lo->slot_used[sl];
    bool product = lo->n == n_layers_used * n_slots_used;
    *list = allow_list && product && strcmp(prefix, "model.") == 0;
    *n_layers = n_layers_used;
    size_t cap = 64 + 2 * strlen(prefix) + 8 * (size_t)n_model_layers; /* escaped: 2 bytes a char at most */
    for (int i = 0; i < lo->n; i++) cap += 2 * strlen(lo->ad[i].module) + 2;
    char *rx = gm_calloc(cap, 1);
    if (!rx) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (*list) {
        /* names, as PEFT lists them: each matches "<name>" or "*.<name>" */
        for (int i = 0; i < lo->n && lo->ad[i].layer == lo->ad[0].layer; i++) {
            if (i) strcat(rx, ",");
            strcat(rx, target_name(arch, &lo->ad[i]));
        }
    } else if (product) {
        /* a regular expression full-matched against module names: exactly these modules (a list
         * would also match e.g. a vision tower's q_proj in a multimodal checkpoint) */
        rx_append(rx, cap, prefix);
        rx_append(rx, cap, gm_lora_layer_word(arch));
        strcat(rx, "(?:");
        bool first = true;
        for (int l = 0; l < n_model_layers; l++)
            if (layers[l]) snprintf(rx + strlen(rx), cap - strlen(rx), "%s%d", first ? "" : "|", l), first = false;
        strcat(rx, ")\\.(?:");
        for (int i = 0; i < lo->n && lo->ad[i].layer == lo->ad[0].layer; i++) {
            if (i) strcat(rx, "|");
            rx_append(rx, cap, sub_name(arch, &lo->ad[i]));
        }
        strcat(rx, ")");
    } else {
        /* per adapted weight, the layers that have it: "<prefix>layers\.(?:0|3)\.self_attn\.q_proj|..."
         * (shorter than every module spelled out, so it fits train.targets) */
        bool first_slot = true;
        for (int sl = 0; sl < GM_MAX_LAYER_WEIGHTS; sl++) {
            if (!lo->slot_used[sl]) continue;
            const gm_lora_adapter *any = NULL;
            if (!first_slot) strcat(rx, "|");
            first_slot = false;
            rx_append(rx, cap, prefix);
            rx_append(rx, cap, gm_lora_layer_word(arch));
            strcat(rx, "(?:");
            bool first = true;
            for (int i = 0; i < lo->n; i++) {
                if (lo->ad[i].slot != sl) continue;
                snprintf(rx + strlen(rx), cap - strlen(rx), "%s%d", first ? "" : "|", lo->ad[i].layer), first = false;
                any = &lo->ad[i];
            }
            strcat(rx, ")\\.");
            rx_append(rx, cap, sub_name(arch, any));
        }
    }
    *out = rx;
    return GM_OK;
}

gm_status gm_adapter_targets(const gm_lora *lo, const gm_model *m, bool *list, char **out, bool layers[GM_MAX_LAYERS],
                             int *n_layers, gm_error *err) {
    return targets_of(lo, m->arch, m->cfg.n_layers, m->peft_prefix, true, list, out, layers, n_layers, err);
}

/* The targets text of a tower's adapters lo (architecture arch, n_layers blocks, module prefix
 * `prefix`), as train.vision_targets / audio_targets read it (every block): "none" without
 * adapters; the module names when they are the same modules on every block; else a regular
 * expression that selects exactly them. */
static gm_status tower_targets(const gm_lora *lo, const gm_arch_def *arch, int64_t n_layers, const char *prefix,
                               char **out, gm_error *err) {
    *out = NULL;
    if (lo->n == 0 || !arch) {
        *out = gm_malloc(5);
        if (!*out) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        memcpy(*out, "none", 5);
        return GM_OK;
    }
    bool list, layers[GM_MAX_LAYERS];
    int n_used = 0, n_slots = 0;
    GM_TRY(targets_of(lo, arch, n_layers, prefix, false, &list, out, layers, &n_used, err));
    for (int sl = 0; sl < GM_MAX_LAYER_WEIGHTS; sl++) n_slots += lo->slot_used[sl];
    if (n_used == n_layers && lo->n == n_used * n_slots) {
        /* the same modules on every block: their names, which a regex-free list matches on the
         * tower's module names only */
        size_t cap = 1;
        for (int i = 0; i < lo->n; i++) cap += strlen(lo->ad[i].module) + 1;
        char *names = gm_calloc(cap, 1);
        if (!names) {
            gm_free(*out), *out = NULL;
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < lo->n && lo->ad[i].layer == lo->ad[0].layer; i++) {
            if (i) strcat(names, ",");
            strcat(names, target_name(arch, &lo->ad[i]));
        }
        gm_free(*out);
        *out = names;
    }
    return GM_OK;
}

gm_status gm_adapter_vision_targets(const gm_adapter *a, const gm_model *m, char **out, gm_error *err) {
    const gm_model *t = m->vision;
    return tower_targets(&a->vision_lora, t ? t->arch : NULL, t ? t->cfg.n_layers : 0, GM_VISION_TOWER_PREFIX, out, err);
}

gm_status gm_adapter_audio_targets(const gm_adapter *a, const gm_model *m, char **out, gm_error *err) {
    (void)m;
    return tower_targets(&a->audio_lora, gm_arch_get(a->audio_cfg.arch), a->audio_cfg.n_layers, GM_AUDIO_TOWER_PREFIX,
                         out, err);
}

gm_status gm_adapter_save_peft(const gm_adapter *a, gm_backend *be, const gm_model *m, const char *dir, const char *base_model,
                               gm_error *err) {
    const gm_lora *lo = &a->lora, *vl = &a->vision_lora, *al = &a->audio_lora;
    if (lo->n + vl->n + al->n < 1) return gm_error_set(err, GM_ERR_INVALID, "the adapter has no modules");
    const gm_lora_config *lcfg = lo->n ? &lo->cfg : vl->n ? &vl->cfg : &al->cfg; /* one rank and scaling for all */
    bool image_path = vl->n > 0 || a->has_proj || al->n > 0; /* another part than the decoder: a regular expression */
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return gm_error_set(err, GM_ERR_INVALID, "%s exists and is not a folder: give a folder to write the PEFT adapter into", dir);
    /* only an earlier adapter may be replaced: next to a model's files (a merged export, a base
     * checkpoint) the adapter would be applied on top by transformers, or hide the model */
    static const char *const mine[] = {PEFT_CONFIG, PEFT_WEIGHTS, "README.md"};
    char other[256];
    GM_TRY(gm_folder_foreign(dir, mine, 3, other, sizeof other, err));
    if (other[0])
        return gm_error_set(err, GM_ERR_INVALID, "%s holds %s, which is not a file of a PEFT adapter: export into a new or "
                            "empty folder (what is there is kept)", dir, other);
    if (stat(dir, &sb) != 0 && mkdir(dir, 0755) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot create the folder: %s", dir, strerror(errno));
    bool layer_used[GM_MAX_LAYERS], list = false;
    int n_layers_used = 0;
    char *targets = NULL, *tower = NULL;
    gm_status s = GM_OK;
    /* with the image path: one regular expression, the decoder's modules or the tower's (PEFT's
     * target_modules; the projector is its modules_to_save) */
    if (lo->n > 0) s = targets_of(lo, m->arch, m->cfg.n_layers, m->peft_prefix, !image_path, &list, &targets, layer_used,
                                  &n_layers_used, err);
    if (s == GM_OK && vl->n > 0) {
        bool tl, tused[GM_MAX_LAYERS];
        int tn;
        s = targets_of(vl, m->vision->arch, m->vision->cfg.n_layers, GM_VISION_TOWER_PREFIX, false, &tl, &tower, tused, &tn, err);
    }
    if (s == GM_OK && al->n > 0) { /* the audio encoder's, joined as the tower's */
        bool tl, tused[GM_MAX_LAYERS];
        int tn;
        char *aud = NULL;
        s = targets_of(al, gm_arch_get(a->audio_cfg.arch), a->audio_cfg.n_layers, GM_AUDIO_TOWER_PREFIX, false, &tl, &aud,
                       tused, &tn, err);
        if (s == GM_OK && tower) {
            size_t k = strlen(tower);
            char *both = gm_malloc(k + strlen(aud) + 2);
            if (!both) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
            else snprintf(both, k + strlen(aud) + 2, "%s|%s", tower, aud);
            gm_free(tower), gm_free(aud);
            tower = both;
        } else if (s == GM_OK) {
            tower = aud;
        }
    }
    if (s == GM_OK && tower) {
        size_t k = targets ? strlen(targets) : 0;
        char *both = gm_malloc(k + strlen(tower) + 2);
        if (!both) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        else snprintf(both, k + strlen(tower) + 2, "%s%s%s", targets ? targets : "", targets ? "|" : "", tower);
        gm_free(targets), gm_free(tower);
        targets = both, tower = NULL;
    }
    if (s != GM_OK) {
        gm_free(targets);
        return s;
    }
    cJSON *c = cJSON_CreateObject();
    if (!c) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (s == GM_OK) {
        /* the fields PEFT's LoraConfig writes, in its order (peft/tuners/lora/config.py) */
        cJSON_AddItemToObject(c, "alpha_pattern", cJSON_CreateObject());
        cJSON_AddItemToObject(c, "auto_mapping", cJSON_CreateNull());
        cJSON_AddStringToObject(c, "base_model_name_or_path", base_model ? base_model : "");
        cJSON_AddStringToObject(c, "bias", "none");
        cJSON_AddBoolToObject(c, "fan_in_fan_out", false);
        cJSON_AddBoolToObject(c, "inference_mode", true);
        cJSON_AddBoolToObject(c, "init_lora_weights", true);
        cJSON_AddItemToObject(c, "layer_replication", cJSON_CreateNull());
        cJSON_AddItemToObject(c, "layers_pattern", cJSON_CreateNull());
        if (list && n_layers_used < m->cfg.n_layers) {
            cJSON *l = cJSON_AddArrayToObject(c, "layers_to_transform");
            for (int i = 0; l && i < m->cfg.n_layers; i++)
                if (layer_used[i]) cJSON_AddItemToArray(l, cJSON_CreateNumber(i));
        } else {
            cJSON_AddItemToObject(c, "layers_to_transform", cJSON_CreateNull());
        }
        cJSON_AddNumberToObject(c, "lora_alpha", gm_f32_shortest(lcfg->alpha));
        cJSON_AddBoolToObject(c, "lora_bias", false);
        cJSON_AddNumberToObject(c, "lora_dropout", gm_f32_shortest(lcfg->dropout));
        if (a->has_proj) { /* trained fully: saved as "<module path>.<parameter>" */
            cJSON *ms = cJSON_AddArrayToObject(c, "modules_to_save");
            if (ms) cJSON_AddItemToArray(ms, cJSON_CreateString("multi_modal_projector"));
        } else {
            cJSON_AddItemToObject(c, "modules_to_save", cJSON_CreateNull());
        }
        cJSON_AddStringToObject(c, "peft_type", "LORA");
        cJSON_AddNumberToObject(c, "r", lcfg->rank);
        cJSON_AddItemToObject(c, "rank_pattern", cJSON_CreateObject());
        cJSON_AddItemToObject(c, "revision", cJSON_CreateNull());
        if (list) {
            cJSON *t = cJSON_AddArrayToObject(c, "target_modules");
            for (char *p = targets, *e; t && p; p = e ? e + 1 : NULL) {
                e = strchr(p, ',');
                if (e) *e = '\0';
                cJSON_AddItemToArray(t, cJSON_CreateString(p));
            }
        } else {
            cJSON_AddStringToObject(c, "target_modules", targets);
        }
        cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
        cJSON_AddBoolToObject(c, "use_dora", false);
        cJSON_AddBoolToObject(c, "use_rslora", lcfg->rslora);
    }
    /* the tensors, on the host: the decoder's adapters, the tower's, the projector */
    const gm_lora *parts[3] = {lo, vl, al};
    int n_wt = 2 * (lo->n + vl->n + al->n) + (a->has_proj ? 2 : 0);
    gm_st_write_tensor *wt = s == GM_OK ? gm_calloc((size_t)n_wt, sizeof *wt) : NULL;
    size_t total = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < parts[k]->n; i++) total += (size_t)(lcfg->rank * (parts[k]->ad[i].in + parts[k]->ad[i].out));
    int64_t C = a->has_proj ? m->vision->cfg.hidden_size : 0, Ct = a->has_proj ? m->vision->cfg.vision.out_hidden_size : 0;
    total += (size_t)(C * Ct + C);
    float *host = s == GM_OK ? gm_malloc(total * sizeof(float)) : NULL;
    if (s == GM_OK && (!wt || !host)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    float *p = host;
    int w = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; s == GM_OK && i < parts[k]->n; i++) {
            const gm_lora_adapter *ad = &parts[k]->ad[i];
            int64_t r = lcfg->rank;
            gm_backend_download(be, p, ad->A, (size_t)(r * ad->in) * sizeof(float));
            wt[w++] = (gm_st_write_tensor){ad->name_A, GM_F32, 2, {r, ad->in}, p};
            p += r * ad->in;
            gm_backend_download(be, p, ad->B, (size_t)(ad->out * r) * sizeof(float));
            wt[w++] = (gm_st_write_tensor){ad->name_B, GM_F32, 2, {ad->out, r}, p};
            p += ad->out * r;
        }
    if (s == GM_OK && a->has_proj) {
        gm_backend_download(be, p, a->vision.proj_w, (size_t)(C * Ct) * sizeof(float));
        wt[w++] = (gm_st_write_tensor){proj_names[0], GM_F32, 2, {C, Ct}, p};
        p += C * Ct;
        gm_backend_download(be, p, a->vision.proj_norm_w, (size_t)C * sizeof(float));
        wt[w++] = (gm_st_write_tensor){proj_names[1], GM_F32, 1, {C}, p};
    }
    if (s == GM_OK) s = gm_backend_status(be, err);
    char wpath[4096], cpath[4096];
    if (s == GM_OK) s = join_path(wpath, sizeof wpath, dir, PEFT_WEIGHTS, err);
    if (s == GM_OK) s = join_path(cpath, sizeof cpath, dir, PEFT_CONFIG, err);
    if (s == GM_OK) {
        static const char *const meta[] = {"format", "pt"};
        s = gm_safetensors_write(wpath, wt, n_wt, meta, 1, err);
    }
    if (s == GM_OK) {
        char *json = cJSON_Print(c);
        s = json ? gm_write_file_atomic(cpath, json, strlen(json), err) : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        cJSON_free(json);
    }
    gm_free(host), gm_free(wt), gm_free(targets);
    cJSON_Delete(c);
    return s;
}

/* ---- writing a llama.cpp GGUF LoRA adapter ------------------------------------------------- */

gm_status gm_adapter_save_gguf(const gm_adapter *a, gm_backend *be, const gm_model *m, const char *path, gm_error *err) {
    const gm_lora *lo = &a->lora;
    if (a->vision_lora.n > 0 || a->has_proj)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s trained the image path (%s): a llama.cpp LoRA adapter carries no "
                            "vision tower or projector, and without them it would be another model than the one trained\n"
                            "  hint: export it with --format peft", a->source, image_parts(a->vision_lora.n, a->has_proj));
    if (a->audio_lora.n > 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s trained the audio encoder (LoRA on %d of its modules): a llama.cpp "
                            "LoRA adapter carries no audio encoder, and without it it would be another model than the one "
                            "trained\n  hint: export it with --format peft", a->source, a->audio_lora.n);
    if (lo->n < 1) return gm_error_set(err, GM_ERR_INVALID, "the adapter has no modules");
    if (m->cfg.arch != GM_ARCH_GEMMA3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s is a %s model: gemmarun writes llama.cpp LoRA files for Gemma 3 bases "
                            "(the ones checked against llama.cpp, tests/e2e/generate_real.sh); llama.cpp's %s tensor names "
                            "and adapter support are unverified here\n  hint: export it with --format peft",
                            m->path, gm_arch_name(m->cfg.arch), gm_arch_name(m->cfg.arch));
    gm_gguf_writer *w = gm_gguf_writer_new();
    size_t total = 0;
    for (int i = 0; i < lo->n; i++) total += (size_t)(lo->cfg.rank * (lo->ad[i].in + lo->ad[i].out));
    float *host = w ? gm_malloc(total * sizeof(float)) : NULL;
    gm_status s = w && host ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (s == GM_OK) {
        /* what llama.cpp's convert_lora_to_gguf.py writes and llama-adapter.cpp requires */
        gm_gguf_set_str(w, "general.architecture", m->arch->name);
        gm_gguf_set_str(w, "general.type", "adapter");
        gm_gguf_set_str(w, "adapter.type", "lora");
        /* llama.cpp scales by alpha / r (llama-adapter.h get_scale) and has no rsLoRA: an
         * rsLoRA adapter's alpha / sqrt(r) is carried as alpha' = alpha * sqrt(r) */
        float alpha = lo->cfg.rslora ? lo->cfg.alpha * sqrtf((float)lo->cfg.rank) : lo->cfg.alpha;
        gm_gguf_set_f32(w, "adapter.lora.alpha", alpha);
    }
    float *p = host;
    char name[128];
    for (int i = 0; s == GM_OK && i < lo->n; i++) {
        const gm_lora_adapter *ad = &lo->ad[i];
        int64_t r = lo->cfg.rank;
        const char *g = m->arch->layer[ad->slot].gguf; /* "attn_q.weight" */
        /* A (r, in) is ne = [in, r] and B (out, r) is ne = [r, out]: the orientation
         * llama-adapter.cpp checks (a->ne[0] == in, b->ne[1] == out, a->ne[1] == b->ne[0]) */
        gm_backend_download(be, p, ad->A, (size_t)(r * ad->in) * sizeof(float));
        snprintf(name, sizeof name, "blk.%d.%s.lora_a", ad->layer, g);
        gm_gguf_add_tensor(w, name, GM_F32, 2, (const int64_t[]){r, ad->in}, p);
        p += r * ad->in;
        gm_backend_download(be, p, ad->B, (size_t)(ad->out * r) * sizeof(float));
        snprintf(name, sizeof name, "blk.%d.%s.lora_b", ad->layer, g);
        gm_gguf_add_tensor(w, name, GM_F32, 2, (const int64_t[]){ad->out, r}, p);
        p += ad->out * r;
    }
    if (s == GM_OK) s = gm_backend_status(be, err);
    if (s == GM_OK) s = gm_gguf_write(w, path, err);
    gm_free(host);
    gm_gguf_writer_free(w);
    return s;
}

/* The buffer of a's image path or audio encoder under PEFT key `name` (*n floats), or NULL. */
static const float *image_buffer(const gm_adapter *a, const char *name, int64_t *n) {
    const gm_lora *parts[2] = {&a->vision_lora, &a->audio_lora};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < parts[k]->n; i++) {
            const gm_lora_adapter *ad = &parts[k]->ad[i];
            if (strcmp(name, ad->name_A) == 0) return *n = parts[k]->cfg.rank * ad->in, ad->A;
            if (strcmp(name, ad->name_B) == 0) return *n = ad->out * parts[k]->cfg.rank, ad->B;
        }
    if (a->has_proj && strcmp(name, proj_names[0]) == 0) return *n = a->proj_C * a->proj_C_text, a->vision.proj_w;
    if (a->has_proj && strcmp(name, proj_names[1]) == 0) return *n = a->proj_C, a->vision.proj_norm_w;
    return NULL;
}

/* A trained tensor outside the decoder's adapters: the image path's, the audio encoder's. */
static bool image_key(const char *name) {
    return strstr(name, "vision_tower.") || strstr(name, "multi_modal_projector.") || strstr(name, "audio_tower.");
}

gm_status gm_adapter_to_trainer(const gm_adapter *a, gm_backend *a_be, gm_trainer *tr, gm_error *err) {
    const gm_lora *src = &a->lora, *dst = gm_trainer_lora(tr);
    /* a trained image path: the run trains exactly its parts, tensor by tensor (an adapter
     * without one leaves the run's image path as it starts) */
    int np = 0, n_image = 0;
    const gm_train_param *pp = gm_trainer_params(tr, &np);
    int64_t image_max = 1;
    bool has_image = a->vision_lora.n > 0 || a->has_proj || a->audio_lora.n > 0;
    for (int i = 0; i < np && has_image; i++) {
        if (!image_key(pp[i].name)) continue;
        int64_t n = 0;
        if (!image_buffer(a, pp[i].name, &n))
            return gm_error_set(err, GM_ERR_INVALID, "the run trains %s, which %s has not (%s select more than it trained)",
                                pp[i].name, a->source,
                                strstr(pp[i].name, "audio_tower.") ? "audio_targets" : "vision_targets / modules_to_save");
        if (n != pp[i].n)
            return gm_error_set(err, GM_ERR_INVALID, "%s: %s holds %lld values, the run's %lld", a->source, pp[i].name,
                                (long long)n, (long long)pp[i].n);
        image_max = n > image_max ? n : image_max;
        n_image++;
    }
    if (has_image && n_image != 2 * (a->vision_lora.n + a->audio_lora.n) + (a->has_proj ? 2 : 0)) {
        if (a->audio_lora.n > 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s trained the audio encoder (LoRA on %d of its modules), which the run "
                                "does not train as it did: set audio_targets as it was trained", a->source, a->audio_lora.n);
        return gm_error_set(err, GM_ERR_INVALID, "%s trained the image path (%s), which the run does not train as it did: set "
                            "vision_targets / modules_to_save as it was trained", a->source,
                            image_parts(a->vision_lora.n, a->has_proj));
    }
    if (src->cfg.rank != dst->cfg.rank)
        return gm_error_set(err, GM_ERR_INVALID, "%s has rank %d, the run %d: set train.rank = %d", a->source, src->cfg.rank,
                            dst->cfg.rank, src->cfg.rank);
    if (src->scaling != dst->scaling || src->cfg.rslora != dst->cfg.rslora)
        return gm_error_set(err, GM_ERR_INVALID, "%s has alpha %g%s, the run alpha %g%s: set train.alpha = %g, train.rslora = %s",
                            a->source, (double)src->cfg.alpha, src->cfg.rslora ? " (rsLoRA)" : "", (double)dst->cfg.alpha,
                            dst->cfg.rslora ? " (rsLoRA)" : "", (double)src->cfg.alpha, src->cfg.rslora ? "true" : "false");
    for (int i = 0; i < src->n; i++) {
        const gm_lora_adapter *x = &src->ad[i];
        if (x->layer >= dst->n_layers || dst->index[x->layer * dst->n_slots + x->slot] < 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s has an adapter on %s, which the run's train.targets / train.layers do "
                                "not select", a->source, x->module);
    }
    for (int i = 0; i < dst->n; i++) {
        const gm_lora_adapter *y = &dst->ad[i];
        if (y->layer >= src->n_layers || src->index[y->layer * src->n_slots + y->slot] < 0)
            return gm_error_set(err, GM_ERR_INVALID, "the run adapts %s, which %s has no adapter for (train.targets / "
                                "train.layers select more modules than it has)", y->module, a->source);
    }
    const int64_t r = src->cfg.rank;
    float *buf = gm_malloc((size_t)(r * src->in_max > 0 ? r * src->in_max : 1) * sizeof *buf);
    int64_t out_max = 1;
    for (int i = 0; i < src->n; i++) out_max = src->ad[i].out > out_max ? src->ad[i].out : out_max;
    float *bufB = gm_malloc((size_t)(out_max * r) * sizeof *bufB);
    if (!buf || !bufB) {
        gm_free(buf), gm_free(bufB);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < dst->n; i++) {
        const gm_lora_adapter *y = &dst->ad[i], *x = &src->ad[src->index[y->layer * src->n_slots + y->slot]];
        gm_backend_download(a_be, buf, x->A, (size_t)(r * x->in) * sizeof *buf);
        gm_backend_download(a_be, bufB, x->B, (size_t)(x->out * r) * sizeof *bufB);
        gm_trainer_write_adapter(tr, i, 'A', buf);
        gm_trainer_write_adapter(tr, i, 'B', bufB);
    }
    gm_free(buf), gm_free(bufB);
    float *img = n_image ? gm_malloc((size_t)image_max * sizeof *img) : NULL;
    if (n_image && !img) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < np && n_image; i++) {
        int64_t n = 0;
        const float *b = image_key(pp[i].name) ? image_buffer(a, pp[i].name, &n) : NULL;
        if (!b) continue;
        gm_backend_download(a_be, img, b, (size_t)n * sizeof *img);
        gm_trainer_write_param(tr, i, img);
    }
    gm_free(img);
    return gm_backend_status(a_be, err);
}

void gm_adapter_free(gm_adapter *a) {
    if (!a) return;
    gm_arena_free(&a->arena);
    gm_lora_free(&a->lora);
    gm_lora_free(&a->vision_lora);
    gm_lora_free(&a->audio_lora);
    gm_free(a);
}
