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

/* Does trial (id, 1-based index) answer to `want`: an index (a short number, as `gemmarun
 * x.lua --trial N` takes), or the id or a prefix of it of at least 6 characters (ids are 12 hex
 * digits, so a short number is never read as an id prefix)? */
static bool trial_matches(const char *want, const char *id, int64_t index) {
    size_t n = strlen(want);
    if (all_digits(want) && strtoll(want, NULL, 10) == index) return true;
    return n >= 6 && strncmp(id, want, n) == 0;
}

/* ---- choosing the trial of a folder ------------------------------------------------------- */

/* Picks the trial file of results folder `dir` (see gm_adapter.h) into path. */
static gm_status pick_trial_file(const char *dir, const char *trial, char *path, size_t cap, gm_error *err) {
    DIR *d = opendir(dir);
    if (!d) return gm_error_set(err, GM_ERR_IO, "%s: cannot open the folder", dir);
    char found[8][1200], listing[1024] = "";
    int n_found = 0, n_trials = 0;
    size_t ln = 0;
    struct { int64_t index; char text[96]; } seen[64]; /* the listing, sorted by index below */
    int n_seen = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        /* trial-<id>.h5 only: not checkpoints (trial-<id>.ckpt.h5) nor saves in flight */
        if (strncmp(name, "trial-", 6) != 0 || !ends_with(name, ".h5") || strchr(name + 6, '.') != name + strlen(name) - 3)
            continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, name);
        gm_h5_file *f = NULL;
        gm_error ignore = {0};
        if (gm_h5_open(p, false, &f, &ignore) != GM_OK) continue;
        char *id = NULL, *status = NULL;
        int64_t index = 0;
        gm_h5_attr_get_str(f, "/", "trial_id", &id, &ignore);
        gm_h5_attr_get_str(f, "/", "status", &status, &ignore);
        gm_h5_attr_get_i64(f, "/", "trial_index", &index, &ignore);
        bool has_adapter = gm_h5_exists(f, "/adapter");
        gm_h5_close(&f, NULL);
        n_trials++;
        if (n_seen < 64) {
            seen[n_seen].index = index;
            snprintf(seen[n_seen++].text, sizeof seen[0].text, "%lld (%s, %s%s)", (long long)index, id ? id : "?",
                     status ? status : "?", has_adapter ? "" : ", no adapter");
        }
        bool match = has_adapter && (trial && *trial ? trial_matches(trial, id ? id : "", index) : true);
        if (match && n_found < 8) snprintf(found[n_found++], sizeof found[0], "%s", p);
        gm_free(id), gm_free(status);
    }
    closedir(d);
    for (int i = 1; i < n_seen; i++) /* insertion sort by index: a few dozen trials */
        for (int j = i; j > 0 && seen[j].index < seen[j - 1].index; j--) {
            __typeof__(seen[0]) t = seen[j];
            seen[j] = seen[j - 1], seen[j - 1] = t;
        }
    for (int i = 0; i < n_seen && ln < sizeof listing; i++)
        ln += (size_t)snprintf(listing + ln, sizeof listing - ln, "%s%s", i ? ", " : "", seen[i].text);
    if (n_seen < n_trials && ln < sizeof listing) snprintf(listing + ln, sizeof listing - ln, ", ...");
    if (n_trials == 0)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial files (trial-<id>.h5) in this folder", dir);
    if (n_found == 1) {
        snprintf(path, cap, "%s", found[0]);
        return GM_OK;
    }
    if (n_found == 0)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial %s%swith an adapter; trials: %s", dir,
                            trial && *trial ? trial : "", trial && *trial ? " " : "", listing);
    return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: several trials have an adapter; choose one with --trial (its index or id): %s",
                        dir, listing);
}

/* ---- reading ------------------------------------------------------------------------------ */

/* LoRA alpha and rsLoRA from a stored configuration (the runner's trial config). */
static gm_status scaling_of(const char *config_json, const char *where, gm_lora_config *lc, gm_error *err) {
    cJSON *j = config_json ? cJSON_Parse(config_json) : NULL;
    const cJSON *alpha = j ? cJSON_GetObjectItemCaseSensitive(j, "alpha") : NULL;
    const cJSON *rs = j ? cJSON_GetObjectItemCaseSensitive(j, "rslora") : NULL;
    gm_status s = GM_OK;
    if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0))
        s = gm_error_set(err, GM_ERR_FORMAT,
                         "%s: the stored configuration does not give the LoRA alpha, so the adapter's scaling is unknown\n"
                         "  hint: save checkpoints with their config (trainer:save(path, {config = ...}))", where);
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
    if (s == GM_OK) s = scaling_of(cfg, path, &lc, err);
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
    char file[1200];
    if (is_dir(path)) GM_TRY(pick_trial_file(path, trial, file, sizeof file, err));
    else snprintf(file, sizeof file, "%s", path);
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
    } else if (strcmp(format, "gemmarun-results") == 0 || strcmp(format, "gemmarun-checkpoint") == 0) {
        bool ckpt = strcmp(format, "gemmarun-checkpoint") == 0;
        char *id = NULL;
        if (!ckpt && gm_h5_attr_get_str(f, "/", "trial_id", &id, NULL) == GM_OK) snprintf(a->trial_id, sizeof a->trial_id, "%s", id);
        gm_free(id);
        if (ckpt) gm_h5_attr_get_i64(f, "/", "step", &a->step, NULL);
        if (!gm_h5_exists(f, "/adapter"))
            s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no adapter in this file (a trial stores it when it completes; "
                             "its checkpoint %s holds the latest one)", file, ckpt ? "" : "trial-<id>.ckpt.h5");
        else s = read_adapter(m, be, f, "/adapter", "/", a, err);
    } else if (strcmp(format, "gemmarun-results-merged") == 0) {
        gm_h5_child *ch = NULL;
        int n = 0;
        char group[256] = "";
        s = gm_h5_list(f, "/trial", &ch, &n, err);
        int hits = 0;
        for (int i = 0; i < n && s == GM_OK; i++) {
            char obj[256];
            snprintf(obj, sizeof obj, "/trial/%s", ch[i].name);
            int64_t index = 0;
            gm_h5_attr_get_i64(f, obj, "trial_index", &index, NULL);
            const char *id = strncmp(ch[i].name, "trial-", 6) == 0 ? ch[i].name + 6 : ch[i].name;
            if (trial && *trial && trial_matches(trial, id, index)) {
                snprintf(group, sizeof group, "%s", obj);
                snprintf(a->trial_id, sizeof a->trial_id, "%s", id);
                hits++;
            }
        }
        gm_h5_list_free(ch, n);
        if (s == GM_OK && (!trial || !*trial))
            s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: a merged results file holds %d trials; choose one with --trial", file, n);
        else if (s == GM_OK && hits != 1)
            s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: %s trial '%s' (by index or id)", file, hits ? "more than one" : "no",
                             trial);
        char ag[300];
        snprintf(ag, sizeof ag, "%s/adapter", group);
        if (s == GM_OK && !gm_h5_exists(f, ag))
            s = gm_error_set(err, GM_ERR_NOT_FOUND,
                             "%s: trial %s was merged without its adapter\n  hint: use its trial file in the results folder, "
                             "or merge with adapters = true", file, a->trial_id);
        if (s == GM_OK) s = read_adapter(m, be, f, ag, group, a, err);
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
