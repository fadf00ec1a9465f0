/*
 * gm_plan_arch.c - memory estimates for Gemma 3n / Gemma 4 training runs (see gm_plan_arch.h).
 *
 * Structure: the part of such a run that is a Gemma 3 decoder - attention and MLP of every layer
 * with their LoRA adapters, norms, embedding, the loss, the kernels' scratch, KV-shared layers
 * without their own keys and values, Gemma 4's wide full-attention heads - is planned by the
 * trainer's own layout (gm_train_plan on the config viewed as Gemma 3: core/arch/gemma3.c's spec
 * walked by core/arch/gm_graph.c), so it cannot drift from what gemmarun allocates. What these
 * architectures add (AltUp streams, per-layer embeddings, LAuReL, sparsity statistics, weightless
 * value norms, mixture-of-experts FFNs, KV-sharing gradient buffers, the towers) is listed below
 * per token and per layer, each with the section of gemma_architecture.md that makes the model
 * keep it, and reserved on a measuring arena so every buffer gets the arena's 64-byte rounding.
 */
#include "gm_plan_arch.h"

#include "gm_arch.h"
#include "gm_arena.h"
#include "gm_dtype.h"
#include "gm_lora.h"
#include "gm_quant.h"
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Gemma 3n: activation sparsity (gaussian top-k) on layers 0-9 (§3.1). */
#define G3N_SPARSE_LAYERS 10
/* Longest audio clip the feature extractors take (§3.9, §4.6): longer audio is several clips. */
#define AUDIO_CLIP_S 30.0
/* Gemma 3n always inserts 188 audio placeholders per clip (§3.9, §3.11). */
#define G3N_AUDIO_TOKENS_PER_CLIP 188
/* Patch vector of the Gemma 4 vision encoder: 16 x 16 pixels x 3 channels (§4.5). */
#define G4_PATCH_VEC 768

/* Whether the images' soft tokens come on top of max_length: for Gemma 3 and 4, whose image paths
 * gemmarun trains, max_length counts every position (the data set places each image's soft tokens
 * and markers inside it, gm_plan_max_images); for Gemma 3n it counts text (gm_plan_arch.h). */
static bool images_add_positions(const gm_config *c) { return c->arch == GM_ARCH_GEMMA3N; }

int64_t gm_plan_sequence_length(const gm_config *c, int64_t max_length, const gm_plan_inputs *in) {
    int64_t T = max_length;
    if (!in) return T;
    if (in->images > 0 && c->vision.tokens > 0 && images_add_positions(c)) T += in->images * (c->vision.tokens + 2);
    if (in->audio_seconds > 0 && c->audio.tokens_per_s > 0) {
        int64_t clips = (int64_t)ceil(in->audio_seconds / AUDIO_CLIP_S);
        int64_t tok = c->arch == GM_ARCH_GEMMA3N ? clips * G3N_AUDIO_TOKENS_PER_CLIP
                                                 : (int64_t)ceil(in->audio_seconds * c->audio.tokens_per_s);
        T += tok + 2 * clips;
    }
    return T;
}

/* ---- base weights beyond the Gemma 3 part ------------------------------------------------ */

/* Bytes of n elements of dtype t (blocks rounded up; for the stored, memory-mapped parts). */
static double elem_bytes(gm_dtype t, double n) {
    const gm_dtype_info *d = gm_dtype_get(t);
    return ceil(n / d->block_size) * d->type_size;
}

/* Resident bytes of one (N, K) matrix in format q: as stored (memory-mapped) when the format
 * aliases the file, else the re-encoded buffers exactly as gm_quant_reserve lays them out. */
static double matrix_bytes(gm_quant q, gm_dtype stored, int64_t N, int64_t K) {
    if (gm_quant_is_alias(q, stored)) return (double)N * elem_bytes(stored, (double)K);
    gm_arena a;
    gm_wview v;
    gm_arena_init(&a, "matrix", GM_DEVICE_CPU);
    gm_quant_reserve(q, N, K, &a, &v);
    return (double)a.used;
}

/* Linear-layer parameters of the towers (the part bitsandbytes would quantize) and the FFN width
 * of the Gemma 4 vision encoder (§4.5: 3072 at width 768, 4304 at width 1152). Same formulas as
 * the presets in gm_config.c. */
static int64_t g4_vision_ffn(const gm_config *c) { return c->vision.hidden_size == 1152 ? 4304 : 4 * c->vision.hidden_size; }

static int64_t vision_linear_params(const gm_config *c) {
    if (c->vision.params <= 0 || c->arch == GM_ARCH_GEMMA3) return 0;
    int64_t C = c->hidden_size, dv = c->vision.hidden_size;
    if (c->arch == GM_ARCH_GEMMA3N) return 2048 * C; /* only the embedder: MobileNet-V5 is Conv2d */
    return c->vision.n_layers * (4 * dv * dv + 3 * dv * g4_vision_ffn(c)) + G4_PATCH_VEC * dv + dv * C;
}

static int64_t audio_linear_params(const gm_config *c) {
    if (c->audio.params <= 0) return 0;
    int64_t C = c->hidden_size, da = c->audio.hidden_size;
    int64_t n = c->audio.n_layers * 24 * da * da + 1024 * da; /* conformer blocks + sub-sampling projection */
    if (c->arch == GM_ARCH_GEMMA3N) return n + da * C;      /* embedder Linear(1536 -> D) (§3.8) */
    return n + da * 1536 + 1536 * C;                        /* output_proj + LM embedder (§4.6) */
}

typedef struct extra_bytes {
    double linear, ple, other, vision, audio;
} extra_bytes;

/* The base weights the Gemma 3 part does not count: experts and router, LAuReL, AltUp and PLE
 * linears (in format q), the per-layer embedding table (stored), the remaining parameters
 * (coefficient matrices, scalars, the extra norms: f32 as the trainer keeps norms) and the
 * towers. `g3_norm_bytes`: the Gemma 3 part's norms, already counted. */
static extra_bytes extra_weights(const gm_config *c, gm_quant q, gm_dtype stored, gm_dtype stored_embed, size_t g3_norm_bytes) {
    extra_bytes b;
    memset(&b, 0, sizeof b);
    int64_t C = c->hidden_size, L = c->n_layers, A = c->altup_inputs, P = c->ple_dim, R = c->laurel_rank;
    int64_t lin = 0;
#define MAT(N, K) (b.linear += matrix_bytes(q, stored, (N), (K)), lin += (int64_t)(N) * (K))
    for (int64_t l = 0; l < L; l++) {
        if (c->n_experts > 0) { /* gate_up [E, 2Fe, C], down [E, C, Fe] (§4.4), router [E, C] */
            for (int64_t e = 0; e < c->n_experts; e++) MAT(2 * c->expert_ffn, C), MAT(C, c->expert_ffn);
            MAT(c->n_experts, C);
        }
        if (R > 0) MAT(R, C), MAT(C, R);      /* LAuReL left / right (§3.4 step 3) */
        if (A > 1) MAT(A, C);                 /* AltUp router (§3.4 step 1) */
        if (P > 0) MAT(P, C), MAT(C, P);      /* PLE gate / projection (§3.4 step 8, §4.2) */
    }
    if (P > 0) MAT(L * P, C);                 /* per-layer model projection (§3.3 step 3) */
    for (int64_t i = 1; i < A; i++) MAT(C, C), MAT(C, C); /* AltUp stream (un)projections (§3.3, §3.6) */
#undef MAT
    if (P > 0) b.ple = (double)c->ple_vocab * elem_bytes(stored_embed, (double)(L * P));
    /* what the checkpoint holds beyond all linear maps, both embeddings and the Gemma 3 part's
     * norms (Gemma 3n's unused k/v of KV-shared layers excluded: never read) */
    const gm_arch_def *g3 = gm_arch_get(GM_ARCH_GEMMA3);
    int64_t g3_lin = 0, unused_kv = 0;
    for (int64_t l = 0; l < L; l++)
        for (int s = 0; s < g3->n_layer; s++) {
            const gm_weight_spec *w = &g3->layer[s];
            if (w->kind != GM_W_LINEAR) continue;
            int64_t n = gm_dim_value(c, l, w->rows, 0) * gm_dim_value(c, l, w->cols, 0);
            if (gm_weight_present(w, c, l)) g3_lin += n;
            else if (c->arch == GM_ARCH_GEMMA3N && w->when == GM_WHEN_OWN_V) unused_kv += 2 * n; /* its k and v */
        }
    int64_t text = gm_config_n_params(c) - c->vision.params - c->audio.params;
    int64_t rest = text - g3_lin - lin - unused_kv - c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2) - c->ple_vocab * L * P;
    double other = 4.0 * (double)(rest > 0 ? rest : 0) - (double)g3_norm_bytes;
    b.other = other > 0 ? other : 0.0;
    /* towers: Linear layers in format q (bitsandbytes quantizes every nn.Linear), the rest as stored */
    int64_t vl = vision_linear_params(c), al = audio_linear_params(c);
    /* Gemma 3's SigLIP tower: gm_plan_vision's item, only in a run with images (below) */
    if (c->vision.params > 0 && c->arch != GM_ARCH_GEMMA3) {
        int64_t dv = c->vision.hidden_size > 0 ? c->vision.hidden_size : 1;
        b.vision = matrix_bytes(q, stored, dv, vl / dv) + elem_bytes(stored_embed, (double)(c->vision.params - vl));
    }
    if (c->audio.params > 0)
        b.audio = matrix_bytes(q, stored, c->audio.hidden_size, al / c->audio.hidden_size) + elem_bytes(stored_embed, (double)(c->audio.params - al));
    return b;
}

/* ---- towers' forward buffers (f32, one image / one clip at a time, nothing saved) ---------- */

static size_t vision_forward_floats(const gm_config *c, int n_threads) {
    int64_t P = c->vision.patches, dv = c->vision.hidden_size, C = c->hidden_size, tok = c->vision.tokens;
    if (c->arch == GM_ARCH_GEMMA3N) {
        /* MobileNet-V5 at 768 x 768 (§3.10): the largest live set is stage 0 (192 x 192 x 128,
         * fused 3x3 expansion x4): block input + expanded + output = 6 x 192^2 x 128; plus the
         * input image and, per thread, one multi-query attention map of stage 2 (48^2 queries x
         * 24^2 keys, KV stride 2). Block internals are timm's, not in our notes: an estimate. */
        return (size_t)(3 * 768 * 768) + (size_t)6 * 192 * 192 * 128 + (size_t)n_threads * (48 * 48) * (24 * 24) +
               (size_t)tok * (size_t)(dv + C);
    }
    /* Gemma 4 ViT (§4.5), layer by layer: patches (P x 768), residual, norm output, q, k, v,
     * attention output (6 P dv), GeGLU gate and up (2 P fv), scores per thread (P x P, as our
     * attention kernel computes one head per thread), pooled output and its projection. */
    return (size_t)P * (size_t)(G4_PATCH_VEC + 6 * dv + 2 * g4_vision_ffn(c)) + (size_t)n_threads * (size_t)(P * P) +
           (size_t)tok * (size_t)(dv + C);
}

static size_t audio_forward_floats(const gm_config *c, double seconds) {
    double s = seconds < AUDIO_CLIP_S ? seconds : AUDIO_CLIP_S;
    int64_t mel = (int64_t)ceil(100.0 * s);                        /* 10 ms hop, 128 mel bins (§3.9, §4.6) */
    int64_t frames = (int64_t)ceil(s * c->audio.frames_per_s);     /* after the two stride-2 convolutions */
    int64_t da = c->audio.hidden_size, tok = (int64_t)ceil(s * c->audio.tokens_per_s);
    /* sub-sampling: features, conv 1 output (128 ch x mel/2 x 64 freq), conv 2 output (32 x mel/4 x 32) */
    size_t sub = (size_t)mel * 128 + (size_t)128 * (size_t)((mel + 1) / 2) * 64 + (size_t)32 * (size_t)((mel + 3) / 4) * 32;
    /* one conformer block: residual, norm, FFN hidden (4 da), q, k, v, attention output, GLU input
     * (2 da) = 12 da per frame, chunked local attention (8 heads x 24-key context + 13 positions) */
    size_t conf = (size_t)frames * (size_t)(12 * da) + (size_t)8 * (size_t)frames * (24 + 13);
    size_t outp = (size_t)tok * (size_t)(1536 + c->hidden_size);   /* soft tokens and their projection */
    return (sub > conf ? sub : conf) + outp;
}

/* ---- activations beyond the Gemma 3 part ---------------------------------------------------- */

/* Floats per token layer l keeps beyond Gemma 3's record, by what keeps them (one slot each, so
 * that a checkpointed record takes each slot's widest). */
enum {
    /* v_norm without weight (§3.2, §4.2): the projection before the norm and its 1/rms; k_eq_v
     * layers take V from k_pre, so only the 1/rms */
    X_VPRE, X_RSTDV,
    /* AltUp (§3.4 steps 1, 2, 7): router norm output + 1/rms, tanh(router), 4x4 coefficients,
     * pred_0 (the attention input), then the correction's router norm + 1/rms, tanh, innovation
     * delta and its 4 gains */
    X_AU_RN, X_AU_RRSTD, X_AU_R, X_AU_COEF, X_AU_PRED0, X_AU_RN2, X_AU_RRSTD2, X_AU_R2, X_AU_DELTA, X_AU_K,
    /* LAuReL (§3.4 step 3): the low-rank branch before its norm, and 1/rms */
    X_LR_PRE, X_LR_RSTD,
    /* gaussian top-k (§3.4 step 6): mean and std of the gate over F per token */
    X_SP_STATS,
    /* PLE injection (§3.4 step 8, §4.2): gate pre-activation (for gelu'), projection before its
     * norm, 1/rms */
    X_PLE_GATE, X_PLE_PRE, X_PLE_RSTD,
    /* MoE (§4.4): router probabilities, router-norm 1/rms, top-k weights and indices, the experts'
     * normed input + 1/rms, per selected expert gate / up / gelu(gate)*up and its output (for the
     * gradient of its weight), the expert sum and the FFN sum before their norms + 1/rms */
    X_MOE_PROBS, X_MOE_RRSTD, X_MOE_TOPW, X_MOE_TOPI, X_MOE_XN, X_MOE_XRSTD, X_MOE_GATE, X_MOE_UP, X_MOE_H, X_MOE_Y,
    X_MOE_D2, X_MOE_D2RSTD, X_MOE_SUM, X_MOE_SUMRSTD,
    X_COUNT
};

static void extra_widths(const gm_config *c, int64_t l, int64_t w[X_COUNT]) {
    memset(w, 0, sizeof(int64_t) * X_COUNT);
    int64_t C = c->hidden_size, A = c->altup_inputs, E = c->n_experts, K = c->experts_top_k, Fe = c->expert_ffn;
    int64_t KW = gm_dim_value(c, l, GM_DIM_KW, 0), kvh = gm_dim_value(c, l, GM_DIM_KVH, 0);
    bool own_kv = c->kv_source[l] == l;
    bool own_v = own_kv && !(c->k_eq_v_full && c->layer_type[l] == GM_LAYER_FULL);
    if (c->arch == GM_ARCH_GEMMA3) return; /* the part is the whole layer */
    if (own_kv) {
        if (own_v) w[X_VPRE] = KW;
        w[X_RSTDV] = kvh;
    }
    if (A > 1) {
        w[X_AU_RN] = C, w[X_AU_RRSTD] = 1, w[X_AU_R] = A, w[X_AU_COEF] = A * A, w[X_AU_PRED0] = C;
        w[X_AU_RN2] = C, w[X_AU_RRSTD2] = 1, w[X_AU_R2] = A, w[X_AU_DELTA] = C, w[X_AU_K] = A;
    }
    if (c->laurel_rank > 0) w[X_LR_PRE] = C, w[X_LR_RSTD] = 1;
    if (c->arch == GM_ARCH_GEMMA3N && l < G3N_SPARSE_LAYERS) w[X_SP_STATS] = 2;
    if (c->ple_dim > 0) w[X_PLE_GATE] = c->ple_dim, w[X_PLE_PRE] = C, w[X_PLE_RSTD] = 1;
    if (E > 0) {
        w[X_MOE_PROBS] = E, w[X_MOE_RRSTD] = 1, w[X_MOE_TOPW] = K, w[X_MOE_TOPI] = K;
        w[X_MOE_XN] = C, w[X_MOE_XRSTD] = 1;
        w[X_MOE_GATE] = w[X_MOE_UP] = w[X_MOE_H] = K * Fe;
        w[X_MOE_Y] = K * C;
        w[X_MOE_D2] = C, w[X_MOE_D2RSTD] = 1, w[X_MOE_SUM] = C, w[X_MOE_SUMRSTD] = 1;
    }
}

static gm_status validate(const gm_config *c, const gm_train_opts *o, int64_t T, gm_error *err) {
    GM_TRY(gm_lora_config_validate(&o->lora, c, err));
    if (o->batch < 1) return gm_error_set(err, GM_ERR_INVALID, "batch = %lld: must be >= 1", (long long)o->batch);
    if (o->max_length < 2)
        return gm_error_set(err, GM_ERR_INVALID, "max_length = %lld: must be >= 2", (long long)o->max_length);
    if (T > c->max_position_embeddings)
        return gm_error_set(err, GM_ERR_INVALID,
                            "max_length = %lld plus %lld image/audio positions = %lld: over the model's "
                            "max_position_embeddings (%lld)",
                            (long long)o->max_length, (long long)(T - o->max_length), (long long)T,
                            (long long)c->max_position_embeddings);
    if (o->n_threads < 1) return gm_error_set(err, GM_ERR_INVALID, "threads must be >= 1");
    if ((unsigned)o->quant >= GM_QUANT_COUNT) return gm_error_set(err, GM_ERR_INVALID, "unknown base weight format");
    return GM_OK;
}

/* Headroom of gm_plan_check_size: every plan total stays under 2^62 bytes. */
#define PLAN_MAX_BYTES 4611686018427387904.0

static double dmax(double a, double b) { return a > b ? a : b; }

gm_status gm_plan_check_size(const gm_config *c, const gm_train_opts *o, const gm_plan_inputs *in, gm_error *err) {
    if (o->batch < 1) return gm_error_set(err, GM_ERR_INVALID, "batch = %lld: must be >= 1", (long long)o->batch);
    if (o->grad_accum < 1)
        return gm_error_set(err, GM_ERR_INVALID, "gradient accumulation = %lld: must be >= 1", (long long)o->grad_accum);
    if (o->max_length < 2)
        return gm_error_set(err, GM_ERR_INVALID, "max_length = %lld: must be >= 2", (long long)o->max_length);
    if (o->n_threads < 1) return gm_error_set(err, GM_ERR_INVALID, "threads must be >= 1");
    /* gm_plan_fit trades batch for accumulation at a constant product: bounding it keeps the
     * doubling from wrapping */
    if ((double)o->batch * (double)o->grad_accum > PLAN_MAX_BYTES)
        return gm_error_set(err, GM_ERR_INVALID, "batch %lld x gradient accumulation %lld: too large to plan",
                            (long long)o->batch, (long long)o->grad_accum);
    double maxpos = (double)c->max_position_embeddings;
    /* inputs first, in double: each image or audio clip takes at least its two markers'
     * positions, so more of them than positions cannot fit (and their counts cannot wrap int64
     * in gm_plan_sequence_length) */
    double T = (double)o->max_length;
    if (in) {
        if (in->images < 0 || (double)in->images > maxpos)
            return gm_error_set(err, GM_ERR_INVALID, "images = %lld: must be in 0..%lld (each image takes positions of the "
                                "model's max_position_embeddings)", (long long)in->images, (long long)c->max_position_embeddings);
        if (!(in->audio_seconds >= 0 && in->audio_seconds <= maxpos * AUDIO_CLIP_S))
            return gm_error_set(err, GM_ERR_INVALID, "audio_seconds = %g: must be in 0..%.0f (each %.0f s clip takes positions "
                                "of the model's max_position_embeddings)", in->audio_seconds, maxpos * AUDIO_CLIP_S, AUDIO_CLIP_S);
        if (in->images > 0 && c->vision.tokens > 0 && images_add_positions(c))
            T += (double)in->images * ((double)c->vision.tokens + 2);
        /* Gemma 3n's clips count inside max_length (its plans are the trainer's layout, where a
         * data set places them: gm_plan_max_audio checks they leave room for text); Gemma 4's are
         * added by the estimate */
        if (in->audio_seconds > 0 && c->audio.tokens_per_s > 0 && c->arch != GM_ARCH_GEMMA3N) {
            double clips = ceil(in->audio_seconds / AUDIO_CLIP_S);
            T += ceil(in->audio_seconds * c->audio.tokens_per_s) + 2 * clips;
        }
    }
    if (T > maxpos) {
        if (T == (double)o->max_length)
            return gm_error_set(err, GM_ERR_INVALID, "max_length = %lld: over the model's max_position_embeddings (%lld)",
                                (long long)o->max_length, (long long)c->max_position_embeddings);
        return gm_error_set(err, GM_ERR_INVALID,
                            "max_length = %lld plus %.0f image/audio positions = %.0f: over the model's "
                            "max_position_embeddings (%lld)",
                            (long long)o->max_length, T - (double)o->max_length, T, (long long)c->max_position_embeddings);
    }
    /* the widest per-token row any buffer has (gm_plan.h's items; layout() and the estimate above) */
    double L = (double)c->n_layers, C = (double)c->hidden_size, A = c->altup_inputs > 1 ? (double)c->altup_inputs : 1;
    double hd = dmax((double)c->head_dim, (double)c->head_dim_full);
    double kvh = dmax((double)c->n_kv_heads, (double)c->n_kv_heads_full);
    double F = (double)c->intermediate_size;
    for (int64_t l = 0; l < c->n_layers && l < GM_MAX_LAYERS; l++) F = dmax(F, (double)c->ffn_dim[l]);
    double w = dmax(C * A, dmax((double)c->n_heads * hd, kvh * hd));
    w = dmax(w, dmax(F, (double)c->experts_top_k * (double)c->expert_ffn));
    w = dmax(w, dmax((double)c->n_experts, L * (double)c->ple_dim));
    w = dmax(w, dmax((double)o->lora.rank, 1));
    double N = (double)o->batch * T, nt = (double)o->n_threads;
    /* f32 activations and workspace: block inputs, one record per layer (the Gemma 3 spec's
     * activations, a LoRA intermediate per weight slot and X_COUNT extras) and the
     * KV-sharing copies (4), the backward's and the loss's buffers (< 64) */
    const gm_arch_def *g3 = gm_arch_get(GM_ARCH_GEMMA3);
    double per_layer = (double)(g3->n_acts + g3->n_layer + X_COUNT + 4);
    double bytes = 4 * N * w * ((L + 1) + L * per_layer + 64);
    /* attention scratch (n_threads x 2 x T x T), the widest dequantized panel per thread, the
     * towers' forward (one image: n_threads x patches^2 attention maps), the LM-head chunk */
    bytes += 4 * nt * (2 * T * T + (double)c->vision.patches * (double)c->vision.patches + w) +
             4 * (GM_MATMUL_PANEL_ROWS + 8.0) * dmax(w, C) + 4.0 * GM_LM_ROWS * GM_LM_VOCAB;
    /* adapters with their gradients and AdamW moments (16 bytes per parameter), base weights
     * converted (<= 4 bytes per parameter) or mapped, the tokenizer */
    bytes += 16 * L * (double)g3->n_layer * (double)o->lora.rank * 2 * w + 8 * (double)gm_config_n_params(c) +
             128 * (double)c->vocab_size;
    if (!(bytes < PLAN_MAX_BYTES))
        return gm_error_set(err, GM_ERR_INVALID,
                            "batch %lld x %.0f positions: too large to plan (its buffers could exceed 2^62 bytes); lower "
                            "batch or max_length", (long long)o->batch, T);
    return GM_OK;
}

static void gib_part(char *buf, size_t cap, size_t *n, const char *what, const char *fmt, double bytes) {
    if (bytes <= 0 || *n >= cap) return;
    int w = bytes >= 0.1 * 1073741824.0
                ? snprintf(buf + *n, cap - *n, "%s%s %s %.2f GiB", *n ? "; " : "", what, fmt, bytes / 1073741824.0)
                : snprintf(buf + *n, cap - *n, "%s%s %s %.1f MiB", *n ? "; " : "", what, fmt, bytes / 1048576.0);
    if (w > 0) *n += (size_t)w;
}

gm_status gm_plan_estimate(const gm_config *c, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                           const gm_plan_inputs *in, gm_plan *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    GM_TRY(gm_lora_config_validate(&o->lora, c, err)); /* the rank, before it sizes anything */
    if (c->arch != GM_ARCH_GEMMA3 && (strcmp(o->vision_targets, "none") != 0 || o->train_projector))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: training its vision tower or projector (%s) is not supported yet: "
                            "only Gemma 3's SigLIP tower trains", c->name,
                            strcmp(o->vision_targets, "none") != 0 ? "vision_targets" : "modules_to_save");
    /* inputs the config has no tower for are refused, not planned as text (a Gemma3nForCausalLM
     * folder has neither tower; Gemma 3's own check is gm_plan_max_images) */
    static const char *const sizes[GM_ARCH_COUNT] = {[GM_ARCH_GEMMA3N] = "gemma3n-e2b, gemma3n-e4b",
                                                      [GM_ARCH_GEMMA4] = "gemma4-e2b, gemma4-e4b (audio), gemma4-31b"};
    const char *named = sizes[c->arch] ? sizes[c->arch] : "a multimodal size";
    if (c->arch != GM_ARCH_GEMMA3 && in && in->images > 0 && c->vision.params <= 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s takes no image inputs: its config has no vision tower\n"
                            "  hint: plan a size that has one by name (%s), or give a multimodal config (%s)", c->name,
                            named, c->arch == GM_ARCH_GEMMA4 ? "Gemma4ForConditionalGeneration" : "Gemma3nForConditionalGeneration");
    if (in && in->audio_seconds > 0 && c->audio.params <= 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s takes no audio inputs: its config has no audio tower\n"
                            "  hint: plan a size that has one by name (%s), or give a multimodal config (%s)", c->name,
                            c->arch == GM_ARCH_GEMMA4 ? "gemma4-e2b, gemma4-e4b" : named,
                            c->arch == GM_ARCH_GEMMA4 ? "Gemma4ForConditionalGeneration" : "Gemma3nForConditionalGeneration");
    GM_TRY(gm_plan_check_size(c, o, in, err));
    int64_t T = gm_plan_sequence_length(c, o->max_length, in);
    GM_TRY(validate(c, o, T, err));
    int64_t B = o->batch, N = B * T, C = c->hidden_size, L = c->n_layers;
    int64_t A = c->altup_inputs > 1 ? c->altup_inputs : 1;
    int nt = o->n_threads;

    /* the Gemma 3 part: the trainer's own layout, on T = text + soft-token positions; a Gemma 3
     * config with images also gets the trainer's SigLIP tower (gm_plan_vision's item below) */
    bool g3_tower = c->arch == GM_ARCH_GEMMA3;
    /* Gemma 3n and Gemma 4: the decoder part is its own trainer's layout (core/arch/gemma3n.c,
     * gemma4.c: AltUp streams, per-layer inputs, LAuReL, KV sharing, experts, their weights); only
     * the towers are estimated */
    bool own = c->arch == GM_ARCH_GEMMA3N || c->arch == GM_ARCH_GEMMA4;
    gm_config g3 = *c;
    if (!own) g3.arch = GM_ARCH_GEMMA3;
    gm_train_opts o3 = *o;
    o3.max_length = T;
    o3.max_images = 0;
    if (g3_tower) GM_TRY(gm_plan_max_images(c, o, in, &o3.max_images, err));
    gm_train_plan_info tp;
    GM_TRY(gm_train_plan(&g3, &o3, stored, stored_embed, &tp, err));

    gm_arena a;
    gm_arena_init(&a, "plan", GM_DEVICE_CPU);
#define F32(n, kind) gm_arena_alloc(&a, (size_t)(n) * sizeof(float), kind)
#define I32(n, kind) gm_arena_alloc(&a, (size_t)(n) * sizeof(int32_t), kind)
    int64_t Fmax = 1;
    if (!own) { /* the Gemma 3 part's missing pieces (a Gemma 3n / 4 config viewed as Gemma 3: no longer
                 * planned so, kept for an architecture whose decoder does not train yet) */
    /* block inputs of all AltUp streams: the part keeps one stream per block input */
    if (A > 1)
        for (int64_t l = 0; l <= L; l++) F32(N * C * (A - 1), GM_MEM_ACTIVATIONS);
    /* the extra record entries: per layer, or the widest one under checkpointing */
    int64_t w[X_COUNT], wmax[X_COUNT];
    memset(wmax, 0, sizeof wmax);
    for (int64_t l = 0; l < L; l++) {
        extra_widths(c, l, w);
        int64_t F = gm_dim_value(c, l, GM_DIM_F, 0);
        Fmax = F > Fmax ? F : Fmax;
        for (int s = 0; s < X_COUNT; s++) {
            if (!o->checkpointing && w[s]) {
                if (s == X_MOE_TOPI) I32(N * w[s], GM_MEM_ACTIVATIONS);
                else F32(N * w[s], GM_MEM_ACTIVATIONS);
            }
            if (w[s] > wmax[s]) wmax[s] = w[s];
        }
    }
    if (o->checkpointing)
        for (int s = 0; s < X_COUNT; s++) {
            if (!wmax[s]) continue;
            if (s == X_MOE_TOPI) I32(N * wmax[s], GM_MEM_ACTIVATIONS);
            else F32(N * wmax[s], GM_MEM_ACTIVATIONS);
        }
    /* KV sharing (§3.5, §4.4): the source layers' K and V are read by later layers - kept apart
     * when checkpointing recycles the record; in the backward their dK/dV accumulate over every
     * sharing layer until the source's own backward (workspace) */
    bool src[GM_MAX_LAYERS] = {false};
    for (int64_t l = 0; l < L; l++)
        if (c->kv_source[l] != l && c->kv_source[l] >= 0 && c->kv_source[l] < l) src[c->kv_source[l]] = true;
    for (int64_t l = 0; l < L; l++) {
        if (!src[l]) continue;
        int64_t KW = gm_dim_value(c, l, GM_DIM_KW, 0);
        if (o->checkpointing) F32(N * KW, GM_MEM_ACTIVATIONS), F32(N * KW, GM_MEM_ACTIVATIONS);
        F32(N * KW, GM_MEM_WORKSPACE), F32(N * KW, GM_MEM_WORKSPACE);
    }
    /* per-layer inputs [N, L x ple_dim] (§3.3 steps 2-4): every layer's PLE gate reads its slice
     * in the forward and the backward (they need no gradient: nothing upstream is trained) */
    if (c->ple_dim > 0) F32(N * L * c->ple_dim, GM_MEM_ACTIVATIONS);
    /* AltUp output (§3.6): streams 1..3 unembedded and their RMS, the average (final norm input) */
    if (A > 1) F32(N * (A - 1) * C, GM_MEM_ACTIVATIONS), F32(N * (A - 1), GM_MEM_ACTIVATIONS), F32(N * C, GM_MEM_ACTIVATIONS);
    /* backward: the residual gradient of the other AltUp streams and a second stream-wide
     * gradient (prediction backward); MoE: the FFN gradients at the k experts' width and the
     * router-logit gradient */
    if (A > 1) F32(N * C * (A - 1), GM_MEM_WORKSPACE), F32(N * C * A, GM_MEM_WORKSPACE);
    if (c->n_experts > 0) {
        int64_t Fwork = c->experts_top_k * c->expert_ffn;
        if (Fwork > Fmax) F32(N * (Fwork - Fmax), GM_MEM_WORKSPACE), F32(N * (Fwork - Fmax), GM_MEM_WORKSPACE),
            F32(N * (Fwork - Fmax), GM_MEM_WORKSPACE);
        F32(N * c->n_experts, GM_MEM_WORKSPACE);
    }
    } /* !own */
    /* kernel scratch: one buffer, the widest need - the part's, or a dequantized panel of an
     * expert or tower matrix */
    gm_quant q = o->quant;
    gm_dtype kd = q == GM_QUANT_NF4 ? GM_NF4 : q == GM_QUANT_BF16 ? GM_BF16 : q == GM_QUANT_INT8 ? GM_I8
                : q == GM_QUANT_F32 ? GM_F32 : stored;
    size_t scratch = tp.scratch_floats, t;
    if (c->n_experts > 0) {
        t = gm_k_matmul_scratch_floats(kd, C, c->expert_ffn, nt);
        scratch = t > scratch ? t : scratch;
    }
    if (c->vision.params > 0 && c->arch == GM_ARCH_GEMMA4) {
        t = gm_k_matmul_scratch_floats(kd, c->vision.hidden_size, g4_vision_ffn(c), nt);
        scratch = t > scratch ? t : scratch;
    }
    if (c->audio.params > 0) {
        t = gm_k_matmul_scratch_floats(kd, c->audio.hidden_size, 4 * c->audio.hidden_size, nt);
        scratch = t > scratch ? t : scratch;
    }
    if (scratch > tp.scratch_floats) F32(scratch - tp.scratch_floats, GM_MEM_TRANSIENT);
    /* frozen towers, forward only, one item at a time (counted apart from the decoder's scratch,
     * as the trainer reserves every buffer for the whole run) */
    bool vis = in && in->images > 0 && c->vision.params > 0 && !g3_tower;
    bool aud = in && in->audio_seconds > 0 && c->audio.params > 0;
    if (vis) F32(vision_forward_floats(c, nt), GM_MEM_TRANSIENT);
    if (aud) F32(audio_forward_floats(c, in->audio_seconds), GM_MEM_TRANSIENT);
#undef F32
#undef I32
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->by_kind[k] = tp.by_kind[k] + a.by_kind[k];
    gm_arena_free(&a);

    /* base weights: the part's (re-encoded in the arena, or read in place) and the extras */
    extra_bytes xb = extra_weights(c, q, stored, stored_embed, tp.weight_bytes[GM_W_NORM]);
    if (own) xb.linear = xb.ple = xb.other = 0; /* in the part's own weights */
    out->by_kind[GM_MEM_WEIGHTS] += tp.alias_bytes + (size_t)(xb.linear + xb.ple + xb.other + xb.vision + xb.audio);
    bool alias = gm_quant_is_alias(q, stored);
    const char *lf = alias ? gm_dtype_name(stored) : gm_quant_name(q), *ef = gm_dtype_name(stored_embed);
    size_t n = 0;
    gib_part(out->base_detail, sizeof out->base_detail, &n, "linear", lf, (double)tp.weight_bytes[GM_W_LINEAR] + xb.linear);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "embeddings", ef, (double)tp.weight_bytes[GM_W_EMBED]);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "per-layer embeddings", ef, xb.ple);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "vision tower", lf, xb.vision);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "audio tower", lf, xb.audio);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "norms", "f32", (double)tp.weight_bytes[GM_W_NORM] + xb.other);

    out->n_trainable = tp.n_trainable;
    out->by_kind[GM_MEM_TRANSIENT] += gm_plan_checkpoint_bytes(out->n_trainable);
    /* Gemma 3's tower: the part's layout reserved it; the same item as gm_plan_training's */
    if (o3.max_images > 0) {
        GM_TRY(gm_plan_vision(c, &o3, o3.max_images, nt, stored, &out->vision, err));
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->by_kind[k] -= out->vision.by_kind[k];
    }
    out->runtime = gm_plan_runtime_bytes(c);
    out->total = out->runtime + out->vision.total;
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->total += out->by_kind[k];
    out->exact = false;
    out->n_params = gm_config_n_params(c);
    if (own)
        snprintf(out->note, sizeof out->note,
                 "estimate: the decoder is the %s trainer's own layout (exact) on T = %lld positions (%lld text + "
                 "%lld image/audio); the towers (which gemmarun does not run yet) frozen, forward in f32 one item at a "
                 "time, their weights as stored (linears in %s)",
                 c->arch == GM_ARCH_GEMMA4 ? "Gemma 4" : "Gemma 3n", (long long)T, (long long)o->max_length,
                 (long long)(T - o->max_length), lf);
    else
        snprintf(out->note, sizeof out->note,
                 "estimate: the Gemma 3 trainer's own layout on T = %lld positions (%lld text + %lld image/audio)%s; "
                 "LoRA on q/k/v/o/gate/up/down only (none on KV-shared k/v, no v where k=v; experts, PLE/AltUp/LAuReL "
                 "linears, towers frozen); towers run forward in f32, one item at a time; %s base: every text linear%s, "
                 "embeddings %s",
                 (long long)T, (long long)o->max_length, (long long)(T - o->max_length),
                 c->n_experts > 0         ? " + top-k expert intermediates"
                 : c->ple_dim > 0           ? " + PLE inputs"
                                            : "",
                 lf, alias ? "" : " and the towers' nn.Linear (as bitsandbytes)", ef);
    return GM_OK;
}
