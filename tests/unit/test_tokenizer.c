/*
 * test_tokenizer.c - the tokenizer and chat template without the real model:
 *   - tests/ref/tiny_tokenizer.json (trained with Hugging Face `tokenizers` by
 *     tests/ref/make_tokenizer_ref.py) must reproduce the ~70 reference encodings in
 *     tests/ref/tiny_tokenizer_ref.json, with merges in both the ["a","b"] and "a b" forms;
 *   - a hand-made vocabulary through gm_tokenizer_from_vocab and through a GGUF image: merge
 *     order, byte fallback, space runs, user-defined/control splitting, dummy prefix, limits;
 *   - error paths: malformed tokenizer.json, unknown model type, merges naming unknown tokens,
 *     unsupported normalizer, inconsistent GGUF keys - each message must name the file;
 *   - the Gemma chat template and the response-start finder.
 */
#include "gguf_build.h"
#include "gm_alloc.h"
#include "gm_chat.h"
#include "gm_gguf.h"
#include "gm_log.h"
#include "gm_mmap.h"
#include "gm_tokenizer.h"
#include "test_util.h"

#include <cjson/cJSON.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define META "\xE2\x96\x81"

static bool same_ids(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
    fprintf(stderr, "    %s (%lld):", what, (long long)n);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Encodes `text` and compares with want[0..nw). */
static void expect_ids(const gm_tokenizer *tok, const char *text, size_t len, bool bos, bool special,
                       const int32_t *want, int64_t nw, const char *label) {
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_error err = {0};
    gm_status st = gm_tokenizer_encode_alloc(tok, text, len, bos, special, &ids, &n, &err);
    bool ok = st == GM_OK && same_ids(ids, n, want, nw);
    CHECK(ok, "%s: encode(\"%.50s\", bos=%d, special=%d) differs", label, text, bos, special);
    if (!ok) {
        if (st != GM_OK) fprintf(stderr, "    error: %s\n", err.msg);
        print_ids("got ", ids, n);
        print_ids("want", want, nw);
    }
    gm_free(ids);
}

#define EXPECT(tok, text, bos, special, ...)                                                 \
    do {                                                                                     \
        const int32_t want_[] = {__VA_ARGS__};                                               \
        expect_ids(tok, text, sizeof(text) - 1, bos, special, want_,                         \
                   (int64_t)(sizeof want_ / sizeof want_[0]), text);                        \
    } while (0)

static void expect_decode(const gm_tokenizer *tok, const int32_t *ids, int64_t n, bool special,
                          const char *want) {
    char *s = NULL;
    gm_error err = {0};
    CHECK_OK(gm_tokenizer_decode(tok, ids, n, special, &s, &err), &err);
    CHECK(s && strcmp(s, want) == 0, "decode gave \"%s\", want \"%s\"", s ? s : "(null)", want);
    gm_free(s);
}

/* A temp file path in the build tree, unique per process. */
static const char *tmp_path(const char *name) {
    static char buf[2][1024];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/tok_test_%d_%s", GM_BINARY_DIR, (int)getpid(), name);
    return buf[k];
}

static void write_text(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(false, "cannot write %s", path);
        return;
    }
    fwrite(s, 1, n, f);
    fclose(f);
}

static cJSON *load_json(const char *rel) {
    char *buf = NULL;
    size_t len = 0;
    gm_error err = {0};
    CHECK_OK(gm_read_file(gm_test_path(rel), &buf, &len, &err), &err);
    cJSON *j = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    gm_free(buf);
    CHECK(j != NULL, "%s does not parse", rel);
    return j;
}

/* ---- the tiny tokenizer.json against Hugging Face ------------------------------------------ */

static int run_tiny_reference(const gm_tokenizer *tok, const cJSON *ref, const char *label) {
    int n_ok = 0, n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(ref, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        bool bos = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special"));
        bool special = cJSON_IsTrue(cJSON_GetObjectItem(c, "parse_special"));
        const cJSON *w = cJSON_GetObjectItem(c, "ids");
        int64_t nw = cJSON_GetArraySize(w);
        int32_t *want = gm_malloc(((size_t)nw + 1) * sizeof *want);
        for (int64_t i = 0; i < nw; i++) want[i] = (int32_t)cJSON_GetArrayItem(w, (int)i)->valuedouble;
        int before = gm_test_failed;
        expect_ids(tok, text, strlen(text), bos, special, want, nw, label);
        /* tokenizers' decode(skip_special_tokens=False) renders specials: render_special */
        expect_decode(tok, want, nw, true, cJSON_GetObjectItem(c, "decoded")->valuestring);
        n_ok += gm_test_failed == before;
        gm_free(want);
        n++;
    }
    printf("%s: %d/%d reference cases match Hugging Face tokenizers\n", label, n_ok, n);
    CHECK(n >= 50, "only %d tiny reference cases", n);
    return n;
}

static void test_tiny(void) {
    gm_tokenizer *tok = NULL;
    gm_error err = {0};
    char path[1024]; /* gm_test_path returns a static buffer that load_json reuses */
    snprintf(path, sizeof path, "%s", gm_test_path("tests/ref/tiny_tokenizer.json"));
    CHECK_OK(gm_tokenizer_from_hf_json(path, NULL, &tok, &err), &err);
    cJSON *ref = load_json("tests/ref/tiny_tokenizer_ref.json");
    if (!tok || !ref) {
        gm_tokenizer_free(tok);
        cJSON_Delete(ref);
        return;
    }
    gm_special_ids sp = gm_tokenizer_special(tok);
    CHECK(sp.bos == 2 && sp.eos == 1 && sp.unk == 3 && sp.pad == 0, "tiny special ids %d %d %d %d",
          sp.bos, sp.eos, sp.unk, sp.pad);
    CHECK(sp.start_of_turn == 4 && sp.end_of_turn == 5, "tiny turn ids %d %d", sp.start_of_turn, sp.end_of_turn);
    CHECK(gm_tokenizer_add_bos(tok), "the post-processor prepends <bos>");
    CHECK(gm_tokenizer_token_type(tok, 4) == GM_TOKEN_CONTROL, "special added token -> CONTROL");
    CHECK(gm_tokenizer_token_type(tok, gm_tokenizer_find(tok, "<html>", 6)) == GM_TOKEN_USER_DEFINED,
          "non-special added token -> USER_DEFINED");
    CHECK(gm_tokenizer_token_type(tok, 6 + 0x41) == GM_TOKEN_BYTE, "<0x41> -> BYTE");
    run_tiny_reference(tok, ref, "tiny (array merges)");
    gm_tokenizer_free(tok);

    /* the same tokenizer with merges written as "a b" strings */
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(gm_read_file(path, &buf, &len, &err), &err);
    cJSON *j = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    gm_free(buf);
    if (j) {
        cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
        cJSON *strs = cJSON_CreateArray();
        const cJSON *m;
        cJSON_ArrayForEach(m, merges) {
            char s[256];
            snprintf(s, sizeof s, "%s %s", cJSON_GetArrayItem(m, 0)->valuestring,
                     cJSON_GetArrayItem(m, 1)->valuestring);
            cJSON_AddItemToArray(strs, cJSON_CreateString(s));
        }
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "merges", strs);
        char *out = cJSON_PrintUnformatted(j);
        const char *p2 = tmp_path("strmerges.json");
        write_text(p2, out, strlen(out));
        free(out);
        gm_tokenizer *tok2 = NULL;
        CHECK_OK(gm_tokenizer_from_hf_json(p2, NULL, &tok2, &err), &err);
        if (tok2) run_tiny_reference(tok2, ref, "tiny (string merges)");
        gm_tokenizer_free(tok2);
        /* tokenizer_config.json can turn BOS off */
        const char *cfg = tmp_path("config.json");
        const char *cfg_text = "{\"add_bos_token\": false, \"eos_token\": {\"content\": \"<end_of_turn>\"}}";
        write_text(cfg, cfg_text, strlen(cfg_text));
        CHECK_OK(gm_tokenizer_from_hf_json(p2, cfg, &tok2, &err), &err);
        CHECK(tok2 && !gm_tokenizer_add_bos(tok2), "add_bos_token false in tokenizer_config.json");
        CHECK(tok2 && gm_tokenizer_special(tok2).eos == 5, "eos_token from tokenizer_config.json");
        gm_tokenizer_free(tok2);
        unlink(p2);
        unlink(cfg);
        cJSON_Delete(j);
    }
    cJSON_Delete(ref);
}

/* ---- tokenizer.json error paths ----------------------------------------------------------- */

/* Writes the tiny tokenizer.json after `edit` changed it, loads it and checks the status and
 * that the message names the file and contains `needle`. */
static void expect_json_error(void (*edit)(cJSON *), gm_status want, const char *needle, const char *name) {
    cJSON *j = load_json("tests/ref/tiny_tokenizer.json");
    if (!j) return;
    edit(j);
    char *out = cJSON_PrintUnformatted(j);
    const char *p = tmp_path(name);
    write_text(p, out, strlen(out));
    free(out);
    cJSON_Delete(j);
    gm_tokenizer *tok = NULL;
    gm_error err = {0};
    gm_status st = gm_tokenizer_from_hf_json(p, NULL, &tok, &err);
    CHECK(st == want && !tok, "%s: status %s, want %s (%s)", name, gm_status_name(st), gm_status_name(want), err.msg);
    CHECK(strstr(err.msg, p) != NULL, "%s: message does not name the file: %s", name, err.msg);
    CHECK(strstr(err.msg, needle) != NULL, "%s: message lacks \"%s\": %s", name, needle, err.msg);
    gm_tokenizer_free(tok);
    unlink(p);
}

static void edit_unigram(cJSON *j) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "type", cJSON_CreateString("Unigram"));
}
static void edit_unknown_merge(cJSON *j) {
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
    cJSON *bad = cJSON_CreateArray();
    cJSON_AddItemToArray(bad, cJSON_CreateString("t"));
    cJSON_AddItemToArray(bad, cJSON_CreateString("zzqq"));
    cJSON_ReplaceItemInArray(merges, 3, bad);
}
static void edit_bad_merge_form(cJSON *j) {
    cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
    cJSON_ReplaceItemInArray(merges, 0, cJSON_CreateString("nospace"));
}
static void edit_nfkc(cJSON *j) {
    cJSON *nz = cJSON_CreateObject();
    cJSON_AddStringToObject(nz, "type", "NFKC");
    cJSON_ReplaceItemInObject(j, "normalizer", nz);
}
static void edit_no_vocab(cJSON *j) { cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "model"), "vocab"); }
static void edit_eos_template(cJSON *j) {
    cJSON *single = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "post_processor"), "single");
    cJSON *eos = cJSON_Parse("{\"SpecialToken\": {\"id\": \"<eos>\", \"type_id\": 0}}");
    cJSON_AddItemToArray(single, eos);
}
static void edit_id_clash(cJSON *j) {
    cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(added, 7), "id", cJSON_CreateNumber(300));
}

static void test_json_errors(void) {
    expect_json_error(edit_unigram, GM_ERR_UNSUPPORTED, "\"Unigram\"", "unigram.json");
    expect_json_error(edit_unknown_merge, GM_ERR_FORMAT, "merges[3]", "badmerge.json");
    expect_json_error(edit_unknown_merge, GM_ERR_FORMAT, "\"zzqq\", which is not in model.vocab", "badmerge2.json");
    expect_json_error(edit_bad_merge_form, GM_ERR_FORMAT, "merges[0]", "mergeform.json");
    expect_json_error(edit_nfkc, GM_ERR_UNSUPPORTED, "normalizer NFKC", "nfkc.json");
    expect_json_error(edit_no_vocab, GM_ERR_FORMAT, "model.vocab", "novocab.json");
    expect_json_error(edit_eos_template, GM_ERR_UNSUPPORTED, "post_processor", "eos.json");
    expect_json_error(edit_id_clash, GM_ERR_FORMAT, "added_tokens[7]", "clash.json");

    /* malformed JSON: the tiny file cut in the middle */
    char *buf = NULL;
    size_t len = 0;
    gm_error err = {0};
    CHECK_OK(gm_read_file(gm_test_path("tests/ref/tiny_tokenizer.json"), &buf, &len, &err), &err);
    if (buf) {
        const char *p = tmp_path("truncated.json");
        write_text(p, buf, len / 2);
        gm_tokenizer *tok = NULL;
        gm_status st = gm_tokenizer_from_hf_json(p, NULL, &tok, &err);
        CHECK(st == GM_ERR_FORMAT && !tok, "truncated json: %s", gm_status_name(st));
        CHECK(strstr(err.msg, p) && strstr(err.msg, "not valid JSON"), "truncated json message: %s", err.msg);
        unlink(p);
        gm_free(buf);
    }
    gm_tokenizer *tok = NULL;
    gm_status st = gm_tokenizer_from_hf_json("/nonexistent/tokenizer.json", NULL, &tok, &err);
    CHECK(st == GM_ERR_IO && strstr(err.msg, "/nonexistent/tokenizer.json"), "missing file: %s %s",
          gm_status_name(st), err.msg);
}

/* ---- a hand-made vocabulary ------------------------------------------------------------------
 * ids 0-3 specials, 4-259 <0x00>..<0xFF>, then the entries below. "bc" comes before "ab", so
 * "abc" (no such token) must merge b+c first. */
enum { V_A = 260, V_B, V_C, V_META, V_BC, V_AB, V_META_A, V_SPACES, V_CTL, V_XX, V_X, V_META_B, V_N };

static const char *const EXTRA[] = {"a", "b", "c", META, "bc", "ab", META "a", "  ", "<ctl>", "xx", "x", META "b"};
static const int32_t EXTRA_TYPE[] = {1, 1, 1, 1, 1, 1, 1, 4, 3, 4, 1, 1};

typedef struct hand_vocab {
    char text[V_N][16];
    const char *ptr[V_N];
    uint64_t len[V_N];
    float score[V_N];
    int32_t type[V_N];
} hand_vocab;

static void make_hand_vocab(hand_vocab *v, bool monotone_scores) {
    static const char *const sp[4] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    for (int i = 0; i < V_N; i++) {
        if (i < 4) snprintf(v->text[i], 16, "%s", sp[i]), v->type[i] = i == 3 ? 2 : 3;
        else if (i < 260) snprintf(v->text[i], 16, "<0x%02X>", i - 4), v->type[i] = 6;
        else snprintf(v->text[i], 16, "%s", EXTRA[i - 260]), v->type[i] = EXTRA_TYPE[i - 260];
        v->ptr[i] = v->text[i];
        v->len[i] = strlen(v->text[i]);
        v->score[i] = v->type[i] == 1 ? -(float)i : -1000.0f;
    }
    /* llama.cpp would merge a+b first in "abc" (higher score); vocabulary order says b+c */
    if (!monotone_scores) v->score[V_AB] = 10.0f;
}

/* Counts warnings instead of printing them. */
static void count_warnings(gm_log_level level, const char *msg, void *user) {
    if (level == GM_LOG_WARN && strstr(msg, "scores of normal tokens")) (*(int *)user)++;
}

static void test_hand_vocab(void) {
    hand_vocab v;
    make_hand_vocab(&v, false);
    gm_special_ids sp = {2, 1, 3, 0, -1, -1};
    gm_tokenizer *tok = NULL;
    gm_error err = {0};
    int warnings = 0;
    gm_log_set_sink(count_warnings, &warnings);
    CHECK_OK(gm_tokenizer_from_vocab(V_N, v.ptr, v.len, v.score, v.type, sp, true, false, &tok, &err), &err);
    CHECK(warnings == 1, "scores that disagree with the vocabulary order are reported (%d)", warnings);
    if (!tok) {
        gm_log_set_sink(NULL, NULL);
        return;
    }
    EXPECT(tok, "abc", true, true, 2, V_A, V_BC);
    EXPECT(tok, "ab", false, true, V_AB);
    EXPECT(tok, "a a", false, true, V_A, V_META_A);
    EXPECT(tok, "a  b", false, true, V_A, V_SPACES, V_B);    /* "  " respelled "▁▁", merged */
    EXPECT(tok, "a   b", false, true, V_A, V_SPACES, V_META_B);
    EXPECT(tok, "axxb", false, true, V_A, V_XX, V_B);       /* user-defined: always split */
    EXPECT(tok, "xxx", false, true, V_XX, V_X);             /* longest match, leftmost */
    EXPECT(tok, "<ctl>a", false, true, V_CTL, V_A);
    EXPECT(tok, "<ctl>", false, false, 4 + '<', V_C, 4 + 't', 4 + 'l', 4 + '>'); /* as text */
    EXPECT(tok, "<unk>", false, false, 4 + '<', 4 + 'u', 4 + 'n', 4 + 'k', 4 + '>');
    EXPECT(tok, "<unk>", false, true, 3);
    EXPECT(tok, "\xC3\xA9", false, true, 4 + 0xC3, 4 + 0xA9); /* é: byte fallback */
    EXPECT(tok, "a\xFF" "b", false, true, V_A, 4 + 0xFF, V_B); /* invalid UTF-8 byte */
    EXPECT(tok, "\xE2\x96", false, true, 4 + 0xE2, 4 + 0x96); /* truncated character */
    EXPECT(tok, "", true, true, 2);
    int32_t ids[8]; /* an empty expectation, checked directly */
    int64_t n = -1;
    CHECK_OK(gm_tokenizer_encode(tok, "", 0, false, true, ids, 8, &n, &err), &err);
    CHECK(n == 0, "empty text without BOS gives %lld ids", (long long)n);
    CHECK(gm_tokenizer_find(tok, "  ", 2) == -1 && gm_tokenizer_find(tok, META META, 6) == V_SPACES,
          "space run stored as \"▁▁\"");

    /* GM_ERR_LIMIT reports the needed count */
    gm_status st = gm_tokenizer_encode(tok, "abc a", 5, true, true, ids, 2, &n, &err);
    CHECK(st == GM_ERR_LIMIT && n == 4, "limit: %s, needed %lld", gm_status_name(st), (long long)n);

    /* decoding */
    const int32_t d1[] = {2, V_A, 4 + 0xC3, 4 + 0xA9, V_META_B, V_SPACES, V_CTL};
    expect_decode(tok, d1, 7, false, "a\xC3\xA9 b  ");
    expect_decode(tok, d1, 7, true, "<bos>a\xC3\xA9 b  <ctl>");
    const int32_t d2[] = {V_A, 4 + 0xC3, V_B}; /* a lone lead byte */
    expect_decode(tok, d2, 3, false, "a\xEF\xBF\xBD" "b");
    const int32_t d3[] = {V_A, 99999};
    char *s = NULL;
    st = gm_tokenizer_decode(tok, d3, 2, false, &s, &err);
    CHECK(st == GM_ERR_INVALID && !s && strstr(err.msg, "99999"), "bad id: %s", err.msg);
    char piece[4];
    CHECK(gm_tokenizer_decode_piece(tok, V_META_A, false, piece, sizeof piece) == 2 && strcmp(piece, " a") == 0,
          "piece ▁a");
    CHECK(gm_tokenizer_decode_piece(tok, V_CTL, true, piece, sizeof piece) == 5 && strcmp(piece, "<ct") == 0,
          "truncated piece \"%s\"", piece);
    CHECK(gm_tokenizer_decode_piece(tok, -1, true, piece, sizeof piece) == 0, "piece of a bad id");
    CHECK(gm_tokenizer_token_text(tok, V_N, NULL) == NULL, "text of a bad id");
    gm_tokenizer_free(tok);

    /* the dummy prefix (add_space_prefix, not Gemma): "a" -> "▁a", after a control token too */
    CHECK_OK(gm_tokenizer_from_vocab(V_N, v.ptr, v.len, v.score, v.type, sp, true, true, &tok, &err), &err);
    if (tok) {
        EXPECT(tok, "a", false, true, V_META_A);
        EXPECT(tok, "<ctl>a", false, true, V_CTL, V_META_A);
        const int32_t d4[] = {V_META_A, V_META_B};
        expect_decode(tok, d4, 2, false, "a b");
        gm_tokenizer_free(tok);
    }

    gm_log_set_sink(NULL, NULL);

    /* bad inputs */
    v.type[5] = 9;
    gm_status st2 = gm_tokenizer_from_vocab(V_N, v.ptr, v.len, v.score, v.type, sp, true, false, &tok, &err);
    CHECK(st2 == GM_ERR_FORMAT && !tok && strstr(err.msg, "token_type[5] = 9"), "bad type: %s", err.msg);
    v.type[5] = 6;
    gm_special_ids bad = {V_N + 5, 1, 3, 0, -1, -1};
    st2 = gm_tokenizer_from_vocab(V_N, v.ptr, v.len, v.score, v.type, bad, true, false, &tok, &err);
    CHECK(st2 == GM_ERR_FORMAT && !tok && strstr(err.msg, "bos_token_id"), "bad bos: %s", err.msg);
}

/* ---- the same vocabulary in a GGUF image ---------------------------------------------------- */
enum { G_OK, G_SCORES_SHORT, G_BAD_TYPE, G_NO_EOS, G_GPT2, G_SCORES_INT, G_BOS_RANGE };

static void build_gguf(gb *b, int variant) {
    hand_vocab v;
    make_hand_vocab(&v, true);
    gb_header(b, 3, 0, variant == G_NO_EOS ? 10 : 11);
    gb_kv_str(b, "general.architecture", "gemma3");
    gb_kv_str(b, "tokenizer.ggml.model", variant == G_GPT2 ? "gpt2" : "llama");
    gb_kv(b, "tokenizer.ggml.tokens", 9);
    gb_arr(b, 8, V_N);
    for (int i = 0; i < V_N; i++) gb_str(b, v.text[i]);
    gb_kv(b, "tokenizer.ggml.scores", 9);
    int ns = variant == G_SCORES_SHORT ? V_N - 1 : V_N;
    gb_arr(b, variant == G_SCORES_INT ? 5 : 6, (uint64_t)ns);
    for (int i = 0; i < ns; i++) {
        if (variant == G_SCORES_INT) gb_u32(b, (uint32_t)i);
        else gb_f32(b, v.score[i]);
    }
    gb_kv(b, "tokenizer.ggml.token_type", 9);
    gb_arr(b, 5, V_N);
    for (int i = 0; i < V_N; i++) gb_u32(b, (uint32_t)(variant == G_BAD_TYPE && i == 7 ? 42 : v.type[i]));
    gb_kv_u32(b, "tokenizer.ggml.bos_token_id", variant == G_BOS_RANGE ? 5000 : 2);
    if (variant != G_NO_EOS) gb_kv_u32(b, "tokenizer.ggml.eos_token_id", 1);
    gb_kv_u32(b, "tokenizer.ggml.unknown_token_id", 3);
    gb_kv_u32(b, "tokenizer.ggml.padding_token_id", 0);
    gb_kv(b, "tokenizer.ggml.add_bos_token", 7);
    gb_u8(b, 1);
    gb_kv(b, "tokenizer.ggml.add_space_prefix", 7);
    gb_u8(b, 0);
    gb_pad(b, 32);
}

static void expect_gguf_error(int variant, gm_status want, const char *needle) {
    gb b = {0};
    build_gguf(&b, variant);
    gm_gguf *g = NULL;
    gm_error err = {0};
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "tiny-tok.gguf", &g, &err), &err);
    if (g) {
        gm_tokenizer *tok = NULL;
        gm_status st = gm_tokenizer_from_gguf(g, &tok, &err);
        CHECK(st == want && !tok, "gguf variant %d: %s, want %s (%s)", variant, gm_status_name(st),
              gm_status_name(want), err.msg);
        CHECK(strstr(err.msg, "tiny-tok.gguf") && strstr(err.msg, needle),
              "gguf variant %d: message should name the file and \"%s\": %s", variant, needle, err.msg);
        gm_tokenizer_free(tok);
    }
    gm_gguf_free(g);
    gb_free(&b);
}

static void test_gguf(void) {
    gb b = {0};
    build_gguf(&b, G_OK);
    gm_gguf *g = NULL;
    gm_error err = {0};
    CHECK_OK(gm_gguf_open_memory(b.p, b.n, "tiny-tok.gguf", &g, &err), &err);
    gm_tokenizer *tok = NULL;
    if (g) CHECK_OK(gm_tokenizer_from_gguf(g, &tok, &err), &err);
    gm_gguf_free(g);
    gb_free(&b); /* the tokenizer must not point into the image */
    if (tok) {
        CHECK(gm_tokenizer_add_bos(tok), "add_bos_token");
        EXPECT(tok, "abc a  b", true, true, 2, V_A, V_BC, V_META_A, V_SPACES, V_B);
        EXPECT(tok, "<ctl><unk>", false, true, V_CTL, 3);
        CHECK(gm_tokenizer_token_type(tok, 3) == GM_TOKEN_UNKNOWN, "unknown type");
        gm_tokenizer_free(tok);
    }
    expect_gguf_error(G_SCORES_SHORT, GM_ERR_FORMAT, "tokenizer.ggml.scores has 271 entries");
    expect_gguf_error(G_BAD_TYPE, GM_ERR_FORMAT, "tokenizer.ggml.token_type[7] = 42");
    expect_gguf_error(G_NO_EOS, GM_ERR_FORMAT, "missing key tokenizer.ggml.eos_token_id");
    expect_gguf_error(G_GPT2, GM_ERR_UNSUPPORTED, "\"gpt2\"");
    expect_gguf_error(G_SCORES_INT, GM_ERR_FORMAT, "tokenizer.ggml.scores");
    expect_gguf_error(G_BOS_RANGE, GM_ERR_FORMAT, "tokenizer.ggml.bos_token_id = 5000");
}

/* ---- chat template ----------------------------------------------------------------------- */

static void expect_render_fmt(gm_chat_format fmt, const gm_chat_msg *m, int64_t n, bool gen, const char *want) {
    char *s = NULL;
    size_t len = 0;
    gm_error err = {0};
    CHECK_OK(gm_chat_render(fmt, m, n, gen, &s, &len, &err), &err);
    CHECK(s && strcmp(s, want) == 0 && len == strlen(want), "render gave \"%s\"\n    want \"%s\"",
          s ? s : "(null)", want);
    gm_free(s);
}

static void expect_render(const gm_chat_msg *m, int64_t n, bool gen, const char *want) {
    expect_render_fmt(GM_CHAT_GEMMA3, m, n, gen, want);
}

static void expect_render_error(const gm_chat_msg *m, int64_t n, const char *needle) {
    char *s = NULL;
    gm_error err = {0};
    gm_status st = gm_chat_render(GM_CHAT_GEMMA3, m, n, true, &s, NULL, &err);
    CHECK(st == GM_ERR_INVALID && !s && strstr(err.msg, needle), "render error: %s: %s (want \"%s\")",
          gm_status_name(st), err.msg, needle);
    gm_free(s);
}

static void test_chat(void) {
    const gm_chat_msg one[] = {{"user", "Hi"}};
    expect_render(one, 1, true, "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    expect_render(one, 1, false, "<start_of_turn>user\nHi<end_of_turn>\n");
    const gm_chat_msg sys[] = {{"system", " Be brief. "}, {"user", "  Q?\n"}, {"assistant", "\tA.  "}};
    expect_render(sys, 3, false,
                  "<start_of_turn>user\n Be brief. \n\nQ?<end_of_turn>\n<start_of_turn>model\nA.<end_of_turn>\n");
    const gm_chat_msg alias[] = {{"user", "x"}, {"model", "y"}, {"user", "z"}};
    expect_render(alias, 3, true,
                  "<start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\ny<end_of_turn>\n"
                  "<start_of_turn>user\nz<end_of_turn>\n<start_of_turn>model\n");
    const gm_chat_msg ws[] = {{"user", " \n\t "}};
    expect_render(ws, 1, false, "<start_of_turn>user\n<end_of_turn>\n");
    expect_render(NULL, 0, true, "<start_of_turn>model\n");
    expect_render(NULL, 0, false, "");

    const gm_chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    expect_render_error(two_users, 2, "message 1");
    const gm_chat_msg model_first[] = {{"assistant", "a"}};
    expect_render_error(model_first, 1, "message 0");
    const gm_chat_msg late_sys[] = {{"user", "a"}, {"system", "b"}};
    expect_render_error(late_sys, 2, "message 1 is a system message");
    const gm_chat_msg tool[] = {{"user", "a"}, {"tool", "b"}};
    expect_render_error(tool, 2, "message 1 has role \"tool\"");
    const gm_chat_msg sys_only[] = {{"system", "s"}};
    expect_render_error(sys_only, 1, "message 1 must be a user message");
    const gm_chat_msg sys_model[] = {{"system", "s"}, {"model", "m"}};
    expect_render_error(sys_model, 2, "message 1 must be a user message");
    const gm_chat_msg null_content[] = {{"user", NULL}};
    expect_render_error(null_content, 1, "message 0 has no content");

    /* the finder */
    const int32_t seq[] = {1, 2, 3, 9, 1, 2, 3, 7, 1, 2};
    const int32_t pat[] = {1, 2, 3};
    CHECK(gm_chat_find_after_last(seq, 10, pat, 3) == 7, "last occurrence");
    CHECK(gm_chat_find_after_last(seq, 7, pat, 3) == 7, "occurrence at the end");
    CHECK(gm_chat_find_after_last(seq, 6, pat, 3) == 3, "earlier occurrence");
    CHECK(gm_chat_find_after_last(seq, 2, pat, 3) == -1, "sequence shorter than the pattern");
    CHECK(gm_chat_find_after_last(seq + 3, 1, pat, 3) == -1, "absent");
    CHECK(gm_chat_find_after_last(seq, 10, pat, 0) == -1, "empty pattern");

    /* response start with a real (tiny) tokenizer */
    gm_tokenizer *tok = NULL;
    gm_error err = {0};
    CHECK_OK(gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_tokenizer.json"), NULL, &tok, &err), &err);
    if (!tok) return;
    int32_t gen_ids[8];
    int64_t ng = 0;
    CHECK_OK(gm_tokenizer_encode(tok, "<start_of_turn>model\n", 21, false, true, gen_ids, 8, &ng, &err), &err);
    CHECK(ng >= 2 && gen_ids[0] == 4, "generation prompt ids start with <start_of_turn>");
    const gm_chat_msg conv[] = {{"user", "say model"}, {"assistant", "model\nmodel"}, {"user", "again"},
                                {"assistant", "The answer."}};
    int32_t *ids = NULL;
    int64_t n = 0, start = -1;
    CHECK_OK(gm_chat_encode(tok, conv, 4, false, &ids, &n, &err), &err);
    CHECK(ids && ids[0] == 2, "chat encoding starts with BOS");
    CHECK_OK(gm_chat_response_start(tok, ids, n, &start, &err), &err);
    /* the response is "The answer.<end_of_turn>\n": decode from start */
    char *s = NULL;
    if (start > 0) CHECK_OK(gm_tokenizer_decode(tok, ids + start, n - start, true, &s, &err), &err);
    CHECK(s && strcmp(s, "The answer.<end_of_turn>\n") == 0, "response from %lld: \"%s\"", (long long)start,
          s ? s : "");
    gm_free(s);
    gm_free(ids);
    const gm_chat_msg user_only[] = {{"user", "hello"}};
    CHECK_OK(gm_chat_encode(tok, user_only, 1, false, &ids, &n, &err), &err);
    gm_status st = gm_chat_response_start(tok, ids, n, &start, &err);
    CHECK(st == GM_ERR_NOT_FOUND && start == -1 && strstr(err.msg, "no model turn"), "no model turn: %s",
          err.msg);
    gm_free(ids);
    CHECK_OK(gm_chat_encode(tok, user_only, 1, true, &ids, &n, &err), &err);
    CHECK_OK(gm_chat_response_start(tok, ids, n, &start, &err), &err);
    CHECK(start == n, "generation prompt: response starts at the end (%lld of %lld)", (long long)start, (long long)n);
    gm_free(ids);
    gm_tokenizer_free(tok);
}

/* Gemma 4's turns (gm_chat.h): its own markers, the system message a turn of its own; the format
 * follows the tokenizer (tests/ref/tiny_gemma4_chat: the tiny tokenizer with Gemma 4's markers),
 * and the response start, earlier model turns and turn-end stop token with it. */
static void test_chat_gemma4(void) {
    const gm_chat_msg sys[] = {{"system", " Be brief. "}, {"user", "  Q?\n"}, {"assistant", "\tA.  "}};
    expect_render_fmt(GM_CHAT_GEMMA4, sys, 3, false,
                      "<|turn>system\nBe brief.<turn|>\n<|turn>user\nQ?<turn|>\n<|turn>model\nA.<turn|>\n");
    const gm_chat_msg one[] = {{"user", "Hi"}};
    expect_render_fmt(GM_CHAT_GEMMA4, one, 1, true, "<|turn>user\nHi<turn|>\n<|turn>model\n");
    gm_tokenizer *t3 = NULL, *t4 = NULL;
    gm_error err = {0};
    CHECK_OK(gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_tokenizer.json"), NULL, &t3, &err), &err);
    CHECK_OK(gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_gemma4_chat/tokenizer.json"), NULL, &t4, &err), &err);
    if (!t3 || !t4) goto done;
    CHECK(gm_chat_format_of(t3) == GM_CHAT_GEMMA3 && gm_chat_format_of(t4) == GM_CHAT_GEMMA4 &&
              gm_chat_format_of(NULL) == GM_CHAT_GEMMA3,
          "chat format by the tokenizer's markers");
    gm_special_ids sp = gm_tokenizer_special(t4);
    CHECK(sp.start_of_turn == 4 && sp.end_of_turn == 5, "Gemma 4 turn tokens %d %d (want 4 5)", sp.start_of_turn,
          sp.end_of_turn);
    const gm_chat_msg conv[] = {{"user", "say model"}, {"assistant", "model\nmodel"}, {"user", "again"},
                                {"assistant", "The answer."}};
    int32_t *ids = NULL;
    int64_t n = 0, start = -1;
    CHECK_OK(gm_chat_encode(t4, conv, 4, false, &ids, &n, &err), &err);
    CHECK_OK(gm_chat_response_start(t4, ids, n, &start, &err), &err);
    char *s = NULL;
    if (start > 0) CHECK_OK(gm_tokenizer_decode(t4, ids + start, n - start, true, &s, &err), &err);
    CHECK(s && strcmp(s, "The answer.<turn|>\n") == 0, "Gemma 4 response from %lld: \"%s\"", (long long)start, s ? s : "");
    gm_free(s);
    s = NULL;
    int64_t(*spans)[2] = NULL, n_spans = 0;
    CHECK_OK(gm_chat_earlier_model_turns(t4, ids, n, &spans, &n_spans, &err), &err);
    if (n_spans == 1) CHECK_OK(gm_tokenizer_decode(t4, ids + spans[0][0], spans[0][1] - spans[0][0], true, &s, &err), &err);
    CHECK(n_spans == 1 && s && strcmp(s, "model\nmodel<turn|>\n") == 0, "Gemma 4 earlier model turn: %lld, \"%s\"",
          (long long)n_spans, s ? s : "");
    gm_free(s);
    gm_free(spans);
    gm_free(ids);
done:
    gm_tokenizer_free(t3);
    gm_tokenizer_free(t4);
}

/* A GGUF-vocabulary tokenizer written as tokenizer.json + tokenizer_config.json
 * (gm_tokenizer_save_hf) and read back (gm_tokenizer_from_hf_json) encodes every text to the same
 * ids: the merges reproduce the vocabulary-order priority, the added tokens the special-token
 * splitting. (transformers reading the same files: tests/e2e/generate_real.sh.) */
static void test_save_hf(void) {
    hand_vocab v;
    make_hand_vocab(&v, true);
    gm_special_ids sp = {2, 1, 3, 0, -1, -1};
    gm_tokenizer *tok = NULL, *back = NULL;
    gm_error err = {0};
    char dir[256], tj[300], tc[300];
    CHECK_OK(gm_tokenizer_from_vocab(V_N, v.ptr, v.len, v.score, v.type, sp, true, false, &tok, &err), &err);
    if (!tok || !gm_test_make_tmpdir("tok_save", dir, sizeof dir)) {
        gm_tokenizer_free(tok);
        return;
    }
    CHECK_OK(gm_tokenizer_save_hf(tok, dir, "{{ bos_token }}", &err), &err);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    CHECK_OK(gm_tokenizer_from_hf_json(tj, tc, &back, &err), &err);
    if (back) {
        static const char *const texts[] = {"abc", "ab", "a a", "a  b", "a   b", "axxb", "xxx", "<ctl>a", "<unk>", "ba cab",
                                            "\xC3\xA9", "a\xFF" "b", "", "xa", "cba  abc<ctl>xx a", "  a"};
        int bad = 0;
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
            for (int special = 0; special < 2; special++) {
                int32_t a[64], b[64];
                int64_t na = 0, nb = 0;
                gm_status s1 = gm_tokenizer_encode(tok, texts[i], strlen(texts[i]), true, special, a, 64, &na, &err);
                gm_status s2 = gm_tokenizer_encode(back, texts[i], strlen(texts[i]), true, special, b, 64, &nb, &err);
                if (s1 != GM_OK || s2 != GM_OK || na != nb || memcmp(a, b, (size_t)na * sizeof a[0]) != 0) {
                    bad++;
                    fprintf(stderr, "  \"%s\" (special %d): %lld vs %lld ids\n", texts[i], special, (long long)na, (long long)nb);
                }
            }
        CHECK(bad == 0, "%d texts encode differently after tokenizer.json was written and read back", bad);
        CHECK(gm_tokenizer_add_bos(back) && gm_tokenizer_special(back).bos == 2 && gm_tokenizer_special(back).eos == 1,
              "BOS, EOS and add_bos carried over");
        /* a tokenizer read from a tokenizer.json is copied, not rewritten */
        CHECK(gm_tokenizer_save_hf(back, dir, NULL, &err) == GM_ERR_UNSUPPORTED, "rewriting a tokenizer.json tokenizer");
        gm_tokenizer_free(back);
    }
    gm_test_remove_tmpdir(dir);
    gm_tokenizer_free(tok);
}

/* Random strings: decode(encode(x)) == x for valid UTF-8 (no lstrip/rstrip tokens in the
 * alphabet), and raw random bytes never crash and give in-range ids. */
static void test_random(void) {
    gm_tokenizer *tok = NULL;
    gm_error err = {0};
    CHECK_OK(gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_tokenizer.json"), NULL, &tok, &err), &err);
    if (!tok) return;
    static const char *const alpha[] = {"a", "b", "e", "t", "h", "the", " ", "  ", "\n", "\n\n", "\t",
                                        "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x99\x82", "<bos>",
                                        "<start_of_turn>", "<html>", "hello world", "hello", ".", "0"};
    const int n_alpha = (int)(sizeof alpha / sizeof alpha[0]);
    uint64_t rng = 12345;
    int bad_trip = 0, bad_ids = 0;
    for (int it = 0; it < 2000; it++) {
        char text[512];
        size_t o = 0;
        int parts = 1 + (int)((gm_test_rand(&rng) + 1) * 15);
        for (int k = 0; k < parts; k++) {
            const char *a = alpha[(int)((gm_test_rand(&rng) + 1) * 0.5 * n_alpha) % n_alpha];
            memcpy(text + o, a, strlen(a));
            o += strlen(a);
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        char *s = NULL;
        if (gm_tokenizer_encode_alloc(tok, text, o, false, true, &ids, &n, &err) == GM_OK &&
            gm_tokenizer_decode(tok, ids, n, true, &s, &err) == GM_OK)
            bad_trip += strlen(s) != o || memcmp(s, text, o) != 0;
        else
            bad_trip++;
        gm_free(ids);
        gm_free(s);
        /* raw bytes */
        for (size_t k = 0; k < 64; k++) text[k] = (char)(int)((gm_test_rand(&rng) + 1) * 128);
        if (gm_tokenizer_encode_alloc(tok, text, 64, true, it & 1, &ids, &n, &err) == GM_OK) {
            for (int64_t k = 0; k < n; k++) bad_ids += ids[k] < 0 || ids[k] >= gm_tokenizer_vocab_size(tok);
        } else {
            bad_ids++;
        }
        gm_free(ids);
    }
    CHECK(bad_trip == 0, "%d of 2000 random strings do not survive encode+decode", bad_trip);
    CHECK(bad_ids == 0, "%d random byte strings gave bad ids", bad_ids);
    gm_tokenizer_free(tok);
}

/* Allocation failures while building and encoding give GM_ERR_NOMEM, never a crash or a leak
 * (the main() leak check covers the leak part). */
static void test_alloc_failures(void) {
    int n_nomem = 0, n_ok = 0;
    for (uint64_t k = 1; k <= 1000 && n_ok == 0; k++) { /* until the build needs no more */
        gm_tokenizer *tok = NULL;
        gm_error err = {0};
        gm_alloc_fail_after(k);
        gm_status st = gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_tokenizer.json"), NULL, &tok, &err);
        gm_alloc_fail_after(0);
        CHECK(st == GM_OK || st == GM_ERR_NOMEM, "build with allocation %llu failing: %s (%s)",
              (unsigned long long)k, gm_status_name(st), err.msg);
        CHECK((st == GM_OK) == (tok != NULL), "tokenizer returned on failure");
        n_nomem += st == GM_ERR_NOMEM;
        n_ok += st == GM_OK;
        if (tok) {
            int32_t *ids = NULL;
            int64_t n = 0;
            const char text[] = "hello world <start_of_turn>user\n caf\xC3\xA9 the then";
            for (uint64_t j = 1; j <= 5; j++) {
                gm_alloc_fail_after(j);
                st = gm_tokenizer_encode_alloc(tok, text, sizeof text - 1, true, true, &ids, &n, &err);
                gm_alloc_fail_after(0);
                CHECK(st == GM_OK || st == GM_ERR_NOMEM, "encode with allocation %llu failing: %s",
                      (unsigned long long)j, gm_status_name(st));
                gm_free(ids);
                ids = NULL;
            }
        }
        gm_tokenizer_free(tok);
    }
    CHECK(n_nomem > 0 && n_ok > 0, "fault injection hit %d failures, %d successes", n_nomem, n_ok);
}

int main(void) {
    gm_alloc_stats before = gm_alloc_get_stats();
    test_tiny();
    test_json_errors();
    test_hand_vocab();
    test_gguf();
    test_chat();
    test_chat_gemma4();
    test_save_hf();
    test_random();
    test_alloc_failures();
    gm_alloc_stats after = gm_alloc_get_stats();
    CHECK(after.bytes_live == before.bytes_live, "leak: %llu bytes still allocated",
          (unsigned long long)(after.bytes_live - before.bytes_live));
    return gm_test_finish();
}
