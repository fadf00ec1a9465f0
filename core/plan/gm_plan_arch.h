/*
 * gm_plan_arch.h - memory estimates for training runs gemmarun cannot train (yet): Gemma 3n and
 * Gemma 4, with their per-layer embeddings, AltUp streams, LAuReL, KV sharing, double-wide and
 * mixture-of-experts FFNs, and vision / audio towers (gemma_architecture.md §3-4).
 *
 * The estimate applies the Gemma 3 trainer's own accounting (core/train/gm_train.c, layout()) to
 * each part of the model: f32 activations of the same saved tensors per layer and per token, one
 * block's record plus every block's input under activation checkpointing, the attention kernel's
 * scratch (n_threads x 2 x T x T plus per-query-head partial dK/dV), the 512 x 8192 f32 LM-head
 * chunk, the widest dequantized weight panel, the backward buffers, and f32 LoRA parameters,
 * gradients and AdamW moments - and adds what these architectures save besides (AltUp's streams
 * and router/prediction/correction intermediates, the [L x ple_dim] per-layer inputs, LAuReL's
 * normed branch, the experts' router probabilities and top-k intermediates), the image / audio soft
 * tokens that take sequence positions, and the frozen towers' forward buffers for one item.
 * Run on a Gemma 3 config it reproduces gm_train_plan's items (tests/unit/test_plan_arch.c), which
 * is how the accounting is checked against the trainer.
 *
 * Assumptions (also in each plan's note):
 *   - LoRA targets only q/k/v/o/gate/up/down of the text decoder (o->lora.targets, o->lora.layers).
 *     KV-shared layers get no k/v adapters (they use another layer's K/V); Gemma 4's k_eq_v full
 *     layers have no v_proj, so no v adapter; MoE experts, AltUp/LAuReL/PLE linears and the towers
 *     are frozen and not adapted. Full layers of Gemma 4 use their own head_dim and KV heads.
 *   - max_length counts text tokens; each image adds vision_tokens soft tokens and each audio clip
 *     (<= 30 s) its soft tokens (Gemma 3n: always 188, §3.9; Gemma 4: 25 per second, §4.6), plus a
 *     begin and an end marker per item. The decoder runs on T = max_length + those positions.
 *     (Gemma 3 and Gemma 4 configs count their images as their trainers run: inside max_length,
 *     the tower being gm_plan_vision's item, as in gm_plan_training; Gemma 4 reaches this estimate
 *     only with audio.)
 *   - Towers run forward in f32 on one image / one clip at a time; nothing of theirs is saved for
 *     the backward (frozen, not adapted).
 *   - Base weights: quant nf4 / int8 / bf16 / f32 re-encode every linear map of the text decoder
 *     (attention, MLP, experts, router, PLE / AltUp / LAuReL linears) and, as bitsandbytes' 4-bit
 *     loading replaces every nn.Linear, the towers' Linear layers; convolutions (all of
 *     MobileNet-V5's body), position tables and norms stay as stored. Embeddings and the
 *     per-layer-embedding table stay in stored_embed. Quant "stored" keeps everything as stored
 *     (memory-mapped). Unused k/v projections of Gemma 3n's KV-shared layers are never read, so
 *     never resident.
 *
 * Ownership: plain value structs. Errors: GM_ERR_INVALID for impossible options (as the trainer's
 * validation: batch, max_length and the soft tokens within max_position_embeddings, LoRA config).
 */
#ifndef GM_PLAN_ARCH_H
#define GM_PLAN_ARCH_H

#include "gm_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Estimates the plan of a LoRA / QLoRA training run of any Gemma 3 / 3n / 4 config (gm_plan_training
 * calls it for arch != GM_ARCH_GEMMA3; on Gemma 3 configs it checks itself against the trainer).
 * Fills out->by_kind (base weights resident in `o->quant`, adapters, gradients, optimizer state,
 * saved activations, transients, workspace), out->runtime (gm_plan_runtime_bytes), out->total,
 * out->exact = false, n_params (gm_config_n_params), n_trainable (LoRA parameters under the
 * assumptions above), base_detail (the base weights by part) and note (what is estimated).
 * `stored` / `stored_embed`: dtypes of the linear weights / embeddings in the file (GM_BF16 for
 * Hugging Face checkpoints). `in` may be NULL (text only). */
gm_status gm_plan_estimate(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                           const gm_plan_inputs *in, gm_plan *out, gm_error *err);

/* The options' own bounds, checked before any size is computed (gm_plan_training and
 * gm_plan_estimate call it first): batch, gradient accumulation, threads and max_length positive
 * (max_length within max_position_embeddings), image / audio inputs that fit the context, and a
 * run small enough that no byte count of the plan can wrap size_t. The last is an upper bound
 * computed in double - every buffer is at most the widest per-token row (hidden x AltUp streams,
 * attention widths, FFN widths, expert intermediates, per-layer inputs, rank) times batch x
 * positions, and there are at most S_COUNT + 4 such buffers per layer plus the block inputs and
 * the backward's - and must stay under 2^62 bytes (4 EiB, beyond any machine), so the size_t sums
 * of the plan below keep 2 bits of headroom. GM_ERR_INVALID, naming the option, otherwise. */
gm_status gm_plan_check_size(const gm_config *cfg, const gm_train_opts *o, const gm_plan_inputs *in, gm_error *err);

/* Sequence positions the decoder runs on for these inputs: max_length + soft tokens + markers
 * (see the assumptions above). */
int64_t gm_plan_sequence_length(const gm_config *cfg, int64_t max_length, const gm_plan_inputs *in);

#ifdef __cplusplus
}
#endif
#endif /* GM_PLAN_ARCH_H */
