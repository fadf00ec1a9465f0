/*
 * gm_arch.h - one definition per architecture: its spec (weights and activations) and its layer
 * forward with the backward beside it.
 *
 * An architecture file (core/arch/gemma3.c, ...) defines a gm_arch_def:
 *   - the weights, as a table of gm_weight_spec: Hugging Face name, GGUF name, shape written in
 *     config dimensions (gm_dim), kind (linear / norm / embedding), when the layer has it, and
 *     whether LoRA may target it. The loader (core/model/gm_model.c), the quantizer
 *     (core/model/gm_weights.c), LoRA (core/train/gm_lora.c: module names, targets, shapes) and
 *     the memory planner all read this table; nothing else lists weights;
 *   - the activations one layer keeps, as a table of gm_act_spec (width per token, whether
 *     training saves it or only inference uses it) and the backward's workspace. The graph's
 *     layout (core/arch/gm_graph.c) walks these tables to reserve and hand out every buffer -
 *     the same walk the planner runs on a measuring arena, so the plan is the allocation;
 *   - layer_fwd / layer_bwd: the layer, written once on the calls of gm_graph.h, whose behaviour
 *     comes from the graph: a KV cache when decoding, saved activations when training, adapters
 *     applied when attached. Generation, evaluation, label scoring and training all run it.
 *
 * What a new architecture adds: its file here (spec + forward + backward), one line in
 * gm_arch_get (gm_arch.c), its config reader (core/model/gm_config.c). See docs/architecture.md.
 *
 * Ownership: the definitions are static tables. Errors: none here (the loader reports missing or
 * mis-shaped weights with both shapes).
 */
#ifndef GM_ARCH_H
#define GM_ARCH_H

#include "gm_config.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The dimensions shapes and widths are written in (llm.c letters, kernels.h). Per-layer values
 * (head width, kv heads, FFN width) are the layer's own: Gemma 4's full layers differ. */
typedef enum gm_dim {
    GM_DIM_NONE = 0, /* no second dimension (1-D weights) */
    GM_DIM_1,        /* one element per token (RMSNorm's 1/rms) */
    GM_DIM_C,        /* hidden_size */
    GM_DIM_V,        /* vocab_size */
    GM_DIM_D,        /* head_dim of the layer */
    GM_DIM_H,        /* query heads */
    GM_DIM_KVH,      /* kv heads of the layer */
    GM_DIM_QW,       /* H * D */
    GM_DIM_KW,       /* KVH * D */
    GM_DIM_F,        /* FFN width of the layer */
    GM_DIM_R,        /* LoRA rank */
    GM_DIM_PATCH,    /* values per image patch of a vision tower: channels x patch x patch */
    GM_DIM_OUT,      /* width a tower projects into (the text decoder's hidden_size) */
    GM_DIM_P,        /* per-layer-input width (Gemma 3n: hidden_size_per_layer_input) */
    GM_DIM_LP,       /* per-layer inputs of all layers: n_layers x P */
    GM_DIM_PV,       /* rows of the per-layer embedding table (vocab_size_per_layer_input) */
    GM_DIM_LR,       /* LAuReL rank */
    GM_DIM_S,        /* AltUp streams (altup_num_inputs) */
    GM_DIM_SS,       /* S x S (AltUp's prediction coefficients per token) */
    GM_DIM_SC,       /* S x C (all AltUp streams of a token) */
    GM_DIM_L,        /* n_layers (one value per layer per token: the per-layer inputs' 1/rms) */
    GM_DIM_C2,       /* 2 C (a GLU's input: Gemma 3n's audio light convolution) */
    GM_DIM_KWF,      /* KVH x D of a full-attention layer (Gemma 4's wider full layers), whatever
                        layer asks */
    /* Gemma 4's mixture of experts (26B-A4B): E experts of FFN width Fe, K of them per token */
    GM_DIM_E,        /* n_experts */
    GM_DIM_K,        /* experts_top_k */
    GM_DIM_FE,       /* expert_ffn */
    GM_DIM_KC,       /* K x C (a token's K expert slots of width C) */
    GM_DIM_KFE,      /* K x Fe */
    GM_DIM_E2FE,     /* E x 2 Fe: the experts' stacked gate-and-up matrices, as rows */
    GM_DIM_EC,       /* E x C: the experts' stacked down matrices, as rows */
    GM_DIM_2,        /* two values per token: a patch's (x, y) grid position (Gemma 4's tower) */
    GM_DIM_COUNT
} gm_dim;

/* The value of d in layer `layer` of config c (layer < 0 for model-level weights); rank for
 * GM_DIM_R. */
int64_t gm_dim_value(const gm_config *c, int64_t layer, gm_dim d, int64_t rank);

typedef enum gm_wkind {
    GM_W_LINEAR = 0, /* a matrix the forward multiplies by (any stored dtype, re-encodable) */
    GM_W_NORM,       /* RMSNorm weight: copied to f32 as the effective scale (1 + w or w) */
    GM_W_EMBED,      /* embedding table (also the tied LM head); gathered by rows */
    GM_W_VEC,        /* a vector used as stored (LayerNorm weight or bias, a linear's bias):
                        copied to f32, no 1 + w */
    GM_W_KIND_COUNT
} gm_wkind;

/* When a layer (or the model) has the weight. */
typedef enum gm_wcond {
    GM_WHEN_ALWAYS = 0,
    GM_WHEN_OWN_KV,  /* the layer computes its own keys and values (kv_source[l] == l) */
    GM_WHEN_OWN_V,   /* ... and its own values (not a k_eq_v full layer of Gemma 4: V = K) */
    GM_WHEN_UNTIED,  /* the LM head is not the embedding */
    GM_WHEN_SPARSE,  /* the layer's FFN gate has activation sparsity (Gemma 3n's first layers) */
    GM_WHEN_PLE,     /* the model has per-layer embeddings (ple_dim > 0: Gemma 4's E-models) */
    GM_WHEN_KV_SHARED, /* the model has KV-shared layers (some kv_source[l] != l) */
    GM_WHEN_MOE,     /* the model has a mixture of experts beside each MLP (n_experts > 0) */
    GM_WHEN_CLIPPED, /* Gemma 4's vision tower clamps its linears' inputs and outputs
                        (use_clipped_linears: the Gemma4ClippableLinear buffers) */
    GM_WHEN_STANDARDIZE, /* Gemma 4's vision tower standardizes its soft tokens (standardize) */
    GM_WHEN_ABSENT,  /* a common slot the architecture lacks (Gemma 4's tower: no final norm) */
} gm_wcond;

typedef struct gm_weight_spec {
    const char *hf;   /* Hugging Face name below "<prefix>layers.N." (layer weights) or "<prefix>"
                         (model weights); the LoRA module name is it without ".weight" */
    const char *gguf; /* GGUF name below "blk.N." (layer weights) or at the top level */
    gm_wkind kind;
    gm_dim rows, cols; /* shape, outermost first (cols GM_DIM_NONE: 1-D) */
    gm_wcond when;
    int lora_id;      /* -1: LoRA never targets it; else a stable small id that seeds the
                         adapter's initialization and dropout streams (never renumber: it would
                         change every run's numbers) */
    bool top_level;   /* named below the model's root instead of its prefix (lm_head.weight; a
                         tower's projector: gm_model.root) */
    bool transposed;  /* a linear the checkpoint stores as (in, out) - Gemma 3's
                         mm_input_projection_weight: copied to f32 as (out, in) at load */
    bool stacked;     /* a stack of n_experts matrices [E, out, in] viewed as (E out, in) and
                         multiplied by blocks of rows (Gemma 4's experts, gm_wview_rows); under NF4
                         kept as stored when one matrix is not a whole number of the format's
                         statistics groups (GM_NF4_ROWS_ALIGN elements: every published expert is) */
} gm_weight_spec;

/* How training and inference use an activation. */
typedef enum gm_act_use {
    GM_ACT_BOTH = 0, /* written by the forward in both modes; saved for the backward in training */
    GM_ACT_TRAIN,    /* kept only for the backward (1/rms, log-sum-exp): NULL at inference */
} gm_act_use;

typedef struct gm_act_spec {
    const char *name; /* for plans and messages */
    gm_dim width;     /* floats per token (N = B*T rows) */
    gm_wcond when;    /* layers that have it */
    gm_act_use use;
} gm_act_spec;

/* Model-level weights every Gemma architecture has, at these indices of its `globals` table (a
 * vision tower: its position embedding, post-layernorm weight, and the embedding again as a
 * tied "head" that is never read). */
enum { GM_GLOBAL_EMBED = 0, GM_GLOBAL_FINAL_NORM = 1, GM_GLOBAL_LM_HEAD = 2 };
#define GM_MAX_GLOBALS 16 /* SigLIP has 8, Gemma 3n 12 */
#define GM_MAX_LAYER_WEIGHTS 64 /* the audio conformer: 22 + 40 clip bounds (Gemma 4's; each arch
                                   file asserts its count fits) */

struct gm_graph;

typedef struct gm_arch_def {
    gm_arch id;
    const char *name;                  /* "gemma3" */
    const char *layers_prefix;         /* below the model prefix: "layers." (Gemma decoders),
                                          "encoder.layers." (SigLIP) */
    bool encoder;                      /* every position sees every other (a vision tower): no
                                          KV cache, no token embedding; gm_graph_begin_encoder */
    bool own_attention;                /* the layer calls its own attention kernel (Gemma 3n's audio
                                          conformer: chunked local attention), not
                                          gm_graph_attention: no workspace is reserved for it */
    const gm_weight_spec *globals;     /* model-level weights, GM_GLOBAL_* first */
    int n_globals;
    const gm_weight_spec *layer;       /* per-layer weights; a weight's slot is its index */
    int n_layer;
    const gm_act_spec *acts;           /* what one layer keeps (the record) */
    int n_acts;
    const gm_act_spec *grads;          /* the backward's workspace, one layer at a time */
    int n_grads;
    /* multiplier of the token embedding rows (Gemma: sqrt(hidden_size), in f32); NULL for an
     * encoder */
    float (*embed_scale)(const gm_config *c);
    /* Gemma 3n: the residual stream is S = altup_inputs streams of C (X[l] is (S, N, C), stream
     * 0 first); false: one stream (N, C) */
    bool altup;
    /* model-level activations of one call (per token; the graph's `mrec`, one set whatever the
     * mode): Gemma 3n's per-layer inputs. NULL / 0: none */
    const gm_act_spec *model_acts;
    int n_model_acts;
    /* after the token embeddings (and soft tokens) are in X[0]'s stream 0: the rest of X[0] and
     * the model activations (Gemma 3n: the other AltUp streams, the per-layer inputs). NULL: none */
    void (*front)(struct gm_graph *g);
    /* backward of front, when the graph's front_grad asks for it (an encoder's soft tokens learn
     * upstream): g->g holds dL/dX[0] (RW wide) on entry; on exit its stream 0 holds dL/d(the
     * input rows the front read). NULL with front NULL (X[0] is the input) */
    void (*front_bwd)(struct gm_graph *g);
    /* the hidden state (N, C) the final norm reads, from X[L], into out (Gemma 3n: the streams
     * unembedded, magnitude-matched and averaged). NULL: X[L] is it */
    void (*head)(struct gm_graph *g, float *out);
    /* backward of head: dout (N, C) in, dL/dX[L] into g->g (assigned); NULL with head NULL */
    void (*head_bwd)(struct gm_graph *g, const float *dout);
    /* layer l: g->X[l] -> g->X[l+1] (gm_graph.h) */
    void (*layer_fwd)(struct gm_graph *g, int64_t l);
    /* layer l: g->g holds dL/dX[l+1] on entry and dL/dX[l] on exit; adapter gradients +=.
     * NULL: no backward yet (the architecture generates and evaluates, training refuses it) */
    void (*layer_bwd)(struct gm_graph *g, int64_t l);
    /* layer_bwd sends a KV-shared layer's key / value gradients to its source layer, and the
     * training forward keeps the source's keys and values apart under activation checkpointing
     * (Gemma 3n); false: training refuses configs with KV sharing */
    bool kv_sharing_bwd;
} gm_arch_def;

/* The definition of an architecture, or NULL when gemmarun has its presets and memory estimates
 * but no forward for it. */
const gm_arch_def *gm_arch_get(gm_arch a);

/* True when the weight exists in layer l (layer < 0: a model-level weight) of config c. */
bool gm_weight_present(const gm_weight_spec *w, const gm_config *c, int64_t layer);

/* Index of the layer weight whose Hugging Face name is `hf` (e.g. "self_attn.q_proj.weight"),
 * or -1. */
int gm_arch_slot(const gm_arch_def *a, const char *hf);

extern const gm_arch_def gm_arch_gemma3;
extern const gm_arch_def gm_arch_gemma3n;
extern const gm_arch_def gm_arch_siglip;
extern const gm_arch_def gm_arch_gemma3n_audio;
extern const gm_arch_def gm_arch_gemma4;
extern const gm_arch_def gm_arch_gemma4_vision;
extern const gm_arch_def gm_arch_gemma4_audio;

/* The width of the residual stream X[l] per token: C, or S x C for an AltUp architecture. */
int64_t gm_arch_residual_width(const gm_arch_def *a, const gm_config *c);

/* ---- SigLIP (core/arch/siglip.c): the vision tower's extra model-level weights, front, head -- */

/* Its globals beyond GM_GLOBAL_* (position embedding, post-layernorm weight, tied slot). */
enum {
    GM_SIGLIP_POST_LN_B = 3, /* post_layernorm.bias */
    GM_SIGLIP_PATCH,         /* patch embedding (C, 3 p p): the conv as a matrix */
    GM_SIGLIP_PATCH_B,
    GM_SIGLIP_MM_NORM,       /* the projector's RMSNorm (Gemma's 1 + w) */
    GM_SIGLIP_MM_PROJ,       /* the projector (C_text, C), transposed at load */
    GM_SIGLIP_GLOBALS
};

/* Buffers of the head (backend memory): post (N, C), mean / rstd (N), pooled / normed (R, C),
 * rstd_mm (R), out (R, C_text) with R = images x tokens per image.
 * A trained projector (PEFT's modules_to_save = ["multi_modal_projector"]) replaces the
 * weights' own: proj (C, C_text) in the checkpoint's orientation (mm_input_projection_weight,
 * out = normed . proj) and norm_scale (C) the RMSNorm's effective scale 1 + w; NULL: the
 * weights'. Backward (gm_siglip_head_bwd): dout (R, C_text) in; dnormed, dpooled (R, C) and
 * dpost (N, C) workspace; dproj (C, C_text) and dnorm (C) accumulate when not NULL. */
typedef struct gm_siglip_head_bufs {
    float *post, *mean, *rstd, *pooled, *normed, *rstd_mm, *out;
    float *std_nbias; /* Gemma 4 (standardize): -std_bias (C), what the head adds before scaling */
    int32_t *pool_src; /* Gemma 4: (rows, k^2) each soft token's patch rows of X[L] (backend) */
    int64_t rows;      /* Gemma 4: soft tokens of the last call (its images' cells, packed) */
    const float *proj, *norm_scale;
    float *dout, *dnormed, *dpooled, *dpost, *dproj, *dnorm;
} gm_siglip_head_bufs;

/* X[0] (N, C) of an encoder graph begun with gm_graph_begin_encoder (T = patches per image) from
 * patches (N, 3 p p) in backend memory: patch embedding + bias + position embedding. */
void gm_siglip_embed(struct gm_graph *g, const float *patches);
/* The soft tokens b->out (images x tokens, C_text) from X[L]: post-layernorm, average pooling,
 * the projector's RMSNorm and projection (gemma_architecture.md §2.2). */
void gm_siglip_head(struct gm_graph *g, const gm_siglip_head_bufs *b);
/* Backward of gm_siglip_head from b->dout: the projector's gradients into b->dproj / b->dnorm
 * (accumulated, each when not NULL) and, when `into_tower`, dL/dX[L] into the graph's residual
 * gradient g->g (assigned) for the tower's layer_bwd. The post-layernorm is frozen. */
void gm_siglip_head_bwd(struct gm_graph *g, const gm_siglip_head_bufs *b, bool into_tower);

/* ---- Gemma 4's vision tower (core/arch/gemma4_vision.c): extra globals, front, head ---------- */

enum {
    GM_G4V_PATCH = 3,   /* patch_embedder.input_proj (C, 3 p p), on patches in (y, x, channel) order */
    GM_G4V_STD_BIAS,    /* std_bias (C), standardize only */
    GM_G4V_STD_SCALE,   /* std_scale (C) */
    GM_G4V_PROJ,        /* embed_vision.embedding_projection (C_text, C) */
    GM_G4V_GLOBALS
};

/* X[0] (N, C) of an encoder graph begun with gm_graph_begin_encoder (T = patches per image) from
 * patches (N, 3 p p) in backend memory, already 2 (x - 0.5) (the model's own rescale: what Gemma 3's
 * processor normalization gives), and each patch's grid column and row xy (2, N) host int32
 * (x's first): input_proj(patches) + table[0][x] + table[1][y] (Gemma4VisionPatchEmbedder). */
void gm_gemma4_vision_embed(struct gm_graph *g, const float *patches, const int32_t *xy);
/* The soft tokens b->out (b->rows, C_text) from X[L]: each the average of its k x k patches
 * (b->pool_src; Gemma4VisionPooler), times sqrt(C), standardized when the config says, RMSNorm
 * without weight, embedding_projection (Gemma4MultimodalEmbedder). b->pooled holds the standardized
 * pooled rows (the RMSNorm's input); b->post is not used. */
void gm_gemma4_vision_head(struct gm_graph *g, const gm_siglip_head_bufs *b);
/* Backward of gm_gemma4_vision_head from b->dout into g->g = dL/dX[L] (assigned); the embedder
 * is frozen. */
void gm_gemma4_vision_head_bwd(struct gm_graph *g, const gm_siglip_head_bufs *b);

#ifdef __cplusplus
}
#endif
#endif /* GM_ARCH_H */
