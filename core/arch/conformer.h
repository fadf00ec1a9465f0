/*
 * conformer.h - the audio conformer block shared by Gemma 3n's (core/arch/gemma3n_audio.c) and
 * Gemma 4's (core/arch/gemma4_audio.c) audio towers: one forward and one backward on the graph,
 * each architecture file only naming the weights (transformers' Gemma3nAudioConformerBlock and
 * Gemma4AudioLayer compute the same block; Gemma 4 adds clamps around its linears and a key scale,
 * see gemma3n_audio.c's top comment for the formulas).
 *
 * Internal to core/arch: the slot order below is both specs' (a spec lists every slot; the clip
 * bounds are GM_WHEN_CLIPPED, absent on Gemma 3n).
 * Ownership and errors: none (the graph's records and weight views are borrowed; nothing fails).
 */
#ifndef GM_CONFORMER_H
#define GM_CONFORMER_H

#include "gm_arch.h"
#include "gm_graph.h"

/* The clipped linears (Gemma 4's Gemma4ClippableLinear): index order of their bounds' slots. */
enum { CF_F0_1, CF_F0_2, CF_Q, CF_K, CF_V, CF_POST, CF_L_START, CF_L_END, CF_F1_1, CF_F1_2, CF_N_LIN };

/* A block's weight slots. W_QSCALE and W_POS hold tables the encoder derives at load (the query
 * scale from per_dim_scale; the projected relative-position table in the slot of the projection it
 * comes from); W_CLIP0 + 4 i + {in_min, in_max, out_min, out_max}: linear i's clamp bounds. */
enum {
    CF_W_F0_PRE, CF_W_F0_1, CF_W_F0_2, CF_W_F0_POST,
    CF_W_A_PRE, CF_W_Q, CF_W_K, CF_W_V, CF_W_QSCALE, CF_W_POS, CF_W_POST, CF_W_A_POST,
    CF_W_L_PRE, CF_W_L_START, CF_W_L_CONV, CF_W_L_NORM, CF_W_L_END,
    CF_W_F1_PRE, CF_W_F1_1, CF_W_F1_2, CF_W_F1_POST,
    CF_W_NORM, CF_W_CLIP0, CF_W_COUNT = CF_W_CLIP0 + 4 * CF_N_LIN
};

_Static_assert((int)CF_W_COUNT <= GM_MAX_LAYER_WEIGHTS, "the conformer's slots fit GM_MAX_LAYER_WEIGHTS");

/* The block's record and backward workspace (gemma3n_audio.c's tables; their sizes checked there). */
enum { CF_N_ACTS = 33 + 2 * CF_N_LIN, CF_N_GRADS = 12 };
extern const gm_act_spec gm_conformer_acts[CF_N_ACTS];
extern const gm_act_spec gm_conformer_grads[CF_N_GRADS];
extern const gm_weight_spec gm_conformer_globals[3];

/* The keys a query at frame t sees, t - L .. t + R (audio_attention_fwd's L and R), of audio
 * config a: Gemma 3n (Gemma3nAudioAttention) L = context_left - 1, R = context_right; Gemma 4
 * (g4: sliding_window_mask_function((context_left - 1, context_right)) of modeling_gemma4.py, which
 * keeps 0 <= t - s < context_left - 1 and 0 < s - t < context_right) one fewer on each side:
 * L = context_left - 2, R = max(context_right - 1, 0). The blocks' context (chunk + context_left - 1
 * + context_right frames) contains that window either way. */
static inline void gm_conformer_window(const gm_audio_config *a, bool g4, int64_t *L, int64_t *R) {
    int64_t l = a->context_left > 0 ? a->context_left - 1 : 0, r = a->context_right;
    if (g4) l = l > 0 ? l - 1 : 0, r = r > 0 ? r - 1 : 0;
    *L = l, *R = r;
}

/* One block: X[l] -> X[l + 1] (forward); g->g = dL/dX[l + 1] -> dL/dX[l] (backward, adapters'
 * gradients accumulated). */
void gm_conformer_layer_fwd(gm_graph *g, int64_t l);
void gm_conformer_layer_bwd(gm_graph *g, int64_t l);

#endif /* GM_CONFORMER_H */
