/*
 * fuzz_tokenizer.c - libFuzzer target for tokenizer.json (gm_tokenizer_from_hf_json: the model's
 * vocabulary and merges, added tokens, normalizer, pre-tokenizer and post-processor sections).
 *
 * The loader reads a path, so each input goes into an anonymous in-memory file (memfd_create)
 * read back through /proc/self/fd. A tokenizer that loads must encode and decode a few texts -
 * plain, with special-token text, invalid UTF-8, empty - without crashing, every id inside its
 * vocabulary; a failed load must leave a message. Without clang the same function is driven
 * over the seed corpus by fuzz_replay.c.
 */
#define _GNU_SOURCE
#include "gm_alloc.h"
#include "gm_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void roundtrip(const gm_tokenizer *tok, const char *text, size_t len) {
    int32_t ids[256];
    int64_t n = 0;
    gm_error err;
    if (gm_tokenizer_encode(tok, text, len, true, true, ids, 256, &n, &err) != GM_OK) return;
    if (n < 0 || n > 256) __builtin_trap();
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= gm_tokenizer_vocab_size(tok)) __builtin_trap(); /* ids in the vocabulary */
    char *s = NULL;
    if (gm_tokenizer_decode(tok, ids, n, false, &s, &err) == GM_OK) gm_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz_tokenizer", 0);
    if (fd < 0) return 0;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    gm_tokenizer *tok = NULL;
    gm_error err;
    if (off == size && gm_tokenizer_from_hf_json(path, NULL, &tok, &err) == GM_OK) {
        static const char *texts[] = {"Hello world", "<start_of_turn>user\nhi<end_of_turn>\n", "\xff\xfe\xc3",
                                      "", "  two  spaces\tand\ttabs ", "日本語のテキスト"};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) roundtrip(tok, texts[i], strlen(texts[i]));
        gm_tokenizer_free(tok);
    } else if (off == size && (tok != NULL || err.msg[0] == '\0')) {
        __builtin_trap(); /* failures leave a message and no tokenizer */
    }
    close(fd);
    return 0;
}
