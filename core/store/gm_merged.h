/*
 * gm_merged.h - a base model with a LoRA adapter merged into its weights, written for other tools:
 * a Hugging Face folder that transformers (and vLLM) load, or a GGUF file that llama.cpp (and
 * Ollama) load.
 *
 * Every weight of the architecture's spec (core/arch/gm_arch.h) is read from the base file as
 * stored and dequantized to f32 (gm_model_weight_f32: a Q4_K GGUF gives its exact Q4_K values),
 * each adapted linear gets W += scaling * B A (B: (out, r), A: (r, in); PEFT's merge, peft/tuners/
 * lora/layer.py get_delta_weight: the product in f32, then scaled), and the result is encoded in
 * the chosen dtype. The base is merged as stored, not as a QLoRA run saw it through NF4: the
 * adapter of a QLoRA trial lands on the weights the run quantized (what PEFT's merge_and_unload on
 * the unquantized base gives, and what servers expect).
 *
 * Hugging Face folder (GM_MERGED_HF): model.safetensors (every weight in `dtype`: bf16 or f32 -
 * not f16: transformers computes in the config's dtype, and Gemma's activations overflow in
 * float16 -, Hugging Face names, norms as w of the scale 1 + w), config.json (gm_config_to_json),
 * generation_config.json (bos, eos and <end_of_turn>, pad), and the tokenizer: the base folder's
 * tokenizer files copied when it has them, else - a GGUF base - tokenizer.json and
 * tokenizer_config.json built from the GGUF vocabulary (gm_tokenizer_save_hf, with the GGUF's chat
 * template, else Gemma 3's: gm_chat_gemma3_jinja; a copied tokenizer without a template gets Gemma
 * 3's as chat_template.jinja). A text base gives a Gemma3ForCausalLM (weights under "model.").
 * A multimodal base (Gemma3ForConditionalGeneration with its tower: a Hugging Face folder, e.g. a
 * text model given a tower by gm_model_save_with_tower) gives the whole multimodal model, with or
 * without an adapter and whatever the adapter trained: the decoder (LoRA merged) under
 * "language_model.model.", the SigLIP tower under "vision_tower.vision_model." with the adapter's
 * tower LoRA merged the same way (W += scaling * B A), the projector under
 * "multi_modal_projector." - the adapter's trained weight and norm when it trained them (PEFT's
 * modules_to_save: merge_and_unload keeps the trained copy), else the base's - and config.json with
 * the vision_config: the layout gm_model_save_with_tower writes, which transformers and
 * gm_model_load read. (A text-only adapter on a multimodal base keeps the tower as stored.) The
 * folder is written as OUT.partial and renamed into place (an earlier export at OUT is replaced
 * whole; a folder holding anything else, or the base's own folder, is refused), so a failed or
 * interrupted export leaves OUT as it was.
 * GGUF (GM_MERGED_GGUF, from a GGUF base; the text decoder only): the base's metadata (tokenizer,
 * chat template, ...) copied with general.file_type set for `dtype` (and Gemma 3's chat template
 * when it has none), written atomically (never over the base itself), the 2-D weights in `dtype` (f32, f16, bf16 or
 * q8_0; q8_0 falls back to f16 for a row length that is not a multiple of 32, as llama.cpp's
 * quantizer does), the 1-D norms in f32, as llama.cpp's converter keeps them.
 *
 * Ownership: nothing is kept; the adapter's A and B (and a trained image path's tensors) are
 * downloaded from backend `be`. Every encoded tensor is held until the file is written from those
 * buffers (peak: the output's size, one weight in f32, the base's mapped pages).
 * Errors: GM_ERR_INVALID (a dtype the format does not take; `out` not a folder / a folder, the
 * base itself, or a folder holding other files - named; an image-path adapter on a model without
 * a tower), GM_ERR_UNSUPPORTED (a GGUF from a Hugging Face base: its tokenizer has no GGUF form
 * here - the message says how to convert the Hugging Face folder instead; a GGUF with an adapter
 * that trained the image path: llama.cpp keeps the tower in a separate mmproj file - the message
 * points to the folder and PEFT exports; a Gemma 3n / 4 config), GM_ERR_NOMEM, GM_ERR_IO naming
 * the path.
 */
#ifndef GM_MERGED_H
#define GM_MERGED_H

#include "gm_backend.h"
#include "gm_dtype.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_status.h"
#include "gm_vision.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_merged_format { GM_MERGED_HF = 0, GM_MERGED_GGUF = 1 } gm_merged_format;

typedef struct gm_merged_info {
    int n_tensors;          /* tensors written */
    int n_merged;           /* of which carry an adapter (the tower's included) */
    int n_tower_merged;     /* of those, the vision tower's linears */
    bool multimodal;        /* the folder holds the tower and projector (Gemma3ForConditionalGeneration) */
    bool projector;         /* the projector is the adapter's trained one */
    size_t bytes;           /* size of model.safetensors / the GGUF file */
    const char *tokenizer;  /* "copied", "built from the GGUF vocabulary", "in the GGUF metadata" or "none" */
} gm_merged_info;

/* Writes model m with adapter `lo` (the decoder's LoRA; may be NULL: the base alone, converted)
 * and `vision` (a trained image path, gm_adapter.vision: the tower's LoRA and the projector, may
 * be NULL or hold neither) merged in, as `format` in `dtype`, at `out` (a folder for
 * GM_MERGED_HF, created if missing; a file for GM_MERGED_GGUF). The adapters' buffers are on
 * backend `be`. info may be NULL. */
gm_status gm_model_save_merged(const gm_model *m, const gm_lora *lo, const gm_vision_adapter *vision, gm_backend *be,
                               gm_merged_format format, gm_dtype dtype, const char *out, gm_merged_info *info, gm_error *err);

/* Writes text model m (a Gemma 3 decoder without a tower) with a new, randomly initialized SigLIP
 * vision tower and multimodal projector attached, as a Hugging Face Gemma3ForConditionalGeneration
 * folder at `out` (transformers and gm_model_load read it): for building an image model from a
 * text model when no pretrained tower of the wanted size is at hand (experiments/digits_vision.lua:
 * the real Gemma 3 270M with a small tower, the tower's LoRA and the projector trained).
 * `vision` gives the tower's shape as Hugging Face's vision_config does - hidden_size, n_layers,
 * n_heads, intermediate_size, image_size, patch_size, layer_norm_eps (0: 1e-6) - and tokens
 * (mm_tokens_per_image: a square whose side divides the patch grid); the rest is filled in: the
 * image markers are the vocabulary's <start_of_image> / <end_of_image>, the soft token
 * <image_soft_token> (262144 when the vocabulary lacks it: such rows are never embedded).
 * Weights: the decoder's as stored, dequantized to f32 (bit-exact) and encoded in `dtype` (f32 or
 * bf16), named in the hub's layout (language_model.model.*); the tower's and the projector's
 * drawn as transformers initializes a Gemma3ForConditionalGeneration made from its config
 * (normal(0, 0.02) linears, patch convolution and position embedding; zero biases and RMSNorm w;
 * unit LayerNorm weights), but with the projector drawn like the linears instead of zeroed (a zero
 * projector stalls training: gm_merged.c add_tower_weight), from Philox streams keyed by `seed`
 * and each weight's name: the same seed gives the same bytes. The tokenizer is copied or built as
 * gm_model_save_merged does; the folder is written as OUT.partial and renamed into place.
 * Errors: GM_ERR_UNSUPPORTED (not Gemma 3), GM_ERR_INVALID (m already has a tower; no tokenizer or
 * no <start_of_image> in it; an inconsistent tower shape, named with its fields; `out` as
 * gm_model_save_merged refuses it), GM_ERR_NOMEM, GM_ERR_IO naming the path. */
gm_status gm_model_save_with_tower(const gm_model *m, const gm_vision_config *vision, uint64_t seed, gm_dtype dtype,
                                   const char *out, gm_merged_info *info, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_MERGED_H */
