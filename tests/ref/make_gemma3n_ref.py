#!/usr/bin/env python3
"""Tiny random Gemma 3n text decoder for gemmarun (run by hand, never in CI).

Writes tests/ref/tiny_gemma3n/{config.json, model.safetensors}: a Gemma3nForCausalLM (transformers
5.24) with every Gemma 3n part at toy sizes - 6 layers (4 sliding, window 4, 2 full), 4 heads over
2 kv heads of width 16, hidden 64, FFN 128, per-layer embeddings of width 16 from a 400-row table
(ids 400..511 take row 0, as get_per_layer_inputs does), 4 AltUp streams, LAuReL rank 8, gaussian
top-k sparsity 0.95 on layers 0-1, the last 2 layers sharing the K/V of layers 3 (sliding) and 2
(full), final logits soft-capped at 30 - and tests/ref/tiny_gemma3n_ref.h5:

  /ids        (2, 20) int32: two sequences, some ids >= 400 (past the per-layer table)
  /logits     (2, 20, 512) f32: the model's logits in one call (no cache, training mode's forward
              path with dropout off)
  /logits_cached  (2, 20, 512) f32: the same sequences fed as a prompt of 7 tokens then one token
              at a time through transformers' cache (KV sharing from the cache: the story's
              "identical with and without a cache")
  /lora/{labels, loss, weights/*, grads/*}: PEFT LoRA (rank 4, alpha 8, q/k/v/o/gate/up/down;
              none on the KV-shared layers' absent k/v) at drawn A and B: the loss of the two
              sequences with their first 5 labels -100, and every adapter's gradient; loss64 and
              grads64/*: the same computed in float64 (the exact values the f32 ones round)
  attrs       max_abs_diff_cached (the two above), max_abs_diff_no_sparsity (how far the logits move
              with activation_sparsity_pattern all 0: the top-k is visible), max_abs_diff_no_ple
              (per-layer inputs zeroed), max_prob (no saturation)

tests/ref/tiny_gemma3n_mm/ (the same decoder in Gemma3nForConditionalGeneration's layout, write_multimodal),
and tests/ref/gemma3n_e4b_config.json: the config.json transformers writes for
Gemma3nForConditionalGeneration with every default (Gemma3nConfig(): the E4B text decoder, its
audio and vision configs) - what gemmarun's reader meets in a real checkpoint folder, compared in
test_plan_arch with the gemma3n-e4b preset.

Every parameter is drawn (not transformers' init, which zeroes correct_output_scale and would hide
the per-layer-input path): linears N(0, 0.08^2), norm weights 1 + N(0, 0.1^2) (Gemma 3n uses them
directly), embeddings N(0, 0.25^2) (logits of spread ~2, no saturation), AltUp coefficients N(0, 0.1^2), correct_output_scale N(1, 0.2^2),
from torch.Generator seeded SEED, in named_parameters order.

Needs the peers venv (tests/peers/setup.sh) plus h5py, e.g.
  pip install --target /tmp/h5 h5py
  PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma3n_ref.py
"""
import hashlib
import os

import h5py
import numpy as np
import torch
from transformers import Gemma3nConfig, Gemma3nForCausalLM, Gemma3nTextConfig

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tiny_gemma3n")
REF = os.path.join(HERE, "tiny_gemma3n_ref.h5")
SEED = 3
T, PROMPT = 20, 7


def config(sparse=(0.95, 0.95, 0.0, 0.0, 0.0, 0.0)):
    return Gemma3nTextConfig(
        vocab_size=512, vocab_size_per_layer_input=400, hidden_size=64, hidden_size_per_layer_input=16,
        intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        sliding_window=4, max_position_embeddings=128, rms_norm_eps=1e-6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"],
        num_kv_shared_layers=2, activation_sparsity_pattern=list(sparse), altup_num_inputs=4, altup_active_idx=0,
        altup_coef_clip=120.0, altup_correct_scale=True, laurel_rank=8, final_logit_softcapping=30.0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=True)


def randomize(model):
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("correct_output_scale"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))
            elif "coefs" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def logits_cached(model, ids):
    rows = []
    with torch.no_grad():
        for b in range(ids.shape[0]):
            out = model(input_ids=ids[b:b + 1, :PROMPT], use_cache=True)
            parts, cache = [out.logits], out.past_key_values
            for t in range(PROMPT, ids.shape[1]):
                out = model(input_ids=ids[b:b + 1, t:t + 1], past_key_values=cache, use_cache=True)
                parts.append(out.logits)
                cache = out.past_key_values
            rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0).float()


def lora_grads(model, ids, seed=SEED + 2, check=None):
    """PEFT LoRA (rank 4, alpha 8, the attention and MLP linears) at A and B drawn from `seed` on a
    copy of the model: the loss of the two sequences (labels -100 on each one's first 5 tokens) and
    every adapter's gradient, under PEFT's saved names. check(peft_model), when given, runs on the
    adapted model before the loss (make_gemma4_ref.py: its routing has no near tie)."""
    import copy

    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    pm.eval()  # no dropout, no coefficient clamp (published weights lie far inside it anyway)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
                weights[name.replace(".default", "")] = p.detach().clone()
    if check:
        check(pm)
    labels = ids.clone()
    labels[:, :5] = -100
    out = pm(input_ids=ids, labels=labels, use_cache=False)
    out.loss.backward()
    grads = {name.replace(".default", ""): p.grad.detach().clone() for name, p in pm.named_parameters() if "lora_" in name}
    return float(out.loss), labels, weights, grads


def write_multimodal(model, out):
    """The same text decoder in Gemma3nForConditionalGeneration's layout, as the published E2B / E4B
    checkpoints store it: config.json of model_type gemma3n (text_config the tiny one, audio and
    vision configs transformers' defaults), the decoder's tensors below model.language_model., and
    a few stand-in tower tensors (the audio tower, the vision tower, their embedders) that a
    text-only load must leave alone. Not loadable by transformers (the towers are stand-ins); the
    check is that gemmarun gives the causal LM's logits from it."""
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    cfg = Gemma3nConfig(text_config=model.config.to_dict())
    with open(os.path.join(out, "config.json"), "w") as fh:
        fh.write(cfg.to_json_string())
    g = torch.Generator().manual_seed(SEED + 3)
    tensors = {k.replace("model.", "model.language_model.", 1): v.detach().clone().contiguous()
               for k, v in model.state_dict().items() if k.startswith("model.")}
    for name, shape in [("model.audio_tower.subsample_conv_projection.conv_0.conv.weight", (8, 1, 3, 3)),
                        ("model.vision_tower.timm_model.conv_stem.conv.weight", (8, 3, 3, 3)),
                        ("model.embed_audio.embedding.weight", (16, 64)),
                        ("model.embed_vision.embedding.weight", (16, 64))]:
        tensors[name] = 0.1 * torch.randn(shape, generator=g)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Gemma3nForCausalLM(config()).eval()
    randomize(model)
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, 512, (2, T), generator=g)
    ids[:, 0] = 2  # BOS
    ids[0, 5], ids[1, 9], ids[1, 15] = 450, 511, 400  # past the per-layer table
    full = logits_of(model, ids)
    cached = logits_cached(model, ids)
    diff_cache = float((full - cached).abs().max())
    assert diff_cache < 1e-4, diff_cache
    dense = Gemma3nForCausalLM(config(sparse=(0.0,) * 6)).eval()
    dense.load_state_dict(model.state_dict())
    diff_sparse = float((full - logits_of(dense, ids)).abs().max())
    saved = model.model.embed_tokens_per_layer.weight.detach().clone()
    with torch.no_grad():
        model.model.embed_tokens_per_layer.weight.zero_()
        model.model.per_layer_model_projection.weight.zero_()
    no_ple = logits_of(model, ids)
    with torch.no_grad():
        model.model.embed_tokens_per_layer.weight.copy_(saved)
    model = Gemma3nForCausalLM(config()).eval()
    randomize(model)  # the same draw again: the model as saved
    assert float((logits_of(model, ids) - full).abs().max()) == 0.0
    diff_ple = float((full - no_ple).abs().max())
    max_prob = float(torch.softmax(full, -1).max())
    model.save_pretrained(OUT, safe_serialization=True)
    write_multimodal(model, os.path.join(HERE, "tiny_gemma3n_mm"))
    with open(os.path.join(HERE, "gemma3n_e4b_config.json"), "w") as f:
        f.write(Gemma3nConfig().to_json_string())
    with h5py.File(REF, "w", track_order=True) as f:
        f.create_dataset("ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("logits", data=full.numpy().astype(np.float32))
        f.create_dataset("logits_cached", data=cached.numpy().astype(np.float32))
        f.attrs["max_abs_diff_cached"] = diff_cache
        f.attrs["max_abs_diff_no_sparsity"] = diff_sparse
        f.attrs["max_abs_diff_no_ple"] = diff_ple
        f.attrs["max_prob"] = max_prob
        loss, labels, weights, grads = lora_grads(model, ids)
        f.create_dataset("lora/labels", data=labels.numpy().astype(np.int32))
        f.create_dataset("lora/loss", data=np.array([loss], dtype=np.float32))
        for k in sorted(weights):
            f.create_dataset("lora/weights/" + k, data=weights[k].numpy().astype(np.float32))
            f.create_dataset("lora/grads/" + k, data=grads[k].numpy().astype(np.float32))
        # the same in float64 (model, adapters and loss): the exact gradients the f32 ones round
        m64 = Gemma3nForCausalLM(config()).eval()
        randomize(m64)
        loss64, _, _, grads64 = lora_grads(m64.double(), ids)
        f.create_dataset("lora/loss64", data=np.array([loss64], dtype=np.float64))
        worst = 0.0
        for k in sorted(grads64):
            g64 = grads64[k].numpy().astype(np.float64)
            f.create_dataset("lora/grads64/" + k, data=g64)
            worst = max(worst, float(np.abs(grads[k].numpy().astype(np.float64) - g64).max() / np.abs(g64).max()))
        f.attrs["peft_f32_grad_rel_err_vs_f64"] = worst
        print(f"LoRA: loss {loss:.6f} (f64 {loss64:.9f}), {len(grads)} adapter tensors; PEFT's f32 gradients lie "
              f"{worst:.3g} (relative to each tensor's largest) from the f64 ones")
    print(f"cache vs no cache: max |diff| {diff_cache:.3g}; without sparsity the logits move {diff_sparse:.3g}, "
          f"without per-layer inputs {diff_ple:.3g}; max probability {max_prob:.3f}")
    mm = os.path.join(HERE, "tiny_gemma3n_mm")
    for fn in sorted(os.listdir(OUT)) + [os.path.join(mm, f) for f in sorted(os.listdir(mm))] + [
            REF, os.path.join(HERE, "gemma3n_e4b_config.json")]:
        p = fn if os.path.isabs(fn) else os.path.join(OUT, fn)
        with open(p, "rb") as fh:
            print(f"{hashlib.sha256(fh.read()).hexdigest()}  {os.path.relpath(p, HERE)}")


if __name__ == "__main__":
    main()
