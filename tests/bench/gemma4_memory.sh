#!/usr/bin/env bash
# The second story's settings on Gemma 4's small sizes, measured here: LoRA rank 64 / alpha 64 on
# all linear layers (the story's), on a random-weight Gemma 4 E2B or E4B text decoder at its real
# shapes (tests/bench/make_random_gemma.py --gemma4), with real text (paragraphs of Debian's GPL-3
# as chat replies), max_length 512, batch 1, checkpointing on, 3 steps; prints the trial's planned
# and measured peak memory (docs/memory.md, "Gemma 4 E2B / E4B, measured here").
#   tests/bench/gemma4_memory.sh [e2b|e4b] [WORKDIR]     (default e2b, /tmp/g4<size>; run from the repository)
# QUANT=nf4 trains on a QLoRA base instead of the stored bf16 (default stored). E2B: ~9 GiB of disk
# and ~10 GiB of memory; E4B: ~14 GiB of disk.
set -eu
SRC=$(pwd)
SIZE=${1:-e2b}
W=${2:-/tmp/g4$SIZE}
GM=${GM:-$SRC/build/gemmarun}
PY=${PY:-$HOME/.cache/gemmarun/peers-venv/bin/python}
Q=${QUANT:-stored}
mkdir -p "$W"
flag=""
[ "$SIZE" = e4b ] && flag=--e4b
[ -f "$W/model/model.safetensors.index.json" ] || "$PY" "$SRC/tests/bench/make_random_gemma.py" "$W/model" --gemma4 $flag
cd "$W"
python3 - <<'PYEOF'
import json
paras = [p.strip().replace("\n", " ") for p in open("/usr/share/common-licenses/GPL-3").read().split("\n\n") if len(p) > 200]
def ex(i, n):  # a question and a reply of n paragraphs
    return {"messages": [{"role": "user", "content": f"Summarize section {i} of the license."},
                         {"role": "assistant", "content": " ".join(paras[i:i + n])}]}
with open("train.jsonl", "w") as f:
    f.write("\n".join(json.dumps(ex(i, n)) for i, n in ((0, 1), (3, 6), (10, 3))) + "\n")
with open("test.jsonl", "w") as f:
    f.write(json.dumps(ex(20, 2)) + "\n")
PYEOF
n=g4${SIZE}_$Q
cat > $n.lua <<EOT
return experiment {
  name = "$n", model = "$W/model",
  task = sft { data = data.jsonl { train = "train.jsonl", test = "test.jsonl" } },
  train = { epochs = 1, batch = 1, lr = 5e-5, rank = 64, alpha = 64, targets = "all-linear", max_length = 512,
            checkpointing = true, quant = "$Q" },
  seeds = { 1 },
}
EOT
rm -rf "results/$n"
/usr/bin/time -v "$GM" $n.lua 2> time.log | grep -E -A3 "Peak memory|final loss"
grep -E "Maximum resident|Elapsed" time.log
