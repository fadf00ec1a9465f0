/*
 * gemma_decoder.h - the weights every Gemma decoder layer has, written once for the architecture
 * files that share them (gemma3.c, gemma3n.c, gemma4.c), and what Gemma 3n and Gemma 4 share
 * beyond them (core/arch/gemma_decoder.c): the per-layer inputs and KV sharing in training.
 * Private to core/arch.
 *
 * An including file starts its layer-slot enum with GM_GEMMA_DECODER_SLOTS (the attention and MLP
 * weights, in this order: also the order of adapters in checkpoints and results) and its tables
 * with GM_GEMMA_DECODER_WEIGHTS and GM_GEMMA_DECODER_GLOBALS (designated initializers on those
 * slots and on GM_GLOBAL_*). lora_id 0..6 are stable RNG stream ids of the seven linears: never
 * renumber them. Names: Hugging Face's below "layers.N." / the model prefix, and llama.cpp's GGUF
 * names. Ownership / errors: static tables only.
 */
#ifndef GM_GEMMA_DECODER_H
#define GM_GEMMA_DECODER_H

#include "gm_arch.h"

#define GM_GEMMA_DECODER_SLOTS                                                                                          \
    W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_Q_NORM, W_K_NORM, W_POST_ATTN_NORM, W_FFN_NORM, W_GATE, W_UP, W_DOWN,          \
        W_POST_FFW_NORM

#define GM_GEMMA_DECODER_WEIGHTS                                                                                        \
    [W_ATTN_NORM] = {"input_layernorm.weight", "attn_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS,  \
                     -1, false},                                                                                        \
    [W_Q] = {"self_attn.q_proj.weight", "attn_q.weight", GM_W_LINEAR, GM_DIM_QW, GM_DIM_C, GM_WHEN_ALWAYS, 0, false},   \
    [W_K] = {"self_attn.k_proj.weight", "attn_k.weight", GM_W_LINEAR, GM_DIM_KW, GM_DIM_C, GM_WHEN_OWN_KV, 1, false},   \
    [W_V] = {"self_attn.v_proj.weight", "attn_v.weight", GM_W_LINEAR, GM_DIM_KW, GM_DIM_C, GM_WHEN_OWN_V, 2, false},    \
    [W_O] = {"self_attn.o_proj.weight", "attn_output.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_QW, GM_WHEN_ALWAYS, 3,      \
             false},                                                                                                    \
    [W_Q_NORM] = {"self_attn.q_norm.weight", "attn_q_norm.weight", GM_W_NORM, GM_DIM_D, GM_DIM_NONE, GM_WHEN_ALWAYS,   \
                  -1, false},                                                                                           \
    [W_K_NORM] = {"self_attn.k_norm.weight", "attn_k_norm.weight", GM_W_NORM, GM_DIM_D, GM_DIM_NONE, GM_WHEN_OWN_KV,   \
                  -1, false},                                                                                           \
    [W_POST_ATTN_NORM] = {"post_attention_layernorm.weight", "post_attention_norm.weight", GM_W_NORM, GM_DIM_C,       \
                          GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false},                                                      \
    [W_FFN_NORM] = {"pre_feedforward_layernorm.weight", "ffn_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE,          \
                    GM_WHEN_ALWAYS, -1, false},                                                                         \
    [W_GATE] = {"mlp.gate_proj.weight", "ffn_gate.weight", GM_W_LINEAR, GM_DIM_F, GM_DIM_C, GM_WHEN_ALWAYS, 4, false},  \
    [W_UP] = {"mlp.up_proj.weight", "ffn_up.weight", GM_W_LINEAR, GM_DIM_F, GM_DIM_C, GM_WHEN_ALWAYS, 5, false},        \
    [W_DOWN] = {"mlp.down_proj.weight", "ffn_down.weight", GM_W_LINEAR, GM_DIM_C, GM_DIM_F, GM_WHEN_ALWAYS, 6, false},  \
    [W_POST_FFW_NORM] = {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", GM_W_NORM, GM_DIM_C,            \
                         GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false}

/* The LM head is the embedding in every published Gemma checkpoint (tie_word_embeddings); an
 * untied head is read from lm_head.weight / output.weight. */
#define GM_GEMMA_DECODER_GLOBALS                                                                                        \
    [GM_GLOBAL_EMBED] = {"embed_tokens.weight", "token_embd.weight", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_ALWAYS,   \
                         -1, false},                                                                                    \
    [GM_GLOBAL_FINAL_NORM] = {"norm.weight", "output_norm.weight", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS,   \
                              -1, false},                                                                               \
    [GM_GLOBAL_LM_HEAD] = {"lm_head.weight", "output.weight", GM_W_EMBED, GM_DIM_V, GM_DIM_C, GM_WHEN_UNTIED, -1, true}

/* The backward's workspace for the attention and the MLP (widths per token), on an including
 * file's enumerators G_DXN .. G_DH; G_DXN: the gradient of a pre-norm output. */
#define GM_GEMMA_DECODER_GRADS                                                                                          \
    [G_DXN] = {"dxn", GM_DIM_C, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                         \
    [G_DQ] = {"dq", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                          \
    [G_DATT] = {"datt", GM_DIM_QW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                      \
    [G_DK] = {"dk", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                          \
    [G_DV] = {"dv", GM_DIM_KW, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                          \
    [G_DGATE] = {"dgate", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                     \
    [G_DUP] = {"dup", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN},                                                         \
    [G_DH] = {"dh", GM_DIM_F, GM_WHEN_ALWAYS, GM_ACT_TRAIN}

/* ---- per-layer inputs (core/arch/gemma_decoder.c) ------------------------------------------
 * Gemma 3n's and Gemma 4's per-layer embeddings (gemma_architecture.md §3.3 steps 2-4, §4.2;
 * transformers' get_per_layer_inputs / project_per_layer_inputs), from x0 (N, C) = the input
 * embeddings in X[0] and the graph's ple_ids:
 *   ple (L, N, P) = ((RMSNorm_P(x0 Wproj^T C^-1/2)) + E[ple_id] sqrt(P)) 2^-1/2, layer-major,
 * with the model-level weights at `globals` indices proj (L P, C), norm (P), table (PV, L P);
 * work (N, L P) and rstd (N L) are the caller's model activations. */
struct gm_graph;
void gm_ple_fwd(struct gm_graph *g, int proj, int norm, int table, float *work, float *ple, float *rstd);
/* Backward of gm_ple_fwd into gx (N, C, accumulated: dL/dx0): dple (L, N, P) in (overwritten, the
 * projection is recomputed there), dwork (N, L P) workspace, rstd as the forward saved it. */
void gm_ple_bwd(struct gm_graph *g, int proj, int norm, float *dple, float *dwork, const float *rstd, float *gx);

/* ---- KV sharing in training (core/arch/gemma_decoder.c) ------------------------------------
 * The last layers of Gemma 3n / 4 attend to an earlier layer's keys and values (kv_source). In
 * training they read the source layer's record - or, under activation checkpointing, where one
 * record serves every layer, copies the source keeps apart - and their key / value gradients wait
 * in a buffer per layer type until the source layer's backward adds them to its own. An
 * architecture names where these live: its record's keys and values (a_k, a_v), the first of four
 * consecutive model activations for the copies (sliding k, sliding v, full k, full v: m_kv) and the
 * first of four consecutive backward buffers for the waiting gradients in the same order (g_dkv). */
typedef struct gm_kv_share {
    int a_k, a_v, m_kv, g_dkv;
} gm_kv_share;

/* Whether a layer after l reads the keys and values l reads (its own, or its source's). */
bool gm_kv_shared_later(const gm_config *c, int64_t l);
/* The keys and values layer l attends to in training (see above). */
void gm_kv_train_source(struct gm_graph *g, int64_t l, const gm_kv_share *s, float **k, float **v);
/* After a source layer l computed its keys and values k, v (n floats each) in a training forward:
 * the copies its sharing layers read under checkpointing (nothing otherwise). */
void gm_kv_keep(struct gm_graph *g, int64_t l, const gm_kv_share *s, const float *k, const float *v, int64_t n);
/* The backward's keys and values gradients dk, dv (n floats each) of layer l's attention: a sharing
 * layer hands them to its source (returns false: the layer has no projections to run them
 * through); a source adds what its sharing layers left (returns true: on into its projections). */
bool gm_kv_grads(struct gm_graph *g, int64_t l, const gm_kv_share *s, float *dk, float *dv, int64_t n);

#endif /* GM_GEMMA_DECODER_H */
