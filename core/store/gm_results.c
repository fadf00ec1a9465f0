/*
 * gm_results.c - trial results files, their readers and the merged table (layout: gm_results.h,
 * results/README.md).
 *
 * Writing: a gm_results handle owns an in-memory HDF5 file (gm_h5_create_memory) that every
 * setter changes in place; gm_results_save puts the complete image on disk with
 * gm_h5_save_atomic. Resuming: gm_results_open of an existing file opens it read-only and copies
 * every object (H5Ocopy: groups recursively, datasets with their chunking and unlimited
 * max size, so metric series stay appendable) and every root attribute into a fresh memory
 * file; the file on disk is never opened for writing. Rejected: opening the disk file read-write
 * and flushing after each change (a kill during a flush can damage the only copy, and HDF5
 * 1.10.8 crashes at exit after a failed write; formats.md §7.2, gm_h5.h), and SWMR (needs
 * libver=latest, whose status flag lingers after a crash).
 *
 * Metrics form a table: every series has one entry per logged row (NaN where a row had no value
 * for it), so pandas can build a DataFrame from /metrics without aligning anything.
 *
 * Reading is generic over attributes (H5Aiterate: whatever the scalar attributes of a group
 * are, with their types), so the readers need no change when the runner stores one more field.
 * The merged file's table is a PyTables-style compound dataset made with H5TBmake_table (hdf5_hl;
 * formats.md §7.1: read by pandas.read_hdf and by h5py), with fixed-length string columns.
 *
 * HDF5 calls not wrapped by gm_h5 are made here on gm_h5_raw_id, each hid_t closed on one
 * cleanup path; errors carry HDF5's error stack through gm_h5_error_set.
 */
#define _GNU_SOURCE // gmtime_r
#include "gm_results.h"

#include "gm_alloc.h" // gm_malloc, gm_free, gm_strdup
#include "gm_h5.h"    // the HDF5 layer

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RESULTS_CREATED_BY "gemmarun " GM_VERSION


const char *const gm_results_ex_names[GM_RESULTS_EX_LISTS] = {"example_index", "predictions", "references",
                                                             "example_word_errors", "example_words",
                                                             "example_phone_errors", "example_phones"};

/* Groups every trial file has (created empty, so readers and users find them). */
static const char *const GROUPS[] = {"/config", "/metrics", "/eval",       "/memory",
                                     "/data",   "/adapter", "/provenance"};
#define N_GROUPS ((int)(sizeof GROUPS / sizeof GROUPS[0]))

/* Root attributes with a fixed type (results/README.md); others are stored as given. */
typedef struct known_attr {
    const char *name;
    gm_results_vkind kind;
    bool reserved; // set by this module only
    bool json;     // must parse as JSON
} known_attr;

static const known_attr ROOT_ATTRS[] = {
    {"format", GM_RV_STR, true, false},        {"version", GM_RV_I64, true, false},
    {"created_by", GM_RV_STR, true, false},    {"experiment", GM_RV_STR, false, false},
    {"trial_id", GM_RV_STR, false, false},     {"trial_index", GM_RV_I64, false, false},
    {"n_trials", GM_RV_I64, false, false},     {"status", GM_RV_STR, false, false},
    {"reason", GM_RV_STR, false, false},       {"config_json", GM_RV_STR, false, true},
    {"report_json", GM_RV_STR, false, true},   {"swept_json", GM_RV_STR, false, true},
    {"started_at", GM_RV_STR, false, false},   {"finished_at", GM_RV_STR, false, false},
    {"wall_seconds", GM_RV_F64, false, false},
};

static const char *const STATUSES[] = {"running", "completed", "failed", "interrupted"};

struct gm_results {
    gm_h5_file *f; // the in-memory file
    char *path;    // where gm_results_save puts it
    bool resumed;
    char **series; // names of the /metrics series (gm_strdup'd)
    int n_series, cap_series;
    int64_t rows; // entries in every series
};

/* ---- small helpers ------------------------------------------------------------------------ */

/* A usable HDF5 link name: non-empty, no '/', not "." or "..". */
static bool name_ok(const char *s) {
    return s && s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static gm_status bad_name(const char *path, const char *what, const char *name, gm_error *err) {
    return gm_error_set(err, GM_ERR_INVALID,
                        "%s: unusable %s name '%s' (it must be non-empty, "
                        "without '/', and not '.' or '..')",
                        path, what, name ? name : "(null)");
}

/* gm_malloc'd a + b (+ c). */
static char *cat3(const char *a, const char *b, const char *c) {
    size_t la = strlen(a), lb = strlen(b), lc = c ? strlen(c) : 0;
    char *s = gm_malloc(la + lb + lc + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    if (c) memcpy(s + la + lb, c, lc);
    s[la + lb + lc] = '\0';
    return s;
}

void gm_results_now_iso(char *buf, int cap) {
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    if (cap > 0 && strftime(buf, (size_t)cap, "%Y-%m-%dT%H:%M:%SZ", &tmv) == 0) buf[0] = '\0';
}

static const known_attr *known(const char *name) {
    for (size_t i = 0; i < sizeof ROOT_ATTRS / sizeof ROOT_ATTRS[0]; i++)
        if (strcmp(ROOT_ATTRS[i].name, name) == 0) return &ROOT_ATTRS[i];
    return NULL;
}

/* Deletes the link `path` if present (a replaced eval or adapter tensor). In a memory file the
 * space is reused by later allocations of this session. */
static gm_status unlink_if_present(gm_results *r, const char *path, gm_error *err) {
    if (!gm_h5_exists(r->f, path)) return GM_OK;
    if (H5Ldelete((hid_t)gm_h5_raw_id(r->f), path, H5P_DEFAULT) < 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot replace %s", r->path, path);
    return GM_OK;
}

/* ---- generic attributes: copy and read ---------------------------------------------------- */

typedef struct copy_ctx {
    hid_t dst;
    const char *label; // for messages
    gm_error *err;
    gm_status s;
} copy_ctx;

/* H5Aiterate callback: copies one attribute, whatever its type, to ctx->dst. Reading with the
 * stored type as the memory type converts nothing; vlen strings come back as pointers owned by
 * HDF5 and are written as they are, then reclaimed. */
static herr_t copy_attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *ud) {
    (void)info;
    copy_ctx *c = ud;
    hid_t a = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID, b = H5I_INVALID_HID;
    void *buf = NULL;
    bool read_ok = false;
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (type = H5Aget_type(a)) < 0 ||
        (space = H5Aget_space(a)) < 0) {
        c->s = gm_h5_error_set(c->err, GM_ERR_FORMAT, "%s: cannot open attribute '%s'", c->label,
                               name);
        goto cleanup;
    }
    hssize_t npts = H5Sget_simple_extent_npoints(space);
    size_t size = H5Tget_size(type);
    if (npts < 0 || size == 0 || !(buf = gm_calloc((size_t)(npts > 0 ? npts : 1), size))) {
        c->s = gm_error_set(c->err, GM_ERR_NOMEM, "%s: out of memory copying attribute '%s'", c->label,
                            name);
        goto cleanup;
    }
    if (H5Aread(a, type, buf) < 0) {
        c->s = gm_h5_error_set(c->err, GM_ERR_FORMAT, "%s: cannot read attribute '%s'", c->label,
                               name);
        goto cleanup;
    }
    read_ok = true;
    if (H5Aexists(c->dst, name) > 0 && H5Adelete(c->dst, name) < 0) {
        c->s =
            gm_h5_error_set(c->err, GM_ERR_IO, "%s: cannot replace attribute '%s'", c->label, name);
        goto cleanup;
    }
    if ((b = H5Acreate2(c->dst, name, type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        H5Awrite(b, type, buf) < 0) {
        c->s = gm_h5_error_set(c->err, GM_ERR_IO, "%s: cannot copy attribute '%s'", c->label, name);
        goto cleanup;
    }
cleanup:
    if (read_ok && (H5Tdetect_class(type, H5T_VLEN) > 0 || H5Tis_variable_str(type) > 0))
        H5Dvlen_reclaim(type, space, H5P_DEFAULT, buf);
    gm_free(buf);
    if (b >= 0) H5Aclose(b);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (a >= 0) H5Aclose(a);
    return c->s == GM_OK ? 0 : -1;
}

/* Copies the attributes of object `src_path` in file `src` onto object `dst_path` of `dst`, and
 * every link below it (H5Ocopy, recursive) except the names in `skip` (NULL-terminated, may be
 * NULL). `dst_path` must exist. */
static gm_status copy_tree(hid_t src, const char *src_path, hid_t dst, const char *dst_path,
                           const char *const *skip, const char *label, gm_error *err) {
    gm_status s = GM_OK;
    hid_t sg = H5I_INVALID_HID, dg = H5I_INVALID_HID;
    if ((sg = H5Oopen(src, src_path, H5P_DEFAULT)) < 0 ||
        (dg = H5Oopen(dst, dst_path, H5P_DEFAULT)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot open %s", label, src_path);
        goto cleanup;
    }
    copy_ctx c = {dg, label, err, GM_OK};
    hsize_t idx = 0;
    if (H5Aiterate2(sg, H5_INDEX_NAME, H5_ITER_INC, &idx, copy_attr_cb, &c) < 0) {
        s = c.s != GM_OK ? c.s
                         : gm_h5_error_set(err, GM_ERR_FORMAT,
                                           "%s: cannot list the attributes "
                                           "of %s",
                                           label, src_path);
        goto cleanup;
    }
    // the links: listed by name, then copied one by one
    H5G_info_t gi;
    if (H5Gget_info(sg, &gi) < 0) {
        s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: %s is not a group", label, src_path);
        goto cleanup;
    }
    for (hsize_t i = 0; i < gi.nlinks; i++) {
        char name[512];
        ssize_t len = H5Lget_name_by_idx(sg, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                                         H5P_DEFAULT);
        if (len < 0 || (size_t)len >= sizeof name) {
            s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot list %s", label, src_path);
            goto cleanup;
        }
        bool skipped = false;
        for (int k = 0; skip && skip[k]; k++) skipped = skipped || strcmp(skip[k], name) == 0;
        if (skipped) continue;
        if (H5Lexists(dg, name, H5P_DEFAULT) > 0 && H5Ldelete(dg, name, H5P_DEFAULT) < 0) {
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot replace %s", label, name);
            goto cleanup;
        }
        if (H5Ocopy(sg, name, dg, name, H5P_DEFAULT, H5P_DEFAULT) < 0) {
            s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot copy %s/%s", label,
                                strcmp(src_path, "/") == 0 ? "" : src_path, name);
            goto cleanup;
        }
    }
cleanup:
    if (dg >= 0) H5Oclose(dg);
    if (sg >= 0) H5Oclose(sg);
    return s;
}

typedef struct read_ctx {
    gm_results_attrs *out;
    int cap;
    const char *label;
    gm_error *err;
    gm_status s;
} read_ctx;

/* H5Aiterate callback: reads one scalar attribute as str, i64 or f64 (others are skipped:
 * arrays, enums, compounds are not part of our layout). */
static herr_t read_attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *ud) {
    (void)info;
    read_ctx *c = ud;
    hid_t a = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID,
          mem = H5I_INVALID_HID;
    gm_results_attr v = {0};
    if ((a = H5Aopen(loc, name, H5P_DEFAULT)) < 0 || (type = H5Aget_type(a)) < 0 ||
        (space = H5Aget_space(a)) < 0) {
        c->s = gm_h5_error_set(c->err, GM_ERR_FORMAT, "%s: cannot open attribute '%s'", c->label,
                               name);
        goto cleanup;
    }
    if (H5Sget_simple_extent_npoints(space) != 1) goto cleanup;
    H5T_class_t cls = H5Tget_class(type);
    herr_t rc = 0;
    if (cls == H5T_INTEGER) {
        v.kind = GM_RV_I64;
        rc = H5Aread(a, H5T_NATIVE_INT64, &v.i);
    } else if (cls == H5T_FLOAT) {
        v.kind = GM_RV_F64;
        rc = H5Aread(a, H5T_NATIVE_DOUBLE, &v.f);
    } else if (cls == H5T_STRING) {
        v.kind = GM_RV_STR;
        htri_t var = H5Tis_variable_str(type);
        size_t size = H5Tget_size(type);
        if (var < 0 || (mem = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_cset(mem, H5Tget_cset(type)) < 0 ||
            H5Tset_size(mem, var ? H5T_VARIABLE : size + 1) < 0) {
            rc = -1;
        } else if (var) {
            char *p = NULL;
            rc = H5Aread(a, mem, &p);
            if (rc >= 0) {
                v.s = gm_strdup(p ? p : "");
                if (p) H5free_memory(p);
            }
        } else {
            v.s = gm_malloc(size + 1);
            if (v.s) {
                rc = H5Aread(a, mem, v.s);
                v.s[size] = '\0';
            }
        }
        if (rc >= 0 && !v.s) {
            c->s = gm_error_set(c->err, GM_ERR_NOMEM, "%s: out of memory", c->label);
            goto cleanup;
        }
    } else {
        goto cleanup;
    }
    if (rc < 0) {
        c->s = gm_h5_error_set(c->err, GM_ERR_FORMAT, "%s: cannot read attribute '%s'", c->label,
                               name);
        goto cleanup;
    }
    if (c->out->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        gm_results_attr *grown = gm_realloc(c->out->a, (size_t)cap * sizeof *grown);
        if (!grown) {
            c->s = gm_error_set(c->err, GM_ERR_NOMEM, "%s: out of memory", c->label);
            goto cleanup;
        }
        c->out->a = grown;
        c->cap = cap;
    }
    if (!(v.name = gm_strdup(name))) {
        c->s = gm_error_set(c->err, GM_ERR_NOMEM, "%s: out of memory", c->label);
        goto cleanup;
    }
    c->out->a[c->out->n++] = v;
    v.s = NULL;
cleanup:
    gm_free(v.s);
    if (mem >= 0) H5Tclose(mem);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (a >= 0) H5Aclose(a);
    return c->s == GM_OK ? 0 : -1;
}

static void attrs_free(gm_results_attrs *a) {
    for (int i = 0; i < a->n; i++) {
        gm_free(a->a[i].name);
        gm_free(a->a[i].s);
    }
    gm_free(a->a);
    a->a = NULL;
    a->n = 0;
}

/* Every scalar attribute of object `obj` (name order). A missing object gives an empty list. */
static gm_status read_attrs(gm_h5_file *f, const char *obj, gm_results_attrs *out, gm_error *err) {
    out->a = NULL;
    out->n = 0;
    if (!gm_h5_exists(f, obj)) return GM_OK;
    char label[600];
    snprintf(label, sizeof label, "%s: %s", gm_h5_path(f), obj);
    hid_t o = H5Oopen((hid_t)gm_h5_raw_id(f), obj, H5P_DEFAULT);
    if (o < 0) return gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot open", label);
    read_ctx c = {out, 0, label, err, GM_OK};
    hsize_t idx = 0;
    gm_status s = GM_OK;
    if (H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, read_attr_cb, &c) < 0)
        s = c.s != GM_OK
                ? c.s
                : gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot list its attributes", label);
    H5Oclose(o);
    if (s != GM_OK) attrs_free(out);
    return s;
}

const gm_results_attr *gm_results_find(const gm_results_attrs *a, const char *name) {
    for (int i = 0; a && i < a->n; i++)
        if (strcmp(a->a[i].name, name) == 0) return &a->a[i];
    return NULL;
}

/* ---- open, save, free --------------------------------------------------------------------- */

static gm_status add_series_name(gm_results *r, const char *name, gm_error *err) {
    if (r->n_series == r->cap_series) {
        int cap = r->cap_series ? 2 * r->cap_series : 16;
        char **grown = gm_realloc(r->series, (size_t)cap * sizeof *grown);
        if (!grown) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", r->path);
        r->series = grown;
        r->cap_series = cap;
    }
    if (!(r->series[r->n_series] = gm_strdup(name)))
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", r->path);
    r->n_series++;
    return GM_OK;
}

/* Length of series /metrics/<name> (-1 if unreadable). */
static int64_t series_len(gm_h5_file *f, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "/metrics/%s", name);
    gm_dtype dt;
    int nd;
    int64_t shape[GM_H5_MAX_DIMS];
    gm_error e = {0};
    if (gm_h5_dataset_info(f, path, &dt, &nd, shape, &e) != GM_OK || nd != 1) return -1;
    return shape[0];
}

/* Checks format and version of an open file. `want` is the format expected. */
static gm_status check_format(gm_h5_file *f, const char *want, char **format_out, gm_error *err) {
    char *fmt = NULL;
    int64_t version = 0;
    gm_error e = {0};
    gm_status sf = gm_h5_attr_get_str(f, "/", "format", &fmt, &e);
    if (sf == GM_ERR_NOMEM) { // not a verdict on the file: say what happened
        if (err) *err = e;
        return sf;
    }
    if (sf != GM_OK)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: not a gemmarun results file (no 'format' "
                            "attribute at the root)",
                            gm_h5_path(f));
    bool ok_fmt = strcmp(fmt, GM_RESULTS_FORMAT) == 0 || strcmp(fmt, GM_RESULTS_MERGED_FORMAT) == 0;
    if (!ok_fmt || (want && strcmp(fmt, want) != 0)) {
        gm_status s = gm_error_set(err, GM_ERR_FORMAT, "%s: format is '%s', expected '%s'%s",
                                   gm_h5_path(f), fmt, want ? want : GM_RESULTS_FORMAT,
                                   strcmp(fmt, GM_RESULTS_MERGED_FORMAT) == 0
                                       ? " (this is a merged file; trial files live in "
                                         "results/<experiment>/)"
                                       : "");
        gm_free(fmt);
        return s;
    }
    if (gm_h5_attr_get_i64(f, "/", "version", &version, &e) != GM_OK ||
        version != GM_RESULTS_VERSION) {
        gm_free(fmt);
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: results format version %lld, this gemmarun "
                            "reads version %d",
                            gm_h5_path(f), (long long)version, GM_RESULTS_VERSION);
    }
    if (format_out)
        *format_out = fmt;
    else
        gm_free(fmt);
    return GM_OK;
}

/* Marks the error in err as a format error (the file is there but unusable). */
static gm_status as_format(gm_error *err) {
    if (err) err->code = GM_ERR_FORMAT;
    return GM_ERR_FORMAT;
}

/* Opens an existing file read-only. Unreadable (permissions, missing): GM_ERR_IO; readable but
 * HDF5 cannot open it (not HDF5, torn, truncated): GM_ERR_FORMAT. */
static gm_status open_existing(const char *path, gm_h5_file **out, gm_error *err) {
    *out = NULL;
    if (access(path, R_OK) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: %s", path,
                            errno == ENOENT ? "no such file" : strerror(errno));
    gm_status s = gm_h5_open(path, false, out, err);
    if (s == GM_OK || s == GM_ERR_NOMEM) return s; // out of memory says nothing about the file
    if (s == GM_ERR_IO) gm_error_prefix(err, "%s: damaged or not a results file", path);
    return as_format(err);
}

gm_status gm_results_open(const char *path, gm_results **out, gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    gm_results *r = gm_calloc(1, sizeof *r);
    if (!r || !(r->path = gm_strdup(path))) {
        gm_free(r);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
    }
    gm_status s = GM_OK;
    gm_h5_file *disk = NULL;
    gm_h5_child *kids = NULL;
    int nk = 0;
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (!exists && errno != ENOENT) {
        s = gm_error_set(err, GM_ERR_IO, "%s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        s = gm_error_set(err, GM_ERR_IO, "%s: is a folder, not a results file", path);
        goto cleanup;
    }
    if (exists) {
        if ((s = open_existing(path, &disk, err)) != GM_OK) goto cleanup;
        if ((s = check_format(disk, GM_RESULTS_FORMAT, NULL, err)) != GM_OK) goto cleanup;
    }
    if ((s = gm_h5_create_memory(path, exists ? (size_t)st.st_size + ((size_t)1 << 20) : 0, &r->f,
                                 err)) != GM_OK)
        goto cleanup;
    if (exists) {
        r->resumed = true;
        if ((s = copy_tree((hid_t)gm_h5_raw_id(disk), "/", (hid_t)gm_h5_raw_id(r->f), "/", NULL,
                           path, err)) != GM_OK) {
            if (s != GM_ERR_NOMEM) { // out of memory says nothing about the file
                gm_error_prefix(err, "%s: damaged results file", path);
                s = as_format(err);
            }
            goto cleanup;
        }
    } else {
        char now[32];
        gm_results_now_iso(now, sizeof now);
        if ((s = gm_h5_attr_set_str(r->f, "/", "format", GM_RESULTS_FORMAT, err)) ||
            (s = gm_h5_attr_set_i64(r->f, "/", "version", GM_RESULTS_VERSION, err)) ||
            (s = gm_h5_attr_set_str(r->f, "/", "created_by", RESULTS_CREATED_BY, err)) ||
            (s = gm_h5_attr_set_str(r->f, "/", "status", "running", err)) ||
            (s = gm_h5_attr_set_str(r->f, "/", "reason", "", err)) ||
            (s = gm_h5_attr_set_str(r->f, "/", "started_at", now, err)) ||
            (s = gm_h5_attr_set_str(r->f, "/", "finished_at", "", err)))
            goto cleanup;
    }
    for (int i = 0; i < N_GROUPS; i++)
        if ((s = gm_h5_group_create(r->f, GROUPS[i], err)) != GM_OK) goto cleanup;
    // the series already there (resumed): names and the common length
    if ((s = gm_h5_list(r->f, "/metrics", &kids, &nk, err)) != GM_OK) goto cleanup;
    for (int i = 0; i < nk; i++) {
        if (kids[i].kind != GM_H5_DATASET) continue;
        int64_t len = series_len(r->f, kids[i].name);
        if (len < 0) {
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: /metrics/%s is not a 1-D series", path,
                             kids[i].name);
            goto cleanup;
        }
        if ((s = add_series_name(r, kids[i].name, err)) != GM_OK) goto cleanup;
        if (len > r->rows) r->rows = len;
    }
cleanup:
    gm_h5_list_free(kids, nk);
    gm_h5_close(&disk, NULL);
    if (s != GM_OK) {
        gm_results_free(r);
        return s;
    }
    *out = r;
    return GM_OK;
}

bool gm_results_resumed(const gm_results *r) { return r->resumed; }

const char *gm_results_path(const gm_results *r) { return r->path; }

int64_t gm_results_rows(const gm_results *r) { return r->rows; }

gm_status gm_results_save(gm_results *r, gm_error *err) {
    return gm_h5_save_atomic(r->f, r->path, err);
}

void gm_results_free(gm_results *r) {
    if (!r) return;
    gm_h5_close(&r->f, NULL);
    for (int i = 0; i < r->n_series; i++) gm_free(r->series[i]);
    gm_free(r->series);
    gm_free(r->path);
    gm_free(r);
}

/* ---- root attributes ---------------------------------------------------------------------- */

static gm_status root_check(gm_results *r, const char *name, gm_results_vkind given,
                            gm_error *err) {
    if (!name_ok(name)) return bad_name(r->path, "attribute", name, err);
    const known_attr *k = known(name);
    if (!k) return GM_OK;
    if (k->reserved)
        return gm_error_set(err, GM_ERR_INVALID, "%s: attribute '%s' is set by gemmarun itself",
                            r->path, name);
    if (strcmp(name, "status") == 0 && given != GM_RV_STR)
        return gm_error_set(err, GM_ERR_INVALID, "%s: 'status' must be a string", r->path);
    static const char *const kind_names[] = {"a string", "an integer", "a number"};
    bool ok = k->kind == given || (k->kind == GM_RV_F64 && given == GM_RV_I64);
    if (!ok)
        return gm_error_set(err, GM_ERR_INVALID, "%s: attribute '%s' must be %s", r->path, name,
                            kind_names[k->kind]);
    return GM_OK;
}

gm_status gm_results_set_str(gm_results *r, const char *name, const char *value, gm_error *err) {
    GM_TRY(root_check(r, name, GM_RV_STR, err));
    if (!value) value = "";
    if (strcmp(name, "status") == 0) return gm_results_set_status(r, value, NULL, err);
    const known_attr *k = known(name);
    if (k && k->json) {
        cJSON *j = cJSON_Parse(value);
        if (!j)
            return gm_error_set(err, GM_ERR_INVALID,
                                "%s: attribute '%s' must be JSON text, got "
                                "'%.80s'",
                                r->path, name, value);
        cJSON_Delete(j);
    }
    return gm_h5_attr_set_str(r->f, "/", name, value, err);
}

gm_status gm_results_set_i64(gm_results *r, const char *name, int64_t value, gm_error *err) {
    GM_TRY(root_check(r, name, GM_RV_I64, err));
    const known_attr *k = known(name);
    if (k && k->kind == GM_RV_F64) return gm_h5_attr_set_f64(r->f, "/", name, (double)value, err);
    return gm_h5_attr_set_i64(r->f, "/", name, value, err);
}

gm_status gm_results_set_f64(gm_results *r, const char *name, double value, gm_error *err) {
    GM_TRY(root_check(r, name, GM_RV_F64, err));
    return gm_h5_attr_set_f64(r->f, "/", name, value, err);
}

gm_status gm_results_set_status(gm_results *r, const char *status, const char *reason,
                                gm_error *err) {
    bool ok = false, final = false;
    for (int i = 0; i < 4; i++)
        if (status && strcmp(status, STATUSES[i]) == 0) ok = true, final = i > 0;
    if (!ok)
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: status '%s' (allowed: running, completed, "
                            "failed, interrupted)",
                            r->path, status ? status : "(null)");
    char now[32];
    gm_results_now_iso(now, sizeof now);
    GM_TRY(gm_h5_attr_set_str(r->f, "/", "status", status, err));
    GM_TRY(gm_h5_attr_set_str(r->f, "/", "reason", reason ? reason : "", err));
    return gm_h5_attr_set_str(r->f, "/", "finished_at", final ? now : "", err);
}

/* ---- config ------------------------------------------------------------------------------- */

gm_status gm_results_config_str(gm_results *r, const char *key, const char *v, gm_error *err) {
    if (!name_ok(key)) return bad_name(r->path, "config field", key, err);
    return gm_h5_attr_set_str(r->f, "/config", key, v ? v : "", err);
}

gm_status gm_results_config_f64(gm_results *r, const char *key, double v, gm_error *err) {
    if (!name_ok(key)) return bad_name(r->path, "config field", key, err);
    return gm_h5_attr_set_f64(r->f, "/config", key, v, err);
}

gm_status gm_results_config_i64(gm_results *r, const char *key, int64_t v, gm_error *err) {
    if (!name_ok(key)) return bad_name(r->path, "config field", key, err);
    return gm_h5_attr_set_i64(r->f, "/config", key, v, err);
}

gm_status gm_results_config_bool(gm_results *r, const char *key, bool v, gm_error *err) {
    return gm_results_config_i64(r, key, v ? 1 : 0, err);
}

/* ---- metrics ------------------------------------------------------------------------------ */

static int series_index(const gm_results *r, const char *name) {
    for (int i = 0; i < r->n_series; i++)
        if (strcmp(r->series[i], name) == 0) return i;
    return -1;
}

/* Appends `n` NaNs to a series (padding). */
static gm_status pad_nan(gm_results *r, const char *path, int64_t n, gm_error *err) {
    if (n <= 0) return GM_OK;
    double *nan_buf = gm_malloc((size_t)n * sizeof(double));
    if (!nan_buf) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", r->path);
    for (int64_t i = 0; i < n; i++) nan_buf[i] = NAN;
    gm_status s = gm_h5_append(r->f, path, GM_F64, nan_buf, n, err);
    gm_free(nan_buf);
    return s;
}

gm_status gm_results_append_row(gm_results *r, const char *const *names, const double *values,
                                int n, gm_error *err) {
    if (n < 0 || (n > 0 && (!names || !values)))
        return gm_error_set(err, GM_ERR_INVALID, "%s: bad metrics row", r->path);
    // validate the whole row first: a bad name must not leave the series misaligned
    for (int i = 0; i < n; i++) {
        if (!name_ok(names[i])) return bad_name(r->path, "metric", names[i], err);
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return gm_error_set(err, GM_ERR_INVALID, "%s: metric '%s' given twice in one row",
                                    r->path, names[i]);
    }
    char path[600];
    // new series: created and padded with NaN for the earlier rows
    for (int i = 0; i < n; i++) {
        if (series_index(r, names[i]) >= 0) continue;
        snprintf(path, sizeof path, "/metrics/%s", names[i]);
        if (gm_h5_exists(r->f, path))
            return gm_error_set(err, GM_ERR_FORMAT, "%s: %s exists but is not a known series",
                                r->path, path);
        GM_TRY(gm_h5_series_create(r->f, path, GM_F64, 0, err));
        GM_TRY(add_series_name(r, names[i], err));
        GM_TRY(pad_nan(r, path, r->rows, err));
    }
    // one value for every series: the given one or NaN
    for (int k = 0; k < r->n_series; k++) {
        double v = NAN;
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], r->series[k]) == 0) v = values[i];
        snprintf(path, sizeof path, "/metrics/%s", r->series[k]);
        int64_t len = series_len(r->f, r->series[k]);
        if (len < 0) return gm_error_set(err, GM_ERR_FORMAT, "%s: cannot read %s", r->path, path);
        // a series shorter than the table (written by another tool) is padded first
        GM_TRY(pad_nan(r, path, r->rows - len, err));
        GM_TRY(gm_h5_append_f64(r->f, path, v, err));
    }
    r->rows++;
    return GM_OK;
}

gm_status gm_results_append(gm_results *r, const char *name, double value, gm_error *err) {
    return gm_results_append_row(r, &name, &value, 1, err);
}

gm_status gm_results_truncate(gm_results *r, int64_t rows, gm_error *err) {
    if (rows < 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: truncate to %lld rows", r->path,
                            (long long)rows);
    if (rows >= r->rows) return GM_OK;
    hid_t fid = (hid_t)gm_h5_raw_id(r->f);
    for (int k = 0; k < r->n_series; k++) {
        char path[600];
        snprintf(path, sizeof path, "/metrics/%s", r->series[k]);
        // a second handle on a dataset gm_h5 keeps open: HDF5 shares one object per file, and
        // gm_h5_append reads the extent afresh on every append
        hid_t d = H5Dopen2(fid, path, H5P_DEFAULT);
        hsize_t dims[1] = {(hsize_t)rows};
        if (d < 0 || H5Dset_extent(d, dims) < 0) {
            gm_status s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot truncate %s", r->path, path);
            if (d >= 0) H5Dclose(d);
            return s;
        }
        H5Dclose(d);
    }
    r->rows = rows;
    return GM_OK;
}

/* ---- evaluations -------------------------------------------------------------------------- */

/* Writes a 1-D dataset of vlen UTF-8 strings (h5py: f[...].asstr()[:] gives str). */
static gm_status write_strings(gm_results *r, const char *path, const char *const *v, int n,
                               gm_error *err) {
    gm_status s = GM_OK;
    hid_t t = H5I_INVALID_HID, space = H5I_INVALID_HID, d = H5I_INVALID_HID;
    hsize_t dims[1] = {(hsize_t)n};
    const char **copy = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (!copy) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", r->path);
    for (int i = 0; i < n; i++) copy[i] = v[i] ? v[i] : "";
    if ((t = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0 || (space = H5Screate_simple(1, dims, NULL)) < 0 ||
        (d = H5Dcreate2((hid_t)gm_h5_raw_id(r->f), path, t, space, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT)) < 0 ||
        (n > 0 && H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, copy) < 0))
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot write %s", r->path, path);
    if (d >= 0) H5Dclose(d);
    if (space >= 0) H5Sclose(space);
    if (t >= 0) H5Tclose(t);
    gm_free(copy);
    return s;
}

gm_status gm_results_set_eval(gm_results *r, const char *phase, const gm_results_eval *e,
                              gm_error *err) {
    if (!name_ok(phase)) return bad_name(r->path, "eval phase", phase, err);
    if (!e || e->n_classes < 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: eval '%s': bad arguments", r->path, phase);
    int K = e->n_classes;
    if (e->confusion)
        for (int64_t i = 0; i < (int64_t)K * K; i++)
            if (e->confusion[i] < 0)
                return gm_error_set(err, GM_ERR_INVALID,
                                    "%s: eval '%s': negative count in the "
                                    "confusion matrix",
                                    r->path, phase);
    int64_t n = e->n_per_example;
    if (n < 0 || (n > 0 && !e->example_index))
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: eval '%s': per-example results need example_index", r->path,
                            phase);
    for (int64_t i = 0; i < n; i++) {
        bool bad_class = K > 0 && ((e->predictions && (e->predictions[i] < 0 ||
                                                       e->predictions[i] >= K)) ||
                                   (e->references && (e->references[i] < 0 ||
                                                      e->references[i] >= K)));
        bool bad_count = (e->word_errors && e->word_errors[i] < 0) || (e->words && e->words[i] < 0) ||
                         (e->phone_errors && e->phone_errors[i] < 0) || (e->phones && e->phones[i] < 0);
        if (e->example_index[i] < 0 || bad_class || bad_count)
            return gm_error_set(err, GM_ERR_INVALID,
                                "%s: eval '%s': example %lld: %s", r->path, phase,
                                (long long)i, bad_class ? "class out of range" : bad_count ? "a negative count"
                                                                               : "example_index out of range");
    }
    char g[400], p[600];
    snprintf(g, sizeof g, "/eval/%s", phase);
    GM_TRY(unlink_if_present(r, g, err));
    GM_TRY(gm_h5_group_create(r->f, g, err));
    if (!isnan(e->accuracy)) GM_TRY(gm_h5_attr_set_f64(r->f, g, "accuracy", e->accuracy, err));
    if (!isnan(e->loss)) GM_TRY(gm_h5_attr_set_f64(r->f, g, "loss", e->loss, err));
    if (e->n_examples >= 0) GM_TRY(gm_h5_attr_set_i64(r->f, g, "n_examples", e->n_examples, err));
    const int64_t *ex_vals[GM_RESULTS_EX_LISTS];
    gm_results_eval_lists(e, ex_vals);
    for (int i = 0; i < GM_RESULTS_EX_LISTS && n > 0; i++) {
        if (!ex_vals[i]) continue;
        snprintf(p, sizeof p, "%s/%s", g, gm_results_ex_names[i]);
        GM_TRY(gm_h5_write(r->f, p, GM_I64, 1, &n, ex_vals[i], err));
    }
    if (K == 0) return GM_OK;
    int64_t shape[2] = {K, K};
    if (e->labels) {
        snprintf(p, sizeof p, "%s/labels", g);
        GM_TRY(write_strings(r, p, e->labels, K, err));
    }
    if (e->per_class) {
        snprintf(p, sizeof p, "%s/per_class_accuracy", g);
        GM_TRY(gm_h5_write(r->f, p, GM_F64, 1, shape, e->per_class, err));
    }
    if (e->confusion) {
        snprintf(p, sizeof p, "%s/confusion", g);
        GM_TRY(gm_h5_write(r->f, p, GM_I64, 2, shape, e->confusion, err));
    }
    return GM_OK;
}

gm_status gm_results_set_eval_f64(gm_results *r, const char *phase, const char *name, double v,
                                  gm_error *err) {
    if (!name_ok(phase)) return bad_name(r->path, "eval phase", phase, err);
    if (!name_ok(name)) return bad_name(r->path, "eval attribute", name, err);
    char g[400];
    snprintf(g, sizeof g, "/eval/%s", phase);
    GM_TRY(gm_h5_group_create(r->f, g, err));
    return gm_h5_attr_set_f64(r->f, g, name, v, err);
}

/* ---- memory, data, adapter ---------------------------------------------------------------- */

gm_status gm_results_set_memory(gm_results *r, const char *name, int64_t bytes, gm_error *err) {
    if (!name_ok(name)) return bad_name(r->path, "memory attribute", name, err);
    if (strchr(name, ' '))
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: memory attribute '%s': use '_' instead of "
                            "spaces (planned_base_weights)",
                            r->path, name);
    return gm_h5_attr_set_i64(r->f, "/memory", name, bytes, err);
}

gm_status gm_results_set_provenance(gm_results *r, const char *name, const char *value, gm_error *err) {
    if (!name_ok(name)) return bad_name(r->path, "provenance attribute", name, err);
    if (!value) return gm_error_set(err, GM_ERR_INVALID, "%s: provenance attribute '%s': no value", r->path, name);
    return gm_h5_attr_set_str(r->f, "/provenance", name, value, err);
}

gm_status gm_results_set_data(gm_results *r, const gm_results_data *d, gm_error *err) {
    const char *text = d->rejections_json ? d->rejections_json : "[]";
    cJSON *j = cJSON_Parse(text);
    if (!j || !cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: rejections_json must be a JSON list, got "
                            "'%.80s'",
                            r->path, text);
    }
    while (cJSON_GetArraySize(j) > GM_RESULTS_MAX_REJECTIONS)
        cJSON_DeleteItemFromArray(j, cJSON_GetArraySize(j) - 1);
    char *capped = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!capped) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", r->path);
    gm_status s;
    if ((s = gm_h5_attr_set_i64(r->f, "/data", "n_train", d->n_train, err)) == GM_OK &&
        (s = gm_h5_attr_set_i64(r->f, "/data", "n_test", d->n_test, err)) == GM_OK &&
        (s = gm_h5_attr_set_i64(r->f, "/data", "n_rejected", d->n_rejected, err)) == GM_OK &&
        (s = gm_h5_attr_set_i64(r->f, "/data", "n_truncated", d->n_truncated, err)) == GM_OK)
        s = gm_h5_attr_set_str(r->f, "/data", "rejections_json", capped, err);
    free(capped); // cJSON allocates with malloc
    return s;
}

gm_status gm_results_put_tensor(gm_results *r, const char *name, const float *data, int ndim,
                                const int64_t *shape, gm_error *err) {
    if (!name_ok(name)) return bad_name(r->path, "adapter tensor", name, err);
    if (ndim < 1 || ndim > GM_H5_MAX_DIMS || !shape || !data)
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: adapter tensor '%s': rank %d (1..%d) or no "
                            "data",
                            r->path, name, ndim, GM_H5_MAX_DIMS);
    char p[600];
    snprintf(p, sizeof p, "/adapter/%s", name);
    GM_TRY(unlink_if_present(r, p, err));
    return gm_h5_write(r->f, p, GM_F32, ndim, shape, data, err);
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Reads a 1-D vlen/fixed string dataset into gm_malloc'd strings (n must match). */
static gm_status read_strings(gm_h5_file *f, const char *path, int n, char ***out, gm_error *err) {
    *out = NULL;
    gm_status s = GM_OK;
    hid_t d = H5I_INVALID_HID, ft = H5I_INVALID_HID, mt = H5I_INVALID_HID, space = H5I_INVALID_HID;
    char **raw = NULL, **res = NULL;
    if ((d = H5Dopen2((hid_t)gm_h5_raw_id(f), path, H5P_DEFAULT)) < 0 ||
        (ft = H5Dget_type(d)) < 0 || (space = H5Dget_space(d)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot open %s", gm_h5_path(f), path);
        goto cleanup;
    }
    if (H5Tget_class(ft) != H5T_STRING || H5Sget_simple_extent_npoints(space) != n) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: %s is not a list of %d strings", gm_h5_path(f),
                         path, n);
        goto cleanup;
    }
    raw = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *raw);
    res = gm_calloc((size_t)(n > 0 ? n : 1), sizeof *res);
    if (!raw || !res) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
        goto cleanup;
    }
    if (H5Tis_variable_str(ft) > 0) {
        if ((mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 ||
            H5Tset_cset(mt, H5Tget_cset(ft)) < 0 ||
            (n > 0 && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) < 0)) {
            s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot read %s", gm_h5_path(f), path);
            goto cleanup;
        }
        for (int i = 0; i < n; i++)
            if (!(res[i] = gm_strdup(raw[i] ? raw[i] : ""))) s = GM_ERR_NOMEM;
        if (n > 0) H5Dvlen_reclaim(mt, space, H5P_DEFAULT, raw);
    } else {
        size_t w = H5Tget_size(ft);
        char *buf = gm_calloc((size_t)(n > 0 ? n : 1), w + 1);
        if (!buf || (mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, w + 1) < 0 ||
            (n > 0 && H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)) {
            gm_free(buf);
            s = gm_h5_error_set(err, GM_ERR_FORMAT, "%s: cannot read %s", gm_h5_path(f), path);
            goto cleanup;
        }
        for (int i = 0; i < n; i++)
            if (!(res[i] = gm_strndup(buf + (size_t)i * (w + 1), w))) s = GM_ERR_NOMEM;
        gm_free(buf);
    }
    if (s == GM_ERR_NOMEM) gm_error_set(err, s, "%s: out of memory", gm_h5_path(f));
cleanup:
    if (s != GM_OK && res) {
        for (int i = 0; i < n; i++) gm_free(res[i]);
        gm_free(res);
        res = NULL;
    }
    gm_free(raw);
    if (mt >= 0) H5Tclose(mt);
    if (space >= 0) H5Sclose(space);
    if (ft >= 0) H5Tclose(ft);
    if (d >= 0) H5Dclose(d);
    *out = res;
    return s;
}

static void trial_free(gm_results_trial *t) {
    gm_free(t->source);
    attrs_free(&t->root);
    attrs_free(&t->config);
    attrs_free(&t->memory);
    attrs_free(&t->data);
    attrs_free(&t->provenance);
    for (int i = 0; i < t->n_metrics; i++) {
        gm_free(t->metrics[i].name);
        gm_free(t->metrics[i].v);
    }
    gm_free(t->metrics);
    for (int i = 0; i < t->n_evals; i++) {
        gm_results_eval_read *e = &t->evals[i];
        gm_free(e->phase);
        attrs_free(&e->attrs);
        for (int k = 0; e->labels && k < e->n_classes; k++) gm_free(e->labels[k]);
        gm_free(e->labels);
        gm_free(e->per_class);
        gm_free(e->confusion);
        int64_t **lists[GM_RESULTS_EX_LISTS];
        gm_results_eval_read_lists(e, lists);
        for (int k = 0; k < GM_RESULTS_EX_LISTS; k++) gm_free(*lists[k]);
    }
    gm_free(t->evals);
    for (int i = 0; i < t->n_adapter; i++) gm_free(t->adapter[i].name);
    gm_free(t->adapter);
    memset(t, 0, sizeof *t);
}

void gm_results_trials_free(gm_results_trial *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) trial_free(&t[i]);
    gm_free(t);
}

/* Reads the eval group `g` (= base/eval/<phase>) into e. */
static gm_status read_eval(gm_h5_file *f, const char *g, const char *phase, gm_results_eval_read *e,
                           gm_error *err) {
    if (!(e->phase = gm_strdup(phase)))
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
    GM_TRY(read_attrs(f, g, &e->attrs, err));
    char p[1200];
    gm_dtype dt;
    int nd;
    int64_t shape[GM_H5_MAX_DIMS];
    // K from whichever per-class dataset is there
    const char *const names[] = {"per_class_accuracy", "confusion", "labels"};
    for (int i = 0; i < 3 && e->n_classes == 0; i++) {
        snprintf(p, sizeof p, "%s/%s", g, names[i]);
        gm_error e2 = {0};
        if (gm_h5_exists(f, p) && gm_h5_dataset_info(f, p, &dt, &nd, shape, &e2) == GM_OK &&
            nd >= 1)
            e->n_classes = (int)shape[0];
    }
    // per-example lists: all of example_index's length n
    snprintf(p, sizeof p, "%s/example_index", g);
    if (gm_h5_exists(f, p)) {
        GM_TRY(gm_h5_dataset_info(f, p, &dt, &nd, shape, err));
        if (nd != 1)
            return gm_error_set(err, GM_ERR_FORMAT, "%s: %s is not a list", gm_h5_path(f), p);
        int64_t n = shape[0];
        int64_t **dst[GM_RESULTS_EX_LISTS];
        gm_results_eval_read_lists(e, dst);
        for (int i = 0; i < GM_RESULTS_EX_LISTS; i++) {
            snprintf(p, sizeof p, "%s/%s", g, gm_results_ex_names[i]);
            if (!gm_h5_exists(f, p)) continue;
            if (!(*dst[i] = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t))))
                return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
            GM_TRY(gm_h5_read(f, p, GM_I64, 1, &n, *dst[i], err));
        }
        e->n_per_example = n;
    }
    int K = e->n_classes;
    if (K == 0) return GM_OK;
    snprintf(p, sizeof p, "%s/labels", g);
    if (gm_h5_exists(f, p)) GM_TRY(read_strings(f, p, K, &e->labels, err));
    snprintf(p, sizeof p, "%s/per_class_accuracy", g);
    if (gm_h5_exists(f, p)) {
        int64_t s1[1] = {K};
        if (!(e->per_class = gm_malloc((size_t)K * sizeof(double))))
            return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
        GM_TRY(gm_h5_read(f, p, GM_F64, 1, s1, e->per_class, err));
    }
    snprintf(p, sizeof p, "%s/confusion", g);
    if (gm_h5_exists(f, p)) {
        int64_t s2[2] = {K, K};
        if (!(e->confusion = gm_malloc((size_t)K * (size_t)K * sizeof(int64_t))))
            return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(f));
        GM_TRY(gm_h5_read(f, p, GM_I64, 2, s2, e->confusion, err));
    }
    return GM_OK;
}

/* Reads the trial rooted at `base` ("" for a trial file, "/trial/<name>" in a merged file). */
static gm_status read_trial(gm_h5_file *f, const char *base, gm_results_trial *t, gm_error *err) {
    memset(t, 0, sizeof *t);
    char p[900];
    gm_h5_child *kids = NULL;
    int nk = 0;
    gm_status s = GM_OK;
    t->source = base[0] ? cat3(gm_h5_path(f), "#", base) : gm_strdup(gm_h5_path(f));
    if (!t->source) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if ((s = read_attrs(f, base[0] ? base : "/", &t->root, err)) != GM_OK) goto cleanup;
    snprintf(p, sizeof p, "%s/config", base);
    if ((s = read_attrs(f, p, &t->config, err)) != GM_OK) goto cleanup;
    snprintf(p, sizeof p, "%s/memory", base);
    if ((s = read_attrs(f, p, &t->memory, err)) != GM_OK) goto cleanup;
    snprintf(p, sizeof p, "%s/data", base);
    if ((s = read_attrs(f, p, &t->data, err)) != GM_OK) goto cleanup;
    snprintf(p, sizeof p, "%s/provenance", base);
    if ((s = read_attrs(f, p, &t->provenance, err)) != GM_OK) goto cleanup;
    // metrics: every 1-D numeric dataset of /metrics
    snprintf(p, sizeof p, "%s/metrics", base);
    if (gm_h5_exists(f, p)) {
        if ((s = gm_h5_list(f, p, &kids, &nk, err)) != GM_OK) goto cleanup;
        t->metrics = gm_calloc((size_t)(nk > 0 ? nk : 1), sizeof *t->metrics);
        if (!t->metrics) {
            s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        for (int i = 0; i < nk; i++) {
            if (kids[i].kind != GM_H5_DATASET) continue;
            char q[1000];
            snprintf(q, sizeof q, "%s/metrics/%s", base, kids[i].name);
            gm_dtype dt;
            int nd;
            int64_t shape[GM_H5_MAX_DIMS];
            if ((s = gm_h5_dataset_info(f, q, &dt, &nd, shape, err)) != GM_OK) goto cleanup;
            if (nd != 1 || dt == GM_DTYPE_COUNT) continue;
            gm_results_series *m = &t->metrics[t->n_metrics++];
            m->name = gm_strdup(kids[i].name);
            m->n = shape[0];
            m->v = gm_malloc((size_t)(shape[0] > 0 ? shape[0] : 1) * sizeof(double));
            if (!m->name || !m->v) {
                s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            if ((s = gm_h5_read(f, q, GM_F64, 1, shape, m->v, err)) != GM_OK) goto cleanup;
        }
        gm_h5_list_free(kids, nk);
        kids = NULL, nk = 0;
    }
    snprintf(p, sizeof p, "%s/eval", base);
    if (gm_h5_exists(f, p)) {
        if ((s = gm_h5_list(f, p, &kids, &nk, err)) != GM_OK) goto cleanup;
        t->evals = gm_calloc((size_t)(nk > 0 ? nk : 1), sizeof *t->evals);
        if (!t->evals) {
            s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        for (int i = 0; i < nk; i++) {
            if (kids[i].kind != GM_H5_GROUP) continue;
            char q[1000];
            snprintf(q, sizeof q, "%s/eval/%s", base, kids[i].name);
            if ((s = read_eval(f, q, kids[i].name, &t->evals[t->n_evals++], err)) != GM_OK)
                goto cleanup;
        }
        gm_h5_list_free(kids, nk);
        kids = NULL, nk = 0;
    }
    snprintf(p, sizeof p, "%s/adapter", base);
    if (gm_h5_exists(f, p)) {
        if ((s = gm_h5_list(f, p, &kids, &nk, err)) != GM_OK) goto cleanup;
        t->adapter = gm_calloc((size_t)(nk > 0 ? nk : 1), sizeof *t->adapter);
        if (!t->adapter) {
            s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
            goto cleanup;
        }
        for (int i = 0; i < nk; i++) {
            if (kids[i].kind != GM_H5_DATASET) continue;
            char q[1000];
            snprintf(q, sizeof q, "%s/adapter/%s", base, kids[i].name);
            gm_results_tensor_info *a = &t->adapter[t->n_adapter++];
            gm_dtype dt;
            if (!(a->name = gm_strdup(kids[i].name))) {
                s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
                goto cleanup;
            }
            if ((s = gm_h5_dataset_info(f, q, &dt, &a->ndim, a->shape, err)) != GM_OK) goto cleanup;
        }
    }
cleanup:
    gm_h5_list_free(kids, nk);
    if (s != GM_OK) trial_free(t);
    return s;
}

static int trial_index_of(const gm_results_trial *t) {
    const gm_results_attr *a = gm_results_find(&t->root, "trial_index");
    return a && a->kind == GM_RV_I64 ? (int)a->i : 0;
}

static int cmp_trials(const void *a, const void *b) {
    const gm_results_trial *x = a, *y = b;
    int ix = trial_index_of(x), iy = trial_index_of(y);
    if (ix != iy) return ix < iy ? -1 : 1;
    return strcmp(x->source, y->source);
}

gm_status gm_results_read(const char *path, gm_results_trial **out, int *n, gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    *n = 0;
    struct stat st;
    if (stat(path, &st) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: %s", path,
                            errno == ENOENT ? "no such file" : strerror(errno));
    if (S_ISDIR(st.st_mode))
        return gm_error_set(err, GM_ERR_IO, "%s: is a folder (list it with gm_results_list)", path);
    gm_h5_file *f = NULL;
    char *fmt = NULL;
    gm_h5_child *kids = NULL;
    int nk = 0;
    gm_results_trial *t = NULL;
    int nt = 0;
    gm_status s = open_existing(path, &f, err);
    if (s != GM_OK) return s;
    if ((s = check_format(f, NULL, &fmt, err)) != GM_OK) goto cleanup;
    if (strcmp(fmt, GM_RESULTS_FORMAT) == 0) {
        if (!(t = gm_calloc(1, sizeof *t))) {
            s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
            goto cleanup;
        }
        if ((s = read_trial(f, "", &t[0], err)) != GM_OK) goto cleanup;
        nt = 1;
    } else {
        if ((s = gm_h5_list(f, "/trial", &kids, &nk, err)) != GM_OK) goto cleanup;
        if (!(t = gm_calloc((size_t)(nk > 0 ? nk : 1), sizeof *t))) {
            s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
            goto cleanup;
        }
        for (int i = 0; i < nk; i++) {
            if (kids[i].kind != GM_H5_GROUP) continue;
            char base[600];
            snprintf(base, sizeof base, "/trial/%s", kids[i].name);
            if ((s = read_trial(f, base, &t[nt], err)) != GM_OK) goto cleanup;
            nt++;
        }
        qsort(t, (size_t)nt, sizeof *t, cmp_trials);
    }
cleanup:
    gm_h5_list_free(kids, nk);
    gm_free(fmt);
    gm_h5_close(&f, NULL);
    if (s != GM_OK) {
        gm_results_trials_free(t, nt);
        return s;
    }
    *out = t;
    *n = nt;
    return GM_OK;
}

/* ---- listing ------------------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void gm_results_list_free(char **paths, int n) {
    if (!paths) return;
    for (int i = 0; i < n; i++) gm_free(paths[i]);
    gm_free(paths);
}

gm_status gm_results_list(const char *dir, char ***out, int *n, gm_error *err) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return gm_error_set(err, GM_ERR_IO, "%s: %s", dir,
                            errno == ENOENT ? "no such folder" : strerror(errno));
    char **v = NULL;
    int nv = 0, cap = 0;
    gm_status s = GM_OK;
    struct dirent *de;
    size_t dl = strlen(dir);
    bool slash = dl > 0 && dir[dl - 1] == '/';
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        // trial files only: "trial-<id>.h5" with no other '.', so that checkpoints
        // ("trial-<id>.ckpt.h5"), saves in flight (".h5.tmp") and other files are left alone
        if (len < 10 || strncmp(de->d_name, "trial-", 6) != 0 ||
            strcmp(de->d_name + len - 3, ".h5") != 0 || memchr(de->d_name, '.', len - 3))
            continue;
        char *p = cat3(dir, slash ? "" : "/", de->d_name);
        struct stat st;
        if (!p) {
            s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
            gm_free(p);
            continue;
        }
        if (nv == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = gm_realloc(v, (size_t)cap * sizeof *grown);
            if (!grown) {
                gm_free(p);
                s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            v = grown;
        }
        v[nv++] = p;
    }
    closedir(d);
    if (s != GM_OK) {
        gm_results_list_free(v, nv);
        return s;
    }
    if (nv > 1) qsort(v, (size_t)nv, sizeof *v, cmp_str);
    *out = v;
    *n = nv;
    return GM_OK;
}

/* ---- merging ------------------------------------------------------------------------------ */

/* Where a column's values come from. */
typedef enum col_src { SRC_ROOT, SRC_CONFIG, SRC_EVAL, SRC_MEMORY } col_src;

typedef struct column {
    char name[160];
    col_src src;
    char key[128];  // attribute name
    char phase[64]; // SRC_EVAL
    gm_results_vkind kind;
    size_t width; // strings: bytes (>= 1)
    size_t offset;
} column;

typedef struct columns {
    column *c;
    int n, cap;
} columns;

static const gm_results_attr *col_value(const column *c, const gm_results_trial *t) {
    switch (c->src) {
    case SRC_ROOT: return gm_results_find(&t->root, c->key);
    case SRC_CONFIG: return gm_results_find(&t->config, c->key);
    case SRC_MEMORY: return gm_results_find(&t->memory, c->key);
    case SRC_EVAL:
        for (int i = 0; i < t->n_evals; i++)
            if (strcmp(t->evals[i].phase, c->phase) == 0)
                return gm_results_find(&t->evals[i].attrs, c->key);
        return NULL;
    }
    return NULL;
}

static bool col_exists(const columns *cs, const char *name) {
    for (int i = 0; i < cs->n; i++)
        if (strcmp(cs->c[i].name, name) == 0) return true;
    return false;
}

/* Adds a column (unless one of that name exists); its type is settled later from the values. */
static bool col_add(columns *cs, const char *name, col_src src, const char *key,
                    const char *phase) {
    if (col_exists(cs, name)) return true;
    if (cs->n == cs->cap) {
        int cap = cs->cap ? 2 * cs->cap : 32;
        column *grown = gm_realloc(cs->c, (size_t)cap * sizeof *grown);
        if (!grown) return false;
        cs->c = grown;
        cs->cap = cap;
    }
    column *c = &cs->c[cs->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->src = src;
    snprintf(c->key, sizeof c->key, "%s", key);
    if (phase) snprintf(c->phase, sizeof c->phase, "%s", phase);
    return true;
}

/* Text of a value in a string column (numbers in a string column: %.17g). */
static void value_text(const gm_results_attr *a, char *buf, size_t cap) {
    if (!a)
        buf[0] = '\0';
    else if (a->kind == GM_RV_STR)
        snprintf(buf, cap, "%s", a->s);
    else if (a->kind == GM_RV_I64)
        snprintf(buf, cap, "%lld", (long long)a->i);
    else
        snprintf(buf, cap, "%.17g", a->f);
}

/* Decides every column's type and width: str if any value is a string; i64 if every trial has
 * an integer; f64 otherwise (NaN for the missing). */
static void col_types(columns *cs, const gm_results_trial *t, int nt) {
    for (int i = 0; i < cs->n; i++) {
        column *c = &cs->c[i];
        bool any_str = false, any_f = false, missing = false;
        size_t width = 1;
        for (int k = 0; k < nt; k++) {
            const gm_results_attr *a = col_value(c, &t[k]);
            if (!a)
                missing = true;
            else if (a->kind == GM_RV_STR)
                any_str = true;
            else if (a->kind == GM_RV_F64)
                any_f = true;
            char buf[4096];
            value_text(a, buf, sizeof buf);
            if (strlen(buf) > width) width = strlen(buf);
        }
        c->kind = any_str ? GM_RV_STR : (any_f || missing) ? GM_RV_F64 : GM_RV_I64;
        c->width = width;
    }
}

/* Appends the names of a JSON list of strings (swept_json) as config columns. */
static bool add_swept(columns *cs, const char *json) {
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    bool ok = true;
    if (j && cJSON_IsArray(j)) {
        for (cJSON *e = j->child; e && ok; e = e->next) {
            if (!cJSON_IsString(e) || !name_ok(e->valuestring) ||
                strcmp(e->valuestring, "seed") == 0)
                continue;
            bool have = false; // listed by an earlier trial already
            for (int i = 0; i < cs->n; i++)
                have = have ||
                       (cs->c[i].src == SRC_CONFIG && strcmp(cs->c[i].key, e->valuestring) == 0);
            if (have) continue;
            char name[160];
            // a swept field named like a fixed column keeps a prefix
            snprintf(name, sizeof name, "%s%s", col_exists(cs, e->valuestring) ? "config_" : "",
                     e->valuestring);
            ok = col_add(cs, name, SRC_CONFIG, e->valuestring, NULL);
        }
    }
    cJSON_Delete(j);
    return ok;
}

/* Builds the /trials table in `dst` (H5TBmake_table). */
static gm_status write_table(gm_h5_file *dst, const columns *cs, const gm_results_trial *t, int nt,
                             gm_error *err) {
    gm_status s = GM_OK;
    size_t row = 0;
    hid_t *types = gm_calloc((size_t)cs->n, sizeof *types);
    size_t *offsets = gm_calloc((size_t)cs->n, sizeof *offsets);
    const char **names = gm_calloc((size_t)cs->n, sizeof *names);
    unsigned char *buf = NULL;
    int n_types = 0;
    if (!types || !offsets || !names) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(dst));
        goto cleanup;
    }
    for (int i = 0; i < cs->n; i++) {
        const column *c = &cs->c[i];
        offsets[i] = row;
        names[i] = c->name;
        if (c->kind == GM_RV_STR) {
            // fixed length, null-padded: PyTables/pandas give str, h5py dtype S<n> (formats.md
            // §7.1)
            if ((types[i] = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(types[i], c->width) < 0 ||
                H5Tset_strpad(types[i], H5T_STR_NULLPAD) < 0) {
                s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot make column %s", gm_h5_path(dst),
                                    c->name);
                goto cleanup;
            }
            row += c->width;
        } else {
            types[i] = H5Tcopy(c->kind == GM_RV_I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE);
            row += 8;
        }
        n_types++;
    }
    if (!(buf = gm_calloc((size_t)(nt > 0 ? nt : 1), row))) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", gm_h5_path(dst));
        goto cleanup;
    }
    for (int k = 0; k < nt; k++) {
        unsigned char *r = buf + (size_t)k * row;
        for (int i = 0; i < cs->n; i++) {
            const column *c = &cs->c[i];
            const gm_results_attr *a = col_value(c, &t[k]);
            if (c->kind == GM_RV_STR) {
                char tmp[4096];
                value_text(a, tmp, sizeof tmp);
                memcpy(r + offsets[i], tmp, strlen(tmp) < c->width ? strlen(tmp) : c->width);
            } else if (c->kind == GM_RV_I64) {
                int64_t v = a ? a->i : 0;
                memcpy(r + offsets[i], &v, 8);
            } else {
                double v = !a ? (double)NAN : a->kind == GM_RV_F64 ? a->f : (double)a->i;
                memcpy(r + offsets[i], &v, 8);
            }
        }
    }
    if (H5TBmake_table("gemmarun trials", (hid_t)gm_h5_raw_id(dst), "trials", (hsize_t)cs->n,
                       (hsize_t)nt, row, names, offsets, types, (hsize_t)(nt > 0 ? nt : 1), NULL, 0,
                       buf) < 0)
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot write the /trials table", gm_h5_path(dst));
cleanup:
    for (int i = 0; i < n_types; i++)
        if (types[i] >= 0) H5Tclose(types[i]);
    gm_free(types);
    gm_free(offsets);
    gm_free(names);
    gm_free(buf);
    return s;
}

/* File name without folder and ".h5" into buf. */
static void stem_of(const char *path, char *buf, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t len = strlen(b);
    if (len > 3 && strcmp(b + len - 3, ".h5") == 0) len -= 3;
    snprintf(buf, cap, "%.*s", (int)len, b);
}

gm_status gm_results_merge(const char *dir, const char *out_path, bool with_adapters,
                           gm_error *err) {
    gm_h5_silence();
    char **paths = NULL;
    int np = 0, nt = 0;
    gm_results_trial *t = NULL;
    gm_h5_file *dst = NULL;
    columns cs = {0};
    GM_TRY(gm_results_list(dir, &paths, &np, err));
    gm_status s = GM_OK;
    if (np == 0) {
        s = gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no trial files (trial-*.h5) to merge", dir);
        goto cleanup;
    }
    if (!(t = gm_calloc((size_t)np, sizeof *t))) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", dir);
        goto cleanup;
    }
    for (int i = 0; i < np; i++) {
        gm_results_trial *one = NULL;
        int n1 = 0;
        if ((s = gm_results_read(paths[i], &one, &n1, err)) != GM_OK) {
            gm_error_prefix(err, "merge of %s stopped", dir);
            if (s == GM_ERR_IO) s = as_format(err);
            goto cleanup;
        }
        t[nt++] = one[0]; // take the contents; the shell array is freed alone
        gm_free(one);
    }
    // rows in trial order; `paths` follows the same order for the copies below
    for (int i = 0; i < nt; i++) {
        gm_free(paths[i]);
        paths[i] = NULL;
    }
    qsort(t, (size_t)nt, sizeof *t, cmp_trials);
    // columns
    bool ok = col_add(&cs, "trial_id", SRC_ROOT, "trial_id", NULL) &&
              col_add(&cs, "trial_index", SRC_ROOT, "trial_index", NULL) &&
              col_add(&cs, "status", SRC_ROOT, "status", NULL) &&
              col_add(&cs, "reason", SRC_ROOT, "reason", NULL);
    bool any_seed = false;
    for (int k = 0; k < nt; k++) any_seed = any_seed || gm_results_find(&t[k].config, "seed");
    if (ok && any_seed) ok = col_add(&cs, "seed", SRC_CONFIG, "seed", NULL);
    for (int k = 0; ok && k < nt; k++) {
        const gm_results_attr *sw = gm_results_find(&t[k].root, "swept_json");
        ok = add_swept(&cs, sw && sw->kind == GM_RV_STR ? sw->s : NULL);
    }
    const char *const phases[] = {"final", "baseline"};
    for (int ph = 0; ok && ph < 2; ph++)
        for (int k = 0; ok && k < nt; k++)
            for (int e = 0; ok && e < t[k].n_evals; e++) {
                if (strcmp(t[k].evals[e].phase, phases[ph]) != 0) continue;
                for (int a = 0; ok && a < t[k].evals[e].attrs.n; a++) {
                    const gm_results_attr *at = &t[k].evals[e].attrs.a[a];
                    if (at->kind == GM_RV_STR) continue;
                    char name[160];
                    snprintf(name, sizeof name, "%s_%s", phases[ph], at->name);
                    ok = col_add(&cs, name, SRC_EVAL, at->name, phases[ph]);
                }
            }
    ok = ok && col_add(&cs, "wall_seconds", SRC_ROOT, "wall_seconds", NULL) &&
         col_add(&cs, "measured_peak_rss", SRC_MEMORY, "measured_peak_rss", NULL) &&
         col_add(&cs, "planned_total", SRC_MEMORY, "planned_total", NULL);
    if (!ok) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", dir);
        goto cleanup;
    }
    col_types(&cs, t, nt);
    // the file
    if ((s = gm_h5_create_memory(out_path, 0, &dst, err)) != GM_OK) goto cleanup;
    char now[32];
    gm_results_now_iso(now, sizeof now);
    const gm_results_attr *ex = gm_results_find(&t[0].root, "experiment");
    const gm_results_attr *rep = gm_results_find(&t[0].root, "report_json");
    const gm_results_attr *swp = gm_results_find(&t[0].root, "swept_json");
    if ((s = gm_h5_attr_set_str(dst, "/", "format", GM_RESULTS_MERGED_FORMAT, err)) ||
        (s = gm_h5_attr_set_i64(dst, "/", "version", GM_RESULTS_VERSION, err)) ||
        (s = gm_h5_attr_set_str(dst, "/", "created_by", RESULTS_CREATED_BY, err)) ||
        (s = gm_h5_attr_set_str(dst, "/", "merged_at", now, err)) ||
        (s = gm_h5_attr_set_i64(dst, "/", "n_trials", nt, err)) ||
        (s = gm_h5_attr_set_str(dst, "/", "experiment", ex && ex->kind == GM_RV_STR ? ex->s : "",
                                err)) ||
        (s = gm_h5_attr_set_str(dst, "/", "report_json",
                                rep && rep->kind == GM_RV_STR ? rep->s : "{}", err)) ||
        (s = gm_h5_attr_set_str(dst, "/", "swept_json",
                                swp && swp->kind == GM_RV_STR ? swp->s : "[]", err)))
        goto cleanup;
    if ((s = write_table(dst, &cs, t, nt, err)) != GM_OK) goto cleanup;
    // each trial's content under /trial/<file stem>
    static const char *const no_adapter[] = {"adapter", NULL};
    for (int k = 0; k < nt; k++) {
        char stem[300], g[400];
        stem_of(t[k].source, stem, sizeof stem);
        snprintf(g, sizeof g, "/trial/%s", stem);
        gm_h5_file *src = NULL;
        if ((s = gm_h5_group_create(dst, g, err)) != GM_OK) goto cleanup;
        if ((s = open_existing(t[k].source, &src, err)) != GM_OK) goto cleanup;
        s = copy_tree((hid_t)gm_h5_raw_id(src), "/", (hid_t)gm_h5_raw_id(dst), g,
                      with_adapters ? NULL : no_adapter, t[k].source, err);
        gm_h5_close(&src, NULL);
        if (s != GM_OK) goto cleanup;
    }
    s = gm_h5_save_atomic(dst, out_path, err);
cleanup:
    gm_free(cs.c);
    gm_h5_close(&dst, NULL);
    gm_results_trials_free(t, nt);
    gm_results_list_free(paths, np);
    return s;
}

/* ---- comparing two trials ------------------------------------------------------------------ */

/* Compares the datasets of group `g` (recursing into subgroups) of fa with fb. */
static gm_status compare_group(gm_h5_file *fa, gm_h5_file *fb, const char *g,
                               const char *const *skip, gm_results_diff *d, gm_error *err) {
    gm_h5_child *kids = NULL;
    int nk = 0;
    if (!gm_h5_exists(fa, g)) return GM_OK;
    GM_TRY(gm_h5_list(fa, g, &kids, &nk, err));
    gm_status s = GM_OK;
    double *va = NULL, *vb = NULL;
    for (int i = 0; i < nk && s == GM_OK; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", g, kids[i].name);
        if (kids[i].kind == GM_H5_GROUP) {
            s = compare_group(fa, fb, p, skip, d, err);
            continue;
        }
        if (kids[i].kind != GM_H5_DATASET) continue;
        bool skipped = false;
        for (int k = 0; skip && skip[k] && !skipped; k++) skipped = strcmp(skip[k], kids[i].name) == 0;
        if (skipped) continue;
        gm_dtype ta, tb;
        int na, nb;
        int64_t sa[GM_H5_MAX_DIMS], sb[GM_H5_MAX_DIMS];
        if ((s = gm_h5_dataset_info(fa, p, &ta, &na, sa, err)) != GM_OK) break;
        if (ta != GM_F64 && ta != GM_F32 && ta != GM_I64) continue; // labels (strings)
        d->n_compared++;
        bool same_shape = gm_h5_exists(fb, p); // and the same element type
        if (same_shape) {
            gm_error e2 = {0};
            same_shape = gm_h5_dataset_info(fb, p, &tb, &nb, sb, &e2) == GM_OK && na == nb && ta == tb;
            for (int k = 0; same_shape && k < na; k++) same_shape = sa[k] == sb[k];
        }
        if (!same_shape) {
            if (d->max_abs != INFINITY) snprintf(d->worst, sizeof d->worst, "%s", p);
            d->n_differ++;
            d->max_abs = INFINITY;
            continue;
        }
        int64_t n = 1;
        for (int k = 0; k < na; k++) n *= sa[k];
        gm_free(va);
        gm_free(vb);
        va = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof *va);
        vb = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof *vb);
        if (!va || !vb) {
            s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory comparing %s", gm_h5_path(fa), p);
            break;
        }
        // read each as stored (the layer does not convert), then widen to f64 in place from the
        // end (f32 and i64 are exact in f64; i64 up to 2^53)
        if ((s = gm_h5_read(fa, p, ta, na, sa, va, err)) != GM_OK ||
            (s = gm_h5_read(fb, p, ta, na, sa, vb, err)) != GM_OK)
            break;
        for (int64_t k = n - 1; k >= 0 && ta != GM_F64; k--) {
            va[k] = ta == GM_F32 ? (double)((float *)va)[k] : (double)((int64_t *)va)[k];
            vb[k] = ta == GM_F32 ? (double)((float *)vb)[k] : (double)((int64_t *)vb)[k];
        }
        double worst = 0;
        bool differ = false;
        for (int64_t k = 0; k < n; k++) {
            if (isnan(va[k]) && isnan(vb[k])) continue;
            double dv = fabs(va[k] - vb[k]);
            if (va[k] != vb[k]) differ = true;
            if (isnan(dv)) dv = INFINITY; // one NaN
            if (dv > worst) worst = dv;
        }
        d->n_values += n;
        if (differ) d->n_differ++;
        if (differ && (worst > d->max_abs || d->worst[0] == '\0')) {
            d->max_abs = fmax(d->max_abs, worst);
            snprintf(d->worst, sizeof d->worst, "%s", p);
        }
    }
    gm_free(va);
    gm_free(vb);
    gm_h5_list_free(kids, nk);
    return s;
}

gm_status gm_results_compare(const char *a, const char *b, const char *const *skip,
                             gm_results_diff *d, gm_error *err) {
    gm_h5_silence();
    memset(d, 0, sizeof *d);
    gm_h5_file *fa = NULL, *fb = NULL;
    GM_TRY(open_existing(a, &fa, err));
    gm_status s = open_existing(b, &fb, err);
    const char *const groups[] = {"/metrics", "/eval", "/adapter"};
    for (int i = 0; i < 3 && s == GM_OK; i++) s = compare_group(fa, fb, groups[i], skip, d, err);
    gm_h5_close(&fa, NULL);
    gm_h5_close(&fb, NULL);
    return s;
}
