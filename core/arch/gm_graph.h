/*
 * gm_graph.h - the context an architecture's forward and backward run in: buffers, mode, cache,
 * adapters, backend. One forward for generation, evaluation, label scoring and training.
 *
 * An architecture writes its layer once (core/arch/gemma3.c) on the calls below; the graph
 * decides what they do:
 *   - mode GM_GRAPH_INFER (generation): the activations of a layer are scratch shared by all
 *     layers, the residual stream is updated in place (X[l] are one buffer), keys and values go
 *     into per-layer KV caches (ring buffers on sliding layers) and attention reads the cache;
 *   - mode GM_GRAPH_TRAIN (training, evaluation, scoring): whole sequences from position 0, every
 *     layer keeps its record of activations for the backward (or, under activation
 *     checkpointing, only its input X[l], and the record is recomputed before its backward);
 *   - with adapters attached (gm_lora), every linear adds its LoRA update, with dropout when the
 *     graph's dropout is on (training forward and the matching backward).
 * Calls are the same in both modes: gm_graph_linear, gm_graph_attention, and the kernels of the
 * backend's table for the rest (norms, RoPE, activations).
 *
 * Memory: gm_graph_layout reserves every buffer by walking the architecture's activation spec
 * (gm_arch.h) for (batch, tokens) - on a measuring arena for the plan, then on the committed one
 * to hand out pointers (gm_arena.h). Backend buffers go to `a`, host staging (token ids and
 * positions before upload) to `host`. Nothing is allocated per call.
 *
 * Ownership: the graph borrows the config, the weights, the adapters and the backend (all must
 * outlive it) and owns its pointer tables (gm_graph_free). Buffers belong to the arenas.
 * Errors: gm_graph_begin returns GM_ERR_INVALID for inputs that do not fit the layout (naming
 * the numbers) before touching any buffer; device failures surface from gm_backend_status.
 * Thread-safety: one graph per thread.
 */
#ifndef GM_GRAPH_H
#define GM_GRAPH_H

#include "gm_arch.h"
#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_lora.h"
#include "gm_status.h"
#include "gm_weights.h"
#include "kernels.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_graph_mode { GM_GRAPH_INFER = 0, GM_GRAPH_TRAIN = 1 } gm_graph_mode;

typedef struct gm_graph_opts {
    gm_graph_mode mode;
    int64_t batch;          /* B: sequences per call */
    int64_t max_tokens;     /* T_max: tokens per sequence per call (training: max_length) */
    int64_t ctx;            /* inference: positions per sequence the KV caches hold */
    bool checkpointing;     /* training: keep only block inputs, recompute each record */
    int64_t lm_rows;        /* rows of the LM head computed at once (scratch sizing) */
    int64_t rank;           /* LoRA rank the adapter buffers are sized for (0: no adapters) */
    int n_threads;          /* CPU threads the kernels' workspace is sized for */
} gm_graph_opts;

/* One call's input: B sequences of T tokens (row n = b*T + t), host memory. */
typedef struct gm_graph_input {
    int64_t B, T;
    const int32_t *ids;       /* (B, T) token ids */
    int64_t pos0;             /* position of t = 0 (inference: positions already cached) */
    /* Soft tokens (image / audio embeddings, already in the text width): row embed_rows[i] of
     * the input takes embeds[i] (C floats) instead of its token's embedding, unscaled, as
     * Hugging Face's masked_scatter of image features does (gemma_architecture.md §2). */
    const float *embeds;      /* (n_embeds, C) */
    const int64_t *embed_rows;
    int64_t n_embeds;
    /* More host rows, each read from its own place (Gemma 3n's hard multimodal tokens: rows of
     * gm_mm_hard's tables, gm_mm_embed.h): row ptr_rows[i] takes ptr_embeds[i] (C floats). */
    const float *const *ptr_embeds;
    const int64_t *ptr_rows;
    int64_t n_ptr_embeds;
    /* Soft tokens already in backend memory (an encoder's output: Gemma 3n's audio): row
     * dev_rows[i] (backend int32, n_dev_embeds of them, each < B T; the caller checked them) takes
     * row i of dev_embeds (n_dev_embeds, C), backend. All rows above are placed before the
     * architecture's front (Gemma 3n's per-layer inputs and AltUp streams read X[0]). */
    const float *dev_embeds;
    const int32_t *dev_rows;
    int64_t n_dev_embeds;
    /* (B, T) or NULL: the end (exclusive, absolute position) of the keys each query sees, for
     * image tokens that see their whole image (gm_mm_kv_end, gemma_architecture.md §2.4);
     * NULL: causal. */
    const int32_t *kv_end;
    /* The caller writes more rows of X[0] after gm_graph_begin (the trainer's images, straight
     * from the tower's output), then calls gm_graph_front: the front must read them (Gemma 4's
     * per-layer inputs project every row of X[0], soft tokens included). */
    bool late_rows;
} gm_graph_input;

typedef struct gm_graph {
    const gm_arch_def *arch;
    const gm_config *cfg;
    gm_backend *be;
    const gm_kernel_table *k;   /* be->k */
    gm_kctx kc;                 /* be's context with the graph's scratch */
    const gm_weights *w;
    const gm_lora *lora;        /* NULL: no adapters */
    gm_graph_opts o;
    int64_t n_rec;              /* records: L (training), 1 (checkpointing, inference) */
    /* this call */
    int64_t B, T, N, pos0;
    bool dropout;               /* LoRA dropout on (training forward and its backward) */
    uint64_t dropout_step, dropout_micro; /* RNG stream of the masks (same in a recompute) */
    /* buffers, backend memory */
    float *X[GM_MAX_LAYERS + 1]; /* (N, RW): input of layer l; X[L] the final residual. Inference:
                                    all the same buffer (updated in place). RW = C, or S x C
                                    stream-major (S, N, C) for AltUp (gm_arch_residual_width) */
    float **mrec;               /* [arch->n_model_acts]: (N, width) model-level activations */
    float *head_out;            /* (N, C): arch->head's output (NULL without a head) */
    int32_t *ple_ids;           /* (N): ids into the per-layer embedding table (Gemma 3n: ids past
                                   it read row 0, as transformers' get_per_layer_inputs) */
    int32_t *ple_sel;           /* (L, N): row n L + l of a token-major (N, L, P) buffer for row
                                   l N + n of its layer-major copy (gather_rows) */
    float **rec;                /* [n_rec * arch->n_acts]: (N, width) per activation, or NULL */
    float **lora_u;             /* [n_rec * arch->n_layer]: (N, r) adapter intermediates */
    float **grad;               /* [arch->n_grads]: backward workspace (training) */
    float *g;                   /* (N, C) gradient of the residual stream (training) */
    float *lora_x, *lora_t;     /* (N, in_max): dropout(x), dv A before dropout */
    float *lora_dv;             /* (N, r) */
    int32_t *ids, *pos;         /* (N) */
    int32_t *kv_end;            /* (N): this call's key ends (gm_graph_input.kv_end) */
    bool has_kv_end;            /* this call has them (else attention is causal) */
    bool front_grad;            /* training: the input rows' gradient is wanted (an encoder's
                                   soft tokens learn): layer_bwd keeps what the front's backward
                                   reads (gm_graph_backward) */
    const uint8_t *row_valid;   /* (N) backend bytes or NULL: an encoder's real rows (Gemma 3n's
                                   audio frames; 0: padding), set by its owner before a call */
    float *k_cache[GM_MAX_LAYERS], *v_cache[GM_MAX_LAYERS]; /* (B, S_l, KW): inference */
    int64_t cache_slots[GM_MAX_LAYERS];                      /* S_l (0: reads another layer's) */
    float *scratch;             /* kernel workspace */
    size_t scratch_floats;
    /* host staging */
    int32_t *host_ids, *host_pos, *host_kv_end, *host_ple_ids; /* (N) */
    int32_t *host_ple_sel;      /* (L, N) */
    /* a mixture of experts (Gemma 4 26B-A4B; NULL without): the routing read back to group each
     * layer's token slots by expert (gm_graph_moe_group) */
    int32_t *host_moe;          /* (3, N K): chosen experts, then slot of each choice, token of each slot */
    int64_t *moe_off;           /* (L, E + 1): layer l's slots of expert e are [off[e], off[e + 1]) */
    int64_t *moe_load;          /* (L, E): slots each expert took since the owner last cleared it
                                   (training forwards only, recomputes not counted): the router load
                                   statistics */
    bool recomputing;           /* inside gm_graph_backward's checkpointing recompute */
} gm_graph;

/* ---- create / layout / destroy ------------------------------------------------------------ */

/* Sets up a graph (pointer tables only; no buffers). lora may be NULL. GM_ERR_UNSUPPORTED for an
 * architecture without a definition, GM_ERR_INVALID for bad sizes, GM_ERR_NOMEM. */
gm_status gm_graph_init(gm_graph *g, const gm_config *cfg, const gm_weights *w, const gm_lora *lora, gm_backend *be,
                        const gm_graph_opts *o, gm_error *err);
void gm_graph_free(gm_graph *g);

/* One pass of the arena protocol: reserves / hands out every buffer (see the file comment).
 * `be` may be NULL on measuring arenas (planning without a backend). */
void gm_graph_layout(gm_graph *g, gm_arena *a, gm_arena *host);

/* ---- forward ------------------------------------------------------------------------------ */

/* Checks and uploads one call's input (ids, positions pos0 .. pos0+T-1), then writes the input
 * embeddings into X[0] (token rows scaled by the architecture's embed_scale, soft tokens as
 * given). GM_ERR_INVALID (id outside the vocabulary, T over the layout, past the cache, soft row
 * outside the input). */
gm_status gm_graph_begin(gm_graph *g, const gm_graph_input *in, gm_error *err);
/* The architecture's front on X[0] (gm_graph_begin runs it, unless its input had late_rows). */
void gm_graph_front(gm_graph *g);

/* For an encoder architecture (arch->encoder: a vision tower): sets up a call of B sequences of
 * T positions, every position seeing every other; the caller's front (e.g. gm_siglip_embed)
 * writes X[0]. GM_ERR_INVALID when B or T do not fit the layout. */
gm_status gm_graph_begin_encoder(gm_graph *g, int64_t B, int64_t T, gm_error *err);
/* The same with items of their own lengths, padded to T: item b's keys end at lens[b] (its
 * positions past lens[b] are padding: they see its keys, none sees them). */
gm_status gm_graph_begin_encoder_lens(gm_graph *g, int64_t B, int64_t T, const int64_t *lens, gm_error *err);

/* Runs layers [0, L): X[0] -> X[L]. */
void gm_graph_forward(gm_graph *g);

/* The final hidden rows (R, C) before the final norm: rows[r] of X[L] (device indices), or of
 * the architecture's head when it has one (Gemma 3n: its AltUp streams unembedded and averaged,
 * computed for all N rows). */
void gm_graph_hidden_rows(gm_graph *g, float *out, const int32_t *rows, int64_t R);

/* Layer l's record: the arch's activations by index (entries NULL where the layer has none). */
float **gm_graph_record(const gm_graph *g, int64_t l);

/* ---- the calls architectures are written on ----------------------------------------------- */

/* y (N, out) = x (N, in) W^T for layer l's linear in `slot`, plus the adapter's
 * scaling * B (A dropout(x)) when one is attached; the adapter's intermediate u (N, r) is kept in
 * the record for the backward. */
void gm_graph_linear(gm_graph *g, int64_t l, int slot, float *y, const float *x);

/* gm_graph_linear for the n <= GM_MATMUL_MULTI_MAX linears of layer l in slots[i] that read the same
 * x (q / k / v, gate / up): y[i] (N, out_i), the same numbers as n gm_graph_linear calls; their base
 * weights in one matmul_fwd_multi (one parallel region when decoding on the CPU), then each adapter. */
void gm_graph_linear_multi(gm_graph *g, int64_t l, int n, const int *slots, float *const *y, const float *x);

/* Backward of gm_graph_linear: dx (N, in) = beta * dx + dy W (+ the adapter's input gradient);
 * the adapter's dA, dB accumulate. x is the forward input. */
void gm_graph_linear_bwd(gm_graph *g, int64_t l, int slot, float *dx, const float *dy, const float *x, float beta);

/* Gemma 4's clipped linear (transformers' Gemma4ClippableLinear, both towers): out (N, n_out) =
 * clamp(clamp(in, lo_in, hi_in) W^T, lo_out, hi_out), W the slot's linear with its adapter (LoRA
 * inside the clamps), the four bounds the layer's weight slots clip0 .. clip0 + 3 (input min, input
 * max, output min, output max; read on the device). cin (N, n_in) receives the clamped input (what
 * W multiplied), raw (N, n_out; NULL at inference) the output before its clamp. */
void gm_graph_linear_clipped(gm_graph *g, int64_t l, int slot, int clip0, float *out, float *raw, float *cin,
                             const float *in, int64_t n_in, int64_t n_out);

/* Its backward: dy (N, n_out) = dL/dout; dyc (N, n_out) receives dy masked by the output clamp (dyc
 * may be dy: then dy is overwritten); dx (N, n_in) = beta dx + dL/din, in the forward's input; tmp
 * (N, n_in) workspace; the adapter's gradients accumulate. */
void gm_graph_linear_clipped_bwd(gm_graph *g, int64_t l, int slot, int clip0, float *dx, const float *dy, float *dyc,
                                 const float *raw, const float *cin, const float *in, float *tmp, int64_t n_in,
                                 int64_t n_out, float beta);

/* The key ends layer l's attention uses: the call's kv_end (gm_graph_input) where the config lets
 * an image's tokens see each other on this layer (gm_config.image_mask; an encoder: always), else
 * NULL (causal). */
const int32_t *gm_graph_kv_end(const gm_graph *g, int64_t l);

/* Attention of layer l: out (N, H*D) from q (N, H*D, normed and rotated), with causal masking (or
 * the call's kv_end: images seen whole; an encoder sees everything) and the layer's sliding
 * window, scale `scale`. k, v (N, KW): the layer's own keys and values, or
 * NULL on a layer that reads layer kv_source[l]'s (then k_src / v_src: that layer's, training).
 * Inference: own keys and values are stored into the layer's cache at the call's positions and
 * attention reads the cache. Training: whole sequences; lse (B, H, T) is saved. */
void gm_graph_attention(gm_graph *g, int64_t l, float *out, float *lse, const float *q, const float *k,
                        const float *v, float scale);

/* Groups layer l's routing by expert: idx (N K) int32 in backend memory (moe_route_fwd's) is read
 * back; slot (N K) gets the row of each (token, choice) in the expert-sorted order and sel (N K) the
 * token of each row (both backend int32); the offsets go to moe_off[l]. Counts into moe_load in a
 * training forward. */
void gm_graph_moe_group(gm_graph *g, int64_t l, const int32_t *idx, int32_t *slot, int32_t *sel);

/* ---- backward ---------------------------------------------------------------------------- */

/* Layers L-1 .. 0 from dL/dX[L] in g->g (each layer's record recomputed first under activation
 * checkpointing), then, with front_grad, the front's backward: g->g's first N C floats hold dL/d
 * the input rows (soft tokens included). Adapters' gradients accumulate. */
void gm_graph_backward(gm_graph *g);

/* ---- the model's head --------------------------------------------------------------------- */
/* Every call's residual width (C, or S x C for AltUp). */
#define GM_GRAPH_RW(g) gm_arch_residual_width((g)->arch, (g)->cfg)

/* out (R, C) = final RMSNorm of x (R, C); rstd (R) saved when not NULL. */
void gm_graph_final_norm(gm_graph *g, float *out, float *rstd, const float *x, int64_t R);
/* out (R, Vc) = h (R, C) E[v0 : v0 + Vc]^T, the LM head's vocabulary rows v0.. (no soft-cap). */
void gm_graph_lm_head(gm_graph *g, float *out, const float *h, int64_t R, int64_t v0, int64_t Vc);

/* The weight view (kernels.h) of layer l's weight in `slot` on the graph's backend. */
const gm_wview *gm_graph_weight(const gm_graph *g, int64_t l, int slot);
/* The f32 data of layer l's norm weight in `slot` (backend memory). */
const float *gm_graph_norm(const gm_graph *g, int64_t l, int slot);

#ifdef __cplusplus
}
#endif
#endif /* GM_GRAPH_H */
