/*
 * gm_gguf.c - GGUF v2/v3 reader: parse and validate the whole header up front, then serve
 * borrowed views into the mapping.
 *
 * How: one forward pass over the image with a bounds-checked cursor (struct rd). Every read
 * first checks that the bytes exist, so no input can make us read outside [buf, buf+size);
 * every count read from the file is checked against the bytes that remain before anything is
 * allocated for it, so a forged count (2^60 tensors) fails with a message instead of a huge
 * allocation. String arrays are walked twice (validate, then index) for the same reason.
 * Arrays of kvs and tensor infos grow as entries are actually parsed, so memory stays
 * proportional to the bytes really present.
 *
 * Duplicate keys and tensor names are found with an open-addressing hash (the same tables
 * serve gm_gguf_find_kv / gm_gguf_find_tensor), so a hostile file with 10^5 tiny entries
 * costs linear time, which the fuzzer relies on.
 *
 * Rejected alternative: copying the header into owned structs (as ggml does). Pointers into
 * the mapping are enough because the mapping lives as long as the gm_gguf.
 *
 * Written from formats.md §1.1-1.3 (the GGUF spec and ggml's reader rules), not from ggml code.
 */
#include "gm_gguf.h"

#include "gm_alloc.h" // gm_malloc, gm_free, gm_strdup
#include "gm_file.h"  // gm_write_file_atomic
#include "gm_mmap.h"  // gm_mmap_open

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32u // GGUF_DEFAULT_ALIGNMENT in ggml's gguf.h
#define GGUF_MAX_NAME 64           // GGML_MAX_NAME: names must be shorter (room for the NUL)
#define GGUF_MAX_DIMS 4            // GGML_MAX_DIMS
#define GGUF_HEADER_BYTES 24       // magic, version, tensor_count, kv_count
/* Smallest possible records, used to bound counts by the bytes that remain:
 * kv = key length (8) + a 1-byte key (empty keys are rejected) + type (4) + a 1-byte value;
 * tensor info = name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 14u
#define GGUF_MIN_TENSOR_BYTES 32u

#define HINT_TRUNCATED                                                                       \
    "hint: the file may be truncated (an interrupted download?): re-download it, e.g. with " \
    "`gemmarun fetch gemma3-270m`"
#define HINT_CORRUPT                                                                         \
    "hint: the file is corrupt or was not written by a GGUF writer: re-download or re-convert it"

struct gm_gguf {
    char *label;         // the path, or the caller's label for in-memory images
    gm_mapped_file map;  // owned when opened from a path (map.data != NULL)
    const uint8_t *buf;
    size_t size;
    uint32_t version;
    uint32_t alignment;
    size_t data_offset;

    gm_gguf_kv *kvs;
    int64_t n_kv, cap_kv;
    gm_gguf_tensor *tensors;
    int64_t n_tensors, cap_tensors;

    /* Open-addressing hash tables: slot holds index+1, 0 = empty. Capacity a power of two. */
    int64_t *kv_hash;
    size_t kv_hash_cap;
    int64_t *t_hash;
    size_t t_hash_cap;
};

/* ---- ggml type table ---------------------------------------------------------------------- */

/* ggml type ids (formats.md §1.3). `dtype` < 0: a ggml type we do not decode. Names follow
 * ggml's spelling so messages match what users see in llama.cpp tools. */
typedef struct ggml_type_row {
    const char *name;
    int dtype;
} ggml_type_row;

static const ggml_type_row ggml_types[] = {
    [0] = {"f32", GM_F32},        [1] = {"f16", GM_F16},
    [2] = {"q4_0", GM_Q4_0},      [3] = {"q4_1", GM_Q4_1},
    [4] = {"q4_2 (removed)", -1}, [5] = {"q4_3 (removed)", -1},
    [6] = {"q5_0", GM_Q5_0},      [7] = {"q5_1", GM_Q5_1},
    [8] = {"q8_0", GM_Q8_0},      [9] = {"q8_1", -1},
    [10] = {"q2_K", GM_Q2_K},     [11] = {"q3_K", GM_Q3_K},
    [12] = {"q4_K", GM_Q4_K},     [13] = {"q5_K", GM_Q5_K},
    [14] = {"q6_K", GM_Q6_K},     [15] = {"q8_K", -1},
    [16] = {"iq2_xxs", -1},       [17] = {"iq2_xs", -1},
    [18] = {"iq3_xxs", -1},       [19] = {"iq1_s", -1},
    [20] = {"iq4_nl", -1},        [21] = {"iq3_s", -1},
    [22] = {"iq2_s", -1},         [23] = {"iq4_xs", -1},
    [24] = {"i8", GM_I8},         [25] = {"i16", GM_I16},
    [26] = {"i32", GM_I32},       [27] = {"i64", GM_I64},
    [28] = {"f64", GM_F64},       [29] = {"iq1_m", -1},
    [30] = {"bf16", GM_BF16},     [31] = {"q4_0_4_4 (removed)", -1},
    [32] = {"q4_0_4_8 (removed)", -1}, [33] = {"q4_0_8_8 (removed)", -1},
    [34] = {"tq1_0", -1},         [35] = {"tq2_0", -1},
    [36] = {"iq4_nl_4_4 (removed)", -1}, [37] = {"iq4_nl_4_8 (removed)", -1},
    [38] = {"iq4_nl_8_8 (removed)", -1}, [39] = {"mxfp4", -1},
    [40] = {"nvfp4", -1},         [41] = {"q1_0", -1},
    [42] = {"q2_0", -1},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *gm_gguf_ggml_type_name(uint32_t ggml_type) {
    if (ggml_type < N_GGML_TYPES && ggml_types[ggml_type].name) return ggml_types[ggml_type].name;
    return "unknown";
}

static const char *const vtype_names[GM_GGUF_VTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *gm_gguf_vtype_name(gm_gguf_vtype t) {
    return (unsigned)t < GM_GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

/* Bytes of one scalar of type t; 0 for STRING and ARRAY (variable length). */
static size_t vtype_size(uint32_t t) {
    switch (t) {
    case GM_GGUF_UINT8: case GM_GGUF_INT8: case GM_GGUF_BOOL: return 1;
    case GM_GGUF_UINT16: case GM_GGUF_INT16: return 2;
    case GM_GGUF_UINT32: case GM_GGUF_INT32: case GM_GGUF_FLOAT32: return 4;
    case GM_GGUF_UINT64: case GM_GGUF_INT64: case GM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* ---- little-endian loads (the mapping may be unaligned; the host may not be LE) ---------- */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

/* A printable copy of a file string for messages: control bytes become '?', long strings are
 * cut with "...". Never reads past s.len. */
static const char *show(gm_strref s, char *out, size_t cap) {
    size_t n = s.len < cap - 4 ? (size_t)s.len : cap - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        out[i] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c; /* never echo raw bytes to a terminal */
    }
    if (n < s.len) {
        memcpy(out + n, "...", 4);
    } else {
        out[n] = '\0';
    }
    return out;
}

/* ---- bounds-checked cursor ---------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t size, pos;
    const char *label;
    gm_error *err;
    char where[200]; // context for messages: "in metadata key 3 ('general.name')"
} rd;

static void set_where(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_where(rd *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->where, sizeof r->where, fmt, ap);
    va_end(ap);
}

static gm_status truncated(rd *r, size_t need, const char *what) {
    return gm_error_set(r->err, GM_ERR_FORMAT,
                        "%s: truncated %s: %s (%zu bytes) at byte %zu runs past the end of the "
                        "file (%zu bytes)\n" HINT_TRUNCATED,
                        r->label, r->where, what, need, r->pos, r->size);
}

static gm_status rd_u32(rd *r, uint32_t *v, const char *what) {
    if (r->size - r->pos < 4) return truncated(r, 4, what);
    *v = ld32(r->p + r->pos);
    r->pos += 4;
    return GM_OK;
}

static gm_status rd_u64(rd *r, uint64_t *v, const char *what) {
    if (r->size - r->pos < 8) return truncated(r, 8, what);
    *v = ld64(r->p + r->pos);
    r->pos += 8;
    return GM_OK;
}

/* A GGUF string: u64 length + bytes (no NUL). The bytes must lie inside the file. */
static gm_status rd_str(rd *r, gm_strref *s, const char *what) {
    size_t at = r->pos;
    uint64_t len = 0;
    char lwhat[96];
    snprintf(lwhat, sizeof lwhat, "the length of %s", what);
    GM_TRY(rd_u64(r, &len, lwhat));
    if (len > r->size - r->pos)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: %s has length %" PRIu64 " (at byte %zu) but only %zu bytes "
                            "remain in the file (%zu bytes): truncated or corrupt\n" HINT_TRUNCATED,
                            r->label, r->where, what, len, at, r->size - r->pos, r->size);
    s->p = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += (size_t)len;
    return GM_OK;
}

/* ---- hash tables over strrefs ------------------------------------------------------------- */

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; // FNV-1a 64
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static bool strref_eq(gm_strref a, const char *p, size_t n) {
    return a.len == n && (n == 0 || memcmp(a.p, p, n) == 0);
}

/* Allocates a table for n entries (load factor <= 1/2). */
static int64_t *hash_new(int64_t n, size_t *cap) {
    size_t c = 8;
    while (c < (size_t)n * 2) c *= 2;
    *cap = c;
    return gm_calloc(c, sizeof(int64_t));
}

/* Inserts index i with name s; returns -1 on success or the index already holding s. */
static int64_t hash_insert(int64_t *tab, size_t cap, gm_strref s, int64_t i,
                           gm_strref (*name_of)(const gm_gguf *, int64_t), const gm_gguf *g) {
    size_t mask = cap - 1, h = (size_t)hash_bytes(s.p, (size_t)s.len) & mask;
    while (tab[h] != 0) {
        int64_t j = tab[h] - 1;
        if (strref_eq(name_of(g, j), s.p, (size_t)s.len)) return j;
        h = (h + 1) & mask;
    }
    tab[h] = i + 1;
    return -1;
}

static int64_t hash_find(const int64_t *tab, size_t cap, const char *p, size_t n,
                         gm_strref (*name_of)(const gm_gguf *, int64_t), const gm_gguf *g) {
    if (!tab) return -1;
    size_t mask = cap - 1, h = (size_t)hash_bytes(p, n) & mask;
    while (tab[h] != 0) {
        int64_t j = tab[h] - 1;
        if (strref_eq(name_of(g, j), p, n)) return j;
        h = (h + 1) & mask;
    }
    return -1;
}

static gm_strref kv_name(const gm_gguf *g, int64_t i) { return g->kvs[i].key; }
static gm_strref tensor_name(const gm_gguf *g, int64_t i) { return g->tensors[i].name; }

/* ---- parsing ------------------------------------------------------------------------------ */

static gm_status nomem(rd *r, const char *what) {
    return gm_error_set(r->err, GM_ERR_NOMEM, "%s: out of memory while reading %s", r->label, what);
}

/* Checks BOOL bytes are 0 or 1 (formats.md §1.1: anything else is invalid). */
static gm_status check_bools(rd *r, const uint8_t *v, uint64_t n, size_t at) {
    for (uint64_t i = 0; i < n; i++) {
        if (v[i] > 1)
            return gm_error_set(
                r->err, GM_ERR_FORMAT,
                "%s: %s: bool value %u at byte %zu is neither 0 nor 1\n" HINT_CORRUPT, r->label,
                r->where, v[i], at + (size_t)i);
    }
    return GM_OK;
}

/* Reads `n` strings starting at the cursor: first validates all lengths (no allocation), then
 * allocates the index and fills it. */
static gm_status rd_str_array(rd *r, uint64_t n, gm_strref **out) {
    *out = NULL;
    size_t start = r->pos;
    char what[64];
    for (uint64_t i = 0; i < n; i++) {
        gm_strref s;
        snprintf(what, sizeof what, "string %" PRIu64 " of %" PRIu64, i, n);
        GM_TRY(rd_str(r, &s, what));
    }
    if (n == 0) return GM_OK;
    gm_strref *v = gm_malloc((size_t)n * sizeof *v);
    if (!v) return nomem(r, "a string array");
    size_t pos = start;
    for (uint64_t i = 0; i < n; i++) { // lengths were validated by the first pass
        uint64_t len = ld64(r->p + pos);
        v[i].p = (const char *)r->p + pos + 8;
        v[i].len = len;
        pos += 8 + (size_t)len;
    }
    *out = v;
    return GM_OK;
}

static gm_status parse_kv(gm_gguf *g, rd *r, int64_t idx, int64_t n_kv) {
    gm_gguf_kv kv;
    memset(&kv, 0, sizeof kv);
    size_t key_at = r->pos;
    set_where(r, "in metadata key %" PRId64 " of %" PRId64, idx, n_kv);
    GM_TRY(rd_str(r, &kv.key, "the key"));
    if (kv.key.len == 0)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: empty key at byte %zu\n" HINT_CORRUPT, r->label, r->where,
                            key_at);
    char kbuf[96];
    set_where(r, "in metadata key %" PRId64 " of %" PRId64 " ('%s')", idx, n_kv,
              show(kv.key, kbuf, sizeof kbuf));

    uint32_t type;
    size_t type_at = r->pos;
    GM_TRY(rd_u32(r, &type, "the value type"));
    if (type >= GM_GGUF_VTYPE_COUNT)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: unknown value type %" PRIu32 " at byte %zu (valid types are "
                            "0..12)\n" HINT_CORRUPT,
                            r->label, r->where, type, type_at);
    kv.type = (gm_gguf_vtype)type;
    kv.arr_type = kv.type;
    kv.n = 1;

    if (type == GM_GGUF_ARRAY) {
        uint32_t et;
        size_t et_at = r->pos;
        GM_TRY(rd_u32(r, &et, "the array element type"));
        if (et == GM_GGUF_ARRAY)
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: %s: nested array (an array of arrays) at byte %zu is not "
                                "supported\nhint: GGUF readers (ggml, gemmarun) reject arrays of "
                                "arrays; rewrite the key as a flat array",
                                r->label, r->where, et_at);
        if (et >= GM_GGUF_VTYPE_COUNT)
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: %s: unknown array element type %" PRIu32 " at byte %zu "
                                "(valid types are 0..12)\n" HINT_CORRUPT,
                                r->label, r->where, et, et_at);
        kv.arr_type = (gm_gguf_vtype)et;
        size_t n_at = r->pos;
        GM_TRY(rd_u64(r, &kv.n, "the array element count"));
        size_t rem = r->size - r->pos;
        size_t esz = et == GM_GGUF_STRING ? 8 : vtype_size(et); // a string is >= its 8-byte length
        if (kv.n > rem / esz)
            return gm_error_set(
                r->err, GM_ERR_FORMAT,
                "%s: %s: array element count %" PRIu64 " at byte %zu is impossible: "
                "the %zu bytes left in the file hold at most %zu %s elements: "
                "truncated or corrupt\n" HINT_TRUNCATED,
                r->label, r->where, kv.n, n_at, rem, rem / esz, gm_gguf_vtype_name(kv.arr_type));
        kv.data = r->p + r->pos;
        if (et == GM_GGUF_STRING) {
            GM_TRY(rd_str_array(r, kv.n, &kv.strs));
        } else {
            if (et == GM_GGUF_BOOL) GM_TRY(check_bools(r, kv.data, kv.n, r->pos));
            r->pos += (size_t)kv.n * esz;
        }
    } else if (type == GM_GGUF_STRING) {
        kv.data = r->p + r->pos;
        gm_strref s;
        GM_TRY(rd_str(r, &s, "the string value"));
        kv.strs = gm_malloc(sizeof *kv.strs);
        if (!kv.strs) return nomem(r, "a string value");
        kv.strs[0] = s;
    } else {
        size_t esz = vtype_size(type);
        if (r->size - r->pos < esz) return truncated(r, esz, "the value");
        kv.data = r->p + r->pos;
        if (type == GM_GGUF_BOOL) GM_TRY(check_bools(r, kv.data, 1, r->pos));
        r->pos += esz;
    }

    if (g->n_kv == g->cap_kv) {
        int64_t cap = g->cap_kv ? g->cap_kv * 2 : 16;
        gm_gguf_kv *nk = gm_realloc(g->kvs, (size_t)cap * sizeof *nk);
        if (!nk) {
            gm_free(kv.strs);
            return nomem(r, "the metadata");
        }
        g->kvs = nk;
        g->cap_kv = cap;
    }
    g->kvs[g->n_kv++] = kv;
    return GM_OK;
}

/* Finds duplicate keys (ggml rejects them) and builds the lookup table. */
static gm_status index_kvs(gm_gguf *g, rd *r) {
    g->kv_hash = hash_new(g->n_kv, &g->kv_hash_cap);
    if (!g->kv_hash) return nomem(r, "the metadata index");
    for (int64_t i = 0; i < g->n_kv; i++) {
        int64_t j = hash_insert(g->kv_hash, g->kv_hash_cap, g->kvs[i].key, i, kv_name, g);
        if (j >= 0) {
            char kbuf[96];
            size_t at = (size_t)((const uint8_t *)g->kvs[i].key.p - g->buf) - 8;
            size_t first = (size_t)((const uint8_t *)g->kvs[j].key.p - g->buf) - 8;
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: duplicate metadata key '%s' at byte %zu (metadata key %" PRId64
                                "; first defined by key %" PRId64 " at byte %zu)\n" HINT_CORRUPT,
                                r->label, show(g->kvs[i].key, kbuf, sizeof kbuf), at, i, j, first);
        }
    }
    return GM_OK;
}

/* general.alignment: optional, must be UINT32 and a power of two (ggml's rule; the spec says a
 * multiple of 8, which every power of two >= 8 also is). */
static gm_status read_alignment(gm_gguf *g, rd *r) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, "general.alignment");
    if (!kv) return GM_OK;
    size_t at = (size_t)(kv->data - g->buf);
    if (kv->type != GM_GGUF_UINT32)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: metadata key 'general.alignment' (value at byte %zu) has type %s; "
                            "it must be uint32\n" HINT_CORRUPT,
                            r->label, at, gm_gguf_vtype_name(kv->type));
    uint32_t a = ld32(kv->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: metadata key 'general.alignment' = %" PRIu32 " (at byte %zu) is "
                            "not a power of two\n" HINT_CORRUPT,
                            r->label, a, at);
    g->alignment = a;
    return GM_OK;
}

static gm_status parse_tensor_info(gm_gguf *g, rd *r, int64_t idx, int64_t n_t) {
    gm_gguf_tensor t;
    memset(&t, 0, sizeof t);
    size_t at = r->pos;
    set_where(r, "in tensor info %" PRId64 " of %" PRId64, idx, n_t);
    GM_TRY(rd_str(r, &t.name, "the tensor name"));
    char nbuf[96];
    show(t.name, nbuf, sizeof nbuf);
    if (t.name.len >= GGUF_MAX_NAME)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: tensor name '%s' at byte %zu is %" PRIu64 " bytes long; GGUF "
                            "allows at most %d\n" HINT_CORRUPT,
                            r->label, r->where, nbuf, at, t.name.len, GGUF_MAX_NAME - 1);
    memcpy(t.cname, t.name.p, (size_t)t.name.len);
    t.cname[t.name.len] = '\0';
    set_where(r, "in tensor info %" PRId64 " of %" PRId64 " ('%s')", idx, n_t, nbuf);

    uint32_t n_dims;
    size_t nd_at = r->pos;
    GM_TRY(rd_u32(r, &n_dims, "n_dims"));
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: n_dims %" PRIu32 " at byte %zu: must be 1..%d\n" HINT_CORRUPT,
                            r->label, r->where, n_dims, nd_at, GGUF_MAX_DIMS);
    int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1};
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t v;
        size_t d_at = r->pos;
        GM_TRY(rd_u64(r, &v, "a dimension"));
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: %s: dimension ne[%" PRIu32 "] = %" PRIu64 " at byte %zu: "
                                "dimensions must be positive (and < 2^63)\n" HINT_CORRUPT,
                                r->label, r->where, d, v, d_at);
        if ((int64_t)v > INT64_MAX / numel)
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: %s: dimension ne[%" PRIu32 "] = %" PRIu64 " at byte %zu makes "
                                "the element count overflow 64 bits\n" HINT_CORRUPT,
                                r->label, r->where, d, v, d_at);
        ne[d] = (int64_t)v;
        numel *= (int64_t)v;
    }

    size_t type_at = r->pos;
    GM_TRY(rd_u32(r, &t.ggml_type, "the tensor type"));
    if (t.ggml_type >= N_GGML_TYPES || !ggml_types[t.ggml_type].name ||
        ggml_types[t.ggml_type].dtype < 0)
        return gm_error_set(r->err, GM_ERR_UNSUPPORTED,
                            "%s: tensor '%s' (tensor info %" PRId64 ", type at byte %zu) has ggml "
                            "type %s (%" PRIu32 "), which gemmarun does not decode\nhint: use a "
                            "file quantized to f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or "
                            "q2_K..q6_K (e.g. a Q4_K_M or Q8_0 GGUF)",
                            r->label, nbuf, idx, type_at, gm_gguf_ggml_type_name(t.ggml_type),
                            t.ggml_type);
    t.dtype = (gm_dtype)ggml_types[t.ggml_type].dtype;
    const gm_dtype_info *di = gm_dtype_get(t.dtype);
    if (ne[0] % di->block_size != 0)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: row length ne[0] = %" PRId64 " is not a multiple of the %s "
                            "block size %d (type at byte %zu)\n" HINT_CORRUPT,
                            r->label, r->where, ne[0], gm_gguf_ggml_type_name(t.ggml_type),
                            (int)di->block_size, type_at);
    /* nbytes = (ne0 / block) * type_size * ne1 * ne2 * ne3, overflow-checked. */
    uint64_t row_bytes, nbytes;
    uint64_t rows = (uint64_t)(numel / ne[0]);
    if (__builtin_mul_overflow((uint64_t)(ne[0] / di->block_size), (uint64_t)di->type_size,
                               &row_bytes) ||
        __builtin_mul_overflow(row_bytes, rows, &nbytes) || nbytes > SIZE_MAX)
        return gm_error_set(r->err, GM_ERR_FORMAT,
                            "%s: %s: the tensor's byte size overflows 64 bits\n" HINT_CORRUPT,
                            r->label, r->where);
    t.nbytes = (size_t)nbytes;

    GM_TRY(rd_u64(r, &t.offset, "the tensor data offset"));

    t.ndim = (int)n_dims;
    for (int i = 0; i < 4; i++) t.shape[i] = 1;
    for (int i = 0; i < t.ndim; i++) t.shape[i] = ne[t.ndim - 1 - i]; // outermost first

    if (g->n_tensors == g->cap_tensors) {
        int64_t cap = g->cap_tensors ? g->cap_tensors * 2 : 64;
        gm_gguf_tensor *nt = gm_realloc(g->tensors, (size_t)cap * sizeof *nt);
        if (!nt) return nomem(r, "the tensor infos");
        g->tensors = nt;
        g->cap_tensors = cap;
    }
    g->tensors[g->n_tensors++] = t;
    return GM_OK;
}

/* Duplicate names, alignment of each offset, and every tensor inside the file. */
typedef struct span {
    uint64_t offset;
    int64_t index;
} span;

static int cmp_span(const void *a, const void *b) {
    uint64_t x = ((const span *)a)->offset, y = ((const span *)b)->offset;
    return x < y ? -1 : x > y;
}

/* No two tensors may share bytes: a corrupt offset that points into another tensor would
 * silently load wrong weights (ggml itself requires tensors laid out back to back). */
static gm_status check_overlaps(gm_gguf *g, rd *r) {
    if (g->n_tensors < 2) return GM_OK;
    span *order = gm_malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return gm_error_set(r->err, GM_ERR_NOMEM, "%s: out of memory", r->label);
    for (int64_t i = 0; i < g->n_tensors; i++) order[i] = (span){g->tensors[i].offset, i};
    qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_span);
    gm_status s = GM_OK;
    for (int64_t k = 1; k < g->n_tensors; k++) {
        const gm_gguf_tensor *a = &g->tensors[order[k - 1].index], *b = &g->tensors[order[k].index];
        if (a->offset + a->nbytes > b->offset) {
            s = gm_error_set(r->err, GM_ERR_FORMAT,
                             "%s: tensors '%s' (offset %" PRIu64 ", %zu bytes) and '%s' (offset %" PRIu64
                             ") overlap in the data section\n" HINT_CORRUPT,
                             r->label, a->cname, a->offset, a->nbytes, b->cname, b->offset);
            break;
        }
    }
    gm_free(order);
    return s;
}

static gm_status place_tensors(gm_gguf *g, rd *r) {
    g->t_hash = hash_new(g->n_tensors, &g->t_hash_cap);
    if (!g->t_hash) return nomem(r, "the tensor index");
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gm_gguf_tensor *t = &g->tensors[i];
        int64_t j = hash_insert(g->t_hash, g->t_hash_cap, t->name, i, tensor_name, g);
        if (j >= 0) {
            size_t at = (size_t)((const uint8_t *)t->name.p - g->buf) - 8;
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: duplicate tensor name '%s': tensor info %" PRId64
                                " at byte %zu "
                                "repeats tensor info %" PRId64 "\n" HINT_CORRUPT,
                                r->label, t->cname, i, at, j);
        }
        if (t->offset % g->alignment != 0)
            return gm_error_set(r->err, GM_ERR_FORMAT,
                                "%s: tensor '%s' (tensor info %" PRId64 "): data offset %" PRIu64
                                " is not a multiple of the alignment %" PRIu32 " (misaligned)\n"
                                HINT_CORRUPT,
                                r->label, t->cname, i, t->offset, g->alignment);
        size_t room = g->data_offset <= g->size ? g->size - g->data_offset : 0;
        if (g->data_offset > g->size || t->offset > room || t->nbytes > room - (size_t)t->offset) {
            uint64_t end;
            char ends[64] = "";
            if (!__builtin_add_overflow((uint64_t)g->data_offset, t->offset, &end) &&
                !__builtin_add_overflow(end, (uint64_t)t->nbytes, &end))
                snprintf(ends, sizeof ends, ", ending at byte %" PRIu64 ",", end);
            return gm_error_set(
                r->err, GM_ERR_FORMAT,
                "%s: tensor '%s' (tensor info %" PRId64 ", %s, %zu bytes) at offset "
                "%" PRIu64 " of the data section (which starts at byte %zu)%s runs "
                "past the end of the file (%zu bytes): the file is truncated or the "
                "offset is corrupt\n" HINT_TRUNCATED,
                r->label, t->cname, i, gm_gguf_ggml_type_name(t->ggml_type), t->nbytes, t->offset,
                g->data_offset, ends, g->size);
        }
        t->data = g->buf + g->data_offset + t->offset;
    }
    return check_overlaps(g, r);
}

/* Explains a wrong magic when the bytes look like a format users confuse with GGUF. */
static const char *magic_hint(const uint8_t *b, size_t n) {
    if (n >= 2 && b[0] == 'P' && b[1] == 'K')
        return "\nhint: this is a zip archive (a downloaded .whl part?): extract its data/ member "
               "first, or let `gemmarun fetch gemma3-270m` do it";
    if (n >= 9 && b[8] == '{')
        return "\nhint: this looks like a safetensors file: open it as safetensors, not GGUF";
    if (n >= 7 && memcmp(b, "version", 7) == 0)
        return "\nhint: this is a git-lfs pointer file, not the model: fetch the real file";
    if (n >= 1 && (b[0] == '<' || b[0] == '{'))
        return "\nhint: this is a text/HTML/JSON file (an error page saved as the model?): "
               "re-download it";
    return "\nhint: the file is not a GGUF model or is corrupt: re-download it";
}

static gm_status parse(gm_gguf *g, gm_error *err) {
    rd r = {.p = g->buf, .size = g->size, .pos = 0, .label = g->label, .err = err};
    set_where(&r, "header");
    if (g->size == 0)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: the file is empty (0 bytes)\n" HINT_TRUNCATED,
                            g->label);
    if (g->size < 4 || memcmp(g->buf, "GGUF", 4) != 0) {
        char shown[24];
        gm_strref m = {(const char *)g->buf, g->size < 4 ? g->size : 4};
        if (g->size < 4 && memcmp(g->buf, "GGUF", g->size) == 0)
            return truncated(&r, 4, "the magic");
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: not a GGUF file: bytes 0..3 are '%s' (%02x %02x %02x %02x), "
                            "expected the magic 'GGUF'%s",
                            g->label, show(m, shown, sizeof shown), g->buf[0],
                            g->size > 1 ? g->buf[1] : 0, g->size > 2 ? g->buf[2] : 0,
                            g->size > 3 ? g->buf[3] : 0, magic_hint(g->buf, g->size));
    }
    r.pos = 4;
    GM_TRY(rd_u32(&r, &g->version, "the version"));
    uint32_t v = g->version;
    if (v == 0)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: invalid GGUF version 0 at byte 4\n" HINT_CORRUPT, g->label);
    if ((v & 0xffffu) == 0) // a big-endian file's small version read on a little-endian host
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: GGUF version at byte 4 reads as 0x%08" PRIx32 " (%" PRIu32 " "
                            "byte-swapped): the file is big-endian, and gemmarun reads only "
                            "little-endian GGUF\nhint: convert it on a little-endian machine or "
                            "download the little-endian release",
                            g->label, v, __builtin_bswap32(v));
    if (v == 1)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: GGUF version 1 (at byte 4) is no longer supported (it used 32-bit "
                            "counts); versions 2 and 3 are\nhint: re-convert the model with a "
                            "current llama.cpp",
                            g->label);
    if (v > 3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: GGUF version %" PRIu32 " (at byte 4) is newer than this reader "
                            "(versions 2 and 3)\nhint: update gemmarun, or re-convert the model "
                            "with a llama.cpp that writes version 3",
                            g->label, v);

    uint64_t n_t, n_kv;
    GM_TRY(rd_u64(&r, &n_t, "the tensor count"));
    GM_TRY(rd_u64(&r, &n_kv, "the metadata key count"));
    size_t rem = g->size - r.pos;
    if (n_t > rem / GGUF_MIN_TENSOR_BYTES)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor count %" PRIu64 " at byte 8 is impossible: the file has "
                            "%zu bytes and each tensor info needs at least %u\n" HINT_TRUNCATED,
                            g->label, n_t, g->size, GGUF_MIN_TENSOR_BYTES);
    if (n_kv > rem / GGUF_MIN_KV_BYTES ||
        n_kv * GGUF_MIN_KV_BYTES > rem - n_t * GGUF_MIN_TENSOR_BYTES)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: metadata key count %" PRIu64 " at byte 16 is impossible: the file "
                            "has %zu bytes, each key/value needs at least %u and the %" PRIu64
                            " tensor infos at least %u each\n" HINT_TRUNCATED,
                            g->label, n_kv, g->size, GGUF_MIN_KV_BYTES, n_t, GGUF_MIN_TENSOR_BYTES);

    for (int64_t i = 0; i < (int64_t)n_kv; i++) GM_TRY(parse_kv(g, &r, i, (int64_t)n_kv));
    GM_TRY(index_kvs(g, &r));
    GM_TRY(read_alignment(g, &r));
    for (int64_t i = 0; i < (int64_t)n_t; i++) GM_TRY(parse_tensor_info(g, &r, i, (int64_t)n_t));

    /* Data section: after the infos, padded up to the alignment (formats.md §1.1). */
    size_t end = r.pos, a = g->alignment;
    g->data_offset = end + (a - end % a) % a;
    return place_tensors(g, &r);
}

/* ---- open/free ---------------------------------------------------------------------------- */

static gm_status open_image(const void *buf, size_t size, const char *label, gm_mapped_file *map,
                            gm_gguf **out, gm_error *err) {
    *out = NULL;
    gm_gguf *g = gm_calloc(1, sizeof *g);
    if (!g) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", label);
    g->label = gm_strdup(label);
    if (!g->label) {
        gm_free(g);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", label);
    }
    if (map) g->map = *map; // owned from here on, also on failure
    g->buf = buf;
    g->size = size;
    gm_status s = parse(g, err);
    if (s != GM_OK) {
        gm_gguf_free(g);
        return s;
    }
    *out = g;
    return GM_OK;
}

gm_status gm_gguf_open(const char *path, gm_gguf **out, gm_error *err) {
    *out = NULL;
    gm_mapped_file map;
    GM_TRY(gm_mmap_open(path, &map, err));
    return open_image(map.data, map.size, path, &map, out, err);
}

gm_status gm_gguf_open_memory(const void *buf, size_t size, const char *label, gm_gguf **out,
                              gm_error *err) {
    if (!buf) size = 0;
    static const uint8_t empty[1];
    return open_image(buf ? buf : empty, size, label ? label : "<memory>", NULL, out, err);
}

void gm_gguf_free(gm_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) gm_free(g->kvs[i].strs);
    gm_free(g->kvs);
    gm_free(g->tensors);
    gm_free(g->kv_hash);
    gm_free(g->t_hash);
    if (g->map.path) gm_mmap_close(&g->map);
    gm_free(g->label);
    gm_free(g);
}

/* ---- queries ------------------------------------------------------------------------------ */

const char *gm_gguf_path(const gm_gguf *g) { return g->label; }
uint32_t gm_gguf_version(const gm_gguf *g) { return g->version; }
uint32_t gm_gguf_alignment(const gm_gguf *g) { return g->alignment; }
size_t gm_gguf_data_offset(const gm_gguf *g) { return g->data_offset; }
size_t gm_gguf_file_size(const gm_gguf *g) { return g->size; }
int64_t gm_gguf_n_kv(const gm_gguf *g) { return g->n_kv; }

const gm_gguf_kv *gm_gguf_kv_at(const gm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? &g->kvs[i] : NULL;
}

const gm_gguf_kv *gm_gguf_find_kv(const gm_gguf *g, const char *key) {
    int64_t i = hash_find(g->kv_hash, g->kv_hash_cap, key, strlen(key), kv_name, g);
    return i >= 0 ? &g->kvs[i] : NULL;
}

/* Integer value of a scalar kv of integer or bool type; false for other types or a uint64
 * that does not fit int64. */
static bool kv_int(const gm_gguf_kv *kv, int64_t *out) {
    const uint8_t *p = kv->data;
    switch (kv->type) {
    case GM_GGUF_UINT8: case GM_GGUF_BOOL: *out = p[0]; return true;
    case GM_GGUF_INT8: *out = (int8_t)p[0]; return true;
    case GM_GGUF_UINT16: *out = ld16(p); return true;
    case GM_GGUF_INT16: *out = (int16_t)ld16(p); return true;
    case GM_GGUF_UINT32: *out = ld32(p); return true;
    case GM_GGUF_INT32: *out = (int32_t)ld32(p); return true;
    case GM_GGUF_INT64: *out = (int64_t)ld64(p); return true;
    case GM_GGUF_UINT64: {
        uint64_t v = ld64(p);
        if (v > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

bool gm_gguf_get_int(const gm_gguf *g, const char *key, int64_t *out) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    return kv && kv_int(kv, out);
}

bool gm_gguf_get_float(const gm_gguf *g, const char *key, double *out) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv) return false;
    if (kv->type == GM_GGUF_FLOAT32) {
        uint32_t u = ld32(kv->data);
        float f;
        memcpy(&f, &u, sizeof f);
        *out = f;
        return true;
    }
    if (kv->type == GM_GGUF_FLOAT64) {
        uint64_t u = ld64(kv->data);
        memcpy(out, &u, sizeof *out);
        return true;
    }
    int64_t i;
    if (kv->type == GM_GGUF_UINT64) { // large uint64 still converts to a double
        *out = (double)ld64(kv->data);
        return true;
    }
    if (!kv_int(kv, &i)) return false;
    *out = (double)i;
    return true;
}

bool gm_gguf_get_bool(const gm_gguf *g, const char *key, bool *out) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv || kv->type != GM_GGUF_BOOL) return false;
    *out = kv->data[0] != 0;
    return true;
}

bool gm_gguf_get_str(const gm_gguf *g, const char *key, gm_strref *out) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv || kv->type != GM_GGUF_STRING) return false;
    *out = kv->strs[0];
    return true;
}

bool gm_gguf_get_str_array(const gm_gguf *g, const char *key, const gm_strref **out, uint64_t *n) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv || kv->type != GM_GGUF_ARRAY || kv->arr_type != GM_GGUF_STRING) return false;
    *out = kv->strs;
    *n = kv->n;
    return true;
}

bool gm_gguf_get_array(const gm_gguf *g, const char *key, gm_gguf_vtype *elem_type,
                       const void **data, uint64_t *n) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv || kv->type != GM_GGUF_ARRAY || kv->arr_type == GM_GGUF_STRING) return false;
    *elem_type = kv->arr_type;
    *data = kv->data;
    *n = kv->n;
    return true;
}

int64_t gm_gguf_n_tensors(const gm_gguf *g) { return g->n_tensors; }

const gm_gguf_tensor *gm_gguf_tensor_at(const gm_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const gm_gguf_tensor *gm_gguf_find_tensor(const gm_gguf *g, const char *name) {
    int64_t i = hash_find(g->t_hash, g->t_hash_cap, name, strlen(name), tensor_name, g);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_raw(wbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = gm_realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_u32(wbuf *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    wb_raw(b, x, 4);
}

static void wb_u64(wbuf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    wb_raw(b, x, 8);
}

static void wb_str(wbuf *b, const char *s, size_t n) {
    wb_u64(b, n);
    wb_raw(b, s, n);
}

typedef struct wtensor {
    char name[GGUF_MAX_NAME];
    uint32_t ggml_type;
    int ndim;
    int64_t shape[GGUF_MAX_DIMS];
    size_t nbytes;
    const void *data;
} wtensor;

struct gm_gguf_writer {
    wbuf kv;          /* the encoded key/value records */
    uint64_t n_kv;
    wtensor *t;
    int64_t n_t, cap_t;
    gm_status first;  /* the first error of an add call */
    char msg[256];
};

gm_gguf_writer *gm_gguf_writer_new(void) { return gm_calloc(1, sizeof(gm_gguf_writer)); }

void gm_gguf_writer_free(gm_gguf_writer *w) {
    if (!w) return;
    gm_free(w->kv.p);
    gm_free(w->t);
    gm_free(w);
}

static void w_fail(gm_gguf_writer *w, gm_status s, const char *fmt, const char *what) {
    if (w->first != GM_OK) return;
    w->first = s;
    snprintf(w->msg, sizeof w->msg, fmt, what);
}

static void w_key(gm_gguf_writer *w, const char *key, gm_gguf_vtype t) {
    wb_str(&w->kv, key, strlen(key));
    wb_u32(&w->kv, (uint32_t)t);
    w->n_kv++;
}

void gm_gguf_set_str(gm_gguf_writer *w, const char *key, const char *value) {
    if (!w) return;
    w_key(w, key, GM_GGUF_STRING);
    wb_str(&w->kv, value, strlen(value));
}

void gm_gguf_set_u32(gm_gguf_writer *w, const char *key, uint32_t value) {
    if (!w) return;
    w_key(w, key, GM_GGUF_UINT32);
    wb_u32(&w->kv, value);
}

void gm_gguf_set_f32(gm_gguf_writer *w, const char *key, float value) {
    if (!w) return;
    union { float f; uint32_t u; } v = {.f = value};
    w_key(w, key, GM_GGUF_FLOAT32);
    wb_u32(&w->kv, v.u);
}

void gm_gguf_copy_kv(gm_gguf_writer *w, const gm_gguf_kv *kv) {
    if (!w) return;
    wb_str(&w->kv, kv->key.p, kv->key.len);
    wb_u32(&w->kv, (uint32_t)kv->type);
    w->n_kv++;
    if (kv->type == GM_GGUF_STRING) {
        wb_str(&w->kv, kv->strs[0].p, kv->strs[0].len);
    } else if (kv->type == GM_GGUF_ARRAY) {
        wb_u32(&w->kv, (uint32_t)kv->arr_type);
        wb_u64(&w->kv, kv->n);
        if (kv->arr_type == GM_GGUF_STRING)
            for (uint64_t i = 0; i < kv->n; i++) wb_str(&w->kv, kv->strs[i].p, kv->strs[i].len);
        else wb_raw(&w->kv, kv->data, (size_t)kv->n * vtype_size(kv->arr_type));
    } else {
        wb_raw(&w->kv, kv->data, vtype_size(kv->type));
    }
}

void gm_gguf_add_tensor(gm_gguf_writer *w, const char *name, gm_dtype dtype, int ndim, const int64_t *shape,
                        const void *data) {
    if (!w) return;
    uint32_t id = 0;
    while (id < N_GGML_TYPES && !(ggml_types[id].name && ggml_types[id].dtype == (int)dtype)) id++;
    if (id == N_GGML_TYPES) return w_fail(w, GM_ERR_INVALID, "tensor '%s': a dtype GGUF has no type for", name);
    if (strlen(name) >= GGUF_MAX_NAME) return w_fail(w, GM_ERR_INVALID, "tensor '%s': name of 64 bytes or more", name);
    if (ndim < 1 || ndim > GGUF_MAX_DIMS) return w_fail(w, GM_ERR_INVALID, "tensor '%s': 1 to 4 dimensions", name);
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *q = gm_realloc(w->t, (size_t)cap * sizeof *q);
        if (!q) return w_fail(w, GM_ERR_NOMEM, "out of memory adding tensor '%s'", name);
        w->t = q, w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ggml_type = id;
    t->ndim = ndim;
    int64_t rows = 1;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d], rows *= d < ndim - 1 ? shape[d] : 1;
    t->nbytes = (size_t)rows * gm_dtype_row_bytes(dtype, shape[ndim - 1]);
    t->data = data;
}

gm_status gm_gguf_write(gm_gguf_writer *w, const char *path, gm_error *err) {
    if (!w) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (w->first != GM_OK) return gm_error_set(err, w->first, "%s: %s", path, w->msg);
    const size_t A = GGUF_DEFAULT_ALIGNMENT;
    wbuf h = {0};
    wb_raw(&h, "GGUF", 4);
    wb_u32(&h, 3);
    wb_u64(&h, (uint64_t)w->n_t);
    wb_u64(&h, w->n_kv);
    wb_raw(&h, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        wb_str(&h, t->name, strlen(t->name));
        wb_u32(&h, (uint32_t)t->ndim);
        for (int d = t->ndim - 1; d >= 0; d--) wb_u64(&h, (uint64_t)t->shape[d]); /* ne: innermost first */
        wb_u32(&h, t->ggml_type);
        wb_u64(&h, off);
        off += (t->nbytes + A - 1) / A * A;
    }
    static const uint8_t zeros[32] = {0};
    wb_raw(&h, zeros, (A - h.n % A) % A);
    /* the header, then each tensor's bytes and padding straight from the caller's buffers: no
     * copy of the data section in memory */
    gm_file_part *parts = gm_malloc((size_t)(1 + 2 * w->n_t) * sizeof *parts);
    gm_status s = GM_OK;
    if (h.oom || w->kv.oom || !parts) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory building the file", path);
    } else {
        int np = 0;
        parts[np++] = (gm_file_part){h.p, h.n};
        for (int64_t i = 0; i < w->n_t; i++) {
            const wtensor *t = &w->t[i];
            parts[np++] = (gm_file_part){t->data, t->nbytes};
            parts[np++] = (gm_file_part){zeros, (A - t->nbytes % A) % A};
        }
        s = gm_write_file_atomic_parts(path, parts, np, err);
    }
    gm_free(parts);
    gm_free(h.p);
    return s;
}
