/*
 * gm_tokenizer.h - Gemma's SentencePiece-style BPE tokenizer.
 *
 * Two sources, one engine:
 *   - the GGUF vocabulary (tokenizer.ggml.tokens / scores / token_type, special ids): the
 *     llama.cpp SPM procedure of formats.md §2.2 - merge the adjacent pair whose merged text is
 *     a vocabulary entry with the highest score, ties to the leftmost; byte fallback <0xXX>;
 *   - a Hugging Face tokenizer.json (model.type "BPE", vocab + merges, byte_fallback): the same
 *     loop, but the priority of a pair is its merge rank (lower first).
 * Before merging, text is split at special/user-defined token texts (longest first; CONTROL
 * tokens only when parse_special is true), spaces become U+2581 "▁" (no dummy prefix for
 * Gemma: add_space_prefix false) and BOS is prepended when add_bos is true.
 * Must reproduce formats.md §2.5 exactly (tests/unit/test_tokenizer_model.c).
 *
 * Ownership: a gm_tokenizer owns copies of every token string and its hash tables; it does not
 * keep pointers into the GGUF mapping or JSON it was built from. Returned token-text pointers
 * are borrowed until gm_tokenizer_free.
 * Errors: construction returns GM_ERR_FORMAT naming the source and the bad entry (e.g. missing
 * scores, a merge naming an unknown token); encode returns GM_ERR_LIMIT when `cap` is too small
 * (with the needed count in *n_out) and GM_ERR_FORMAT for invalid UTF-8 is NOT raised: invalid
 * bytes fall back to byte tokens, as SentencePiece does.
 * Thread-safety: encode/decode are reentrant (no shared mutable state after construction).
 */
#ifndef GM_TOKENIZER_H
#define GM_TOKENIZER_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Token types as in GGUF tokenizer.ggml.token_type (formats.md §2.1). */
typedef enum gm_token_type {
    GM_TOKEN_UNDEFINED = 0,
    GM_TOKEN_NORMAL = 1,
    GM_TOKEN_UNKNOWN = 2,
    GM_TOKEN_CONTROL = 3,
    GM_TOKEN_USER_DEFINED = 4,
    GM_TOKEN_UNUSED = 5,
    GM_TOKEN_BYTE = 6,
} gm_token_type;

typedef struct gm_tokenizer gm_tokenizer;

/* Special ids; -1 when the vocabulary has none. */
typedef struct gm_special_ids {
    int32_t bos, eos, unk, pad;
    int32_t start_of_turn, end_of_turn; /* looked up by text: "<start_of_turn>", "<end_of_turn>" */
} gm_special_ids;

/* Builds from parallel arrays (as stored in GGUF). tokens[i] has length lens[i] (not
 * NUL-terminated). scores and types may not be NULL. Everything is copied. */
gm_status gm_tokenizer_from_vocab(int64_t n, const char *const *tokens, const uint64_t *lens,
                                  const float *scores, const int32_t *types,
                                  gm_special_ids special, bool add_bos, bool add_space_prefix,
                                  gm_tokenizer **out, gm_error *err);

/* Builds from a GGUF file already opened (reads the tokenizer.ggml.* keys). */
struct gm_gguf;
gm_status gm_tokenizer_from_gguf(const struct gm_gguf *g, gm_tokenizer **out, gm_error *err);

/* Builds from a Hugging Face tokenizer.json (+ optional tokenizer_config.json beside it for
 * add_bos_token; may be NULL). */
gm_status gm_tokenizer_from_hf_json(const char *tokenizer_json_path,
                                    const char *tokenizer_config_path, gm_tokenizer **out,
                                    gm_error *err);

void gm_tokenizer_free(gm_tokenizer *tok);

/* Encodes `len` bytes of UTF-8 text into ids[0..*n_out). add_bos: prepend BOS (if the tokenizer
 * has one). parse_special: recognise CONTROL token texts such as "<start_of_turn>" in the text
 * (user-defined tokens are always recognised). Returns GM_ERR_LIMIT if cap is too small. */
gm_status gm_tokenizer_encode(const gm_tokenizer *tok, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, int64_t cap, int64_t *n_out,
                              gm_error *err);

/* Appends the text of `id` to buf (NUL-terminated, truncated at cap). NORMAL tokens turn "▁"
 * back into spaces; BYTE tokens give the raw byte; CONTROL tokens give their text only when
 * render_special. Returns the number of bytes the full piece needs (may exceed cap - 1). */
size_t gm_tokenizer_decode_piece(const gm_tokenizer *tok, int32_t id, bool render_special,
                                 char *buf, size_t cap);

/* Decodes a whole id sequence into a gm_malloc'd NUL-terminated string (*out). */
gm_status gm_tokenizer_decode(const gm_tokenizer *tok, const int32_t *ids, int64_t n,
                              bool render_special, char **out, gm_error *err);

int64_t gm_tokenizer_vocab_size(const gm_tokenizer *tok);
gm_special_ids gm_tokenizer_special(const gm_tokenizer *tok);
/* Raw stored text of a token (with "▁"), its length in *len; NULL if id is out of range. */
const char *gm_tokenizer_token_text(const gm_tokenizer *tok, int32_t id, size_t *len);
gm_token_type gm_tokenizer_token_type(const gm_tokenizer *tok, int32_t id);
/* Id of an exact token text, or -1. */
int32_t gm_tokenizer_find(const gm_tokenizer *tok, const char *text, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* GM_TOKENIZER_H */
