/*
 * gm_config.h - the model configuration every Gemma graph is built from.
 *
 * One struct for Gemma 3 / 3n / 4 models: the text decoder's fields at the top level (Hugging Face's
 * text_config, or a text-only config), the towers nested as vision / audio (vision_config,
 * audio_config), as Hugging Face nests them. Per-layer properties live in per-layer arrays
 * (layer type, RoPE base and scale, FFN width, which layer's KV cache a layer reads), so Gemma 3n
 * and Gemma 4 features (KV sharing between layers, per-layer FFN widths, per-layer embeddings,
 * AltUp, mixture of experts) extend this struct instead of rewriting the graph. Fields that a
 * Gemma 3 model does not use keep neutral values (0 / -1 / 1.0) and are documented as such.
 *
 * Sources, in order of precedence, each filling the same struct:
 *   - GGUF metadata (gemma3.* keys, formats.md §1.9; llama.cpp's hard-coded Gemma 3 constants:
 *     sliding-window pattern 6, local RoPE base 10,000, query scale 1/sqrt(head_dim));
 *   - a Hugging Face config.json, old field names (rope_theta, rope_local_base_freq,
 *     sliding_window_pattern, rope_scaling) and new ones (layer_types, rope_parameters), and the
 *     multimodal wrapper's "text_config";
 *   - built-in presets of the published sizes (gemma_architecture.md §1.1), for planning.
 *
 * Ownership: plain value struct, no pointers. Errors: the loaders return GM_ERR_FORMAT for a
 * malformed file, GM_ERR_NOT_FOUND naming a missing required key (e.g. "config.json: missing
 * key 'hidden_size'"), GM_ERR_UNSUPPORTED for an architecture we do not implement, and
 * GM_ERR_INVALID when values contradict each other (heads not divisible by kv heads, ...).
 */
#ifndef GM_CONFIG_H
#define GM_CONFIG_H

#include "gm_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GM_MAX_LAYERS 128

/* GM_ARCH_SIGLIP: the vision tower of a multimodal Gemma 3, run as its own graph on a config
 * made by gm_config_vision_tower; GM_ARCH_GEMMA3N_AUDIO: Gemma 3n's audio conformer, on a config
 * made by gm_config_audio_tower; GM_ARCH_GEMMA4_VISION: Gemma 4's vision tower (gm_config_vision_tower
 * of a Gemma 4 config); GM_ARCH_GEMMA4_AUDIO: Gemma 4's audio tower (gm_config_audio_tower of one). */
typedef enum gm_arch {
    GM_ARCH_GEMMA3 = 0, GM_ARCH_GEMMA3N, GM_ARCH_GEMMA4, GM_ARCH_SIGLIP, GM_ARCH_GEMMA3N_AUDIO, GM_ARCH_GEMMA4_VISION,
    GM_ARCH_GEMMA4_AUDIO, GM_ARCH_COUNT
} gm_arch;
const char *gm_arch_name(gm_arch a);

typedef enum gm_layer_type { GM_LAYER_SLIDING = 0, GM_LAYER_FULL = 1 } gm_layer_type;

/* Where the checkpoint stores RMSNorm weights: Hugging Face keeps w (effective scale 1+w),
 * GGUF keeps 1+w already (gemma_architecture.md §5.3; adding 1 again destroys the model). */
typedef enum gm_norm_convention { GM_NORM_ONE_PLUS_W = 0, GM_NORM_DIRECT = 1 } gm_norm_convention;

/* The vision tower of a multimodal model, as Hugging Face nests it (vision_config, plus the
 * wrapper's mm_tokens_per_image). Zero: no tower. */
typedef struct gm_vision_config {
    int64_t params;               /* parameters of the tower + projector (planning) */
    int64_t tokens;               /* soft tokens per image (mm_tokens_per_image) */
    int64_t hidden_size;          /* width of the tower */
    int64_t n_layers;             /* num_hidden_layers */
    int64_t patches;              /* patches per image the tower attends over */
    int64_t intermediate_size;    /* MLP width (0: unknown, planners assume 4x) */
    int64_t n_heads;              /* num_attention_heads */
    int64_t image_size, patch_size;
    float layer_norm_eps;         /* the tower's LayerNorms and the projector's RMSNorm (1e-6) */
    int64_t out_hidden_size;      /* the text width the projector maps into */
    int32_t image_token_id;       /* <image_soft_token> (262144; image_token_index) */
    int32_t boi_id, eoi_id;       /* <start_of_image> 255999, <end_of_image> 256000 */
    /* Gemma 3n's vision embedder: hard tokens ids hard_offset .. + hard_vocab - 1 (262,144 and 128:
     * vision_config's vocab_offset, vocab_size) of width hidden_size; 0 for Gemma 3 */
    int64_t hard_offset, hard_vocab;
    /* Gemma 4's tower (Gemma4VisionConfig; 0 / false elsewhere): kv heads and head width, the
     * pooling kernel (3: k x k patches per soft token), rows of each axis of the 2-D position
     * table (position_embedding_size 10,240), RoPE base (100), clipped linears
     * (use_clipped_linears), standardized soft tokens (standardize), and the image-token budget
     * the image processor resizes each image into (max_soft_tokens: 70, 140, 280, 560, 1120;
     * preprocessor_config.json, 280 without one). Each image keeps its aspect (its own grid,
     * gm_mm_image_tokens); image_size, patches and tokens are a square image's at that budget
     * (gm_config_gemma4_image_budget), what plans without data count per image. */
    int64_t n_kv_heads, head_dim, pool, pos_table;
    float rope_theta;
    bool clipped, standardize;
    int64_t max_soft_tokens;
} gm_vision_config;

/* The audio tower (audio_config). Zero: no tower. The encoder fields below `frames_per_s` are
 * Gemma 3n's (Gemma3nAudioConfig: defaults = E2B / E4B, gemma_architecture.md §3.9; each read from
 * audio_config when stated) and what core/audio/gm_audio_encoder.h builds the encoder from. */
typedef struct gm_audio_config {
    int64_t params;               /* parameters of the tower (planning) */
    double tokens_per_s;          /* soft tokens per second of audio (3n: 6.25, 4: 25) */
    int64_t hidden_size, n_layers;
    double frames_per_s;          /* encoder frames per second before reduction */
    int64_t n_mels;               /* input_feat_size (128) */
    int64_t n_heads;              /* conf_num_attention_heads (8) */
    int64_t chunk;                /* conf_attention_chunk_size (12) */
    int64_t context_left;         /* conf_attention_context_left (13: 12 frames back and the frame) */
    int64_t context_right;        /* conf_attention_context_right (0) */
    float logit_cap;              /* conf_attention_logit_cap (50) */
    int64_t conv_kernel;          /* conf_conv_kernel_size (5) */
    int64_t reduction;            /* conf_reduction_factor (4) */
    float residual_weight;        /* conf_residual_weight (0.5) */
    float clip;                   /* gradient_clipping (1e10: the clamps in the forward) */
    float rms_eps;                /* rms_norm_eps (1e-6) */
    float group_norm_eps;         /* sscp_conv_group_norm_eps (1e-3) */
    int64_t sscp_channels[2];     /* sscp_conv_channel_size (128, 32) */
    int64_t sscp_kernel[2][2];    /* sscp_conv_kernel_size ((3, 3), (3, 3)): (time, frequency) */
    int64_t sscp_stride[2][2];    /* sscp_conv_stride_size ((2, 2), (2, 2)) */
    int64_t vocab_size;           /* the embedder's hard tokens (128) */
    int64_t vocab_offset;         /* their first id (262,272) */
    int64_t soft_tokens;          /* audio_soft_tokens_per_image: positions per clip (188) */
    int32_t audio_token_id;       /* <audio_soft_token> 262273 */
    int32_t boa_id, eoa_id;       /* <start_of_audio> 256000, <end_of_audio> 262272 */
    /* Gemma 4 (Gemma4AudioConfig) only */
    int64_t out_dims;             /* output_proj_dims (1536): the tower's output projection; 0 on 3n */
    bool clipped;                 /* use_clipped_linears: the conformer's linears clamp in and out */
} gm_audio_config;

/* Where an image's soft tokens attend to each other bidirectionally (the rest stays causal):
 * Gemma 3 on every layer (token_type_ids, §2.4); Gemma 4 with use_bidirectional_attention
 * "vision" on its sliding layers only (create_masks_for_vision_model: full layers stay causal),
 * without it nowhere (the E-models' configs: null). */
typedef enum gm_image_mask { GM_IMAGE_MASK_ALL = 0, GM_IMAGE_MASK_SLIDING, GM_IMAGE_MASK_NONE } gm_image_mask;

typedef struct gm_config {
    gm_arch arch;
    char name[64];                /* "gemma3-270m", or the file's general.name */
    int64_t vocab_size;           /* V: rows of the embedding table */
    int64_t hidden_size;          /* C (D in the architecture notes) */
    int64_t n_layers;             /* L */
    int64_t n_heads;              /* H */
    int64_t n_kv_heads;           /* KVH */
    int64_t head_dim;             /* D */
    int64_t intermediate_size;    /* F (all layers, Gemma 3); see ffn_dim[] */
    int64_t sliding_window;       /* W */
    int64_t max_position_embeddings;
    float rms_norm_eps;
    float query_pre_attn_scalar;  /* attention scale = query_pre_attn_scalar^-0.5 */
    float final_logit_softcap;    /* 0 = none (Gemma 3); 30 in Gemma 3n/4 */
    float attn_logit_softcap;     /* 0 = none */
    bool tie_word_embeddings;     /* LM head = embedding (all Gemma) */
    gm_norm_convention norm_convention;
    int32_t bos_id, eos_id, pad_id;

    /* Gemma 3n / Gemma 4 parts (0 or 1 = absent; gemma_architecture.md §3-4). The Gemma 3
     * graph ignores them; the memory planner counts them. */
    int64_t ple_dim;              /* per-layer embedding width (3n, 4 E-models: 256) */
    int64_t ple_vocab;            /* rows of the per-layer embedding table (262,144) */
    int64_t altup_inputs;         /* AltUp streams (3n: 4), 1 = none */
    int64_t laurel_rank;          /* LAuReL low-rank branch (3n: 64) */
    int64_t head_dim_full;        /* head_dim of full-attention layers (4: 512); 0 = head_dim */
    int64_t n_kv_heads_full;      /* kv heads of full layers (4: k_eq_v models); 0 = n_kv_heads */
    bool k_eq_v_full;             /* full layers have no v_proj (4: 31B, 26B-A4B) */
    int64_t n_experts;            /* MoE experts per layer (4: 26B-A4B: 128), 0 = dense */
    int64_t experts_top_k;        /* experts per token (8) */
    int64_t expert_ffn;           /* FFN width of one expert (704) */
    gm_vision_config vision;      /* the image tower (Hugging Face's vision_config) */
    gm_image_mask image_mask;     /* which layers let an image's tokens see each other */
    gm_audio_config audio;        /* the audio tower (audio_config) */

    /* per layer */
    gm_layer_type layer_type[GM_MAX_LAYERS];
    float rope_theta[GM_MAX_LAYERS];      /* 10,000 sliding / 1,000,000 full */
    float rope_pos_scale[GM_MAX_LAYERS];  /* 1/factor for linear RoPE scaling, else 1 */
    float rope_partial[GM_MAX_LAYERS];    /* fraction of the head's frequency pairs that rotate
                                             (Gemma 4's proportional RoPE on full layers: 0.25,
                                             partial_rotary_factor); 0 = all (every other model) */
    int64_t ffn_dim[GM_MAX_LAYERS];       /* F per layer (Gemma 3: all = intermediate_size) */
    int32_t kv_source[GM_MAX_LAYERS];     /* layer whose K/V this layer uses (itself for Gemma 3;
                                             Gemma 3n/4 KV sharing points later layers back) */
    float act_sparsity[GM_MAX_LAYERS];    /* Gemma 3n's gaussian top-k target sparsity of the FFN
                                             gate (activation_sparsity_pattern: 0.95 on the first
                                             layers, §3.4 step 6); 0 = dense (Gemma 3 / 4) */
} gm_config;

/* Gemma 3n / 4 KV sharing (gemma_architecture.md §3.5, §4.4; transformers' kv_sharing_modes): the
 * last n_shared layers read the keys and values of the last earlier layer of their own type
 * (sliding / full); the others their own. Uses cfg->layer_type; GM_ERR_INVALID (naming `label`)
 * when a shared layer's type has no earlier layer or n_shared is outside 0..n_layers - 1. */
gm_status gm_config_kv_sharing(gm_config *cfg, int64_t n_shared, const char *label, gm_error *err);

/* Frequency pairs that rotate in layer l's RoPE: floor(rope_partial[l] * D / 2) with D the
 * layer's head width, all D / 2 when rope_partial[l] is 0 (transformers'
 * _compute_proportional_rope_parameters: int(partial_rotary_factor * head_dim // 2)). */
int64_t gm_config_rope_pairs(const gm_config *cfg, int64_t l);

/* Fills the per-layer arrays from the scalar fields for a Gemma 3 model: layer i is full iff
 * (i+1) % pattern == 0 (pattern 6 for Gemma 3), RoPE bases, kv_source[i] = i. */
void gm_config_gemma3_layers(gm_config *cfg, int sliding_pattern, float theta_local,
                             float theta_global, float global_pos_scale);

/* The vision tower of multimodal config mm as a config of its own (arch GM_ARCH_SIGLIP): its
 * width, layers, heads (head_dim = width / heads, as many kv heads), MLP width, LayerNorm eps as
 * rms_norm_eps, every layer full attention, vocab_size = patches (the position table's rows);
 * `vision` copied, so the spec's patch and output widths resolve. GM_ERR_INVALID when mm has no
 * usable tower (naming the missing or inconsistent field). */
gm_status gm_config_vision_tower(const gm_config *mm, gm_config *tower, gm_error *err);

/* Gemma 4: the square image grid of budget max_soft_tokens (transformers'
 * get_aspect_ratio_preserving_size on a square image: side = floor(sqrt(budget k^2) p / (k p)) k p
 * pixels, k the pooling kernel, p the patch) into cfg->vision: max_soft_tokens, image_size, patches
 * and tokens ((side / (k p))^2: 256 at budget 280, 768 x 768 pixels). GM_ERR_INVALID naming the
 * budget when it is not one of 70, 140, 280, 560, 1120 (the processor's _SUPPORTED_SOFT_TOKENS)
 * or the tower has no patch size. */
gm_status gm_config_gemma4_image_budget(gm_config *cfg, int64_t max_soft_tokens, gm_error *err);

/* Whether the model has an audio tower gemmarun runs (Gemma 3n's, Gemma 4 E2B / E4B's). */
static inline bool gm_config_has_audio(const gm_config *c) {
    return c->audio.hidden_size > 0 && c->audio.n_heads > 0 && (c->arch == GM_ARCH_GEMMA3N || c->arch == GM_ARCH_GEMMA4);
}

/* Gemma 3n's audio conformer as a config of its own (arch GM_ARCH_GEMMA3N_AUDIO): width
 * audio_config.hidden_size C, its layers and heads (head_dim C / heads, as many kv heads), the
 * feed-forward width 4 C (Gemma3nAudioConformerFeedForward), every layer full, vocab_size 1 (no
 * table); `audio` copied (the blocks read its clamp, residual weight, attention context, logit cap,
 * kernel width and eps). GM_ERR_INVALID when mm has no audio tower or an inconsistent one. */
gm_status gm_config_audio_tower(const gm_config *mm, gm_config *tower, gm_error *err);

/* Checks internal consistency (positive sizes, H % KVH == 0, layers <= GM_MAX_LAYERS, ...). */
gm_status gm_config_validate(const gm_config *cfg, const char *source, gm_error *err);

struct gm_gguf;
/* From GGUF metadata (general.architecture must be "gemma3"). */
gm_status gm_config_from_gguf(const struct gm_gguf *g, gm_config *cfg, gm_error *err);

/* From a Hugging Face config.json file (Gemma3ForCausalLM, or a multimodal config with
 * "text_config"; Gemma3nForCausalLM (model_type gemma3n_text) or Gemma3nForConditionalGeneration
 * (gemma3n, its text_config; the audio / vision towers' sizes for planning): per-layer FFN widths,
 * KV sharing, activation sparsity, per-layer embeddings, AltUp, LAuReL, weights used directly as
 * norm scales). Gemma 3n's variations gemmarun does not implement (altup_active_idx != 0,
 * altup_correct_scale false, hidden_activation other than gelu_pytorch_tanh) are
 * GM_ERR_UNSUPPORTED naming the key. */
gm_status gm_config_from_json_file(const char *path, gm_config *cfg, gm_error *err);
/* Same, from JSON text in memory; `label` names it in messages. */
gm_status gm_config_from_json(const char *json, const char *label, gm_config *cfg, gm_error *err);

/* Built-in presets of the published sizes: "gemma3-270m", "gemma3-1b", "gemma3-4b",
 * "gemma3-12b", "gemma3-27b", "gemma3n-e2b", "gemma3n-e4b", "gemma4-e2b", "gemma4-e4b",
 * "gemma4-31b", "gemma4-26b-a4b" (Gemma 3n / 4 with their per-layer arrays and tower sizes, for
 * planning). gemma3-4b / 12b / 27b are the multimodal checkpoints (Gemma3ForConditionalGeneration):
 * `vision` holds their SigLIP So400m tower and projector, as a config.json of theirs would;
 * gemma3-270m / 1b are text-only (vision all zero). Returns GM_ERR_NOT_FOUND listing the known
 * names. */
gm_status gm_config_preset(const char *name, gm_config *cfg, gm_error *err);

/* The config as a Hugging Face config.json for Gemma3ForCausalLM (model_type "gemma3_text"), the
 * fields transformers' Gemma3TextConfig writes, with `dtype` ("float32", "bfloat16", ...) as the
 * weights' dtype: layer_types and rope_parameters (transformers >= 5) and the same RoPE as
 * rope_theta / rope_local_base_freq / rope_scaling (older versions). A config with a vision tower
 * (vision.hidden_size > 0) is written as Gemma3ForConditionalGeneration (model_type "gemma3"): the
 * decoder's fields as text_config, the tower as vision_config, mm_tokens_per_image and the image
 * token ids at the top. gm_config_from_json reads it back to the same config. *out: cJSON_Print text, free with cJSON_free. Errors: GM_ERR_UNSUPPORTED
 * for a Gemma 3n / 4 config (not written yet), GM_ERR_NOMEM. */
gm_status gm_config_to_json(const gm_config *c, const char *dtype, char **out, gm_error *err);

/* Number of parameters as the checkpoint stores them (embedding counted once; tied head): the text
 * decoder, for Gemma 3n / 4 also the per-layer embeddings, AltUp, LAuReL and experts, and the
 * vision / audio towers with their projectors (vision.params, audio.params: multimodal Gemma 3
 * presets and config.json files with a vision_config count their SigLIP tower). */
int64_t gm_config_n_params(const gm_config *cfg);

#ifdef __cplusplus
}
#endif
#endif /* GM_CONFIG_H */
