"""Random-weight Gemma 3 text checkpoints of the real shapes, for the GPU script (tests/device/run.sh):
the real weights do not travel (the 270M GGUF alone is 253 MB; the run tool carries 64 MiB), and a
speed benchmark needs the shapes, not the values.

    python3 tests/device/make_checkpoints.py OUT_DIR [--sizes 270m,1b,4b] [--device cuda]

writes OUT_DIR/gemma3-<size>-random/ for each size: config.json (Gemma3ForCausalLM, model_type
gemma3_text), model.safetensors (bf16, one file, tied embeddings as the real ones) and
tokenizer.json.

Shapes: /work/shared/reference/gemma_architecture.md §1.1 (transformers' convert_gemma3_weights.py
_VARIANTS): hidden size, layers, heads, KV heads, head_dim 256, intermediate size,
query_pre_attn_scalar 256, sliding window, max positions, RoPE (global 1e6, linear x8 on 4B; local
1e4), the real vocabulary rows (262,144; 262,208 for 4B, whose published checkpoint carries the 64
image rows). The weights are transformers' own initialization (normal, std 0.02; norms 0) under a
fixed seed.

Tokenizer: the repository's tiny BPE fixture (tests/ref/tiny_tokenizer.json, 426 tokens, Gemma's
special-token ids and chat markers), not Gemma's 262,144-token vocabulary (33 MB as tokenizer.json;
it does not travel either). The model keeps the real vocabulary size: gemmarun tokenizes the
benchmark's text into ids below 426, the embedding and the LM head are the full 262,144 rows, so
every step costs what it costs on the real model.
"""
import argparse
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "ref", "tiny_tokenizer.json")

# size: hidden, layers, heads, kv_heads, intermediate, sliding_window, max_positions, vocab, global RoPE linear factor
SHAPES = {
    "270m": (640, 18, 4, 1, 2048, 512, 32768, 262144, None),
    "1b": (1152, 26, 4, 1, 6912, 512, 32768, 262144, None),
    "4b": (2560, 34, 8, 4, 10240, 1024, 131072, 262208, 8.0),
}


def config_for(size):
    from transformers import Gemma3TextConfig

    D, L, H, K, F, W, P, V, factor = SHAPES[size]
    full = {"rope_type": "default", "rope_theta": 1000000.0}
    if factor:
        full = {"rope_type": "linear", "factor": factor, "rope_theta": 1000000.0}
    return Gemma3TextConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=K,
        head_dim=256, intermediate_size=F, query_pre_attn_scalar=256, sliding_window=W,
        max_position_embeddings=P, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)],
        rope_parameters={"full_attention": full,
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        attention_bias=False, attn_logit_softcapping=None, final_logit_softcapping=None,
        architectures=["Gemma3ForCausalLM"])


def make(size, out, device, seed):
    import torch
    from transformers import Gemma3ForCausalLM

    t0 = time.time()
    cfg = config_for(size)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma3ForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="64GB")  # one model.safetensors
    shutil.copyfile(TOKENIZER, os.path.join(out, "tokenizer.json"))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"{out}: Gemma 3 {size} shape, {n / 1e6:.1f} M parameters (bf16), {time.time() - t0:.1f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", default="270m,1b,4b")
    ap.add_argument("--device", default="cuda" if os.environ.get("GM_DEVICE", "cuda") == "cuda" else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch

    dev = a.device if (a.device != "cuda" or torch.cuda.is_available()) else "cpu"
    for size in a.sizes.split(","):
        if size not in SHAPES:
            sys.exit(f"make_checkpoints.py: unknown size {size} (known: {', '.join(SHAPES)})")
        d = os.path.join(a.out, f"gemma3-{size}-random")
        if os.path.exists(os.path.join(d, "model.safetensors")):
            print(f"{d}: already there")
            continue
        make(size, d, dev, a.seed)


if __name__ == "__main__":
    main()
