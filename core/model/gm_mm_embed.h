/*
 * gm_mm_embed.h - Gemma 3n's multimodal embedders' hard tokens, and the lookup of a multimodal
 * checkpoint's tower tensors.
 *
 * Gemma 3n keeps two blocks of ids at the top of its text vocabulary for each tower: vision ids
 * vocab_offset .. + 127 (262,144..: <end_of_image>, <image_soft_token>, ...) and audio ids
 * (262,272..: <end_of_audio>, <audio_soft_token>, ..., 262,399 the padding token of audio soft
 * tokens). Such an id is not embedded by the text table but by its tower's embedder
 * (Gemma3nMultimodalEmbedder, transformers' modeling_gemma3n.py; gemma_architecture.md §3.8):
 *     hard(id) = RMS_noweight(RMS_hard(E[id - offset]) Wproj^T)        (V, C_text)
 * with RMS norms that multiply by their stored weight and the tower config's rms_norm_eps, and no
 * sqrt(C) scale. gm_mm_hard holds both tables, computed once on the host (128 rows each); the
 * caller places their rows into a prompt as soft tokens are placed (gm_graph_input.ptr_embeds), so
 * the one graph serves both. Soft-token placeholders (the audio / image soft token ids) are left to the
 * caller, who puts the encoder's soft tokens there.
 *
 * Ownership: gm_mm_hard owns its tables (gm_mm_hard_free). Errors: GM_ERR_NOT_FOUND /
 * GM_ERR_FORMAT naming the checkpoint and the tensor, GM_ERR_UNSUPPORTED (a dtype other than
 * f32 / bf16 / f16), GM_ERR_NOMEM.
 */
#ifndef GM_MM_EMBED_H
#define GM_MM_EMBED_H

#include "gm_model.h"
#include "gm_safetensors.h"
#include "gm_status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The tensor "<root><module><name>" of multimodal model m's checkpoint, root "model." (transformers
 * 5 and the hub's Gemma 3n files) or "", checked to be f32 / bf16 / f16 of shape (shape[0..nd-1]).
 * *out borrows m's mapping; gm_dequant_row (kernels.h) widens its elements to f32. */
gm_status gm_mm_tensor(const gm_model *m, const char *module, const char *name, int nd, const int64_t *shape,
                       const gm_st_tensor **out, gm_error *err);

typedef struct gm_mm_hard_range {
    int64_t offset, V;   /* ids offset .. offset + V - 1 */
    int32_t soft_id;     /* the soft-token placeholder among them (left to the caller) */
    float *table;        /* (V, C) host, gm_malloc'd */
} gm_mm_hard_range;

typedef struct gm_mm_hard {
    int64_t C;                  /* the text width */
    int n;                      /* ranges held (0: a model without embedders) */
    gm_mm_hard_range r[2];      /* vision, audio (those whose config and tensors exist) */
} gm_mm_hard;

/* Computes the hard-token tables of Gemma 3n model m (a Gemma3nForConditionalGeneration folder:
 * embed_vision.* and embed_audio.*; a tower without a config, or whose ids lie past the text
 * vocabulary, is skipped). Other models: n = 0. */
gm_status gm_mm_hard_load(const gm_model *m, gm_mm_hard *out, gm_error *err);
void gm_mm_hard_free(gm_mm_hard *h);

/* The embedding (C floats, borrowed) of id when it is a hard multimodal token, else NULL. */
const float *gm_mm_hard_row(const gm_mm_hard *h, int32_t id);

/* For ids (N), writes to ptrs / rows (room for cap) every position holding a hard multimodal
 * token other than a soft-token placeholder, with a pointer to its embedding (borrowed from h):
 * what gm_graph_input's ptr_embeds / ptr_rows take. Returns how many (at most cap: the caller
 * sizes cap as N). */
int64_t gm_mm_hard_place(const gm_mm_hard *h, const int32_t *ids, int64_t N, const float **ptrs, int64_t *rows, int64_t cap);

#ifdef __cplusplus
}
#endif
#endif /* GM_MM_EMBED_H */
