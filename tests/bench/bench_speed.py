#!/usr/bin/env python3
"""tests/bench/bench_speed.py - LoRA training speed on the real Gemma 3 270M against the peers, in one run.

For each row (max_length x batch), one process each:
  gemmarun  tests/bench/train_step.lua, the Q4_K_M base as stored, compute = "f32" and, where this
            CPU multiplies bf16 natively, compute = "bf16"
  peer      transformers + PEFT on the same GGUF (dequantized to f32 by transformers), sdpa
            attention, f32 and torch.autocast("cpu", bfloat16)
LoRA rank 16 on all seven linears, every example filling max_length, median step after a warm-up.
Before the rows, this machine's GEMM rates at the model's shapes (build/tests/bench/bench_gemm and
tests/bench/peer_gemm.py, time-weighted over the shapes), which model FLOP utilisation (MFU) is
measured against: model FLOPs a step / step time / the rate of the dtype the engine multiplies in
(gemmarun: its own kernels' rate; the peer: torch's). Model FLOPs from the spec (2 per
multiply-add): base linears forward and dX (4 T P, P = the 18 layers' linear weights), LoRA
forward and backward (6 T r (in + out) per adapter), attention's four causal matmuls forward and
eight backward (12 B H D L (L + 1) / 2 per layer), the LM head forward and dX on the supervised
positions S (4 S V C). T = B L tokens. The peer's bf16 autocast is skipped (said in its row) where
this run measured torch's bf16 GEMMs under a fifth of its f32 rate: emulated bf16 (a 2-core AVX2
EPYC: 2 against 151 GFLOP/s, one 128 x 1 step 139.7 s) cannot be the strongest setting.

    python3 tests/bench/bench_speed.py [--rows 128x1,512x1,128x4,512x4] [--steps 3] [--threads 2]

The peer's Python: $GEMMARUN_REF_PY, else the peers venv (tests/peers/setup.sh).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GM = os.path.join(ROOT, "build", "gemmarun")

# Gemma 3 270M (reference/gemma_architecture.md; the GGUF's metadata)
C, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FF, VOCAB = 640, 18, 4, 1, 256, 2048, 262144
LINEARS = {  # (in, out) of the seven LoRA targets
    "q_proj": (C, HEADS * HEAD_DIM), "k_proj": (C, KV_HEADS * HEAD_DIM), "v_proj": (C, KV_HEADS * HEAD_DIM),
    "o_proj": (HEADS * HEAD_DIM, C), "gate_proj": (C, FF), "up_proj": (C, FF), "down_proj": (FF, C)}


def model_flops(batch, length, supervised, rank):
    T = batch * length
    P = LAYERS * sum(i * o for i, o in LINEARS.values())
    base = 4 * T * P
    lora = LAYERS * sum(6 * T * rank * (i + o) for i, o in LINEARS.values())
    attn = LAYERS * 12 * batch * HEADS * HEAD_DIM * length * (length + 1) // 2
    head = 4 * supervised * VOCAB * C
    return base + lora + attn + head


def peer_python():
    for p in (os.environ.get("GEMMARUN_REF_PY"),
              os.path.join(os.environ.get("GEMMARUN_HOME", os.path.expanduser("~/.cache/gemmarun")), "peers-venv",
                           "bin", "python")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"FAILED ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}\n")
        return None
    return r.stdout


def slow_bf16(peer_rate):
    """Whether the peer's bf16 autocast cannot be its strongest setting on this CPU: torch's bf16 GEMM
    rate, measured in this run, under a fifth of its f32 rate (the step is mostly GEMMs)."""
    return bool(peer_rate.get("bf16") and peer_rate.get("f32")) and peer_rate["bf16"] < peer_rate["f32"] / 5


def total_rate(text, col):
    """The time-weighted rate column `col` of a bench_gemm / peer_gemm table's **all** row."""
    for line in text.splitlines():
        if line.startswith("| **all**"):
            cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
            return float(cells[col])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128x1,512x1,128x4,512x4", help="max_length x batch, comma-separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    py = peer_python()
    threads = str(a.threads)

    gemm = run([os.path.join(ROOT, "build", "tests", "bench", "bench_gemm"), "--threads", threads, "--rows", "512"])
    if gemm is None:
        return 1
    print("## GEMM rates at the 270M's shapes (M = 512 rows)\n")
    print(gemm)
    rate = {"f32": total_rate(gemm, 2), "bf16": total_rate(gemm, 3)}
    bf16_native = "bf16 native: yes" in gemm
    peer_rate = {}
    if py:
        pg = run([py, os.path.join("tests", "bench", "peer_gemm.py"), "--threads", threads, "--rows", "512"],
                 {"OMP_NUM_THREADS": threads})
        if pg:
            print(pg)
            peer_rate = {"f32": total_rate(pg, 2), "bf16": total_rate(pg, 3)}

    model = run([GM, "fetch", "gemma3-270m"]).strip().splitlines()[-1]
    print(f"## LoRA rank {a.rank} all-linear, Gemma 3 270M, {a.threads} threads, median of {a.steps} steps\n")
    print("| max_length | batch | engine | step s | tokens/s | vs strongest peer | MFU (of its dtype's GEMM rate) | peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in a.rows.split(","):
        length, batch = (int(x) for x in row.split("x"))
        results, skipped = [], []
        computes = ["f32"] + (["bf16"] if bf16_native else [])
        for comp in computes:
            out = run([GM, "tests/bench/train_step.lua", "--threads", threads],
                      {"QUANT": "stored", "CKPT": "0", "RANK": str(a.rank), "MAX_LEN": str(length), "BATCH": str(batch),
                       "STEPS": str(a.steps), "COMPUTE": comp, "SUPERVISED": "1"})
            if not out:
                continue
            table = [l for l in out.splitlines() if l.startswith("| ")][-1]
            cells = [c.strip() for c in table.strip("|").split("|")]
            step, peak = float(cells[5]), float(cells[7])
            sup = int(re.search(r"supervised (\d+)", out).group(1))
            flops = model_flops(batch, length, sup, a.rank)
            results.append((f"gemmarun, Q4_K_M base, compute {comp}", step, peak, flops / step / 1e9 / rate[comp], False))
        if py:
            for auto in ("none", "bf16"):
                if auto == "bf16" and slow_bf16(peer_rate):
                    # torch's bf16 GEMMs are emulated on this CPU: the setting cannot be the strongest
                    # (2 against 151 GFLOP/s on a 2-core AVX2 EPYC, where one 128 x 1 step took 139.7 s)
                    skipped.append(f"| {length} | {batch} | transformers + PEFT, sdpa, bf16 autocast | skipped: torch's bf16 "
                                   f"GEMM rate {peer_rate['bf16']:.0f} GFLOP/s here, under a fifth of its f32 "
                                   f"{peer_rate['f32']:.0f} | | | | |")
                    continue
                out = run([py, "tests/bench/peer_train.py", model, "--rank", str(a.rank), "--max-len", str(length),
                           "--batch", str(batch), "--steps", str(a.steps), "--threads", threads, "--attn", "sdpa",
                           "--autocast", auto], {"OMP_NUM_THREADS": threads})
                if not out:
                    continue
                cells = [c.strip() for c in out.strip().splitlines()[-1].strip("|").split("|")]
                step, peak = float(cells[5]), float(cells[6])
                # labels = input ids: every position but the last of each row is supervised
                flops = model_flops(batch, length, batch * (length - 1), a.rank)
                r = peer_rate.get("bf16" if auto == "bf16" else "f32")
                name = "transformers + PEFT, sdpa, " + ("bf16 autocast" if auto == "bf16" else "f32")
                results.append((name, step, peak, flops / step / 1e9 / r if r else None, True))
        peers = [r[1] for r in results if r[4]]
        best_peer = min(peers) if peers else None
        for name, step, peak, mfu, _ in results:
            tps = batch * length / step
            vs = f"{best_peer / step:.2f}x" if best_peer else "-"
            m = f"{100 * mfu:.0f}%" if mfu else "-"
            print(f"| {length} | {batch} | {name} | {step:.2f} | {tps:.0f} | {vs} | {m} | {peak:,.0f} |")
        for line in skipped:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
