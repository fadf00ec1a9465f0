/*
 * gm_train.h - LoRA / QLoRA training: the architecture's forward with saved activations, its
 * backward into the adapters only, loss on response tokens, AdamW.
 *
 * One gm_trainer is one training run on one model on one backend: it owns the (optionally
 * re-encoded) base weights, the adapters with their gradients and AdamW moments, and every
 * activation and workspace buffer, all laid out from the config and the options and allocated
 * once in one arena per memory (gm_arena.h protocol): nothing is allocated inside a step, and the
 * peak does not depend on which examples a step draws. gm_train_plan gives the same itemized
 * sizes without a model: it runs the same layout on measuring arenas.
 *
 * The forward and backward are the architecture's (core/arch/gemma3.c), the one definition
 * generation also runs (core/model/gm_decoder.h), in the graph's training mode on whole padded
 * sequences (B, T <= max_length), with the backward formulas of §1.4-1.7 (kernels.h). The frozen
 * base gets no weight gradients; the embedding is frozen too. Loss: cross-entropy of the
 * supervised positions only (targets >= 0), computed chunk by chunk over rows and over the
 * vocabulary so the (tokens x 262,144) logits never exist. Gradient accumulation divides by the
 * number of supervised tokens of the whole accumulated batch, so batch 4 x accumulation 1 and
 * batch 1 x accumulation 4 give the same loss and gradients (as the Hugging Face Trainer does
 * with num_items_in_batch).
 *
 * Activation checkpointing (per decoder block): only each block's input is kept; the backward
 * recomputes the block's activations (same kernels, same dropout masks) right before its
 * backward, trading one extra forward for ~L-fold less activation memory.
 *
 * Ownership: the trainer borrows the model (and a backend given to gm_trainer_new_on), which must
 * outlive it, and owns everything else. Adapter buffers are backend memory: read and write them
 * with gm_trainer_read_adapter / gm_trainer_write_adapter (on the CPU backend the pointers of
 * gm_trainer_adapters are host memory too).
 * Errors: gm_trainer_new: GM_ERR_INVALID (bad options, naming the field and allowed values),
 * GM_ERR_NOMEM (with the planned size). gm_trainer_step: GM_ERR_INVALID for a batch that does not
 * fit the plan or an example with no supervised token (naming the example), GM_ERR_NONFINITE
 * when the loss or a gradient is NaN/Inf (naming the step and the tensor; the adapters are left
 * as they were before the step). A failed step leaves the trainer usable (nothing is sticky).
 */
#ifndef GM_TRAIN_H
#define GM_TRAIN_H

#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_quant.h"
#include "gm_status.h"
#include "gm_vision.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The chunked cross-entropy's logits block: supervised rows x vocabulary entries at a time (f32,
 * 16 MiB), so the (tokens x 262,144) logits never exist. The planner reads these too. */
#define GM_LM_ROWS 512
#define GM_LM_VOCAB 8192

typedef enum gm_schedule { GM_SCHED_CONSTANT = 0, GM_SCHED_LINEAR, GM_SCHED_COSINE } gm_schedule;
const char *gm_schedule_name(gm_schedule s);
bool gm_schedule_from_name(const char *name, gm_schedule *out);

/* Precision of the base weights' GEMMs (the `compute` option). AUTO: bf16 where the backend
 * multiplies bf16 natively and faster than f32 (CUDA, a CPU with AMX or an AMD
 * CPU with AVX512-BF16: kernels.h, gm_k_cpu_bf16_auto), f32 elsewhere; BF16: bf16 inputs with f32
 * accumulation where native (CUDA; a CPU with AVX512-BF16 / AMX, gm_k_cpu_bf16_native), refused by
 * gm_trainer_new_on on a backend without it;
 * F32: f32 everywhere (parity with PEFT in f32; the same numbers on every device). */
typedef enum gm_compute { GM_COMPUTE_AUTO = 0, GM_COMPUTE_BF16, GM_COMPUTE_F32 } gm_compute;
bool gm_compute_from_name(const char *name, gm_compute *out);
/* "bf16" or "f32": what a trainer with option c computes its base GEMMs in on a device named
 * `device` ("cpu", "cuda", "cuda:N"; gm_backend_parse_device): AUTO: bf16 on a CUDA device, or
 * the CPU where gm_k_cpu_bf16_auto; BF16: bf16 (where not native the trainer refuses it); F32:
 * f32. Recorded with each trial. */
const char *gm_compute_effective(gm_compute c, const char *device);

/* The options of a training run. The user-facing ones are listed, with their defaults and
 * ranges, in gm_train_opts.def (the schema); warmup_steps, total_steps, the seed and the thread
 * count are set by the caller (the runner derives them). */
typedef struct gm_train_opts {
    gm_lora_config lora;
    gm_quant quant;          /* base weight precision */
    int64_t batch;           /* sequences per micro-batch (B) */
    int64_t max_length;      /* tokens per sequence (T), the plan's worst case */
    int64_t grad_accum;      /* micro-batches per optimizer step */
    float lr;
    float weight_decay;
    float beta1, beta2, eps;
    float max_grad_norm;     /* 0 = no clipping */
    gm_schedule schedule;
    double warmup;           /* schema: a fraction of total_steps if < 1, else steps */
    int64_t warmup_steps;    /* what the trainer uses (gm_train_opts_resolve sets it from warmup) */
    int64_t total_steps;     /* for the linear/cosine decay */
    bool checkpointing;      /* activation checkpointing per decoder block */
    int64_t epochs;          /* the runner's loop: passes over the data */
    int64_t max_steps;       /* ... or this many steps (0: the epochs decide) */
    int64_t checkpoint_every; /* ... with a resumable checkpoint every this many steps */
    int64_t max_images;      /* images per micro-batch the image path is planned for (0: text
                                only); the caller derives it from the data, like the seed */
    char vision_targets[GM_LORA_TARGETS_MAX]; /* LoRA targets in the vision tower ("none": frozen) */
    bool train_projector;    /* modules_to_save = "multi_modal_projector": the projector learns */
    bool pan_and_scan;       /* the data's images are seen with their pan & scan crops (the
                                runner's data sets; the trainer sees only max_images) */
    int64_t max_audio;       /* audio clips per micro-batch the audio path is planned for (0: no
                                audio); the caller derives it from the data, like max_images */
    int64_t max_audio_frames; /* log-mel frames of the longest clip (gm_audio_frames; 30 s: 2997) */
    char audio_targets[GM_LORA_TARGETS_MAX]; /* LoRA targets in Gemma 3n's audio conformer ("none": frozen) */
    int64_t ple_resident;    /* bytes of Gemma 3n's per-layer embedding table the data's ids touch
                                (gm_dataset_table_resident; the caller derives it from the data):
                                what of the memory-mapped table becomes resident; 0: all of it */
    gm_compute compute;      /* precision of the base weights' GEMMs (gm_compute) */
    int n_threads;
} gm_train_opts;

/* What of the image path o trains (vision_targets, modules_to_save), for gm_vision_init_train:
 * the tower's LoRA config goes into *vl (o's rank, alpha, dropout and seed, with vision_targets
 * as its targets), which must outlive the use of the result. */
gm_vision_train gm_train_vision_selection(const gm_train_opts *o, gm_lora_config *vl);

/* The audio conformer's LoRA config (o's rank, alpha, dropout and seed with audio_targets as its
 * targets) in *al, returned; NULL when audio_targets is "none" (the encoder is frozen). */
const gm_lora_config *gm_train_audio_selection(const gm_train_opts *o, gm_lora_config *al);

/* The defaults of the schema (gm_train_opts.def), plus seed 0, 2 threads, total_steps 1. */
gm_train_opts gm_train_opts_default(void);

/* Sets warmup_steps from warmup and total_steps (a fraction rounded half up, as the runner
 * rounds: floor(warmup * total_steps + 0.5); else warmup steps). */
void gm_train_opts_resolve(gm_train_opts *o);

/* ---- the schema of the training options (gm_train_opts.def) ------------------------------ */

typedef enum gm_opt_kind { GM_OPT_INT = 0, GM_OPT_NUM, GM_OPT_BOOL, GM_OPT_ENUM, GM_OPT_TARGETS, GM_OPT_LAYERS } gm_opt_kind;

/* "integer", "number", "boolean", "enum", "targets", "layers" (the prelude's kind names). */
const char *gm_opt_kind_name(gm_opt_kind k);

typedef struct gm_opt_spec {
    const char *name;
    gm_opt_kind kind;
    double def;              /* numeric / boolean default; NAN: none */
    const char *def_text;    /* the default as written ("linear", "all-linear", "all", "" for none) */
    double min, max;         /* inclusive bounds, NAN when none */
    double gt, lt;           /* exclusive bounds, NAN when none */
    const char *values;      /* ENUM: allowed values, comma-separated */
    const char *doc;         /* one line */
    const char *source;      /* where the default comes from */
} gm_opt_spec;

/* A value for gm_train_opt_set: num for INT / NUM / BOOL, text for ENUM / TARGETS, layers for
 * LAYERS (a GM_MAX_LAYERS bool array, NULL: all layers). */
typedef struct gm_opt_value {
    double num;
    const char *text;
    const bool *layers;
} gm_opt_value;

/* The schema's rows (static), *n of them, in the table's order. */
const gm_opt_spec *gm_train_opt_specs(int *n);
/* The row of an option, or NULL. */
const gm_opt_spec *gm_train_opt_find(const char *name);
/* The row whose name is closest to a mistyped one (a typo: within a third of its length, at most 3
 * edits), or NULL: for "did you mean". */
const gm_opt_spec *gm_train_opt_closest(const char *name);
/* Checks v against the row's kind and range and stores it. GM_ERR_INVALID naming the option,
 * the value and what is allowed ("rank = 0: must be >= 1"); o is unchanged then. */
gm_status gm_train_opt_set(gm_train_opts *o, const gm_opt_spec *s, gm_opt_value v, gm_error *err);
/* The same from text as users type it on a command line ("1e-4", "on", "q_proj,v_proj", "0,1,5"):
 * numbers for INT / NUM, on/off, true/false, yes/no or 1/0 for BOOL, comma-separated indices for
 * LAYERS, the text itself otherwise. */
gm_status gm_train_opt_parse(gm_train_opts *o, const gm_opt_spec *s, const char *text, gm_error *err);
/* Checks a TARGETS row's text before any model loads, against the modules of the part it
 * adapts (targets: the Gemma decoder's; vision_targets: the SigLIP tower's, or "none"):
 * gm_lora_targets_check's rules and errors, prefixed with the option's name. */
gm_status gm_train_opt_targets_check(const gm_opt_spec *s, const char *text, gm_error *err);
/* The allowed values of a row as one phrase ("an integer 1..4096", "a number > 0", "constant,
 * linear, cosine") into buf; returns buf. */
const char *gm_opt_describe_range(const gm_opt_spec *s, char *buf, size_t cap);

/* One micro-batch: B sequences of T tokens (T <= max_length, B <= batch), right-padded.
 * targets[b*T + t] is the token position t must predict (normally ids[b*T + t + 1]) or -1 for
 * positions without loss (prompt, padding, the last position). example_index (optional) names
 * the examples in error messages. */
typedef struct gm_batch {
    int64_t B, T;
    const int32_t *ids;
    const int32_t *targets;
    const int64_t *example_index;
    /* Images (multimodal models): pixels (n_images, 3, S, S) host, preprocessed (core/image), in
     * the order their soft-token runs appear in ids (row-major over the batch). Each image fills
     * one run of the config's tokens-per-image <image_soft_token> ids; those tokens see their
     * whole image, the rest stays causal (gm_mm_kv_end). The tower and projector learn what the
     * options vision_targets and modules_to_save say (frozen by default). */
    const float *pixels;
    int64_t n_images;
    /* Gemma 4's images of their own sizes (gm_batch_images): image j (3, image_hw[2j],
     * image_hw[2j+1]) right after image j - 1 in pixels, its run of soft tokens its grid's cells;
     * NULL: every image S x S at pixels + j 3 S S, each the config's tokens-per-image. */
    const int64_t *image_hw;
    /* Audio (Gemma 3n): log-mel features (n_audio, audio_frames, 128) and their frame mask
     * (n_audio, audio_frames; 1 = a frame of the clip), host, as Gemma3nAudioFeatureExtractor
     * gives a batch of clips (gm_audio_features_compute), in the order their soft-token runs appear
     * in ids. Each clip fills one run of the config's audio_soft_tokens_per_image
     * <audio_soft_token> ids (causal attention, as every Gemma 3n token). The audio encoder
     * learns what audio_targets says (frozen by default). */
    const float *audio_features;
    const uint8_t *audio_valid;
    int64_t n_audio, audio_frames;
    /* The same images and clips as the previous call's (generation: the sequences grow, their
     * media stay): an evaluation, scoring or logits call reuses the encoders' soft tokens of the
     * previous one when no training step ran in between, instead of encoding them again. */
    bool same_media;
} gm_batch;

typedef struct gm_step_stats {
    double loss;             /* mean cross-entropy over the supervised tokens of the step */
    int64_t n_tokens;        /* supervised tokens in the step */
    double grad_norm;        /* total L2 norm of the adapter gradients before clipping */
    double lr;               /* learning rate used for this step */
    int64_t step;            /* optimizer steps completed after this one */
    /* a mixture of experts (Gemma 4 26B-A4B; both 0 without): how evenly this step's token slots
     * went to the experts (this rank's, gm_graph.moe_load), per layer then over layers -
     * router_max_load: the largest share an expert took relative to an even one (1: balanced, E:
     * one expert took every slot), the worst layer's; router_load_cv: the coefficient of variation
     * (std / mean) of the experts' slot counts, the layers' mean (0: balanced) */
    double router_max_load, router_load_cv;
} gm_step_stats;

typedef struct gm_trainer gm_trainer;

/* A trainer on its own CPU backend. */
gm_status gm_trainer_new(const gm_model *m, const gm_train_opts *o, gm_trainer **out, gm_error *err);
/* A trainer on backend `be` (borrowed: the CPU, strict or CUDA backend). */
gm_status gm_trainer_new_on(const gm_model *m, const gm_train_opts *o, gm_backend *be, gm_trainer **out, gm_error *err);
void gm_trainer_free(gm_trainer *tr);

typedef struct gm_dist gm_dist; /* core/dist/gm_dist.h */

/* Data-parallel training (core/dist/gm_dist.h): from now on each gm_trainer_step all-reduces,
 * over the world `d` (borrowed, must outlive the trainer or the next call), the step's supervised
 * token count, its loss sum and the trained tensors' gradients (sum), before the non-finite
 * check, clipping and AdamW, which then run identically on every rank. Each rank passes its
 * share of the step: rank r the micro-batches r*A .. r*A+A-1 of the step (A = grad_accum; fewer,
 * or none, in a short last step), so world_size ranks with grad_accum A give the micro-batches,
 * loss, gradients (up to the order of float sums) and updates of one process with grad_accum
 * A x world_size. d NULL or of world_size 1: back to one process. GM_ERR_UNSUPPORTED when the
 * backend's memory is not host memory and d has no NCCL attached for it; GM_ERR_NOMEM. */
gm_status gm_trainer_set_dist(gm_trainer *tr, gm_dist *d, gm_error *err);

/* One optimizer step over n_micro micro-batches (gradient accumulation). Data parallel: every
 * rank must call it for every step, with n_micro 0 allowed; a failure on one rank (its batch
 * refused, a device error) makes every rank's step fail (the others with GM_ERR_INVALID or
 * GM_ERR_RUNTIME naming how many ranks failed); a failed all-reduce is GM_ERR_DEVICE. */
gm_status gm_trainer_step(gm_trainer *tr, const gm_batch *micro, int n_micro, gm_step_stats *st, gm_error *err);

/* Forward only: sum of token losses and supervised token count (evaluation; no gradients). */
gm_status gm_trainer_eval(gm_trainer *tr, const gm_batch *b, double *loss_sum, int64_t *n_tokens, gm_error *err);

/* Log-probability of the supervised tokens of each sequence (forward only, no dropout):
 * seq_logprob[b] = sum over supervised t of log p(targets[b, t] | ids[b, <= t]). Classification
 * by label scoring compares these across one prompt with each label as the response. */
gm_status gm_trainer_score(gm_trainer *tr, const gm_batch *b, double *seq_logprob, gm_error *err);

/* Logits of K candidate tokens at one position of each sequence (forward only): out (B, K) =
 * final-normed hidden state at row pos[b] of sequence b, times the embedding rows cand[k]
 * (soft-capped like the full logits). The fast path of label scoring when the labels' first
 * tokens differ. */
gm_status gm_trainer_choice_logits(gm_trainer *tr, const gm_batch *b, const int64_t *pos, const int32_t *cand,
                                   int64_t K, float *out, gm_error *err);

/* Logits of chosen positions (forward only, no dropout): out (n_rows, V) = the LM head applied to
 * the final-normed hidden state at rows[i] = b*T + t of the batch, soft-capped like the loss's.
 * n_rows <= GM_LM_ROWS. What generation computes token by token with the KV cache
 * (gm_decoder_forward) for the same sequence and adapters. */
gm_status gm_trainer_logits(gm_trainer *tr, const gm_batch *b, const int64_t *rows, int64_t n_rows, float *out,
                            gm_error *err);

/* Lower-level pieces (tests): zero the gradients; run forward + backward on one micro-batch,
 * accumulating gradients scaled by grad_scale (1 / supervised tokens of the whole step). */
void gm_trainer_zero_grad(gm_trainer *tr);
gm_status gm_trainer_forward_backward(gm_trainer *tr, const gm_batch *b, float grad_scale, double *loss_sum,
                                      gm_error *err);

/* The language model's adapters (array owned by the trainer; buffers are backend memory). */
gm_lora_adapter *gm_trainer_adapters(gm_trainer *tr, int *n);

/* Every trained tensor with its gradient and AdamW moments (backend memory): the language
 * model's adapters (A, B of each, in gm_trainer_adapters' order), then the vision tower's, then
 * the projector's weights (modules_to_save). name: the PEFT key; shape as PEFT saves it; decay:
 * whether weight decay applies (not on norm weights, as Hugging Face's Trainer). */
typedef struct gm_train_param {
    const char *name;
    float *p, *d, *m, *v;
    int64_t n;
    int ndim;
    int64_t shape[2];
    bool decay;
} gm_train_param;

/* The list above (owned by the trainer; *n entries). */
const gm_train_param *gm_trainer_params(const gm_trainer *tr, int *n);
/* Images the trainer has run through the vision tower so far (a batch's repeated image runs once
 * outside a training step through a learning tower). */
int64_t gm_trainer_images_encoded(const gm_trainer *tr);
/* Audio clips the trainer has run through the audio encoder so far. */
int64_t gm_trainer_clips_encoded(const gm_trainer *tr);
/* True when anything outside the language model's adapters trains (tower adapters, projector):
 * such a run's adapter is not a plain language-model LoRA. */
bool gm_trainer_trains_vision(const gm_trainer *tr);
/* The adapter set, to attach to a generation state on the same backend (gm_infer_opts.adapter). */
const gm_lora *gm_trainer_lora(const gm_trainer *tr);
/* The trainer's backend. */
gm_backend *gm_trainer_backend(const gm_trainer *tr);
/* Copies adapter i's A (which = 'A', rank x in floats) or B ('B', out x rank) into host memory
 * dst, or writes it from src. */
void gm_trainer_read_adapter(gm_trainer *tr, int i, char which, float *dst);
void gm_trainer_write_adapter(gm_trainer *tr, int i, char which, const float *src);
/* Writes trained tensor i of gm_trainer_params (n floats from host memory src) and what follows
 * from it (a trained projector's norm scale). */
void gm_trainer_write_param(gm_trainer *tr, int i, const float *src);
const gm_train_opts *gm_trainer_opts(const gm_trainer *tr);
/* The configuration of the model it trains (borrowed from the model). */
const gm_config *gm_trainer_config(const gm_trainer *tr);
int64_t gm_trainer_step_count(const gm_trainer *tr);
/* Sets the step counter (restoring a checkpoint). */
void gm_trainer_set_step(gm_trainer *tr, int64_t step);
/* The trainer's backend arena (sizes per memory kind, for reports); gm_trainer_host_bytes: its
 * host staging arena's size (ids, targets and the loss's per-row values before upload). */
const gm_arena *gm_trainer_arena(const gm_trainer *tr);
size_t gm_trainer_host_bytes(const gm_trainer *tr);

/* Learning rate at optimizer step `step` (0-based), Hugging Face get_scheduler semantics. */
double gm_train_lr_at(const gm_train_opts *o, int64_t step);

/* What a training run allocates, from the config and the options alone (loads nothing): the
 * trainer's own layout run on measuring arenas, for a host-visible backend. */
typedef struct gm_train_plan_info {
    size_t by_kind[GM_MEM_KIND_COUNT]; /* the arenas (backend + host staging), by memory kind */
    size_t total;                      /* their sum */
    size_t host_bytes;                 /* of total, the host staging arena's (host memory on any backend) */
    size_t alias_bytes;                /* base weights read in place from the file (memory-mapped,
                                          resident, not in an arena), the audio encoder's included */
    size_t audio_alias_bytes;          /* of which the audio encoder's linears */
    size_t weight_bytes[GM_W_KIND_COUNT]; /* resident base weights by gm_wkind: linear, norm,
                                          embedding, vector (aliased or re-encoded) */
    int64_t n_trainable;               /* trained parameters: LoRA (language model and vision
                                          tower) and the projector when it is trained */
    size_t scratch_floats;             /* the kernels' workspace (part of the transient item) */
    bool cpu_bf16;                     /* it computes in bf16 on the CPU: oneDNN is loaded (its memory
                                          is planned beside ours: gm_plan.c) */
    bool cpu_bf16_gemms;               /* ... and some base weights are not f32: oneDNN multiplies */
} gm_train_plan_info;

/* Whether a trainer of config c could run with options o: sizes, rates, the LoRA config, and what
 * the architecture's training supports (KV sharing needs its backward to return shared keys'
 * gradients; activation checkpointing with KV sharing is refused). The check gm_trainer_new runs
 * first; the runner's preflight runs it on every trial of a loadable model before any trains.
 * Errors: GM_ERR_INVALID / GM_ERR_UNSUPPORTED naming the option and what to use instead. */
gm_status gm_train_opts_check(const gm_config *c, const gm_train_opts *o, gm_error *err);

/* Plans a run. `stored` / `stored_embed`: the stored dtypes of the linear weights and the
 * embedding. Errors as gm_trainer_new's for the options (GM_ERR_INVALID naming the field),
 * GM_ERR_UNSUPPORTED for an architecture without a definition. */
gm_status gm_train_plan(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                        gm_train_plan_info *out, gm_error *err);

/* Checkpoints (core/store/gm_checkpoint.h): adapters, AdamW moments, step, RNG and data position. */
gm_status gm_trainer_save(gm_trainer *tr, const char *path, int64_t epoch, int64_t data_pos, double loss,
                          const char *config_json, gm_error *err);
gm_status gm_trainer_load(gm_trainer *tr, const char *path, int64_t *epoch, int64_t *data_pos, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_TRAIN_H */
