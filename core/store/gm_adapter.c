/*
 * gm_adapter.c - reading a trained adapter from a trial file, a results folder, a merged results
 * file or a checkpoint (see gm_adapter.h).
 */
#include "gm_adapter.h"

#include "gm_alloc.h"
#include "gm_h5.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
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
    char where[1200];   /* its trial file (folder) or its group (merged file) */
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
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, name);
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
        char ag[1300];
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
 * the one with the same "layers.N.<module>" tail. */
static const char *file_key(const char *module, char (*keys)[192], int n) {
    const char *tail = strstr(module, "layers.");
    for (int i = 0; i < n; i++) {
        const char *t = strstr(keys[i], "layers.");
        if (t && tail && strcmp(t, tail) == 0) return keys[i];
    }
    return NULL;
}

/* Reads the adapter group `group` of open file f (config from attribute config_json of
 * `config_obj`) into a. */
static gm_status read_adapter(const gm_model *m, gm_backend *be, gm_h5_file *f, const char *group, const char *config_obj,
                              gm_adapter *a, gm_error *err) {
    const char *path = gm_h5_path(f);
    gm_h5_child *ch = NULL;
    int n = 0;
    GM_TRY(gm_h5_list(f, group, &ch, &n, err));
    const char **modules = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *modules);
    char (*keys)[192] = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *keys);
    gm_status s = modules && keys ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    int nm = 0;
    int64_t rank = 0;
    /* the modules: every "<key>.lora_A.weight" (module = key without PEFT's "base_model.model.") */
    for (int i = 0; i < n && s == GM_OK; i++) {
        const char *name = ch[i].name;
        if (ch[i].kind != GM_H5_DATASET || !ends_with(name, A_SUFFIX)) continue;
        snprintf(keys[nm], sizeof keys[nm], "%.*s", (int)(strlen(name) - strlen(A_SUFFIX)), name);
        modules[nm] = strncmp(keys[nm], PEFT_PREFIX, strlen(PEFT_PREFIX)) == 0 ? keys[nm] + strlen(PEFT_PREFIX) : keys[nm];
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
        nm++;
    }
    gm_h5_list_free(ch, n);
    if (s == GM_OK && nm == 0) s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: %s holds no LoRA tensors (*%s)", path, group, A_SUFFIX);
    gm_lora_config lc = gm_lora_config_default();
    lc.rank = (int)rank;
    char *cfg = NULL;
    if (s == GM_OK && gm_h5_attr_get_str(f, config_obj, "config_json", &cfg, err) != GM_OK) cfg = NULL;
    if (s == GM_OK) s = scaling_of(f, config_obj, cfg, path, &lc, err);
    gm_free(cfg);
    if (s == GM_OK) s = gm_lora_describe_modules(&a->lora, &lc, m->arch, &m->cfg, m->prefix, modules, nm, err);
    if (s == GM_OK && a->lora.n != nm)
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: %d adapter modules listed, %d distinct", path, nm, a->lora.n);
    if (s == GM_OK) { /* buffers on the backend */
        gm_backend_arena(be, &a->arena, "adapter");
        gm_lora_layout(&a->lora, &a->arena, false);
        s = gm_arena_commit(&a->arena, err);
    }
    int64_t io_max = 1;
    if (s == GM_OK) {
        gm_lora_layout(&a->lora, &a->arena, false);
        for (int i = 0; i < a->lora.n; i++) {
            io_max = a->lora.ad[i].in > io_max ? a->lora.ad[i].in : io_max;
            io_max = a->lora.ad[i].out > io_max ? a->lora.ad[i].out : io_max;
        }
    }
    float *stage = s == GM_OK ? gm_malloc((size_t)(rank * io_max) * sizeof(float)) : NULL;
    if (s == GM_OK && !stage) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* each tensor through host staging; gm_h5_read checks the shapes this model needs */
    for (int i = 0; i < a->lora.n && s == GM_OK; i++) {
        gm_lora_adapter *ad = &a->lora.ad[i];
        const char *key = file_key(ad->module, keys, nm);
        char ds[400];
        int64_t shA[2] = {rank, ad->in}, shB[2] = {ad->out, rank};
        snprintf(ds, sizeof ds, "%s/%s.lora_A.weight", group, key);
        s = gm_h5_read(f, ds, GM_F32, 2, shA, stage, err);
        if (s == GM_OK) gm_backend_upload(be, ad->A, stage, (size_t)(rank * ad->in) * sizeof(float));
        snprintf(ds, sizeof ds, "%s/%s.lora_B.weight", group, key);
        if (s == GM_OK) s = gm_h5_read(f, ds, GM_F32, 2, shB, stage, err);
        if (s == GM_OK) gm_backend_upload(be, ad->B, stage, (size_t)(ad->out * rank) * sizeof(float));
        if (s != GM_OK) gm_error_prefix(err, "adapter of %s", ad->module);
    }
    gm_free(stage);
    gm_free(modules), gm_free(keys);
    if (s == GM_OK) s = gm_backend_status(be, err);
    return s;
}

gm_status gm_adapter_load(const gm_model *m, gm_backend *be, const char *path, const char *trial, gm_adapter **out,
                          gm_error *err) {
    *out = NULL;
    if (!path || !*path) return gm_error_set(err, GM_ERR_INVALID, "no adapter path given");
    char file[1200];
    bool from_folder = is_dir(path);
    if (from_folder) {
        cand *c = NULL;
        int n = 0, pick = -1;
        GM_TRY(folder_trials(path, &c, &n, err));
        gm_status s = choose(c, n, trial, path, &pick, err);
        if (s == GM_OK) snprintf(file, sizeof file, "%s", c[pick].where);
        gm_free(c);
        if (s != GM_OK) return s;
    } else {
        snprintf(file, sizeof file, "%s", path);
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
            char ag[1300];
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

void gm_adapter_free(gm_adapter *a) {
    if (!a) return;
    gm_arena_free(&a->arena);
    gm_lora_free(&a->lora);
    gm_free(a);
}
