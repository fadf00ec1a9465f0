/*
 * test_data.c - the identity of a tokenized data set (gm_dataset_sha256, the data_sha256 of
 * results provenance): equal for the same examples; different when one token id, a response
 * start, a label or the order of examples changes, even at the same lengths; the empty set hashes
 * as sha256 of nothing. (Tokenization and response starts themselves: test_tokenizer,
 * test_train_model; JSONL reading: fuzz_jsonl.)
 */
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

static void hash(const gm_dataset *ds, char hex[65]) {
    gm_error err = {0};
    CHECK_OK(gm_dataset_sha256(ds, hex, &err), &err);
}

int main(void) {
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
    gm_tokenizer_free(tok);
    return gm_test_finish();
}
