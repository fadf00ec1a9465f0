#!/usr/bin/env python3
"""A random-weight Gemma 3n or Gemma 4 checkpoint folder at the real shapes, for measuring memory.

    ~/.cache/gemmarun/peers-venv/bin/python tests/bench/make_random_gemma.py OUT [--e4b] [--gemma4]

Gemma 3n (default): writes OUT/config.json (Gemma3nForConditionalGeneration: the E2B text decoder of
reference/gemma_architecture.md §3.1 - 30 layers, FFN 8192, 10 KV-shared layers, sparsity 0.95 on
layers 0-9 - and transformers 5.24's default audio and vision configs), OUT/model-0000k-of-0000n.safetensors
and their index: every tensor of transformers' Gemma3nForConditionalGeneration in bf16 but the
MobileNet-V5 vision tower's (timm is not installed and no gemmarun run reads it; its embedder is
written), drawn from numpy's PCG64 seeded 0: matrices, convolutions and embeddings N(0, 0.02^2), norm
weights 1, correct_output_scale 1, per_dim_scale 0. And OUT/tokenizer.json: tests/ref/tiny_tokenizer.json
filled with "<unused_i>" entries up to the model's 262,400 ids and Gemma 3n's special tokens at their
real ids (<start_of_image> 255999, <start_of_audio> 256000, <end_of_image> 262144, <image_soft_token>
262145, <end_of_audio> 262272, <audio_soft_token> 262273): text comes out as the tiny tokenizer's
ids, which is all a memory measurement needs.

No torch weights are made: the model is built on the meta device for its names and shapes, and each
tensor is drawn and written straight to its shard (2 GiB each), so the script needs about 3 GiB of
memory for a ~10 GiB checkpoint. E2B: 5.1 B parameters, 10.3 GB on disk, ~2 minutes here.

--gemma4: Gemma 4's E2B (or E4B) text decoder as Gemma4ForCausalLM (reference/gemma_architecture.md
§4.1: E2B 35 layers of 1536, 8 heads over 1 kv head of 256 / 512 on full layers, (4 sliding + 1 full)
x 7, FFN 6144 and 12288 on the 20 KV-shared layers; E4B 42 layers of 2560, 2 kv heads, (5 + 1) x 7,
FFN 10240, 18 KV-shared; per-layer embeddings of 256 from a 262,144-row table; layer_scalar 1), and the
same tokenizer with Gemma 4's markers (<|turn> 105, <turn|> 106, <|image> 255999, <|image|> 258880,
<image|> 258882): text in Gemma 4's chat format. E2B: 4.65 B parameters, 8.7 GiB.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
from transformers import (Gemma3nConfig, Gemma3nForConditionalGeneration, Gemma3nTextConfig, Gemma4ForCausalLM,
                          Gemma4TextConfig)
from transformers.models.gemma3n import modeling_gemma3n

HERE = os.path.dirname(os.path.abspath(__file__))
SHARD = 2 << 30


def text_config(e4b):
    L, F, shared = (35, 16384, 15) if e4b else (30, 8192, 10)
    return Gemma3nTextConfig(
        num_hidden_layers=L, intermediate_size=F, num_kv_shared_layers=shared,
        activation_sparsity_pattern=[0.95] * 10 + [0.0] * (L - 10),
        layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(L)])


def gemma4_config(e4b):
    L, C, KVH, F, shared, pattern = (42, 2560, 2, 10240, 18, 6) if e4b else (35, 1536, 1, 6144, 20, 5)
    return Gemma4TextConfig(
        vocab_size=262144, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=8,
        num_key_value_heads=KVH, head_dim=256, global_head_dim=512, sliding_window=512,
        max_position_embeddings=131072, hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144,
        num_kv_shared_layers=shared, use_double_wide_mlp=not e4b, final_logit_softcapping=30.0,
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(L)])


class NoVisionTower(torch.nn.Module):
    """Stands in for the MobileNet-V5 tower (timm): holds no weights."""


def shapes(cfg):
    if getattr(cfg, "model_type", "") == "gemma4_text":
        with torch.device("meta"):
            model = Gemma4ForCausalLM(cfg)
        return [(k, tuple(v.shape)) for k, v in model.state_dict().items() if not k.startswith("lm_head.")]
    real = modeling_gemma3n.AutoModel.from_config

    def from_config(c, **kw):
        if getattr(c, "model_type", "") == "gemma3n_vision":
            return NoVisionTower()
        return real(c, **kw)

    modeling_gemma3n.AutoModel.from_config = from_config
    try:
        with torch.device("meta"):
            model = Gemma3nForConditionalGeneration(cfg)
    finally:
        modeling_gemma3n.AutoModel.from_config = real
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items() if not k.startswith("lm_head.")]


def values(rng, name, shape):
    """bf16 values (truncated from f32: random values) of one tensor, drawn in chunks of 2^26 so that
    the per-layer table (2.35 B values on Gemma 4 E2B) never exists in f32 whole."""
    n = int(np.prod(shape))
    out = np.empty(n, np.uint16)
    if name.endswith("per_dim_scale"):
        out[:] = 0
    elif name.endswith("correct_output_scale") or name.endswith("layer_scalar") or ("norm" in name and len(shape) == 1):
        out[:] = np.float32(1.0).view(np.uint32) >> 16
    else:
        step = 1 << 26
        for i in range(0, n, step):
            x = rng.standard_normal(min(step, n - i), dtype=np.float32) * np.float32(0.02)
            out[i:i + len(x)] = (x.view(np.uint32) >> 16).astype(np.uint16)
    return out


def write_shard(path, tensors):
    header, off = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + data.nbytes]}
        off += data.nbytes
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data.tobytes())


def write_tokenizer(path, vocab_size, gemma4=False):
    """The tiny tokenizer, its vocabulary filled up to the model's (ids must be dense: "<unused_i>"
    entries that no text merges into), the model's special tokens at their ids (Gemma 4: its turn
    markers too, renamed from the tiny tokenizer's)."""
    with open(os.path.join(HERE, "..", "ref", "tiny_tokenizer.json")) as fh:
        tok = json.load(fh)
    specials = {255999: "<start_of_image>", 256000: "<start_of_audio>", 262144: "<end_of_image>",
                262145: "<image_soft_token>", 262272: "<end_of_audio>", 262273: "<audio_soft_token>"}
    if gemma4:
        specials = {255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>", 258881: "<|audio|>",
                    258882: "<image|>", 258883: "<audio|>"}
        rename = {"<start_of_turn>": "<|turn>", "<end_of_turn>": "<turn|>"}
        for a in tok["added_tokens"]:
            a["content"] = rename.get(a["content"], a["content"])
        tok["model"]["vocab"] = {rename.get(k, k): v for k, v in tok["model"]["vocab"].items()}
    used = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
    for i in range(vocab_size):
        if i not in used and i not in specials:
            tok["model"]["vocab"][f"<unused_{i}>"] = i
    base = tok["added_tokens"][0]
    for i, content in specials.items():
        tok["added_tokens"].append(dict(base, id=i, content=content))
    with open(path, "w") as fh:
        json.dump(tok, fh, ensure_ascii=False)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, e4b, g4 = sys.argv[1], "--e4b" in sys.argv, "--gemma4" in sys.argv
    os.makedirs(out, exist_ok=True)
    cfg = gemma4_config(e4b) if g4 else Gemma3nConfig(text_config=text_config(e4b).to_dict())
    with open(os.path.join(out, "config.json"), "w") as fh:
        fh.write(cfg.to_json_string())
    write_tokenizer(os.path.join(out, "tokenizer.json"), cfg.vocab_size if g4 else cfg.text_config.vocab_size, g4)
    items = shapes(cfg)
    # shards of at most SHARD bytes, in the model's order
    groups, cur, size = [], [], 0
    for name, shape in items:
        nb = 2 * int(np.prod(shape))
        if cur and size + nb > SHARD:
            groups.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nb
    groups.append(cur)
    rng = np.random.Generator(np.random.PCG64(0))
    weight_map, total, n_params = {}, 0, 0
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = [(name, shape, values(rng, name, shape)) for name, shape in group]
        write_shard(os.path.join(out, fname), tensors)
        for name, shape, data in tensors:
            weight_map[name] = fname
            total += data.nbytes
            n_params += int(np.prod(shape))
        print(f"{fname}: {len(tensors)} tensors, {sum(t[2].nbytes for t in tensors) / 2**30:.2f} GiB", flush=True)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)
    print(f"{out}: {n_params / 1e9:.3f} B parameters in {len(groups)} shards ({total / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
