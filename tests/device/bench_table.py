"""The GPU benchmark's Markdown table (tests/device/run.sh, issue 11 item 5), from the rows run.sh ran:

    python3 tests/device/bench_table.py ROWS.txt CKPT_DIR BENCH_DIR RESULTS_DIR [GPU.txt]

ROWS.txt: one line per row, "<size>_<max_len>_<batch>_<quant> done|skipped <why>"; gemmarun's
numbers come from its trial file (RESULTS_DIR/bench_<tag>/trial-*.h5: the per-step tokens/s
series, the memory group, the provenance's device), the peer's from BENCH_DIR/peer_<tag>.json
(tests/bench/peer_train.py --json). The first optimizer step is the warm-up and is not counted.

MFU: tokens/s x model FLOPs per token / 989e12. 989 TFLOP/s is the H200 SXM's dense bf16 Tensor
Core peak: NVIDIA's H200 datasheet gives 1,979 TFLOPS for bf16 "with sparsity", twice the dense
rate (the same figures as the H100 SXM). Model FLOPs per token of LoRA training with a frozen
base, activation recomputation not counted (the same formula for both frameworks):
  4 x (linear weights + V x D)   forward, and the backward's input gradient (no weight gradient)
  + 6 x LoRA weights             forward, input and weight gradients of A and B
  + 12 x H x d x context         attention scores and values, forward (4 x) and backward (8 x),
                                 context = the mean number of keys a query sees (causal; the
                                 sliding layers' window capped)
"""
import glob
import json
import os
import statistics
import sys

PEAK = 989e12


def flops_per_token(cfg, T, rank=16):
    D, L, H, K = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, F, V, W = cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"], cfg["sliding_window"]
    lin = L * (D * H * d + 2 * D * K * d + H * d * D + 3 * D * F)
    lora = L * rank * ((D + H * d) + 2 * (D + K * d) + (H * d + D) + 2 * (D + F) + (F + D))
    full = (T + 1) / 2
    slide = (T + 1) / 2 if T <= W else (W * (W + 1) / 2 + (T - W) * W) / T
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)]
    ctx = sum(full if t == "full_attention" else slide for t in types)
    return 4 * (lin + V * D) + 6 * lora + 12 * H * d * ctx


def ours(results, tag):
    import h5py
    import numpy as np

    files = glob.glob(os.path.join(results, f"bench_{tag}", "trial-*.h5"))
    if not files:
        return None
    with h5py.File(files[0], "r") as f:
        tps = f["metrics/tokens_per_s"][:] if "metrics/tokens_per_s" in f else np.array([])
        mem = dict(f["memory"].attrs) if "memory" in f else {}
        prov = dict(f["provenance"].attrs) if "provenance" in f else {}
        status = f.attrs.get("status", "")
    if isinstance(status, bytes):
        status = status.decode()
    dev = prov.get("device", "?")
    if isinstance(dev, bytes):
        dev = dev.decode()
    # the device's own peak when the run records one (a memory key naming the device), else the
    # process's peak resident memory, said as such
    # on a GPU the runner records (lua/runner.lua) the allocator's high-water mark
    # (measured_gpu_peak_arenas, planned as planned_gpu_arenas) and the card's memory in use
    # (measured_gpu_used: cudaMemGetInfo, context included; planned as planned_gpu_total)
    mib = lambda k: float(mem[k]) / 2**20 if k in mem else None
    peak, what, planned = None, "", None
    if "measured_gpu_used" in mem:
        peak, what, planned = mib("measured_gpu_used"), "GPU in use (cudaMemGetInfo)", mib("planned_gpu_total")
    elif "measured_peak_rss" in mem:
        peak, what, planned = mib("measured_peak_rss"), "host RSS (no GPU peak recorded)", mib("planned_total")
    arenas = (mib("measured_gpu_peak_arenas"), mib("planned_gpu_arenas"))
    timed = [float(x) for x in tps[1:]] if len(tps) > 1 else [float(x) for x in tps]
    return {"tokens_per_s": statistics.median(timed) if timed else None, "peak_mib": peak, "peak_what": what,
            "device": dev, "status": status, "planned_mib": planned, "arenas": arenas,
            "steps": len(timed), "memory_keys": sorted(mem)}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    rows_txt, ck, bench, results = sys.argv[1:5]
    gpu = ""  # nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    if len(sys.argv) > 5 and os.path.exists(sys.argv[5]):
        gpu = open(sys.argv[5]).readline().strip()
    out = []
    out.append(f"GPU benchmark: LoRA rank 16 (alpha 32) on all linear layers, bf16 base (nf4 rows: QLoRA's "
               f"base), activation checkpointing off, random-weight checkpoints of the real shapes "
               f"(tests/device/make_checkpoints.py); one card{': ' + gpu if gpu else ''}. tokens/s: median "
               f"over the timed steps (the first is the warm-up); MFU against 989 TFLOP/s (H200 SXM dense "
               f"bf16, NVIDIA datasheet), model FLOPs as tests/device/bench_table.py defines them. Peak "
               f"memory: torch.cuda.max_memory_allocated for the peer, gemmarun's own measured peak "
               f"(the key named in the note) for ours.")
    out.append("")
    out.append("| model | max_length | batch | base | framework | tokens/s | MFU | peak MiB | note |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for line in open(rows_txt):
        parts = line.split()
        if not parts:
            continue
        tag, state, why = parts[0], parts[1], " ".join(parts[2:])
        size, T, bs, q = tag.split("_")
        T, bs = int(T), int(bs)
        base = "bf16" if q == "stored" else q
        if state == "skipped":
            out.append(f"| {size} | {T} | {bs} | {base} | both | - | - | - | skipped: {why} |")
            continue
        try:
            cfg = json.load(open(os.path.join(ck, f"gemma3-{size}-random", "config.json")))
            fpt = flops_per_token(cfg, T)
        except (OSError, KeyError, ValueError):
            fpt = None
        g = ours(results, tag)
        if g is None:
            out.append(f"| {size} | {T} | {bs} | {base} | gemmarun | - | - | - | no trial file (log gm_{tag}.log) |")
        else:
            mfu = g["tokens_per_s"] * fpt / PEAK if g["tokens_per_s"] and fpt else None
            note = f"device {g['device']}, {g['status']}, {g['steps']} timed steps; peak: {g['peak_what']}"
            if g["planned_mib"]:
                note += f"; planned {g['planned_mib']:.0f} ({(g['peak_mib'] or 0) / g['planned_mib'] - 1:+.1%})"
            if g["arenas"][0] is not None and g["arenas"][1]:
                note += (f"; arenas (allocator peak) {g['arenas'][0]:.0f} vs planned {g['arenas'][1]:.0f} "
                         f"({g['arenas'][0] / g['arenas'][1] - 1:+.1%})")
            out.append(f"| {size} | {T} | {bs} | {base} | gemmarun | {fmt(g['tokens_per_s'], '.0f')} | "
                       f"{fmt(mfu, '.1%')} | {fmt(g['peak_mib'], '.0f')} | {note} |")
        pj = os.path.join(bench, f"peer_{tag}.json")
        if os.path.exists(pj):
            p = json.load(open(pj))
            mfu = p["tokens_per_s"] * fpt / PEAK if fpt else None
            out.append(f"| {size} | {T} | {bs} | {base} | {p['peer']} ({p['attn']}) | {p['tokens_per_s']:.0f} | "
                       f"{fmt(mfu, '.1%')} | {fmt(p['peak_device_mib'], '.0f')} | {p['steps']} timed steps |")
        else:
            why = {"peer-no-bnb": "no bitsandbytes", "peer-skipped-time": "skipped: time"}.get(why, f"failed (log peer_{tag}.log)")
            out.append(f"| {size} | {T} | {bs} | {base} | transformers + PEFT | - | - | - | {why} |")
    if fpt_note := [f"{s}: {flops_per_token(json.load(open(os.path.join(ck, f'gemma3-{s}-random', 'config.json'))), 2048) / 1e9:.2f}"
                    for s in ("270m", "1b", "4b") if os.path.exists(os.path.join(ck, f"gemma3-{s}-random", "config.json"))]:
        out.append("")
        out.append("Model GFLOP per token at max_length 2048: " + ", ".join(fpt_note) + ".")
    print("\n".join(out))


if __name__ == "__main__":
    main()
