/*
 * test_data.c - the identity of a tokenized data set (gm_dataset_sha256, the data_sha256 of
 * results provenance): equal for the same examples; different when one token id, a response
 * start, a label or the order of examples changes, even at the same lengths; the empty set hashes
 * as sha256 of nothing. (Tokenization and response starts themselves: test_tokenizer,
 * test_train_model; JSONL reading: fuzz_jsonl.) And what is supervised: every model turn of a
 * multi-turn chat (its text, <end_of_turn> and newline), none of the user's; a one-turn data set
 * hashes as before the earlier turns were recorded. And what of a row-read table (Gemma 3n's
 * per-layer embeddings) two data sets' ids make resident (gm_dataset_table_resident): counted by
 * hand for ids in one block, straddling two, shared between the sets, and past the table.
 */
#include "gm_alloc.h"
#include "gm_data.h"
#include "gm_tokenizer.h"
#include "test_util.h"

#include <string.h>

static const gm_chat_msg CHATS[3][2] = {
    {{"user", "Which fruit is red?"}, {"assistant", "The cherry."}},
    {{"user", "A short note about the berry"}, {"assistant", "berry"}},
    {{"user", "And the apple?"}, {"assistant", "An apple a day keeps the doctor away."}},
};

static void fill(gm_dataset *ds, const gm_tokenizer *tok, const int *order) {
    gm_dataset_init(ds);
    gm_error err = {0};
    for (int i = 0; i < 3; i++) CHECK_OK(gm_dataset_add_chat(ds, tok, CHATS[order[i]], 2, 64, order[i], &err), &err);
}

/* The supervised targets of example 0 of ds as text: each run of supervised positions decoded
 * (special tokens rendered), runs joined with "|". */
static void supervised_text(const gm_dataset *ds, const gm_tokenizer *tok, char *out, size_t cap) {
    int64_t n = ds->ex[0].n, idx = 0;
    int32_t *ids = gm_malloc((size_t)n * 4), *tg = gm_malloc((size_t)n * 4), *run = gm_malloc((size_t)n * 4);
    int64_t T = gm_batch_collate(ds, &idx, 1, 0, ids, tg);
    out[0] = '\0';
    for (int64_t t = 0, k = 0; t <= T; t++) {
        if (t < T && tg[t] >= 0) {
            run[k++] = tg[t];
            continue;
        }
        if (k == 0) continue;
        char *txt = NULL;
        gm_error err = {0};
        CHECK_OK(gm_tokenizer_decode(tok, run, k, true, &txt, &err), &err);
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%s", l ? "|" : "", txt ? txt : "?");
        gm_free(txt);
        k = 0;
    }
    gm_free(ids), gm_free(tg), gm_free(run);
}

static void check_multi_turn(const gm_tokenizer *tok) {
    static const gm_chat_msg chat[5] = {{"system", "Be brief."},       {"user", "Which fruit is red?"},
                                        {"assistant", "The cherry."},  {"user", "And the apple?"},
                                        {"assistant", "Green or red."}};
    gm_dataset ds;
    gm_dataset_init(&ds);
    gm_error err = {0};
    CHECK_OK(gm_dataset_add_chat(&ds, tok, chat, 5, 128, -1, &err), &err);
    char got[512];
    if (ds.n == 1) {
        supervised_text(&ds, tok, got, sizeof got);
        CHECK(strcmp(got, "The cherry.<end_of_turn>\n|Green or red.<end_of_turn>\n") == 0,
              "two model turns: both supervised, their text, <end_of_turn> and newline; the user's not: '%s'", got);
        CHECK(ds.ex[0].n_turns == 1, "one earlier model turn recorded (%lld)", (long long)ds.ex[0].n_turns);
    }
    /* truncated inside the last turn: the earlier turn whole, the last one's first tokens */
    gm_dataset tr;
    gm_dataset_init(&tr);
    int64_t cut = ds.n == 1 ? ds.ex[0].response_start + 2 : 64;
    CHECK_OK(gm_dataset_add_chat(&tr, tok, chat, 5, cut, -1, &err), &err);
    if (tr.n == 1) {
        supervised_text(&tr, tok, got, sizeof got);
        CHECK(strncmp(got, "The cherry.<end_of_turn>\n|", 26) == 0 && strlen(got) > 26 && !strstr(got + 26, "<end_of_turn>"),
              "truncated: the earlier turn whole, the last cut: '%s'", got);
    }
    /* one model turn: only the response, and no earlier turns to record */
    gm_dataset one;
    gm_dataset_init(&one);
    CHECK_OK(gm_dataset_add_chat(&one, tok, chat + 3, 2, 128, -1, &err), &err);
    if (one.n == 1) {
        supervised_text(&one, tok, got, sizeof got);
        CHECK(strcmp(got, "Green or red.<end_of_turn>\n") == 0 && one.ex[0].n_turns == 0 && one.ex[0].turns == NULL,
              "one turn: the response alone: '%s'", got);
    }
    printf("multi-turn chat: supervised '%s' (one turn)\n", got);
    gm_dataset_free(&ds), gm_dataset_free(&tr), gm_dataset_free(&one);
}

static void hash(const gm_dataset *ds, char hex[65]) {
    gm_error err = {0};
    CHECK_OK(gm_dataset_sha256(ds, hex, &err), &err);
}

/* gm_dataset_table_resident on two hand-made data sets: rows of 15,360 bytes (Gemma 3n E2B's
 * 30 x 256 bf16) in 64 KiB blocks: row r spans bytes [15360 r, 15360 (r + 1)). */
static void test_table_resident(void) {
    int32_t a_ids[4] = {0, 1, 2, 3};            /* rows 0-3: bytes 0..61,439, block 0 */
    int32_t b_ids[3] = {4, 300000, 5};          /* row 4 straddles blocks 0-1 (61,440..76,799), row 5 in block 1;
                                                   300000 is past the table: row 0 */
    gm_example ea = {.ids = a_ids, .n = 4}, eb = {.ids = b_ids, .n = 3};
    gm_dataset a = {.ex = &ea, .n = 1}, b = {.ex = &eb, .n = 1};
    const gm_dataset *both[2] = {&a, &b};
    const size_t RB = 15360, BLOCK = 65536;
    size_t got = gm_dataset_table_resident(both, 2, 262144, RB);
    CHECK(got == 2 * BLOCK, "ids 0-5 and one past the table: 2 blocks (%zu bytes)", got);
    int32_t c_ids[2] = {1000, 262143};          /* row 1000: bytes 15,360,000..15,375,359, all in block 234; the
                                                   last row in block 61,439 */
    gm_example ec = {.ids = c_ids, .n = 2};
    gm_dataset c = {.ex = &ec, .n = 1};
    const gm_dataset *one[1] = {&c};
    got = gm_dataset_table_resident(one, 1, 262144, RB);
    CHECK(got == 3 * BLOCK, "rows 1000 and 262143 and row 0: 3 blocks (%zu bytes)", got);
    got = gm_dataset_table_resident(one, 1, 4, RB); /* a table smaller than its blocks: the table */
    CHECK(got == 4 * RB, "a 4-row table: all of it, %zu bytes", got);
}

int main(void) {
    test_table_resident();
    gm_error err = {0};
    gm_tokenizer *tok = NULL;
    CHECK_OK(gm_tokenizer_from_hf_json(gm_test_path("tests/ref/tiny_tokenizer.json"), NULL, &tok, &err), &err);
    if (!tok) return gm_test_finish();
    static const int in_order[3] = {0, 1, 2}, swapped[3] = {1, 0, 2};
    gm_dataset a, b;
    char ha[65], hb[65];
    fill(&a, tok, in_order);
    fill(&b, tok, in_order);
    hash(&a, ha);
    hash(&b, hb);
    CHECK(strlen(ha) == 64 && strcmp(ha, hb) == 0, "the same examples hash the same: %s vs %s", ha, hb);

    // one token id, same length
    int32_t keep = b.ex[1].ids[3];
    b.ex[1].ids[3] = keep + 1;
    hash(&b, hb);
    CHECK(strcmp(ha, hb) != 0, "one token id changed (same length): the hash changes");
    b.ex[1].ids[3] = keep;
    // the response start (what is supervised), same tokens
    b.ex[2].response_start -= 1;
    hash(&b, hb);
    CHECK(strcmp(ha, hb) != 0, "the response start changed: the hash changes");
    b.ex[2].response_start += 1;
    // a label
    b.ex[0].label = 7;
    hash(&b, hb);
    CHECK(strcmp(ha, hb) != 0, "a label changed: the hash changes");
    b.ex[0].label = 0;
    hash(&b, hb);
    CHECK(strcmp(ha, hb) == 0, "restored: the same hash again");
    gm_dataset_free(&b);

    // the order of the examples
    fill(&b, tok, swapped);
    hash(&b, hb);
    CHECK(strcmp(ha, hb) != 0, "the same examples in another order: another hash");
    gm_dataset_free(&b);

    // nothing
    gm_dataset_init(&b);
    hash(&b, hb);
    CHECK(strcmp(hb, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0,
          "the empty set is sha256 of nothing: %s", hb);
    gm_dataset_free(&b);
    gm_dataset_free(&a);
    check_multi_turn(tok);
    gm_tokenizer_free(tok);
    return gm_test_finish();
}
