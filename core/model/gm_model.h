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
 * Which weights exist, their names in both layouts and their shapes come from the architecture's
 * spec (core/arch/gm_arch.h); the loader walks it and nothing else lists weights.
 * Weight names: every view carries its Hugging Face name ("model.layers.3.self_attn.q_proj.weight",
 * with the checkpoint's own module prefix), the name PEFT adapters and our HDF5 files use,
 * whatever the file called it.
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

#include "gm_arch.h"
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

typedef enum gm_model_format { GM_FORMAT_GGUF = 0, GM_FORMAT_SAFETENSORS = 1 } gm_model_format;

typedef struct gm_model {
    gm_config cfg;
    const gm_arch_def *arch;   /* the architecture's spec and forward (core/arch) */
    gm_model_format format;
    char path[1024];
    /* Module path of the text decoder in this checkpoint's weight names: "model." for
     * Gemma3ForCausalLM and GGUF files, "model.language_model." (converters, transformers 4.52 to
     * 4.x) or "language_model.model." (the hub's files, transformers 5's save_pretrained) for
     * Gemma3ForConditionalGeneration. */
    char prefix[64];
    /* The same path in transformers' module tree, as PEFT names adapter modules whatever the
     * files' layout: "model." for a text model, "model.language_model." for a multimodal Gemma 3
     * (transformers >= 4.52; checked against PEFT 0.21 on transformers 5.24 by tests/ref/
     * make_vision_ref.py). */
    char peft_prefix[64];
#define GM_PEFT_PREFIX_MULTIMODAL "model.language_model."
    /* Where top-level weights (gm_weight_spec.top_level) are named: "" for the text decoder; a
     * tower's multimodal root ("" or "model."), where its projector lives. */
    char root[64];
    /* Model-level weights by GM_GLOBAL_* index: embedding (V, C) in its stored dtype, final norm
     * (C) f32 effective scale, LM head (V, C) (the embedding's view when tied). */
    gm_tensor global[GM_MAX_GLOBALS];
    gm_tensor *layer;          /* [n_layers * arch->n_layer]: layer l's weight in slot s at
                                  l * n_layer + s; absent weights (KV-shared k/v) have data NULL.
                                  Linears stay as stored; norms are f32 effective scales. */
    struct gm_tokenizer *tok;  /* NULL if the checkpoint has no tokenizer */
    /* The vision tower and projector of a multimodal checkpoint (Gemma3ForConditionalGeneration),
     * as a model of its own: arch siglip, config gm_config_vision_tower, prefix the multimodal
     * model's root ("" or "model."), weights viewed in the same files. NULL: text only. */
    struct gm_model *vision;
    bool borrows_files;        /* a tower: gguf / st belong to the model that holds it */
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

/* Why model m cannot read images, as a clause for messages ("it has no vision tower", or Gemma 3n's
 * vision encoder not being in gemmarun), or NULL when it can (a loaded SigLIP tower). Static
 * storage. */
const char *gm_model_no_images(const gm_model *m);
/* The same for audio: NULL when model m reads audio (Gemma 3n with its audio encoder), else why
 * (Gemma 4's tower not being in gemmarun, or no encoder at all, with what to use). Static storage. */
const char *gm_model_no_audio(const gm_model *m);

/* The PEFT module prefix (gm_model.peft_prefix) of the checkpoint at `path` without loading it:
 * "model." for GGUF files, from the safetensors header's names for Hugging Face checkpoints (no
 * weight is read).
 * Errors as gm_model_load's for the safetensors files. */
gm_status gm_model_prefix(const char *path, char *out, size_t cap, gm_error *err);

/* The stored dtypes of a Hugging Face checkpoint's text decoder without loading it, from the
 * safetensors header: *linear that of layer 0's up_proj (the dominant linear), *embed the
 * embedding's; each left as it was when the tensor is absent. For planning (gm_config_probe).
 * Errors: GM_ERR_INVALID (`path` is not a Hugging Face checkpoint), gm_safetensors_open's. */
gm_status gm_model_stored_dtypes(const char *path, gm_dtype *linear, gm_dtype *embed, gm_error *err);

/* Layer l's weight in `slot` (m->arch->layer[slot]). */
static inline const gm_tensor *gm_model_weight(const gm_model *m, int64_t l, int slot) {
    return &m->layer[l * m->arch->n_layer + slot];
}

/* The identity of the model's files, for provenance (results files): sha256 of each file the
 * load read - the GGUF file; or config.json, every safetensors shard (and the index) and, when the
 * tokenizer came from them, tokenizer.json and tokenizer_config.json - and, in `hex`, the sha256 of
 * the lines "<file name> <sha256>\n" in that order (for a single GGUF file: the file's own sha256).
 * `files` (may be NULL) receives "name=<first 12 hex digits>" per file, space-separated, cut to
 * cap. Reads every byte of the weights (~0.2 s for 253 MB): call once per model and run.
 * Errors: GM_ERR_IO naming the file. */
gm_status gm_model_sha256(const gm_model *m, char hex[65], char *files, size_t cap, gm_error *err);

/* Weight `w` of m's architecture spec in layer `layer` (< 0: a model-level weight) as f32, read
 * from the file as stored: dst holds rows * cols floats (1-D weights: cols floats), linears and
 * the embedding dequantized from their stored dtype (bit-exact: every stored dtype is exact in
 * f32), norms in convention `conv` - GM_NORM_ONE_PLUS_W gives Hugging Face's stored w,
 * GM_NORM_DIRECT GGUF's 1 + w - converted from the file's own by adding or subtracting 1 in f32
 * (as llama.cpp's convert_hf_to_gguf.py does). For writing the model in another format
 * (core/store/gm_merged.h). Errors: GM_ERR_NOT_FOUND naming the file and the tensor. */
gm_status gm_model_weight_f32(const gm_model *m, const gm_weight_spec *w, int64_t layer, gm_norm_convention conv,
                             float *dst, gm_error *err);

/* The kernel weight view of a tensor whose storage is self-contained (f32, f16, bf16, GGUF
 * blocks). */
gm_wview gm_wview_of(const gm_tensor *t);

/* Calls fn for every weight view (embedding, final norm, then each layer in order). */
typedef void (*gm_model_tensor_fn)(const gm_tensor *t, void *user);
void gm_model_for_each_tensor(const gm_model *m, gm_model_tensor_fn fn, void *user);

/* Tells the kernel that the memory-mapped pages of the linear weights may be dropped (after a
 * trainer re-quantized them, e.g. to NF4, it never reads them again): resident memory falls by
 * their size; a later read faults them back in from the file. Only weights viewed in place from
 * a read-only mapping are affected; a no-op otherwise. */
void gm_model_release_linear_pages(const gm_model *m);


#ifdef __cplusplus
}
#endif
#endif /* GM_MODEL_H */
