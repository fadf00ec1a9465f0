#!/usr/bin/env bash
# The first story's run, measured here: LoRA on a random-weight Gemma 3n E2B (its real shapes,
# tests/bench/make_random_gemma.py) with real audio clips, max_length 1024, batch 1, checkpointing
# on, 4 steps, in two example orders; prints each trial's planned and measured peak memory
# (docs/memory.md, "A random-weight E2B, measured here"). About 10 GiB of disk and 9 GiB of memory;
# ~15 minutes on 2 cores. AUDIO_TARGETS=all-linear (or module names) also puts LoRA on the audio
# encoder's conformer (its trials are named e2b_a<seed>).
#   tests/bench/gemma3n_e2b_memory.sh [WORKDIR]      (default /tmp/e2b; run from the repository)
set -eu
SRC=$(pwd)
W=${1:-/tmp/e2b}
GM=${GM:-$SRC/build/gemmarun}
PY=${PY:-$HOME/.cache/gemmarun/peers-venv/bin/python}
mkdir -p "$W"
[ -f "$W/model/model.safetensors.index.json" ] || "$PY" "$SRC/tests/bench/make_random_gemma.py" "$W/model"
cd "$W"
python3 - <<'PYEOF'
import gzip, json
A = "/usr/share/asterisk/sounds/en_US_f_Allison"
t = {}
for line in gzip.open("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz", "rt"):
    if ": " in line and not line.startswith(";"):
        k, v = line.split(": ", 1)
        t[k] = v.strip()
def ex(name, reps):  # a clip, and its transcript repeated: replies of 20 to ~480 tokens
    return {"messages": [{"role": "user", "content": [{"type": "audio", "path": f"{A}/{name}.wav"},
            {"type": "text", "text": "Transcribe this recording and comment on the speaker's pronunciation."}]},
            {"role": "assistant", "content": ((t[name] + " ") * reps).strip()}]}
train = [ex("hello-world", 2), ex("agent-pass", 14), ex("basic-pbx-ivr-main", 2), ex("all-circuits-busy-now", 30)]
with open("train.jsonl", "w") as f:
    f.write("\n".join(json.dumps(x) for x in train) + "\n")
with open("test.jsonl", "w") as f:
    f.write(json.dumps(ex("vm-goodbye", 20)) + "\n")
PYEOF
AT=${AUDIO_TARGETS:-none}
for s in 1 2; do
  n=e2b_$s
  [ "$AT" = none ] || n=e2b_a$s
  cat > $n.lua <<EOT
return experiment {
  name = "$n", model = "$W/model",
  task = sft { data = data.jsonl { train = "train.jsonl", test = "test.jsonl" } },
  train = { epochs = 1, batch = 1, lr = 1e-4, rank = 16, alpha = 16, targets = "all-linear", max_length = 1024,
            checkpointing = true, quant = "stored", audio_targets = "$AT" },
  seeds = { $s },
}
EOT
  rm -rf "results/$n"
  "$GM" $n.lua | grep -A3 "Peak memory"
done
