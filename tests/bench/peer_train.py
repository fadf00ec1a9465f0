"""Peer for bench_train: one LoRA training step of Gemma 3 270M in Hugging Face transformers + PEFT
on the CPU, the same configuration train_step.lua measures in gemmarun: LoRA rank R, alpha 2R on
q/k/v/o/gate/up/down of every layer, batch B of max_length T tokens (every token a label), AdamW,
activation (gradient) checkpointing off or on. The weights come from the same GGUF through
transformers' own GGUF loader, dequantized to f32 (gemmarun's `quant=f32` row is the like-for-like
comparison; its other rows keep the base quantized).

Prints one Markdown row like bench_train.sh's:
| peer | ckpt | rank | batch | max_length | step s (median) | peak RSS MiB |

Run with the reference venv (tests/ref/README.md), e.g. by tests/bench/bench_train.sh:
    python tests/bench/peer_train.py GGUF --rank 16 --max-len 256 --batch 1 --steps 4 --ckpt 0
"""
import argparse
import os
import resource
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ckpt", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--autocast", default="none", choices=["none", "bf16"],
                    help="bf16: torch.autocast('cpu', bfloat16) around the forward (oneDNN bf16 kernels "
                         "where the CPU has them)")
    a = ap.parse_args()

    import torch
    import transformers
    import peft
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, f = os.path.split(a.gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32,
                                                 attn_implementation=a.attn)
    if a.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    cfg = peft.LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj"])
    model = peft.get_peft_model(model, cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(1)
    times = []
    for s in range(a.steps + 1):
        ids = torch.randint(1000, 200000, (a.batch, a.max_len), generator=g)
        ids[:, 0] = 2  # <bos>
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s > 0:  # step 0 is the warm-up, as in train_step.lua
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"| transformers {transformers.__version__} + peft {peft.__version__} (f32, {a.attn}{', bf16 autocast' if a.autocast == 'bf16' else ''}) | "
          f"{'on' if a.ckpt else 'off'} | {a.rank} | {a.batch} | {a.max_len} | "
          f"{statistics.median(times):.2f} | {peak:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
