/*
 * gm_decoder.h - generation-time state of a model: the architecture's one forward in inference
 * mode (core/arch/gm_graph.h) with a KV cache, optional LoRA adapters, logits on the host.
 *
 * The layer is the architecture's own (core/arch/gemma3.c), the very code training runs; here the
 * graph keeps a KV cache per layer (layers that read another layer's keys and values, kv_source,
 * have none), reuses one set of activation buffers for every layer, and applies the adapters when
 * some are attached (gm_infer_opts.adapter: a trainer's, or one loaded from a results or
 * checkpoint file, core/store/gm_adapter.h). After the last layer the wanted rows are final-normed
 * and multiplied by the LM head, soft-capped when the config says so, and downloaded.
 *
 * Memory: gm_infer_new plans every buffer for (B, T_max tokens per call, ctx_max positions)
 * from the config alone and allocates one arena on the backend (plus a small host arena for the
 * logits and the staging of ids); gm_decoder_forward allocates nothing.
 * Sliding layers keep a ring buffer of min(ctx_max, W + T_max - 1) slots (enough for a whole
 * prefill chunk to see its window); full layers keep ctx_max slots.
 *
 * Ownership: gm_infer owns its arenas and, when none was given, its CPU backend; it borrows the
 * model, the adapter and a given backend, which must outlive it.
 * Errors: gm_infer_new returns GM_ERR_NOMEM with the planned size, GM_ERR_INVALID when the
 * adapter belongs to another backend; gm_decoder_forward returns GM_ERR_INVALID for a token id
 * outside the vocabulary or a call that would overflow T_max or ctx_max (naming the numbers),
 * and leaves the state unchanged in that case; a device failure comes back as GM_ERR_DEVICE.
 * Thread-safety: one gm_infer per thread; the model may be shared.
 */
#ifndef GM_DECODER_H
#define GM_DECODER_H

#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_graph.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_weights.h"
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
    const gm_lora *adapter; /* LoRA adapters to apply (NULL: the base model); their buffers must
                               be memory of `backend` */
    gm_backend *backend;  /* where to run (NULL: a CPU backend of the infer's own) */
    bool int8_dot;        /* one-token steps on Q8_0 / Q5_0 / Q4_K / Q6_K weights with llama.cpp-style int8 dots
                             (gm_kctx.int8_dot, kernels.h): faster decoding, but not the f32
                             numbers (within the bound kernels.h states). CPU kernels; off here (the
                             library computes the f32 numbers unless asked); generation's front ends
                             take GM_GENERATE_DOT_DEFAULT */
} gm_infer_opts;

/* The dots generation's front ends (`gemmarun generate --dot`, model:generate{dot =}) decode with
 * unless told: "int8", llama.cpp's scheme (x quantized to Q8_0 per 32 values, integer dots on the
 * stored blocks: 1.08-1.22x llama.cpp's decoding speed on a 2-core EPYC, docs/benchmarks.md), or
 * "f32" (each stored weight block dequantized and multiplied in f32: the numbers transformers
 * computes on the same GGUF, which the parity tests check; 0.73-0.80x llama.cpp's speed there). Training, evaluation and
 * model:logits always compute in f32 (or bf16 where `compute` says): this is decoding only. */
#define GM_GENERATE_DOT_DEFAULT "int8"

/* Parses a dot name ("int8" | "f32") into gm_infer_opts.int8_dot. Returns false (and leaves
 * *int8_dot unchanged) for any other name; the caller names the option in its error. */
bool gm_dot_from_name(const char *name, bool *int8_dot);

typedef struct gm_infer {
    const gm_model *model;
    gm_backend *be;             /* borrowed, or owned_be */
    gm_backend *owned_be;
    gm_weights w;               /* the model's weights on the backend (as stored) */
    gm_graph g;                 /* the forward in inference mode */
    gm_arena arena;             /* backend: weights copies, activations, KV caches, scratch */
    gm_arena host;              /* host: id / position staging, logits */
    int64_t B, T_max, ctx_max, logit_rows;
    int64_t n_past;             /* positions already in the caches */
    int32_t *logit_sel;         /* (logit_rows) backend: rows whose logits are wanted */
    int32_t *host_sel;          /* (logit_rows) host staging of logit_sel */
    float *logit_in;            /* (logit_rows, C) backend: final-normed rows fed to the LM head */
    float *logits_dev;          /* (logit_rows, V) backend */
    float *logits;              /* (logit_rows, V) host: the last call's logits */
    int64_t n_logit_rows;       /* rows filled by the last call */
    /* optional capture of the residual stream for tests: (L+1, B*T, C) host, set by the caller */
    float *capture_hidden;
} gm_infer;

/* Plans and allocates the state; opts may be NULL only if defaults suffice (ctx must be set). */
gm_status gm_infer_new(const gm_model *m, const gm_infer_opts *opts, gm_infer **out, gm_error *err);
void gm_infer_free(gm_infer *st);

/* Whether the state's one-token steps take the int8 dots at all: int8_dot was asked for, the
 * backend is the CPU's, and the LM head or a layer's linear is stored in a type the int8 dots read
 * (an f32 or bf16 model decodes in f32 whatever was asked). What generation reports. */
bool gm_infer_int8_dots(const gm_infer *st);

/* Switches the int8 dots of later one-token steps on or off (gm_infer_opts.int8_dot) on a state
 * kept between calls (model:generate's). */
void gm_infer_set_int8_dot(gm_infer *st, bool int8_dot);

/* Bytes gm_infer_new would allocate for these options (no allocation): the plan. */
size_t gm_infer_plan_bytes(const gm_config *cfg, const gm_infer_opts *opts, gm_dtype weight_dtype,
                           size_t by_kind[GM_MEM_KIND_COUNT]);

/* Forgets all cached positions (the next call starts at position 0). */
void gm_infer_reset(gm_infer *st);

/* Runs ids (B, T) at positions n_past .. n_past+T-1 of every sequence and appends them to the
 * caches. all_logits: logits for every one of the B*T positions (needs logit_rows >= B*T);
 * otherwise for the last position of each sequence (B rows). Result in st->logits (host),
 * row-major (n_logit_rows, V). */
gm_status gm_decoder_forward(gm_infer *st, const int32_t *ids, int64_t T, bool all_logits,
                             gm_error *err);

/* The same with soft tokens: in->ids (B, in->T), and in->embeds placed at in->embed_rows (see
 * gm_graph_input; in->B must be the state's batch and in->pos0 is ignored: n_past is used). */
gm_status gm_decoder_forward_input(gm_infer *st, const gm_graph_input *in, bool all_logits, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_DECODER_H */
