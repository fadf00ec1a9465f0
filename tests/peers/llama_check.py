#!/usr/bin/env python3
"""The llama.cpp side of the adapter round trips (tests/e2e/generate_real.sh), in the peers venv
(tests/peers/setup.sh: llama-cpp-python built from source, its libllama the llama.cpp of its
vendor/ tree).

  llama_check.py compare --model BASE.gguf --lora ADAPTER.gguf --ids 2,5,7 --ours FILE
                 --ours-base FILE --greedy FILE --tol X --min-corr C --tol-slope S
      llama.cpp runs the ids on BASE with and without the GGUF LoRA adapter (scale 1). FILE holds
      gemmarun's logits after the last token with the same adapter (tests/peers/logits.lua), and
      --ours-base without it; --greedy gemmarun's greedy continuation (token ids, one per line).
      Checks:
        - max |ours - llama.cpp| <= X with the adapter (X is about llama.cpp's own arithmetic: its
          dot products quantize the activations to 8 bits, which moves the base model's logits by
          as much);
        - the adapter's effect on the logits, e = (with - without), is the same in both: the
          correlation of ours and llama.cpp's is >= C, and the least-squares slope of llama.cpp's
          on ours is within S of 1 (a wrong alpha or rank scaling would move it);
        - the adapter moves llama.cpp's logits by more than EFFECT_FACTOR * X, so a dropped adapter
          would fail the first check;
        - llama.cpp's greedy continuation with the adapter is gemmarun's.
Prints one "ok"/"FAIL" line per check; exit status 1 when a check fails.
"""

import argparse
import sys

import numpy as np
from llama_cpp import Llama

EFFECT_FACTOR = 4.0


def run(model, lora, ids, n_greedy):
    kw = dict(model_path=model, n_ctx=max(64, len(ids) + n_greedy + 8), n_threads=2, n_batch=512, logits_all=True,
              verbose=False, seed=0)
    if lora:
        kw["lora_path"] = lora
    llm = Llama(**kw)
    llm.eval(ids)
    last = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
    toks, seq = [], list(ids)
    for _ in range(n_greedy):  # greedy: argmax of the logits after the last token, fed back
        nxt = int(np.argmax(llm.scores[len(seq) - 1]))
        toks.append(nxt)
        seq.append(nxt)
        llm.eval([nxt])
    llm.close()
    return last, toks


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    for k in ("--model", "--lora", "--ids", "--ours", "--ours-base", "--greedy"):
        c.add_argument(k, required=True)
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--min-corr", type=float, required=True)
    c.add_argument("--tol-slope", type=float, required=True)
    a = p.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    ours_base = np.loadtxt(a.ours_base, dtype=np.float64).reshape(-1)
    want = [int(x) for x in open(a.greedy).read().split()]
    with_a, toks = run(a.model, a.lora, ids, len(want))
    without, _ = run(a.model, None, ids, 0)
    fails = 0

    def check(ok, text):
        nonlocal fails
        fails += 0 if ok else 1
        print(("ok    " if ok else "FAIL  ") + text)

    d = float(np.max(np.abs(ours - with_a)))
    check(d <= a.tol, f"logits with the adapter: max |gemmarun - llama.cpp| = {d:.3g} (bound {a.tol:g}) over {ours.size} logits")
    e_ours, e_llama = ours - ours_base, with_a - without
    corr = float(np.corrcoef(e_ours, e_llama)[0, 1])
    slope = float(e_ours @ e_llama / (e_ours @ e_ours))
    check(corr >= a.min_corr and abs(slope - 1) <= a.tol_slope,
          f"the adapter's effect on the logits: correlation {corr:.4f} (>= {a.min_corr:g}), slope llama.cpp/gemmarun "
          f"{slope:.3f} (1 +- {a.tol_slope:g})")
    eff = float(np.max(np.abs(e_llama)))
    check(eff > EFFECT_FACTOR * a.tol, f"the adapter moves llama.cpp's logits by up to {eff:.3g} (> {EFFECT_FACTOR:g} x {a.tol:g})")
    check(toks == want, f"greedy continuation with the adapter: llama.cpp {toks}, gemmarun {want}")
    # context for the bound, not a check: how far llama.cpp's arithmetic puts the base model alone
    print(f"info  the base model alone: max |gemmarun - llama.cpp| = {float(np.max(np.abs(ours_base - without))):.3g}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
