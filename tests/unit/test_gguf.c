/*
 * test_gguf.c - GGUF reader on images built in memory: the worked example of formats.md §1.1
 * byte for byte, every metadata getter, and a catalogue of broken files, each of which must
 * fail with the right status and a message naming the file and the problem. Every prefix of a
 * valid file and thousands of random corruptions must fail (or parse) cleanly, never crash.
 * The broken files are also written to a temporary folder and opened by path, so the message
 * is checked to carry the path.
 */
#include "gguf_build.h"
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_gguf.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static size_t hexdecode(const char *hex, uint8_t *out) {
    size_t n = 0;
    for (const char *p = hex; p[0] && p[1]; p += 2) {
        unsigned v;
        sscanf(p, "%2x", &v);
        out[n++] = (uint8_t)v;
    }
    return n;
}

/* Opens `b` from memory and from a file named `name` in the temp folder; both must fail with
 * `want` and a message holding the label/path and each of the NULL-terminated `words`. */
static void expect_fail(const gb *b, const char *name, gm_status want, const char *const *words) {
    gm_error err = {0};
    gm_gguf *g = NULL;
    char label[300];
    snprintf(label, sizeof label, "mem:%s", name);
    gm_status s = gm_gguf_open_memory(b->p, b->n, label, &g, &err);
    CHECK(s == want, "%s: got %s, want %s: %s", name, gm_status_name(s), gm_status_name(want),
          err.msg);
    CHECK(g == NULL, "%s: no object on failure", name);
    CHECK(gm_test_contains(err.msg, label), "%s: message names the label: %s", name, err.msg);
    for (int i = 0; words && words[i]; i++)
        CHECK(gm_test_contains(err.msg, words[i]), "%s: message should contain '%s': %s", name, words[i],
              err.msg);
    if (g) gm_gguf_free(g);

    char path[600];
    snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, name);
    CHECK(gb_write_file(b, path) == 0, "write %s", path);
    gm_error ferr = {0};
    g = NULL;
    s = gm_gguf_open(path, &g, &ferr);
    CHECK(s == want, "%s (file): got %s: %s", name, gm_status_name(s), ferr.msg);
    CHECK(gm_test_contains(ferr.msg, path), "%s: file message names the path: %s", name, ferr.msg);
    for (int i = 0; words && words[i]; i++)
        CHECK(gm_test_contains(ferr.msg, words[i]), "%s (file): message should contain '%s': %s", name,
              words[i], ferr.msg);
    if (g) gm_gguf_free(g);
    unlink(path);
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- valid files ------------------------------------------------------------------------ */

static void test_worked_example(void) {
    /* formats.md §1.1, transcribed from the measured dump. */
    static const char *hex =
        "47475546" "03000000" "0100000000000000" "0200000000000000"
        "1400000000000000" "67656e6572616c2e617263686974656374757265"
        "08000000" "0600000000000000" "67656d6d6133"
        "1100000000000000" "67656e6572616c2e616c69676e6d656e74"
        "04000000" "20000000"
        "0100000000000000" "77"
        "02000000" "0400000000000000" "0200000000000000" "00000000" "0000000000000000"
        "00000000000000000000000000000000"
        "00000000" "0000803f" "00000040" "00004040" "00008040" "0000a040" "0000c040" "0000e040";
    uint8_t want[256];
    size_t nwant = hexdecode(hex, want);
    CHECK(nwant == 192, "transcribed example is %zu bytes", nwant);

    gb b = {0};
    gb_example(&b);
    CHECK(b.n == 192, "builder wrote %zu bytes, want 192", b.n);
    CHECK(b.n == nwant && memcmp(b.p, want, nwant) == 0,
          "builder output equals the documented bytes");

    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open_memory(want, nwant, "example", &g, &err), &err);
    if (!g) return;
    CHECK(gm_gguf_version(g) == 3, "version %u", gm_gguf_version(g));
    CHECK(gm_gguf_alignment(g) == 32, "alignment %u", gm_gguf_alignment(g));
    CHECK(gm_gguf_data_offset(g) == 160, "data offset %zu", gm_gguf_data_offset(g));
    CHECK(gm_gguf_file_size(g) == 192, "size %zu", gm_gguf_file_size(g));
    CHECK(strcmp(gm_gguf_path(g), "example") == 0, "label");
    CHECK(gm_gguf_n_kv(g) == 2, "n_kv %lld", (long long)gm_gguf_n_kv(g));
    gm_strref arch = {0};
    CHECK(gm_gguf_get_str(g, "general.architecture", &arch) && arch.len == 6 &&
              memcmp(arch.p, "gemma3", 6) == 0,
          "architecture");
    int64_t al = 0;
    CHECK(gm_gguf_get_int(g, "general.alignment", &al) && al == 32, "alignment kv");
    CHECK(gm_gguf_n_tensors(g) == 1, "one tensor");
    const gm_gguf_tensor *t = gm_gguf_find_tensor(g, "w");
    CHECK(t != NULL, "tensor w");
    if (t) {
        CHECK(t == gm_gguf_tensor_at(g, 0), "tensor_at(0)");
        CHECK(t->dtype == GM_F32 && t->ggml_type == 0, "f32");
        CHECK(t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 4, "shape {2, 4} (reversed ne)");
        CHECK(t->shape[2] == 1 && t->shape[3] == 1, "unused dims are 1");
        CHECK(t->offset == 0 && t->nbytes == 32, "offset %llu nbytes %zu",
              (unsigned long long)t->offset, t->nbytes);
        CHECK(t->data == (const void *)(want + 160), "data points into the image at 160");
        CHECK(strcmp(t->cname, "w") == 0 && t->name.len == 1, "name");
        float v[8];
        memcpy(v, t->data, sizeof v);
        bool ok = true;
        for (int i = 0; i < 8; i++) ok = ok && v[i] == (float)i;
        CHECK(ok, "values 0..7");
    }
    CHECK(gm_gguf_find_tensor(g, "x") == NULL, "absent tensor");
    CHECK(gm_gguf_find_tensor(g, "") == NULL, "empty name");
    CHECK(gm_gguf_tensor_at(g, 1) == NULL && gm_gguf_tensor_at(g, -1) == NULL, "tensor_at range");
    gm_gguf_free(g);
    gb_free(&b);

    /* Version 2 has the same layout and must parse. */
    want[4] = 2;
    g = NULL;
    CHECK_OK(gm_gguf_open_memory(want, nwant, "example-v2", &g, &err), &err);
    if (g) CHECK(gm_gguf_version(g) == 2, "version 2");
    gm_gguf_free(g);
}

static void test_getters(void) {
    gb b = {0};
    gb_header(&b, 3, 0, 18);
    gb_kv(&b, "u8", 0), gb_u8(&b, 200);
    gb_kv(&b, "i8", 1), gb_u8(&b, (uint8_t)-5);
    gb_kv(&b, "u16", 2), gb_u16(&b, 60000);
    gb_kv(&b, "i16", 3), gb_u16(&b, (uint16_t)-30000);
    gb_kv(&b, "u32", 4), gb_u32(&b, 4000000000u);
    gb_kv(&b, "i32", 5), gb_u32(&b, (uint32_t)-2000000000);
    gb_kv(&b, "f32", 6), gb_f32(&b, 1.5f);
    gb_kv(&b, "bool", 7), gb_u8(&b, 1);
    gb_kv_str(&b, "str", "hi there");
    gb_kv(&b, "u64", 10), gb_u64(&b, (1ull << 63) + 5);
    gb_kv(&b, "i64", 11), gb_u64(&b, (uint64_t)-(1ll << 62));
    gb_kv(&b, "f64", 12), gb_f64(&b, 3.25);
    gb_kv(&b, "arr.u8", 9), gb_arr(&b, 0, 3), gb_u8(&b, 1), gb_u8(&b, 2), gb_u8(&b, 3);
    gb_kv(&b, "arr.f32", 9), gb_arr(&b, 6, 2), gb_f32(&b, -1.0f), gb_f32(&b, 2.5f);
    gb_kv(&b, "arr.str", 9), gb_arr(&b, 8, 3), gb_str(&b, "a"), gb_str(&b, ""), gb_str(&b, "ccc");
    gb_kv(&b, "arr.empty", 9), gb_arr(&b, 8, 0);
    gb_kv(&b, "arr.bool", 9), gb_arr(&b, 7, 2), gb_u8(&b, 0), gb_u8(&b, 1);
    gb_kv_str(&b, "empty.str", "");

    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "getters", &g, &err), &err);
    if (!g) {
        gb_free(&b);
        return;
    }
    CHECK(gm_gguf_n_kv(g) == 18, "18 keys");
    int64_t i = 0;
    double f = 0;
    bool bo = false;
    gm_strref s = {0};
    CHECK(gm_gguf_get_int(g, "u8", &i) && i == 200, "u8 %lld", (long long)i);
    CHECK(gm_gguf_get_int(g, "i8", &i) && i == -5, "i8 %lld", (long long)i);
    CHECK(gm_gguf_get_int(g, "u16", &i) && i == 60000, "u16");
    CHECK(gm_gguf_get_int(g, "i16", &i) && i == -30000, "i16");
    CHECK(gm_gguf_get_int(g, "u32", &i) && i == 4000000000ll, "u32");
    CHECK(gm_gguf_get_int(g, "i32", &i) && i == -2000000000ll, "i32");
    CHECK(gm_gguf_get_int(g, "i64", &i) && i == -(1ll << 62), "i64");
    CHECK(!gm_gguf_get_int(g, "u64", &i), "u64 above INT64_MAX is not an int64");
    CHECK(gm_gguf_get_int(g, "bool", &i) && i == 1, "bool as int");
    CHECK(!gm_gguf_get_int(g, "f32", &i), "float is not an int");
    CHECK(!gm_gguf_get_int(g, "str", &i), "string is not an int");
    CHECK(!gm_gguf_get_int(g, "arr.u8", &i), "array is not an int");
    CHECK(!gm_gguf_get_int(g, "missing", &i), "missing key");
    CHECK(gm_gguf_get_float(g, "f32", &f) && f == 1.5, "f32");
    CHECK(gm_gguf_get_float(g, "f64", &f) && f == 3.25, "f64");
    CHECK(gm_gguf_get_float(g, "i32", &f) && f == -2000000000.0, "int as float");
    CHECK(gm_gguf_get_float(g, "u64", &f) && f == 9223372036854775808.0 + 5, "u64 as float");
    CHECK(!gm_gguf_get_float(g, "str", &f), "string is not a float");
    CHECK(gm_gguf_get_bool(g, "bool", &bo) && bo, "bool");
    CHECK(!gm_gguf_get_bool(g, "u8", &bo), "u8 is not a bool");
    CHECK(gm_gguf_get_str(g, "str", &s) && s.len == 8 && memcmp(s.p, "hi there", 8) == 0, "str");
    CHECK(gm_gguf_get_str(g, "empty.str", &s) && s.len == 0, "empty string");
    CHECK(!gm_gguf_get_str(g, "u8", &s), "u8 is not a string");
    CHECK(!gm_gguf_get_str(g, "arr.str", &s), "array is not a string");

    const gm_strref *strs = NULL;
    uint64_t n = 0;
    CHECK(gm_gguf_get_str_array(g, "arr.str", &strs, &n) && n == 3, "string array");
    if (strs && n == 3) {
        CHECK(strs[0].len == 1 && strs[0].p[0] == 'a', "s[0]");
        CHECK(strs[1].len == 0, "s[1] empty");
        CHECK(strs[2].len == 3 && memcmp(strs[2].p, "ccc", 3) == 0, "s[2]");
    }
    CHECK(gm_gguf_get_str_array(g, "arr.empty", &strs, &n) && n == 0, "empty string array");
    CHECK(!gm_gguf_get_str_array(g, "arr.u8", &strs, &n), "u8 array is not a string array");
    gm_gguf_vtype et;
    const void *data = NULL;
    CHECK(gm_gguf_get_array(g, "arr.u8", &et, &data, &n) && et == GM_GGUF_UINT8 && n == 3 &&
              memcmp(data, "\1\2\3", 3) == 0,
          "u8 array");
    CHECK(gm_gguf_get_array(g, "arr.f32", &et, &data, &n) && et == GM_GGUF_FLOAT32 && n == 2,
          "f32 array");
    if (data && n == 2) {
        float fv[2];
        memcpy(fv, data, sizeof fv);
        CHECK(fv[0] == -1.0f && fv[1] == 2.5f, "f32 array values");
    }
    CHECK(gm_gguf_get_array(g, "arr.bool", &et, &data, &n) && et == GM_GGUF_BOOL && n == 2,
          "bool array");
    CHECK(!gm_gguf_get_array(g, "arr.str", &et, &data, &n), "string array via get_str_array only");
    CHECK(!gm_gguf_get_array(g, "u8", &et, &data, &n), "scalar is not an array");

    const gm_gguf_kv *kv = gm_gguf_find_kv(g, "arr.str");
    CHECK(kv && kv->type == GM_GGUF_ARRAY && kv->arr_type == GM_GGUF_STRING && kv->n == 3, "kv");
    CHECK(gm_gguf_kv_at(g, 0) && gm_gguf_kv_at(g, 0)->type == GM_GGUF_UINT8, "kv_at(0)");
    CHECK(gm_gguf_kv_at(g, 18) == NULL && gm_gguf_kv_at(g, -1) == NULL, "kv_at range");
    CHECK(gm_gguf_find_kv(g, "u") == NULL && gm_gguf_find_kv(g, "u88") == NULL, "prefix keys");
    CHECK(gm_gguf_n_tensors(g) == 0, "no tensors");
    CHECK(strcmp(gm_gguf_vtype_name(GM_GGUF_FLOAT64), "float64") == 0, "vtype name");
    CHECK(strcmp(gm_gguf_ggml_type_name(12), "q4_K") == 0, "ggml type name");
    CHECK(strcmp(gm_gguf_ggml_type_name(1000), "unknown") == 0, "unknown ggml type name");
    gm_gguf_free(g);
    gb_free(&b);
}

static void test_rich(void) {
    gb b = {0};
    gb_rich(&b);
    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "rich", &g, &err), &err);
    if (g) {
        CHECK(gm_gguf_n_tensors(g) == 3, "3 tensors");
        const gm_gguf_tensor *tb = gm_gguf_find_tensor(g, "b"), *tc = gm_gguf_find_tensor(g, "c");
        CHECK(tb && tb->dtype == GM_Q8_0 && tb->ndim == 2 && tb->shape[0] == 2 &&
                  tb->shape[1] == 32 && tb->nbytes == 68,
              "q8_0 tensor");
        CHECK(tc && tc->dtype == GM_Q4_K && tc->ndim == 1 && tc->shape[0] == 256 &&
                  tc->nbytes == 144,
              "q4_K tensor");
        const gm_strref *toks;
        uint64_t n;
        CHECK(gm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n) && n == 3 &&
                  toks[2].len == 5 && memcmp(toks[2].p, "hello", 5) == 0,
              "tokens");
        double fb;
        CHECK(gm_gguf_get_float(g, "gemma3.rope.freq_base", &fb) && fb == 1e6, "freq_base");
    }
    gm_gguf_free(g);

    /* A custom alignment is honoured: data starts at a multiple of 64. */
    gb c = {0};
    gb_header(&c, 3, 1, 1);
    gb_kv_u32(&c, "general.alignment", 64);
    const uint64_t ne[1] = {4};
    gb_tensor(&c, "v", 1, ne, 0, 0);
    gb_pad(&c, 64);
    for (int i = 0; i < 4; i++) gb_f32(&c, 1.0f);
    g = NULL;
    CHECK_OK(gm_gguf_open_memory(c.p, c.n, "align64", &g, &err), &err);
    /* infos end at byte 90 (24 header + 33 kv + 33 info), so data starts at 128 */
    if (g) CHECK(gm_gguf_alignment(g) == 64 && gm_gguf_data_offset(g) == 128, "alignment 64: %zu",
                 gm_gguf_data_offset(g));
    gm_gguf_free(g);
    gb_free(&c);
    gb_free(&b);
}

/* ---- broken files ----------------------------------------------------------------------- */

/* The example with one field replaced: builds it field by field with the given overrides. */
typedef struct ex_opts {
    uint32_t version;
    uint64_t n_tensors, n_kv;
    uint32_t n_dims;
    uint64_t ne0, ne1;
    uint32_t type;
    uint64_t offset;
} ex_opts;

static void build_ex(gb *b, ex_opts o) {
    gb_header(b, o.version, o.n_tensors, o.n_kv);
    gb_kv_str(b, "general.architecture", "gemma3");
    gb_kv_u32(b, "general.alignment", 32);
    gb_str(b, "w");
    gb_u32(b, o.n_dims);
    gb_u64(b, o.ne0);
    for (uint32_t d = 1; d < o.n_dims; d++) gb_u64(b, d == 1 ? o.ne1 : 1);
    gb_u32(b, o.type);
    gb_u64(b, o.offset);
    gb_pad(b, 32);
    for (int i = 0; i < 8; i++) gb_f32(b, (float)i);
}

static const ex_opts EX = {3, 1, 2, 2, 4, 2, 0, 0};

static void test_bad_header(void) {
    gb b = {0};
    ex_opts o;

    gb_example(&b);
    b.p[3] = 'X';
    expect_fail(&b, "bad_magic", GM_ERR_FORMAT, WORDS("not a GGUF file", "GGUX"));
    b.p[0] = 'P', b.p[1] = 'K';
    expect_fail(&b, "zip_magic", GM_ERR_FORMAT, WORDS("not a GGUF file", "zip"));
    gb_free(&b);

    o = EX, o.version = 0, build_ex(&b, o);
    expect_fail(&b, "version0", GM_ERR_FORMAT, WORDS("version 0"));
    gb_free(&b);
    o = EX, o.version = 1, build_ex(&b, o);
    expect_fail(&b, "version1", GM_ERR_UNSUPPORTED, WORDS("version 1", "no longer supported"));
    gb_free(&b);
    o = EX, o.version = 4, build_ex(&b, o);
    expect_fail(&b, "version4", GM_ERR_UNSUPPORTED, WORDS("version 4"));
    gb_free(&b);
    o = EX, o.version = 0x03000000u, build_ex(&b, o);
    expect_fail(&b, "big_endian", GM_ERR_UNSUPPORTED, WORDS("big-endian", "byte 4"));
    gb_free(&b);

    o = EX, o.n_tensors = 1ull << 60, build_ex(&b, o);
    expect_fail(&b, "absurd_tensors", GM_ERR_FORMAT,
                WORDS("tensor count 1152921504606846976", "impossible"));
    gb_free(&b);
    o = EX, o.n_kv = 1ull << 60, build_ex(&b, o);
    expect_fail(&b, "absurd_kvs", GM_ERR_FORMAT, WORDS("metadata key count", "impossible"));
    gb_free(&b);
    o = EX, o.n_tensors = UINT64_MAX, o.n_kv = UINT64_MAX, build_ex(&b, o);
    expect_fail(&b, "max_counts", GM_ERR_FORMAT, WORDS("impossible"));
    gb_free(&b);

    gb_header(&b, 3, 0, 0); // a valid empty file: no keys, no tensors
    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "empty-gguf", &g, &err), &err);
    if (g) CHECK(gm_gguf_n_tensors(g) == 0 && gm_gguf_n_kv(g) == 0, "empty gguf");
    gm_gguf_free(g);
    gb_free(&b);
}

static void test_bad_metadata(void) {
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "k", 9), gb_arr(&b, 9, 1), gb_arr(&b, 4, 1), gb_u32(&b, 7);
    expect_fail(&b, "nested_array", GM_ERR_FORMAT, WORDS("nested array", "'k'", "byte 37"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "k", 13), gb_u32(&b, 0);
    expect_fail(&b, "unknown_vtype", GM_ERR_FORMAT, WORDS("unknown value type 13", "byte 33"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "k", 9), gb_arr(&b, 44, 1), gb_u32(&b, 0);
    expect_fail(&b, "unknown_elem_type", GM_ERR_FORMAT, WORDS("unknown array element type 44"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "k", 9), gb_arr(&b, 4, 1ull << 60), gb_u32(&b, 0);
    expect_fail(&b, "absurd_array", GM_ERR_FORMAT, WORDS("array element count", "impossible"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "k", 9), gb_arr(&b, 8, 4), gb_str(&b, "a"), gb_str(&b, "b"), gb_u64(&b, 1000),
        gb_raw(&b, "cccccccccccc", 12);
    expect_fail(&b, "string_past_end", GM_ERR_FORMAT, WORDS("string 2 of 4", "has length 1000"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_u64(&b, 1ull << 62), gb_raw(&b, "kkkkkkkkkkkkkkkkkkkkkkkkkkkk", 28);
    expect_fail(&b, "key_past_end", GM_ERR_FORMAT, WORDS("the key has length 4611686018427387904"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "", 4), gb_u32(&b, 1);
    expect_fail(&b, "empty_key", GM_ERR_FORMAT, WORDS("empty key", "byte 24"));
    gb_free(&b);

    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "dup", 1), gb_kv_u32(&b, "dup", 2);
    expect_fail(&b, "duplicate_key", GM_ERR_FORMAT, WORDS("duplicate metadata key 'dup'"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "flag", 7), gb_u8(&b, 2);
    expect_fail(&b, "bad_bool", GM_ERR_FORMAT, WORDS("neither 0 nor 1", "'flag'"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, "alignment_not_pow2", GM_ERR_FORMAT,
                WORDS("general.alignment", "power of two"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "general.alignment", 0);
    expect_fail(&b, "alignment_zero", GM_ERR_FORMAT, WORDS("power of two"));
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_kv(&b, "general.alignment", 10), gb_u64(&b, 32);
    expect_fail(&b, "alignment_u64", GM_ERR_FORMAT, WORDS("general.alignment", "uint64", "uint32"));
    gb_free(&b);
}

static void test_bad_tensors(void) {
    gb b = {0};
    ex_opts o;

    o = EX, o.offset = 64, build_ex(&b, o);
    expect_fail(&b, "offset_past_end", GM_ERR_FORMAT,
                WORDS("'w'", "past the end of the file", "truncated", "offset 64", "192 bytes"));
    gb_free(&b);

    gb_example(&b);
    b.n = 180; // data cut short
    expect_fail(&b, "data_truncated", GM_ERR_FORMAT,
                WORDS("'w'", "past the end of the file", "180 bytes", "hint:"));
    gb_free(&b);

    o = EX, o.offset = 4, build_ex(&b, o);
    expect_fail(&b, "misaligned", GM_ERR_FORMAT,
                WORDS("'w'", "not a multiple of the alignment 32"));
    gb_free(&b);

    o = EX, o.type = 16, build_ex(&b, o);
    expect_fail(&b, "iq2_xxs", GM_ERR_UNSUPPORTED, WORDS("'w'", "iq2_xxs (16)", "hint:"));
    gb_free(&b);

    o = EX, o.type = 99, build_ex(&b, o);
    expect_fail(&b, "type99", GM_ERR_UNSUPPORTED, WORDS("'w'", "unknown (99)"));
    gb_free(&b);

    o = EX, o.type = 8, o.ne0 = 33, build_ex(&b, o);
    expect_fail(&b, "ne0_not_block_multiple", GM_ERR_FORMAT,
                WORDS("ne[0] = 33", "q8_0 block size 32"));
    gb_free(&b);

    o = EX, o.n_dims = 5, build_ex(&b, o);
    expect_fail(&b, "n_dims5", GM_ERR_FORMAT, WORDS("n_dims 5", "'w'"));
    gb_free(&b);

    o = EX, o.n_dims = 0, build_ex(&b, o);
    expect_fail(&b, "n_dims0", GM_ERR_FORMAT, WORDS("n_dims 0"));
    gb_free(&b);

    o = EX, o.ne1 = 0, build_ex(&b, o);
    expect_fail(&b, "zero_dim", GM_ERR_FORMAT, WORDS("ne[1] = 0", "positive"));
    gb_free(&b);

    o = EX, o.ne1 = UINT64_MAX, build_ex(&b, o);
    expect_fail(&b, "negative_dim", GM_ERR_FORMAT, WORDS("ne[1]", "positive"));
    gb_free(&b);

    o = EX, o.ne0 = 1ull << 40, o.ne1 = 1ull << 40, build_ex(&b, o);
    expect_fail(&b, "overflow_dims", GM_ERR_FORMAT, WORDS("overflow"));
    gb_free(&b);

    o = EX, o.ne0 = 1ull << 62, o.ne1 = 1, build_ex(&b, o);
    expect_fail(&b, "overflow_bytes", GM_ERR_FORMAT, WORDS("overflow"));
    gb_free(&b);

    o = EX, o.ne0 = 1ull << 40, o.ne1 = 1, build_ex(&b, o);
    expect_fail(&b, "huge_tensor", GM_ERR_FORMAT, WORDS("past the end of the file"));
    gb_free(&b);

    /* Two tensors with the same name. */
    gb_header(&b, 3, 2, 0);
    const uint64_t ne[1] = {8};
    gb_tensor(&b, "w", 1, ne, 0, 0);
    gb_tensor(&b, "w", 1, ne, 0, 32);
    gb_pad(&b, 32);
    for (int i = 0; i < 16; i++) gb_f32(&b, 0.0f);
    expect_fail(&b, "duplicate_tensor", GM_ERR_FORMAT, WORDS("duplicate tensor name 'w'"));
    gb_free(&b);

    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = '\0';
    gb_header(&b, 3, 1, 0);
    gb_tensor(&b, longname, 1, ne, 0, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 8; i++) gb_f32(&b, 0.0f);
    expect_fail(&b, "long_name", GM_ERR_FORMAT, WORDS("64 bytes long", "at most 63"));
    gb_free(&b);
    longname[63] = '\0'; // 63 bytes is allowed
    gb_header(&b, 3, 1, 0);
    gb_tensor(&b, longname, 1, ne, 0, 0);
    gb_pad(&b, 32);
    for (int i = 0; i < 8; i++) gb_f32(&b, 0.0f);
    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "name63", &g, &err), &err);
    if (g) CHECK(gm_gguf_find_tensor(g, longname) != NULL, "63-byte name found");
    gm_gguf_free(g);
    gb_free(&b);
}

/* Every prefix of a valid file fails with GM_ERR_FORMAT and a "truncated" message, except
 * those that only drop the zero padding after the last tensor, which are still valid. */
static void test_prefixes(void) {
    gb b = {0};
    gb_rich(&b);
    size_t end = b.n - 16; // the last tensor (144 bytes) is followed by 16 bytes of padding
    for (size_t n = end; n <= b.n; n++) {
        gm_error err = {0};
        gm_gguf *g = NULL;
        CHECK_OK(gm_gguf_open_memory(b.p, n, "prefix", &g, &err), &err);
        gm_gguf_free(g);
    }
    int bad = 0, no_word = 0;
    for (size_t n = 0; n < end; n++) {
        uint8_t *copy = malloc(n ? n : 1); // exact-size copy so ASan catches any overread
        memcpy(copy, b.p, n);
        gm_error err = {0};
        gm_gguf *g = NULL;
        gm_status s = gm_gguf_open_memory(copy, n, "prefix", &g, &err);
        if (s != GM_ERR_FORMAT || g) {
            if (bad++ < 5) fprintf(stderr, "prefix %zu: %s %s\n", n, gm_status_name(s), err.msg);
        } else if (!gm_test_contains(err.msg, "truncated") || !gm_test_contains(err.msg, "prefix")) {
            if (no_word++ < 5) fprintf(stderr, "prefix %zu: message: %s\n", n, err.msg);
        }
        gm_gguf_free(g);
        free(copy);
    }
    CHECK(bad == 0, "%d of %zu prefixes did not fail with format", bad, end);
    CHECK(no_word == 0, "%d prefixes without 'truncated' in the message", no_word);
    gb_free(&b);
}

/* Random byte corruption: must never crash; when it parses, every tensor lies in the image. */
static void test_corruption(void) {
    gb b = {0};
    gb_rich(&b);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int parsed = 0, failed = 0, bad_status = 0, out_of_bounds = 0;
    uint8_t *copy = malloc(b.n);
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(copy, b.p, b.n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            size_t pos = (size_t)(rng % b.n);
            /* Bias half the flips into the header and infos, where the structure lives. */
            if (iter & 1) pos = (size_t)(rng % 400);
            copy[pos] = (uint8_t)(rng >> 32);
        }
        size_t n = (iter % 7 == 0) ? (size_t)((rng >> 20) % b.n) : b.n;
        gm_error err = {0};
        gm_gguf *g = NULL;
        gm_status s = gm_gguf_open_memory(copy, n, "flip", &g, &err);
        if (s == GM_OK) {
            parsed++;
            for (int64_t i = 0; i < gm_gguf_n_tensors(g); i++) {
                const gm_gguf_tensor *t = gm_gguf_tensor_at(g, i);
                const uint8_t *d = t->data;
                if (d < copy || d + t->nbytes > copy + n) out_of_bounds++;
            }
            gm_gguf_free(g);
        } else {
            failed++;
            if (s != GM_ERR_FORMAT && s != GM_ERR_UNSUPPORTED) bad_status++;
            if (!gm_test_contains(err.msg, "flip")) bad_status++;
        }
    }
    free(copy);
    CHECK(bad_status == 0, "%d corrupted files gave another status or an unnamed message",
          bad_status);
    CHECK(out_of_bounds == 0, "%d tensors outside the image", out_of_bounds);
    CHECK(parsed + failed == 20000, "all corruptions handled (%d parsed, %d rejected)", parsed,
          failed);
    printf("corruption: %d parsed, %d rejected\n", parsed, failed);
    gb_free(&b);
}

/* Allocation failure at every point of a parse: GM_ERR_NOMEM (or success once the failing
 * allocation is past the last one), never a crash or a leak. */
static void test_oom(void) {
    gb b = {0};
    gb_rich(&b);
    int nomem = 0, ok = 0, other = 0;
    for (uint64_t n = 1; n < 64; n++) {
        gm_error err = {0};
        gm_gguf *g = NULL;
        gm_alloc_fail_after(n);
        gm_status s = gm_gguf_open_memory(b.p, b.n, "oom", &g, &err);
        gm_alloc_fail_after(0);
        if (s == GM_ERR_NOMEM && g == NULL && gm_test_contains(err.msg, "out of memory")) nomem++;
        else if (s == GM_OK && g) ok++;
        else other++;
        gm_gguf_free(g);
    }
    CHECK(other == 0 && nomem > 0 && ok > 0, "oom: %d nomem, %d ok, %d other", nomem, ok, other);
    gb_free(&b);
}

static void test_paths(void) {
    gm_error err = {0};
    gm_gguf *g = NULL;
    char path[600];
    snprintf(path, sizeof path, "%s/missing.gguf", tmpdir);
    CHECK(gm_gguf_open(path, &g, &err) == GM_ERR_IO && g == NULL, "missing file: %s", err.msg);
    CHECK(gm_test_contains(err.msg, path), "missing-file message names the path: %s", err.msg);

    gb b = {0};
    expect_fail(&b, "empty", GM_ERR_FORMAT, WORDS("empty", "0 bytes"));

    gb_rich(&b);
    snprintf(path, sizeof path, "%s/rich.gguf", tmpdir);
    CHECK(gb_write_file(&b, path) == 0, "write rich");
    CHECK_OK(gm_gguf_open(path, &g, &err), &err);
    if (g) {
        CHECK(strcmp(gm_gguf_path(g), path) == 0, "path kept");
        const gm_gguf_tensor *t = gm_gguf_find_tensor(g, "c");
        CHECK(t && memcmp(t->data, b.p + (b.n - 160), 144) == 0, "mapped tensor bytes");
        gm_gguf_free(g);
    }
    unlink(path);
    gb_free(&b);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gm_test_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    gm_alloc_stats before = gm_alloc_get_stats();
    test_worked_example();
    test_getters();
    test_rich();
    test_bad_header();
    test_bad_metadata();
    test_bad_tensors();
    test_prefixes();
    test_corruption();
    test_oom();
    test_paths();
    gm_alloc_stats after = gm_alloc_get_stats();
    CHECK(after.bytes_live == before.bytes_live, "no leaks: %llu bytes still live",
          (unsigned long long)(after.bytes_live - before.bytes_live));
    rmdir(tmpdir);
    return gm_test_finish();
}
