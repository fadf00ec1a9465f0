/*
 * gm_arch.c - the registry of architecture definitions and the spec helpers (see gm_arch.h).
 */
#include "gm_arch.h"

#include <string.h>

int64_t gm_dim_value(const gm_config *c, int64_t layer, gm_dim d, int64_t rank) {
    bool full = layer >= 0 && c->layer_type[layer] == GM_LAYER_FULL;
    /* Gemma 4's full-attention layers have their own head width and kv heads (0: the same) */
    int64_t D = full && c->head_dim_full > 0 ? c->head_dim_full : c->head_dim;
    int64_t KVH = full && c->n_kv_heads_full > 0 ? c->n_kv_heads_full : c->n_kv_heads;
    switch (d) {
    case GM_DIM_NONE: return 0;
    case GM_DIM_1: return 1;
    case GM_DIM_C: return c->hidden_size;
    case GM_DIM_V: return c->vocab_size;
    case GM_DIM_D: return D;
    case GM_DIM_H: return c->n_heads;
    case GM_DIM_KVH: return KVH;
    case GM_DIM_QW: return c->n_heads * D;
    case GM_DIM_KW: return KVH * D;
    case GM_DIM_F: return layer >= 0 && c->ffn_dim[layer] > 0 ? c->ffn_dim[layer] : c->intermediate_size;
    case GM_DIM_R: return rank;
    case GM_DIM_PATCH: return 3 * c->vision.patch_size * c->vision.patch_size;
    case GM_DIM_OUT: return c->vision.out_hidden_size;
    case GM_DIM_P: return c->ple_dim;
    case GM_DIM_LP: return c->n_layers * c->ple_dim;
    case GM_DIM_PV: return c->ple_vocab;
    case GM_DIM_LR: return c->laurel_rank;
    case GM_DIM_S: return c->altup_inputs;
    case GM_DIM_SS: return c->altup_inputs * c->altup_inputs;
    case GM_DIM_SC: return c->altup_inputs * c->hidden_size;
    case GM_DIM_L: return c->n_layers;
    case GM_DIM_C2: return 2 * c->hidden_size;
    case GM_DIM_E: return c->n_experts;
    case GM_DIM_K: return c->experts_top_k;
    case GM_DIM_FE: return c->expert_ffn;
    case GM_DIM_KC: return c->experts_top_k * c->hidden_size;
    case GM_DIM_KFE: return c->experts_top_k * c->expert_ffn;
    case GM_DIM_E2FE: return c->n_experts * 2 * c->expert_ffn;
    case GM_DIM_EC: return c->n_experts * c->hidden_size;
    case GM_DIM_2: return 2;
    case GM_DIM_KWF:
        return (c->n_kv_heads_full > 0 ? c->n_kv_heads_full : c->n_kv_heads) *
               (c->head_dim_full > 0 ? c->head_dim_full : c->head_dim);
    default: return 0;
    }
}

bool gm_weight_present(const gm_weight_spec *w, const gm_config *c, int64_t layer) {
    switch (w->when) {
    case GM_WHEN_OWN_KV: return layer >= 0 && c->kv_source[layer] == layer;
    case GM_WHEN_OWN_V:
        return layer >= 0 && c->kv_source[layer] == layer && !(c->k_eq_v_full && c->layer_type[layer] == GM_LAYER_FULL);
    case GM_WHEN_UNTIED: return !c->tie_word_embeddings;
    case GM_WHEN_SPARSE: return layer >= 0 && c->act_sparsity[layer] > 0.0f;
    case GM_WHEN_PLE: return c->ple_dim > 0;
    case GM_WHEN_MOE: return c->n_experts > 0;
    case GM_WHEN_CLIPPED: return c->arch == GM_ARCH_GEMMA4_AUDIO ? c->audio.clipped : c->vision.clipped;
    case GM_WHEN_STANDARDIZE: return c->vision.standardize;
    case GM_WHEN_ABSENT: return false;
    case GM_WHEN_KV_SHARED:
        for (int64_t l = 0; l < c->n_layers; l++)
            if (c->kv_source[l] != l) return true;
        return false;
    default: return true;
    }
}

int gm_arch_slot(const gm_arch_def *a, const char *hf) {
    for (int s = 0; s < a->n_layer; s++)
        if (strcmp(a->layer[s].hf, hf) == 0) return s;
    return -1;
}

const gm_arch_def *gm_arch_get(gm_arch a) {
    switch (a) {
    case GM_ARCH_GEMMA3: return &gm_arch_gemma3;
    case GM_ARCH_GEMMA3N: return &gm_arch_gemma3n;
    case GM_ARCH_SIGLIP: return &gm_arch_siglip;
    case GM_ARCH_GEMMA3N_AUDIO: return &gm_arch_gemma3n_audio;
    case GM_ARCH_GEMMA4: return &gm_arch_gemma4;
    case GM_ARCH_GEMMA4_VISION: return &gm_arch_gemma4_vision;
    case GM_ARCH_GEMMA4_AUDIO: return &gm_arch_gemma4_audio;
    default: return NULL;
    }
}

int64_t gm_arch_residual_width(const gm_arch_def *a, const gm_config *c) {
    return a->altup && c->altup_inputs > 1 ? c->altup_inputs * c->hidden_size : c->hidden_size;
}
