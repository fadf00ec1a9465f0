#!/usr/bin/env bash
# End-to-end: Gemma 4 through gemmarun, on the tiny random Gemma 4 decoders of make_gemma4_ref.py
# (tiny_gemma4: per-layer inputs, KV sharing with double-wide MLPs, wide full-layer heads with
# proportional RoPE, layer scalars; tiny_gemma4_kv: keys as values on full layers) with the tiny
# test tokenizer in Gemma 4's chat format (tests/ref/tiny_gemma4_chat):
#   - generate: a chat prompt, then new tokens through the KV caches, stopping at <turn|>;
#   - an experiment (2 learning rates) trains LoRA on chat data rendered in Gemma 4's turns (its
#     response start found by them), evaluates and writes its table; the loss falls; each trial's
#     measured peak memory within TOL_PLAN_PEAK_REL of its (exact) plan;
#   - activation checkpointing on gives the same trial bit for bit (the KV-shared layers read the
#     keys and values their source layer kept);
#   - the k_eq_v decoder trains too, and the mixture-of-experts one, its router's load per step
#     in the trial's metrics; its adapter loads in PEFT too;
#   - the trained adapter exported as a PEFT folder, loaded by PEFT on transformers'
#     Gemma4ForCausalLM: the same logits within TOL_ADAPTER_PEER_TINY_ABS.
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
BASE=$SRC/tests/ref/tiny_gemma4_chat
TOL=$(tol TOL_ADAPTER_PEER_TINY_ABS)
IDS=2,15,27,100,31,7,300,450

expect_run "generate --chat on Gemma 4: a prompt in its turns, then tokens through the KV caches" 0 \
  "[0-9]+ prompt tokens .* [0-9]+ new tokens" -- "$GM" generate "$BASE" --chat "hello world" --max-tokens 6

# chat data: a system turn, a question and its answer (the answers' tokens are the loss)
mkdir -p data
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  case $((i % 3)) in 0) a="apple" ;; 1) a="berry" ;; *) a="cherry" ;; esac
  printf '{"messages": [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "a short note %d: which fruit?"}, {"role": "assistant", "content": "the %s"}]}\n' "$i" "$a"
done > data/chat.jsonl
cat > g4.lua <<EOF
return experiment {
  name = "g4", model = "$BASE",
  task = sft { data = data.jsonl { train = "data/chat.jsonl", test_fraction = 0.25 } },
  train = { epochs = 2, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64 },
  sweep = grid { lr = {1e-2, 3e-3} },
  seeds = {1},
}
EOF
expect_run "an experiment on Gemma 4 trains LoRA on chat data in its turns (2 trials), evaluates and writes its table" 0 \
  "trial 2/2 .* final loss.*written: results/g4.md" -- "$GM" g4.lua
PY=""
find_python h5py
if [ -n "$PY" ]; then
  expect_run "each trial's loss falls (last step below the first) and its peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 \
    "^ok 2$" -- trials_fall_and_fit results/g4
else
  skip_unless_ci "the trial files' loss and memory (h5py: run ./setup.sh)"
fi

# the plan is the trainer's own layout (exact: no estimate's note), for the three decoders
for m in "$BASE" "$SRC/tests/ref/tiny_gemma4_kv" "$SRC/tests/ref/tiny_gemma4_moe"; do
  out=$("$GM" plan "$m" max_length=64 batch=2 rank=4 2>&1) && rc=0 || rc=$?
  if [ "$rc" = 0 ] && printf '%s' "$out" | grep -q 'total' && ! printf '%s' "$out" | grep -q '^note:'; then
    pass=$((pass + 1)); echo "ok    plan of $(basename "$m"): the trainer's exact layout"
  else
    fail=$((fail + 1)); echo "FAIL  plan of $(basename "$m") (exit $rc) is not the exact layout:"; printf '%s\n' "$out" | head -20 | sed 's/^/      /'
  fi
done

# activation checkpointing: the lr=1e-2 trial again with it on gives the same series and adapter
sed -e 's/name = "g4"/name = "g4_ckpt"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' \
    -e 's/max_length = 64 }/max_length = 64, checkpointing = true }/' g4.lua > g4_ckpt.lua
expect_run "the same trial with activation checkpointing trains" 0 "written: results/g4_ckpt.md" -- "$GM" g4_ckpt.lua
same_ckpt_trial results/g4 results/g4_ckpt 0.01

# the 31B family's decoder (keys as values on full layers; the Gemma 3 test tokenizer: its turns)
sed -e 's/name = "g4"/name = "g4_kv"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' \
    -e "s|tests/ref/tiny_gemma4_chat|tests/ref/tiny_gemma4_kv|" g4.lua > g4_kv.lua
mkdir -p kv && ln -sf "$SRC/tests/ref/tiny_gemma4_kv/config.json" "$SRC/tests/ref/tiny_gemma4_kv/model.safetensors" kv/ \
  && ln -sf "$SRC/tests/ref/tiny_gemma4_chat/tokenizer.json" kv/
sed -i "s|$SRC/tests/ref/tiny_gemma4_kv|$(pwd)/kv|" g4_kv.lua
expect_run "the k_eq_v decoder (31B family) trains on the same data" 0 "trial 1/1 .* final loss.*written: results/g4_kv.md" \
  -- "$GM" g4_kv.lua

# the 26B-A4B family's decoder (a mixture of experts beside every MLP): trains, with the router's
# load per step in the trial's metrics
mkdir -p moe && ln -sf "$SRC/tests/ref/tiny_gemma4_moe/config.json" "$SRC/tests/ref/tiny_gemma4_moe/model.safetensors" moe/ \
  && ln -sf "$SRC/tests/ref/tiny_gemma4_chat/tokenizer.json" moe/
sed -e 's/name = "g4_kv"/name = "g4_moe"/' -e "s|$(pwd)/kv|$(pwd)/moe|" g4_kv.lua > g4_moe.lua
expect_run "the mixture-of-experts decoder (26B-A4B family) trains on the same data" 0 \
  "trial 1/1 .* final loss.*written: results/g4_moe.md" -- "$GM" g4_moe.lua
if [ -n "$PY" ]; then
  expect_run "its trial file has the router's load per step (max share 1..4 of an even one, cv >= 0)" 0 "^ok [0-9]+$" -- "$PY" -c "
import glob, h5py
p = [f for f in glob.glob('results/g4_moe/trial-*.h5') if not f.endswith('.ckpt.h5')][0]
f = h5py.File(p, 'r')
mx, cv, loss = f['metrics/router_max_load'][:], f['metrics/router_load_cv'][:], f['metrics/loss'][:]
assert len(mx) == len(loss) and len(cv) == len(loss), (len(mx), len(cv), len(loss))
assert ((mx >= 1) & (mx <= 4)).all() and (cv >= 0).all() and (cv > 0).any(), (mx, cv)
print('ok', len(mx))"
  expect_run "a dense Gemma 4 trial has no router columns" 0 "^ok$" -- "$PY" -c "
import glob, h5py
p = [f for f in glob.glob('results/g4_kv/trial-*.h5') if not f.endswith('.ckpt.h5')][0]
assert 'router_max_load' not in h5py.File(p, 'r')['metrics']
print('ok')"
fi

# what a user gets wrong, each refused by name before any work
mkdir -p moe_off && ln -sf "$SRC/tests/ref/tiny_gemma4_moe/model.safetensors" "$SRC/tests/ref/tiny_gemma4_chat/tokenizer.json" moe_off/ \
  && sed 's/"enable_moe_block": true/"enable_moe_block": false/' "$SRC/tests/ref/tiny_gemma4_moe/config.json" > moe_off/config.json
expect_run "a config that leaves the file's experts unused (enable_moe_block false): refused naming a tensor" 2 \
  "tensor 'model.layers.0.experts.down_proj' is in the checkpoint, but its config.json leaves it unused" \
  -- "$GM" generate moe_off "hi" --max-tokens 2
"$GM" export results/g4_kv --trial 1 out_kv > /dev/null 2>&1
expect_run "the 31B-family adapter on the E-family model: refused, naming the KV-shared layer" 2 \
  "adapter on model.layers.4.self_attn.k_proj, but layer 4 of this model reads layer 3's keys and values \(KV sharing" \
  -- "$GM" generate "$BASE" --adapter out_kv "hi" --max-tokens 2
expect_run "a GGUF LoRA export of a Gemma 4 adapter: refused (llama.cpp's Gemma 4 unverified)" 2 \
  "is a gemma4 model: gemmarun writes llama.cpp LoRA files for Gemma 3 bases.*--format peft" \
  -- "$GM" export results/g4 --trial 1 --format gguf g4.gguf
mkdir -p imgs && cp "$SRC/tests/ref/images/chelsea.png" imgs/
expect_run "an image on a text-only Gemma 4: refused, naming the missing tower" 2 \
  "chelsea.png: .*it has no vision tower" -- "$GM" generate "$BASE" --chat --image imgs/chelsea.png "What is it?"
# Gemma4ForConditionalGeneration's layout of the config (text_config beside vision / audio configs): the text decoder runs
mkdir -p mm && ln -sf "$SRC/tests/ref/tiny_gemma4/model.safetensors" "$SRC/tests/ref/tiny_gemma4_chat/tokenizer.json" mm/
"${PY:-python3}" -c "
import json, sys
t = json.load(open(sys.argv[1]))
json.dump({'model_type': 'gemma4', 'text_config': t, 'vision_config': {'model_type': 'gemma4_vision'},
           'audio_config': {'model_type': 'gemma4_audio'}}, open('mm/config.json', 'w'))" "$SRC/tests/ref/tiny_gemma4/config.json"
expect_run "a gemma4 (multimodal) config: its text decoder generates" 0 "[0-9]+ prompt tokens .* 3 new tokens" \
  -- "$GM" generate mm "hello world" --max-tokens 3
expect_run "an image on it: refused, its files holding no tower" 2 "chelsea.png: .*its files hold no vision tower" \
  -- "$GM" generate mm --chat --image imgs/chelsea.png "What is it?"

# the adapter through PEFT
expect_run "export --trial 2 as a PEFT folder: 38 modules (no k / v on the 2 KV-shared layers)" 0 \
  "38 LoRA modules, rank 4, alpha 8, as a PEFT adapter" -- "$GM" export results/g4 --trial 2 out2
MODEL=$BASE IDS=$IDS OUT=results/ours.txt ADAPTER=results/g4 TRIAL=2 "$GM" "$SRC/tests/peers/logits.lua" > /dev/null 2>&1
peers_python
if [ -z "$PEERS" ]; then
  skip_unless_ci "PEFT round trip: no Python with torch, transformers and peft (tests/peers/setup.sh installs them)"
else
  expect_run "PEFT loads it on transformers' Gemma4ForCausalLM: the same logits within $TOL" 0 \
    "ok +logits with the adapter.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter out2 --ids $IDS --ours results/ours.txt --tol "$TOL"
  "$GM" export results/g4_moe --trial 1 out_moe > /dev/null 2>&1
  MODEL=$(pwd)/moe IDS=$IDS OUT=results/ours_moe.txt ADAPTER=results/g4_moe TRIAL=1 "$GM" "$SRC/tests/peers/logits.lua" > /dev/null 2>&1
  expect_run "... and the mixture of experts' adapter on transformers' Gemma4ForCausalLM with experts: the same logits within $TOL" 0 \
    "ok +logits with the adapter.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$(pwd)/moe" --adapter out_moe --ids $IDS --ours results/ours_moe.txt --tol "$TOL"
fi
finish
