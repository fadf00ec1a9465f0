/*
 * gm_vision.h - the image path of a multimodal Gemma 3: preprocessed pixels through the SigLIP
 * tower and the projector (core/arch/siglip.c) into soft tokens in the text width, and the
 * attention ends that let each image's soft tokens see their whole image.
 *
 * A gm_vision runs the tower's one definition in the graph's encoder mode (gm_graph.h: no KV
 * cache, every patch of an image sees every other) on up to max_images images per call, with the
 * tower's weights as stored. Memory: gm_vision_new plans every buffer for max_images images on
 * a measuring arena, then allocates once (the arena protocol of gm_arena.h); encoding allocates
 * nothing.
 *
 * Ownership: borrows the model (which must outlive it) and a given backend; owns its arenas,
 * graph, weights table and, when none was given, its CPU backend.
 * Errors: gm_vision_new returns GM_ERR_INVALID for a model without a vision tower (naming the
 * checkpoint), GM_ERR_NOMEM with the planned size; gm_vision_encode returns GM_ERR_INVALID for
 * more images than planned, GM_ERR_DEVICE for a device failure. Thread-safety: one per thread.
 */
#ifndef GM_VISION_H
#define GM_VISION_H

#include "gm_arch.h"
#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_graph.h"
#include "gm_model.h"
#include "gm_status.h"
#include "gm_weights.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_vision {
    const gm_model *tower;      /* the multimodal model's vision part (gm_model.vision); NULL: a plan */
    gm_config tcfg;             /* the tower's config (gm_config_vision_tower) */
    gm_backend *be, *owned_be;
    gm_weights w;
    gm_graph g;
    gm_arena arena, host;
    gm_siglip_head_bufs head;   /* backend memory */
    float *patches;             /* (max_images * P, 3 p p) backend */
    float *host_patches;        /* the same, host staging */
    int64_t max_images;
    int64_t image_size, patch_size, side; /* S, p, S / p */
    int64_t P;                  /* patches per image, side^2 */
    int64_t tokens;             /* soft tokens per image */
    int64_t C, C_text;          /* tower width, text width */
    gm_dtype stored;            /* a plan (tower NULL): the dtype the checkpoint stores the tower's
                                   matrices in (gm_vision_init: bf16, as the hub's files) */
} gm_vision;

/* Plans and allocates the image path of multimodal model m for up to max_images images per call,
 * on backend be (NULL: a CPU backend of its own with n_threads threads). */
gm_status gm_vision_new(const gm_model *m, int64_t max_images, int n_threads, gm_backend *be, gm_vision **out,
                        gm_error *err);
void gm_vision_free(gm_vision *v);

/* The same path inside another owner's arenas (the trainer's): describe it for multimodal config
 * mm (and, when not NULL, its model's tower `tower`: m->vision), then run gm_vision_layout in each
 * pass of the owner's arena protocol (a = backend arena, host = host staging). be may be NULL
 * for a plan; a plan sizes the tower's weights as stored in v->stored (set it between the two
 * calls for another dtype). gm_vision_release frees the tables (not the arenas). */
gm_status gm_vision_init(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images, int n_threads,
                         gm_backend *be, gm_error *err);
gm_status gm_vision_layout(gm_vision *v, gm_arena *a, gm_arena *host, gm_error *err);
void gm_vision_release(gm_vision *v);

/* Runs n images (pixels (n, 3, S, S) host) through the tower and projector; the soft tokens stay
 * in backend memory at v->head.out (n * tokens, C_text). */
gm_status gm_vision_run(gm_vision *v, const float *pixels, int64_t n, gm_error *err);

/* Soft tokens of n images: pixels (n, 3, S, S) host f32, preprocessed as Gemma 3's image processor
 * does (core/image: resized to S x S, rescaled, normalized to [-1, 1]); out (n, tokens, C_text)
 * host. hidden (n, P, C) host, or NULL: the tower's last_hidden_state (after post_layernorm). */
gm_status gm_vision_encode(gm_vision *v, const float *pixels, int64_t n, float *out, float *hidden, gm_error *err);

/* The attention ends of a multimodal sequence (gm_graph_input.kv_end): ids (B, T) at positions
 * pos0 .. pos0+T-1; a run of consecutive image_token_id tokens is one image, whose tokens see
 * the whole run (kv_end = the run's end), every other token is causal (kv_end = its position + 1).
 * Hugging Face's token_type_ids mask (get_block_sequence_ids_for_mask, gemma_architecture.md
 * §2.4). Returns the number of images found. */
int64_t gm_mm_kv_end(const int32_t *ids, int64_t B, int64_t T, int32_t image_token_id, int64_t pos0, int32_t *kv_end);

#ifdef __cplusplus
}
#endif
#endif /* GM_VISION_H */
