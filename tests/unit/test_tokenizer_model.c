/*
 * test_tokenizer_model.c - the tokenizer on the real Gemma 3 270M GGUF: every vector of
 * formats.md §2.5, decode round trips, ~330 strings and 6 chat renderings from Hugging Face
 * (tests/ref/tokenizer_ref.json, made by tests/ref/make_tokenizer_ref.py), plus timings.
 * Fails (does not skip) when the model is not in the cache.
 */
#include "gm_alloc.h"
#include "gm_chat.h"
#include "gm_gguf.h"
#include "gm_mmap.h"
#include "gm_tokenizer.h"
#include "test_util.h"

#include <cjson/cJSON.h>

#include <string.h>
#include <time.h>

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
    fprintf(stderr, "    %s (%lld):", what, (long long)n);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Encodes and compares with `want`; prints both on a mismatch. Returns true on a match. */
static bool check_encode(const gm_tokenizer *tok, const char *text, size_t len, bool bos,
                         bool special, const int32_t *want, int64_t n_want, const char *label) {
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_error err = {0};
    gm_status st = gm_tokenizer_encode_alloc(tok, text, len, bos, special, &ids, &n, &err);
    bool ok = st == GM_OK && n == n_want && memcmp(ids, want, (size_t)n * sizeof *ids) == 0;
    CHECK(ok, "%s: encode(\"%.60s\", bos=%d, parse_special=%d) differs from the reference", label,
          text, bos, special);
    if (!ok) {
        if (st != GM_OK) fprintf(stderr, "    error: %s\n", err.msg);
        print_ids("got ", ids, n);
        print_ids("want", want, n_want);
    }
    gm_free(ids);
    return ok;
}

/* ---- formats.md §2.5 ----------------------------------------------------------------------- */
typedef struct vec {
    const char *text;
    int32_t ids[12];
    int n;
} vec;

static const vec VEC_BOS[] = {
    {"Hello world", {2, 9259, 1902}, 3},
    {" Hello", {2, 26352}, 2},
    {"Hello  world", {2, 9259, 138, 12392}, 4},
    {"hello\n\nworld", {2, 23391, 108, 12392}, 4},
    {"<start_of_turn>user\nHi<end_of_turn>\n", {2, 105, 2364, 107, 10979, 106, 107}, 7},
    {"1234567", {2, 236770, 236778, 236800, 236812, 236810, 236825, 236832}, 8},
    {"na\xC3\xAFve caf\xC3\xA9", {2, 1789, 238527, 560, 33443}, 5},
    {"\xF0\x9F\x99\x82", {2, 240731}, 2}, /* 🙂 */
    {"\t\tx", {2, 255969, 236781}, 3},
    {"", {2}, 1},
    {" ", {2, 236743}, 2},
};

static const vec VEC_NOBOS[] = {
    {"\xF0\x93\x80\x80", {478, 385, 366, 366}, 4}, /* 𓀀: byte fallback */
    {"a\x07" "b", {236746, 245, 236763}, 3},
    {"The quick brown fox jumps over the lazy dog.",
     {818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761}, 10},
    {"I'm", {236777, 236789, 236757}, 3},
    {"<start_of_turn>model\n", {105, 4368, 107}, 3},
};

static void test_vectors(const gm_tokenizer *tok) {
    for (size_t i = 0; i < sizeof VEC_BOS / sizeof VEC_BOS[0]; i++) {
        const vec *v = &VEC_BOS[i];
        check_encode(tok, v->text, strlen(v->text), true, true, v->ids, v->n, "§2.5");
    }
    for (size_t i = 0; i < sizeof VEC_NOBOS / sizeof VEC_NOBOS[0]; i++) {
        const vec *v = &VEC_NOBOS[i];
        check_encode(tok, v->text, strlen(v->text), false, true, v->ids, v->n, "§2.5");
    }
    /* round trips: decoding without special rendering gives the text back (BOS is CONTROL) */
    for (size_t i = 0; i < sizeof VEC_BOS / sizeof VEC_BOS[0]; i++) {
        const vec *v = &VEC_BOS[i];
        char *s = NULL;
        gm_error err = {0};
        CHECK_OK(gm_tokenizer_decode(tok, v->ids, v->n, true, &s, &err), &err);
        char want[128];
        snprintf(want, sizeof want, "<bos>%s", v->text);
        CHECK(s && strcmp(s, want) == 0, "decode(render_special) of \"%s\" gave \"%s\"", v->text, s ? s : "");
        gm_free(s);
        CHECK_OK(gm_tokenizer_decode(tok, v->ids, v->n, false, &s, &err), &err);
        if (!strstr(v->text, "<start_of_turn>"))
            CHECK(s && strcmp(s, v->text) == 0, "decode of \"%s\" gave \"%s\"", v->text, s ? s : "");
        else
            CHECK(s && strcmp(s, "user\nHi\n") == 0, "decode without specials gave \"%s\"", s ? s : "");
        gm_free(s);
    }
    for (size_t i = 0; i < sizeof VEC_NOBOS / sizeof VEC_NOBOS[0]; i++) {
        const vec *v = &VEC_NOBOS[i];
        char *s = NULL;
        gm_error err = {0};
        CHECK_OK(gm_tokenizer_decode(tok, v->ids, v->n, true, &s, &err), &err);
        CHECK(s && strcmp(s, v->text) == 0, "decode of \"%s\" gave \"%s\"", v->text, s ? s : "");
        gm_free(s);
    }
    /* a byte run that is not valid UTF-8 decodes to U+FFFD per byte (HF ByteFallback) */
    const int32_t broken[] = {236746, 478, 385, 236763}; /* a F0 93 b */
    char *s = NULL;
    gm_error err = {0};
    CHECK_OK(gm_tokenizer_decode(tok, broken, 4, false, &s, &err), &err);
    CHECK(s && strcmp(s, "a\xEF\xBF\xBD\xEF\xBF\xBD" "b") == 0, "broken byte run gave \"%s\"", s ? s : "");
    gm_free(s);
    /* a NUL byte in the text is byte token 238 */
    const int32_t nul_ids[] = {236746, 238, 236763};
    check_encode(tok, "a\0b", 3, false, true, nul_ids, 3, "NUL");
}

static void test_metadata(const gm_tokenizer *tok) {
    CHECK(gm_tokenizer_vocab_size(tok) == 262144, "vocab %lld", (long long)gm_tokenizer_vocab_size(tok));
    gm_special_ids sp = gm_tokenizer_special(tok);
    CHECK(sp.bos == 2 && sp.eos == 1 && sp.unk == 3 && sp.pad == 0, "bos %d eos %d unk %d pad %d",
          sp.bos, sp.eos, sp.unk, sp.pad);
    CHECK(sp.start_of_turn == 105 && sp.end_of_turn == 106, "turn ids %d %d", sp.start_of_turn, sp.end_of_turn);
    CHECK(gm_tokenizer_add_bos(tok), "add_bos_token should be true");
    CHECK(gm_tokenizer_token_type(tok, 105) == GM_TOKEN_CONTROL, "type 105");
    CHECK(gm_tokenizer_token_type(tok, 108) == GM_TOKEN_USER_DEFINED, "type 108");
    CHECK(gm_tokenizer_token_type(tok, 238 + 0x41) == GM_TOKEN_BYTE, "type <0x41>");
    CHECK(gm_tokenizer_token_type(tok, 9259) == GM_TOKEN_NORMAL, "type 9259");
    size_t len = 0;
    const char *t = gm_tokenizer_token_text(tok, 138, &len);
    CHECK(t && len == 6 && memcmp(t, "\xE2\x96\x81\xE2\x96\x81", 6) == 0, "138 respelled as two U+2581");
    CHECK(gm_tokenizer_find(tok, "\xE2\x96\x81world", 8) == 1902, "find ▁world");
    CHECK(gm_tokenizer_find(tok, "<0xFF>", 6) == 238 + 255, "find <0xFF>");
    CHECK(gm_tokenizer_find(tok, "no-such-token-xyz", 17) == -1, "find absent");
    char piece[32];
    CHECK(gm_tokenizer_decode_piece(tok, 1902, false, piece, sizeof piece) == 6 && strcmp(piece, " world") == 0,
          "piece 1902 = \"%s\"", piece);
    CHECK(gm_tokenizer_decode_piece(tok, 105, false, piece, sizeof piece) == 0 && piece[0] == 0, "piece 105 hidden");
    CHECK(gm_tokenizer_decode_piece(tok, 105, true, piece, sizeof piece) == 15 &&
              strcmp(piece, "<start_of_turn>") == 0, "piece 105 rendered");
    CHECK(gm_tokenizer_decode_piece(tok, 238 + 'A', false, piece, sizeof piece) == 1 && piece[0] == 'A',
          "byte piece");
    CHECK(gm_tokenizer_decode_piece(tok, 138, false, piece, sizeof piece) == 2 && strcmp(piece, "  ") == 0,
          "space-run piece");
}

/* ---- tests/ref/tokenizer_ref.json --------------------------------------------------------- */

static int64_t json_ids(const cJSON *arr, int32_t **out) {
    int64_t n = cJSON_GetArraySize(arr);
    *out = gm_malloc(((size_t)n + 1) * sizeof **out);
    int64_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) (*out)[i++] = (int32_t)it->valuedouble;
    return n;
}

static void test_reference(const gm_tokenizer *tok) {
    char *buf = NULL;
    size_t len = 0;
    gm_error err = {0};
    CHECK_OK(gm_read_file(gm_test_path("tests/ref/tokenizer_ref.json"), &buf, &len, &err), &err);
    cJSON *root = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    gm_free(buf);
    CHECK(root != NULL, "tests/ref/tokenizer_ref.json does not parse");
    if (!root) return;
    const cJSON *c;
    int n_cases = 0, n_ok = 0, n_dec_ok = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const cJSON *text = cJSON_GetObjectItem(c, "text");
        bool bos = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special"));
        bool special = cJSON_IsTrue(cJSON_GetObjectItem(c, "parse_special"));
        int32_t *want;
        int64_t nw = json_ids(cJSON_GetObjectItem(c, "ids"), &want);
        char label[32];
        snprintf(label, sizeof label, "case %d", n_cases);
        n_ok += check_encode(tok, text->valuestring, strlen(text->valuestring), bos, special, want, nw, label);
        /* decoding the reference ids (without the BOS) gives Hugging Face's decode */
        char *s = NULL;
        int64_t skip = bos && nw > 0 ? 1 : 0;
        CHECK_OK(gm_tokenizer_decode(tok, want + skip, nw - skip, true, &s, &err), &err);
        const char *dec = cJSON_GetObjectItem(c, "decoded")->valuestring;
        bool dok = s && strcmp(s, dec) == 0;
        CHECK(dok, "%s: decode gave \"%.60s\", Hugging Face \"%.60s\"", label, s ? s : "", dec);
        /* and Gemma's tokenization is lossless: that is the original text */
        CHECK(s && strcmp(s, text->valuestring) == 0, "%s: round trip gave \"%.60s\"", label, s ? s : "");
        n_dec_ok += dok;
        gm_free(s);
        gm_free(want);
        n_cases++;
    }
    printf("reference strings: %d/%d encodings and %d/%d decodings match Hugging Face\n", n_ok,
           n_cases, n_dec_ok, n_cases);
    CHECK(n_cases >= 300, "only %d reference strings", n_cases);

    int n_chats = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "chats")) {
        gm_chat_msg msgs[8];
        int64_t nm = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(c, "messages")) {
            msgs[nm].role = cJSON_GetObjectItem(m, "role")->valuestring;
            msgs[nm].content = cJSON_GetObjectItem(m, "content")->valuestring;
            nm++;
        }
        bool gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        char *text = NULL;
        size_t tl = 0;
        CHECK_OK(gm_chat_render(GM_CHAT_GEMMA3, msgs, nm, gen, &text, &tl, &err), &err);
        const char *want_text = cJSON_GetObjectItem(c, "text")->valuestring;
        CHECK(text && strcmp(text, want_text) == 0, "chat %d renders \"%s\", HF \"%s\"", n_chats,
              text ? text : "", want_text);
        int32_t *want, *ids = NULL;
        int64_t nw = json_ids(cJSON_GetObjectItem(c, "ids"), &want), n = 0;
        CHECK_OK(gm_chat_encode(tok, msgs, nm, gen, &ids, &n, &err), &err);
        CHECK(ids && n == nw && memcmp(ids, want, (size_t)n * sizeof *ids) == 0, "chat %d ids differ", n_chats);
        /* response start: after the last <start_of_turn>model\n (105 4368 107) */
        int64_t start = -1, expect = -1;
        for (int64_t i = nw - 3; i >= 0 && expect < 0; i--)
            if (want[i] == 105 && want[i + 1] == 4368 && want[i + 2] == 107) expect = i + 3;
        gm_status st = gm_chat_response_start(tok, want, nw, &start, &err);
        CHECK(st == GM_OK && start == expect, "chat %d: response start %lld, expected %lld", n_chats,
              (long long)start, (long long)expect);
        if (gen) CHECK(start == nw, "with a generation prompt the response starts at the end");
        gm_free(text);
        gm_free(ids);
        gm_free(want);
        n_chats++;
    }
    CHECK(n_chats >= 6, "only %d chats", n_chats);
    cJSON_Delete(root);
}

/* ~2 KB of mixed text: prose, code, numbers, unicode. */
static void test_speed(const gm_tokenizer *tok, double build_s) {
    char text[4096];
    size_t o = 0;
    const char *parts[] = {
        "The quick brown fox jumps over the lazy dog. ",
        "for (size_t i = 0; i < n; i++) y[i] += a * x[i];\n",
        "Prices rose 3.7% to $1,234.56 on 2024-01-31. ",
        "na\xC3\xAFve caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x99\x82  ",
        "It was the best of times, it was the worst of times, it was the age of wisdom.\n\n",
    };
    for (int k = 0; o < 2000; k++) {
        size_t l = strlen(parts[k % 5]);
        memcpy(text + o, parts[k % 5], l);
        o += l;
    }
    int32_t ids[4096];
    int64_t n = 0;
    gm_error err = {0};
    const int reps = 300;
    double t0 = gm_test_now_s();
    for (int r = 0; r < reps; r++) gm_tokenizer_encode(tok, text, o, true, true, ids, 4096, &n, &err);
    double per = (gm_test_now_s() - t0) / reps;
    printf("vocab build from GGUF: %.1f ms; encode %zu bytes -> %lld tokens: %.1f us (%.1f MB/s)\n",
           build_s * 1e3, o, (long long)n, per * 1e6, (double)o / per / 1e6);
    /* printed, not asserted: speed belongs to benchmarks, not to pass/fail (README "Speed") */
}

int main(void) {
    const char *path = gm_test_real_model();
    CHECK(path != NULL, "the real Gemma 3 270M GGUF is required for this test");
    if (!path) return gm_test_finish();
    gm_gguf *g = NULL;
    gm_error err = {0};
    CHECK_OK(gm_gguf_open(path, &g, &err), &err);
    if (!g) return gm_test_finish();
    gm_tokenizer *tok = NULL;
    double t0 = gm_test_now_s();
    CHECK_OK(gm_tokenizer_from_gguf(g, &tok, &err), &err);
    double build_s = gm_test_now_s() - t0;
    gm_gguf_free(g); /* the tokenizer keeps no pointers into the mapping */
    if (tok) {
        test_metadata(tok);
        test_vectors(tok);
        test_reference(tok);
        test_speed(tok, build_s);
    }
    gm_tokenizer_free(tok);
    return gm_test_finish();
}
