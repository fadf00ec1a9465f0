#!/usr/bin/env python3
"""Tiny random Gemma 4 text decoders for gemmarun (run by hand, never in CI).

Two Gemma4ForCausalLM (transformers 5.24) at toy sizes, each with the parts of one family of
published sizes (gemma_architecture.md §4):

  tests/ref/tiny_gemma4/      the E2B / E4B family: 6 layers (4 sliding, window 4, 2 full), 4 heads
                              over 2 kv heads, head_dim 16 on sliding layers and 32 on full ones
                              (global_head_dim) with proportional RoPE (partial_rotary_factor 0.25:
                              4 of 16 frequency pairs rotate), per-layer embeddings of width 16 from
                              a table as large as the vocabulary, the last 2 layers KV-shared (layer 4
                              reads layer 3's keys and values, layer 5 layer 2's) with double-wide
                              MLPs (2 x 96), a layer_scalar per layer, final logits soft-capped at 30
  tests/ref/tiny_gemma4_kv/   the 31B family: the same without per-layer embeddings or KV sharing,
                              attention_k_eq_v (full layers have no v_proj: V is the raw K
                              projection, RMS-normed without weight, unrotated) with 1 global kv head
                              against 2 on sliding layers
  tests/ref/tiny_gemma4_moe/  the 26B-A4B family: tiny_gemma4_kv with a mixture of experts beside
                              every dense MLP (4 experts of width 32, top 2; router, per-expert
                              scales, the three extra norms); /router_counts (6, 4) int32: per layer,
                              how many top-k slots each expert took

and for each, tests/ref/<name>_ref.h5:

  /ids        (2, 20) int32: two sequences
  /logits     (2, 20, 512) f32: the model's logits in one call (no cache)
  /logits_cached  (2, 20, 512) f32: the same sequences as a prompt of 7 tokens then one token at a
              time through transformers' cache (KV sharing from the cache: "identical with and
              without a cache", the issue's most reported Gemma 4 bug)
  /lora/{labels, loss, weights/*, grads/*}: PEFT LoRA (rank 4, alpha 8, q/k/v/o/gate/up/down; none
              on the KV-shared layers' absent k/v or the k_eq_v layers' absent v) at drawn A and B:
              the loss of the two sequences with their first 5 labels -100, and every adapter's
              gradient; loss64 and grads64/*: the same in float64
  attrs       max_abs_diff_cached, max_prob (no saturation), max_abs_diff_no_ple (per-layer inputs
              zeroed; E family), max_abs_diff_full_rope (the full layers' RoPE rotating every pair
              instead of a quarter: the partial rotation is visible), max_abs_diff_unit_scalar
              (layer_scalar all 1: visible)

tests/ref/tiny_gemma4_chat/: tiny_gemma4 (links) with a tokenizer.json in Gemma 4's chat format: the
tiny test tokenizer of tests/ref/tiny_gemma3_chat with its turn markers renamed (<start_of_turn> ->
<|turn>, <end_of_turn> -> <turn|>, same ids), so gemmarun renders Gemma 4's turns for it.

tests/ref/gemma4_e2b_config.json, gemma4_e4b_config.json: the config.json transformers writes for the
E2B and E4B text decoders at their real sizes (tests/bench/make_random_gemma.py's gemma4_config, the
random-weight checkpoints measured in docs/memory.md), compared in test_plan_arch with the
gemma4-e2b / gemma4-e4b presets.

Every parameter and the layer_scalar buffers are drawn, from torch.Generator seeded SEED, in
named_parameters order then the scalars: linears N(0, 0.08^2) (the router's N(0, 1): logits of spread ~1,
no near ties - the smallest gap between a token's 2nd and 3rd probability is asserted above 1e-4, also
with the adapters), norm weights and router.scale 1 + N(0, 0.1^2), per_expert_scale 1 + N(0, 0.2^2)
(Gemma 4 uses them directly), embeddings N(0, 0.25^2), layer_scalar U(0.5, 1.5).

Needs torch, transformers 5.24, peft 0.21 and h5py, e.g. the peers venv (tests/peers/setup.sh):
  pip install --target /tmp/h5 h5py
  PYTHONPATH=/tmp/h5 ~/.cache/gemmarun/peers-venv/bin/python tests/ref/make_gemma4_ref.py
"""

import hashlib
import os

import h5py
import numpy as np
import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

import make_gemma3n_ref as g3n  # the same logits (one call, and through the cache) and PEFT gradients
from make_gemma3n_ref import logits_cached, logits_of

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 4
T = 20
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
               "full_attention"]


def config(variant, full_rope_factor=0.25):
    common = dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=4, max_position_embeddings=128,
        rms_norm_eps=1e-6, layer_types=list(LAYER_TYPES), final_logit_softcapping=30.0,
        rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": full_rope_factor,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=True)
    if variant == "e":
        return Gemma4TextConfig(**common, vocab_size_per_layer_input=512, hidden_size_per_layer_input=16,
                                num_kv_shared_layers=2, use_double_wide_mlp=True)
    if variant == "moe":
        return Gemma4TextConfig(**common, hidden_size_per_layer_input=0, attention_k_eq_v=True,
                                num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
                                moe_intermediate_size=32)
    return Gemma4TextConfig(**common, hidden_size_per_layer_input=0, attention_k_eq_v=True,
                            num_global_key_value_heads=1)


def randomize(model):
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("router.scale"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("router.proj.weight"):  # logits of spread ~1: a clear top-k
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            elif name.endswith("per_expert_scale"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def make(variant, **kw):
    cfg = config(variant, **kw)
    cfg._experts_implementation = "eager"  # the reference loop over experts (grouped_mm has no float64)
    m = Gemma4ForCausalLM(cfg).eval()
    randomize(m)
    return m


def router_counts(model, ids):
    """Per layer, how many of the tokens' top-k slots each expert took, and the smallest gap between
    a token's k-th and (k+1)-th router probability (a near tie would make the choice fragile)."""
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    k, counts, gap = model.config.top_k_experts, [], 1.0
    for p in out.router_logits:
        v = p.sort(-1, descending=True).values
        gap = min(gap, float((v[:, k - 1] - v[:, k]).min()))
        counts.append(torch.nn.functional.one_hot(p.topk(k, -1).indices, p.shape[-1]).sum((0, 1)))
    return torch.stack(counts).numpy().astype(np.int32), gap


def lora_grads(model, ids):
    """PEFT LoRA on a copy of the model (make_gemma3n_ref.lora_grads: rank 4, alpha 8, the attention and
    MLP linears at drawn A and B), this file's seed; with experts, the adapted model's routing has no
    near tie."""
    def no_near_tie(pm):
        if model.config.enable_moe_block:
            _, gap = router_counts(pm, ids)
            assert gap > 1e-4, f"near tie in the adapted model's routing: {gap}"
    return g3n.lora_grads(model, ids, seed=SEED + 2, check=no_near_tie)


def write(variant, name):
    out_dir, ref = os.path.join(HERE, name), os.path.join(HERE, name + "_ref.h5")
    model = make(variant)
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(3, 512, (2, T), generator=g)
    ids[:, 0] = 2  # BOS
    full = logits_of(model, ids)
    cached = logits_cached(model, ids)
    diff_cache = float((full - cached).abs().max())
    assert diff_cache < 1e-4, diff_cache
    attrs = {"max_abs_diff_cached": diff_cache, "max_prob": float(torch.softmax(full, -1).max())}
    attrs["max_abs_diff_full_rope"] = float((full - logits_of(make(variant, full_rope_factor=1.0), ids)).abs().max())
    unit = make(variant)
    with torch.no_grad():
        for n_, b in unit.named_buffers():
            if n_.endswith("layer_scalar"):
                b.fill_(1.0)
    attrs["max_abs_diff_unit_scalar"] = float((full - logits_of(unit, ids)).abs().max())
    if variant == "moe":
        counts, gap = router_counts(model, ids)
        assert gap > 1e-4, f"near tie in the routing: {gap}"
        attrs["min_topk_gap"] = gap
    if variant == "e":
        no_ple = make(variant)
        with torch.no_grad():
            no_ple.model.embed_tokens_per_layer.weight.zero_()
            no_ple.model.per_layer_model_projection.weight.zero_()
        attrs["max_abs_diff_no_ple"] = float((full - logits_of(no_ple, ids)).abs().max())
    model.save_pretrained(out_dir, safe_serialization=True)
    with h5py.File(ref, "w", track_order=True) as f:
        f.create_dataset("ids", data=ids.numpy().astype(np.int32))
        f.create_dataset("logits", data=full.numpy().astype(np.float32))
        f.create_dataset("logits_cached", data=cached.numpy().astype(np.float32))
        if variant == "moe":
            f.create_dataset("router_counts", data=counts)
        for k, v in attrs.items():
            f.attrs[k] = v
        loss, labels, weights, grads = lora_grads(model, ids)
        f.create_dataset("lora/labels", data=labels.numpy().astype(np.int32))
        f.create_dataset("lora/loss", data=np.array([loss], dtype=np.float32))
        for k in sorted(weights):
            f.create_dataset("lora/weights/" + k, data=weights[k].numpy().astype(np.float32))
            f.create_dataset("lora/grads/" + k, data=grads[k].numpy().astype(np.float32))
        loss64, _, _, grads64 = lora_grads(make(variant).double(), ids)
        f.create_dataset("lora/loss64", data=np.array([loss64], dtype=np.float64))
        worst = 0.0
        for k in sorted(grads64):
            g64 = grads64[k].numpy().astype(np.float64)
            f.create_dataset("lora/grads64/" + k, data=g64)
            worst = max(worst, float(np.abs(grads[k].numpy().astype(np.float64) - g64).max() / np.abs(g64).max()))
        f.attrs["peft_f32_grad_rel_err_vs_f64"] = worst
    print(f"{name}: {len(grads)} adapter tensors, loss {loss:.6f} (f64 {loss64:.9f}), f32 grads {worst:.3g} from f64; "
          + ", ".join(f"{k} {v:.3g}" for k, v in attrs.items()))
    for fn in sorted(os.listdir(out_dir)) + [ref]:
        p = fn if os.path.isabs(fn) else os.path.join(out_dir, fn)
        with open(p, "rb") as fh:
            print(f"{hashlib.sha256(fh.read()).hexdigest()}  {os.path.relpath(p, HERE)}")


def write_chat():
    import json
    out = os.path.join(HERE, "tiny_gemma4_chat")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(HERE, "tiny_gemma3_chat", "tokenizer.json")) as f:
        tok = json.load(f)
    rename = {"<start_of_turn>": "<|turn>", "<end_of_turn>": "<turn|>"}
    for a in tok["added_tokens"]:
        a["content"] = rename.get(a["content"], a["content"])
    tok["model"]["vocab"] = {rename.get(k, k): v for k, v in tok["model"]["vocab"].items()}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    for fn in ("config.json", "model.safetensors"):
        link = os.path.join(out, fn)
        if not os.path.islink(link):
            os.symlink(os.path.join("..", "tiny_gemma4", fn), link)


def write_real_configs():
    import sys
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    from make_random_gemma import gemma4_config
    for e4b, name in ((False, "gemma4_e2b_config.json"), (True, "gemma4_e4b_config.json")):
        with open(os.path.join(HERE, name), "w") as f:
            f.write(gemma4_config(e4b).to_json_string())


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    write("e", "tiny_gemma4")
    write("kv", "tiny_gemma4_kv")
    write("moe", "tiny_gemma4_moe")
    write_chat()
    write_real_configs()


if __name__ == "__main__":
    main()
