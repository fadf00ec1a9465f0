/*
 * gm_checkpoint.c - training checkpoints: layout in gm_checkpoint.h, HDF5 through gm_h5.
 *
 * Save: validate the caller's tensor list (names usable as HDF5 link names, unique, ranks
 * 0..4), build the whole file in memory (HDF5 core driver), then gm_h5_save_atomic: the image
 * into <path>.tmp with write(2), fsync, rename() onto <path>, fsync the folder (formats.md
 * §7.3). rename() within one folder is atomic on POSIX file systems: a reader, or a run resumed
 * after a kill -9 or a power cut, sees either the old file or the new one. A failed save
 * removes its .tmp; a killed one leaves it, and the next save truncates it.
 * Why in memory: HDF5 1.10.8 cannot survive a failing write during a flush or close of a disk
 * file (disk full): it crashes the process at exit (gm_h5.h). With the image written by our own
 * loop, disk errors are plain errno values. The cost is memory: the image plus a copy of it
 * (2x the checkpoint size) during the save; LoRA checkpoints are small next to the model.
 * Rejected: writing in place with H5Fflush (a crash mid-flush can damage the only copy,
 * formats.md §7.2) and SWMR (needs libver=latest, whose status flag lingers after a crash).
 *
 * Load: open, check the root `format` and `version` attributes, then check every requested
 * tensor (exists, f32, exactly the caller's shape) before reading any of them, so a mismatch
 * leaves the caller's buffers and scalars untouched; then read the tensors, then set the
 * scalars.
 */
#include "gm_checkpoint.h"

#include "gm_alloc.h" // gm_malloc, gm_free, gm_strdup
#include "gm_h5.h"    // the HDF5 layer

#include <stdio.h>
#include <string.h>

#define CKPT_FORMAT "gemmarun-checkpoint"
#define CKPT_VERSION 1
/* GM_VERSION comes from project(VERSION) in CMakeLists.txt. */
#define CKPT_CREATED_BY "gemmarun " GM_VERSION

#define HINT_CONFIG                                                                           \
    "hint: the checkpoint was saved by a run with another adapter configuration (model, LoRA " \
    "rank or target modules); resume with that configuration or start a new run"

/* The three tensor groups, in the order of gm_ckpt_tensor's data, m, v. */
static const char *const group_of[3] = {"/adapter", "/optimizer/m", "/optimizer/v"};
static const char *const role_of[3] = {"weights", "AdamW first moment", "AdamW second moment"};

static float *buffer_of(const gm_ckpt_tensor *t, int k) {
    return k == 0 ? t->data : k == 1 ? t->m : t->v;
}

/* gm_malloc'd concatenation a + sep + b (sep may be ""). */
static char *join3(const char *a, const char *sep, const char *b) {
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = gm_malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
    return buf;
}

/* The caller's tensor list: usable names, ranks, a data buffer each, no name twice. */
static gm_status check_list(const char *path, const gm_ckpt *c, gm_error *err) {
    if (!c || c->n_tensors < 0 || (c->n_tensors > 0 && !c->tensors))
        return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: bad tensor list", path);
    for (int i = 0; i < c->n_tensors; i++) {
        const gm_ckpt_tensor *t = &c->tensors[i];
        if (!t->name || !t->name[0] || strchr(t->name, '/') || strcmp(t->name, ".") == 0)
            return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: tensor %d has an unusable "
                                "name '%s' (empty, '.', or containing '/')", path, i,
                                t->name ? t->name : "(null)");
        if (t->ndim < 0 || t->ndim > GM_H5_MAX_DIMS)
            return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: tensor '%s' has rank %d "
                                "(0..%d)", path, t->name, t->ndim, GM_H5_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: tensor '%s' has a "
                                    "negative dimension", path, t->name);
        if (!t->data)
            return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: tensor '%s' has no data "
                                "buffer", path, t->name);
        for (int j = 0; j < i; j++)
            if (strcmp(c->tensors[j].name, t->name) == 0)
                return gm_error_set(err, GM_ERR_INVALID, "checkpoint %s: tensor '%s' is listed "
                                    "twice", path, t->name);
    }
    return GM_OK;
}

/* ---- save --------------------------------------------------------------------------------- */

static gm_status write_contents(gm_h5_file *f, const gm_ckpt *c, gm_error *err) {
    GM_TRY(gm_h5_attr_set_str(f, "/", "format", CKPT_FORMAT, err));
    GM_TRY(gm_h5_attr_set_i64(f, "/", "version", CKPT_VERSION, err));
    GM_TRY(gm_h5_attr_set_i64(f, "/", "step", c->step, err));
    GM_TRY(gm_h5_attr_set_i64(f, "/", "epoch", c->epoch, err));
    GM_TRY(gm_h5_attr_set_i64(f, "/", "data_pos", c->data_pos, err));
    GM_TRY(gm_h5_attr_set_u64(f, "/", "rng_seed", c->rng_seed, err));
    GM_TRY(gm_h5_attr_set_u64(f, "/", "rng_counter", c->rng_counter, err));
    GM_TRY(gm_h5_attr_set_f64(f, "/", "loss", c->loss, err));
    GM_TRY(gm_h5_attr_set_str(f, "/", "config_json", c->config_json ? c->config_json : "{}", err));
    if (c->lora_alpha > 0) { /* the adapters' scaling, whatever config_json says (gm_adapter.h) */
        GM_TRY(gm_h5_attr_set_f64(f, "/", "lora_alpha", c->lora_alpha, err));
        GM_TRY(gm_h5_attr_set_i64(f, "/", "lora_rslora", c->lora_rslora ? 1 : 0, err));
    }
    GM_TRY(gm_h5_attr_set_str(f, "/", "created_by", CKPT_CREATED_BY, err));
    for (int k = 0; k < 3; k++) GM_TRY(gm_h5_group_create(f, group_of[k], err));
    for (int i = 0; i < c->n_tensors; i++) {
        const gm_ckpt_tensor *t = &c->tensors[i];
        for (int k = 0; k < 3; k++) {
            const float *buf = buffer_of(t, k);
            if (!buf) continue;
            char *name = join3(group_of[k], "/", t->name);
            if (!name)
                return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
            gm_status s = gm_h5_write(f, name, GM_F32, t->ndim, t->shape, buf, err);
            gm_free(name);
            if (s != GM_OK) return s;
        }
    }
    return GM_OK;
}

/* Expected file size: the tensor bytes plus HDF5's own structures (object headers, B-trees,
 * heaps: about 1-2 KiB per dataset, measured with h5stat; 4 KiB each keeps a margin). */
static size_t expected_size(const gm_ckpt *c) {
    size_t bytes = (size_t)1 << 16;
    for (int i = 0; i < c->n_tensors; i++) {
        const gm_ckpt_tensor *t = &c->tensors[i];
        size_t n = sizeof(float);
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        for (int k = 0; k < 3; k++)
            if (buffer_of(t, k)) bytes += n + 4096;
    }
    return bytes;
}

gm_status gm_ckpt_save(const char *path, const gm_ckpt *c, gm_error *err) {
    GM_TRY(check_list(path, c, err));
    gm_h5_file *f = NULL;
    // the whole file is built in memory (HDF5 never writes to the disk itself, see gm_h5.h),
    // then put in place by <path>.tmp + fsync + rename + folder fsync
    gm_status s = gm_h5_create_memory(path, expected_size(c), &f, err);
    if (s == GM_OK) s = write_contents(f, c, err);
    if (s == GM_OK) s = gm_h5_save_atomic(f, path, err);
    gm_h5_close(&f, NULL); // a memory file: nothing to fail
    if (s != GM_OK) gm_error_prefix(err, "saving checkpoint %s", path);
    return s;
}

/* ---- load --------------------------------------------------------------------------------- */

/* A required root attribute: absent means "not a (complete) checkpoint", GM_ERR_FORMAT. */
static gm_status need(gm_status s, const char *path, const char *name, gm_error *err) {
    if (s == GM_ERR_NOT_FOUND)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: not a complete gemmarun checkpoint: the root "
                            "attribute '%s' is missing", path, name);
    return s;
}

/* Opens `path` read-only and checks that it is a checkpoint of the version this build reads. */
static gm_status open_checkpoint(const char *path, gm_h5_file **out, gm_error *err) {
    gm_h5_file *f = NULL;
    GM_TRY(gm_h5_open(path, false, &f, err));
    char *format = NULL;
    int64_t version = 0;
    gm_status s = gm_h5_attr_get_str(f, "/", "format", &format, err);
    bool other = s == GM_OK && strcmp(format, CKPT_FORMAT) != 0;
    if (s == GM_ERR_NOT_FOUND || s == GM_ERR_FORMAT || other) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: an HDF5 file, but not a gemmarun checkpoint "
                         "(root attribute format = %s%.64s%s, expected '%s')", path,
                         format ? "'" : "", format ? format : "(none)", format ? "'" : "",
                         CKPT_FORMAT);
        goto cleanup;
    }
    if (s != GM_OK) goto cleanup;
    s = need(gm_h5_attr_get_i64(f, "/", "version", &version, err), path, "version", err);
    if (s != GM_OK) goto cleanup;
    if (version != CKPT_VERSION) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: checkpoint version %lld, this build reads "
                         "version %d; hint: resume with the gemmarun that wrote it", path,
                         (long long)version, CKPT_VERSION);
        goto cleanup;
    }
cleanup:
    gm_free(format);
    if (s != GM_OK) {
        gm_h5_close(&f, NULL);
        return s;
    }
    *out = f;
    return GM_OK;
}

/* Every requested tensor exists, is f32 and has exactly the caller's shape. */
static gm_status check_tensors(gm_h5_file *f, const char *path, const gm_ckpt *c, gm_error *err) {
    for (int i = 0; i < c->n_tensors; i++) {
        const gm_ckpt_tensor *t = &c->tensors[i];
        for (int k = 0; k < 3; k++) {
            if (!buffer_of(t, k)) continue;
            char *name = join3(group_of[k], "/", t->name);
            if (!name) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
            gm_dtype dt;
            int nd = 0;
            int64_t shape[GM_H5_MAX_DIMS];
            gm_status s = gm_h5_dataset_info(f, name, &dt, &nd, shape, err);
            char a[128], b[128];
            if ((s == GM_ERR_NOT_FOUND || s == GM_ERR_FORMAT) && k == 0)
                s = gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' is missing (no dataset %s); "
                                 HINT_CONFIG, path, t->name, name);
            else if (s == GM_ERR_NOT_FOUND || s == GM_ERR_FORMAT) // weights present (k=0 passed)
                s = gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' has no %s in the file (no "
                                 "dataset %s); hint: it was saved without optimizer state: load "
                                 "the weights only (m = v = NULL) and start the optimizer afresh",
                                 path, t->name, role_of[k], name);
            else if (s == GM_OK && dt != GM_F32)
                s = gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' (%s) is stored as %s, "
                                 "expected f32", path, t->name, name,
                                 dt == GM_DTYPE_COUNT ? "a non-numeric type" : gm_dtype_name(dt));
            else if (s == GM_OK &&
                     (nd != t->ndim || memcmp(shape, t->shape, (size_t)nd * sizeof *shape)))
                s = gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' (%s) has shape %s in the "
                                 "file, expected %s; " HINT_CONFIG, path, t->name, name,
                                 shape_str(a, sizeof a, nd, shape),
                                 shape_str(b, sizeof b, t->ndim, t->shape));
            gm_free(name);
            if (s != GM_OK) return s;
        }
    }
    return GM_OK;
}

static gm_status read_tensors(gm_h5_file *f, const gm_ckpt *c, gm_error *err) {
    for (int i = 0; i < c->n_tensors; i++) {
        const gm_ckpt_tensor *t = &c->tensors[i];
        for (int k = 0; k < 3; k++) {
            float *buf = buffer_of(t, k);
            if (!buf) continue;
            char *name = join3(group_of[k], "/", t->name);
            if (!name) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
            gm_status s = gm_h5_read(f, name, GM_F32, t->ndim, t->shape, buf, err);
            gm_free(name);
            if (s != GM_OK) return s;
        }
    }
    return GM_OK;
}

/* The scalar fields from the root attributes, into `got` (the caller's copy). */
static gm_status read_scalars(gm_h5_file *f, const char *path, gm_ckpt *got, gm_error *err) {
    const struct {
        const char *name;
        char kind; // 'i' int64, 'u' uint64, 'f' float64
        void *dst;
    } rows[] = {
        {"step", 'i', &got->step},          {"epoch", 'i', &got->epoch},
        {"data_pos", 'i', &got->data_pos},  {"rng_seed", 'u', &got->rng_seed},
        {"rng_counter", 'u', &got->rng_counter}, {"loss", 'f', &got->loss},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *name = rows[i].name;
        gm_status s = rows[i].kind == 'i' ? gm_h5_attr_get_i64(f, "/", name, rows[i].dst, err)
                      : rows[i].kind == 'u' ? gm_h5_attr_get_u64(f, "/", name, rows[i].dst, err)
                                            : gm_h5_attr_get_f64(f, "/", name, rows[i].dst, err);
        GM_TRY(need(s, path, name, err));
    }
    return GM_OK;
}

gm_status gm_ckpt_load(const char *path, gm_ckpt *c, gm_error *err) {
    GM_TRY(check_list(path, c, err));
    gm_h5_file *f = NULL;
    GM_TRY(open_checkpoint(path, &f, err));
    gm_ckpt got = *c;
    gm_status s;
    if ((s = read_scalars(f, path, &got, err)) != GM_OK ||
        (s = check_tensors(f, path, c, err)) != GM_OK || (s = read_tensors(f, c, err)) != GM_OK)
        goto cleanup;
    c->step = got.step;
    c->epoch = got.epoch;
    c->data_pos = got.data_pos;
    c->rng_seed = got.rng_seed;
    c->rng_counter = got.rng_counter;
    c->loss = got.loss;
cleanup:
    gm_h5_close(&f, NULL); // read-only: nothing to flush, a close failure changes nothing read
    return s;
}

gm_status gm_ckpt_read_config(const char *path, char **out, gm_error *err) {
    *out = NULL;
    gm_h5_file *f = NULL;
    GM_TRY(open_checkpoint(path, &f, err));
    gm_status s = gm_h5_attr_get_str(f, "/", "config_json", out, err);
    s = need(s, path, "config_json", err);
    gm_h5_close(&f, NULL);
    return s;
}
