/*
 * gm_data.h - training examples: chat conversations tokenized up front, response-only targets,
 * batches; and the built-in real data set (Debian fortunes).
 *
 * An example is one conversation rendered with Gemma's chat template and tokenized once, before
 * any training step: ids (n tokens, BOS first) and the index of the first response token, found
 * as the position after the LAST "<start_of_turn>model\n" (searching from the end, because image
 * or audio placeholders change the prompt length; core/text/gm_chat.h). Position t predicts
 * ids[t+1]; it is supervised when ids[t+1] belongs to a model turn: the last (the response, to
 * the end) and, in a multi-turn chat, every earlier one (its text, <end_of_turn> and newline; as
 * TRL's assistant-only loss). Examples longer than max_length are truncated on the right; an
 * example whose last response would lose every token is rejected with its reason, never
 * silently kept.
 *
 * Ownership: a gm_dataset owns its examples (ids arrays, texts, labels, image references).
 * gm_batch_collate and gm_batch_images write into caller buffers ((B, T); max_images x 3 x S x S).
 * A gm_image_check_cache is owned by its creator (gm_image_check_cache_new / _free) and used by
 * one thread at a time. Errors: GM_ERR_INVALID naming the example (index, and its
 * label if any) and the reason; GM_ERR_IO naming the file for unreadable data.
 */
#ifndef GM_DATA_H
#define GM_DATA_H

#include "gm_chat.h"
#include "gm_image.h"
#include "gm_status.h"
#include "gm_tokenizer.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_example {
    int32_t *ids;          /* (n) tokens, BOS first */
    int64_t n;
    int64_t response_start; /* index of the first response token in ids */
    int32_t label;         /* class index for classification sets, -1 otherwise */
    /* images (multimodal), in the order of their soft-token runs in ids: file paths and the
     * sha256 of each file (64 hex digits; part of the data set's identity), owned */
    char **images, **image_sha;
    int64_t n_images;
    /* pan & scan (gm_image_opts.pan_and_scan): per image the number of its crops, each crop one
     * more soft-token run in ids right after its image's (transformers' Gemma3Processor); NULL:
     * pan & scan off, each image one run. Owned. */
    int64_t *crops;
    /* Gemma 4: per image its soft tokens (its aspect-preserving grid's cells, gm_mm_image_tokens);
     * NULL: the spec's tokens each. Owned. */
    int64_t *image_tokens;
    /* the model turns before the last (multi-turn chats; gm_chat_earlier_model_turns): [start,
     * end) token spans, supervised as the last turn is; NULL and 0 for one model turn, owned */
    int64_t (*turns)[2];
    int64_t n_turns;
    /* audio clips (Gemma 3n), in the order of their soft-token runs in ids: file paths and each
     * file's sha256 (part of the data set's identity), owned */
    char **audio, **audio_sha;
    int64_t n_audio;
} gm_example;

/* How a multimodal model takes images into its prompt (gemma_architecture.md §2.4): each
 * "<start_of_image>" the chat template writes becomes "\n\n" boi + tokens x image_token + eoi
 * "\n\n" (transformers' Gemma3Processor); with pan & scan an image with crops becomes "Here is
 * the original image " + its block + " and here are some crops to help you see better " + one
 * block per crop, joined by " " (Gemma3Processor.replace_image_token). */
typedef struct gm_mm_spec {
    int32_t boi_id, eoi_id, image_token_id;
    int64_t tokens;        /* soft tokens per image */
    /* Another medium in the same shape (Gemma 3n's audio: each "<start_of_audio>" becomes "\n\n"
     * boa + tokens x audio_soft_token + eoa "\n\n", Gemma3nProcessor's full_audio_sequence): the
     * text marking its place and opening its block (NULL: "<start_of_image>"), the token text
     * closing it ("<end_of_image>"), its soft token's text ("<image_soft_token>") and its name in
     * messages ("image"). gm_mm_spec_audio makes the audio spec of a Gemma 3n config (Gemma 4's:
 * "<start_of_audio>" in messages, "<|audio>" + n x "<|audio|>" + "<audio|>" bare, n per clip). */
    const char *open_text, *close_text, *soft_text, *what;
    /* Gemma 4 (Gemma4Processor.replace_image_token): the placeholder becomes boi_text + close_text
     * with no "\n\n" around (bare); boi_text NULL: open_text is also the opening token's text.
     * image: the model's image processor (gm_mm_image_opts; Gemma 4: bicubic, aspect kept). */
    const char *boi_text;
    bool bare;
    gm_image_opts image;
} gm_mm_spec;

struct gm_config;
/* The image spec of a multimodal config (its ids and soft tokens per image): Gemma 3's
 * "\n\n<start_of_image>...<end_of_image>\n\n" blocks, Gemma 4's bare "<|image>...<image|>" with
 * "<|image|>" soft tokens. Messages mark each image with "<start_of_image>" for both. */
gm_mm_spec gm_mm_spec_image(const struct gm_config *c);
/* The image processor's options of a multimodal config: Gemma 3's (Gemma3ImageProcessor at the
 * tower's side, bilinear); Gemma 4's (Gemma4ImageProcessor: bicubic, each image at its
 * aspect-preserving size within max_soft_tokens x pool^2 patches). */
gm_image_opts gm_mm_image_opts(const struct gm_config *c);
/* Soft tokens of an image of w x h pixels on config c: Gemma 4's of its aspect-preserving grid
 * (gm_image_aspect_size; GM_ERR_INVALID where the processor raises), otherwise the config's
 * tokens per image. */
gm_status gm_mm_image_tokens(const struct gm_config *c, int64_t w, int64_t h, int64_t *tokens, gm_error *err);
/* The audio spec of a Gemma 3n config (its boa / eoa / audio soft token ids and soft tokens per
 * clip). */
gm_mm_spec gm_mm_spec_audio(const struct gm_config *c);

typedef struct gm_dataset {
    gm_example *ex;
    int64_t n, cap;
    int64_t n_rejected;    /* examples refused by gm_dataset_add_chat (reason logged) */
    int64_t n_truncated;   /* examples cut to max_length (response partly kept) */
    gm_image_opts image_opts; /* the processor gm_batch_images runs: the spec's of the last example
                                 added with images (one model per data set) */
} gm_dataset;

void gm_dataset_init(gm_dataset *ds);
void gm_dataset_free(gm_dataset *ds);

/* Renders msgs with the chat template, tokenizes, finds the response start and appends the
 * example (truncated to max_length). Returns GM_ERR_INVALID (the example is not added; the
 * caller decides whether that is fatal) when the response would be empty after truncation or
 * the conversation has no model turn. */
/* The most images one example may hold (a chat's image parts). */
#define GM_MAX_IMAGES_PER_EXAMPLE 64

gm_status gm_dataset_add_chat(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                              int64_t max_length, int32_t label, gm_error *err);

/* The same for a model with a vision tower (mm: its image tokens; NULL: as gm_dataset_add_chat),
 * the conversation with or without images: msgs' text holds one "<start_of_image>" per image
 * (what Gemma's chat template writes for an image item), images[i] / image_sha[i] the i-th image's
 * file and its sha256 (checked by the caller: gm_image_check), crops[i] (crops NULL: pan & scan
 * off) its pan & scan crop count (gm_image_pan_and_scan_crops of the referenced image's size,
 * found by the caller). The placeholders are expanded as mm says. GM_ERR_INVALID (not added) when the placeholders and the images differ in number, when
 * the text itself holds <image_soft_token> (only images fill those), when
 * the tokenizer's <start_of_image> / <end_of_image> are not the config's ids, or when max_length
 * would cut into an image (naming the image, its tokens' span and max_length): truncation never
 * splits an image. tokens[i] (tokens NULL: mm->tokens each): Gemma 4's soft tokens of image i
 * (gm_mm_image_tokens of the referenced image's size, found by the caller). */
gm_status gm_dataset_add_chat_images(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                                     int64_t max_length, int32_t label, const gm_mm_spec *mm, const char *const *images,
                                     const char *const *image_sha, int64_t n_images, const int64_t *crops,
                                     const int64_t *tokens, gm_error *err);

/* The same for audio clips on a Gemma 3n or Gemma 4 model (mm: gm_mm_spec_audio): msgs' text holds
 * one "<start_of_audio>" per clip, audio[i] / audio_sha[i] the i-th clip's file and its sha256
 * (checked by the caller: gm_audio_check); tokens[i] its soft tokens (gm_audio_tokens of its
 * samples: Gemma 4's depend on the clip's length; NULL: mm->tokens each, Gemma 3n's). The same
 * checks and errors, naming clips; max_length never cuts into a clip's block. */
gm_status gm_dataset_add_chat_audio(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                                    int64_t max_length, int32_t label, const gm_mm_spec *mm, const char *const *audio,
                                    const char *const *audio_sha, int64_t n_audio, const int64_t *tokens, gm_error *err);
/* What of a table read by rows (Gemma 3n's per-layer embeddings: `rows` rows of row_bytes each,
 * memory-mapped) the token ids of data sets ds[0..n) make resident: the 64 KiB blocks holding the
 * rows of every id below `rows` they use, and row 0 (what every other id reads), counted once
 * across the data sets - blocks, not pages, because Linux maps the cached pages around a faulting
 * one (fault_around_bytes, 64 KiB by default). Bytes; 0 when out of memory (then: plan the whole
 * table). */
size_t gm_dataset_table_resident(const gm_dataset *const *ds, int n, int64_t rows, size_t row_bytes);
/* The most clips one example of ds has. */
int64_t gm_dataset_max_audio(const gm_dataset *ds);
struct gm_audio_fe;
/* The clips of examples idx[0..B) in batch order, decoded (gm_audio_load, within `max_seconds`
 * each, <= 0: the default limit) and through the feature extractor as one batch (fe: padded to the
 * longest, 30 s at most): features (room for max_clips x max_frames x 128 floats) and valid (room
 * for max_clips x max_frames); *n_clips and *frames receive the batch's clip count and frame
 * count (every clip padded to it). A clip repeated in the batch is decoded once. Errors name the
 * file (it may have changed since the data set was built): GM_ERR_INVALID for more than
 * max_clips clips or frames; the decoder's and the extractor's otherwise. */
gm_status gm_batch_audio(const gm_dataset *ds, const int64_t *idx, int64_t B, const struct gm_audio_fe *fe,
                         double max_seconds, int64_t max_clips, int64_t max_frames, float *features, uint8_t *valid,
                         int64_t *n_clips, int64_t *frames, gm_error *err);
/* Text (a rendered chat, or a raw prompt) with one "<start_of_image>" per image into ids, BOS
 * first, each image expanded as mm says (see gm_dataset_add_chat_images, whose checks it makes;
 * ex_index names the example in messages). *ids_out is gm_malloc'd. */
gm_status gm_mm_encode_text(const gm_tokenizer *tok, const char *text, const gm_mm_spec *mm, int64_t n_images,
                            const int64_t *crops, const int64_t *tokens, int64_t ex_index, int32_t **ids_out, int64_t *n_out,
                            gm_error *err);

/* The images the vision tower sees for example e: its images and their pan & scan crops. */
int64_t gm_example_views(const gm_example *e);

/* The most images one example of ds has, pan & scan crops counted (gm_example_views: what
 * the tower encodes, for planning a micro-batch's image path). */
int64_t gm_dataset_max_images(const gm_dataset *ds);

/* The images of examples idx[0..B) in batch order, each decoded and preprocessed (core/image:
 * Gemma 3's processor, S x S) into pixels (room for max_images x 3 x S x S floats), an image with
 * pan & scan crops (gm_example.crops) followed by its crops in the processor's order; *n_images
 * receives their count (gm_example_views summed). Each image is a reference (gm_image_ref_parse: a file, or a region of
 * one). A reference repeated in the batch (label scoring: one example's images once per
 * candidate) is preprocessed once and copied; consecutive references to one file (the cells of a
 * sprite sheet) decode it once: the last decoded file is kept until another file is needed, so at
 * most one decoded file is held at a time. Errors name the reference (the file may have changed
 * since the data set was built): GM_ERR_INVALID when more than max_images or a region outside its
 * file, or an image whose crop count is no longer the one its tokens were made for; the decoder's
 * errors otherwise. With the data set's Gemma 4 processor (image_opts.max_patches) each image
 * keeps its own size: image j (3, hw[2j], hw[2j+1]) follows the one before it in pixels (room for
 * max_images x gm_mm_image_floats), and an image whose grid no longer gives the soft tokens its
 * example was made with is GM_ERR_INVALID; hw may be NULL for square images (then S x S each). */
gm_status gm_batch_images(const gm_dataset *ds, const int64_t *idx, int64_t B, int64_t S, int64_t max_images,
                          float *pixels, int64_t *hw, int64_t *n_images, gm_error *err);
/* The most floats one preprocessed image of config c takes: 3 S S (Gemma 3), 3 x max_soft_tokens x
 * pool^2 x patch^2 (Gemma 4, any aspect within the budget). */
int64_t gm_mm_image_floats(const struct gm_config *c);

/* What gm_image_check learned of each file within one validation pass, so that the 5,000 cells of
 * one sprite sheet decode and hash it once: per distinct file, its decoded size and the sha256
 * state after its bytes, or the error it gave (a broken sheet is reported for each of its
 * references without being decoded again). Entries stay until gm_image_check_cache_free: a file
 * changed during the pass is not seen. A few hundred bytes per file. */
typedef struct gm_image_check_cache gm_image_check_cache;

/* A new, empty cache (owned: gm_image_check_cache_free), or NULL when out of memory. */
gm_image_check_cache *gm_image_check_cache_new(void);

/* Releases the cache and every entry. NULL is a no-op. */
void gm_image_check_cache_free(gm_image_check_cache *c);

/* Checks an image reference (gm_image_ref_parse: a file, or a region "#xywh=X,Y,W,H" of one):
 * decodes the file completely (a truncated or corrupt file is found here, before training),
 * checks that the region lies inside it, and hashes it: sha_hex (65 chars) is the sha256 of the
 * file's bytes, followed for a region by the region's normalized fragment text
 * (gm_image_ref_fragment, e.g. "#xywh=20,0,20,20"): two cells of one sheet differ, a plain file
 * hashes as its bytes alone. *w / *h receive the decoded FILE's size after EXIF orientation (what
 * the decoder holds, even for a region: the memory plan counts it). cache (NULL: none) keeps each
 * file's decode and hash for the next reference to it. Errors name the reference or the file
 * (core/image/gm_image.h); GM_ERR_NOMEM for the cache. */
gm_status gm_image_check(gm_image_check_cache *cache, const char *ref, char sha_hex[65], int64_t *w, int64_t *h,
                         gm_error *err);

/* The identity of the data actually trained or evaluated on, for provenance: sha256 over every
 * example in order - its token count, response start, label (int64, int64, int32, little-endian)
 * and token ids (int32), and the sha256 of each of its images - as 64 hex digits. Two data sets hash equal iff the model sees the same
 * tokens with the same supervision: an edited file, another tokenizer, max_length or template
 * changes it; a reformatted but equivalent file does not. Errors: GM_ERR_IO if OpenSSL fails. */
gm_status gm_dataset_sha256(const gm_dataset *ds, char hex[65], gm_error *err);

/* Collates examples idx[0..B) into ids/targets (B, T) with T = the longest of them (right-padded
 * with pad_id, targets -1 on padding and prompt). Returns T. */
int64_t gm_batch_collate(const gm_dataset *ds, const int64_t *idx, int64_t B, int32_t pad_id, int32_t *ids,
                         int32_t *targets);

/* ---- built-in real data: Debian's fortunes package ---------------------------------------- */

/* Reads the fortunes of one topic file (/usr/share/games/fortunes/<topic>; entries separated by
 * lines holding only "%"), trimmed, keeping entries of at most max_chars characters. Calls fn for
 * each entry in file order. Returns GM_ERR_IO with an install hint when the file is missing. */
typedef void (*gm_text_fn)(const char *text, size_t len, void *user);
gm_status gm_fortunes_read(const char *dir, const char *topic, size_t max_chars, gm_text_fn fn, void *user,
                           int64_t *n_read, gm_error *err);

/* The default folder of Debian's fortunes package. */
#define GM_FORTUNES_DIR "/usr/share/games/fortunes"

#ifdef __cplusplus
}
#endif
#endif /* GM_DATA_H */
