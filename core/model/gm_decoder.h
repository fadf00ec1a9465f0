/*
 * gm_decoder.h - the Gemma 3 text decoder forward pass with a KV cache (inference).
 *
 * The graph (gemma_architecture.md §1.3), per layer l, on the residual stream x (B*T, C):
 *   xn = RMSNorm_in(x); q,k,v = xn Wq^T, xn Wk^T, xn Wv^T; per-head RMSNorm(q), RMSNorm(k);
 *   RoPE(q), RoPE(k) at the layer's base; k,v -> cache of layer kv_source[l];
 *   a = attention(q, cache; causal, sliding window on local layers) Wo^T;
 *   x += RMSNorm_post_attn(a);
 *   m = Wdown (gelu_tanh(RMSNorm_pre_ffw(x) Wgate^T) * (RMSNorm_pre_ffw(x) Wup^T));
 *   x += RMSNorm_post_ffw(m)
 * then logits = RMSNorm_final(x) E^T (tied), soft-capped when the config says so.
 * Extension points for Gemma 3n / 4 are the config's per-layer arrays: kv_source (layers that
 * reuse an earlier layer's cache skip their own k/v projection), ffn_dim, rope per layer.
 *
 * Memory: gm_infer_new plans every buffer for (B, T_max tokens per call, ctx_max positions)
 * from the config alone and allocates one arena; gm_decoder_forward allocates nothing.
 * Sliding layers keep a ring buffer of min(ctx_max, W + T_max - 1) slots (enough for a whole
 * prefill chunk to see its window); full layers keep ctx_max slots.
 *
 * Ownership: gm_infer owns its arena; it borrows the model, which must outlive it.
 * Errors: gm_infer_new returns GM_ERR_NOMEM with the planned size; gm_decoder_forward returns
 * GM_ERR_INVALID for a token id outside the vocabulary or a call that would overflow T_max or
 * ctx_max (naming the numbers), and leaves the state unchanged in that case.
 * Thread-safety: one gm_infer per thread; the model may be shared.
 */
#ifndef GM_DECODER_H
#define GM_DECODER_H

#include "gm_arena.h"
#include "gm_model.h"
#include "gm_status.h"
#include "kernels.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_infer_opts {
    int64_t batch;        /* B: sequences decoded side by side (default 1) */
    int64_t max_tokens;   /* T_max: tokens per forward call (prefill chunk; default ctx) */
    int64_t ctx;          /* ctx_max: total positions per sequence (prompt + generated) */
    int64_t logit_rows;   /* rows of logits a call may ask for (default B) */
    int n_threads;        /* CPU threads (default 2) */
} gm_infer_opts;

typedef struct gm_infer {
    const gm_model *model;
    const gm_kernel_table *k;
    gm_kctx kctx;
    gm_arena arena;
    int64_t B, T_max, ctx_max, logit_rows;
    int64_t n_past;             /* positions already in the caches */
    /* activations, rows = B*T_max */
    float *x;                   /* (B*T, C) residual stream */
    float *xn;                  /* (B*T, C) normed input of a sub-block */
    float *q, *att;             /* (B*T, H*D) */
    float *kx, *vx;             /* (B*T, KVH*D) new keys/values of this call */
    float *tmp;                 /* (B*T, C) sub-block output */
    float *gate, *up;           /* (B*T, F_max) */
    int32_t *pos;               /* (B*T) absolute positions */
    int32_t *ids;               /* (B*T) copy of the input ids */
    float *k_cache[GM_MAX_LAYERS], *v_cache[GM_MAX_LAYERS]; /* (B, S_l, KVH, D) */
    int64_t cache_slots[GM_MAX_LAYERS];                      /* S_l */
    float *logits;              /* (logit_rows, V) */
    float *logit_in;            /* (logit_rows, C) final-normed rows fed to the LM head */
    int64_t n_logit_rows;       /* rows filled by the last call */
    /* optional capture of the residual stream for tests: (L+1, B*T, C), set by the caller */
    float *capture_hidden;
} gm_infer;

/* Plans and allocates the state; opts may be NULL only if defaults suffice (ctx must be set). */
gm_status gm_infer_new(const gm_model *m, const gm_infer_opts *opts, gm_infer **out, gm_error *err);
void gm_infer_free(gm_infer *st);

/* Bytes gm_infer_new would allocate for these options (no allocation): the plan. */
size_t gm_infer_plan_bytes(const gm_config *cfg, const gm_infer_opts *opts, gm_dtype weight_dtype,
                           size_t by_kind[GM_MEM_KIND_COUNT]);

/* Forgets all cached positions (the next call starts at position 0). */
void gm_infer_reset(gm_infer *st);

/* Runs ids (B, T) at positions n_past .. n_past+T-1 of every sequence and appends them to the
 * caches. all_logits: logits for every one of the B*T positions (needs logit_rows >= B*T);
 * otherwise for the last position of each sequence (B rows). Result in st->logits, row-major
 * (n_logit_rows, V). */
gm_status gm_decoder_forward(gm_infer *st, const int32_t *ids, int64_t T, bool all_logits,
                             gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_DECODER_H */
