/*
 * gm_model.h - a loaded Gemma text decoder: config, weight views, tokenizer.
 *
 * gm_model_load opens a GGUF file or a Hugging Face checkpoint (a folder with config.json and
 * model.safetensors or a sharded index; or a .safetensors file with config.json beside it),
 * fills the config, and builds one gm_tensor view per weight. Linear and embedding weights stay
 * where they are - memory-mapped, in their stored dtype (f32, bf16, f16 or a GGUF block
 * format) - and kernels dequantize panels on the fly. Only the small RMSNorm weights are copied,
 * into f32 "effective scale" form: 1 + w for Hugging Face checkpoints, the stored value for
 * GGUF (which already holds 1 + w; gemma_architecture.md §5.3, pitfall 4 of §6).
 *
 * Weight names: every view carries its Hugging Face name ("model.layers.3.self_attn.q_proj.weight"),
 * the name PEFT adapters and our HDF5 files use, whatever the file called it.
 *
 * Ownership: gm_model owns the mappings (GGUF / safetensors), the norm arena and the tokenizer;
 * all views are valid until gm_model_free. A model is read-only after loading and may be
 * shared by several inference states and threads.
 * Errors: GM_ERR_IO (missing path), GM_ERR_FORMAT (malformed file; a weight whose shape does not
 * match the config is named with both shapes), GM_ERR_NOT_FOUND (a required tensor or
 * config.json is missing), GM_ERR_UNSUPPORTED (architecture, dtype). Messages name the file.
 */
#ifndef GM_MODEL_H
#define GM_MODEL_H

#include "gm_arena.h"
#include "gm_config.h"
#include "gm_status.h"
#include "gm_tensor.h"
#include "kernels.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gm_gguf;
struct gm_safetensors;
struct gm_tokenizer;

/* The weights of one decoder layer (Gemma 3). Shapes (outermost first):
 * attention: q (H*D, C), k (KVH*D, C), v (KVH*D, C), o (C, H*D); q_norm/k_norm (D);
 * MLP: gate (F, C), up (F, C), down (C, F); block norms (C). Norms are f32 effective scales. */
typedef struct gm_layer_weights {
    gm_tensor attn_norm, q, k, v, o, q_norm, k_norm, post_attn_norm;
    gm_tensor ffn_norm, gate, up, down, post_ffw_norm;
} gm_layer_weights;

/* Which linear of a layer (LoRA target modules use these names). */
typedef enum gm_linear {
    GM_LIN_Q = 0, GM_LIN_K, GM_LIN_V, GM_LIN_O, GM_LIN_GATE, GM_LIN_UP, GM_LIN_DOWN, GM_LIN_COUNT
} gm_linear;
/* "q_proj", "k_proj", ... (PEFT target-module names). */
const char *gm_linear_name(gm_linear which);
/* The view of that linear in a layer. */
const gm_tensor *gm_layer_linear(const gm_layer_weights *lw, gm_linear which);

/* The matrices a forward pass multiplies by, as kernel weight views (kernels/kernels.h). The model
 * builds one set as stored; a training session may build another (e.g. NF4-quantized base). */
typedef struct gm_weights_view {
    gm_wview embed;                            /* (V, C) */
    gm_wview lm_head;                          /* (V, C) */
    gm_wview lin[GM_MAX_LAYERS][GM_LIN_COUNT]; /* per layer, per gm_linear */
} gm_weights_view;

/* The weight view of a tensor whose storage is self-contained (f32, f16, bf16, GGUF blocks). */
gm_wview gm_wview_of(const gm_tensor *t);

typedef enum gm_model_format { GM_FORMAT_GGUF = 0, GM_FORMAT_SAFETENSORS = 1 } gm_model_format;

typedef struct gm_model {
    gm_config cfg;
    gm_model_format format;
    char path[1024];
    gm_tensor embed;           /* (V, C), stored dtype; also the LM head when tied */
    gm_tensor lm_head;         /* (V, C): == embed when tie_word_embeddings */
    gm_tensor final_norm;      /* (C) f32 effective scale */
    gm_layer_weights *layers;  /* [cfg.n_layers] */
    struct gm_tokenizer *tok;  /* NULL if the checkpoint has no tokenizer */
    gm_weights_view *views;    /* the weights as stored, for the kernels */
    size_t mapped_bytes;       /* bytes of weights viewed in place (mmapped) */
    /* owned resources */
    struct gm_gguf *gguf;
    struct gm_safetensors *st;
    gm_arena arena;            /* f32 norm weights */
} gm_model;

typedef struct gm_model_opts {
    bool load_tokenizer;       /* default true: build the tokenizer as well */
} gm_model_opts;

/* Loads `path` (GGUF file, HF folder, .safetensors file or index json). opts may be NULL. */
gm_status gm_model_load(const char *path, const gm_model_opts *opts, gm_model **out, gm_error *err);

void gm_model_free(gm_model *m);

/* Calls fn for every weight view (embedding, final norm, then each layer in order). */
typedef void (*gm_model_tensor_fn)(const gm_tensor *t, void *user);
void gm_model_for_each_tensor(const gm_model *m, gm_model_tensor_fn fn, void *user);

/* Tells the kernel that the memory-mapped pages of the linear weights may be dropped (after a
 * trainer re-quantized them, e.g. to NF4, it never reads them again): resident memory falls by
 * their size; a later read faults them back in from the file. Only weights viewed in place from
 * a read-only mapping are affected; a no-op otherwise. */
void gm_model_release_linear_pages(const gm_model *m);

/* Embedding multiplier applied to token rows: sqrt(C) in f32 (we compute in f32; Hugging Face
 * rounds it to the compute dtype, which is f32 here too - gemma_architecture.md §1.3). */
float gm_model_embed_scale(const gm_model *m);

#ifdef __cplusplus
}
#endif
#endif /* GM_MODEL_H */
