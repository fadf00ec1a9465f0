/*
 * gm_vision.h - the image path of a multimodal Gemma 3 or Gemma 4: preprocessed pixels through the
 * tower and its projector (core/arch/siglip.c: SigLIP and Gemma 3's projector; core/arch/
 * gemma4_vision.c: Gemma 4's tower and embed_vision, picked by the tower config's arch) into soft
 * tokens in the text width, and the attention ends that let each image's soft tokens see their
 * whole image.
 *
 * A gm_vision runs the tower's one definition in the graph's encoder mode (gm_graph.h: no KV
 * cache, every patch of an image sees every other) on up to max_images images per call, with the
 * tower's weights as stored and, for a trained image path read back (gm_vision_new_adapted), the
 * adapter's LoRA on the tower and its projector. Memory: gm_vision_new plans every buffer for max_images images on
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
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_status.h"
#include "gm_weights.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What of the image path trains (the trainer's options vision_targets and modules_to_save):
 * lora - adapters on the tower's linears (its targets are matched on the tower's module names,
 * "model.vision_tower.encoder.layers.N.self_attn.q_proj" as PEFT names them on transformers 5's
 * Gemma3ForConditionalGeneration), or NULL; projector - the projector's weight and RMSNorm
 * trained fully (PEFT's modules_to_save = ["multi_modal_projector"]). */
typedef struct gm_vision_train {
    const gm_lora_config *lora;
    bool projector;
} gm_vision_train;

/* A trained tensor of the image path with its gradient and AdamW moments (backend memory):
 * n floats, shape as PEFT saves it; decay false for the RMSNorm weight (Hugging Face's Trainer
 * exempts norm weights from weight decay). */
typedef struct gm_vision_param {
    char name[160];          /* PEFT key: base_model.model.model.multi_modal_projector.<...> */
    float *p, *d, *m, *v;
    int64_t n, shape[2];
    int ndim;
    bool decay;
} gm_vision_param;

#define GM_VISION_PROJ_PARAMS 2
/* The most images one call of the image path takes. */
#define GM_VISION_MAX_IMAGES 256

/* The projector's PEFT module prefix (transformers 5's Gemma3ForConditionalGeneration) and the
 * tower's (module names "<prefix>layers.N.self_attn.q_proj"). */
#define GM_VISION_PROJECTOR_PREFIX "base_model.model.model.multi_modal_projector."
#define GM_VISION_TOWER_PREFIX "model.vision_tower.encoder."

/* A trained image path read back (gm_adapter.vision), for inference: tower - LoRA on the tower's
 * linears (modules under GM_VISION_TOWER_PREFIX), or NULL; proj_w (C, C_text) and proj_norm_w (C,
 * PEFT's mm_soft_emb_norm.weight w: the RMSNorm scales by 1 + w) - the trained projector, or both
 * NULL. All backend memory, on the backend the image path runs on; borrowed. */
typedef struct gm_vision_adapter {
    const gm_lora *tower;
    const float *proj_w;
    const float *proj_norm_w;
} gm_vision_adapter;

typedef struct gm_vision {
    const gm_model *tower;      /* the multimodal model's vision part (gm_model.vision); NULL: a plan */
    gm_config tcfg;             /* the tower's config (gm_config_vision_tower) */
    gm_backend *be, *owned_be;
    gm_weights w;
    gm_graph g;
    gm_arena arena, host;
    gm_siglip_head_bufs head;   /* backend memory */
    bool g4;                    /* Gemma 4's tower (core/arch/gemma4_vision.c), else SigLIP */
    int64_t P_max, tokens_max;  /* patches and soft tokens of the largest image planned for (Gemma 4:
                                   any grid within max_soft_tokens; SigLIP: P, tokens) */
    int32_t *host_xy;           /* Gemma 4: (2, max_images * P_max) host, the patches' columns then rows */
    int32_t *host_pool_src;     /* Gemma 4: (max_images * tokens_max, k^2) host, each soft token's patch rows */
    int64_t *host_lens;         /* Gemma 4: (max_images) host, each image's patches */
    int64_t soft_off[GM_VISION_MAX_IMAGES + 1]; /* the last run's image i's soft tokens are rows
                                   soft_off[i] .. soft_off[i + 1] of head.out */
    int64_t n_soft;             /* soft-token rows of the last run */
    float *patches;             /* (max_images * P, 3 p p) backend */
    float *host_patches;        /* the same, host staging */
    int64_t max_images;
    int64_t image_size, patch_size, side; /* S, p, S / p */
    int64_t P;                  /* patches per image, side^2 */
    int64_t tokens;             /* soft tokens per image */
    int64_t C, C_text;          /* tower width, text width */
    /* training (gm_vision_init with a gm_vision_train): */
    bool train_tower;           /* adapters on the tower: the graph keeps its records, backward runs */
    bool train_proj;            /* the projector is trained: proj, norm below */
    gm_lora lora;               /* the tower's adapters (n = 0 when none) */
    gm_vision_adapter ad;       /* inference with a trained image path (gm_vision_new_adapted);
                                   zero when none */
    gm_vision_param proj[GM_VISION_PROJ_PARAMS]; /* [0] mm_input_projection_weight (C, C_text),
                                                   [1] mm_soft_emb_norm.weight w (C) */
    float *norm_scale;          /* (C): 1 + w, what the RMSNorm multiplies by (a trained or an
                                   adapter's projector) */
    float *dsoft;               /* (max_images * tokens, C_text): dL/d soft tokens, the caller's */
    int64_t n_encoded;          /* images run through the tower so far (a counter, for tests and
                                   reports) */
    gm_dtype stored;            /* a plan (tower NULL): the dtype the checkpoint stores the tower's
                                   matrices in (gm_vision_init: bf16, as the hub's files) */
} gm_vision;

/* Plans and allocates the image path of multimodal model m for up to max_images images per call,
 * on backend be (NULL: a CPU backend of its own with n_threads threads). */
gm_status gm_vision_new(const gm_model *m, int64_t max_images, int n_threads, gm_backend *be, gm_vision **out,
                        gm_error *err);
/* The same with a trained image path `ad` (its buffers on be, which must then be given; ad NULL:
 * gm_vision_new): the encoder runs the tower's adapters (inference, no dropout) and the head uses
 * the adapter's projector. GM_ERR_INVALID for a tower adapter of another tower shape. */
gm_status gm_vision_new_adapted(const gm_model *m, int64_t max_images, int n_threads, gm_backend *be,
                                const gm_vision_adapter *ad, gm_vision **out, gm_error *err);
void gm_vision_free(gm_vision *v);

/* The same path inside another owner's arenas (the trainer's): describe it for multimodal config
 * mm (and, when not NULL, its model's tower `tower`: m->vision), then run gm_vision_layout in each
 * pass of the owner's arena protocol (a = backend arena, host = host staging). be may be NULL
 * for a plan; a plan sizes the tower's weights as stored in v->stored (set it between the two
 * calls for another dtype). gm_vision_release frees the tables (not the arenas). */
gm_status gm_vision_init(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images, int n_threads,
                         gm_backend *be, gm_error *err);
/* The same for training: what `t` selects learns (t NULL or selecting nothing: frozen, as
 * gm_vision_init); checkpointing keeps only each tower layer's input and recomputes its record
 * before the backward. GM_ERR_INVALID when t->lora's targets select no module of the tower. */
gm_status gm_vision_init_train(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images,
                               const gm_vision_train *t, bool checkpointing, int n_threads, gm_backend *be, gm_error *err);
/* After the allocating layout pass: PEFT's initial tower adapters (A uniform, B zero), the
 * projector's trained copies from the model's weights, zero gradients and moments. */
gm_status gm_vision_init_params(gm_vision *v, gm_error *err);
/* Backward of the last gm_vision_run from v->dsoft (images x tokens, C_text; backend): the
 * projector's gradients and the tower adapters' accumulate. Only for a trained image path. */
void gm_vision_backward(gm_vision *v);
/* After a trained projector's optimizer step: norm_scale = 1 + w. */
void gm_vision_params_updated(gm_vision *v);
gm_status gm_vision_layout(gm_vision *v, gm_arena *a, gm_arena *host, gm_error *err);
void gm_vision_release(gm_vision *v);

/* Runs n images (pixels (n, 3, S, S) host) through the tower and projector; the soft tokens stay
 * in backend memory at v->head.out (n * tokens, C_text). */
gm_status gm_vision_run(gm_vision *v, const float *pixels, int64_t n, gm_error *err);
/* The same on images which[0..n) of pixels (which NULL: 0..n-1); soft tokens of which[i] at row
 * i * tokens of v->head.out. */
gm_status gm_vision_run_some(gm_vision *v, const float *pixels, const int64_t *which, int64_t n, gm_error *err);

/* Gemma 4: n images of their own sizes (the aspect-preserving grids of Gemma4ImageProcessor): image
 * i (3, hw[2i], hw[2i+1]) pixels, normalized as gm_vision_encode's, sides multiples of pool x patch
 * pixels and at most P_max patches, stored one after the other in pixels. Its soft tokens stay at
 * head.out rows soft_off[i] .. soft_off[i + 1] (gm_vision_encode_grids: downloaded into out, n_soft
 * rows of C_text). GM_ERR_INVALID naming the image for a size the tower cannot take, and for a
 * SigLIP tower. */
gm_status gm_vision_run_grids(gm_vision *v, const float *pixels, const int64_t *hw, int64_t n, gm_error *err);
/* The same with image i at imgs[i] (wherever it is). */
gm_status gm_vision_run_images(gm_vision *v, const float *const *imgs, const int64_t *hw, int64_t n, gm_error *err);
gm_status gm_vision_encode_grids(gm_vision *v, const float *pixels, const int64_t *hw, int64_t n, float *out, gm_error *err);

/* Soft tokens of n images: pixels (n, 3, S, S) host f32, preprocessed as Gemma 3's image processor
 * does (core/image: resized to S x S, rescaled, normalized to [-1, 1]; for Gemma 4 the resize is
 * bicubic and [-1, 1] is the model's own 2 (x - 0.5)); out (n, tokens, C_text) host. hidden (n, P, C)
 * host, or NULL: the tower's last_hidden_state (SigLIP: after post_layernorm; Gemma 4: the encoder's
 * output before pooling). */
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
