/*
 * gm_safetensors.c - safetensors reader: one file, or a Hugging Face folder of shards.
 *
 * How: each file is memory-mapped; its JSON header is copied into a NUL-terminated buffer (so
 * cJSON never depends on bytes after the header) and parsed with cJSON. Every entry is
 * validated as the reference Rust reader does (formats.md §4.1): known dtype, integer shape,
 * data_offsets [begin, end) matching numel * element size, and, after sorting by offset, the
 * entries tile the byte buffer from 0 to exactly the end of the file. Names are copied
 * (gm_strdup) so the cJSON tree is freed right after parsing; tensor data stays in the
 * mappings.
 *
 * Folders (formats.md §4.2): model.safetensors.index.json maps tensor names to shard files;
 * every shard it names is opened and every name it lists must be in the shard it says.
 * Without an index, the folder's model.safetensors (or its only *.safetensors file, as in a
 * PEFT adapter folder holding adapter_model.safetensors) is opened.
 *
 * Lookups use an index sorted by name (bsearch), which also finds duplicate names, both inside
 * one header (JSON allows repeated keys; cJSON keeps them) and across shards.
 * cJSON allocates with its own malloc; its trees never outlive a call here.
 */
#include "gm_safetensors.h"

#include "gm_alloc.h" // gm_malloc, gm_free, gm_strdup
#include "gm_file.h"  // gm_write_file_atomic
#include "gm_mmap.h"  // gm_mmap_open, gm_read_file

#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ST_MAX_HEADER 100000000ull // the Rust reader's limit on the JSON header length
#define ST_MAX_DIMS 8              // gm_st_tensor.shape capacity
#define ST_MAX_INT 9007199254740992.0 // 2^53: larger JSON numbers are not exact doubles

#define HINT_TRUNCATED                                                                       \
    "hint: the file may be truncated (an interrupted download?): download it again"
#define HINT_CORRUPT                                                                         \
    "hint: the file is corrupt or was not written by a safetensors writer: download or save " \
    "it again"

typedef struct st_shard {
    char *path;          // file path, or the label of an in-memory image
    gm_mapped_file map;  // owned when the shard was opened from a file
    const uint8_t *buf;
    size_t size;
} st_shard;

typedef struct st_meta {
    char *key, *value;
} st_meta;

struct gm_safetensors {
    st_shard *shards;
    int n_shards;
    gm_st_tensor *tensors;
    int64_t n_tensors, cap_tensors;
    int64_t *by_name; // tensor indices sorted by name
    st_meta *meta;    // __metadata__ of the first shard
    int n_meta;
};

/* ---- dtypes ------------------------------------------------------------------------------- */

typedef struct st_dtype_row {
    const char *name;
    int dtype; // gm_dtype, or -1 for a known safetensors dtype we do not handle
} st_dtype_row;

/* formats.md §4.1 (safetensors/src/tensor.rs Dtype). BOOL is one byte per element: read as u8. */
static const st_dtype_row st_dtypes[] = {
    {"F32", GM_F32}, {"F16", GM_F16}, {"BF16", GM_BF16}, {"F64", GM_F64},
    {"I8", GM_I8},   {"U8", GM_U8},   {"I16", GM_I16},   {"I32", GM_I32},
    {"I64", GM_I64}, {"BOOL", GM_U8}, {"U16", -1},       {"U32", -1},
    {"U64", -1},     {"C64", -1},     {"F8_E5M2", -1},   {"F8_E4M3", -1},
    {"F8_E8M0", -1}, {"F8_E4M3FNUZ", -1}, {"F8_E5M2FNUZ", -1}, {"F4", -1},
    {"F6_E2M3", -1}, {"F6_E3M2", -1},
};

/* ---- small helpers ------------------------------------------------------------------------ */

static uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A JSON number that is a non-negative integer below 2^53. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= ST_MAX_INT)) return false;
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return false;
    *out = u;
    return true;
}

/* "f32[4, 4]" for messages. */
static const char *describe(gm_dtype dt, int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "%s[", gm_dtype_name(dt));
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static gm_status nomem(gm_error *err, const char *label) {
    return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", label);
}

typedef struct name_idx {
    const char *name;
    int64_t idx;
} name_idx;

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name);
}

/* One header entry while checking the tiling. */
typedef struct span {
    uint64_t begin, end;
    int64_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static gm_status push_tensor(gm_safetensors *st, const gm_st_tensor *t, const char *label,
                             gm_error *err) {
    if (st->n_tensors == st->cap_tensors) {
        int64_t cap = st->cap_tensors ? st->cap_tensors * 2 : 64;
        gm_st_tensor *nt = gm_realloc(st->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return nomem(err, label);
        st->tensors = nt;
        st->cap_tensors = cap;
    }
    st->tensors[st->n_tensors++] = *t;
    return GM_OK;
}

/* ---- one file ----------------------------------------------------------------------------- */

/* Validates one entry of the header and appends it (data pointer filled by the caller). */
static gm_status parse_entry(gm_safetensors *st, int shard, const cJSON *e, uint64_t buf_len,
                             const char *label, span *sp, gm_error *err) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': the entry is not a JSON object with dtype, shape "
                            "and data_offsets\n" HINT_CORRUPT, label, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"\n"
                            HINT_CORRUPT, label, name);
    if (!cJSON_IsArray(js))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"\n"
                            HINT_CORRUPT, label, name);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]\n"
                            HINT_CORRUPT, label, name);

    gm_st_tensor t;
    memset(&t, 0, sizeof t);
    t.shard = shard;
    const st_dtype_row *row = NULL;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, jd->valuestring) == 0) row = &st_dtypes[i];
    if (!row)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': unknown dtype '%s'\nhint: safetensors dtypes are "
                            "F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL, U16, U32, U64, "
                            "C64, F8_*, F6_*, F4",
                            label, name, jd->valuestring);
    if (row->dtype < 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: tensor '%s': dtype %s is not supported (gemmarun reads F32, F16, "
                            "BF16, F64, I8, U8, I16, I32, I64 and BOOL)\nhint: convert the "
                            "checkpoint to bf16 or f32 first",
                            label, name, row->name);
    t.dtype = (gm_dtype)row->dtype;

    int nd = cJSON_GetArraySize(js);
    if (nd > ST_MAX_DIMS)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has %d dimensions; at most %d are supported", label,
                            name, nd, ST_MAX_DIMS);
    t.ndim = nd;
    uint64_t numel = 1;
    bool overflow = false;
    int d = 0;
    for (const cJSON *j = js->child; j; j = j->next, d++) {
        uint64_t v;
        if (!json_uint(j, &v))
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: tensor '%s': shape[%d] is not a non-negative integer "
                                "below 2^53\n" HINT_CORRUPT, label, name, d);
        t.shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel)) overflow = true;
    }
    uint64_t b, e2, nbytes;
    if (!json_uint(jo->child, &b) || !json_uint(jo->child->next, &e2))
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets are not non-negative integers below "
                            "2^53\n" HINT_CORRUPT, label, name);
    char desc[160];
    describe(t.dtype, t.ndim, t.shape, desc, sizeof desc);
    if (overflow ||
        __builtin_mul_overflow(numel, (uint64_t)gm_dtype_get(t.dtype)->type_size, &nbytes))
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': the size of %s overflows 64 bits\n" HINT_CORRUPT,
                            label, name, desc);
    if (e2 < b || e2 - b != nbytes)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") do not "
                            "match %s (%" PRIu64 " bytes)\n" HINT_CORRUPT,
                            label, name, b, e2, desc, nbytes);
    if (e2 > buf_len)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") run past "
                            "the end of the file: the data buffer holds only %" PRIu64 " bytes: "
                            "the file is truncated\n" HINT_TRUNCATED,
                            label, name, b, e2, buf_len);
    t.nbytes = (size_t)nbytes;
    t.name = gm_strdup(name);
    if (!t.name) return nomem(err, label);
    sp->begin = b;
    sp->end = e2;
    sp->idx = st->n_tensors;
    gm_status s = push_tensor(st, &t, label, err);
    if (s != GM_OK) gm_free(t.name);
    return s;
}

static gm_status parse_metadata(gm_safetensors *st, const cJSON *m, const char *label,
                                gm_error *err) {
    if (!cJSON_IsObject(m))
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: \"__metadata__\" is not an object\n" HINT_CORRUPT, label);
    int n = cJSON_GetArraySize(m);
    for (const cJSON *j = m->child; j; j = j->next)
        if (!cJSON_IsString(j))
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: \"__metadata__\" entry '%s' is not a string (safetensors "
                                "metadata values must be strings)\n" HINT_CORRUPT,
                                label, j->string);
    if (st->meta || n == 0) return GM_OK; // only the first shard's metadata is kept
    st->meta = gm_calloc((size_t)n, sizeof *st->meta);
    if (!st->meta) return nomem(err, label);
    for (const cJSON *j = m->child; j; j = j->next) {
        st_meta *me = &st->meta[st->n_meta];
        me->key = gm_strdup(j->string);
        me->value = gm_strdup(j->valuestring);
        st->n_meta++;
        if (!me->key || !me->value) return nomem(err, label);
    }
    return GM_OK;
}

/* Why a file that is not safetensors looks the way it does. */
static const char *magic_hint(const uint8_t *b, size_t n) {
    if (n >= 4 && memcmp(b, "GGUF", 4) == 0) return "\nhint: this is a GGUF file: open it as GGUF";
    if (n >= 2 && b[0] == 'P' && b[1] == 'K')
        return "\nhint: this is a zip archive (a PyTorch .bin?)";
    return "\n" HINT_CORRUPT;
}

/* Parses shard `si` (already mapped into st->shards[si]) and appends its tensors. */
static gm_status parse_shard(gm_safetensors *st, int si, gm_error *err) {
    const st_shard *sh = &st->shards[si];
    const char *label = sh->path;
    const uint8_t *p = sh->buf;
    size_t size = sh->size;
    if (size < 8)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: truncated: the file has %zu bytes, fewer than the 8-byte header "
                            "length\n" HINT_TRUNCATED, label, size);
    uint64_t n = ld64(p);
    if (n > ST_MAX_HEADER)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: header length %" PRIu64 " (bytes 0..7) exceeds the limit of %llu "
                            "bytes: not a safetensors file, or corrupt%s",
                            label, n, ST_MAX_HEADER, magic_hint(p, size));
    if (n > size - 8)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: header length %" PRIu64 " (bytes 0..7) runs past the end of the "
                            "file (%zu bytes): the file is truncated\n" HINT_TRUNCATED,
                            label, n, size);
    if (n < 2 || p[8] != '{')
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: the JSON header at byte 8 does not start with '{': not a "
                            "safetensors file%s", label, magic_hint(p, size));
    char *hdr = gm_malloc((size_t)n + 1);
    if (!hdr) return nomem(err, label);
    memcpy(hdr, p + 8, (size_t)n);
    hdr[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
    gm_status s = GM_OK;
    span *spans = NULL;
    int64_t first = st->n_tensors;
    uint64_t buf_len = size - 8 - n;
    if (!root) {
        size_t at = end ? (size_t)(end - hdr) : 0;
        s = gm_error_set(err, GM_ERR_FORMAT,
                         "%s: the header is not valid JSON: error near byte %zu of the file "
                         "(header byte %zu)\n" HINT_CORRUPT, label, at + 8, at);
        goto done;
    }
    for (const char *q = end; q < hdr + n; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: unexpected bytes after the JSON header, at byte %zu (only "
                             "space padding may follow it)\n" HINT_CORRUPT,
                             label, (size_t)(q - hdr) + 8);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: the JSON header is not an object\n" HINT_CORRUPT,
                         label);
        goto done;
    }
    int n_entries = cJSON_GetArraySize(root);
    spans = gm_malloc((size_t)(n_entries > 0 ? n_entries : 1) * sizeof *spans);
    if (!spans) {
        s = nomem(err, label);
        goto done;
    }
    int n_spans = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if ((s = parse_metadata(st, e, label, err)) != GM_OK) goto done;
            continue;
        }
        if ((s = parse_entry(st, si, e, buf_len, label, &spans[n_spans], err)) != GM_OK) goto done;
        n_spans++;
    }
    /* Sorted by offset, the entries must tile [0, buf_len) exactly (zero-size ones anywhere). */
    qsort(spans, (size_t)n_spans, sizeof *spans, cmp_span);
    uint64_t at = 0;
    int64_t prev = -1;
    for (int i = 0; i < n_spans; i++) {
        const span *sp = &spans[i];
        if (sp->begin != at) {
            const char *what = sp->begin > at ? "leaves a gap after" : "overlaps";
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") %s %s%s%s "
                             "(which ends at %" PRIu64 "): offsets must tile the data buffer "
                             "exactly\n" HINT_CORRUPT,
                             label, st->tensors[sp->idx].name, sp->begin, sp->end, what,
                             prev >= 0 ? "tensor '" : "the start of the buffer",
                             prev >= 0 ? st->tensors[prev].name : "", prev >= 0 ? "'" : "", at);
            goto done;
        }
        at = sp->end;
        prev = sp->idx;
    }
    if (at != buf_len) {
        s = gm_error_set(err, GM_ERR_FORMAT,
                         "%s: %" PRIu64 " trailing bytes after the last tensor (file bytes %"
                         PRIu64 "..%zu are not covered by any entry): the data buffer must end at "
                         "the end of the file\n" HINT_CORRUPT,
                         label, buf_len - at, 8 + n + at, size);
        goto done;
    }
    /* Reorder this shard's tensors into file order and point them into the mapping. */
    if (n_spans > 0) {
        gm_st_tensor *tmp = gm_malloc((size_t)n_spans * sizeof *tmp);
        if (!tmp) {
            s = nomem(err, label);
            goto done;
        }
        for (int i = 0; i < n_spans; i++) {
            tmp[i] = st->tensors[spans[i].idx];
            tmp[i].data = p + 8 + n + spans[i].begin;
        }
        memcpy(st->tensors + first, tmp, (size_t)n_spans * sizeof *tmp);
        gm_free(tmp);
    }
done:
    gm_free(spans);
    cJSON_Delete(root);
    gm_free(hdr);
    return s;
}

/* ---- object lifetime ---------------------------------------------------------------------- */

void gm_safetensors_free(gm_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_tensors; i++) gm_free(st->tensors[i].name);
    gm_free(st->tensors);
    gm_free(st->by_name);
    for (int i = 0; i < st->n_meta; i++) {
        gm_free(st->meta[i].key);
        gm_free(st->meta[i].value);
    }
    gm_free(st->meta);
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map.path) gm_mmap_close(&st->shards[i].map);
        gm_free(st->shards[i].path);
    }
    gm_free(st->shards);
    gm_free(st);
}

/* Sorted name index; duplicate names are an error naming where both copies are. */
static gm_status index_names(gm_safetensors *st, const char *label, gm_error *err) {
    size_t n = (size_t)(st->n_tensors > 0 ? st->n_tensors : 1);
    st->by_name = gm_malloc(n * sizeof(int64_t));
    name_idx *tmp = gm_malloc(n * sizeof *tmp);
    if (!st->by_name || !tmp) {
        gm_free(tmp);
        return nomem(err, label);
    }
    for (int64_t i = 0; i < st->n_tensors; i++) tmp[i] = (name_idx){st->tensors[i].name, i};
    qsort(tmp, (size_t)st->n_tensors, sizeof *tmp, cmp_name);
    for (int64_t i = 0; i < st->n_tensors; i++) st->by_name[i] = tmp[i].idx;
    gm_free(tmp);
    for (int64_t i = 1; i < st->n_tensors; i++) {
        const gm_st_tensor *a = &st->tensors[st->by_name[i - 1]], *b = &st->tensors[st->by_name[i]];
        if (strcmp(a->name, b->name) == 0)
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: duplicate tensor name '%s' (in %s and in %s)\n" HINT_CORRUPT,
                                label, a->name, st->shards[a->shard].path,
                                st->shards[b->shard].path);
    }
    return GM_OK;
}

static gm_safetensors *new_st(int n_shards) {
    gm_safetensors *st = gm_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->shards = gm_calloc((size_t)n_shards, sizeof *st->shards);
    if (!st->shards) {
        gm_free(st);
        return NULL;
    }
    return st;
}

gm_status gm_safetensors_open_memory(const void *buf, size_t size, const char *label,
                                     gm_safetensors **out, gm_error *err) {
    *out = NULL;
    if (!label) label = "<memory>";
    gm_safetensors *st = new_st(1);
    if (!st) return nomem(err, label);
    static const uint8_t empty[1];
    st->n_shards = 1;
    st->shards[0].path = gm_strdup(label);
    st->shards[0].buf = buf ? buf : empty;
    st->shards[0].size = buf ? size : 0;
    gm_status s = st->shards[0].path ? parse_shard(st, 0, err) : nomem(err, label);
    if (s == GM_OK) s = index_names(st, label, err);
    if (s != GM_OK) {
        gm_safetensors_free(st);
        return s;
    }
    *out = st;
    return GM_OK;
}

/* Maps shard si from `path` and parses it. */
static gm_status open_shard(gm_safetensors *st, int si, const char *path, gm_error *err) {
    st_shard *sh = &st->shards[si];
    sh->path = gm_strdup(path);
    if (!sh->path) return nomem(err, path);
    GM_TRY(gm_mmap_open(path, &sh->map, err));
    sh->buf = sh->map.data;
    sh->size = sh->map.size;
    if (!sh->buf) { // an empty file maps to NULL
        static const uint8_t empty[1];
        sh->buf = empty;
    }
    return parse_shard(st, si, err);
}

static gm_status open_file(const char *path, gm_safetensors **out, gm_error *err) {
    gm_safetensors *st = new_st(1);
    if (!st) return nomem(err, path);
    st->n_shards = 1;
    gm_status s = open_shard(st, 0, path, err);
    if (s == GM_OK) s = index_names(st, path, err);
    if (s != GM_OK) {
        gm_safetensors_free(st);
        return s;
    }
    *out = st;
    return GM_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard file name from an index must be a plain name in the index's folder. */
static bool plain_file_name(const char *s) {
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static gm_status open_index(const char *index_path, gm_safetensors **out, gm_error *err) {
    char *text = NULL;
    size_t len = 0;
    GM_TRY(gm_read_file(index_path, &text, &len, err));
    cJSON *root = cJSON_ParseWithLength(text, len);
    gm_free(text);
    gm_status s = GM_OK;
    gm_safetensors *st = NULL;
    const char **names = NULL;
    char *dir = NULL, *path = NULL;
    if (!root) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: not valid JSON\n" HINT_CORRUPT, index_path);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        s = gm_error_set(err, GM_ERR_FORMAT,
                         "%s: no \"weight_map\" object (expected {\"weight_map\": {tensor name: "
                         "shard file}})\n" HINT_CORRUPT, index_path);
        goto done;
    }
    /* Distinct shard names, sorted (model-00001-of-... first). */
    int n_entries = cJSON_GetArraySize(wm), n_names = 0;
    names = gm_malloc((size_t)(n_entries > 0 ? n_entries : 1) * sizeof *names);
    if (!names) {
        s = nomem(err, index_path);
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring)) {
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: weight_map entry for tensor '%s' is not a shard file name in "
                             "the index's folder\n" HINT_CORRUPT,
                             index_path, e->string);
            goto done;
        }
        names[n_names++] = e->valuestring;
    }
    qsort(names, (size_t)n_names, sizeof *names, cmp_str);
    int n_shards = 0;
    for (int i = 0; i < n_names; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) names[n_shards++] = names[i];
    if (n_shards == 0) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: the weight_map is empty\n" HINT_CORRUPT,
                         index_path);
        goto done;
    }

    st = new_st(n_shards);
    const char *slash = strrchr(index_path, '/');
    dir = slash ? gm_strndup(index_path, (size_t)(slash - index_path)) : gm_strdup(".");
    if (!st || !dir) {
        s = nomem(err, index_path);
        goto done;
    }
    for (int i = 0; i < n_shards; i++) {
        size_t plen = strlen(dir) + strlen(names[i]) + 2;
        gm_free(path);
        path = gm_malloc(plen);
        if (!path) {
            s = nomem(err, index_path);
            goto done;
        }
        snprintf(path, plen, "%s/%s", dir, names[i]);
        st->n_shards = i + 1;
        s = open_shard(st, i, path, err);
        if (s != GM_OK) {
            if (s == GM_ERR_IO) { // say which index entry wanted the missing shard
                const char *who = "?";
                int count = 0;
                for (const cJSON *e = wm->child; e; e = e->next)
                    if (strcmp(e->valuestring, names[i]) == 0 && count++ == 0) who = e->string;
                char sys[sizeof err->msg];
                snprintf(sys, sizeof sys, "%s", err ? err->msg : "");
                s = gm_error_set(err, GM_ERR_IO,
                                 "%s: shard '%s' (listed for tensor '%s' and %d other%s) cannot be "
                                 "opened: %s\nhint: the download is incomplete: fetch the missing "
                                 "shard into the same folder",
                                 index_path, names[i], who, count - 1, count == 2 ? "" : "s", sys);
            }
            goto done;
        }
    }
    if ((s = index_names(st, index_path, err)) != GM_OK) goto done;
    /* Every tensor the index lists must be in the shard it names. */
    for (const cJSON *e = wm->child; e; e = e->next) {
        const gm_st_tensor *t = gm_safetensors_find(st, e->string);
        if (!t || strcmp(strrchr(st->shards[t->shard].path, '/') + 1, e->valuestring) != 0) {
            s = gm_error_set(err, GM_ERR_FORMAT,
                             "%s: the index puts tensor '%s' in shard '%s', but %s\n"
                             "hint: the index and the shards come from different saves: download "
                             "the folder again",
                             index_path, e->string, e->valuestring,
                             t ? "it is in another shard" : "that shard has no such tensor");
            goto done;
        }
    }
done:
    gm_free(path);
    gm_free(dir);
    gm_free(names);
    cJSON_Delete(root);
    if (s != GM_OK) {
        gm_safetensors_free(st);
        return s;
    }
    *out = st;
    return GM_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Opens a folder: its index, else model.safetensors, else its only *.safetensors file. */
static gm_status open_folder(const char *dir, gm_safetensors **out, gm_error *err) {
    size_t plen = strlen(dir) + 64;
    char *p = gm_malloc(plen);
    if (!p) return nomem(err, dir);
    gm_status s;
    snprintf(p, plen, "%s/model.safetensors.index.json", dir);
    if (is_file(p)) {
        s = open_index(p, out, err);
        gm_free(p);
        return s;
    }
    snprintf(p, plen, "%s/model.safetensors", dir);
    if (is_file(p)) {
        s = open_file(p, out, err);
        gm_free(p);
        return s;
    }
    gm_free(p);
    DIR *d = opendir(dir);
    if (!d) return gm_error_set(err, GM_ERR_IO, "%s: cannot read the folder", dir);
    char *only = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".safetensors")) continue;
        if (count++ == 0) only = gm_strdup(e->d_name);
    }
    closedir(d);
    if (count != 1) {
        gm_free(only);
        return gm_error_set(err, GM_ERR_IO,
                            "%s: the folder has no model.safetensors.index.json or "
                            "model.safetensors, and %d other .safetensors files\nhint: pass the "
                            "file (or the index) to open",
                            dir, count);
    }
    if (!only) return nomem(err, dir);
    plen = strlen(dir) + strlen(only) + 2;
    p = gm_malloc(plen);
    if (!p) {
        gm_free(only);
        return nomem(err, dir);
    }
    snprintf(p, plen, "%s/%s", dir, only);
    gm_free(only);
    s = open_file(p, out, err);
    gm_free(p);
    return s;
}

gm_status gm_safetensors_open(const char *path, gm_safetensors **out, gm_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: no such file or folder", path);
    if (S_ISDIR(sb.st_mode)) {
        /* Strip trailing slashes so messages read "dir/model..." not "dir//model...". */
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        char *dir = gm_strndup(path, n);
        if (!dir) return nomem(err, path);
        gm_status s = open_folder(dir, out, err);
        gm_free(dir);
        return s;
    }
    if (ends_with(path, ".json")) return open_index(path, out, err);
    return open_file(path, out, err);
}

/* ---- queries ------------------------------------------------------------------------------ */

int64_t gm_safetensors_n_tensors(const gm_safetensors *st) { return st->n_tensors; }

const gm_st_tensor *gm_safetensors_tensor_at(const gm_safetensors *st, int64_t i) {
    return (i >= 0 && i < st->n_tensors) ? &st->tensors[i] : NULL;
}

const gm_st_tensor *gm_safetensors_find(const gm_safetensors *st, const char *name) {
    int64_t lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const gm_st_tensor *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *gm_safetensors_metadata(const gm_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

int gm_safetensors_n_shards(const gm_safetensors *st) { return st->n_shards; }

const char *gm_safetensors_shard_path(const gm_safetensors *st, int shard) {
    return (shard >= 0 && shard < st->n_shards) ? st->shards[shard].path : NULL;
}

/* ---- writing ------------------------------------------------------------------------------ */

static const char *st_dtype_name(gm_dtype d) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].dtype == (int)d && strcmp(st_dtypes[i].name, "BOOL") != 0) return st_dtypes[i].name;
    return NULL;
}

/* order[0..n) sorted by the tensors' names (insertion sort: a few hundred names; names checked
 * non-NULL by the caller's loop first). */
static void sort_by_name(int *order, const gm_st_write_tensor *t, int n) {
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i;
        for (; j > 0 && strcmp(t[order[j - 1]].name ? t[order[j - 1]].name : "", t[v].name ? t[v].name : "") > 0; j--)
            order[j] = order[j - 1];
        order[j] = v;
    }
}

gm_status gm_safetensors_write(const char *path, const gm_st_write_tensor *t, int n, const char *const *meta, int n_meta,
                               gm_error *err) {
    int *order = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    cJSON *h = cJSON_CreateObject();
    gm_status s = order && h ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    for (int i = 0; s == GM_OK && i < n; i++) order[i] = i;
    if (s == GM_OK) sort_by_name(order, t, n);
    if (s == GM_OK && n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(h, "__metadata__");
        for (int i = 0; m && i < n_meta; i++) cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]);
    }
    size_t off = 0;
    for (int k = 0; s == GM_OK && k < n; k++) {
        const gm_st_write_tensor *w = &t[order[k]];
        const char *dn = st_dtype_name(w->dtype);
        if (!w->name || !*w->name || !dn || gm_dtype_get(w->dtype)->is_quantized || w->ndim < 0 || w->ndim > 8) {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s': cannot be written to safetensors (dtype %s, %d dims)", path,
                             w->name ? w->name : "", gm_dtype_name(w->dtype), w->ndim);
            break;
        }
        if (k > 0 && strcmp(t[order[k - 1]].name, w->name) == 0) {
            s = gm_error_set(err, GM_ERR_INVALID, "%s: tensor '%s' given twice", path, w->name);
            break;
        }
        int64_t numel = 1;
        double shp[8];
        for (int d = 0; d < w->ndim; d++) numel *= w->shape[d], shp[d] = (double)w->shape[d];
        size_t nb = (size_t)numel * (size_t)gm_dtype_get(w->dtype)->type_size;
        cJSON *e = cJSON_AddObjectToObject(h, w->name);
        double offs[2] = {(double)off, (double)(off + nb)};
        if (!e || !cJSON_AddStringToObject(e, "dtype", dn) || !cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shp, w->ndim)) ||
            !cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offs, 2)))
            s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        off += nb;
    }
    char *json = s == GM_OK ? cJSON_PrintUnformatted(h) : NULL;
    if (s == GM_OK && !json) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    /* header padded with spaces so the byte buffer starts 8-byte aligned (as the reference
     * writer does) */
    size_t hn = json ? strlen(json) : 0, hpad = (hn + 7) / 8 * 8;
    /* the header, then each tensor's bytes straight from the caller's buffers (no image of the
     * whole file in memory: a merged model's tensors are large) */
    uint8_t *head = s == GM_OK ? gm_malloc(8 + hpad) : NULL;
    gm_file_part *parts = s == GM_OK ? gm_malloc((size_t)(n + 1) * sizeof *parts) : NULL;
    if (s == GM_OK && (!head || !parts)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory writing %s", path);
    if (s == GM_OK) {
        for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)hpad >> (8 * i));
        memcpy(head + 8, json, hn);
        memset(head + 8 + hn, ' ', hpad - hn);
        parts[0] = (gm_file_part){head, 8 + hpad};
        size_t total = 0;
        for (int k = 0; k < n; k++) {
            const gm_st_write_tensor *w = &t[order[k]];
            int64_t numel = 1;
            for (int d = 0; d < w->ndim; d++) numel *= w->shape[d];
            size_t nb = (size_t)numel * (size_t)gm_dtype_get(w->dtype)->type_size;
            parts[k + 1] = (gm_file_part){w->data, nb};
            total += nb;
        }
        s = total == off ? gm_write_file_atomic_parts(path, parts, n + 1, err)
                         : gm_error_set(err, GM_ERR_INVALID, "%s: data size mismatch", path);
    }
    gm_free(head);
    gm_free(parts);
    cJSON_free(json);
    cJSON_Delete(h);
    gm_free(order);
    return s;
}
