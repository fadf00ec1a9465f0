/*
 * gm_tokenizer.h - Gemma's SentencePiece-style BPE tokenizer (docs/tokenizer.md).
 *
 * Two sources, one engine (a merge loop over a priority heap of adjacent symbol pairs):
 *   - the GGUF vocabulary (tokenizer.ggml.tokens / scores / token_type, special ids): a pair
 *     may merge when its concatenated text is a vocabulary entry; the pair whose merged token
 *     comes first in the vocabulary wins, then the longer left part, then the leftmost pair.
 *     This is exactly the tokenizer Hugging Face builds from a Gemma GGUF (transformers'
 *     gemma GGUF builder); it equals llama.cpp's "highest score first" (formats.md §2.2) on
 *     every normal token, because Gemma's scores fall strictly with the id; on the tested
 *     strings it differs from llama.cpp only where llama.cpp splits runs of more than 31
 *     spaces (docs/tokenizer.md).
 *     Tokens made only of spaces (stored as ASCII spaces in the GGUF) are respelled with
 *     U+2581 "▁" as in Hugging Face, so they take part in merging like any other token;
 *   - a Hugging Face tokenizer.json (model.type "BPE", vocab + merges, byte_fallback): the same
 *     loop, but the priority of a pair is its merge rank (lower first), then the leftmost.
 * Before merging, the text is split at added/special token texts (leftmost, then longest
 * match; CONTROL/UNKNOWN tokens only when parse_special is true, USER_DEFINED always), spaces
 * become U+2581 "▁" (no dummy prefix for Gemma: add_space_prefix false), characters missing
 * from the vocabulary become byte tokens <0xXX>, and BOS is prepended when add_bos is true.
 * Must reproduce formats.md §2.5 exactly (tests/unit/test_tokenizer_model.c).
 *
 * Ownership: a gm_tokenizer owns copies of every token string and its hash tables; it does not
 * keep pointers into the GGUF mapping or JSON it was built from. Returned token-text pointers
 * are borrowed until gm_tokenizer_free.
 * Errors: construction returns GM_ERR_FORMAT naming the source and the bad entry (e.g. missing
 * scores, a merge naming an unknown token) and GM_ERR_UNSUPPORTED for tokenizer.json features
 * we do not implement (named); encode returns GM_ERR_LIMIT when `cap` is too small
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
    int32_t start_of_turn, end_of_turn; /* looked up by text: "<start_of_turn>", "<end_of_turn>"
                                           (Gemma 4's tokenizer: "<|turn>", "<turn|>") */
} gm_special_ids;

/* Builds from parallel arrays (as stored in GGUF). tokens[i] has length lens[i] (not
 * NUL-terminated). scores and types may not be NULL. Everything is copied. Merge priority is
 * vocabulary order (see above); scores are only checked (a warning is logged when normal
 * tokens' scores do not fall with the id, i.e. when the two orders could disagree).
 * special.start_of_turn / end_of_turn are ignored and looked up by text. Errors name
 * "vocabulary" and the bad index (token type outside 0..6, special id out of range). */
gm_status gm_tokenizer_from_vocab(int64_t n, const char *const *tokens, const uint64_t *lens,
                                  const float *scores, const int32_t *types,
                                  gm_special_ids special, bool add_bos, bool add_space_prefix,
                                  gm_tokenizer **out, gm_error *err);

/* Builds from a GGUF file already opened (reads the tokenizer.ggml.* keys: tokens, scores,
 * token_type, bos/eos/unknown/padding_token_id, add_bos_token, add_space_prefix).
 * tokenizer.ggml.model must be "llama" (SentencePiece) else GM_ERR_UNSUPPORTED. A missing
 * required key (tokens, scores, token_type, bos_token_id, eos_token_id), a key of the wrong
 * type, arrays of different lengths or a token type out of range give GM_ERR_FORMAT naming the
 * GGUF path and the key. */
struct gm_gguf;
gm_status gm_tokenizer_from_gguf(const struct gm_gguf *g, gm_tokenizer **out, gm_error *err);

/* Builds from a Hugging Face tokenizer.json (+ optional tokenizer_config.json beside it for
 * add_bos_token and the bos/eos/pad token names; may be NULL). Supported: model BPE with
 * vocab, merges ("a b" strings or ["a","b"] pairs), byte_fallback, fuse_unk, ignore_merges;
 * added_tokens (special -> CONTROL, else USER_DEFINED; normalized, lstrip, rstrip honoured);
 * normalizer null, Replace(" " -> "▁") or Sequence[Prepend("▁"), Replace(" " -> "▁")];
 * pre_tokenizer null or Split(" ", MergedWithPrevious) (a no-op after that normalizer);
 * post_processor null or TemplateProcessing that prepends one special token (BOS).
 * Anything else is GM_ERR_UNSUPPORTED naming the file and the feature; malformed JSON or
 * entries are GM_ERR_FORMAT naming the file and the entry. */
gm_status gm_tokenizer_from_hf_json(const char *tokenizer_json_path,
                                    const char *tokenizer_config_path, gm_tokenizer **out,
                                    gm_error *err);

/* Writes a tokenizer built from a GGUF vocabulary as a Hugging Face tokenizer in folder `dir`
 * (which must exist): tokenizer.json - model BPE with the vocabulary (ids as here, space runs
 * spelled with "▁"), byte_fallback, fuse_unk, and the merges that give exactly this tokenizer's
 * priority (every split of a token into two vocabulary entries, by the merged token's id, then
 * the longer left part; 514,906 for Gemma 3), Gemma's normalizer / pre-tokenizer / decoder, a BOS
 * post-processor when add_bos, CONTROL and UNKNOWN tokens as special added tokens and USER_DEFINED
 * ones as plain added tokens - what transformers builds from the same GGUF - and
 * tokenizer_config.json (add_bos_token, the bos/eos/pad/unk names, `chat_template` when not NULL,
 * tokenizer_class GemmaTokenizer). Both files written atomically.
 * Errors: GM_ERR_UNSUPPORTED for a tokenizer read from a tokenizer.json (copy that file) or a
 * token holding a NUL byte, GM_ERR_NOMEM, GM_ERR_IO naming the file. */
gm_status gm_tokenizer_save_hf(const gm_tokenizer *tok, const char *dir, const char *chat_template, gm_error *err);

void gm_tokenizer_free(gm_tokenizer *tok);

/* Encodes `len` bytes of UTF-8 text into ids[0..*n_out). add_bos: prepend BOS (if the tokenizer
 * has one). parse_special: recognise CONTROL token texts such as "<start_of_turn>" in the text
 * (user-defined tokens are always recognised). Returns GM_ERR_LIMIT if cap is too small. */
gm_status gm_tokenizer_encode(const gm_tokenizer *tok, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, int64_t cap, int64_t *n_out,
                              gm_error *err);

/* Writes the text of `id` to buf (NUL-terminated, truncated at cap). NORMAL and USER_DEFINED
 * tokens turn "▁" back into spaces; BYTE tokens give the raw byte; CONTROL, UNKNOWN and UNUSED
 * tokens give their text only when render_special (else nothing). An id out of range gives
 * nothing. Returns the number of bytes the full piece needs (may exceed cap - 1). */
size_t gm_tokenizer_decode_piece(const gm_tokenizer *tok, int32_t id, bool render_special,
                                 char *buf, size_t cap);

/* Encodes into a gm_malloc'd array (*ids, caller frees with gm_free) of *n_out ids. */
gm_status gm_tokenizer_encode_alloc(const gm_tokenizer *tok, const char *text, size_t len,
                                    bool add_bos, bool parse_special, int32_t **ids,
                                    int64_t *n_out, gm_error *err);

/* Decodes a whole id sequence into a gm_malloc'd NUL-terminated string (*out). Runs of byte
 * tokens are joined first, so multi-byte UTF-8 characters split over byte tokens come out
 * whole; a run that is not valid UTF-8 gives one U+FFFD per byte token (as Hugging Face's
 * ByteFallback decoder). Ids out of range are GM_ERR_INVALID. */
gm_status gm_tokenizer_decode(const gm_tokenizer *tok, const int32_t *ids, int64_t n,
                              bool render_special, char **out, gm_error *err);

int64_t gm_tokenizer_vocab_size(const gm_tokenizer *tok);
/* Whether the source asks for BOS by default (GGUF add_bos_token; tokenizer.json
 * post-processor or tokenizer_config add_bos_token). Callers pass it as encode's add_bos. */
bool gm_tokenizer_add_bos(const gm_tokenizer *tok);
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
