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
  llama_check.py merged --model MERGED.gguf --ids 2,5,7 --ours FILE --ours-base FILE --greedy FILE --tol X
      llama.cpp runs the ids on a merged model (gemmarun export --format merged OUT.gguf): its
      logits after the last token equal FILE (gemmarun: the base with the adapter attached) within
      X, its greedy continuation is --greedy's, it carries Gemma's chat template (for llama.cpp's
      chat formatting), and the adapter moves ours (FILE against
      --ours-base, the base alone) by more than EFFECT_FACTOR * X, so a merge that lost the adapter
      would fail the first check.
  llama_check.py quantize --f32 MERGED_F32.gguf --ours MERGED_Q8_0.gguf
      llama.cpp's own quantizer (llama_model_quantize, ftype MOSTLY_Q8_0) turns the f32 GGUF into
      Q8_0; every tensor of gemmarun's Q8_0 file must equal it byte for byte, with the same type.
Prints one "ok"/"FAIL" line per check; exit status 1 when a check fails.
"""

import argparse
import ctypes
import os
import struct
import sys
import tempfile

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
    meta = dict(llm.metadata)
    llm.close()
    return last, toks, meta


def report(ok, text):
    """Prints one check's line; returns 1 when it failed."""
    print(("ok    " if ok else "FAIL  ") + text)
    return 0 if ok else 1


def gguf_tensors(path):
    """{name: (ggml type, bytes)} of a GGUF v3 file, by a direct reading of its header (gguf-py's
    reader parses every metadata array into numpy, which takes seconds for a 262k vocabulary)."""
    with open(path, "rb") as f:
        buf = f.read()
    magic, version, n_t, n_kv = struct.unpack_from("<IIQQ", buf, 0)
    assert magic == 0x46554747 and version == 3, path
    pos = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32

    def skip(t, pos):
        if t == 8:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return pos + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if et == 8:
                for _ in range(n):
                    (k,) = struct.unpack_from("<Q", buf, pos)
                    pos += 8 + k
                return pos
            return pos + n * sizes[et]
        return pos + sizes[t]

    for _ in range(n_kv):
        (k,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + k].decode()
        pos += 8 + k
        (t,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if key == "general.alignment":
            (align,) = struct.unpack_from("<I", buf, pos)
        pos = skip(t, pos)
    infos = []
    for _ in range(n_t):
        (k,) = struct.unpack_from("<Q", buf, pos)
        name = buf[pos + 8:pos + 8 + k].decode()
        pos += 8 + k
        (nd,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        pos += 8 * nd
        typ, off = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, typ, off))
    data = (pos + align - 1) // align * align
    ends = sorted(off for _, _, off in infos) + [len(buf) - data]
    out = {}
    for name, typ, off in infos:
        end = min(e for e in ends if e > off)  # the next tensor's start (sizes include padding)
        out[name] = (typ, buf[data + off:data + end])
    return out


def quantize(a):
    import llama_cpp

    with tempfile.TemporaryDirectory() as d:
        ref = os.path.join(d, "llama_q8_0.gguf")
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
        p.nthread = 2
        rc = llama_cpp.llama_model_quantize(a.f32.encode(), ref.encode(), ctypes.byref(p))
        if rc != 0:
            print(f"FAIL  llama.cpp could not quantize {a.f32} (rc {rc})")
            return 1
        theirs = gguf_tensors(ref)
    ours = gguf_tensors(a.ours)
    if set(ours) != set(theirs):
        print(f"FAIL  the tensors differ: {sorted(set(ours) ^ set(theirs))[:6]}")
        return 1
    # padding after a tensor is not its data: compare each tensor's bytes up to the shorter length
    bad = [n for n in ours if ours[n][0] != theirs[n][0] or ours[n][1].rstrip(b"\0") != theirs[n][1].rstrip(b"\0")]
    q8 = sum(1 for n in ours if ours[n][0] == 8)
    if bad:
        print(f"FAIL  {len(bad)} of {len(ours)} tensors differ from llama.cpp's Q8_0, e.g. {bad[0]} (types {ours[bad[0]][0]} / {theirs[bad[0]][0]})")
        return 1
    print(f"ok    all {len(ours)} tensors equal llama.cpp's own quantization byte for byte ({q8} in Q8_0, the rest f32)")
    return 0


def merged(a):
    ids = [int(x) for x in a.ids.split(",")]
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    ours_base = np.loadtxt(a.ours_base, dtype=np.float64).reshape(-1)
    want = [int(x) for x in open(a.greedy).read().split()]
    theirs, toks, meta = run(a.model, None, ids, len(want))
    template = meta.get("tokenizer.chat_template", "")
    diff, effect = float(np.max(np.abs(ours - theirs))), float(np.max(np.abs(ours - ours_base)))
    fails = report("<start_of_turn>" in template and "<end_of_turn>" in template,
                   f"the file carries Gemma's chat template ({len(template)} characters)")
    fails += report(diff <= a.tol, f"merged model in llama.cpp: max |gemmarun with the adapter - llama.cpp| = {diff:.3g} "
                    f"(bound {a.tol:g}) over {ours.size} logits")
    fails += report(effect > EFFECT_FACTOR * a.tol,
                    f"the adapter moves gemmarun's logits by up to {effect:.3g} (> {EFFECT_FACTOR:g} x {a.tol:g})")
    fails += report(toks == want, f"greedy continuation: llama.cpp {toks}, gemmarun {want}")
    return 1 if fails else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    for k in ("--model", "--lora", "--ids", "--ours", "--ours-base", "--greedy"):
        c.add_argument(k, required=True)
    c.add_argument("--tol", type=float, required=True)
    c.add_argument("--min-corr", type=float, required=True)
    c.add_argument("--tol-slope", type=float, required=True)
    g = sub.add_parser("merged")
    for k in ("--model", "--ids", "--ours", "--ours-base", "--greedy"):
        g.add_argument(k, required=True)
    g.add_argument("--tol", type=float, required=True)
    q = sub.add_parser("quantize")
    q.add_argument("--f32", required=True)
    q.add_argument("--ours", required=True)
    a = p.parse_args()
    if a.cmd == "merged":
        return merged(a)
    if a.cmd == "quantize":
        return quantize(a)
    ids = [int(x) for x in a.ids.split(",")]
    ours = np.loadtxt(a.ours, dtype=np.float64).reshape(-1)
    ours_base = np.loadtxt(a.ours_base, dtype=np.float64).reshape(-1)
    want = [int(x) for x in open(a.greedy).read().split()]
    with_a, toks, _ = run(a.model, a.lora, ids, len(want))
    without, _, _ = run(a.model, None, ids, 0)
    d = float(np.max(np.abs(ours - with_a)))
    fails = report(d <= a.tol, f"logits with the adapter: max |gemmarun - llama.cpp| = {d:.3g} (bound {a.tol:g}) over {ours.size} logits")
    e_ours, e_llama = ours - ours_base, with_a - without
    corr = float(np.corrcoef(e_ours, e_llama)[0, 1])
    slope = float(e_ours @ e_llama / (e_ours @ e_ours))
    fails += report(corr >= a.min_corr and abs(slope - 1) <= a.tol_slope,
          f"the adapter's effect on the logits: correlation {corr:.4f} (>= {a.min_corr:g}), slope llama.cpp/gemmarun "
          f"{slope:.3f} (1 +- {a.tol_slope:g})")
    eff = float(np.max(np.abs(e_llama)))
    fails += report(eff > EFFECT_FACTOR * a.tol, f"the adapter moves llama.cpp's logits by up to {eff:.3g} (> {EFFECT_FACTOR:g} x {a.tol:g})")
    fails += report(toks == want, f"greedy continuation with the adapter: llama.cpp {toks}, gemmarun {want}")
    # context for the bound, not a check: how far llama.cpp's arithmetic puts the base model alone
    print(f"info  the base model alone: max |gemmarun - llama.cpp| = {float(np.max(np.abs(ours_base - without))):.3g}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
