/*
 * gm_plan_arch.c - memory estimates for Gemma 3n / Gemma 4 training runs (see gm_plan_arch.h).
 *
 * Structure: the trainer's buffers are reserved, one by one, on a measuring arena (gm_arena.h), so
 * every buffer gets the arena's 64-byte rounding exactly as gm_train.c's layout() would; each
 * buffer below names the layout() buffer it mirrors, or the section of gemma_architecture.md that
 * makes the architecture keep it. Base weights are computed apart (memory-mapped ones are not in
 * the arena) with gm_quant's per-matrix rounding.
 */
#include "gm_plan_arch.h"

#include "gm_arena.h"
#include "gm_dtype.h"
#include "gm_lora.h"
#include "gm_quant.h"
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* LM-head chunking of the trainer (gm_train.c LM_ROWS / LM_VOCAB): rows x vocabulary entries. */
#define LM_ROWS 512
#define LM_VOCAB 8192
/* Gemma 3n: activation sparsity (gaussian top-k) on layers 0-9 (§3.1). */
#define G3N_SPARSE_LAYERS 10
/* Longest audio clip the feature extractors take (§3.9, §4.6): longer audio is several clips. */
#define AUDIO_CLIP_S 30.0
/* Gemma 3n always inserts 188 audio placeholders per clip (§3.9, §3.11). */
#define G3N_AUDIO_TOKENS_PER_CLIP 188
/* Patch vector of the Gemma 4 vision encoder: 16 x 16 pixels x 3 channels (§4.5). */
#define G4_PATCH_VEC 768
/* Factorized position table of the Gemma 4 vision encoder: [2, 10240, dv] (§4.5). */
#define G4_POS_ROWS (2 * 10240)

/* ---- geometry ------------------------------------------------------------------------------ */

/* One decoder layer as the accounting needs it. */
typedef struct lgeo {
    int64_t hd, kvh, QW, KW, F; /* head width, KV heads, q width H*hd, kv width kvh*hd, dense FFN */
    bool has_k;                 /* computes its own K/V (false: KV-shared, §3.5 / §4.4) */
    bool has_vproj;             /* has a v_proj (false: k_eq_v full layer, §4.2) */
    bool sparse;                /* Gemma 3n gaussian top-k layer (§3.4 step 6) */
} lgeo;

static lgeo geo(const gm_config *c, int64_t l) {
    lgeo g;
    bool full = c->layer_type[l] == GM_LAYER_FULL;
    g.hd = (full && c->head_dim_full > 0) ? c->head_dim_full : c->head_dim;
    g.kvh = (full && c->n_kv_heads_full > 0) ? c->n_kv_heads_full : c->n_kv_heads;
    g.QW = c->n_heads * g.hd;
    g.KW = g.kvh * g.hd;
    g.F = c->ffn_dim[l] > 0 ? c->ffn_dim[l] : c->intermediate_size;
    g.has_k = c->kv_source[l] == l;
    g.has_vproj = g.has_k && !(c->k_eq_v_full && full);
    g.sparse = c->arch == GM_ARCH_GEMMA3N && l < G3N_SPARSE_LAYERS;
    return g;
}

/* (in, out) of linear w of layer l, false when the layer has no such linear to adapt. */
static bool lin_shape(const gm_config *c, int64_t l, int w, int64_t *in, int64_t *out) {
    lgeo g = geo(c, l);
    int64_t C = c->hidden_size;
    switch ((gm_linear)w) {
    case GM_LIN_Q: *in = C, *out = g.QW; return true;
    case GM_LIN_K: *in = C, *out = g.KW; return g.has_k;
    case GM_LIN_V: *in = C, *out = g.KW; return g.has_vproj;
    case GM_LIN_O: *in = g.QW, *out = C; return true;
    case GM_LIN_GATE:
    case GM_LIN_UP: *in = C, *out = g.F; return true;
    case GM_LIN_DOWN: *in = g.F, *out = C; return true;
    default: *in = *out = 0; return false;
    }
}

static bool adapted(const gm_train_opts *o, int64_t l, int w) {
    return o->lora.layers[l] && (o->lora.targets & (1u << w));
}

int64_t gm_plan_sequence_length(const gm_config *c, int64_t max_length, const gm_plan_inputs *in) {
    int64_t T = max_length;
    if (!in) return T;
    if (in->images > 0 && c->vision_tokens > 0) T += in->images * (c->vision_tokens + 2);
    if (in->audio_seconds > 0 && c->audio_tokens_per_s > 0) {
        int64_t clips = (int64_t)ceil(in->audio_seconds / AUDIO_CLIP_S);
        int64_t tok = c->arch == GM_ARCH_GEMMA3N ? clips * G3N_AUDIO_TOKENS_PER_CLIP
                                                 : (int64_t)ceil(in->audio_seconds * c->audio_tokens_per_s);
        T += tok + 2 * clips;
    }
    return T;
}

/* ---- base weights -------------------------------------------------------------------------- */

static size_t align_up(size_t b) { return (b + GM_ARENA_ALIGN - 1) / GM_ARENA_ALIGN * GM_ARENA_ALIGN; }

/* Bytes of n elements of dtype t (blocks rounded up; for the stored, memory-mapped parts). */
static double elem_bytes(gm_dtype t, double n) {
    const gm_dtype_info *d = gm_dtype_get(t);
    return ceil(n / d->block_size) * d->type_size;
}

/* Resident bytes of one (N, K) linear weight in format q: as stored (memory-mapped) when the
 * format aliases the file, else the converted buffer with gm_quant_layout's per-part rounding
 * (gm_quant.c matrix_bytes: f32 4NK, bf16 2NK, int8 NK + 4N, nf4 NK/2 + NK/64 + 4 ceil(NK/16384)). */
static double matrix_bytes(gm_quant q, gm_dtype stored, int64_t N, int64_t K) {
    if (gm_quant_is_alias(q, stored)) {
        const gm_dtype_info *d = gm_dtype_get(stored);
        return (double)N * (double)((K + d->block_size - 1) / d->block_size) * d->type_size;
    }
    size_t nk = (size_t)N * (size_t)K;
    switch (q) {
    case GM_QUANT_F32: return (double)align_up(nk * 4);
    case GM_QUANT_BF16: return (double)align_up(nk * 2);
    case GM_QUANT_INT8: return (double)(align_up(nk) + align_up((size_t)N * 4));
    case GM_QUANT_NF4: {
        gm_nf4_sizes s = gm_nf4_sizes_of((int64_t)nk);
        return (double)(align_up(s.packed_bytes) + align_up((size_t)s.n_blocks) + align_up((size_t)s.n_groups * 4));
    }
    default: return (double)nk * 2;
    }
}

/* Dtype the trainer's matmul kernels see for a weight in format q (gm_train.c scratch_floats). */
static gm_dtype kernel_dtype(gm_quant q, gm_dtype stored) {
    switch (q) {
    case GM_QUANT_NF4: return GM_NF4;
    case GM_QUANT_BF16: return GM_BF16;
    case GM_QUANT_INT8: return GM_I8;
    case GM_QUANT_F32: return GM_F32;
    default: return stored;
    }
}

/* Linear-layer parameters of the towers (the part bitsandbytes would quantize) and the FFN width
 * of the Gemma 4 vision encoder (§4.5: 3072 at width 768, 4304 at width 1152). Same formulas as
 * the presets in gm_config.c. */
static int64_t g4_vision_ffn(const gm_config *c) { return c->vision_hidden == 1152 ? 4304 : 4 * c->vision_hidden; }

static int64_t vision_linear_params(const gm_config *c) {
    if (c->vision_params <= 0) return 0;
    int64_t C = c->hidden_size, dv = c->vision_hidden;
    if (c->arch == GM_ARCH_GEMMA3N) return 2048 * C; /* only the embedder: MobileNet-V5 is Conv2d */
    return c->vision_layers * (4 * dv * dv + 3 * dv * g4_vision_ffn(c)) + G4_PATCH_VEC * dv + dv * C;
}

static int64_t audio_linear_params(const gm_config *c) {
    if (c->audio_params <= 0) return 0;
    int64_t C = c->hidden_size, da = c->audio_hidden;
    int64_t n = c->audio_layers * 24 * da * da + 1024 * da; /* conformer blocks + sub-sampling projection */
    if (c->arch == GM_ARCH_GEMMA3N) return n + da * C;      /* embedder Linear(1536 -> D) (§3.8) */
    return n + da * 1536 + 1536 * C;                        /* output_proj + LM embedder (§4.6) */
}

typedef struct base_bytes {
    double linear, embed, ple, other, vision, audio;
    int64_t linear_params; /* resident linear parameters (for the check against gm_quant_bytes) */
} base_bytes;

/* Every linear map of the text decoder that training reads, plus the rest, by part. */
static base_bytes base_weights(const gm_config *c, gm_quant q, gm_dtype stored, gm_dtype stored_embed) {
    base_bytes b;
    memset(&b, 0, sizeof b);
    int64_t C = c->hidden_size, L = c->n_layers, A = c->altup_inputs, P = c->ple_dim, R = c->laurel_rank;
    int64_t lin = 0;
#define MAT(N, K) (b.linear += matrix_bytes(q, stored, (N), (K)), lin += (int64_t)(N) * (K))
    for (int64_t l = 0; l < L; l++) {
        int64_t in, out;
        for (int w = 0; w < GM_LIN_COUNT; w++)
            if (lin_shape(c, l, w, &in, &out)) MAT(out, in);
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
    b.linear_params = lin;
    b.embed = (double)c->vocab_size * (c->tie_word_embeddings ? 1 : 2) * elem_bytes(stored_embed, (double)C);
    if (P > 0) b.ple = (double)c->ple_vocab * elem_bytes(stored_embed, (double)(L * P));
    /* norms, scalars, small coefficient matrices: whatever the checkpoint holds beyond the above
     * (Gemma 3n's unused k/v of KV-shared layers excluded), kept in f32 as the trainer does */
    int64_t unused_kv = 0;
    if (c->arch == GM_ARCH_GEMMA3N)
        for (int64_t l = 0; l < L; l++)
            if (c->kv_source[l] != l) unused_kv += 2 * C * geo(c, l).KW;
    int64_t text = gm_config_n_params(c) - c->vision_params - c->audio_params;
    int64_t rest = text - lin - unused_kv - c->vocab_size * C * (c->tie_word_embeddings ? 1 : 2) - c->ple_vocab * L * P;
    b.other = rest > 0 ? 4.0 * (double)rest : 0.0;
    /* towers: Linear layers in format q (bitsandbytes quantizes every nn.Linear), the rest as stored */
    int64_t vl = vision_linear_params(c), al = audio_linear_params(c);
    if (c->vision_params > 0)
        b.vision = matrix_bytes(q, stored, c->vision_hidden > 0 ? c->vision_hidden : 1, vl / (c->vision_hidden > 0 ? c->vision_hidden : 1)) +
                   elem_bytes(stored_embed, (double)(c->vision_params - vl));
    if (c->audio_params > 0)
        b.audio = matrix_bytes(q, stored, c->audio_hidden, al / c->audio_hidden) + elem_bytes(stored_embed, (double)(c->audio_params - al));
    return b;
}

/* ---- towers' forward buffers (f32, one image / one clip at a time, nothing saved) ---------- */

static size_t vision_forward_floats(const gm_config *c, int n_threads) {
    int64_t P = c->vision_patches, dv = c->vision_hidden, C = c->hidden_size, tok = c->vision_tokens;
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
    int64_t frames = (int64_t)ceil(s * c->audio_frames_per_s);     /* after the two stride-2 convolutions */
    int64_t da = c->audio_hidden, tok = (int64_t)ceil(s * c->audio_tokens_per_s);
    /* sub-sampling: features, conv 1 output (128 ch x mel/2 x 64 freq), conv 2 output (32 x mel/4 x 32) */
    size_t sub = (size_t)mel * 128 + (size_t)128 * (size_t)((mel + 1) / 2) * 64 + (size_t)32 * (size_t)((mel + 3) / 4) * 32;
    /* one conformer block: residual, norm, FFN hidden (4 da), q, k, v, attention output, GLU input
     * (2 da) = 12 da per frame, chunked local attention (8 heads x 24-key context + 13 positions) */
    size_t conf = (size_t)frames * (size_t)(12 * da) + (size_t)8 * (size_t)frames * (24 + 13);
    size_t outp = (size_t)tok * (size_t)(1536 + c->hidden_size);   /* soft tokens and their projection */
    return (sub > conf ? sub : conf) + outp;
}

/* ---- the estimate -------------------------------------------------------------------------- */

/* Per-token widths (floats) of the buffers one layer saves, by slot: layout()'s layer_acts first,
 * then what Gemma 3n / 4 keep besides. With checkpointing one record holds the widest layer. */
enum {
    /* gm_train.c layer_acts */
    S_XN1, S_RSTD1, S_QPRE, S_RSTDQ, S_KPRE, S_RSTDK, S_Q, S_K, S_V, S_ATT, S_LSE, S_OPRE, S_RSTDPA, S_XMID, S_XN2,
    S_RSTD2, S_GATE, S_UP, S_H, S_DPRE, S_RSTDPF, S_LORA_U0,
    /* v_norm without weight (§3.2, §4.2): the projection before the norm and its 1/rms; k_eq_v
     * layers take V from k_pre, so only the 1/rms */
    S_VPRE = S_LORA_U0 + GM_LIN_COUNT, S_RSTDV,
    /* AltUp (§3.4 steps 1, 2, 7): router norm output + 1/rms, tanh(router), 4x4 coefficients,
     * pred_0 (the attention input), then the correction's router norm + 1/rms, tanh, innovation
     * delta and its 4 gains */
    S_AU_RN, S_AU_RRSTD, S_AU_R, S_AU_COEF, S_AU_PRED0, S_AU_RN2, S_AU_RRSTD2, S_AU_R2, S_AU_DELTA, S_AU_K,
    /* LAuReL (§3.4 step 3): the low-rank branch before its norm, and 1/rms */
    S_LR_PRE, S_LR_RSTD,
    /* gaussian top-k (§3.4 step 6): mean and std of the gate over F per token */
    S_SP_STATS,
    /* PLE injection (§3.4 step 8, §4.2): gate pre-activation (for gelu'), projection before its
     * norm, 1/rms */
    S_PLE_GATE, S_PLE_PRE, S_PLE_RSTD,
    /* MoE (§4.4): router probabilities, router-norm 1/rms, top-k weights and indices, the experts'
     * normed input + 1/rms, per selected expert gate / up / gelu(gate)*up and its output (for the
     * gradient of its weight), the expert sum and the FFN sum before their norms + 1/rms */
    S_MOE_PROBS, S_MOE_RRSTD, S_MOE_TOPW, S_MOE_TOPI, S_MOE_XN, S_MOE_XRSTD, S_MOE_GATE, S_MOE_UP, S_MOE_H, S_MOE_Y,
    S_MOE_D2, S_MOE_D2RSTD, S_MOE_SUM, S_MOE_SUMRSTD,
    S_COUNT
};

static void record_widths(const gm_config *c, const gm_train_opts *o, int64_t l, int64_t w[S_COUNT]) {
    memset(w, 0, sizeof(int64_t) * S_COUNT);
    lgeo g = geo(c, l);
    int64_t C = c->hidden_size, H = c->n_heads, A = c->altup_inputs, E = c->n_experts, K = c->experts_top_k,
            Fe = c->expert_ffn, r = o->lora.rank;
    w[S_XN1] = C, w[S_RSTD1] = 1, w[S_QPRE] = g.QW, w[S_RSTDQ] = H;
    if (g.has_k) w[S_KPRE] = g.KW, w[S_RSTDK] = g.kvh, w[S_K] = g.KW, w[S_V] = g.KW;
    w[S_Q] = g.QW, w[S_ATT] = g.QW, w[S_LSE] = H;
    w[S_OPRE] = C, w[S_RSTDPA] = 1, w[S_XMID] = C, w[S_XN2] = C, w[S_RSTD2] = 1;
    w[S_GATE] = w[S_UP] = w[S_H] = g.F;
    w[S_DPRE] = C, w[S_RSTDPF] = 1;
    /* layout() keeps a LoRA input per target module in every record (whether or not this layer is
     * selected); a layer without the linear has none */
    for (int t = 0; t < GM_LIN_COUNT; t++) {
        int64_t in, out;
        if ((o->lora.targets & (1u << t)) && lin_shape(c, l, t, &in, &out)) w[S_LORA_U0 + t] = r;
    }
    if (c->arch == GM_ARCH_GEMMA3) return;
    if (g.has_k) {
        if (g.has_vproj) w[S_VPRE] = g.KW;
        w[S_RSTDV] = g.kvh;
    }
    if (A > 1) {
        w[S_AU_RN] = C, w[S_AU_RRSTD] = 1, w[S_AU_R] = A, w[S_AU_COEF] = A * A, w[S_AU_PRED0] = C;
        w[S_AU_RN2] = C, w[S_AU_RRSTD2] = 1, w[S_AU_R2] = A, w[S_AU_DELTA] = C, w[S_AU_K] = A;
    }
    if (c->laurel_rank > 0) w[S_LR_PRE] = C, w[S_LR_RSTD] = 1;
    if (g.sparse) w[S_SP_STATS] = 2;
    if (c->ple_dim > 0) w[S_PLE_GATE] = c->ple_dim, w[S_PLE_PRE] = C, w[S_PLE_RSTD] = 1;
    if (E > 0) {
        w[S_MOE_PROBS] = E, w[S_MOE_RRSTD] = 1, w[S_MOE_TOPW] = K, w[S_MOE_TOPI] = K;
        w[S_MOE_XN] = C, w[S_MOE_XRSTD] = 1;
        w[S_MOE_GATE] = w[S_MOE_UP] = w[S_MOE_H] = K * Fe;
        w[S_MOE_Y] = K * C;
        w[S_MOE_D2] = C, w[S_MOE_D2RSTD] = 1, w[S_MOE_SUM] = C, w[S_MOE_SUMRSTD] = 1;
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
        if (in->images > 0 && c->vision_tokens > 0) T += (double)in->images * ((double)c->vision_tokens + 2);
        if (in->audio_seconds > 0 && c->audio_tokens_per_s > 0) {
            double clips = ceil(in->audio_seconds / AUDIO_CLIP_S);
            T += (c->arch == GM_ARCH_GEMMA3N ? clips * G3N_AUDIO_TOKENS_PER_CLIP : ceil(in->audio_seconds * c->audio_tokens_per_s)) +
                 2 * clips;
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
    /* f32 activations and workspace: block inputs, one record per layer (S_COUNT buffers) and the
     * KV-sharing copies (4), the backward's and the loss's buffers (< 64) */
    double bytes = 4 * N * w * ((L + 1) + L * (S_COUNT + 4) + 64);
    /* attention scratch (n_threads x 2 x T x T), the widest dequantized panel per thread, the
     * towers' forward (one image: n_threads x patches^2 attention maps), the LM-head chunk */
    bytes += 4 * nt * (2 * T * T + (double)c->vision_patches * (double)c->vision_patches + w) +
             4 * (GM_MATMUL_PANEL_ROWS + 8.0) * dmax(w, C) + 4.0 * LM_ROWS * LM_VOCAB;
    /* adapters with their gradients and AdamW moments (16 bytes per parameter), base weights
     * converted (<= 4 bytes per parameter) or mapped, the tokenizer */
    bytes += 16 * L * GM_LIN_COUNT * (double)o->lora.rank * 2 * w + 8 * (double)gm_config_n_params(c) +
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
    GM_TRY(gm_plan_check_size(c, o, in, err));
    int64_t T = gm_plan_sequence_length(c, o->max_length, in);
    GM_TRY(validate(c, o, T, err));
    int64_t B = o->batch, N = B * T, C = c->hidden_size, H = c->n_heads, L = c->n_layers, r = o->lora.rank;
    int64_t A = c->altup_inputs > 1 ? c->altup_inputs : 1;
    int nt = o->n_threads;
    gm_arena a;
    gm_arena_init(&a, "plan", GM_DEVICE_CPU);
#define F32(n, kind) gm_arena_alloc(&a, (size_t)(n) * sizeof(float), kind)
#define I32(n, kind) gm_arena_alloc(&a, (size_t)(n) * sizeof(int32_t), kind)

    /* adapters: A (r x in), B (out x r), f32 parameters, gradients, AdamW m and v (layout()) */
    int64_t n_trainable = 0, Imax = 1;
    for (int64_t l = 0; l < L; l++)
        for (int w = 0; w < GM_LIN_COUNT; w++) {
            int64_t fin, fout;
            if (!adapted(o, l, w) || !lin_shape(c, l, w, &fin, &fout)) continue;
            int64_t na = r * fin, nb = fout * r;
            F32(na, GM_MEM_ADAPTERS), F32(nb, GM_MEM_ADAPTERS);
            F32(na, GM_MEM_GRADS), F32(nb, GM_MEM_GRADS);
            F32(na, GM_MEM_OPTIMIZER), F32(na, GM_MEM_OPTIMIZER), F32(nb, GM_MEM_OPTIMIZER), F32(nb, GM_MEM_OPTIMIZER);
            n_trainable += na + nb;
            if (fin > Imax) Imax = fin;
        }

    /* saved activations: every block's input (X[0..L], all AltUp streams), then the per-layer
     * records - one per layer, or the widest one under checkpointing (layout()) */
    for (int64_t l = 0; l <= L; l++) F32(N * C * A, GM_MEM_ACTIVATIONS);
    int64_t w[S_COUNT], wmax[S_COUNT];
    memset(wmax, 0, sizeof wmax);
    int64_t QWmax = 1, KWmax = 1, Fmax = 1, hdmax = 1;
    for (int64_t l = 0; l < L; l++) {
        record_widths(c, o, l, w);
        lgeo g = geo(c, l);
        QWmax = g.QW > QWmax ? g.QW : QWmax, KWmax = g.KW > KWmax ? g.KW : KWmax;
        Fmax = g.F > Fmax ? g.F : Fmax, hdmax = g.hd > hdmax ? g.hd : hdmax;
        for (int s = 0; s < S_COUNT; s++) {
            if (!o->checkpointing && w[s]) {
                if (s == S_MOE_TOPI) I32(N * w[s], GM_MEM_ACTIVATIONS);
                else F32(N * w[s], GM_MEM_ACTIVATIONS);
            }
            if (w[s] > wmax[s]) wmax[s] = w[s];
        }
    }
    if (o->checkpointing)
        for (int s = 0; s < S_COUNT; s++) {
            if (!wmax[s]) continue;
            if (s == S_MOE_TOPI) I32(N * wmax[s], GM_MEM_ACTIVATIONS);
            else F32(N * wmax[s], GM_MEM_ACTIVATIONS);
        }
    I32(N, GM_MEM_ACTIVATIONS), I32(N, GM_MEM_ACTIVATIONS); /* ids, pos */
    /* KV sharing (§3.5, §4.4): the source layers' K and V are read by later layers - kept apart
     * when checkpointing recycles the record; in the backward their dK/dV accumulate over every
     * sharing layer until the source's own backward (workspace) */
    bool src[GM_MAX_LAYERS] = {false};
    for (int64_t l = 0; l < L; l++)
        if (c->kv_source[l] != l && c->kv_source[l] >= 0 && c->kv_source[l] < l) src[c->kv_source[l]] = true;
    for (int64_t l = 0; l < L; l++) {
        if (!src[l]) continue;
        int64_t KW = geo(c, l).KW;
        if (o->checkpointing) F32(N * KW, GM_MEM_ACTIVATIONS), F32(N * KW, GM_MEM_ACTIVATIONS);
        F32(N * KW, GM_MEM_WORKSPACE), F32(N * KW, GM_MEM_WORKSPACE);
    }
    /* per-layer inputs [N, L x ple_dim] (§3.3 steps 2-4): every layer's PLE gate reads its slice
     * in the forward and the backward (they need no gradient: nothing upstream is trained) */
    if (c->ple_dim > 0) F32(N * L * c->ple_dim, GM_MEM_ACTIVATIONS);
    /* AltUp output (§3.6): streams 1..3 unembedded and their RMS, the average (final norm input) */
    if (A > 1) F32(N * (A - 1) * C, GM_MEM_ACTIVATIONS), F32(N * (A - 1), GM_MEM_ACTIVATIONS), F32(N * C, GM_MEM_ACTIVATIONS);

    /* backward workspace (layout()): residual gradient (all streams), two C-wide temporaries, q/k/v
     * and attention-output gradients at the widest layer, FFN gradients at the widest FFN (MoE: k
     * experts' intermediates per token), LoRA temporaries; AltUp needs a second stream-wide
     * gradient (prediction backward), MoE the router-logit gradient */
    int64_t Fwork = Fmax;
    if (c->n_experts > 0 && c->experts_top_k * c->expert_ffn > Fwork) Fwork = c->experts_top_k * c->expert_ffn;
    F32(N * C * A, GM_MEM_WORKSPACE);
    if (A > 1) F32(N * C * A, GM_MEM_WORKSPACE);
    F32(N * C, GM_MEM_WORKSPACE), F32(N * C, GM_MEM_WORKSPACE);
    F32(N * QWmax, GM_MEM_WORKSPACE), F32(N * QWmax, GM_MEM_WORKSPACE);
    F32(N * KWmax, GM_MEM_WORKSPACE), F32(N * KWmax, GM_MEM_WORKSPACE);
    F32(N * Fwork, GM_MEM_WORKSPACE), F32(N * Fwork, GM_MEM_WORKSPACE), F32(N * Fwork, GM_MEM_WORKSPACE);
    if (c->n_experts > 0) F32(N * c->n_experts, GM_MEM_WORKSPACE);
    F32(N * r, GM_MEM_WORKSPACE);
    F32(N * Imax, GM_MEM_WORKSPACE), F32(N * Imax, GM_MEM_WORKSPACE);
    /* loss (layout()): supervised rows and targets, gathered rows, running log-sum-exp; the
     * logits chunk LM_ROWS x LM_VOCAB never grows with the 262k vocabulary */
    I32(N, GM_MEM_WORKSPACE), I32(N, GM_MEM_WORKSPACE);
    F32(N * C, GM_MEM_WORKSPACE), F32(N * C, GM_MEM_WORKSPACE), F32(N * C, GM_MEM_WORKSPACE), F32(N, GM_MEM_WORKSPACE);
    int64_t rows = N < LM_ROWS ? N : LM_ROWS, vc = c->vocab_size < LM_VOCAB ? c->vocab_size : LM_VOCAB;
    F32(rows * vc, GM_MEM_TRANSIENT);
    for (int i = 0; i < 4; i++) F32(N, GM_MEM_WORKSPACE);

    /* kernel scratch (gm_train.c scratch_floats): attention (n_threads x 2 x T x T + partial dK/dV
     * per query head) at the widest head, or the widest dequantized weight panel; the LM head's
     * panel uses the linear weights' stored type as the trainer does */
    size_t scratch = 0, t;
    for (int64_t l = 0; l < L; l++) {
        t = gm_k_attention_scratch_floats(B, T, H, geo(c, l).hd, nt);
        scratch = t > scratch ? t : scratch;
    }
    gm_dtype kd = kernel_dtype(o->quant, stored);
    t = gm_k_matmul_scratch_floats(stored, LM_VOCAB, C, nt);
    scratch = t > scratch ? t : scratch;
    for (int64_t l = 0; l < L; l++)
        for (int wl = 0; wl < GM_LIN_COUNT; wl++) {
            int64_t fin, fout;
            if (!lin_shape(c, l, wl, &fin, &fout)) continue;
            t = gm_k_matmul_scratch_floats(kd, fout, fin, nt);
            scratch = t > scratch ? t : scratch;
        }
    if (c->n_experts > 0) {
        t = gm_k_matmul_scratch_floats(kd, C, c->expert_ffn, nt);
        scratch = t > scratch ? t : scratch;
    }
    if (c->vision_params > 0 && c->arch == GM_ARCH_GEMMA4) {
        t = gm_k_matmul_scratch_floats(kd, c->vision_hidden, g4_vision_ffn(c), nt);
        scratch = t > scratch ? t : scratch;
    }
    if (c->audio_params > 0) {
        t = gm_k_matmul_scratch_floats(kd, c->audio_hidden, 4 * c->audio_hidden, nt);
        scratch = t > scratch ? t : scratch;
    }
    F32(scratch, GM_MEM_TRANSIENT);
    /* frozen towers, forward only, one item at a time (counted apart from the decoder's scratch,
     * as the trainer reserves every buffer for the whole run) */
    bool vis = in && in->images > 0 && c->vision_params > 0, aud = in && in->audio_seconds > 0 && c->audio_params > 0;
    if (vis) F32(vision_forward_floats(c, nt), GM_MEM_TRANSIENT);
    if (aud) F32(audio_forward_floats(c, in->audio_seconds), GM_MEM_TRANSIENT);
#undef F32
#undef I32
    memcpy(out->by_kind, a.by_kind, sizeof a.by_kind);
    gm_arena_free(&a);

    /* base weights */
    base_bytes bw = base_weights(c, o->quant, stored, stored_embed);
    out->by_kind[GM_MEM_WEIGHTS] = (size_t)(bw.linear + bw.embed + bw.ple + bw.other + bw.vision + bw.audio);
    bool alias = gm_quant_is_alias(o->quant, stored);
    const char *lf = alias ? gm_dtype_name(stored) : gm_quant_name(o->quant), *ef = gm_dtype_name(stored_embed);
    size_t n = 0;
    gib_part(out->base_detail, sizeof out->base_detail, &n, "linear", lf, bw.linear);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "embeddings", ef, bw.embed);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "per-layer embeddings", ef, bw.ple);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "vision tower", lf, bw.vision);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "audio tower", lf, bw.audio);
    gib_part(out->base_detail, sizeof out->base_detail, &n, "norms", "f32", bw.other);

    out->by_kind[GM_MEM_TRANSIENT] += gm_plan_checkpoint_bytes(n_trainable);
    out->runtime = gm_plan_runtime_bytes(c);
    out->total = out->runtime;
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->total += out->by_kind[k];
    out->exact = false;
    out->n_params = gm_config_n_params(c);
    out->n_trainable = n_trainable;
    snprintf(out->note, sizeof out->note,
             "estimate: the Gemma 3 trainer's f32 layout per layer on T = %lld positions (%lld text + %lld image/audio)%s; "
             "LoRA on q/k/v/o/gate/up/down only (none on KV-shared k/v, no v where k=v; experts, PLE/AltUp/LAuReL "
             "linears, towers frozen); towers run forward in f32, one item at a time; %s base: every text linear%s, "
             "embeddings %s",
             (long long)T, (long long)o->max_length, (long long)(T - o->max_length),
             c->arch == GM_ARCH_GEMMA3N ? " + AltUp streams, PLE, LAuReL"
             : c->n_experts > 0         ? " + top-k expert intermediates"
             : c->ple_dim > 0           ? " + PLE inputs"
                                        : "",
             lf, alias ? "" : " and the towers' nn.Linear (as bitsandbytes)", ef);
    return GM_OK;
}
