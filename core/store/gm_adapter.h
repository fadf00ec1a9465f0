/*
 * gm_adapter.h - a trained LoRA adapter read back from disk, to generate or evaluate with.
 *
 * Sources (what `gemmarun generate --adapter` and `m:generate{adapter = ...}` accept):
 *   - a trial file of a results folder (results/<experiment>/trial-<id>.h5, format
 *     "gemmarun-results"): its /adapter group, the final adapter of a completed trial;
 *   - a results folder (results/<experiment>/): the trial chosen with `trial`, by its 1-based
 *     index in the sweep (a number, as `gemmarun x.lua --trial N`) or its id (or a prefix of it
 *     that only one trial's id starts with, any case; a number of 1-3 digits is an index only); without `trial`, the only trial that has
 *     an adapter (failed and interrupted trials have none);
 *   - a merged results file (results/<experiment>.h5, "gemmarun-results-merged", when merged with
 *     adapters, gm.results_merge(..., {adapters = true})): /trial/trial-<id>/adapter of the trial
 *     chosen as in a folder; the runner's own merged file has no adapters (use the folder);
 *   - a checkpoint (format "gemmarun-checkpoint", e.g. results/<experiment>/trial-<id>.ckpt.h5):
 *     /adapter, the adapter as of that step;
 *   - a PEFT adapter folder (adapter_config.json + adapter_model.safetensors, as PEFT's
 *     save_pretrained writes it, or gm_adapter_save_peft): r, lora_alpha, use_rslora and
 *     lora_dropout from the config; F32, BF16 or F16 tensors. What would make the forward differ
 *     from ours is refused with the field's name (DoRA, trained biases, rank_pattern /
 *     alpha_pattern, modules_to_save other than a multimodal model's projector, LoRA on
 *     embeddings), as are a tensor without its A/B
 *     partner and a tensor whose shape does not fit the model (another base, another rank).
 * A run that trained the image path (vision_targets, modules_to_save) stores the tower's adapters
 * ("...vision_tower.encoder.layers.N...", the text adapters' rank and scaling) and the projector
 * ("...multi_modal_projector.mm_input_projection_weight" (C, C_text), "...mm_soft_emb_norm.weight"
 * (C)) beside them: read into vision_lora and the projector's buffers (a.vision for
 * gm_vision_new_adapted); a model without a vision tower refuses them (GM_ERR_INVALID). A PEFT
 * folder may hold them too: LoRA on "model.vision_tower.encoder." modules, the projector with
 * modules_to_save ["multi_modal_projector"] (any other modules_to_save is refused).
 * A run that trained Gemma 3n's audio encoder (audio_targets) stores its conformer's adapters
 * ("...audio_tower.conformer.N...", the text adapters' rank and scaling) the same way: read into
 * audio_lora (for gm_audio_encoder_new_adapted); a model without an audio encoder refuses them.
 * The tensors are named by PEFT keys ("base_model.model.<module>.lora_A.weight", formats.md §6);
 * the modules present say where the adapters go, their shapes give the rank, and the stored
 * configuration gives the scaling: the attributes lora_alpha / lora_rslora a trainer writes into its
 * checkpoints, else config_json's alpha and rslora (trial files). Modules are matched on
 * "layers.N.<module>", so an adapter trained on a GGUF applies to the same model's Hugging Face
 * checkpoint in either layout.
 *
 * Ownership: gm_adapter_load returns an owned adapter (gm_adapter_free) whose buffers live on the
 * given backend; it borrows nothing after returning. Attach `&a->lora` to a generation state on
 * that backend (gm_infer_opts.adapter; NULL when a->lora.n is 0) and `&a->vision` to its image
 * path (gm_vision_new_adapted).
 * Errors: GM_ERR_IO / GM_ERR_FORMAT (unreadable or not one of the formats above, naming the
 * path), GM_ERR_NOT_FOUND (no adapter in the file; a trial that does not exist, is ambiguous or
 * has no adapter - the messages list the trials there are; several trials and no `trial`; a
 * trial file that is not the trial asked for), GM_ERR_INVALID (`trial` given with a checkpoint;
 * adapter shapes that do not fit the model, naming the tensor and both shapes).
 */
#ifndef GM_ADAPTER_H
#define GM_ADAPTER_H

#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_status.h"
#include "gm_vision.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_adapter {
    gm_lora lora;            /* the text decoder's adapters (A, B on the backend) */
    gm_lora vision_lora;     /* the vision tower's (n = 0: none) */
    gm_lora audio_lora;      /* Gemma 3n's audio encoder's (n = 0: none) */
    gm_config audio_cfg;     /* the audio conformer's config (gm_config_audio_tower) when the model has one */
    bool has_proj;           /* the run trained the projector (modules_to_save) */
    int64_t proj_C, proj_C_text; /* its sizes: the tower's width, the text width */
    gm_vision_adapter vision; /* the image path's trained parts for gm_vision_new_adapted: tower =
                                &vision_lora when it has adapters, else NULL; proj_w, proj_norm_w
                                when has_proj, else NULL */
    gm_arena arena;          /* their buffers */
    char source[4096];       /* the file or PEFT folder the tensors came from */
    char trial_id[64];       /* the trial's id ("" for a checkpoint) */
    int64_t step;            /* optimizer steps the adapter was trained for (-1: unknown) */
} gm_adapter;

/* Loads the adapter at `path` (see the file comment) for model m onto backend be. `trial` may be
 * NULL or "". */
gm_status gm_adapter_load(const gm_model *m, gm_backend *be, const char *path, const char *trial, gm_adapter **out,
                          gm_error *err);
void gm_adapter_free(gm_adapter *a);

/* The targets that select exactly lo's modules on model m, as PEFT's target_modules and
 * gemmarun's train.targets both read them: *list true - *out is a comma-separated list of module
 * names ("q_proj,v_proj") and layers[] the adapted layers (*n_layers of them), when the adapters
 * are those modules on those layers of a "model." checkpoint; false - *out is a regular
 * expression full-matched against module names that selects exactly the adapted ones (layers[]
 * is still filled). *out is gm_malloc'd. Errors: GM_ERR_NOMEM. */
gm_status gm_adapter_targets(const gm_lora *lo, const gm_model *m, bool *list, char **out, bool layers[GM_MAX_LAYERS],
                             int *n_layers, gm_error *err);

/* The vision_targets that select exactly a's tower adapters on multimodal model m, as train.
 * vision_targets reads them (matched on the tower's module names, every tower layer): "none" when
 * a has none; the module names ("q_proj,fc1") when they are the same modules on every layer; else
 * a regular expression full-matched against "model.vision_tower.encoder.layers.N.<module>" that
 * selects exactly them. *out is gm_malloc'd. Errors: GM_ERR_NOMEM. */
gm_status gm_adapter_vision_targets(const gm_adapter *a, const gm_model *m, char **out, gm_error *err);

/* The audio_targets that select exactly a's audio-encoder adapters on Gemma 3n model m, as train.
 * audio_targets reads them: "none" when a has none; the module names when they are the same
 * modules on every block; else a regular expression full-matched against
 * "model.audio_tower.conformer.N.<module>". *out is gm_malloc'd. Errors: GM_ERR_NOMEM. */
gm_status gm_adapter_audio_targets(const gm_adapter *a, const gm_model *m, char **out, gm_error *err);

struct gm_trainer;
/* Starts trainer tr from adapter `a` (loaded on backend a_be for the trainer's model): each of the
 * trainer's adapters gets a's A and B of the same module, and a trained image path's tensors (the
 * tower's adapters, the projector) theirs by PEFT key (continuing training from a published or
 * earlier adapter; the optimizer state starts fresh). The two must be the same adapter shape:
 * GM_ERR_INVALID names what differs and what to set - a module one has and the other has not
 * (train.targets / train.layers, vision_targets, modules_to_save), the rank (train.rank), the
 * scaling (train.alpha, train.rslora). */
gm_status gm_adapter_to_trainer(const gm_adapter *a, gm_backend *a_be, struct gm_trainer *tr, gm_error *err);

/* Writes adapter `a` (loaded for model m on backend be) as a PEFT LoRA adapter folder `dir`
 * (created if missing; its two files replaced atomically):
 *   adapter_model.safetensors  F32 tensors under PEFT's keys for m's layout
 *                              ("base_model.model." + module + ".lora_A.weight" / ".lora_B.weight",
 *                              A: (r, in), B: (out, r)), the tower's likewise and a trained
 *                              projector as PEFT saves modules_to_save ("<module path>.<param>"),
 *                              metadata {"format": "pt"};
 *   adapter_config.json        LoraConfig's fields as PEFT's save_pretrained writes them
 *                              (peft/tuners/lora/config.py): peft_type LORA, task_type CAUSAL_LM,
 *                              r, lora_alpha, lora_dropout, use_rslora, bias "none",
 *                              base_model_name_or_path = base_model. target_modules: the module
 *                              names (["q_proj", "v_proj"]) with layers_to_transform when the
 *                              adapters are those modules on those layers of a "model." checkpoint;
 *                              otherwise a regular expression PEFT full-matches that selects exactly
 *                              the adapted modules (a multimodal checkpoint's vision tower has
 *                              q_proj too), the tower's adapted modules included; modules_to_save
 *                              ["multi_modal_projector"] for a trained projector.
 * PeftModel.from_pretrained(base, dir) then computes what gemmarun computes with `a` (tested by
 * tests/e2e/adapters_peft.sh). Errors: GM_ERR_INVALID (dir is a file), GM_ERR_IO naming the
 * path, GM_ERR_NOMEM. */
gm_status gm_adapter_save_peft(const gm_adapter *a, gm_backend *be, const gm_model *m, const char *dir, const char *base_model,
                               gm_error *err);

/* Writes adapter `a` as a llama.cpp LoRA adapter GGUF file at `path` (atomically), as llama.cpp's
 * convert_lora_to_gguf.py writes one and llama-adapter.cpp loads it (llama-cli --lora FILE):
 * general.architecture (m's architecture, "gemma3"), general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha; per adapter "blk.N.<GGUF weight name>.lora_a" (A, ne = [in, r]) and
 * ".lora_b" (B, ne = [r, out]), F32. llama.cpp scales by alpha / r and knows no rsLoRA, so an
 * rsLoRA adapter carries alpha * sqrt(r). Errors: GM_ERR_UNSUPPORTED for an adapter that trained
 * the image path (llama.cpp adapters carry no vision tower), GM_ERR_NOMEM, GM_ERR_IO naming the
 * path. */
gm_status gm_adapter_save_gguf(const gm_adapter *a, gm_backend *be, const gm_model *m, const char *path, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_ADAPTER_H */
