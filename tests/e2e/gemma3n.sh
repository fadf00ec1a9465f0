#!/usr/bin/env bash
# End-to-end: Gemma 3n through gemmarun, on the tiny random Gemma 3n of make_gemma3n_ref.py
# (every part of the architecture: AltUp, LAuReL, per-layer inputs, gaussian top-k, KV sharing)
# with the tiny test tokenizer (tests/ref/tiny_gemma3n_chat: links to both):
#   - generate: a prompt and new tokens through the KV caches;
#   - an experiment (2 learning rates) trains LoRA on it, evaluates, writes its table; the trial's
#     measured peak memory within TOL_PLAN_PEAK_REL of its plan;
#   - activation checkpointing on gives the same trial bit for bit (the KV-shared layers read the
#     keys and values their source layer kept);
#   - the multimodal layout (tiny_gemma3n_mm) trains on padded batches; images on Gemma 3n and
#     images / audio in the plan of a tower-less config are refused by name;
#   - the trained adapter exported as a PEFT folder, loaded by PEFT on transformers'
#     Gemma3nForCausalLM: the same logits within TOL_ADAPTER_PEER_TINY_ABS.
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
BASE=$SRC/tests/ref/tiny_gemma3n_chat
TOL=$(tol TOL_ADAPTER_PEER_TINY_ABS)
IDS=2,15,27,100,31,7,300,450

expect_run "generate on Gemma 3n: a prompt, then 6 tokens through the KV caches" 0 "2 prompt tokens .* 6 new tokens" \
  -- "$GM" generate "$BASE" "hello world" --max-tokens 6

# the runner tests' labelled fruit notes and experiment (lib.bash), on the tiny Gemma 3n: 2 epochs,
# 2 learning rates, one seed
tiny_fixture "$SRC" 2
sed -e 's/name = "tiny"/name = "g3n"/' -e "s|tests/ref/tiny_gemma3_chat|tests/ref/tiny_gemma3n_chat|" \
    -e 's/seeds = {1, 2},/seeds = {1},/' -e 's/, checkpoint_every = 5//' tiny.lua > g3n.lua
expect_run "an experiment on Gemma 3n trains LoRA (2 trials), evaluates and writes its table" 0 \
  "trial 2/2  24 steps, final loss.*final accuracy.*written: results/g3n.md" -- "$GM" g3n.lua
# the loss falls: the last step's below the first's in each trial file
PY=""
find_python h5py
if [ -n "$PY" ]; then
  expect_run "each trial's loss falls (last step below the first) and its peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 \
    "^ok 2$" -- trials_fall_and_fit results/g3n
else
  skip_unless_ci "the trial files' loss and memory (h5py: run ./setup.sh)"
fi

# activation checkpointing (the KV-shared layers read the keys their source layer kept): the lr=1e-2
# trial again with it on gives the same loss series and adapter, bit for bit
sed -e 's/name = "g3n"/name = "g3n_ckpt"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' \
    -e 's/max_length = 64 }/max_length = 64, checkpointing = true }/' g3n.lua > g3n_ckpt.lua
expect_run "the same trial with activation checkpointing trains" 0 "written: results/g3n_ckpt.md" -- "$GM" g3n_ckpt.lua
same_ckpt_trial results/g3n results/g3n_ckpt 0.01

# the multimodal layout (Gemma3nForConditionalGeneration: the decoder below model.language_model.):
# batches of 2 notes of different lengths (padding) train; images are refused by name, before any
# trial (its vision encoder is not in gemmarun); a plan of a config without towers refuses them
sed -e 's/name = "g3n"/name = "g3n_mm"/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' \
    -e "s|tests/ref/tiny_gemma3n_chat|tests/ref/tiny_gemma3n_mm|" g3n.lua > g3n_mm.lua
expect_run "the multimodal layout trains on padded batches of 2" 0 "trial 1/1  24 steps, final loss.*written: results/g3n_mm.md" \
  -- "$GM" g3n_mm.lua
mkdir -p imgs && cp "$SRC/tests/ref/images/chelsea.png" imgs/
printf '%s\n' '{"messages": [{"role": "user", "content": [{"type": "image", "path": "imgs/chelsea.png"}, {"type": "text", "text": "What is it?"}]}, {"role": "assistant", "content": "a cat"}]}' > img.jsonl
cat > g3n_img.lua <<EOF
return experiment {
  name = "g3n_img", model = "$SRC/tests/ref/tiny_gemma3n_mm",
  task = sft { data = data.jsonl { train = "img.jsonl", test = "img.jsonl" } },
  train = { epochs = 1, batch = 1, lr = 1e-3, rank = 4, max_length = 64 },
}
EOF
expect_run "images on Gemma 3n: refused by the dry run naming the missing vision encoder" 2 \
  "the data has images \(first: .*chelsea.png\), but model .*tiny_gemma3n_mm: Gemma 3n's vision encoder \(MobileNet-V5\) is not in gemmarun yet" \
  -- "$GM" g3n_img.lua --dry-run
expect_run "plan images=1 of a Gemma3nForCausalLM folder (no towers): refused" 2 "takes no image inputs: its config has no vision tower" \
  -- "$GM" plan "$BASE" max_length=64 images=1
expect_run "... and audio" 2 "takes no audio inputs: its config has no audio tower" -- "$GM" plan "$BASE" max_length=64 audio_seconds=5

# the adapter through PEFT
expect_run "export --trial 2 as a PEFT folder: 38 modules (no k / v on the 2 KV-shared layers)" 0 \
  "38 LoRA modules, rank 4, alpha 8, as a PEFT adapter" -- "$GM" export results/g3n --trial 2 out2
MODEL=$BASE IDS=$IDS OUT=results/ours.txt ADAPTER=results/g3n TRIAL=2 "$GM" "$SRC/tests/peers/logits.lua" > /dev/null 2>&1
peers_python
if [ -z "$PEERS" ]; then
  skip_unless_ci "PEFT round trip: no Python with torch, transformers and peft (tests/peers/setup.sh installs them)"
else
  expect_run "PEFT loads it on transformers' Gemma3nForCausalLM: the same logits within $TOL" 0 \
    "ok +logits with the adapter.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$BASE" --adapter out2 --ids $IDS --ours results/ours.txt --tol "$TOL"
fi
finish
