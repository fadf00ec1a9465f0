/*
 * test_util.h - the checks every test uses, the tolerance table, and fixture paths.
 *
 * A test program calls the CHECK macros, then `return gm_test_finish();`, which prints the
 * closing "N passed, N failed" line and returns the exit code ctest reads (0 pass, 1 fail,
 * 77 skipped). Output is terse on success and says the values on failure.
 *
 * Tolerances live in one table (below), each with the reason for its size. A test that needs a
 * looser bound adds a row here with its reason; no ad-hoc literals in tests.
 */
#ifndef GM_TEST_UTIL_H
#define GM_TEST_UTIL_H

#include "gm_status.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- tolerance table ------------------------------------------------------------------------
 * name                      value   why
 */
/* Dequantized values vs. ggml's own reference output (formats.md §1.7): the reference printed
 * 7 significant digits, and both sides compute d*q in f32 from the same f16 scale. */
#define TOL_DEQUANT_ABS 2e-6
/* f32 kernels vs. a double-precision loop over the same inputs: f32 rounding over sums of at
 * most a few thousand terms of magnitude <= 10. */
#define TOL_KERNEL_F32_REL 2e-5
#define TOL_KERNEL_F32_ABS 2e-5
/* Tiny random Gemma 3 (f32) logits vs. transformers on CPU in f32: identical math, different
 * summation order (OpenBLAS vs. MKL-DNN/ATen blocking); logits of magnitude <= ~5. */
#define TOL_TINY_LOGITS_ABS 2e-4
/* Real Gemma 3 270M (dequantized weights, f32 compute) vs. transformers in f32: 18 layers with
 * RMSNorm scales up to ~740 amplify summation-order differences; logits reach ~50. Measured
 * (2026-12-02, OpenBLAS 0.3.21, 2 threads, test_decoder_model): worst |diff| 1.6e-4 over 5 prompts
 * x 1,056 ids x every prefill position, 5.0e-5 on the top-32 ids of 48 cached decode steps (2.9e-4
 * before the one-model-definition forward, 2026-11-30). Absolute, no relative escape: 2.5x the
 * worst measurement. */
#define TOL_REAL_LOGITS_ABS 4e-4
/* log-sum-exp over the 262,144-entry vocabulary, same reasons: measured 7.8e-5 (prefill), 4.1e-5
 * (decode); 2.5x. */
#define TOL_REAL_LSE_ABS 2e-4
/* The real 270M's training loss at initialization (training forward, chunked f32 online
 * log-sum-exp) vs the mean cross-entropy from the decoder's logits with a double log-softmax over
 * all 262,144 entries (test_train_model, 8 fortunes): measured 1.7e-8 relative on an AVX-512 CPU
 * (2026-12-02) and 1.04e-7 on an AVX2-only one (2026-12-04: OpenBLAS's Haswell sgemm rounds
 * otherwise; the same bits with the binaries before and after that day's kernel changes); 3x the
 * larger. f32 has 6e-8 relative precision: this is a few roundings of the mean loss, while a
 * token or a vocabulary chunk missing from either side moves it by more than 1e-4. */
#define TOL_REAL_LOSS_F64_REL 3e-7
/* LoRA training of the tiny Gemma 3 vs. PEFT (+ bitsandbytes NF4) on CPU, f32 both sides
 * (tests/unit/test_train.c, fixture tests/ref/lora_ref.h5 on tiny_gemma3_lora: loss 6.6 nats near
 * ln 512, no saturated target; and tiny_gemma3_v9k, 9,000 x 560 logits in 2 x 2 LM chunks).
 * Measured 2026-12-02: loss 1.0e-7 relative; gradients 9.6e-6 of each tensor's largest element
 * (rsLoRA; 4.7e-6 otherwise); adapter weights after 10 AdamW steps 3.9e-6 absolute (Adam's
 * m/sqrt(v) turns tiny gradient differences of near-zero gradients into full-size updates, so
 * weights diverge faster than losses). Bounds: 10x the loss, 2x the gradients, 2.5x the weights. */
#define TOL_PEFT_LOSS_REL 1e-6
#define TOL_PEFT_GRAD_REL 2e-5
#define TOL_PEFT_WEIGHT_ABS 1e-5
/* Tiny Gemma 3n LoRA gradients (f32) vs PEFT's float64 computation of them and vs PEFT's f32 one
 * (tests/ref/make_gemma3n_ref.py, /lora): the unscaled attention (scale 1) and the AltUp streams
 * amplify f32 rounding - PEFT's own f32 gradients lie 2.12e-5 (relative to each tensor's largest)
 * from its float64 ones. Measured 2026-12-05: ours 1.6e-5 from PEFT's f32, 2.6e-5 from float64.
 * Bound: about twice either f32 computation's distance from float64. */
#define TOL_GEMMA3N_GRAD_REL 5e-5
/* The same for the tiny Gemma 4 decoders (tests/ref/make_gemma4_ref.py, /lora): unscaled attention
 * over wider full-layer heads, keys also the values on the k_eq_v fixture - PEFT's own f32 gradients
 * lie 5.1e-5 (E family) and 5.9e-5 (k_eq_v) from its float64 ones. Measured 2026-12-05: ours
 * 2.1e-5 / 2.4e-5 from PEFT's f32, 3.3e-5 / 5.6e-5 from float64. Bound: about twice PEFT's own f32
 * distance from float64. */
#define TOL_GEMMA4_GRAD_REL 1.2e-4
/* Logits of a model with an adapter, gemmarun against PEFT applying the same adapter (exported by
 * gemmarun or made by PEFT) on transformers' float32 model (tests/e2e/adapters_peft.sh): the same
 * bounds as the base models' logits (TOL_TINY_LOGITS_ABS, TOL_REAL_LOGITS_ABS) - the adapter adds
 * two small f32 matmuls per linear, of the same rounding class. Measured: 9.6e-6 (tiny). */
#define TOL_ADAPTER_PEER_TINY_ABS 2e-4
#define TOL_ADAPTER_PEER_REAL_ABS 4e-4
/* The same adapter exported as a GGUF LoRA file and applied by llama.cpp (llama-cpp-python 0.3.36)
 * to the real 270M's Q4_K_M GGUF, against gemmarun on the same file (generate_real.sh,
 * tests/peers/llama_check.py). llama.cpp's dot products quantize the activations to 8 bits: on the
 * base model alone its logits differ from ours by up to 1.01 (chat prompt, 262,144 logits) and
 * 0.86 (plain text); with the adapter 0.82. The bound is 2.5x the base model's worst: it measures
 * llama.cpp's arithmetic, not the adapter. The adapter's effect (with - without) agrees in
 * direction (correlation measured 0.9989 and 0.9973) and size (least-squares slope measured 1.017
 * and 0.965; an rsLoRA or rank scaling mix-up would give sqrt(8) or 1/sqrt(8)). */
#define TOL_ADAPTER_LLAMA_REAL_ABS 2.5
#define TOL_ADAPTER_LLAMA_EFFECT_CORR_MIN 0.99
#define TOL_ADAPTER_LLAMA_SLOPE_ABS 0.1
/* A merged model (gemmarun export --format merged: the base with the adapter merged into its
 * weights) against gemmarun with the adapter attached (tests/e2e/adapters_peft.sh,
 * generate_real.sh). f32 folder in transformers, float32: measured 1.15e-5 (tiny) and 2.77e-5
 * (real 270M, 262,144 logits after a chat prompt); gemmarun on the same folder 9.6e-6 (tiny): the
 * merge moves only the order of f32 additions (W x + s B (A x) against (W + s B A) x). Bounds as
 * the adapter's (TOL_ADAPTER_PEER_*). The bf16 folder (the default): the weights' bf16 rounding
 * (2^-9 relative) moves the tiny model's logits (up to 59) by 0.103; bound 0.3 (the adapter moves
 * them by 24.6). A GGUF merged model in llama.cpp against gemmarun with the adapter on the Q4_K_M
 * base: f16 measured 0.0248 (f32 0.0127, bf16 0.209: llama.cpp rounds activations to the weights'
 * type), Q8_0 0.902 (llama.cpp quantizes the activations to 8 bits for Q8_0 weights; on the Q4_K_M
 * base alone it is 1.01, TOL_ADAPTER_LLAMA_REAL_ABS); bounds about 2-4x those. */
#define TOL_MERGED_PEER_TINY_ABS 2e-4
#define TOL_MERGED_PEER_REAL_ABS 4e-4
#define TOL_MERGED_BF16_TINY_ABS 0.3
#define TOL_MERGED_LLAMA_F16_ABS 0.1
#define TOL_MERGED_LLAMA_Q8_0_ABS 2.0
/* The tiny multimodal Gemma 3 (tests/ref/make_vision_ref.py: SigLIP tower of 2 layers, width 32,
 * 16 patches; the tiny Gemma 3 decoder) against transformers on CPU in f32 (tests/unit/
 * test_vision.c), every weight layout: identical math, other summation orders (OpenBLAS vs ATen,
 * double vs f32 LayerNorm statistics). Measured 2026-12-02: tower output 1.61e-6, soft tokens
 * 1.07e-6 (magnitudes <= ~4); logits with 1, 2 and no images 6.56e-6. Bounds 3x. */
#define TOL_VISION_TOWER_TINY_ABS 5e-6
#define TOL_VISION_LOGITS_TINY_ABS 2e-5
/* Gemma 4's tower with an image (test_gemma4_vision, tiny f32 model, transformers 5.24): its last
 * hidden state (values up to 8.8; 5.5e-5 measured) and soft tokens (up to 3.7; 7.5e-6 measured), f32
 * both sides in different orders; the logits with our soft tokens (3.9e-4 measured: on transformers'
 * own soft tokens they are within TOL_TINY_LOGITS_ABS, 1.2e-4, so the rest is the tower's rounding
 * amplified by the decoder, the soft tokens entering unscaled beside sqrt(C)-scaled text rows) */
#define TOL_GEMMA4_VISION_HIDDEN_ABS 1e-4
#define TOL_GEMMA4_VISION_ABS 2e-5
#define TOL_GEMMA4_VISION_LOGITS_ABS 6e-4
/* LoRA gradients of that model with an image vs PEFT (f32): transformers' own f32 gradients are
 * 3.0e-4 (relative to the largest) from its ".double()" run (peft_f32_grad_rel_err_vs_f64: its
 * norms, pooler and loss stay f32, and the tower's gradients cancel), so both f32 runs may differ
 * by about that much */
#define TOL_GEMMA4_VISION_GRAD_REL 5e-4
/* The loss of that model's LoRA on the language model and the tower vs PEFT's float64 run: PEFT's
 * own f32 loss is 5.9e-7 (relative) from it; ours 4.5e-7 on a 2-core AVX-512 Xeon, 1.18e-6 on a
 * 2-core AVX2 EPYC (OpenBLAS's Haswell kernels; 1.2e-6 there before kernels/cpu/vmath.h too), both
 * kinds of CI machine; its logits are 4e-4 from transformers' (TOL_GEMMA4_VISION_LOGITS_ABS) */
#define TOL_GEMMA4_VISION_LOSS_REL 2.5e-6
/* A batch of images of different grids (the tower's batch padded) vs each image's sequence alone:
 * measured 4.8e-5 (of the largest entry, in the text decoder's layer 1) on the AVX-512 Xeon, and
 * 4.1e-5 with two images of one grid (no padding at all): the batch's other GEMM shapes and
 * summation orders, f32. On the AVX2 EPYC 1.28e-4 (2.11e-4 at e6a8289), 30-90e-6 on most of the 104
 * tensors; with the padding visible as keys (the bug this catches) 3.47 */
#define TOL_GEMMA4_VISION_BATCH_REL 4e-4
/* Gemma 3n's audio encoder (tests/unit/test_audio_encoder.c: the tiny encoder of
 * make_gemma3n_audio_ref.py on two real clips) against transformers on CPU in f32: the same math,
 * other summation orders (double sums in the convolutions, the group norm and the attention).
 * Measured 2026-12-05: sub-sampling output 2.2e-6, block outputs 2.5e-6, encoder 1.9e-6, soft
 * tokens 2.1e-6 (values up to 3.9). Bound 4x. */
#define TOL_AUDIO_ENCODER_ABS 1e-5
/* The trainer's summed loss over the fixture's prompts with their clips against the loss computed
 * from transformers' logits (test_audio_encoder): those logits lie within 2.7e-5 of gemmarun's.
 * Measured 2026-12-05: 2.3e-8 (loss 103.63 over 11 tokens); the bound of the PEFT loss checks. */
#define TOL_AUDIO_LOSS_REL 1e-6
/* LoRA gradients through the audio encoder and the decoder (tiny Gemma 3n with audio,
 * make_gemma3n_audio_ref.py /lora), relative to each tensor's largest: PEFT's own f32 gradients
 * lie 6.6e-5 from its float64 ones (the clamps, the logit cap and the unscaled attention of the
 * decoder amplify f32 rounding). Measured 2026-12-05: ours 2.9e-5 from float64, 5.6e-5 from
 * PEFT's f32 (the encoder's post.lora_A). Bound: about twice PEFT's own f32 distance. */
#define TOL_AUDIO_GRAD_REL 1.2e-4
/* Gemma 4's audio tower (test_gemma4_audio: the tiny f32 model of make_gemma4_audio_ref.py on two
 * real clips, against transformers 5.24 on CPU): the same math, other summation orders (double sums
 * in the convolutions and the attention). Measured 2026-12-05: sub-sampling 1.9e-6, blocks 2.3e-6,
 * tower output 1.2e-6, soft tokens 2.3e-6 (values up to 3.8): bound 4x. The logits of two prompts
 * with a clip each, 4.1e-5 (bound 3x), and the trainer's summed loss from them, 4.8e-8 relative (the
 * PEFT loss checks' bound). LoRA on the decoder and inside the tower's clamps vs PEFT, relative to
 * each tensor's largest: 1.4e-5 from PEFT's f32, 2.0e-5 from its float64, with PEFT's own f32 2.8e-5
 * from its float64 (peft_f32_grad_rel_err_vs_f64): bound about 4x PEFT's own distance. */
#define TOL_GEMMA4_AUDIO_ABS 1e-5
#define TOL_GEMMA4_AUDIO_LOGITS_ABS 1.2e-4
#define TOL_GEMMA4_AUDIO_LOSS_REL 1e-6
#define TOL_GEMMA4_AUDIO_GRAD_REL 1e-4
/* A sequence's log-probability (a sum over its 6 supervised tokens) scored in a batch of 3 copies
 * (one tower pass for the repeated image) vs alone (batch 1): the same math, the batch's BLAS
 * blocking. Measured 2026-12-02: 1.4e-6 (log-probability about -40); bound 7x. */
#define TOL_VISION_SCORE_BATCH_ABS 1e-5
/* Gradient checks (tests/unit/test_grad.c). f32 analytic gradients vs the 4th-order central
 * difference of a double-precision loss, relative to the tensor's largest gradient: measured
 * <= 2.6e-7 on every kernel (2026-11-30); 5e-6 leaves room for other inputs and still catches any
 * wrong term (a missing factor or sign is an O(1) error). */
#define TOL_GRAD_FD_REL 5e-6
/* A kernel's f32 forward loss vs the same loss in double: attention sums T*D products per output
 * and exponentiates (1e-4); the chunked cross-entropy sums V exp() terms per row (1e-5). */
#define TOL_GRAD_ATTN_LOSS_REL 1e-4
#define TOL_GRAD_XENT_LOSS_REL 1e-5
/* kernels/cpu/vmath.h against libm in double, every 2e6-th of the range (exp on [-87, 88.3],
 * tanh on [-20, 20]): measured 2026-12-06 exp 8.2e-8 relative, tanh 1.4e-7 relative (7.6e-8
 * absolute); bounds about 2x, under 2 float ulps (1.19e-7 each). */
#define TOL_VMATH_EXP_REL 1.5e-7
#define TOL_VMATH_TANH_REL 2.5e-7
/* Accumulating backward (beta = 1) vs plain backward plus the old value: one f32 addition of
 * values <= ~10, so within a few f32 ulps. */
#define TOL_GRAD_ACCUM_ABS 1e-6
/* AdamW, 10 steps of lr 2e-3 vs torch's update transcribed in double: f32 rounding of the update
 * terms accumulates to ~1e-6. */
#define TOL_ADAMW_ABS 1e-5
/* Sum of squares: the kernel accumulates in double, so only the summation order differs. */
#define TOL_SUMSQ_REL 1e-9
/* Dropout's kept values x / (1 - p): one f32 division, half an ulp (6e-8) relative; 1e-6 is loose. */
#define TOL_DROPOUT_SCALE_REL 1e-6
/* The learning rate of each step vs PEFT's scheduler (Python doubles): ours is computed in double
 * and stored as f32 for the kernel, so half an f32 ulp (6e-8) relative; 1e-6 + 1e-9 absolute. */
#define TOL_LR_REL 1e-6
#define TOL_LR_ABS 1e-9
/* The same examples split differently (batch 4 x accumulation 1 vs 1 x 4, 2 x 2 vs 4 x 1): the
 * same terms summed in a different order in f32; losses ~1-60 nats, measured <= 2e-7 relative. */
#define TOL_ACCUM_EQUIV_REL 1e-6
/* Data parallel (tests/e2e/data_parallel.sh, h5diff -d / -p): 2 ranks x grad_accum 2 vs 1 process
 * x grad_accum 4 on the tiny model (lr 1e-3; 12 steps with dropout, 8 with batch 5). A step's
 * gradients are the same terms summed as (g0 + g1) + (g2 + g3) instead of ((g0 + g1) + g2) + g3
 * in f32, and AdamW carries the last-bit differences on. Measured (2026-12-03): adapter 6.0e-7
 * abs (values up to 0.13), loss 2.9e-8 relative (losses ~50 nats); the bounds leave 16x / 30x.
 * Not a bound for long or unstable runs: at lr 1e-2 over 36 steps the adapters drifted 8e-5 apart
 * (the differences grow with the steps, as any reordering's do). 2 ranks x grad_accum 1 vs
 * grad_accum 2 sums two terms either way and is compared exactly (measured: bit-identical). */
#define TOL_DATA_PARALLEL_ADAPTER_ABS 1e-5
#define TOL_DATA_PARALLEL_LOSS_REL 1e-6
/* CUDA kernel vs. its CPU twin on the same inputs: f32 both sides, but different reduction
 * order (warp trees vs. sequential/double sums) and __expf/__tanhf-class intrinsics. */
#define TOL_CUDA_VS_CPU_ABS 1e-4
#define TOL_CUDA_VS_CPU_REL 1e-4
/* ... where a value is a sum over hundreds of products (GEMMs with K = 256-512 and |x|, |w| ~ 1:
 * results ~ 20, summed in cuBLAS's order, not OpenBLAS's; attention's dq / dk / dv and parameter
 * gradients summed over rows): the absolute part for results of that size (the relative part
 * stays TOL_CUDA_VS_CPU_REL). */
#define TOL_CUDA_VS_CPU_GEMM_ABS 1e-3
/* A CUDA bf16 GEMM (gm_kctx.bf16_gemm: x and the weight rounded to bf16, 8 significant bits, f32
 * accumulation) against the CPU's f32 one, as a fraction of the output's largest magnitude: with
 * |x|, |w| ~ U(-1, 1) and K = 256-512 the rounding error of a sum is ~sqrt(K) 2^-8 |x w| (about
 * 0.2% of the largest output), bounded at 1% - a GEMM that skipped the weight's dequantization
 * or read the wrong panel is off by the output's size. */
#define TOL_CUDA_BF16_GEMM_REL_MAX 1e-2
/* The CPU's bf16 GEMM (oneDNN, kernels/cpu/gemm_bf16.c) against the same products of bf16-rounded
 * x and weights summed in double, as a fraction of the output's largest magnitude: all that is left
 * is f32 accumulation over K = 512 (~sqrt(K) 2^-24 of a term; measured 3.4e-7). The fixture is not
 * saturated: the f32 GEMM is off that reference by more than TOL_CPU_BF16_GEMM_DISTINCT (1.2e-3). */
#define TOL_CPU_BF16_GEMM_REL 2e-6
#define TOL_CPU_BF16_GEMM_DISTINCT 1e-4
/* The CPU's: 3 LoRA steps on the tiny PEFT fixture with bf16 GEMMs (a bf16 base, an NF4 base; measured 1.5e-4)
 * against the same with f32 GEMMs (relative; test_train's test_compute). */
#define TOL_BF16_LOSS_REL 1e-3
/* The losses of 3 LoRA steps with bf16 GEMMs on a bf16 base against the same with f32 GEMMs
 * (relative). */
#define TOL_CUDA_BF16_LOSS_REL 1e-2
/* Base-weight re-encoding (core/quant, test_quant*.c). NF4 itself is compared with bitsandbytes
 * *exactly* (bytes, f32 statistics, dequantized values); these rows bound the error of each format
 * against the original f32 weight, per element, and a matmul through the encoded view is held to
 * sum_k |x_k| * bound_k + TOL_KERNEL_F32_REL * sum_k |x_k| |w_k|.
 * bf16: 8 significant bits (7 stored + the implicit one); round to nearest even is off by at most
 * half an ulp, 2^(e-8) for 2^e <= |w| < 2^(e+1), so |w - bf16(w)| <= 2^-8 |w| (reached near 2^e). */
#define TOL_QUANT_BF16_REL 0x1p-8
/* int8 vector-wise: q = round(x * 127/a) is within half a step of x/s, s = a/127; the two f32
 * roundings in 127/a = (1/a)*127 and s = a/127 add <= 4e-7 relative per step, times |q| <= 127:
 * bound (0.5 + 1e-4) * s. */
#define TOL_QUANT_INT8_STEPS 0.5001
/* The int8 dots of decoding (gm_kctx.int8_dot, kernels.h): each x is quantized to q * d with
 * d = max|x| / 127 of its block, off by at most half a step (+ the f32 rounding of x * (1/d), 127 x
 * 2^-24 of a step); the dot against the f32 one is then held to
 * sum_b TOL_INT8_DOT_STEPS * d_b * sum_{i in b} |w_i| + TOL_KERNEL_F32_REL * sum |x_i| |w_i|. */
#define TOL_INT8_DOT_STEPS 0.5001
/* NF4, in units of the block absmax A: the nearest of 16 codes is within half the widest gap of
 * the code book ((1 - 0.6961928) / 2 = 0.1519; +1e-4 for the f32 rounding of x * (1/A)). */
#define TOL_QUANT_NF4_CODE 0.1520
/* NF4 double quantization, in units of the group's absmax2: the dequantized absmax is within half
 * the widest gap of the signed dynamic map (0.0140625 / 2 = 0.00703) plus half a bin of bnb's
 * 65,536-bin code table (1/65535 = 1.5e-5) plus f32 roundings. */
#define TOL_QUANT_NF4_ABSMAX2 0.0071
/* Memory planner estimates (tests/unit/test_plan_arch.c). Parameter totals of the Gemma 3n / 4
 * presets vs published figures: those are printed with 2-3 significant digits (5.44B, 7.85B,
 * 5.1B, 30.7B, 25.2B: half a unit of the last digit is <= 1%), and one tower of Gemma 3n
 * (MobileNet-V5-300M) is only known by the "300M" in its name (+-5M = 0.1% of E2B). */
#define TOL_PARAMS_PUBLISHED_REL 0.01
/* Figures published with fewer digits or derived by a rule the model card does not spell out:
 * Gemma 4 E4B "8B" (one digit), "4.5B effective" (we get 4.64B: the card's breakdown of the
 * effective count is not available), 26B-A4B "3.8B active", Gemma 3n "1.91B effective". */
#define TOL_PARAMS_ROUGH_REL 0.04
/* The estimator run on Gemma 3 vs the trainer's own plan (gm_train_plan / gm_plan_training): the
 * same buffers with the same rounding, so every item agrees exactly; the bound only allows for
 * the base weights' norms (f32 in both, counted from the config by two formulas). */
#define TOL_PLAN_VS_TRAINER_REL 0.001
/* Activations at batch 2 vs batch 1: every saved buffer is N = B*T rows wide, so exactly 2x up to
 * the arena's 64-byte rounding of a few tiny buffers. */
#define TOL_PLAN_BATCH_SCALING_REL 0.001
/* A training run's measured peak resident memory (VmHWM) vs its plan's total: the product's
 * promise (DESIGN.md's memory model). Measured 2026-12-05: the 270M's text runs +0.8 / +1.0%
 * (README's quickstart), its image path -0.1% (digits_vision.lua, 4+2 digits per class, was
 * +7.3% before the tokenizer.json tree got its own mapping), the tiny image model within 2%. */
#define TOL_PLAN_PEAK_REL 0.05
/* Generation with adapters (KV cache, one token per call) vs the training forward on the whole
 * sequence, same weights and adapters (test_backend on the tiny model, test_train_model on the real
 * 270M): the same layer code, but decode-time attention over the cache (attention_fwd) vs the
 * training kernel (attention_train_fwd), and 1-row GEMVs vs GEMMs, sum in different orders.
 * Tiny model (logits <= ~5, 6 layers): measured 1.5e-5 (2026-12-01); real 270M (logits ~50, 18
 * layers with RMSNorm scales up to ~740 amplifying rounding): measured 2.1e-4 over 64 positions x
 * 262,144 logits. Bounds ~7x and ~10x the measurements; the adapters themselves move the logits by
 * 6.5 (tiny) and 36 (270M), so a missing adapter term fails by orders of magnitude. */
#define TOL_GEN_VS_TRAIN_ABS 1e-4
#define TOL_GEN_VS_TRAIN_REAL_ABS 2e-3
/* Table statistics (core/stats, tests/unit/test_stats.c). t_{0.975,df} above the tabulated
 * df <= 30 comes from the A&S 26.7.5 expansion: vs scipy.stats.t.ppf measured 1.3e-8 relative at
 * df = 31 (the worst case, the error falls as 1/df^5); the tabulated values are scipy's digits. */
#define TOL_T95_REL 2e-8
/* Percentile bootstrap of a 0/1 mean: the resample mean is exactly Binomial(n, p)/n, so each bound
 * lands on (or, by type-7 interpolation, between) the exact binomial quantiles; 10,000 resamples
 * move a 2.5% quantile by at most one step of the 1/n grid (MC sd of the tail fraction 0.16%). */
#define TOL_BOOT_BINOMIAL_STEPS 1.0
/* Calibration of the paired bootstrap test under the null: 400 simulated pairs of systems with the
 * same accuracy, rejection rate at alpha = 0.05 must lie within 3 binomial sd (0.033) of 0.05:
 * [0.017, 0.083] (a test that always or never rejects fails by far). */
#define TOL_PAIRED_NULL_RATE_ABS 0.033
/* A bootstrap p-value vs the exact probability it estimates (computable for 0/1 scores): within 4
 * Monte Carlo standard deviations sqrt(p(1-p)/B), plus 1/B for the +1 of the p-value. */
#define TOL_BOOT_MC_SD 4.0
/* Image preprocessing (core/image, test_image.c): decoding, resize and pixel_values equal PIL and
 * Gemma3ImageProcessorPil exactly. transformers' default Gemma3ImageProcessor (torchvision backend)
 * is not the reference: its antialiased bilinear resize rounds differently, so a few 8-bit levels
 * move by one (measured 2026-12-02, chelsea.png at 896: 12 of 2,408,448 values), one level being
 * 2/255 = 0.00784 after (x - 0.5) / 0.5, plus <= 6e-8 from its fused (x - 127.5) / 127.5. Bound:
 * one level and a float's rounding; a wrong filter or size moves values by many levels. */
#define TOL_IMAGE_TORCHVISION_ABS (2.0 / 255 + 1e-6)
/* Audio in (core/audio, test_audio.c; references from tests/ref/make_audio_ref.py).
 * Decoded, averaged and converted 16 kHz samples vs soundfile + numpy's mean + samplerate.resample
 * (libsndfile 1.2.2 and libsamplerate 0.2.2 in the wheels, Debian's 1.2.0 and 0.2.2 here): measured
 * 0 (bit-identical) on the real 8 kHz clips and the 44.1 kHz stereo WAV and FLAC; 4.5e-8 on the Ogg
 * Vorbis (Debian's libvorbis and the wheel's round the synthesis differently). Bound 1e-6, a few
 * ulps of samples near 1: the next-best converter (SRC_SINC_MEDIUM_QUALITY) moves samples by up to
 * 0.013 (speech) and 0.21 (the chirp), summing the channels instead of averaging them by 0.46. */
#define TOL_AUDIO_DECODE_ABS 1e-6
/* The extractor's periodic Hann window (f32) vs numpy's with its baseline loops, which call libm's
 * cosf as we do: measured 0. One f32 ulp of values in [0.5, 1) (2^-24): numpy's AVX2/FMA cos
 * differs from it by that in 35 of the 512 values; a symmetric window (2 pi n / 511) by 6e-3. */
#define TOL_AUDIO_WINDOW_ABS 0x1p-24
/* Log-mel features vs Gemma3nAudioFeatureExtractor (numpy's baseline loops) on the same 16 kHz
 * samples: both FFTs are f64 rounded to complex64 (FFTW here, pocketfft there), the mel sums f64 in
 * other orders, the log f64, then f32. Measured 9.5e-7 (one f32 ulp of |values| in [8, 16): the
 * floor is log(1e-5) = -11.5) on the real clips and 4.8e-7 on generated noise. Bound 4e-6. Not a
 * bound against transformers on any CPU: with numpy's AVX2/FMA loops (the default where the CPU
 * has them) the window's last bits change and the log-mels of bins ~60 dB under their frame's peak
 * move by up to 4.1e-3 (the fixture's /batch max_abs_diff_default_dispatch); an f32 FFT would be
 * 0.05 away. */
#define TOL_AUDIO_LOGMEL_ABS 4e-6
/* Log-mel features vs Gemma4AudioFeatureExtractor (numpy's baseline loops) on the same 16 kHz
 * samples (test_audio, tests/ref/gemma4_audio_fe_ref.h5): the same f64-FFT-rounded-to-complex64
 * path as 3n's, magnitudes, f64 mel sums in other orders, log(mel + 1e-3) in f64, then f32; the
 * window (np.hanning in f64, then f32) is bit-identical. Measured 2026-12-05: 4.8e-7 (one f32 ulp of
 * |values| in [4, 8): the floor is log(1e-3) = -6.9) on the real clips and on generated noise;
 * transformers' own output with numpy's SIMD loops moves by the same 4.8e-7 (its window unchanged).
 * Bound 2e-6, four such ulps. */
#define TOL_AUDIO4_LOGMEL_ABS 2e-6
/* Tokenizer, chat template, parsers: exact. */

/* ---- checks ---- */
extern int gm_test_passed, gm_test_failed;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (cond) {                                                                          \
            gm_test_passed++;                                                                \
        } else {                                                                             \
            gm_test_failed++;                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

#define CHECK_OK(expr, errp)                                                                 \
    do {                                                                                     \
        gm_status chk_s_ = (expr);                                                           \
        const gm_error *chk_e_ = (errp); /* a variable: `&err` in a test is never NULL */    \
        CHECK(chk_s_ == GM_OK, "%s -> %s: %s", #expr, gm_status_name(chk_s_),               \
              chk_e_ ? chk_e_->msg : "");                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol, ...)                                                           \
    do {                                                                                     \
        double chk_a_ = (double)(a), chk_b_ = (double)(b);                                   \
        CHECK(fabs(chk_a_ - chk_b_) <= (tol), "%.9g vs %.9g (tol %.3g): ", chk_a_, chk_b_,   \
              (double)(tol));                                                                \
        if (!(fabs(chk_a_ - chk_b_) <= (tol))) fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n"); \
    } while (0)

/* Compares two float arrays; on failure prints the first few values side by side and the
 * worst element. Passes when every |a-b| <= abs_tol + rel_tol*|b|. Returns max |a-b|. */
double gm_check_close(const char *what, const float *a, const float *b, size_t n,
                      double abs_tol, double rel_tol);

/* Prints "N passed, N failed" and returns the process exit code. */
int gm_test_finish(void);

/* Marks the whole test skipped (prints why) and returns 77. For what a machine may lack by design
 * (a GPU). */
int gm_test_skip(const char *why);
/* The same, except under CI (environment CI set, not "0"/"false"): a failed check and exit 1. For a
 * missing tool or library that CI installs, so a broken install cannot pass as a skip. */
int gm_test_skip_unless_ci(const char *why);

/* Absolute path of a file under the source tree (tests/ref/..., etc.); static buffer. */
const char *gm_test_path(const char *rel);

/* Path of the real Gemma 3 270M GGUF in the cache, or NULL (with a message on stderr) if it is
 * missing. Honors GEMMARUN_HOME. */
const char *gm_test_real_model(void);

/* strstr(hay, needle) != NULL: error messages are checked for the words a user needs. */
bool gm_test_contains(const char *hay, const char *needle);

/* true if the path exists (stat succeeds). */
bool gm_test_file_exists(const char *path);

/* A fresh scratch folder /tmp/gm_<name>_XXXXXX (mkdtemp) into buf (>= 64 bytes), or false after
 * a failed CHECK (a failure, never a skip: the checks that need it would silently not run). */
bool gm_test_make_tmpdir(const char *name, char *buf, size_t cap);
/* Removes a scratch folder and everything in it. */
void gm_test_remove_tmpdir(const char *dir);

/* Monotonic clock in seconds (CLOCK_MONOTONIC), for the timings some tests print. */
double gm_test_now_s(void);

/* Crash-safety tests: forks a child that runs child(ctx, fd) (it writes its progress reports to
 * fd and never returns on its own), sleeps `delay` seconds, kills it with SIGKILL, reaps it and
 * checks that SIGKILL is what ended it (a counted check naming `what`). Returns the read end of
 * the report pipe, which the caller drains and closes; -1 if the pipe could not be made. */
int gm_test_fork_and_kill(double delay, void (*child)(void *ctx, int fd), void *ctx, const char *what);

struct gm_model;
struct gm_backend;
struct gm_lora;
/* Generation's logits of ids[0..T): one token per gm_decoder_forward call through the KV cache
 * (batch 1), with adapters `lora` (NULL: none) on backend be (NULL: a CPU backend of its own);
 * out (T, V). Counts a failed check on error. */
void gm_test_cached_logits(const struct gm_model *m, struct gm_backend *be, const struct gm_lora *lora, const int32_t *ids,
                           int64_t T, float *out);

struct gm_trainer;
/* PEFT fixtures of a multimodal model's LoRA (make_gemma4_vision_ref.py /lora_vt,
 * make_gemma4_audio_ref.py /lora_at): each adapter tensor under "<group>/<key>", key
 * "layers.3.self_attn.q_proj.A" for the language model's and "<word>.layers.0.<module>.B" for the
 * tower's (a PEFT name holding `tower`, e.g. "vision_tower" / "vision"). gm_test_peft_load uploads
 * every trained tensor of tr from the fixture, checking that each is named as one of the group's
 * peft_keys (one a line) and sized as PEFT's; returns how many it loaded. gm_test_peft_grads compares
 * each gradient with "<key>_grad" (f32) and "<key>_grad64" (float64): worst[f64][part] the worst
 * relative error (gm_test_rel_err), part 1 the tower's; seen[part] the tensors of each part. */
int gm_test_peft_load(struct gm_trainer *tr, const char *file, const char *group, const char *tower, const char *word);
void gm_test_peft_grads(struct gm_trainer *tr, const char *file, const char *group, const char *tower, const char *word,
                        double worst[2][2], int seen[2]);

/* The tiny Gemma 3 that tests/ref/make_lora_ref.py ran PEFT on (lora_ref.h5). */
#define GM_TEST_LORA_MODEL "tests/ref/tiny_gemma3_lora"

/* log-sum-exp of one row of V logits, in double (an independent reference for the kernels'
 * f32 online log-sum-exp). */
double gm_test_lse(const float *row, int64_t V);

/* A gradient's error relative to the reference's largest entry: max |got - want| / max |want|. */
double gm_test_rel_err(const float *got, const float *want, size_t n);

/* A tiny deterministic PRNG for test inputs (xorshift64*): uniform in [-1, 1). */
float gm_test_rand(uint64_t *state);

/* Reads a whole dataset of a reference HDF5 file into a gm_malloc'd buffer converted to
 * float32 (is_int = 0), int32 (is_int = 1), float64 (is_int = 2) or uint8 (is_int = 3). *n receives the element count; dims (up to 4) the
 * shape if not NULL. Returns NULL (and counts a failed check) if the file or dataset is missing. */
void *gm_test_h5_read(const char *file, const char *dataset, int is_int, size_t *n, int64_t *dims, int *ndim);
/* True when `path` (a group or dataset) exists in the HDF5 file (no error printed when not). */
bool gm_test_h5_exists(const char *file, const char *path);
/* Reads a numeric or string attribute of an object; returns false if absent. */
bool gm_test_h5_attr_double(const char *file, const char *obj, const char *attr, double *out);
/* A string attribute of an object (fixed or variable length) as a gm_malloc'd C string; NULL
 * if absent or not a string. */
char *gm_test_h5_attr_string(const char *file, const char *obj, const char *attr);

#endif /* GM_TEST_UTIL_H */
