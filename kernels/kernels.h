/*
 * kernels.h - raw-pointer compute kernels, CPU reference beside CUDA twin.
 *
 * Two layers (style guide §4.6): core/ validates gm_tensor shapes and devices and calls these;
 * kernels trust their inputs (assert only) and do the math. Every kernel exists as
 * gm_k_<name>_cpu (kernels/cpu/) and, in CUDA builds, gm_k_<name>_cuda (kernels/cuda/) with the
 * identical parameter list; the list is kernels.def.
 *
 * Dimension letters (fixed project-wide): B batch, T tokens, C model dim (hidden_size),
 * H query heads, KVH kv heads, D head_dim, F FFN width, V vocab, S kv-cache slots,
 * M/N/K the GEMM dims. All activations are f32, row-major, contiguous.
 *
 * Shapes and contracts:
 *   dequant_rows   out (rows, K) f32 <- rows row0 .. row0+rows-1 of the weight w (N, K).
 *   matmul_fwd     out (M, N) = beta*out + x (M, K) . W^T for a weight view W (N, K) of any
 *                  storage. beta is 0 or 1 (1 accumulates, used for LoRA and residual paths).
 *                  Quantized W is dequantized panel by panel (never whole).
 *   matmul_fwd_multi  out[i] (M, N_i) = x (M, K) . W_i^T for the n <= GM_MATMUL_MULTI_MAX weight
 *                  views w[i] (N_i, K) that read the same x (q / k / v; gate / up): the same bits as
 *                  n calls of matmul_fwd with beta 0. Why: decoding (M <= 4) on the CPU takes one
 *                  parallel region for all of them, and x is quantized once for the int8 dots, where
 *                  each call was a region with its own fork and join (docs/benchmarks.md "Fused
 *                  projections"). The CUDA twin makes the n calls.
 *   embed_fwd      out (N, C) = table[ids[n]] * scale; table (V, C) a weight view.
 *   rmsnorm_fwd    out (N, C) = x / sqrt(mean(x^2) + eps) * w; w is the *effective* scale
 *                  (Gemma's 1 + weight, already added at load); w NULL: a weightless norm
 *                  (Gemma 3n's v_norm, scale 1). rstd (N) saved if not NULL.
 *                  Statistics in f32 (gemma_architecture.md §1.4). out may alias x.
 *   rope_fwd       out (N, NH, D) = rotate_half RoPE of x at positions pos[n] * pos_scale with
 *                  inv_freq[i] = theta^(-2i/D) (NeoX half-split layout, §1.5). out may alias x.
 *                  Only the first n_rot frequency pairs rotate (inv_freq[i] = 0 for i >= n_rot:
 *                  Gemma 4's "proportional" RoPE on full layers, §4.3: 64 of 256); n_rot = D/2
 *                  is the whole head.
 *   attention_fwd  out (B, T, H, D) = softmax(q k^T * scale + mask) v, with q (B, T, H, D)
 *                  at absolute positions pos0 .. pos0+T-1 and keys/values in caches
 *                  (B, S, KVH, D) where position p lives in slot p % S. Query head h uses kv
 *                  head h / (H / KVH). Causal; if window > 0 a key j is visible to query p
 *                  only when j > p - window (sliding layers). Requires S >= min(window, pos0+T)
 *                  for sliding and S >= pos0+T for full layers. Softmax in f32.
 *                  kv_end (B, T) int32, or NULL: query t sees keys j < kv_end[b*T+t] (absolute
 *                  positions) instead of j <= pos0+t - how an image's tokens see each other
 *                  bidirectionally while text stays causal (gemma_architecture.md §2.4: the
 *                  end of the query's image, or pos0+t+1); the window still cuts from below.
 *                  Keys past pos0+T-1 are never visible (they are not in the cache).
 *   geglu_fwd      out (n) = gelu_tanh(gate) * up  (§1.6).
 *   add_fwd        y (n) += x (n)   (residual stream).
 *   softcap_fwd    out (n) = cap * tanh(x / cap).
 * Gemma 3n (gemma_architecture.md §3; transformers' Gemma3nTextAltUp, Gemma3nTextModel,
 * Gemma3nTextMLP), S AltUp streams stored stream-major: x (S, N, C), stream j at x + j N C:
 *   altup_predict_fwd  out[j] = x[j] + sum_i coef[n, j S + i] x[i], coef (N, S*S) the
 *                  prediction_coefs output per token as Hugging Face reshapes it (row j, column i);
 *                  out must not alias x.
 *   altup_correct_fwd  out[j] = pred[j] + (coef[n, j] + 1) (act - pred[0]), act (N, C), coef
 *                  (N, S); out may alias pred.
 *   rms_match_fwd  out (N, C) = x * rms(target) / sqrt(max(mean(x^2), eps)), rms(t) =
 *                  sqrt(mean(t^2)) per row, no eps (the AltUp stream projections' magnitude
 *                  matching); out may alias x, not target.
 *   gaussian_topk_fwd  out (N, F) = max(0, x - (mean + std_mult * std)), mean and std (population)
 *                  per row: the FFN gate's activation sparsity; out may alias x.
 *   mul_cols_fwd   out (N, C) = x * s[c] (a per-channel scale: AltUp's correct_output_scale);
 *                  out may alias x.
 *   Their backward (assigning their outputs, except dtarget):
 *   altup_predict_bwd  dx[i] = dpred[i] + sum_j coef[n, j S + i] dpred[j]; dcoef[n, j S + i] =
 *                  sum_c dpred[j] x[i].
 *   altup_correct_bwd  from dy = dL/dout: dact = sum_j dy[j] (coef[n, j] + 1); dpred[j] = dy[j]
 *                  (j > 0), dpred[0] = dy[0] - dact; dcoef[n, j] = sum_c dy[j] (act - pred[0]).
 *   rms_match_bwd  with f = rms(t) / r, r = sqrt(max(mean(x^2), eps)), s = sum_c dy x:
 *                  dx = f dy - [mean(x^2) > eps] f s x / (C r^2); dtarget += s t / (C r rms(t))
 *                  (0 where rms(t) = 0).
 *   gaussian_topk_bwd  with the mask m = [x > cut] and G = sum_f m dy: dx = m dy - G (1/F +
 *                  std_mult (x - mean) / (F std)) (the cut's dependence on the row; 0 when std = 0).
 *   tanh_bwd       dx = dy (1 - y^2), y = tanh of the input; dx may alias dy.
 * Gemma 3n's audio encoder (gemma_architecture.md §3.9; transformers' Gemma3nAudioEncoder and its
 * modules in modeling_gemma3n.py), forward only (the tower is frozen):
 *   conv2d_fwd     out (B, To, Fo, Co) = the convolution of x (B, T, F, Ci) (channels last) with
 *                  w (Co, Ci, KT, KF) (torch's Conv2d layout, no bias), strides (ST, SF), the time
 *                  axis zero-padded by PT before the first frame and as far as the taps reach after
 *                  the last, the frequency axis by PF on both sides: out[b, t, f, o] = sum_{i, kt, kf}
 *                  w[o, i, kt, kf] x[b, t ST + kt - PT, f SF + kf - PF, i] over the taps inside x;
 *                  To = (T - 1) / ST + 1, Fo = (F + 2 PF - KF) / SF + 1. PT = 0: Gemma 3n's "reverse
 *                  causal" padding (Gemma3nAudioSSCPConvBlock); PT = 1 with KT = 3, ST = 2: Conv2d's
 *                  padding=1 (Gemma4AudioSubSampleConvProjectionLayer).
 *   cumulative_group_norm_fwd  out (B, T, G) from x (B, T, G), G a multiple of C (channel g % C):
 *                  with n_t = G (t + 1), m_t = sum_{t' <= t, g} x / n_t and
 *                  v_t = sum_{t' <= t} sum_g (x[t'] - m_{t'})^2 / n_t,
 *                  out[t, g] = (x[t, g] - m_t) / sqrt(v_t + eps) w[g % C], then max(0, .) when relu
 *                  (Gemma3nAudioCumulativeGroupNorm, no mask, as transformers calls it). out may alias x.
 *   audio_attention_fwd  out (B, T, H, D) from q, k, v (B, T, H, D) (q already scaled), pos
 *                  (L + R + 1, H, D) the projected relative-position embedding (row f: the key at
 *                  s = t - L + f, i.e. t - s = L - f steps back) and valid (B, T) (1 = a real
 *                  frame): query t of block u = t / W sees the keys s of its block's context
 *                  u W - L .. u W + W - 1 + R with t - L <= s <= t + R, 0 <= s < T and valid[b, s];
 *                  logit = cap tanh((q_t . k_s + q_t . pos[s - t + L]) / cap), softmax in f32. A
 *                  query that sees no key averages the values of its block's whole context (zeros
 *                  outside 0..T-1), as transformers' softmax over an all-masked row does
 *                  (Gemma3nAudioAttention, Gemma3nAudioRelativePositionEmbedding).
 *                  L + R + 1 <= GM_K_AUDIO_SPAN_MAX (the encoder refuses wider contexts).
 *   conv1d_causal_fwd  out (B, T, C)[t, c] = sum_k w[c, k] x[b, t - K + 1 + k, c] (depthwise, taps
 *                  before 0 are zero: Gemma3nAudioConformerLightConv1d); out must not alias x.
 *   glu_fwd        out (N, C) = x[:, :C] * sigmoid(x[:, C:]) for x (N, 2C).
 *   silu_fwd       out (n) = x sigmoid(x); out may alias x.
 *   clamp_fwd      out (n) = min(max(x, -limit), limit); out may alias x.
 *   mask_rows_fwd  rows n of x (N, C) with keep[n] = 0 set to fill (C), or to 0 when fill is NULL.
 * Their backward (gradients of the frozen encoder's activations, for adapters on its linears):
 *   audio_attention_bwd  dq, dk, dv (B, T, H, D) assigned from dout and the forward's inputs;
 *                  pos is frozen (no gradient). work (B, T, H, 2): each query's log-sum-exp and
 *                  delta = sum_s P_s (dout . v_s) (an averaging query: +inf, 0). With
 *                  l = cap tanh(a / cap): da = P (dout . v_s - delta) (1 - (l / cap)^2),
 *                  dq_t = sum_s da (k_s + pos), dk_s = sum_t da q_t, dv_s = sum_t P dout_t, and an
 *                  averaging query's dout / (W + L + R) to every key of its block's context. Two
 *                  passes (queries, then keys), no atomics: the same sums in every run.
 *   conv1d_causal_bwd  dx (B, T, C)[t, c] = sum_k w[c, k] dy[b, t + K - 1 - k, c] (outputs past T
 *                  absent); assigned, must not alias dy.
 *   glu_bwd        dx (N, 2C) from dy (N, C) and the forward's x (N, 2C): d x[:, :C] = dy sg,
 *                  d x[:, C:] = dy x[:, :C] sg (1 - sg), sg = sigmoid(x[:, C:]).
 *   silu_bwd       dx (n) = dy sg (1 + x (1 - sg)); dx may alias dy.
 *   clamp_bwd      dx (n) = dy where -limit <= x <= limit, else 0 (torch.clamp's gradient);
 *                  dx may alias dy.
 *   layernorm_fwd  out (N, C) = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), biased
 *                  variance, statistics in double (torch.nn.LayerNorm; SigLIP, gemma_
 *                  architecture.md §2.1); mean, rstd (N) saved when not NULL. out may alias x.
 *   layernorm_bwd  with xh = (x - mean) rstd, g = dy w: dx = beta*dx + rstd (g - mean(g) -
 *                  xh mean(g xh)); dw += sum_rows dy xh, db += sum_rows dy (each when not NULL).
 *   bias_fwd       y (N, C) += b (C) on every row.
 *   gelu_fwd       out (n) = gelu_tanh(x) (SigLIP's gelu_pytorch_tanh MLP, no gate);
 *   gelu_bwd       dx (n) = dy * gelu_tanh'(x) (assigned; dx may alias dy).
 *   avgpool_fwd    out (B, (P/K)^2, C) = mean over K x K windows of x (B, P*P, C), a P x P token
 *                  grid in row-major order (torch AvgPool2d(K, K) on the channel-first view:
 *                  Gemma 3's projector, §2.2). avgpool_bwd: dx (B, P*P, C) = dy of the window
 *                  / K^2 (assigned).
 * Gemma 4's vision tower (transformers' modeling_gemma4.py: Gemma4ClippableLinear,
 * Gemma4VisionRotaryEmbedding and apply_multidimensional_rope, Gemma4VisionPooler):
 *   clip_fwd       out (n) = min(max(x, *lo), *hi) (torch.clamp(x, lo, hi): a clipped linear's
 *                  input_min / input_max, output_min / output_max); lo and hi point to ONE float
 *                  each in the table's device memory (the checkpoint's buffers, read there: no
 *                  host copy), either may be -inf / +inf. NaN stays NaN; *lo > *hi gives *hi
 *                  everywhere, as torch's. out may alias x.
 *   clip_bwd       dx (n) = dy where *lo <= x <= *hi, else 0 (torch.clamp's gradient: the bounds
 *                  pass it); dx may alias dy.
 *   rope2d_fwd     out (N, NH, D) = the 2-D RoPE of x (N, NH, D), D a multiple of 4: the first
 *                  half [0, D/2) of every head is rope_fwd's rotate_half rotation of width D/2 at
 *                  position pos_x[n], the second half [D/2, D) the same at pos_y[n]: pairs
 *                  (j, j + D/4) of a half, inv_freq[i] = theta^(-2i/(D/2)) for i < D/4, the angle
 *                  computed as rope_fwd computes it (a half equals rope_fwd of head width D/2,
 *                  n_rot D/4, pos_scale 1). out may alias x.
 *   rope2d_bwd     dx = rotation of dy by -angle (the transpose of rope2d_fwd); dx may alias dy.
 *   pool_gather_fwd  out (R, C): out[r] = scale * sum_{j<K} x[src[r K + j]], x (N, C) rows, src
 *                  (R, K) int32 row indices into x (each in 0..N-1); the sum runs j = 0..K-1 in
 *                  order, in f32, then times scale (CPU and CUDA: the same operations in the same
 *                  order). Gemma 4's vision pooler (Gemma4VisionPooler._avg_pool_by_positions):
 *                  row r a soft token, its K = k^2 patches those of its k x k cell, scale 1/k^2;
 *                  any grid shape, padding rows of x simply never named. Must not alias x.
 *   pool_gather_bwd  dx (N, C) = 0 everywhere, then dx[src[r K + j]] = scale * dout[r] (R, C) for
 *                  every r, j (assigned). Contract: each row of x appears AT MOST ONCE in src
 *                  (true for the pooler: a patch belongs to one cell) - no accumulation, no
 *                  atomics (the CUDA twin zeroes dx, then one thread per (r, j, c) writes); rows
 *                  never named (padding) get 0. Must not alias dout.
 *
 *
 * Training kernels (whole sequences, no cache; row n = b*T + t):
 *   attention_train_fwd  out (B, T, H, D), lse (B, H, T) = log-sum-exp of each query's scaled,
 *                  masked scores (saved for the backward); q (B, T, H, D), k/v (B, T, KVH, D);
 *                  causal, sliding if window > 0 (j > t - window); kv_end as in attention_fwd
 *                  (positions 0..T; all T: bidirectional, a vision encoder). Scratch: gm_k_attention_
 *                  scratch_floats. Softmax in f32 (the CPU twin materializes each head's T x T
 *                  scores; the CUDA twin is fused, online softmax, no T x T buffer:
 *                  kernels/cuda/attention_train.cu).
 *   attention_bwd  dq (B, T, H, D), dk/dv (B, T, KVH, D) (all assigned) from dout and the
 *                  forward's q, k, v, out, lse. With P = exp(S - lse): dV = P^T dO,
 *                  dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q;
 *                  kv-head gradients sum over the query heads of their group.
 *   matmul_bwd_input  dx (M, K) = beta*dx + dy (M, N) . W (N, K) for a weight view (frozen
 *                  base or a LoRA matrix); quantized W dequantized panel by panel.
 *   matmul_bwd_weight dw (N, K) = beta*dw + dy^T (N x M) . x (M, K), all f32 (LoRA gradients).
 *   rmsnorm_bwd    with r = rstd, xh = x r, u = dy * w: dx = beta*dx + r (u - xh mean(u xh))
 *                  (gemma_architecture.md §1.4); dw += sum_rows dy * xh when dw is not NULL;
 *                  w NULL: the weightless norm (u = dy). dx may alias dy when dw is NULL.
 *   rope_bwd       dx = rotation of dy by -angle (the transpose of rope_fwd). dx may alias dy.
 *   geglu_bwd      dgate = dh * up * gelu'(gate), dup = dh * gelu(gate) (§1.6).
 *   scale_fwd      out = s * x.
 *   dropout_fwd    out = x * keep / (1 - p), keep[i] = uniform(key, i) >= p (Philox,
 *                  kernels/philox.h): the same key gives the same mask on every device, so the
 *                  backward applies this very kernel to the gradient.
 *   xent_lse_update  one vocabulary chunk [v0, v0+Vc) of the chunked cross-entropy: for each of
 *                  R rows, update the running max / sum of exp (online log-sum-exp) with the
 *                  (optionally soft-capped) logits, and record the target's logit when the
 *                  target falls in this chunk. Full (R x V) logits never exist.
 *   xent_grad_update  one chunk of the one-pass cross-entropy with its gradient (the LM head
 *                  multiplies once forward and once back per chunk, never recomputing logits):
 *                  as xent_lse_update for run_max / run_sum / tgt_logit, and, with m the row's
 *                  new running max and z the (soft-capped) logits: the row's accumulated
 *                  gradient dh (R, C) is rescaled by exp(old max - m) (set to 0 on the first
 *                  chunk, run_max = -inf), and logits become the weights exp(z - m) dz/dl
 *                  (dz/dl = 1 - (z/c)^2 when soft-capped, else 1), the target's own weight 0,
 *                  which the caller multiplies into dh (dh += weights . E_chunk). After the last
 *                  chunk dh = sum_{v != target} exp(z_v - m) dz_v/dl_v E_v, the softmax part of
 *                  dL/dh off the target times run_sum.
 *   xent_grad_finish  dh (R, C) = grad_scale (dh / run_sum + (exp(z_t - lse) - 1) dz/dl(z_t)
 *                  e_tgt), z_t = tgt_logit, e_tgt (R, C) the target's row of the head
 *                  (embed_fwd): dL/dh of the token loss lse - z_t. The target's p_t - 1 is formed
 *                  here in f32, not as p_t through the GEMM minus 1 after it: a bf16 GEMM rounds
 *                  its weights, and p_t - 1 near p_t = 1 would lose its digits. Rows with target
 *                  < 0 get 0.
 *   adamw          PyTorch AdamW (decoupled weight decay, Loshchilov & Hutter 2019), in the
 *                  order torch's single-tensor implementation evaluates it:
 *                  p *= decay (= 1 - lr wd); m += (1-b1) (g - m); v = b2 v + (1-b2) g g;
 *                  p += -step_size * m / (sqrt(v) / bc2_sqrt + eps), with
 *                  step_size = lr / (1 - b1^step), bc2_sqrt = sqrt(1 - b2^step) (computed by the
 *                  caller in double and rounded to f32, as torch does with Python scalars).
 *   sumsq          *out = sum x^2 (double accumulation; NaN/Inf propagate). out is one double of
 *                  the table's device memory (download it to read it).
 *
 * Data movement (so that model code never reads or writes backend memory from the host):
 *   fill           out (n) = value.
 *   gather_rows    out (R, C): row i = x row rows[i] (x has at least max(rows)+1 rows of C).
 *   scatter_rows   out row rows[i] = x row i (R, C); other rows of out are left as they are;
 *                  rows must be distinct.
 *   kv_store       cache (B, S, W) <- x (B, T, W): position pos0 + t of sequence b goes to slot
 *                  (pos0 + t) % S (the KV cache's ring buffer; see attention_fwd).
 *   xent_lse_finish  lse (R) = run_max + log(run_sum) in f32, closing xent_lse_update's online
 *                  log-sum-exp.
 *
 * Gemma 4's mixture of experts (gemma_architecture.md §4.4; transformers' Gemma4TextRouter,
 * Gemma4TextExperts), E experts, K per token, a token's K choices in "slots" that the caller
 * orders by expert (slot[n K + k] is the row of choice k of token n in the expert-sorted (N K) rows):
 *   moe_route_fwd  probs (N, E): the router's logits in, softmax (f32) out; idx (N, K) int32: the K
 *                  largest probabilities' experts, largest first (a tie: the lower expert); w (N, K) =
 *                  p[idx] / sum_k p[idx_k] * per_expert_scale[idx] (renormalized, then scaled).
 *   moe_route_bwd  dlogits (N, E) from dw (N, K): through the scale, the renormalization and the
 *                  softmax (the choice itself is piecewise constant: no gradient). Assigns.
 *   moe_combine_fwd  y (N, C) = sum_k w[n, k] ys[slot[n K + k]] (w NULL: weights 1, the sum of a
 *                  token's slots - the backward of gathering its row into them). Assigns.
 *   moe_combine_bwd  dw[n, k] = dy[n] . ys[slot] (assigned; dw may be NULL: not wanted), then
 *                  dys[slot] = w[n, k] dy[n]. dys may alias ys (each slot is read before written).
 *
 * Gradient convention: parameter gradients accumulate (+=, beta = 1); activation gradients are
 * assigned (=, beta = 0) except on the residual stream, where two paths meet and they
 * accumulate.
 *
 * Ownership: kernels allocate nothing; scratch comes from gm_kctx (planned by the caller).
 * Errors: none returned; misuse asserts. CUDA kernels are asynchronous on ctx->stream;
 * errors surface at the next gm_cuda_sync.
 */
#ifndef GM_KERNELS_H
#define GM_KERNELS_H

#include "../core/base/gm_dtype.h"

#include <stddef.h>
#include <stdint.h>

/* The widest relative span (L + R + 1) audio_attention_fwd takes: Gemma 3n has 13. */
#define GM_K_AUDIO_SPAN_MAX 512

#ifdef __cplusplus
extern "C" {
#endif

/* A frozen weight matrix W (rows N, cols K) in whatever storage it has: the view kernels read.
 *   f32 / f16 / bf16 / GGUF block formats: `data` is row 0, rows are row_bytes apart;
 *   GM_NF4 (bitsandbytes, formats.md §5.1): `data` holds the packed codes of the flattened
 *     tensor (element e in byte e/2, even e in the high nibble); block b = e/64 has absmax
 *     GM_DYNAMIC_MAP_SIGNED[absmax_code[b]] * absmax2[b/256] + absmax_offset (double quant);
 *   GM_I8 (vector-wise int8): int8 rows, w[r][k] = q[r][k] * row_scale[r].
 * On CUDA every pointer is a device pointer. */
typedef struct gm_wview {
    gm_dtype type;
    const void *data;
    size_t row_bytes;
    int64_t rows, cols;              /* N, K */
    const uint8_t *absmax_code;      /* NF4 only */
    const float *absmax2;            /* NF4 only */
    float absmax_offset;             /* NF4 only */
    const float *row_scale;          /* GM_I8 only */
} gm_wview;

/* Rows [r0, r0 + n) of a weight view (a block of a stacked matrix: Gemma 4's experts). Any type
 * whose rows are self-contained (float types, GGUF block types, int8 with its row scales), and NF4
 * when the block starts on a group of its double-quantized statistics (r0 x cols a multiple of
 * GM_NF4_ROWS_ALIGN elements: 256 blocks of 64 - true of every expert of 26B-A4B; the one absmax
 * offset is the whole tensor's, as quantized). */
#define GM_NF4_ROWS_ALIGN (64 * 256)
static inline gm_wview gm_wview_rows(const gm_wview *w, int64_t r0, int64_t n) {
    gm_wview v = *w;
    v.rows = n;
    if (w->type == GM_NF4) {
        int64_t e0 = r0 * w->cols; /* the caller checked e0 % GM_NF4_ROWS_ALIGN == 0 */
        v.data = (const uint8_t *)w->data + e0 / 2;
        v.absmax_code = w->absmax_code + e0 / 64;
        v.absmax2 = w->absmax2 + e0 / GM_NF4_ROWS_ALIGN;
        return v;
    }
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (w->row_scale) v.row_scale = w->row_scale + r0;
    return v;
}

/* A plain contiguous f32 matrix (N, K) as a weight view (LoRA A/B, tests). */
static inline gm_wview gm_wview_f32(const float *data, int64_t rows, int64_t cols) {
    gm_wview w = {GM_F32, data, (size_t)cols * sizeof(float), rows, cols, 0, 0, 0.0f, 0};
    return w;
}

/* Per-call execution context: threads, stream and the scratch the caller planned. */
typedef struct gm_kctx {
    int n_threads;        /* CPU threads for OpenMP loops and OpenBLAS */
    void *stream;         /* cudaStream_t on CUDA, unused on CPU */
    float *scratch;       /* workspace for dequantized weight panels etc. */
    size_t scratch_floats; /* its size in floats */
    void *blas;           /* cublasHandle_t bound to the stream on CUDA (NULL: the process's own) */
    bool int8_dot;        /* CPU, matmul_fwd with M = 1 on Q8_0 / Q5_0 / Q4_K / Q6_K weights (decoding): x is
                             quantized to int8 blocks once and the dots are integer, as llama.cpp's
                             (gm_dot_rows_q8) - faster, and NOT the f32 result: generation's default
                             (GM_GENERATE_DOT_DEFAULT, gm_decoder.h; `generate --dot f32` turns it off);
                             false everywhere else (training, evaluation, logits) */
    bool bf16_gemm;       /* matmul_fwd / matmul_bwd_input on a non-f32 weight (a bf16, NF4, int8 or GGUF base):
                             the weight (its panels dequantized) and x / dy in bf16, products accumulated
                             in f32 into f32 outputs - the mixed precision of PEFT with bf16 autocast
                             (torch.autocast on the CPU, TrainingArguments.bf16 on a GPU), rounding x to 8
                             significant bits: NOT the f32 result. CUDA: cublasGemmEx, CUBLAS_COMPUTE_32F,
                             from gm_backend.bf16_gemm (on by default). CPU: oneDNN's matmul
                             (kernels/cpu/gemm_bf16.c) in bf16_staging, both set by the trainer as its
                             compute option says (gm_train.h, gm_compute: "bf16" where native, "auto"
                             where faster than f32); without staging room, f32. f32 weights (adapters, an
                             f32 base): always f32 */
    uint16_t *bf16_staging; /* CPU bf16 GEMMs: x / dy and one dequantized weight panel in bf16 */
    size_t bf16_staging_elems; /* its size in bf16 elements (at most GM_CPU_BF16_STAGING_BYTES / 2) */
} gm_kctx;

/*
 * gm_kernels_startup(argv) - first thing in an executable's main(): the environment the CPU kernels'
 * libraries read once, in their constructors, before main() runs. Unless the user set them:
 *   - GOMP_SPINCOUNT=GM_OMP_SPINCOUNT (3000): an OpenMP thread that waits at a barrier or for the
 *     next parallel region spins about 30 us (libgomp counts ~100,000 spins a millisecond), then
 *     sleeps (futex). libgomp's default spins up to 300,000 iterations; when another process holds
 *     a core, the thread that finished its share spins on the CPU the unfinished one needs, and a
 *     training step of the 270M went from 4.75 s to 18.0 s beside one busy process (3.8x); never
 *     spinning (OMP_WAIT_POLICY=passive, the default from 2026-12-04 to 12-06) kept it at 2.2x
 *     (1.5x is the fair share of 2 cores among 3 busy threads) but each of decoding's parallel regions
 *     (~130 a token then, 73 since matmul_fwd_multi) paid a futex wake-up: 31-35 tokens/s against
 *     54-59 with the short spin (int8 dots, 128-token prompt, 2-core EPYC; llama.cpp 60-61); the step beside a busy process 2.34x
 *     with it, 2.51x at 10,000 spins (tests/bench/bench_busy.sh, bench_forward.sh;
 *     docs/benchmarks.md, "Short spins"). Not set when the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT.
 *   - OPENBLAS_CORETYPE: OpenBLAS's runtime CPU detection (0.3.21, Debian 12) does not know newer
 *     CPUs and falls back to its SSE3 "Prescott" kernels: on a 2-core AVX-512 Xeon sgemm ran at 63
 *     GFLOP/s instead of 265-309 with its SkylakeX kernels, and a LoRA step of the 270M took 7.04 s
 *     instead of 2.76 s (docs/benchmarks.md, "OpenBLAS's core type"). Where the core OpenBLAS picked
 *     predates AVX2 (gm_blas_core_fallback) but the CPU has AVX-512 (F, BW, DQ, VL, CD) it is set to
 *     SkylakeX, with AVX2 and FMA to Haswell.
 * How: the libraries read their environment once, before main(); setting a variable from the
 * executable's .preinit_array does not work with glibc (libc's start-up then resets environ), so
 * the process sets them and re-executes itself (/proc/self/exe, same argv: one more exec at start).
 * Children (sbatch, MPI ranks) inherit them. Returns only if nothing had to change or the
 * re-execution failed (then the libraries' defaults stand: slower, never wrong).
 */
void gm_kernels_startup(char **argv);
#define GM_OMP_SPINCOUNT "3000" /* the spin count gm_kernels_startup sets (above: why this value) */
/* The OpenBLAS core type gm_kernels_startup would set ("SkylakeX", "Haswell"), or NULL where
 * OpenBLAS's own choice stands: it was set by the user, is AVX2 or newer, or the CPU has no AVX2. */
const char *gm_blas_core_fallback(void);
/* OpenBLAS's build and core, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
 * (openblas_get_config, whose core is the one in use), for `gemmarun --version`. Static storage. */
const char *gm_blas_info(void);

/* Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16, as oneDNN reports it:
 * dnnl_get_effective_cpu_isa, which honours DNNL_MAX_CPU_ISA; false in a build without oneDNN).
 * Where false, compute = "auto" trains in f32 and "bf16" is refused (gm_trainer_new_on). */
bool gm_k_cpu_bf16_native(void);
/* Whether compute = "auto" picks bf16 on this CPU: where its bf16 GEMMs are faster than f32 ones -
 * AMX-BF16 (tile multiplies), or an AMD CPU with AVX512-BF16 (Zen 4 and later: bf16 dot products at
 * twice the f32 FMA rate; measured through torch on a 2-core EPYC, 350-375 GFLOP/s bf16 against
 * 200-230 f32). Not an Intel CPU with AVX512-BF16 alone: VDPBF16PS issues on one port where FMAs
 * issue on two, so it multiplies no faster than f32, plus the rounding - measured on a 2-core Xeon,
 * oneDNN's bf16 matmul 166-175 GFLOP/s (torch's 171) against OpenBLAS sgemm's 265-309, a LoRA step of
 * the 270M 4.44 s in bf16 against 2.76 s in f32 (docs/benchmarks.md, "bf16 GEMM rates").
 * GEMMARUN_BF16_AUTO=1 / =0 overrides the rule on a native CPU (to measure the other choice). */
bool gm_k_cpu_bf16_auto(void);
/* The CPU's bf16 staging (gm_kctx.bf16_staging) is planned in the trainer's arena when it computes in
 * bf16: what its largest GEMM needs at once (gm_k_matmul_bf16_staging_elems), at most this - a
 * 512-row weight panel of up to 16,384 columns and the activations beside it; larger ones go in row
 * chunks. */
#define GM_CPU_BF16_STAGING_BYTES ((size_t)32 << 20)

/* Workspace (floats) that matmul_fwd / matmul_bwd_input need for a weight of N rows by K
 * columns of `type` (0 for f32). Callers size gm_kctx.scratch as the max over their weights. */
size_t gm_k_matmul_scratch_floats(gm_dtype w_type, int64_t N, int64_t K, int n_threads);

/* bf16 staging (elements, gm_kctx.bf16_staging) with which matmul_fwd / matmul_bwd_input on the CPU
 * multiply M rows by a weight of N x K of `type` in bf16 at once: a dequantized panel (none for a
 * bf16 weight, which is multiplied as stored) and M activation rows of the wider side; 0 for f32
 * weights. A smaller staging takes the rows in chunks (at least one row beside the panel). */
size_t gm_k_matmul_bf16_staging_elems(gm_dtype w_type, int64_t N, int64_t K, int64_t M);

/* Workspace (floats) attention_train_fwd / attention_bwd need for these sizes. */
size_t gm_k_attention_scratch_floats(int64_t B, int64_t T, int64_t H, int64_t D, int n_threads);

/* Rows of W dequantized at once by matmul_fwd (the panel height). */
#define GM_MATMUL_PANEL_ROWS 512

/* Most weights one matmul_fwd_multi call takes (q / k / v is 3). */
#define GM_MATMUL_MULTI_MAX 4

/* Row dequantizer shared by the CPU kernels: dst (n) f32 <- one row of `type` whose bytes start at
 * src (self-contained formats: f32/f16/bf16/f64 and the GGUF blocks). */
void gm_dequant_row(gm_dtype type, const void *src, float *dst, int64_t n);
/* Row r of any weight view (including NF4 and int8) into dst (w->cols floats), CPU memory. */
void gm_dequant_wrow(const gm_wview *w, int64_t r, float *dst);
/* *out = row r of w . x (w->cols floats), fused for the formats of Gemma's Q4_K_M files (Q8_0, Q5_0,
 * Q4_K, Q6_K: no dequantized row written and read back), bit-identical to gm_dequant_wrow followed
 * by matmul.c's dot, summed in gm_lanes_sum32's order (test_kernels checks it). Returns false, *out
 * untouched, for other types. */
bool gm_dot_wrow(const gm_wview *w, int64_t r, const float *x, float *out);
/* The summation order of every CPU dot product of the GEMV path (matmul.c's dot, gm_dot_wrow): element
 * e goes to lane e mod 32 in increasing e, then the lanes are halved, s[k] += s[k + w] for w = 16, 8,
 * 4, 2, 1. 32 lanes are four independent 8-wide AVX2 accumulators, so the adds do not wait on each
 * other (one accumulator made decoding add-latency bound), and a block of 32 quantized weights is
 * exactly one round. */
static inline float gm_lanes_sum32(float s[32]) {
    for (int w = 16; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) s[k] += s[k + w];
    return s[0];
}
/* false: gm_dot_wrow runs its baseline x86-64 code even where the CPU has AVX2 (tests compare the
 * twins; nothing else sets it). Default true. */
extern bool gm_cpu_simd;

/* The int8 dots of decoding (gm_kctx.int8_dot), llama.cpp's Q8_0 activation scheme
 * (ggml-quants.c quantize_row_q8_0, ggml_vec_dot_q8_0_q8_0 / q5_0_q8_0), with an arithmetic of our
 * own that the scalar and AVX2 twins share bit for bit:
 *   gm_quantize_x_q8: x (K, a multiple of 32) in blocks of 32: d = max|x| / 127, q = x * (1/d)
 *     rounded to nearest (ties to even), q = 0 when the block is 0; out: K/32 blocks of 40 bytes
 *     (f32 d, the int32 sum of its q, 32 int8), GM_XQ8_BYTES(K);
 *   gm_dot_rows_q8: out[i] = row r0 + i of w (i < n) . x, for Q8_0, Q5_0, Q4_K and Q6_K weights
 *     (gm_int8_dot_supports): each block of 32 weights' integers (Q8_0's q; Q5_0's q - 16; Q4_K's
 *     q; Q6_K's q - 32) dotted with x's exactly, 4 elements a lane (lane j of block b: elements
 *     4j..4j+3); each lane scaled by fl(weight scale of the lane * d_x,b) and summed in f32 into
 *     accumulator (b mod 2, j); the two accumulators added lane by lane and the 8 lanes halved;
 *     Q4_K's min terms fl(fl(dmin M) * d_x,b) * sum of x's q, summed apart in block order and
 *     subtracted last. Returns false (*out untouched) for other weight types.
 * Error against the f32 dot: each x is off by at most d_x/2 (plus f32 rounding), so
 * |int8 - f32| <= sum_b d_x,b/2 * sum_i |w_i| (test_kernels asserts it with TOL_INT8_DOT_STEPS). */
#define GM_XQ8_BYTES(K) ((size_t)(K) / 32 * 40)
bool gm_int8_dot_supports(gm_dtype type);
void gm_quantize_x_q8(const float *x, int64_t K, void *out);
bool gm_dot_rows_q8(const gm_wview *w, int64_t r0, int64_t n, const void *xq, float *out);

/* Sets the OpenBLAS thread count (once per process; cheap to call again), and on x86 sets
 * flush-to-zero and denormals-are-zero (MXCSR FTZ | DAZ) in the calling thread and in each of the
 * n_threads OpenMP threads that run our loops and OpenBLAS (libgomp keeps them for the process):
 * subnormal floats (below 1.2e-38) become 0. Why: as a model grows confident, most of the
 * 262,144 softmax probabilities of the LM head fall below 1e-38 and the backward GEMM on them
 * ran at half speed (digits_vision.lua: 0.9 s per step at the start, 1.8 s after 200 steps, 73%
 * of the time in sgemm). What it changes: values and gradients below 1.2e-38, far under every
 * tolerance; results stay deterministic. */
void gm_kernels_set_threads(int n_threads);

/* GM_CPU_CLONES before a hot CPU kernel function: GCC compiles it twice, for baseline x86-64 and
 * with AVX2, and the dynamic loader picks the clone the CPU runs (function multi-versioning,
 * target_clones / ifunc). "avx2" does not include FMA, so no multiply-add is contracted and both
 * clones compute the same bits (test_dequant checks the dispatched clone against ggml's vectors).
 * Why: the build targets baseline x86-64 (SSE2) to run on any x86-64 CPU; the dequantizers and
 * the dot were 89% of decoding time in that code (perf of bench_forward, 2026-12-04;
 * docs/benchmarks.md). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GM_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GM_CPU_CLONES
#endif

#define GM_KERNEL(name, params, args) void gm_k_##name##_cpu params;
#include "kernels.def"
#undef GM_KERNEL

#ifdef GM_HAVE_CUDA
#define GM_KERNEL(name, params, args) void gm_k_##name##_cuda params;
#include "kernels.def"
#undef GM_KERNEL
#endif

/* One function table per device, filled from kernels.def. */
typedef struct gm_kernel_table {
#define GM_KERNEL(name, params, args) void(*name) params;
#include "kernels.def"
#undef GM_KERNEL
} gm_kernel_table;

extern const gm_kernel_table gm_kernels_cpu;
#ifdef GM_HAVE_CUDA
extern const gm_kernel_table gm_kernels_cuda;
#endif

#ifdef __cplusplus
}
#endif
#endif /* GM_KERNELS_H */
