/*
 * test_safetensors.c - safetensors reader: a valid single file, a sharded folder with an index,
 * folder fallbacks, and broken files, each of which must fail with a message naming the file
 * and the entry. Every prefix of a valid file and random corruptions must fail cleanly. The
 * writer's files read back.
 */
#include "gguf_build.h" // the gb byte buffer
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_dtype.h"
#include "gm_safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* u64 header length + JSON (padded with spaces to a multiple of 8, as the Rust writer does)
 * + data. */
static void st_build(gb *b, const char *json, const void *data, size_t n) {
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    gb_u64(b, padded);
    gb_raw(b, json, len);
    for (size_t i = len; i < padded; i++) gb_u8(b, ' ');
    gb_raw(b, data, n);
}

static void data_bytes(uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i * 7 + 1);
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_fail(const gb *b, const char *name, gm_status want, const char *const *words) {
    char label[300];
    snprintf(label, sizeof label, "mem:%s", name);
    gm_error err = {0};
    gm_safetensors *st = NULL;
    gm_status s = gm_safetensors_open_memory(b->p, b->n, label, &st, &err);
    CHECK(s == want && st == NULL, "%s: got %s, want %s: %s", name, gm_status_name(s),
          gm_status_name(want), err.msg);
    CHECK(gm_test_contains(err.msg, label), "%s: message names the label: %s", name, err.msg);
    for (int i = 0; words[i]; i++)
        CHECK(gm_test_contains(err.msg, words[i]), "%s: message should contain '%s': %s", name, words[i],
              err.msg);
    gm_safetensors_free(st);

    char path[600];
    snprintf(path, sizeof path, "%s/%s.safetensors", tmpdir, name);
    CHECK(gb_write_file(b, path) == 0, "write %s", path);
    st = NULL;
    s = gm_safetensors_open(path, &st, &err);
    CHECK(s == want && st == NULL, "%s (file): got %s: %s", name, gm_status_name(s), err.msg);
    CHECK(gm_test_contains(err.msg, path), "%s: file message names the path: %s", name, err.msg);
    for (int i = 0; words[i]; i++)
        CHECK(gm_test_contains(err.msg, words[i]), "%s (file): message should contain '%s': %s", name,
              words[i], err.msg);
    gm_safetensors_free(st);
    unlink(path);
}

/* ---- valid files ------------------------------------------------------------------------ */

static const char *VALID_JSON =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"c\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[22,24]},"
    "\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[24,24]},"
    "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}";

static void valid_file(gb *b) {
    uint8_t d[32];
    data_bytes(d, sizeof d);
    st_build(b, VALID_JSON, d, sizeof d);
}

static void test_single(void) {
    gb b = {0};
    valid_file(&b);
    gm_error err = {0};
    gm_safetensors *st = NULL;
    CHECK_OK(gm_safetensors_open_memory(b.p, b.n, "single", &st, &err), &err);
    if (!st) {
        gb_free(&b);
        return;
    }
    size_t data0 = b.n - 32;
    CHECK(gm_safetensors_n_tensors(st) == 5, "5 tensors");
    const gm_st_tensor *a = gm_safetensors_find(st, "a"), *bb = gm_safetensors_find(st, "b");
    const gm_st_tensor *c = gm_safetensors_find(st, "c"), *z = gm_safetensors_find(st, "z");
    const gm_st_tensor *s = gm_safetensors_find(st, "s");
    CHECK(a && a->dtype == GM_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 2 &&
              a->nbytes == 16 && a->data == b.p + data0 && a->shard == 0,
          "a: f32[2, 2] at the buffer start");
    CHECK(bb && bb->dtype == GM_BF16 && bb->ndim == 1 && bb->shape[0] == 3 && bb->nbytes == 6 &&
              bb->data == b.p + data0 + 16,
          "b: bf16[3] at 16");
    CHECK(c && c->dtype == GM_U8 && c->nbytes == 2, "c: BOOL read as u8");
    CHECK(z && z->ndim == 2 && z->shape[0] == 0 && z->nbytes == 0, "z: zero-size tensor");
    CHECK(s && s->ndim == 0 && s->nbytes == 8 && s->dtype == GM_I64, "s: scalar");
    CHECK(gm_safetensors_find(st, "missing") == NULL && gm_safetensors_find(st, "") == NULL,
          "absent");
    /* tensor_at is in file (offset) order */
    CHECK(gm_safetensors_tensor_at(st, 0) == a && gm_safetensors_tensor_at(st, 1) == bb &&
              gm_safetensors_tensor_at(st, 2) == c,
          "offset order");
    CHECK(gm_safetensors_tensor_at(st, 5) == NULL && gm_safetensors_tensor_at(st, -1) == NULL,
          "tensor_at range");
    const char *fmt = gm_safetensors_metadata(st, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0, "metadata format");
    CHECK(gm_safetensors_metadata(st, "nope") == NULL, "absent metadata");
    CHECK(strcmp(gm_safetensors_shard_path(st, 0), "single") == 0, "shard label");
    CHECK(gm_safetensors_shard_path(st, 1) == NULL, "shard range");
    gm_safetensors_free(st);

    /* No metadata, no tensors: "{}" is a valid empty file. */
    gb e = {0};
    st_build(&e, "{}", NULL, 0);
    st = NULL;
    CHECK_OK(gm_safetensors_open_memory(e.p, e.n, "empty-st", &st, &err), &err);
    if (st) CHECK(gm_safetensors_n_tensors(st) == 0, "no tensors");
    gm_safetensors_free(st);
    gb_free(&e);
    gb_free(&b);
}

static void write_shard(const char *dir, const char *name, const char *json, size_t n) {
    gb b = {0};
    uint8_t d[64];
    data_bytes(d, n);
    st_build(&b, json, d, n);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(gb_write_file(&b, path) == 0, "write %s", path);
    gb_free(&b);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "write %s", path);
    if (f) fputs(text, f), fclose(f);
}

static const char *SHARD1 =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}";
static const char *SHARD2 =
    "{\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
static const char *INDEX =
    "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
    "\"model.embed.weight\":\"model-00001-of-00002.safetensors\","
    "\"model.layers.0.w\":\"model-00002-of-00002.safetensors\","
    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}";

static void test_folder(void) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0755);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 24);
    write_shard(dir, "model-00002-of-00002.safetensors", SHARD2, 16);
    write_text(dir, "model.safetensors.index.json", INDEX);

    char index[500], with_slash[500];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    snprintf(with_slash, sizeof with_slash, "%s/", dir);
    const char *paths[] = {dir, index, with_slash};
    for (int k = 0; k < 3; k++) {
        gm_error err = {0};
        gm_safetensors *st = NULL;
        CHECK_OK(gm_safetensors_open(paths[k], &st, &err), &err);
        if (!st) continue;
        CHECK(gm_safetensors_n_tensors(st) == 3, "3 tensors across 2 shards");
        const gm_st_tensor *e = gm_safetensors_find(st, "model.embed.weight");
        const gm_st_tensor *w = gm_safetensors_find(st, "model.layers.0.w");
        CHECK(e && e->shard == 0 && e->dtype == GM_BF16 && e->shape[0] == 4 && e->nbytes == 16,
              "embed in shard 0");
        CHECK(w && w->shard == 1 && w->nbytes == 16, "layer weight in shard 1");
        if (w) {
            const char *sp = gm_safetensors_shard_path(st, w->shard);
            CHECK(sp && gm_test_contains(sp, "model-00002-of-00002.safetensors") && !gm_test_contains(sp, "//"),
                  "shard path %s", sp ? sp : "(null)");
            uint8_t d[16];
            data_bytes(d, 16);
            CHECK(memcmp(w->data, d, 16) == 0, "shard 2 data mapped");
        }
        const char *fmt = gm_safetensors_metadata(st, "format");
        CHECK(fmt && strcmp(fmt, "pt") == 0, "metadata of the first shard");
        gm_safetensors_free(st);
    }

    /* A folder with just model.safetensors, and one with just adapter_model.safetensors. */
    const char *singles[] = {"model.safetensors", "adapter_model.safetensors"};
    for (int k = 0; k < 2; k++) {
        char d2[400];
        snprintf(d2, sizeof d2, "%s/single%d", tmpdir, k);
        mkdir(d2, 0755);
        write_shard(d2, singles[k], SHARD2, 16);
        gm_error err = {0};
        gm_safetensors *st = NULL;
        CHECK_OK(gm_safetensors_open(d2, &st, &err), &err);
        if (st) CHECK(gm_safetensors_find(st, "model.layers.0.w") != NULL, "%s found", singles[k]);
        gm_safetensors_free(st);
        char p[600];
        snprintf(p, sizeof p, "%s/%s", d2, singles[k]);
        unlink(p);
        /* Now empty: a clear I/O error naming the folder. */
        st = NULL;
        CHECK(gm_safetensors_open(d2, &st, &err) == GM_ERR_IO && gm_test_contains(err.msg, d2),
              "empty folder: %s", err.msg);
        rmdir(d2);
    }

    /* Missing shard named in the index. */
    char p2[600];
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    unlink(p2);
    gm_error err = {0};
    gm_safetensors *st = NULL;
    gm_status s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_IO && st == NULL, "missing shard -> io: %s", err.msg);
    CHECK(gm_test_contains(err.msg, index) && gm_test_contains(err.msg, "model-00002-of-00002.safetensors") &&
              gm_test_contains(err.msg, "'model.layers.0.w'") && gm_test_contains(err.msg, "hint:"),
          "missing-shard message names the index, the shard and the tensor: %s", err.msg);

    /* The index names a tensor the shard does not have. */
    write_shard(dir, "model-00002-of-00002.safetensors",
                "{\"other\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "'model.layers.0.w'") &&
              gm_test_contains(err.msg, "no such tensor"),
          "index/shard mismatch: %s", err.msg);

    /* The same tensor in two shards. */
    write_shard(dir, "model-00002-of-00002.safetensors",
                "{\"model.layers.0.w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                24);
    s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "duplicate tensor name 'model.norm.weight'"),
          "duplicate across shards: %s", err.msg);

    /* A shard name that escapes the folder. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"x\":\"../model-00001-of-00002.safetensors\"}}");
    s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "'x'"), "shard outside the folder: %s", err.msg);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
    s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "weight_map"), "bad index: %s", err.msg);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": ");
    s = gm_safetensors_open(dir, &st, &err);
    CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "not valid JSON"), "index not JSON: %s", err.msg);

    char p[600];
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[k]);
        unlink(p);
    }
    rmdir(dir);

    snprintf(p, sizeof p, "%s/does-not-exist", tmpdir);
    CHECK(gm_safetensors_open(p, &st, &err) == GM_ERR_IO && gm_test_contains(err.msg, p), "missing path");
}

/* ---- broken files ----------------------------------------------------------------------- */

static void test_bad(void) {
    gb b = {0};
    uint8_t d[128];
    data_bytes(d, sizeof d);

    valid_file(&b);
    b.n -= 3;
    expect_fail(&b, "truncated", GM_ERR_FORMAT, WORDS("truncated", "'s'", "past the end"));
    gb_free(&b);

    gb_raw(&b, "\x10\x00\x00", 3);
    expect_fail(&b, "tiny", GM_ERR_FORMAT, WORDS("truncated", "3 bytes"));
    gb_free(&b);

    gb_u64(&b, 4096);
    gb_raw(&b, "{\"a\":{}}", 8);
    expect_fail(&b, "header_past_eof", GM_ERR_FORMAT,
                WORDS("header length 4096", "past the end", "truncated"));
    gb_free(&b);

    gb_u64(&b, 200000000);
    gb_raw(&b, "{}      ", 8);
    expect_fail(&b, "header_too_long", GM_ERR_FORMAT, WORDS("header length 200000000", "limit"));
    gb_free(&b);

    st_build(&b, "{\"a\": {\"dtype\": \"F32\", oops}", NULL, 0);
    expect_fail(&b, "not_json", GM_ERR_FORMAT, WORDS("not valid JSON", "byte"));
    gb_free(&b);

    st_build(&b, "[1, 2, 3]", NULL, 0);
    expect_fail(&b, "no_brace", GM_ERR_FORMAT, WORDS("does not start with '{'"));
    gb_free(&b);

    gb_raw(&b, "GGUF\x03\x00\x00\x00", 8);
    gb_raw(&b, d, 32);
    expect_fail(&b, "gguf_magic", GM_ERR_FORMAT, WORDS("GGUF"));
    gb_free(&b);

    st_build(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} xx", d, 4);
    expect_fail(&b, "garbage_after_json", GM_ERR_FORMAT,
                WORDS("unexpected bytes after the JSON header"));
    gb_free(&b);

    st_build(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", d, 12);
    expect_fail(&b, "gap", GM_ERR_FORMAT, WORDS("'b'", "gap", "'a'", "tile"));
    gb_free(&b);

    st_build(&b, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8);
    expect_fail(&b, "overlap", GM_ERR_FORMAT, WORDS("overlaps", "tile"));
    gb_free(&b);

    st_build(&b, "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8);
    expect_fail(&b, "not_from_zero", GM_ERR_FORMAT, WORDS("'b'", "the start of the buffer"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[0,12]}}", d, 12);
    expect_fail(&b, "size_mismatch", GM_ERR_FORMAT,
                WORDS("tensor 'x': data_offsets [0, 12) do not match f32[4, 4] (64 bytes)"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", d, 8);
    expect_fail(&b, "reversed_offsets", GM_ERR_FORMAT, WORDS("'x'", "do not match"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 4);
    expect_fail(&b, "unknown_dtype", GM_ERR_FORMAT, WORDS("'x'", "unknown dtype 'F33'"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", d, 4);
    expect_fail(&b, "fp8", GM_ERR_UNSUPPORTED, WORDS("'x'", "F8_E4M3", "not supported"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 10);
    expect_fail(&b, "trailing", GM_ERR_FORMAT, WORDS("6 trailing bytes"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8);
    expect_fail(&b, "duplicate", GM_ERR_FORMAT, WORDS("duplicate tensor name 'x'"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", d, 4);
    expect_fail(&b, "negative_shape", GM_ERR_FORMAT, WORDS("'x'", "shape[0]"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", d, 4);
    expect_fail(&b, "fractional_shape", GM_ERR_FORMAT, WORDS("'x'", "shape[0]"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
             d, 4);
    expect_fail(&b, "nine_dims", GM_ERR_UNSUPPORTED, WORDS("'x'", "9 dimensions"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                 "\"data_offsets\":[0,4]}}", d, 4);
    expect_fail(&b, "overflow", GM_ERR_FORMAT, WORDS("'x'", "overflow"));
    gb_free(&b);

    st_build(&b, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", d, 4);
    expect_fail(&b, "no_offsets", GM_ERR_FORMAT, WORDS("'x'", "data_offsets"));
    gb_free(&b);

    st_build(&b, "{\"x\":[1,2]}", d, 4);
    expect_fail(&b, "entry_not_object", GM_ERR_FORMAT, WORDS("'x'", "not a JSON object"));
    gb_free(&b);

    st_build(&b, "{\"__metadata__\":{\"format\":1}}", NULL, 0);
    expect_fail(&b, "metadata_not_string", GM_ERR_FORMAT, WORDS("__metadata__", "'format'"));
    gb_free(&b);
}

static void test_prefixes_and_flips(void) {
    gb b = {0};
    valid_file(&b);
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        gm_error err = {0};
        gm_safetensors *st = NULL;
        gm_status s = gm_safetensors_open_memory(copy, n, "prefix", &st, &err);
        if ((s != GM_ERR_FORMAT || st || !gm_test_contains(err.msg, "prefix")) && bad++ < 5)
            fprintf(stderr, "prefix %zu: %s: %s\n", n, gm_status_name(s), err.msg);
        gm_safetensors_free(st);
        free(copy);
    }
    CHECK(bad == 0, "%d of %zu prefixes did not fail cleanly", bad, b.n);

    uint64_t rng = 12345;
    int parsed = 0, rejected = 0, oob = 0;
    uint8_t *copy = malloc(b.n);
    for (int iter = 0; iter < 5000; iter++) {
        memcpy(copy, b.p, b.n);
        for (int k = 0; k < 1 + iter % 3; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            copy[rng % b.n] = (uint8_t)(rng >> 40);
        }
        gm_error err = {0};
        gm_safetensors *st = NULL;
        if (gm_safetensors_open_memory(copy, b.n, "flip", &st, &err) == GM_OK) {
            parsed++;
            for (int64_t i = 0; i < gm_safetensors_n_tensors(st); i++) {
                const gm_st_tensor *t = gm_safetensors_tensor_at(st, i);
                const uint8_t *p = t->data;
                if (p < copy || p + t->nbytes > copy + b.n) oob++;
            }
        } else {
            rejected++;
        }
        gm_safetensors_free(st);
    }
    free(copy);
    CHECK(oob == 0, "%d tensors outside the image", oob);
    printf("corruption: %d parsed, %d rejected\n", parsed, rejected);
    gb_free(&b);
}

/* Allocation failure at every point: GM_ERR_NOMEM or success, never a crash or a leak. */
static void test_oom(void) {
    gb b = {0};
    valid_file(&b);
    int nomem = 0, ok = 0, other = 0;
    for (uint64_t n = 1; n < 48; n++) {
        gm_error err = {0};
        gm_safetensors *st = NULL;
        gm_alloc_fail_after(n);
        gm_status s = gm_safetensors_open_memory(b.p, b.n, "oom", &st, &err);
        gm_alloc_fail_after(0);
        if (s == GM_ERR_NOMEM && st == NULL) nomem++;
        else if (s == GM_OK && st) ok++;
        else other++;
        gm_safetensors_free(st);
    }
    CHECK(other == 0 && nomem > 0 && ok > 0, "oom: %d nomem, %d ok, %d other", nomem, ok, other);
    gb_free(&b);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* gm_safetensors_write then gm_safetensors_open: names, dtypes, shapes, bytes and metadata come
 * back; the header is 8-aligned and lists the tensors in name order; bad requests are refused. */
static void test_write(void) {
    float a[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
    uint16_t b[3] = {0x3f80, 0xc000, 0x0001};
    int64_t c[1] = {-5};
    gm_st_write_tensor t[3] = {
        {"zeta.lora_B.weight", GM_F32, 2, {2, 3}, a},
        {"alpha", GM_BF16, 1, {3}, b},
        {"mid", GM_I64, 0, {0}, c},
    };
    static const char *const meta[] = {"format", "pt"};
    char path[600];
    snprintf(path, sizeof path, "%s/written.safetensors", tmpdir);
    gm_error err = {0};
    CHECK_OK(gm_safetensors_write(path, t, 3, meta, 1, &err), &err);
    gm_safetensors *st = NULL;
    CHECK_OK(gm_safetensors_open(path, &st, &err), &err);
    if (st) {
        CHECK(gm_safetensors_n_tensors(st) == 3, "3 tensors back: %lld", (long long)gm_safetensors_n_tensors(st));
        const gm_st_tensor *x = gm_safetensors_find(st, "zeta.lora_B.weight");
        CHECK(x && x->dtype == GM_F32 && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 3 && x->nbytes == sizeof a &&
              memcmp(x->data, a, sizeof a) == 0, "f32 tensor back bit for bit");
        x = gm_safetensors_find(st, "alpha");
        CHECK(x && x->dtype == GM_BF16 && x->ndim == 1 && x->shape[0] == 3 && memcmp(x->data, b, sizeof b) == 0, "bf16 back");
        x = gm_safetensors_find(st, "mid");
        CHECK(x && x->dtype == GM_I64 && x->ndim == 0 && memcmp(x->data, c, sizeof c) == 0, "scalar i64 back");
        const char *f = gm_safetensors_metadata(st, "format");
        CHECK(f && strcmp(f, "pt") == 0, "metadata format=pt back: %s", f ? f : "(none)");
        /* in name order: alpha (bytes 0-6), mid (6-14), zeta (14-38) */
        CHECK(gm_safetensors_tensor_at(st, 0) && strcmp(gm_safetensors_tensor_at(st, 0)->name, "alpha") == 0 &&
              (const uint8_t *)gm_safetensors_find(st, "zeta.lora_B.weight")->data -
                  (const uint8_t *)gm_safetensors_find(st, "alpha")->data == 14,
              "tensors laid out in name order");
    }
    gm_safetensors_free(st);
    FILE *fp = fopen(path, "rb");
    unsigned char h8[8] = {0};
    CHECK(fp && fread(h8, 1, 8, fp) == 8, "read the header length");
    if (fp) fclose(fp);
    CHECK(h8[0] % 8 == 0, "header length %u is a multiple of 8", h8[0]);
    unlink(path);
    /* refused: a duplicate name, a block dtype, an empty name */
    gm_st_write_tensor dup[2] = {{"x", GM_F32, 1, {1}, a}, {"x", GM_F32, 1, {1}, a}};
    gm_status s = gm_safetensors_write(path, dup, 2, NULL, 0, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "'x' given twice"), "duplicate refused: %s", err.msg);
    gm_st_write_tensor q[1] = {{"q", GM_Q8_0, 1, {32}, a}};
    s = gm_safetensors_write(path, q, 1, NULL, 0, &err);
    CHECK(s == GM_ERR_INVALID && gm_test_contains(err.msg, "tensor 'q'"), "block dtype refused: %s", err.msg);
    gm_st_write_tensor e[1] = {{"", GM_F32, 1, {1}, a}};
    s = gm_safetensors_write(path, e, 1, NULL, 0, &err);
    CHECK(s == GM_ERR_INVALID, "empty name refused: %s", err.msg);
    CHECK(access(path, F_OK) != 0, "nothing written by a refused call");
    snprintf(path, sizeof path, "%s/no/such/folder/x.safetensors", tmpdir);
    s = gm_safetensors_write(path, t, 3, NULL, 0, &err);
    CHECK(s == GM_ERR_IO && gm_test_contains(err.msg, path), "unwritable path named: %s", err.msg);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gm_test_st_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    gm_alloc_stats before = gm_alloc_get_stats();
    test_single();
    test_folder();
    test_bad();
    test_prefixes_and_flips();
    test_oom();
    test_write();
    gm_alloc_stats after = gm_alloc_get_stats();
    CHECK(after.bytes_live == before.bytes_live, "no leaks: %llu bytes still live",
          (unsigned long long)(after.bytes_live - before.bytes_live));
    rmdir(tmpdir);
    return gm_test_finish();
}
