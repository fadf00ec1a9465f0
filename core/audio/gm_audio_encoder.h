/*
 * gm_audio_encoder.h - Gemma 3n's audio encoder and audio embedder: log-mel features (gm_audio.h)
 * in, the soft tokens that stand at a clip's <audio_soft_token> positions of the prompt out.
 *
 * transformers' Gemma3nAudioEncoder, Gemma3nMultimodalEmbedder and Gemma3nModel.forward's audio
 * merge (modeling_gemma3n.py; gemma_architecture.md §3.8-3.9); the conformer blocks are an
 * architecture of the graph (core/arch/gemma3n_audio.c), so their linears take LoRA adapters and
 * have a backward; the sub-sampling and the embedder are frozen:
 *   sub-sampling: features (B, T, 128) as an image of 1 channel; twice: conv 3x3 stride 2 (time
 *     padded by 2 after the last frame, frequency by 1 on each side), cumulative group norm over
 *     (frequency, channels) along time, ReLU; then (B, T2, F2 C1) . input_proj^T -> (B, T2, D);
 *     frame t2's validity is frame 4 t2's (clamped to T - 1);
 *   conformer block x L (G = gradient_clipping, clamp(x) = min(max(x, -G), G)):
 *     ffw(x) = x + 0.5 RMS_post(clamp(silu(RMS_pre(clamp(x)) W1^T) W2^T));
 *     x = ffw_start(x);
 *     x = x + RMS_post(clamp(att(RMS_pre(clamp(x))) Wpost^T)), att the chunked local attention
 *       with relative positions (kernels.h audio_attention_fwd), q scaled by
 *       Dh^-0.5 / softplus(0) * softplus(per_dim_scale);
 *     x = x * valid; x = x + silu(RMS_conv(clamp(dwconv_causal(glu(RMS_pre(x) Wstart^T))))) Wend^T;
 *     x = RMS_norm(clamp(ffw_end(x)));
 *   reduction: every 4th frame (and its validity); padding frames zeroed;
 *   embedder: soft = RMS_noweight(RMS_soft(x) Wproj^T) (B, T3, C_text); padding frames and the
 *     positions T3 .. soft_tokens - 1 take the hard embedding of the last audio id
 *     (RMS_noweight(RMS_hard(E[id]) Wproj^T)), as Gemma3nModel pads every clip to
 *     audio_soft_tokens_per_image (188) positions.
 * RMS norms multiply by their stored weight (Gemma 3n's convention). Asserted against transformers
 * 5.24 on real speech by tests/unit/test_audio_encoder.c (tests/ref/make_gemma3n_audio_ref.py).
 *
 * Memory: planned, then allocated once (gm_arena's two passes) for up to max_clips clips of up to
 * max_frames feature frames. Linears are read as stored (f32, bf16 or f16): in place from the
 * memory-mapped checkpoint on a host-visible backend, uploaded once otherwise; vectors, the
 * convolutions, the projected relative-position tables and the padding token's embedding are f32
 * in the arena.
 * Ownership: gm_audio_encoder_new returns an owned encoder (gm_audio_encoder_free), which borrows
 * the model (and its mapping), the hard-token tables and the backend: all must outlive it.
 * enc->soft is backend memory owned by the encoder.
 * Errors: GM_ERR_INVALID (bad sizes; a batch longer than planned; a clip giving more soft tokens
 * than the model's audio_soft_tokens_per_image), GM_ERR_UNSUPPORTED (a model without an audio
 * tower, a tensor dtype other than f32/bf16/f16, a context wider than GM_K_AUDIO_SPAN_MAX),
 * GM_ERR_NOT_FOUND / GM_ERR_FORMAT (a tensor missing or of the wrong shape, both named with the
 * file), GM_ERR_NOMEM / GM_ERR_DEVICE (the arena). Messages end with what to do.
 */
#ifndef GM_AUDIO_ENCODER_H
#define GM_AUDIO_ENCODER_H

#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_config.h"
#include "gm_dtype.h"
#include "gm_graph.h"
#include "gm_lora.h"
#include "gm_status.h"
#include "gm_weights.h"
#include "kernels.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gm_model;
struct gm_mm_hard;

/* The most clips one encoder runs at once (Gemma 4's per-clip offsets are a fixed table). */
#define GM_AUDIO_MAX_CLIPS 256

/* The encoder's sizes, derived from the config (gm_audio_encoder_dims). */
typedef struct gm_audio_encoder_dims {
    int64_t M;                 /* mel bins (128) */
    int64_t C0, C1;            /* sub-sampling channels (128, 32) */
    int64_t F1, F2;            /* frequency bins after each convolution (64, 32) */
    int64_t D, H, Dh, FF;      /* width, heads, head width, feed-forward width (4 D) */
    int64_t W, L, R, K;        /* chunk, frames back, frames ahead, light-conv taps */
    int64_t red;               /* reduction factor (4) */
    int64_t C_text;            /* the decoder's width */
    int64_t soft_tokens;       /* positions per clip in the prompt (188); Gemma 4: the most a clip
                                  may have (750: each clip has one per valid frame after the
                                  sub-sampling) */
    int64_t V;                 /* hard audio tokens (128); Gemma 4: 0 */
    int64_t Dout;              /* the embedder's input width: D (3n), output_proj_dims (Gemma 4) */
} gm_audio_encoder_dims;

/* Frames after the sub-sampling (T2) and soft tokens (T3) of T feature frames, for config c. */
void gm_audio_encoder_frames(const gm_audio_config *c, int64_t T, int64_t *T2, int64_t *T3);

/* The soft tokens a clip of `samples` samples at 16 kHz takes in a prompt of multimodal config c:
 * Gemma 3n's audio_soft_tokens_per_image (188) whatever its length; Gemma 4's one per valid frame
 * after the sub-sampling, ceil(ceil(n / 2) / 2) of the extractor's n valid frames, n = (s - 161) /
 * 160 + 1 of its s = min(samples, 480000) samples (a frame is valid when its whole 321-sample
 * window after the 160 zeros of padding is audio: Gemma4AudioFeatureExtractor's mask, whatever the
 * batch pads to), 0 under 161 samples, at most audio_seq_length (750): what
 * Gemma4Processor.replace_audio_token and _compute_audio_num_tokens insert, and what
 * gm_audio_encoder_run gives the clip. */
int64_t gm_audio_tokens(const gm_config *c, int64_t samples);

/* The audio tower's PEFT module prefix (transformers 5's Gemma3nForConditionalGeneration): the
 * conformer's linears are "<prefix>conformer.N.attention.attn.q_proj", ... */
#define GM_AUDIO_TOWER_PREFIX "model.audio_tower."

typedef struct gm_audio_encoder {
    const struct gm_model *m;  /* borrowed; NULL: a plan */
    gm_audio_config cfg;       /* m->cfg.audio */
    gm_audio_encoder_dims d;
    gm_config tcfg;            /* the conformer as a config of its own (gm_config_audio_tower) */
    gm_weights w;              /* the conformer's views (core/arch/gemma3n_audio.c's slots) */
    gm_graph g;                /* the conformer blocks: X[0] from the sub-sampling, X[L] to the
                                  reduction */
    gm_lora lora;              /* the conformer's adapters when it trains (n = 0 when not) */
    bool train_tower;          /* adapters train: the graph keeps its records, backward runs */
    gm_backend *be, *owned_be;  /* be NULL: a plan (a host-visible backend assumed) */
    gm_arena arena, host;       /* gm_audio_encoder_new's own (unused inside another owner's arenas) */
    gm_dtype stored;            /* a plan: the dtype the checkpoint stores the linears in (bf16) */
    size_t alias_bytes;         /* linears read in place from the mapping (not in the arena) */
    int64_t max_clips, max_frames;
    size_t scratch_floats;      /* the sub-sampling's and the embedder's matmul workspace */
    /* weights outside the blocks, and the matrices the blocks' derived tables come from */
    float *conv_w[2], *gn_w[2];          /* (Co, Ci, 3, 3), (Co) */
    gm_wview input_proj;                 /* (D, F2 C1) */
    gm_wview *pos_proj;                  /* [n_layers] (owned array): (D, D) as stored */
    float *soft_norm;                    /* (D) */
    gm_wview proj;                       /* embedding_projection (C_text, D) */
    const struct gm_mm_hard *hard;       /* borrowed: the hard-token tables (gm_mm_embed.h) */
    float *pad;                          /* (C_text): the padding audio token's embedding */
    int64_t pad_id;                      /* that token, counted from the audio offset (text vocab - 1 - offset) */
    /* activations (backend); the blocks' are the graph's */
    float *x_in, *c0, *c1, *scratch;
    float *red, *red_n, *proj_out, *soft; /* (N3, D) reduced, normed; (N3, C_text) projected; (B, soft_tokens, C_text) */
    float *rstd_red, *rstd_out;          /* (N3): the embedder's two norms (training) */
    float *dsoft;                        /* (max_clips, soft_tokens, C_text): dL/d soft tokens, the caller's (training) */
    float *dred, *dout;                  /* (N3, D), (N3, C_text): the embedder's backward workspace */
    uint8_t *valid2, *valid3;
    int32_t *rows;                       /* reduction's row indices */
    /* host staging */
    uint8_t *h_valid2, *h_valid3;
    int32_t *h_rows;
    int64_t B, T2, T3;                   /* the last run's batch */
    /* Gemma 4 (g4): its sub-sampling (Conv2d padding 1, LayerNorm without bias, ReLU, the input
     * masked before each convolution), output_proj, and soft tokens packed: clip b's soft_off[b + 1]
     * - soft_off[b] tokens (its valid frames after the sub-sampling) at rows soft_off[b].. of soft */
    bool g4;
    float *zeros;                        /* (max(C0, C1)): the LayerNorms' absent bias */
    float *relu_b;                       /* {0, +inf}: ReLU as a clamp (clip_fwd's device bounds) */
    gm_wview out_proj;                   /* (Dout, D) */
    float *out_bias;                     /* (Dout) */
    float *outp, *doutp;                 /* (N2, Dout): output_proj's output; its gradient (training) */
    uint8_t *valid0, *valid1, *h_valid1; /* (B, T), (B, T1): each convolution's input frames */
    int64_t n_soft;                      /* the last run's soft tokens (Gemma 4: the sum of its clips') */
    int64_t soft_off[GM_AUDIO_MAX_CLIPS + 1];
    int64_t n_encoded;                   /* clips run through the encoder so far (for tests and reports) */
} gm_audio_encoder;

/* Plans and allocates the encoder of model m (its config's audio tower, its checkpoint's
 * model.audio_tower.* and model.embed_audio.* tensors) for up to max_clips clips of up to
 * max_frames frames, on backend be (NULL: a CPU backend of its own with n_threads threads), and
 * loads its weights. hard: m's hard-token tables (gm_mm_hard_load; borrowed, must outlive the
 * encoder), where the padding token's embedding comes from. */
gm_status gm_audio_encoder_new(const struct gm_model *m, const struct gm_mm_hard *hard, int64_t max_clips,
                               int64_t max_frames, int n_threads, gm_backend *be, gm_audio_encoder **out, gm_error *err);
/* The same running a trained adapter's LoRA on the conformer (gm_adapter.audio_lora: its buffers
 * on be, which must then be given; ad NULL or empty: gm_audio_encoder_new). GM_ERR_INVALID for an
 * adapter of another number of blocks. */
gm_status gm_audio_encoder_new_adapted(const struct gm_model *m, const struct gm_mm_hard *hard, int64_t max_clips,
                                       int64_t max_frames, int n_threads, gm_backend *be, const gm_lora *ad,
                                       gm_audio_encoder **out, gm_error *err);
void gm_audio_encoder_free(gm_audio_encoder *e);

/* The same encoder inside another owner's arenas (the trainer's, the planner's): describes it for
 * multimodal config mm (m and hard may be NULL for a plan, be too: a host-visible backend is
 * assumed), then gm_audio_encoder_layout runs in each pass of the owner's arena protocol;
 * gm_audio_encoder_release frees the tables (not the arenas). */
gm_status gm_audio_encoder_init(gm_audio_encoder *e, const gm_config *mm, const struct gm_model *m,
                                const struct gm_mm_hard *hard, int64_t max_clips, int64_t max_frames, int n_threads,
                                gm_backend *be, gm_error *err);
/* The same for training: lora (NULL: frozen, as gm_audio_encoder_init) puts adapters on the
 * conformer's linears its targets select (PEFT's target_modules rules on the module names under
 * GM_AUDIO_TOWER_PREFIX; its layers selection is ignored: every block), kept records for the
 * backward (only each block's input with checkpointing, the record recomputed before its
 * backward). GM_ERR_INVALID (prefixed "audio_targets") when the targets select no module or name
 * one the conformer has not. */
gm_status gm_audio_encoder_init_train(gm_audio_encoder *e, const gm_config *mm, const struct gm_model *m,
                                      const struct gm_mm_hard *hard, int64_t max_clips, int64_t max_frames,
                                      const gm_lora_config *lora, bool checkpointing, int n_threads, gm_backend *be,
                                      gm_error *err);
/* After the allocating layout pass of a training encoder: PEFT's initial adapters (A uniform, B
 * zero), zero gradients and moments. */
gm_status gm_audio_encoder_init_params(gm_audio_encoder *e, gm_error *err);
/* Backward of the last gm_audio_encoder_run from e->dsoft ((B, soft_tokens, C_text), backend):
 * the adapters' gradients accumulate. Only for a training encoder. */
void gm_audio_encoder_backward(gm_audio_encoder *e);
void gm_audio_encoder_release(gm_audio_encoder *e);

/* One pass of the arena protocol (gm_arena.h) on a = backend arena, host = host staging. */
gm_status gm_audio_encoder_layout(gm_audio_encoder *e, gm_arena *a, gm_arena *host, gm_error *err);

/* Audio files to the soft tokens that stand for them in a prompt (what `generate --audio` and
 * m:logits{audio = ...} run; needs gemmarun built with audio, GM_HAVE_AUDIO): each file decoded
 * and resampled (gm_audio_load), the batch's log-mel features (gm_audio_features_compute, the
 * model's extractor: Gemma 3n's or Gemma 4's), the encoder (gm_audio_encoder_new_adapted with `ad`,
 * NULL for none) on backend be (NULL: a CPU backend of n_threads). soft (room for n x soft_tokens x
 * C_text host floats) receives them: Gemma 3n's soft_tokens rows a clip, Gemma 4's tokens[i] rows
 * of clip i one after the other; tokens (n, may be NULL) each clip's count; samples (n, may be
 * NULL) each clip's length at 16 kHz before the extractor's 30 s cut. hard: m's hard-token tables
 * (unused on Gemma 4).
 * Errors: gm_audio_load's naming the file, GM_ERR_INVALID for a clip under one 32 ms frame or more
 * than 16 clips, the encoder's. */
gm_status gm_audio_encode_files(const struct gm_model *m, const struct gm_mm_hard *hard, const char *const *paths, int n,
                                int n_threads, gm_backend *be, const gm_lora *ad, float *soft, int64_t *tokens,
                                int64_t *samples, gm_error *err);

/* Called with each stage's output (backend memory, rows x cols f32): "sscp", "block_<i>",
 * "encoder" (after the reduction, padding frames zeroed). For tests and debugging. */
typedef void (*gm_audio_trace_fn)(void *user, const char *stage, const float *x, int64_t rows, int64_t cols);

/* Encodes B clips: features (B, T, M) f32 and valid (B, T) (1 = a frame of the clip, the
 * extractor's mask), host memory. Afterwards e->soft holds (B, soft_tokens, C_text) soft tokens
 * (backend memory, valid until the next run) and e->h_valid3 the T3 reduced frames' validity.
 * trace may be NULL. Gemma 4 (g4): e->soft holds the n_soft soft tokens packed, clip b's at rows
 * soft_off[b] .. soft_off[b + 1] - 1 (one per valid frame after the sub-sampling), and the trace's
 * "encoder" stage is the tower's output (output_proj) at those frames. Errors: GM_ERR_INVALID (B or
 * T outside what was planned, a clip giving more than soft_tokens tokens), the backend's sticky
 * error. */
gm_status gm_audio_encoder_run(gm_audio_encoder *e, const float *features, const uint8_t *valid, int64_t B, int64_t T,
                               gm_audio_trace_fn trace, void *user, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_AUDIO_ENCODER_H */
