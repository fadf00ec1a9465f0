/*
 * gm_chat.h - Gemma's chat templates (gemma_architecture.md §2.5, §4.7, formats.md §2.4) and the
 * response-start finder used by the training loss.
 *
 * Two formats, chosen by the tokenizer's own control tokens (gm_chat_format_of):
 * GM_CHAT_GEMMA3 (Gemma 3 and 3n) follows the Gemma 3 Jinja template: per message
 *   <start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n
 * with "assistant" renamed "model"; a leading system message is not a turn - its text (not
 * trimmed, as in the template) plus "\n\n" is put in front of the first user turn's content;
 * after it, roles must alternate user, model, user, ...; the optional generation prompt is
 * <start_of_turn>model\n.
 * GM_CHAT_GEMMA4 (a tokenizer with "<|turn>" and "<turn|>"): per message
 *   <|turn>{system|user|model}\n{content, trimmed}<turn|>\n
 * - a system message is a turn of its own - and the generation prompt <|turn>model\n. Gemma 4's
 * published template was not among the sources (gemma_architecture.md §4.7-4.8): this is the turn
 * structure public Gemma 4 prompt builders write (no thinking channel: the model turn's text is
 * the answer, as in the story's fine-tuning data).
 * The rendered text does NOT start with "<bos>" (the template's first token): encode it with
 * gm_tokenizer_encode(..., add_bos = true, parse_special = true), which prepends BOS as an id.
 * Writing "<bos>" into the text as well would give two BOS tokens. Note that parse_special also
 * turns a literal "<start_of_turn>" typed inside a message into the control token, exactly as
 * Hugging Face does.
 *
 * Ownership: gm_chat_render returns a gm_malloc'd string the caller frees with gm_free;
 * gm_chat_encode returns a gm_malloc'd id array likewise. Messages are only read.
 * Errors: GM_ERR_INVALID naming the message index for an unknown role, a system message that
 * is not first or not followed by a user message, roles that do not alternate, or a NULL
 * content; GM_ERR_NOT_FOUND when a sequence has no model turn. Reentrant.
 */
#ifndef GM_CHAT_H
#define GM_CHAT_H

#include "gm_status.h"
#include "gm_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_chat_format { GM_CHAT_GEMMA3 = 0, GM_CHAT_GEMMA4 = 1 } gm_chat_format;

/* The format a tokenizer's model is prompted in: GM_CHAT_GEMMA4 when it has both "<|turn>" and
 * "<turn|>", else GM_CHAT_GEMMA3 (also for tok NULL). */
gm_chat_format gm_chat_format_of(const gm_tokenizer *tok);

/* One chat message. role: "system", "user", "assistant" or "model"; content: UTF-8 text. */
typedef struct gm_chat_msg {
    const char *role;
    const char *content;
} gm_chat_msg;

/* ---- rendering ---- */

/* Gemma 3's chat template as Jinja, the "chat_template" string of google/gemma-3-*-it's
 * tokenizer_config.json that gm_chat_render implements: written into exported Hugging Face
 * folders (core/store/gm_merged.h) whose base carries no template of its own. */
extern const char gm_chat_gemma3_jinja[];
/* The GM_CHAT_GEMMA4 format written as a Jinja template (the same text gm_chat_render writes),
 * for exported folders of a Gemma 4 base that carries no template of its own. */
extern const char gm_chat_gemma4_jinja[];

/* Renders msgs[0..n) as Gemma chat text in format fmt (without <bos>, see above) into *out
 * (gm_malloc'd, NUL-terminated; length in *len_out if not NULL). add_generation_prompt appends
 * the format's model-turn opening ("<start_of_turn>model\n", "<|turn>model\n"). n == 0 gives ""
 * (or just the generation prompt). */
gm_status gm_chat_render(gm_chat_format fmt, const gm_chat_msg *msgs, int64_t n, bool add_generation_prompt,
                         char **out, size_t *len_out, gm_error *err);

/* Renders in tok's format (gm_chat_format_of) and encodes with BOS and parse_special: *ids is
 * gm_malloc'd, *n_ids long. */
gm_status gm_chat_encode(const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n,
                         bool add_generation_prompt, int32_t **ids, int64_t *n_ids,
                         gm_error *err);

/* ---- response start ---- */

/* Index just after the LAST occurrence of pat[0..m) in ids[0..n) (searching from the end), or
 * -1 if it does not occur (or m <= 0). */
int64_t gm_chat_find_after_last(const int32_t *ids, int64_t n, const int32_t *pat, int64_t m);

/* Where the model's response starts in a chat token sequence: the position right after the
 * last model-turn opening of tok's format ("<start_of_turn>model\n": its token sequence under
 * `tok`, e.g. 105 4368 107 for Gemma 3; "<|turn>model\n" for Gemma 4).
 * The training loss covers ids[*start..n). GM_ERR_NOT_FOUND (and *start = -1) when the
 * sequence has no model turn. */
/* The model turns of a chat token sequence BEFORE the last one (the last is gm_chat_response_
 * start's, to the end): for each, [start, end) with start right after its model-turn opening and
 * end at the next turn opening (so its text, the turn's end and the "\n" after it, as
 * the last turn's run to the end). *spans is gm_malloc'd (NULL when *n_spans = 0). Every model
 * turn is supervised in training (TRL's assistant-only loss), not only the last. Errors:
 * GM_ERR_NOMEM, the tokenizer's. */
gm_status gm_chat_earlier_model_turns(const gm_tokenizer *tok, const int32_t *ids, int64_t n, int64_t (**spans)[2],
                                      int64_t *n_spans, gm_error *err);

gm_status gm_chat_response_start(const gm_tokenizer *tok, const int32_t *ids, int64_t n,
                                 int64_t *start, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_CHAT_H */
