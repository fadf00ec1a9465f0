/*
 * gm_generate.h - text generation: prefill, then one token at a time, greedy or sampled.
 *
 * Sampling follows the usual order (as transformers' generate applies its logits processors):
 * temperature, then top-k, then top-p (nucleus), then a draw from the renormalized
 * distribution with the counter-based RNG (gm_rng.h), so a seed gives the same text whatever
 * the thread count. temperature <= 0 means greedy (argmax; ties go to the lowest id).
 *
 * Ownership: the caller owns out_ids (capacity max_new_tokens). The gm_infer state is borrowed
 * and reset at the start. Errors: GM_ERR_INVALID (prompt longer than the planned context),
 * anything gm_decoder_forward returns, GM_ERR_NONFINITE when the logits are NaN/Inf (corrupt
 * weights), GM_ERR_INTERRUPTED when opts->interrupt was raised (the tokens so far are kept in
 * out_ids / n_out). A callback returning false stops early and is not an error.
 */
#ifndef GM_GENERATE_H
#define GM_GENERATE_H

#include "gm_decoder.h"
#include "gm_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_sample_opts {
    int64_t max_new_tokens;  /* stop after this many new tokens */
    float temperature;       /* <= 0: greedy */
    int top_k;               /* 0: off (default 64 in Gemma's generation_config) */
    float top_p;             /* 1: off (Gemma default 0.95) */
    uint64_t seed;
    const int32_t *stop_ids; /* generation stops after emitting one of these (kept in the output) */
    int n_stop;
    const volatile int *interrupt; /* optional: nonzero stops between prefill chunks and tokens */
} gm_sample_opts;

/* Checks that a generation fits the model: n_prompt >= 1, max_new_tokens >= 1 and
 * n_prompt + max_new_tokens <= max_position_embeddings (without overflow). GM_ERR_INVALID
 * with the numbers and a hint otherwise. */
gm_status gm_generate_check(const gm_config *cfg, int64_t n_prompt, int64_t max_new_tokens, gm_error *err);

/* Called after each new token; return false to stop. */
typedef bool (*gm_token_cb)(int32_t token, void *user);

typedef struct gm_generate_stats {
    int64_t n_prompt, n_generated;
    double prefill_seconds, decode_seconds;
} gm_generate_stats;

/* Picks the next token from logits (V) according to opts; `step` indexes the RNG stream. */
int32_t gm_sample_token(const float *logits, int64_t V, const gm_sample_opts *opts, uint64_t step,
                        float *work);

gm_status gm_generate(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_sample_opts *opts,
                      gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                      gm_generate_stats *stats, gm_error *err);

/* gm_generate for a prompt holding images (a multimodal model): soft (n_soft, C) host rows, the
 * images' soft tokens (gm_vision_encode), replace the prompt's rows soft_rows (its image_token_id
 * runs), and each image's tokens see the whole image (gm_mm_kv_end). The prompt is prefilled in
 * one call: GM_ERR_INVALID when it is longer than the state's tokens per call. */
gm_status gm_generate_images(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const float *soft,
                             const int64_t *soft_rows, int64_t n_soft, int32_t image_token_id, const gm_sample_opts *o,
                             gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out, gm_generate_stats *stats,
                             gm_error *err);

struct gm_mm_hard;
/* What a prompt holds besides text tokens: soft (n_soft, C) host rows replacing the prompt's rows
 * soft_rows (an encoder's soft tokens: images, audio clips); image_token_id, whose runs see their
 * whole image (gm_mm_kv_end; < 0: every token causal, as in Gemma 3n); hard, Gemma 3n's hard
 * multimodal tokens (gm_mm_embed.h: <end_of_audio>, ...) placed from their embedders, or NULL. */
typedef struct gm_prompt_media {
    const float *soft;
    const int64_t *soft_rows;
    int64_t n_soft;
    int32_t image_token_id;
    const struct gm_mm_hard *hard;
} gm_prompt_media;

/* gm_generate for a prompt with media (pm), prefilled in one call (GM_ERR_INVALID when longer than
 * the state's tokens per call). gm_generate_images is this with images. */
gm_status gm_generate_media(gm_infer *st, const int32_t *prompt, int64_t n_prompt, const gm_prompt_media *pm,
                            const gm_sample_opts *o, gm_token_cb cb, void *user, int32_t *out_ids, int64_t *n_out,
                            gm_generate_stats *stats, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_GENERATE_H */
