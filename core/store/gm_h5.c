/*
 * gm_h5.c - thin HDF5 layer: files, groups, scalar attributes, whole datasets, 1-D series.
 *
 * How: every function follows one shape (style guide §4.9): each hid_t starts as
 * H5I_INVALID_HID, the first failing HDF5 call records its error stack into the caller's
 * gm_error at once (gm_h5_error_set; any later HDF5 API call, including the closes below, would
 * clear the stack) and jumps to the single `cleanup:` block, which closes whatever was opened.
 * Objects are addressed by path from the file id (HDF5 resolves "/a/b/c" itself); existence is
 * checked first so a missing object is a clean GM_ERR_NOT_FOUND rather than an HDF5 stack.
 *
 * Memory files (gm_h5_create_memory) use the core driver without backing store; their image
 * (H5Fget_file_image, after H5Fflush) is written by our own loop and put in place by rename,
 * because HDF5 1.10.8 cannot recover from a failed write of its own (see gm_h5.h).
 *
 * Types: file types are explicit little-endian (H5T_IEEE_F32LE ...), memory types native, so
 * files are the same on any host and h5py sees '<f4'. Strings are variable-length UTF-8, which
 * h5py returns as `str` for attributes (formats.md §7.1).
 *
 * Written against the HDF5 1.10 API (Debian 12): H5Literate/H5L_info_t and
 * H5Oget_info_by_name2, which 1.12+ still provide under these names only with 1.10 API mapping.
 */
#include "gm_h5.h"

#include "gm_alloc.h" // gm_malloc, gm_free, gm_strdup
#include "gm_file.h"  // gm_write_file, gm_write_file_atomic

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "gm_h5_raw_id returns hid_t as int64_t");

#define SERIES_DEFAULT_CHUNK 1024 // 8 KiB of f64 per chunk: formats.md §7.1 measured setup
#define SERIES_DEFLATE_LEVEL 4    // gzip level 4: the usual speed/size middle (formats.md §7.1)

#define SERIES_CACHE 16 // series kept open per file: a training log has a handful of metrics

/* An appendable series kept open between appends, so its last chunk stays in HDF5's chunk
 * cache instead of being deflated and written on every append (measured: ~155 us per append
 * when each append opened and closed the dataset). */
typedef struct series_slot {
    char *name; // gm_strdup'd object path; NULL = free slot
    hid_t dset;
    bool is_float;
} series_slot;

struct gm_h5_file {
    hid_t id;
    char *path; // gm_strdup'd copy, for messages
    bool in_memory; // HDF5 core driver without backing store (gm_h5_create_memory)
    series_slot series[SERIES_CACHE];
    int next_evict; // round-robin victim when all slots are taken
};

/* ---- error bridge ------------------------------------------------------------------------- */

void gm_h5_silence(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

typedef struct stack_text {
    char *p;
    size_t cap, len;
    int total; // frames on the stack
} stack_text;

static void text_add(stack_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(stack_text *t, const char *fmt, ...) {
    if (t->len + 1 >= t->cap) return;
    size_t from = t->len;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (w < 0) return;
    if ((size_t)w >= t->cap - t->len) { // truncated: mark it
        t->len = t->cap - 1;
        if (t->cap > 4) memcpy(t->p + t->cap - 4, "...", 4);
    } else {
        t->len += (size_t)w;
    }
    for (size_t i = from; i < t->len; i++) // HDF5 texts carry ctime()'s newline: one line only
        if (t->p[i] == '\n' || t->p[i] == '\r' || t->p[i] == '\t') t->p[i] = ' ';
}

/* One frame: "func(): description". Walking upward, frame 0 is the innermost: it and the next
 * one name the cause (errno text, "truncated file", "no space"); the last is the API call that
 * failed. The frames between are HDF5 internals and are elided. The innermost also gets its
 * minor-error text ("[File has been truncated]"). H5Ewalk2 and H5Eget_msg do not clear the
 * stack they report on. */
static herr_t walk_frame(unsigned n, const H5E_error2_t *e, void *ud) {
    stack_text *t = ud;
    int i = (int)n;
    if (i >= 2 && i < t->total - 1) {
        if (i == 2) text_add(t, " <- ...");
        return 0;
    }
    const char *desc = e->desc ? e->desc : "";
    text_add(t, "%s%s(): %s", i ? " <- " : "", e->func_name ? e->func_name : "?", desc);
    char minor[160] = "";
    if (i == 0 && H5Eget_msg(e->min_num, NULL, minor, sizeof minor) > 0 && !strstr(desc, minor))
        text_add(t, " [%s]", minor);
    return 0;
}

gm_status gm_h5_error_set(gm_error *err, gm_status code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    ssize_t total = H5Eget_num(H5E_DEFAULT);
    if (total <= 0) return code; // nothing recorded: the message stands alone
    stack_text t = {err->msg, sizeof err->msg, strlen(err->msg), (int)total};
    text_add(&t, ": HDF5: ");
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_frame, &t);
    return code;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, ")");
    return buf;
}

/* File and memory types for a gm_dtype; false when there is no mapping here. */
static bool type_pair(gm_dtype dt, hid_t *file_t, hid_t *mem_t) {
    switch (dt) {
    case GM_F32: *file_t = H5T_IEEE_F32LE; *mem_t = H5T_NATIVE_FLOAT; return true;
    case GM_F64: *file_t = H5T_IEEE_F64LE; *mem_t = H5T_NATIVE_DOUBLE; return true;
    case GM_I32: *file_t = H5T_STD_I32LE; *mem_t = H5T_NATIVE_INT32; return true;
    case GM_I64: *file_t = H5T_STD_I64LE; *mem_t = H5T_NATIVE_INT64; return true;
    default: return false;
    }
}

static bool dtype_is_float(gm_dtype dt) { return dt == GM_F32 || dt == GM_F64; }

static const char *dtype_label(gm_dtype dt) {
    return (int)dt >= 0 && dt < GM_DTYPE_COUNT ? gm_dtype_name(dt) : "unsupported type";
}

/* The gm_dtype of a stored datatype, or GM_DTYPE_COUNT. */
static gm_dtype dtype_of(hid_t t) {
    H5T_class_t c = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    if (c == H5T_FLOAT) return size == 4 ? GM_F32 : size == 8 ? GM_F64 : GM_DTYPE_COUNT;
    if (c == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_2)
        return size == 4 ? GM_I32 : size == 8 ? GM_I64 : GM_DTYPE_COUNT;
    return GM_DTYPE_COUNT;
}

/* A link-creation property list that creates missing groups above the new object. */
static hid_t lcpl_intermediate(void) {
    hid_t l = H5Pcreate(H5P_LINK_CREATE);
    if (l >= 0 && H5Pset_create_intermediate_group(l, 1) < 0) {
        H5Pclose(l);
        return H5I_INVALID_HID;
    }
    return l;
}

/* Kind of the object at path (following hard links only), or GM_H5_KIND_COUNT if absent. */
static gm_h5_kind kind_at(hid_t loc, const char *path) {
    H5O_info_t oi;
    if (H5Oget_info_by_name2(loc, path, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
        return GM_H5_KIND_COUNT;
    return oi.type == H5O_TYPE_GROUP ? GM_H5_GROUP
           : oi.type == H5O_TYPE_DATASET ? GM_H5_DATASET
                                         : GM_H5_OTHER;
}

/* ---- files -------------------------------------------------------------------------------- */

static gm_status wrap(hid_t id, const char *path, bool in_memory, gm_h5_file **out,
                      gm_error *err) {
    gm_h5_file *f = gm_malloc(sizeof *f);
    char *p = gm_strdup(path);
    if (!f || !p) {
        gm_free(f);
        gm_free(p);
        H5Fclose(id);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory opening the file", path);
    }
    memset(f, 0, sizeof *f);
    f->id = id;
    f->path = p;
    f->in_memory = in_memory;
    for (int i = 0; i < SERIES_CACHE; i++) f->series[i].dset = H5I_INVALID_HID;
    *out = f;
    return GM_OK;
}

gm_status gm_h5_create(const char *path, gm_h5_file **out, gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    // default file-creation and -access lists: earliest library version bounds (formats.md §7.2)
    hid_t id = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (id < 0) return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create HDF5 file", path);
    return wrap(id, path, false, out, err);
}

gm_status gm_h5_open(const char *path, bool writable, gm_h5_file **out, gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: %s", path,
                            errno == ENOENT ? "no such file" : strerror(errno));
    if (S_ISDIR(st.st_mode))
        return gm_error_set(err, GM_ERR_IO, "%s: is a directory, not an HDF5 file", path);
    hid_t id = H5Fopen(path, writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
    if (id < 0) {
        gm_status s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot open HDF5 file", path);
        if (H5Fis_hdf5(path) == 0) // readable, but no superblock signature anywhere
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: not an HDF5 file (no HDF5 signature; %lld bytes)", path,
                             (long long)st.st_size);
        return s;
    }
    return wrap(id, path, false, out, err);
}

gm_status gm_h5_create_memory(const char *name, size_t size_hint, gm_h5_file **out,
                              gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    // the core driver grows its buffer in steps of `increment` (realloc): one step when the
    // hint is right, 1 MiB steps otherwise
    size_t increment = size_hint > ((size_t)1 << 20) ? size_hint : ((size_t)1 << 20);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_core(fapl, increment, 0) < 0) {
        gm_status s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot set up an in-memory HDF5 file",
                                      name);
        if (fapl >= 0) H5Pclose(fapl);
        return s;
    }
    // HDF5 refuses two open files of one name, even in memory: each gets a name of its own
    // (`name` stays the label in our messages)
    static unsigned long long serial;
    char unique[64];
    snprintf(unique, sizeof unique, "gm_h5 memory file #%llu", ++serial);
    hid_t id = H5Fcreate(unique, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    gm_status s = GM_OK;
    if (id < 0)
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create an in-memory HDF5 file", name);
    H5Pclose(fapl); // after the error text: any HDF5 call clears the error stack
    return s == GM_OK ? wrap(id, name, true, out, err) : s;
}

/* The complete current image of a memory file into a gm_malloc'd buffer (*img, *size). */
static gm_status memory_image(gm_h5_file *f, unsigned char **img, size_t *size, gm_error *err) {
    gm_h5_silence();
    *img = NULL;
    if (!f->in_memory)
        return gm_error_set(err, GM_ERR_INVALID, "%s: not an in-memory file (gm_h5_create_memory)",
                            f->path);
    // the image is complete only once the metadata cache (and cached series chunks) are in it
    if (H5Fflush(f->id, H5F_SCOPE_GLOBAL) < 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot flush the in-memory file", f->path);
    ssize_t n = H5Fget_file_image(f->id, NULL, 0);
    if (n <= 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot get the size of the file image",
                               f->path);
    unsigned char *p = gm_malloc((size_t)n);
    if (!p)
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory copying the %lld-byte file "
                            "image", f->path, (long long)n);
    if (H5Fget_file_image(f->id, p, (size_t)n) != n) {
        gm_free(p);
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot copy the file image", f->path);
    }
    *img = p;
    *size = (size_t)n;
    return GM_OK;
}

void gm_h5_library_version(char *buf, size_t cap) {
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    snprintf(buf, cap, "%u.%u.%u", maj, min, rel);
}

gm_status gm_h5_write_image(gm_h5_file *f, const char *path, bool durable, gm_error *err) {
    unsigned char *img;
    size_t n;
    gm_status s = memory_image(f, &img, &n, err);
    if (s == GM_OK) s = gm_write_file(path, img, n, durable, err);
    gm_free(img);
    return s;
}

gm_status gm_h5_save_atomic(gm_h5_file *f, const char *path, gm_error *err) {
    if (!f->in_memory)
        return gm_error_set(err, GM_ERR_INVALID, "%s: not a memory file (gm_h5_create_memory); "
                            "cannot snapshot it to %s", f->path, path);
    unsigned char *img;
    size_t n;
    gm_status s = memory_image(f, &img, &n, err);
    if (s != GM_OK) {
        gm_error_prefix(err, "%s not replaced (the previous file there, if any, is untouched)", path);
        return s;
    }
    s = gm_write_file_atomic(path, img, n, err);
    gm_free(img);
    return s;
}

gm_status gm_h5_close(gm_h5_file **fp, gm_error *err) {
    if (!fp || !*fp) return GM_OK;
    gm_h5_file *f = *fp;
    *fp = NULL;
    gm_h5_silence();
    gm_status s = GM_OK;
    for (int i = 0; i < SERIES_CACHE; i++) { // closing a series writes its cached last chunk
        series_slot *sl = &f->series[i];
        if (!sl->name) continue;
        if (H5Dclose(sl->dset) < 0 && s == GM_OK)
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: closing series %s failed (disk full?)",
                                f->path, sl->name);
        gm_free(sl->name);
        sl->name = NULL;
    }
    if (H5Fclose(f->id) < 0 && s == GM_OK)
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: closing the file failed (disk full?)", f->path);
    gm_free(f->path);
    gm_free(f);
    return s;
}

gm_status gm_h5_flush(gm_h5_file *f, gm_error *err) {
    gm_h5_silence();
    if (H5Fflush(f->id, H5F_SCOPE_GLOBAL) < 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: flush failed (disk full?)", f->path);
    return GM_OK;
}

const char *gm_h5_path(const gm_h5_file *f) { return f->path; }

int64_t gm_h5_raw_id(const gm_h5_file *f) { return (int64_t)f->id; }

int64_t gm_h5_open_objects(void) {
    gm_h5_silence();
    // files, groups, datasets, attributes, named types: what H5Fclose would complain about
    int64_t n = (int64_t)H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    // plus the transient ids that H5Fget_obj_count does not see
    const H5I_type_t kinds[] = {H5I_DATATYPE, H5I_DATASPACE, H5I_GENPROP_LST};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        hsize_t m = 0;
        if (H5Inmembers(kinds[i], &m) >= 0) n += (int64_t)m;
    }
    return n;
}

/* ---- groups and listing ------------------------------------------------------------------- */

bool gm_h5_exists(gm_h5_file *f, const char *path) {
    gm_h5_silence();
    if (!path || !path[0]) return false;
    if (strcmp(path, "/") == 0) return true;
    // H5Lexists fails (< 0) when a component above the last is missing: that is "absent" too
    return H5Lexists(f->id, path, H5P_DEFAULT) > 0 &&
           H5Oexists_by_name(f->id, path, H5P_DEFAULT) > 0;
}

gm_status gm_h5_group_create(gm_h5_file *f, const char *path, gm_error *err) {
    gm_h5_silence();
    if (gm_h5_exists(f, path)) {
        if (kind_at(f->id, path) == GM_H5_GROUP) return GM_OK;
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: cannot create group %s: a dataset exists there", f->path, path);
    }
    gm_status s = GM_OK;
    hid_t lcpl = H5I_INVALID_HID, g = H5I_INVALID_HID;
    if ((lcpl = lcpl_intermediate()) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create group %s", f->path, path);
        goto cleanup;
    }
    if ((g = H5Gcreate2(f->id, path, lcpl, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create group %s", f->path, path);
        goto cleanup;
    }
cleanup:
    if (g >= 0) H5Gclose(g);
    if (lcpl >= 0) H5Pclose(lcpl);
    return s;
}

typedef struct list_ctx {
    gm_h5_child *items;
    int n, cap;
    bool nomem;
} list_ctx;

static herr_t list_one(hid_t group, const char *name, const H5L_info_t *info, void *ud) {
    list_ctx *c = ud;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        gm_h5_child *items = gm_realloc(c->items, (size_t)cap * sizeof *items);
        if (!items) {
            c->nomem = true;
            return -1;
        }
        c->items = items;
        c->cap = cap;
    }
    char *copy = gm_strdup(name);
    if (!copy) {
        c->nomem = true;
        return -1;
    }
    gm_h5_kind k = GM_H5_OTHER;
    if (info->type == H5L_TYPE_HARD) {
        k = kind_at(group, name);
        if (k == GM_H5_KIND_COUNT) k = GM_H5_OTHER;
    }
    c->items[c->n].name = copy;
    c->items[c->n].kind = k;
    c->n++;
    return 0;
}

void gm_h5_list_free(gm_h5_child *children, int n) {
    if (!children) return;
    for (int i = 0; i < n; i++) gm_free(children[i].name);
    gm_free(children);
}

gm_status gm_h5_list(gm_h5_file *f, const char *path, gm_h5_child **out, int *n, gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    *n = 0;
    if (!gm_h5_exists(f, path))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no group %s", f->path, path);
    if (kind_at(f->id, path) != GM_H5_GROUP)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s is not a group", f->path, path);
    gm_status s = GM_OK;
    list_ctx c = {0};
    hid_t g = H5Gopen2(f->id, path, H5P_DEFAULT);
    if (g < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot open group %s", f->path, path);
        goto cleanup;
    }
    if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, list_one, &c) < 0) {
        if (c.nomem)
            s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory listing %s", f->path, path);
        else
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot list group %s", f->path, path);
        goto cleanup;
    }
cleanup:
    if (g >= 0) H5Gclose(g);
    if (s != GM_OK) {
        gm_h5_list_free(c.items, c.n);
        return s;
    }
    *out = c.items;
    *n = c.n;
    return GM_OK;
}

/* ---- attributes --------------------------------------------------------------------------- */

static gm_status attr_write(gm_h5_file *f, const char *obj, const char *name, hid_t file_t,
                            hid_t mem_t, const void *buf, gm_error *err) {
    if (!gm_h5_exists(f, obj))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: cannot set attribute '%s': no object %s",
                            f->path, name, obj);
    gm_status s = GM_OK;
    hid_t space = H5I_INVALID_HID, attr = H5I_INVALID_HID;
    htri_t ex = H5Aexists_by_name(f->id, obj, name, H5P_DEFAULT);
    if (ex < 0 || (ex > 0 && H5Adelete_by_name(f->id, obj, name, H5P_DEFAULT) < 0)) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot replace attribute '%s' of %s", f->path,
                            name, obj);
        goto cleanup;
    }
    if ((space = H5Screate(H5S_SCALAR)) < 0 ||
        (attr = H5Acreate_by_name(f->id, obj, name, file_t, space, H5P_DEFAULT, H5P_DEFAULT,
                                  H5P_DEFAULT)) < 0 ||
        H5Awrite(attr, mem_t, buf) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot write attribute '%s' of %s", f->path,
                            name, obj);
        goto cleanup;
    }
cleanup:
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    return s;
}

gm_status gm_h5_attr_set_i64(gm_h5_file *f, const char *obj, const char *name, int64_t v,
                             gm_error *err) {
    gm_h5_silence();
    return attr_write(f, obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, err);
}

gm_status gm_h5_attr_set_u64(gm_h5_file *f, const char *obj, const char *name, uint64_t v,
                             gm_error *err) {
    gm_h5_silence();
    return attr_write(f, obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, err);
}

gm_status gm_h5_attr_set_f64(gm_h5_file *f, const char *obj, const char *name, double v,
                             gm_error *err) {
    gm_h5_silence();
    return attr_write(f, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, err);
}

/* A variable-length UTF-8 string type (formats.md §7.1); caller closes it. */
static hid_t vlen_utf8(void) {
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return H5I_INVALID_HID;
    }
    return t;
}

gm_status gm_h5_attr_set_str(gm_h5_file *f, const char *obj, const char *name, const char *v,
                             gm_error *err) {
    gm_h5_silence();
    hid_t t = vlen_utf8();
    if (t < 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot make a string type for attribute '%s'",
                               f->path, name);
    const char *buf[1] = {v ? v : ""};
    gm_status s = attr_write(f, obj, name, t, t, buf, err);
    H5Tclose(t);
    return s;
}

/* Opens attribute `name` of `obj` (*attr) with its type (*type); both closed by the caller. */
static gm_status attr_open(gm_h5_file *f, const char *obj, const char *name, hid_t *attr,
                           hid_t *type, gm_error *err) {
    *attr = *type = H5I_INVALID_HID;
    if (!gm_h5_exists(f, obj))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no object %s (looking for attribute '%s')",
                            f->path, obj, name);
    htri_t ex = H5Aexists_by_name(f->id, obj, name, H5P_DEFAULT);
    if (ex < 0)
        return gm_h5_error_set(err, GM_ERR_IO, "%s: cannot look up attribute '%s' of %s", f->path,
                               name, obj);
    if (ex == 0)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: %s has no attribute '%s'", f->path, obj,
                            name);
    gm_status s = GM_OK;
    hid_t space = H5I_INVALID_HID;
    if ((*attr = H5Aopen_by_name(f->id, obj, name, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
        (*type = H5Aget_type(*attr)) < 0 || (space = H5Aget_space(*attr)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot open attribute '%s' of %s", f->path, name,
                            obj);
        goto cleanup;
    }
    if (H5Sget_simple_extent_npoints(space) != 1)
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: attribute '%s' of %s is not a single value",
                         f->path, name, obj);
cleanup:
    if (space >= 0) H5Sclose(space);
    if (s != GM_OK) {
        if (*type >= 0) H5Tclose(*type);
        if (*attr >= 0) H5Aclose(*attr);
        *attr = *type = H5I_INVALID_HID;
    }
    return s;
}

typedef enum num_kind { NUM_I64, NUM_U64, NUM_F64 } num_kind;

static gm_status attr_read_num(gm_h5_file *f, const char *obj, const char *name, num_kind want,
                               void *out, gm_error *err) {
    gm_h5_silence();
    hid_t attr, type;
    GM_TRY(attr_open(f, obj, name, &attr, &type, err));
    gm_status s = GM_OK;
    H5T_class_t c = H5Tget_class(type);
    if (c != H5T_INTEGER && !(want == NUM_F64 && c == H5T_FLOAT)) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: attribute '%s' of %s is not %s", f->path, name,
                         obj, want == NUM_F64 ? "a number" : "an integer");
        goto cleanup;
    }
    herr_t rc;
    if (want == NUM_F64) {
        rc = H5Aread(attr, H5T_NATIVE_DOUBLE, out);
    } else if (H5Tget_sign(type) == H5T_SGN_NONE) {
        uint64_t u = 0;
        rc = H5Aread(attr, H5T_NATIVE_UINT64, &u);
        if (rc >= 0 && want == NUM_I64 && u > (uint64_t)INT64_MAX) {
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: attribute '%s' of %s = %llu does not fit int64", f->path, name,
                             obj, (unsigned long long)u);
            goto cleanup;
        }
        if (rc >= 0 && want == NUM_I64) *(int64_t *)out = (int64_t)u;
        if (rc >= 0 && want == NUM_U64) *(uint64_t *)out = u;
    } else {
        int64_t i = 0;
        rc = H5Aread(attr, H5T_NATIVE_INT64, &i);
        if (rc >= 0 && want == NUM_U64 && i < 0) {
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: attribute '%s' of %s = %lld is negative",
                             f->path, name, obj, (long long)i);
            goto cleanup;
        }
        if (rc >= 0 && want == NUM_I64) *(int64_t *)out = i;
        if (rc >= 0 && want == NUM_U64) *(uint64_t *)out = (uint64_t)i;
    }
    if (rc < 0)
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read attribute '%s' of %s", f->path, name,
                            obj);
cleanup:
    H5Tclose(type);
    H5Aclose(attr);
    return s;
}

gm_status gm_h5_attr_get_i64(gm_h5_file *f, const char *obj, const char *name, int64_t *out,
                             gm_error *err) {
    return attr_read_num(f, obj, name, NUM_I64, out, err);
}

gm_status gm_h5_attr_get_u64(gm_h5_file *f, const char *obj, const char *name, uint64_t *out,
                             gm_error *err) {
    return attr_read_num(f, obj, name, NUM_U64, out, err);
}

gm_status gm_h5_attr_get_f64(gm_h5_file *f, const char *obj, const char *name, double *out,
                             gm_error *err) {
    return attr_read_num(f, obj, name, NUM_F64, out, err);
}

gm_status gm_h5_attr_get_str(gm_h5_file *f, const char *obj, const char *name, char **out,
                             gm_error *err) {
    gm_h5_silence();
    *out = NULL;
    hid_t attr, type;
    GM_TRY(attr_open(f, obj, name, &attr, &type, err));
    gm_status s = GM_OK;
    hid_t mem = H5I_INVALID_HID;
    char *vlen = NULL, *copy = NULL;
    if (H5Tget_class(type) != H5T_STRING) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: attribute '%s' of %s is not a string", f->path,
                         name, obj);
        goto cleanup;
    }
    htri_t var = H5Tis_variable_str(type);
    size_t size = H5Tget_size(type);
    if (var < 0 || (mem = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_cset(mem, H5Tget_cset(type)) < 0 ||
        H5Tset_size(mem, var ? H5T_VARIABLE : size + 1) < 0 ||
        (!var && H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0)) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read attribute '%s' of %s", f->path, name,
                            obj);
        goto cleanup;
    }
    if (var) {
        if (H5Aread(attr, mem, &vlen) < 0) {
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read attribute '%s' of %s", f->path,
                                name, obj);
            goto cleanup;
        }
        copy = gm_strdup(vlen ? vlen : "");
    } else {
        copy = gm_malloc(size + 1);
        if (copy && H5Aread(attr, mem, copy) < 0) {
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read attribute '%s' of %s", f->path,
                                name, obj);
            goto cleanup;
        }
        if (copy) copy[size] = '\0';
    }
    if (!copy) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory reading attribute '%s' of %s",
                         f->path, name, obj);
        goto cleanup;
    }
    *out = copy;
    copy = NULL;
cleanup:
    if (vlen) H5free_memory(vlen); // HDF5 allocated it with its own malloc
    gm_free(copy);
    if (mem >= 0) H5Tclose(mem);
    H5Tclose(type);
    H5Aclose(attr);
    return s;
}

/* ---- datasets ----------------------------------------------------------------------------- */

/* Opens dataset `path` and reports its type, rank and dims. *dset is closed by the caller. */
static gm_status dset_open(gm_h5_file *f, const char *path, hid_t *dset, gm_dtype *dtype,
                           int *ndim, hsize_t dims[GM_H5_MAX_DIMS], hsize_t maxdims[GM_H5_MAX_DIMS],
                           gm_error *err) {
    *dset = H5I_INVALID_HID;
    if (!gm_h5_exists(f, path))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no dataset %s", f->path, path);
    if (kind_at(f->id, path) != GM_H5_DATASET)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s is a group, not a dataset", f->path, path);
    gm_status s = GM_OK;
    hid_t type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    if ((*dset = H5Dopen2(f->id, path, H5P_DEFAULT)) < 0 || (type = H5Dget_type(*dset)) < 0 ||
        (space = H5Dget_space(*dset)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot open dataset %s", f->path, path);
        goto cleanup;
    }
    *dtype = dtype_of(type);
    int nd = H5Sget_simple_extent_ndims(space);
    if (nd < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read the shape of dataset %s", f->path,
                            path);
        goto cleanup;
    }
    if (nd > GM_H5_MAX_DIMS) {
        s = gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: dataset %s has %d dimensions, at most %d "
                         "are supported", f->path, path, nd, GM_H5_MAX_DIMS);
        goto cleanup;
    }
    *ndim = nd;
    if (H5Sget_simple_extent_dims(space, dims, maxdims) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read the shape of dataset %s", f->path,
                            path);
        goto cleanup;
    }
cleanup:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (s != GM_OK && *dset >= 0) {
        H5Dclose(*dset);
        *dset = H5I_INVALID_HID;
    }
    return s;
}

static gm_status check_shape_arg(gm_h5_file *f, const char *path, int ndim, const int64_t *shape,
                                 gm_error *err) {
    if (ndim < 0 || ndim > GM_H5_MAX_DIMS || (ndim > 0 && !shape))
        return gm_error_set(err, GM_ERR_INVALID, "%s: dataset %s: rank %d is not 0..%d", f->path,
                            path, ndim, GM_H5_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return gm_error_set(err, GM_ERR_INVALID,
                                "%s: dataset %s: dimension %d is negative (%lld)", f->path, path,
                                i, (long long)shape[i]);
    return GM_OK;
}

gm_status gm_h5_write(gm_h5_file *f, const char *path, gm_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, gm_error *err) {
    gm_h5_silence();
    hid_t file_t, mem_t;
    if (!type_pair(dtype, &file_t, &mem_t))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: dataset %s: dtype %s cannot be stored "
                            "(f32, f64, i32, i64 only)", f->path, path, dtype_label(dtype));
    GM_TRY(check_shape_arg(f, path, ndim, shape, err));
    if (gm_h5_exists(f, path))
        return gm_error_set(err, GM_ERR_INVALID, "%s: dataset %s already exists", f->path, path);
    hsize_t dims[GM_H5_MAX_DIMS];
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        dims[i] = (hsize_t)shape[i];
        numel *= shape[i];
    }
    if (numel > 0 && !data)
        return gm_error_set(err, GM_ERR_INVALID, "%s: dataset %s: no data", f->path, path);
    gm_status s = GM_OK;
    hid_t lcpl = H5I_INVALID_HID, space = H5I_INVALID_HID, dset = H5I_INVALID_HID;
    if ((lcpl = lcpl_intermediate()) < 0 ||
        (space = ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(ndim, dims, NULL)) < 0 ||
        (dset = H5Dcreate2(f->id, path, file_t, space, lcpl, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create dataset %s", f->path, path);
        goto cleanup;
    }
    if (numel > 0 && H5Dwrite(dset, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot write dataset %s (disk full?)", f->path,
                            path);
        goto cleanup;
    }
cleanup:
    if (dset >= 0) H5Dclose(dset);
    if (space >= 0) H5Sclose(space);
    if (lcpl >= 0) H5Pclose(lcpl);
    return s;
}

gm_status gm_h5_dataset_info(gm_h5_file *f, const char *path, gm_dtype *dtype, int *ndim,
                             int64_t shape[GM_H5_MAX_DIMS], gm_error *err) {
    gm_h5_silence();
    hid_t dset;
    hsize_t dims[GM_H5_MAX_DIMS];
    GM_TRY(dset_open(f, path, &dset, dtype, ndim, dims, NULL, err));
    H5Dclose(dset);
    for (int i = 0; i < *ndim; i++) shape[i] = (int64_t)dims[i];
    return GM_OK;
}

gm_status gm_h5_read(gm_h5_file *f, const char *path, gm_dtype dtype, int ndim,
                     const int64_t *shape, void *data, gm_error *err) {
    gm_h5_silence();
    hid_t file_t, mem_t;
    if (!type_pair(dtype, &file_t, &mem_t))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: dataset %s: cannot read into dtype %s "
                            "(f32, f64, i32, i64 only)", f->path, path, dtype_label(dtype));
    GM_TRY(check_shape_arg(f, path, ndim, shape, err));
    hid_t dset;
    gm_dtype have;
    int nd;
    hsize_t dims[GM_H5_MAX_DIMS];
    GM_TRY(dset_open(f, path, &dset, &have, &nd, dims, NULL, err));
    gm_status s = GM_OK;
    int64_t numel = 1, have_shape[GM_H5_MAX_DIMS];
    bool same = nd == ndim;
    for (int i = 0; i < nd; i++) {
        have_shape[i] = (int64_t)dims[i];
        if (same && have_shape[i] != shape[i]) same = false;
        numel *= have_shape[i];
    }
    if (!same) {
        char a[128], b[128];
        s = gm_error_set(err, GM_ERR_INVALID, "%s: dataset %s has shape %s, expected %s", f->path,
                         path, shape_str(a, sizeof a, nd, have_shape),
                         shape_str(b, sizeof b, ndim, shape));
        goto cleanup;
    }
    if (have == GM_DTYPE_COUNT || dtype_is_float(have) != dtype_is_float(dtype)) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: dataset %s holds %s, cannot read it as %s",
                         f->path, path, dtype_label(have), gm_dtype_name(dtype));
        goto cleanup;
    }
    if (numel > 0 && H5Dread(dset, mem_t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read dataset %s", f->path, path);
        goto cleanup;
    }
cleanup:
    H5Dclose(dset);
    return s;
}

/* ---- appendable series -------------------------------------------------------------------- */

gm_status gm_h5_series_create(gm_h5_file *f, const char *path, gm_dtype dtype, int64_t chunk,
                              gm_error *err) {
    gm_h5_silence();
    hid_t file_t, mem_t;
    if ((dtype != GM_F64 && dtype != GM_I64) || !type_pair(dtype, &file_t, &mem_t))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: series %s: dtype %s (f64 or i64 only)",
                            f->path, path, dtype_label(dtype));
    if (chunk < 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: series %s: negative chunk size", f->path,
                            path);
    if (gm_h5_exists(f, path))
        return gm_error_set(err, GM_ERR_INVALID, "%s: series %s already exists", f->path, path);
    hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED};
    hsize_t cdims[1] = {(hsize_t)(chunk ? chunk : SERIES_DEFAULT_CHUNK)};
    gm_status s = GM_OK;
    hid_t lcpl = H5I_INVALID_HID, dcpl = H5I_INVALID_HID, space = H5I_INVALID_HID,
          dset = H5I_INVALID_HID;
    if ((lcpl = lcpl_intermediate()) < 0 || (dcpl = H5Pcreate(H5P_DATASET_CREATE)) < 0 ||
        H5Pset_chunk(dcpl, 1, cdims) < 0 || H5Pset_shuffle(dcpl) < 0 ||
        H5Pset_deflate(dcpl, SERIES_DEFLATE_LEVEL) < 0 ||
        (space = H5Screate_simple(1, dims, maxdims)) < 0 ||
        (dset = H5Dcreate2(f->id, path, file_t, space, lcpl, dcpl, H5P_DEFAULT)) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot create series %s", f->path, path);
        goto cleanup;
    }
cleanup:
    if (dset >= 0) H5Dclose(dset);
    if (space >= 0) H5Sclose(space);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    return s;
}

/* The open series at `path` from the cache, opening (and creating when missing), checking and
 * caching it when absent. *owned is set when the cache had no room for it (no memory for the
 * name): the caller then closes *dset itself. */
static gm_status series_get(gm_h5_file *f, const char *path, gm_dtype dtype, hid_t *dset,
                            bool *is_float, bool *owned, gm_error *err) {
    *owned = false;
    for (int i = 0; i < SERIES_CACHE; i++)
        if (f->series[i].name && strcmp(f->series[i].name, path) == 0) {
            *dset = f->series[i].dset;
            *is_float = f->series[i].is_float;
            return GM_OK;
        }
    if (!gm_h5_exists(f, path)) GM_TRY(gm_h5_series_create(f, path, dtype, 0, err));
    gm_dtype have;
    int nd;
    hsize_t dims[GM_H5_MAX_DIMS], maxdims[GM_H5_MAX_DIMS];
    GM_TRY(dset_open(f, path, dset, &have, &nd, dims, maxdims, err));
    if (nd != 1 || maxdims[0] != H5S_UNLIMITED || have == GM_DTYPE_COUNT) {
        H5Dclose(*dset);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s is not an appendable 1-D numeric series",
                            f->path, path);
    }
    *is_float = dtype_is_float(have);
    char *name = gm_strdup(path);
    if (!name) { // still appendable, just not kept open
        *owned = true;
        return GM_OK;
    }
    int slot = -1;
    for (int i = 0; i < SERIES_CACHE && slot < 0; i++)
        if (!f->series[i].name) slot = i;
    if (slot < 0) { // evict: its cached chunk is written now
        slot = f->next_evict;
        f->next_evict = (f->next_evict + 1) % SERIES_CACHE;
        series_slot *old = &f->series[slot];
        gm_status s = GM_OK;
        if (H5Dclose(old->dset) < 0)
            s = gm_h5_error_set(err, GM_ERR_IO, "%s: closing series %s failed", f->path,
                                old->name);
        gm_free(old->name);
        old->name = NULL;
        if (s != GM_OK) {
            gm_free(name);
            H5Dclose(*dset);
            return s;
        }
    }
    f->series[slot] = (series_slot){name, *dset, *is_float};
    return GM_OK;
}

gm_status gm_h5_append(gm_h5_file *f, const char *path, gm_dtype dtype, const void *values,
                       int64_t n, gm_error *err) {
    gm_h5_silence();
    hid_t file_t, mem_t;
    if ((dtype != GM_F64 && dtype != GM_I64) || !type_pair(dtype, &file_t, &mem_t))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: series %s: dtype %s (f64 or i64 only)",
                            f->path, path, dtype_label(dtype));
    if (n < 0 || (n > 0 && !values))
        return gm_error_set(err, GM_ERR_INVALID, "%s: series %s: bad append of %lld values",
                            f->path, path, (long long)n);
    hid_t dset = H5I_INVALID_HID;
    bool is_float = false, owned = false;
    GM_TRY(series_get(f, path, dtype, &dset, &is_float, &owned, err));
    gm_status s = GM_OK;
    hid_t fspace = H5I_INVALID_HID, mspace = H5I_INVALID_HID;
    if (is_float != dtype_is_float(dtype)) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: series %s holds %s, cannot append %s", f->path,
                         path, is_float ? "floats" : "integers", gm_dtype_name(dtype));
        goto cleanup;
    }
    if (n == 0) goto cleanup;
    hsize_t cur[1] = {0}, count[1] = {(hsize_t)n};
    if ((fspace = H5Dget_space(dset)) < 0 || H5Sget_simple_extent_dims(fspace, cur, NULL) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot read the length of series %s", f->path,
                            path);
        goto cleanup;
    }
    H5Sclose(fspace);
    fspace = H5I_INVALID_HID;
    hsize_t grown[1] = {cur[0] + count[0]};
    if (H5Dset_extent(dset, grown) < 0 || (fspace = H5Dget_space(dset)) < 0 ||
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, cur, NULL, count, NULL) < 0 ||
        (mspace = H5Screate_simple(1, count, NULL)) < 0 ||
        H5Dwrite(dset, mem_t, mspace, fspace, H5P_DEFAULT, values) < 0) {
        s = gm_h5_error_set(err, GM_ERR_IO, "%s: cannot append to series %s", f->path, path);
        goto cleanup;
    }
cleanup:
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    if (owned) H5Dclose(dset);
    return s;
}

gm_status gm_h5_append_f64(gm_h5_file *f, const char *path, double value, gm_error *err) {
    return gm_h5_append(f, path, GM_F64, &value, 1, err);
}

gm_status gm_h5_append_i64(gm_h5_file *f, const char *path, int64_t value, gm_error *err) {
    return gm_h5_append(f, path, GM_I64, &value, 1, err);
}
