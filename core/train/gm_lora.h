/*
 * gm_lora.h - LoRA adapters on the linear layers of a model, keyed by module name (Hu et al.
 * 2021, arXiv 2106.09685; PEFT conventions, formats.md §5.4 and §6).
 *
 * For a target linear y = x W^T (W: out x in), the adapter adds
 *     y += scaling * dropout(x) A^T B^T,   A: (rank, in), B: (out, rank)
 * with scaling = alpha / rank, or alpha / sqrt(rank) with rsLoRA (Kalajdzievski 2023,
 * arXiv 2312.03732). Initialization as PEFT's default: A ~ U(-1/sqrt(in), 1/sqrt(in))
 * (kaiming_uniform with a = sqrt(5)), B = 0, so training starts from the base model. Our draws
 * come from the counter-based RNG (core/base/gm_rng.h) keyed by the seed, the layer and the
 * weight's stable lora_id (core/arch/gm_arch.h), so they do not depend on the thread count; they
 * are not torch's draws (tests that compare with PEFT load PEFT's initial A instead).
 *
 * Modules: every weight the architecture's spec marks LoRA-targetable is a module, named as
 * PEFT names it - the checkpoint's module prefix, the layer and the spec's Hugging Face name
 * without ".weight", e.g. "model.layers.3.self_attn.q_proj" (Gemma3ForCausalLM) or
 * "model.language_model.layers.3.self_attn.q_proj" (Gemma3ForConditionalGeneration).
 * Targets match as PEFT's target_modules does (peft/tuners/tuners_utils.py,
 * check_target_module_exists):
 *   - "all-linear": every targetable module (never the tied embedding / LM head, which PEFT
 *     excludes as the output embedding);
 *   - a list of names, as a comma- or space-separated string ("q_proj,v_proj",
 *     "self_attn.o_proj"): a module matches when its name equals an entry or ends with "." and
 *     the entry;
 *   - a regular expression (a string with any of ^$*+?()[]{}|\): POSIX extended syntax, with
 *     Python's \d \w \s (and negations) and (?:...) groups translated, matched against the whole
 *     module name as PEFT's re.fullmatch does, e.g. ".*\.layers\.\d+\.self_attn\.(q_proj|v_proj)".
 *     In a list (Lua table) every entry is a plain name, as in PEFT.
 * Layers select further (layers_to_transform, default all).
 *
 * Names: every adapter tensor is named by its PEFT key, "base_model.model." + module +
 * ".lora_A.weight", in checkpoints, results and exported adapter_model.safetensors.
 *
 * Ownership: a gm_lora owns its adapter descriptions (gm_lora_free). The buffers (parameters,
 * gradients, AdamW moments) belong to the arena gm_lora_layout reserved them on - the trainer's,
 * or an adapter file's (core/store/gm_adapter.h) - and are backend memory.
 * Errors: gm_lora_describe returns GM_ERR_INVALID naming a target that matches no module (with
 * the module names there are) or a bad regular expression; gm_lora_config_validate names the bad
 * field and its allowed range.
 */
#ifndef GM_LORA_H
#define GM_LORA_H

#include "gm_arch.h"
#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_config.h"
#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_LORA_TARGETS_MAX 4096

typedef struct gm_lora_config {
    int rank;                     /* r >= 1 */
    float alpha;                  /* lora_alpha */
    float dropout;                /* lora_dropout in [0, 1) */
    bool rslora;                  /* scaling alpha / sqrt(r) instead of alpha / r */
    char targets[GM_LORA_TARGETS_MAX]; /* target_modules: "all-linear", a name list or a regex */
    bool layers[GM_MAX_LAYERS];   /* layers to adapt (layers_to_transform) */
    uint64_t seed;                /* initialization seed */
} gm_lora_config;

/* Defaults (PEFT's LoraConfig, except targets): rank 8, alpha 8, dropout 0, all-linear, every
 * layer, seed 0. The training options' schema (gm_train_opts.def) overrides them for runs. */
gm_lora_config gm_lora_config_default(void);

/* Checks rank, alpha, dropout and the layer selection against the model config; the targets are
 * checked against the model's modules by gm_lora_describe. */
gm_status gm_lora_config_validate(const gm_lora_config *lc, const gm_config *mc, gm_error *err);

float gm_lora_scaling(const gm_lora_config *lc);

/* One adapter: description plus buffer pointers (backend memory, f32, contiguous; gradients and
 * moments NULL unless laid out for training). */
typedef struct gm_lora_adapter {
    char module[128];         /* "model.layers.3.self_attn.q_proj" */
    int layer;
    int slot;                 /* the weight's index in the architecture's layer spec */
    int lora_id;              /* the spec's stable id (RNG streams) */
    int64_t in, out;          /* in_features, out_features of the base linear */
    float *A, *B;             /* (rank, in), (out, rank) */
    float *dA, *dB;           /* gradients, same shapes */
    float *mA, *vA, *mB, *vB; /* AdamW moments */
    char name_A[160], name_B[160]; /* PEFT keys */
} gm_lora_adapter;

typedef struct gm_lora {
    gm_lora_config cfg;
    float scaling;
    int n;                    /* adapters */
    gm_lora_adapter *ad;      /* [n]: by layer, then by the spec's order */
    int64_t n_layers;
    int n_slots;
    int *index;               /* [n_layers * n_slots]: adapter index, or -1 */
    bool slot_used[GM_MAX_LAYER_WEIGHTS]; /* some layer adapts this slot */
    int64_t in_max;           /* widest adapter input (1 if none) */
    int64_t n_params;         /* trainable parameters: sum of rank * (in + out) */
} gm_lora;

/* Describes the adapters lc gives on a model of this architecture and config, with module names
 * under `prefix` ("model." when NULL). No buffers yet. GM_ERR_INVALID (see the file comment),
 * GM_ERR_NOMEM. On failure *lo is empty (gm_lora_free is still allowed). */
gm_status gm_lora_describe(gm_lora *lo, const gm_lora_config *lc, const gm_arch_def *arch, const gm_config *mc,
                           const char *prefix, gm_error *err);
void gm_lora_free(gm_lora *lo);

/* The spec slot of a PEFT module name ("...layers.4.self_attn.k_proj": the slot of
 * "self_attn.k_proj.weight") and its layer number into *layer; -1 when the name has no layer number
 * (*layer -1) or names no weight of arch's spec (*layer still set). */
int gm_lora_module_slot(const gm_arch_def *arch, const char *module, int64_t *layer);

/* Why layer `layer` of a model with config mc has no weight in `slot` (the slot is in arch's spec):
 * a KV-shared layer's keys and values, a k_eq_v full layer's values, or plainly absent - a clause
 * written into buf (cap bytes) and returned; NULL when the layer has the weight. */
const char *gm_lora_absent_why(const gm_arch_def *arch, const gm_config *mc, int slot, int64_t layer, char *buf, size_t cap);

/* Describes exactly the adapters on the given modules (e.g. read from an adapter file), each
 * named "<any prefix>layers.N.<module>" with <module> a LoRA-targetable weight of the spec without
 * ".weight" ("self_attn.q_proj"); lc gives rank, alpha, dropout, rslora (its targets and layers
 * are ignored). Module names are rebuilt under `prefix`. GM_ERR_INVALID naming a module the model
 * has not (layer out of range, unknown or non-targetable name), GM_ERR_NOMEM. */
gm_status gm_lora_describe_modules(gm_lora *lo, const gm_lora_config *lc, const gm_arch_def *arch, const gm_config *mc,
                                   const char *prefix, const char *const *modules, int n_modules, gm_error *err);

/* Reserves (measuring arena) or hands out (committed) the buffers: A and B, and with `train`
 * also dA, dB and the four AdamW moments, per adapter in that order (kinds adapters, gradients,
 * optimizer state). */
void gm_lora_layout(gm_lora *lo, gm_arena *a, bool train);

/* The word before a layer's index in the module names of architecture a: the last part of its
 * layers_prefix - "layers." (the Gemma decoders, SigLIP's "encoder.layers.") or "conformer."
 * (Gemma 3n's audio encoder: "model.audio_tower.conformer.3.attention.attn.q_proj"). */
const char *gm_lora_layer_word(const gm_arch_def *a);

/* The adapter on layer l's weight in `slot`, or NULL. */
static inline gm_lora_adapter *gm_lora_at(const gm_lora *lo, int64_t l, int slot) {
    if (!lo || !lo->index) return NULL;
    int i = lo->index[l * lo->n_slots + slot];
    return i >= 0 ? &lo->ad[i] : NULL;
}

/* Checks a targets text before any model is loaded: "all-linear", a list whose every name is (a
 * suffix of) a targetable module of the architecture, or a regular expression that compiles.
 * GM_ERR_INVALID naming the unknown module (with the allowed names) or the bad expression.
 * Whether a regex selects anything is known only with the model (gm_lora_describe). */
gm_status gm_lora_targets_check(const char *targets, const gm_arch_def *arch, const char *prefix, gm_error *err);

/* True when `module` (a LoRA-targetable module's name) is selected by `targets` (the rules
 * above). A bad regular expression matches nothing (gm_lora_describe reports it). */
bool gm_lora_target_matches(const char *targets, const char *module);

/* True when a targets text is a regular expression (not "all-linear", not a list of names). */
bool gm_lora_targets_is_regex(const char *targets);

/* Starts every adapter of lo for training on backend be (its buffers laid out with train = true):
 * PEFT's initial A (gm_lora_init_A), B zero, zero gradients and AdamW moments. GM_ERR_NOMEM for the
 * host staging; the backend's sticky error. */
gm_status gm_lora_init_train(const gm_lora *lo, gm_backend *be, gm_error *err);

/* PEFT's initial A of one adapter into A_host (rank x in floats, host memory): uniform in
 * +-1/sqrt(in), deterministic in (seed, layer, lora_id). B starts at zero. */
void gm_lora_init_A(const gm_lora_config *lc, const gm_lora_adapter *ad, float *A_host);

#ifdef __cplusplus
}
#endif
#endif /* GM_LORA_H */
