/*
 * gm_lora.h - LoRA adapters on the linear layers of the Gemma decoder (Hu et al. 2021,
 * arXiv 2106.09685; PEFT conventions, formats.md §5.4 and §6).
 *
 * For a target linear y = x W^T (W: out x in), the adapter adds
 *     y += scaling * dropout(x) A^T B^T,   A: (rank, in), B: (out, rank)
 * with scaling = alpha / rank, or alpha / sqrt(rank) with rsLoRA (Kalajdzievski 2023,
 * arXiv 2312.03732). Initialization as PEFT's default: A ~ U(-1/sqrt(in), 1/sqrt(in))
 * (kaiming_uniform with a = sqrt(5)), B = 0, so training starts from the base model. Our draws
 * come from the counter-based RNG (core/base/gm_rng.h) keyed by the seed and the adapter, so
 * they do not depend on the thread count; they are not torch's draws (tests that compare with
 * PEFT load PEFT's initial A instead).
 *
 * Targets: any subset of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or
 * "all-linear" (all seven in every selected layer; never the tied embedding / LM head, as PEFT
 * excludes the output embedding), on a selection of layers (default all).
 *
 * Names: every adapter tensor is named by its PEFT key, e.g.
 * "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight", in checkpoints, results and
 * exported adapter_model.safetensors.
 *
 * Ownership: gm_lora only describes the adapters (shapes, names, scaling). The trainer owns the
 * parameter, gradient and optimizer buffers and points each gm_lora_adapter into its arenas.
 * Errors: gm_lora_parse_targets returns GM_ERR_INVALID naming the unknown module and the allowed
 * names; gm_lora_config_validate names the bad field and its allowed range.
 */
#ifndef GM_LORA_H
#define GM_LORA_H

#include "gm_config.h"
#include "gm_model.h"
#include "gm_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_lora_config {
    int rank;                     /* r >= 1 */
    float alpha;                  /* lora_alpha */
    float dropout;                /* lora_dropout in [0, 1) */
    bool rslora;                  /* scaling alpha / sqrt(r) instead of alpha / r */
    uint32_t targets;             /* bit (1 << gm_linear) per target module */
    bool layers[GM_MAX_LAYERS];   /* layers to adapt (layers_to_transform) */
    uint64_t seed;                /* initialization seed */
} gm_lora_config;

/* Defaults: rank 8, alpha 8, dropout 0, all-linear, every layer, seed 0. */
gm_lora_config gm_lora_config_default(void);

/* Parses "all-linear" or a comma/space separated list of module names into a target mask. */
gm_status gm_lora_parse_targets(const char *spec, uint32_t *targets, gm_error *err);

gm_status gm_lora_config_validate(const gm_lora_config *lc, const gm_config *mc, gm_error *err);

float gm_lora_scaling(const gm_lora_config *lc);

/* One adapter: the trainer fills the buffer pointers (all f32, contiguous). */
typedef struct gm_lora_adapter {
    int layer;
    gm_linear which;
    int64_t in, out;          /* in_features, out_features of the base linear */
    float *A, *B;             /* (rank, in), (out, rank) */
    float *dA, *dB;           /* gradients, same shapes */
    float *mA, *vA, *mB, *vB; /* AdamW moments */
    char name_A[128], name_B[128]; /* PEFT keys */
} gm_lora_adapter;

/* in/out features of a target linear in a layer (from the model config). */
void gm_lora_linear_shape(const gm_config *mc, int layer, gm_linear which, int64_t *in, int64_t *out);

/* The PEFT key of an adapter matrix ("A" or "B"). */
void gm_lora_peft_name(int layer, gm_linear which, char ab, char *buf, size_t cap);

/* Number of adapters and trainable parameters the config gives on this model. */
int64_t gm_lora_count(const gm_lora_config *lc, const gm_config *mc, int64_t *n_params);

/* PEFT default init of one adapter (A uniform, B zero), deterministic in (seed, layer, which). */
void gm_lora_init_adapter(const gm_lora_config *lc, gm_lora_adapter *ad);

#ifdef __cplusplus
}
#endif
#endif /* GM_LORA_H */
