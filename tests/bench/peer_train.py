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

On a GPU (tests/device/run.sh): MODEL may be a Hugging Face folder instead of a GGUF (the random-
weight checkpoints of tests/device/make_checkpoints.py), `--device cuda --dtype bf16 --attn sdpa`
loads the base in bf16 on the card (PEFT keeps the adapters in f32, its default), `--quant nf4`
loads it through bitsandbytes as QLoRA does (NF4, double quantization, bf16 compute), and `--json
FILE` also writes the numbers (median step time, tokens/s, peak device memory from
torch.cuda.max_memory_allocated) for run.sh's table. Without these options the CPU behaviour
above is unchanged.
"""
import json
import argparse
import os
import resource
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf", help="a GGUF file, or a Hugging Face checkpoint folder")
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
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="the base weights' dtype")
    ap.add_argument("--quant", default="none", choices=["none", "nf4"],
                    help="nf4: the base through bitsandbytes 4-bit (QLoRA; cuda only)")
    ap.add_argument("--json", default=None, help="also write the numbers to this file (JSON)")
    a = ap.parse_args()

    import torch
    import transformers
    import peft
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    cuda = a.device == "cuda"
    if os.path.isdir(a.gguf):
        kw = {}
        if a.quant == "nf4":
            kw["quantization_config"] = transformers.BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(a.gguf, dtype=dtype, attn_implementation=a.attn,
                                                     device_map={"": a.device} if cuda else None, **kw)
    else:
        d, f = os.path.split(a.gguf)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=dtype,
                                                     attn_implementation=a.attn)
        if cuda:
            model = model.to("cuda")
    vocab = model.config.vocab_size
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
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for s in range(a.steps + 1):
        ids = torch.randint(1000, min(200000, vocab), (a.batch, a.max_len), generator=g)
        ids[:, 0] = 2  # <bos>
        if cuda:
            ids = ids.to("cuda")
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()  # the step's kernels are done before the clock is read
        if s > 0:  # step 0 is the warm-up, as in train_step.lua
            times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if a.json:
        med = statistics.median(times)
        with open(a.json, "w") as fj:
            json.dump({"peer": f"transformers {transformers.__version__} + peft {peft.__version__}",
                       "device": a.device, "dtype": a.dtype, "quant": a.quant, "attn": a.attn, "rank": a.rank,
                       "batch": a.batch, "max_len": a.max_len, "ckpt": a.ckpt, "steps": len(times),
                       "step_s": med, "tokens_per_s": a.batch * a.max_len / med,
                       "peak_device_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
                       "peak_rss_mib": peak, "loss": float(out.loss.detach())}, fj)
    what = "f32" if a.dtype == "f32" else "bf16"
    if a.quant == "nf4":
        what = "nf4 + bf16 compute"
    if cuda:
        what += ", cuda"
    print(f"| transformers {transformers.__version__} + peft {peft.__version__} ({what}, {a.attn}{', bf16 autocast' if a.autocast == 'bf16' else ''}) | "
          f"{'on' if a.ckpt else 'off'} | {a.rank} | {a.batch} | {a.max_len} | "
          f"{statistics.median(times):.2f} | {peak:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
