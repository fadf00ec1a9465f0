/*
 * gm_plan.h - the memory planner: the peak a training run needs, known before any weight is
 * loaded, itemized.
 *
 * A plan needs only a model config (GGUF metadata, a Hugging Face config.json or a built-in
 * preset of the published sizes: gm_config_preset) and the training options. For Gemma 3 - the
 * graph gemmarun trains - the plan IS the trainer's own layout: gm_train_plan runs the same layout
 * function the trainer allocates with, on a measuring arena, so planned and allocated bytes are
 * equal by construction; the plan adds the base weights the trainer reads in place (memory-mapped
 * file pages that become resident) and the process's own runtime (code, libraries, tokenizer,
 * BLAS buffers). For Gemma 3n and Gemma 4, which gemmarun cannot train yet, the plan applies the
 * same per-token accounting to their parts (per-layer embeddings, AltUp streams, KV sharing,
 * double-wide and mixture-of-experts FFNs, vision and audio towers) and says it is an estimate.
 *
 * Items (gm_mem_kind): base weights, adapters, gradients, optimizer state, saved activations,
 * largest transient (attention scores, LM-head logits chunk), workspace, plus `runtime`, and for a
 * Gemma 3 run with images `vision tower` (gm_plan_tower: the tower's weights, its forward buffers
 * for the images of a micro-batch and their pixel staging, taken out of the other items).
 * Peak = their sum: every item is allocated once and lives for the whole run (DESIGN.md §7).
 *
 * Ownership: plain value structs. Errors: GM_ERR_INVALID for impossible options (as the
 * trainer's validation) and for runs too large for size_t to count (gm_plan_check_size: refused,
 * never wrapped into a small plan), GM_ERR_UNSUPPORTED for an architecture the planner does not
 * know.
 */
#ifndef GM_PLAN_H
#define GM_PLAN_H

#include "gm_arena.h"
#include "gm_config.h"
#include "gm_status.h"
#include "gm_train.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Multimodal inputs per example (they change the activations: image and audio soft tokens take
 * sequence positions, and the towers run on every example). */
typedef struct gm_plan_inputs {
    int64_t images;          /* images per example */
    double audio_seconds;    /* seconds of audio per example */
} gm_plan_inputs;

/* The vision tower's share of a Gemma 3 run with images (gm_plan_vision): the SigLIP tower and
 * projector as the trainer holds them - frozen, as stored, run forward on up to max_images images
 * per micro-batch (core/model/gm_vision.c, whose own layout sizes every buffer here). */
typedef struct gm_plan_tower {
    int64_t max_images;      /* images (the audio tower: clips) per micro-batch it is sized for; 0:
                                the run has none */
    int64_t frames;          /* the audio tower: feature frames of its longest clip (30 s: 2997) */
    gm_dtype stored;         /* the dtype its matrices are stored in (read in place) */
    size_t weights;          /* tower + projector: matrices as stored (memory-mapped pages, resident
                                once read), LayerNorm / bias vectors and the projector in f32 */
    size_t activations;      /* its forward on max_images images: the patches, one layer's buffers,
                                the attention scratch, pooled / normed / projected soft tokens */
    size_t staging;          /* host staging: the images' patches before they are copied over */
    size_t trained;          /* what of it trains (vision_targets, modules_to_save): the tower's
                                adapters, a trained projector's copy, their gradients and AdamW
                                moments; 0 when frozen (not part of activations) */
    size_t by_kind[GM_MEM_KIND_COUNT]; /* what of the above the run's arenas hold, by kind (the
                                trainer's layout counts it in its items; the plan moves it here) */
    size_t total;            /* weights + trained + activations + staging */
} gm_plan_tower;

typedef struct gm_plan {
    size_t by_kind[GM_MEM_KIND_COUNT]; /* the items, the vision tower's share taken out */
    gm_plan_tower vision;    /* the vision tower (Gemma 3 with images), a separate item */
    gm_plan_tower audio;     /* Gemma 3n's audio encoder and embedder (with audio), a separate item:
                                weights (read in place), its forward's buffers (activations), no
                                staging; frozen (trained 0) */
    size_t runtime;          /* process: code, libraries, tokenizer, BLAS buffers */
    size_t total;            /* runtime + the items + vision.total + audio.total */
    bool exact;              /* true: the trainer's own layout (Gemma 3); false: an estimate */
    int64_t n_params;        /* base model parameters */
    int64_t n_trainable;     /* LoRA parameters */
    char base_detail[256];   /* how the base weights break down (linear / embeddings / towers) */
    char note[512];          /* what is estimated and why, when not exact */
    size_t host_only;        /* of total, what is host memory on every device: the runtime, the
                                host staging arenas, checkpoint saves, the tower's pixel staging */
    /* where it runs (gm_plan_on_device; GM_DEVICE_CPU: everything above is host memory) */
    gm_device device;
    size_t device_arenas;    /* CUDA: the arenas on the GPU with the base weights uploaded into
                                them, and cuBLAS's workspace: gm_cuda_peak_bytes should equal it */
    size_t cuda_context;     /* CUDA: the context's own memory (an estimate: cudaMemGetInfo sees it) */
    size_t device_total;     /* device_arenas + cuda_context */
    size_t host_total;       /* CUDA: host_only */
} gm_plan;

/* Plans a training run. `stored` is the stored dtype of the linear weights (for quant "stored"
 * and to size memory-mapped weights): GM_BF16 for Hugging Face checkpoints, the dominant GGUF
 * type otherwise. inputs may be NULL (text only). Images on a Gemma 3 model with a vision tower
 * (a multimodal size or checkpoint): the trainer's tower for gm_plan_max_images images per
 * micro-batch, itemized as out->vision; a text-only run plans no tower, as the trainer
 * allocates none. Audio on a Gemma 3n model: the trainer's audio encoder for gm_plan_max_audio clips,
 * itemized as out->audio (exact: the trainer's own layout). GM_ERR_UNSUPPORTED for images on a
 * model without a tower or audio on a model without an audio encoder. */
gm_status gm_plan_training(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                           const gm_plan_inputs *inputs, gm_plan *out, gm_error *err);

/* Images per micro-batch a Gemma 3 run reserves its vision tower for (gm_train_opts.max_images):
 * the options' own max_images (the runner sets it: the most images one example has x batch) or
 * inputs->images x batch, whichever is larger; 0 without images. For Gemma 3, max_length counts
 * every position, each image's soft tokens and two markers included (the data set places them
 * inside it): GM_ERR_INVALID when inputs->images of them leave no position for text, or when
 * the model has no vision tower. */
gm_status gm_plan_max_images(const gm_config *cfg, const gm_train_opts *o, const gm_plan_inputs *inputs, int64_t *out,
                             gm_error *err);

/* The vision tower's share of a Gemma 3 run (multimodal cfg) for max_images images per
 * micro-batch with n_threads threads, its matrices stored as `stored`, training what o's
 * vision_targets and modules_to_save select (their adapters, gradients, moments and saved
 * activations are the tower's share too): gm_vision_init_train and gm_vision_layout - the
 * functions the trainer reserves the tower with - on measuring arenas, plus the weights it reads
 * in place. Errors: gm_config_vision_tower's (no or an inconsistent
 * tower). */
gm_status gm_plan_vision(const gm_config *cfg, const gm_train_opts *o, int64_t max_images, int n_threads, gm_dtype stored,
                         gm_plan_tower *out, gm_error *err);

/* Audio clips per micro-batch and the longest clip's feature frames a Gemma 3n run reserves its
 * audio encoder for (gm_train_opts.max_audio, max_audio_frames): the options' own (the runner sets
 * them from the data) or, from inputs->audio_seconds per example, ceil(seconds / 30) clips x batch
 * of min(seconds, 30) s each, whichever is larger; 0 without audio. max_length counts every
 * position, each clip's soft tokens and its markers included: GM_ERR_INVALID when they leave no
 * position for text; GM_ERR_UNSUPPORTED when the model has no audio encoder. */
gm_status gm_plan_max_audio(const gm_config *cfg, const gm_train_opts *o, const gm_plan_inputs *inputs, int64_t *clips,
                            int64_t *frames, gm_error *err);

/* The audio encoder's share of a Gemma 3n run for max_clips clips of up to `frames` feature
 * frames per micro-batch, its matrices stored as `stored`, trained as o says (audio_targets: its
 * adapters, their gradients and moments, the blocks' records; checkpointing; threads):
 * gm_audio_encoder_init_train and gm_audio_encoder_layout - what the trainer reserves it with - on
 * measuring arenas, plus the matrices it reads in place. Errors: gm_audio_encoder_init_train's. */
gm_status gm_plan_audio(const gm_config *cfg, int64_t max_clips, int64_t frames, const gm_train_opts *o, gm_dtype stored,
                        gm_plan_tower *out, gm_error *err);

/* The config of a model argument without loading weights: a built-in size name (unless it is
 * also a fetched model in the cache), a GGUF file (header only), a Hugging Face folder or its
 * config.json. *stored / *stored_embed receive the stored dtype of the linear weights and of the
 * embedding (bf16 assumed for Hugging Face checkpoints and presets). */
gm_status gm_config_probe(const char *arg, gm_config *cfg, gm_dtype *stored, gm_dtype *stored_embed, gm_error *err);

/* True when gm_config_probe(arg) takes its config from the built-in size table: a size to plan
 * with, but no weights to load (a fetched model of the same name is a file and wins). */
bool gm_config_probe_is_preset(const char *arg);

/* The runtime item: resident memory of the process before any model is loaded (measured
 * constant, docs/memory.md) plus the tokenizer of a vocab_size vocabulary. */
size_t gm_plan_runtime_bytes(const gm_config *cfg);

/* memory_limit with fit (issue: never run out of memory mid-run): if the plan exceeds `limit`
 * bytes, turn on activation checkpointing, then halve the batch and double the gradient
 * accumulation (same effective batch) until the plan fits. On success *o holds the chosen
 * options (max_images, images per micro-batch, shrinks with the batch), *p their plan and
 * `chosen` says what changed ("" if nothing had to); GM_ERR_LIMIT
 * (with the smallest plan reached and what else would help) when even batch 1 with
 * checkpointing does not fit. */
gm_status gm_plan_fit(const gm_config *cfg, gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                      const gm_plan_inputs *inputs, size_t limit, gm_plan *p, char *chosen, size_t cap, gm_error *err);

/* Resident bytes a checkpoint save adds for a moment: the in-memory HDF5 image of the adapters and
 * both AdamW moments (3 x 4 bytes per trainable parameter) and its written copy
 * (core/store/gm_checkpoint.c builds the file in memory, then writes it), plus HDF5's own state
 * (5.5 MiB and 1.5 bytes per parameter, fitted: docs/memory.md). Part of "largest transient". */
size_t gm_plan_checkpoint_bytes(int64_t n_trainable);

/* Places a plan on a device: for GM_DEVICE_CUDA the items split into what lives on the GPU (the
 * arenas, the base weights the CUDA backend uploads instead of reading them in place, the cuBLAS
 * workspace and the bf16 staging buffer: GM_CUDA_LIBRARY_BYTES) and on the host (host_only), plus the CUDA context
 * (GM_PLAN_CUDA_CONTEXT_BYTES, an estimate) - and the plan is marked an estimate until the GPU
 * script (tests/device/run.sh) has compared it with the allocator's peak and cudaMemGetInfo.
 * GM_DEVICE_CPU leaves the plan as it is. */
void gm_plan_on_device(gm_plan *p, gm_device device);

/* Writes the itemized table (one item per line, then the total) into buf. */
void gm_plan_format(const gm_plan *p, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* GM_PLAN_H */
