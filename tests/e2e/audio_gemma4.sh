#!/usr/bin/env bash
# End-to-end: audio through gemmarun on a Gemma 4 (the tiny random Gemma4ForConditionalGeneration
# with an audio tower of tests/ref/tiny_gemma4_audio, make_gemma4_audio_ref.py) on real speech
# (Debian's asterisk-core-sounds-en-wav, as tests/e2e/audio.sh):
#   - generate --audio: the clip's own count of soft tokens (hello-world.wav: 1.4 s, 35 tokens at
#     one per 40 ms) between <|audio> and <audio|>;
#   - an sft experiment on chat JSONL with {"type": "audio"} parts, LoRA on the decoder and inside
#     the audio tower's clipped linears (audio_targets = "all-linear"): clips of different lengths
#     (each example its own token count), the loss falls, the trial's peak memory within
#     TOL_PLAN_PEAK_REL of its plan, whose "audio tower" item is the encoder's own layout;
#   - exported as a PEFT folder that PeftModel applies to transformers' Gemma4ForConditionalGeneration
#     with the same logits for a prompt with a real clip (TOL_ADAPTER_PEER_TINY_ABS), the tower's
#     adapters moving them;
#   - generate with the trained adapter, from the trial and from its PEFT folder;
#   - the shortest clips: one under Gemma 4's first frame refused by name, one just over it kept; a
#     31 s clip whose example max_length rejects does not size the trial's audio path;
#   - audio_targets naming a clipped linear's wrapper (q_proj): refused, naming q_proj.linear;
#   - `gemmarun plan` of the E2B preset with audio_seconds: exact, with its audio tower item.
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
M=$SRC/tests/ref/tiny_gemma4_audio
A=/usr/share/asterisk/sounds/en_US_f_Allison
T=/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz
if [ ! -r "$A/hello-world.wav" ] || [ ! -r "$T" ]; then
  skip_unless_ci "the real speech data (asterisk-core-sounds-en-wav, asterisk-core-sounds-en: ./setup.sh)"
  finish
  exit $?
fi

# BOS, <|audio>, 35 x <|audio|>, <audio|>, "Transcribe." (8 tokens of the tiny tokenizer)
expect_run "generate --audio on Gemma 4: the clip's 35 soft tokens (1.4 s at 40 ms each) in the prompt, then 6 new tokens" 0 \
  "46 prompt tokens .* 6 new tokens" -- "$GM" generate "$M" --audio "$A/hello-world.wav" "Transcribe." --max-tokens 6
expect_run "... a shorter clip takes fewer (vm-goodbye.wav: 0.9 s, 22 tokens)" 0 "33 prompt tokens .* 2 new tokens" \
  -- "$GM" generate "$M" --audio "$A/vm-goodbye.wav" "Transcribe." --max-tokens 2

zcat "$T" > t.txt
mkjson() {
  local n t
  for n in "$@"; do
    t=$(grep "^$n: " t.txt | sed "s/^$n: //")
    printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "%s/%s.wav"}, {"type": "text", "text": "Transcribe."}]}, {"role": "assistant", "content": "%s"}]}\n' "$A" "$n" "$t"
  done
}
mkjson activated added agent-loginok agent-pass auth-thankyou all-circuits-busy-now conf-muted conf-unmuted > train.jsonl
mkjson goodbye hello-world vm-goodbye vm-password > test.jsonl
cat > g4a.lua <<EOT
return experiment {
  name = "g4a", model = "$M",
  task = sft { data = data.jsonl { train = "train.jsonl", test = "test.jsonl" } },
  train = { epochs = 4, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 128, audio_targets = "all-linear" },
}
EOT
expect_run "its dry run plans the audio tower exactly (the encoder's own layout, its adapters)" 0 \
  "plan [0-9.]+ MiB \(.*audio tower [0-9.]+ MiB.*audio [0-9.]+ MiB\)" -- "$GM" g4a.lua --dry-run
expect_run "an sft experiment on real clips with LoRA inside the audio tower's clamps trains (16 steps)" 0 \
  "trial 1/1  16 steps, final loss.*written: results/g4a.md" -- "$GM" g4a.lua
PY=""
find_python h5py
if [ -n "$PY" ]; then
  expect_run "its loss falls and its peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 "^ok 1$" -- \
    trials_fall_and_fit results/g4a 4
else
  skip_unless_ci "the trial file's loss and memory (h5py: run ./setup.sh)"
fi
expect_run "export: a PEFT folder, the tower's adapters in it" 0 \
  "LoRA modules \(20 on the audio encoder\).*Gemma4ForConditionalGeneration" -- "$GM" export results/g4a g4a_peft
IDS="2,506$(printf ',508%.0s' $(seq 35)),507,45,77,3"
peers_python
if [ -n "$PEERS" ]; then
  wav_16k "$A/hello-world.wav" hello16k.wav # both sides read the same samples, no resampling
  MODEL=$M IDS=$IDS OUT=results/g4a.txt ADAPTER=results/g4a AUDIO=hello16k.wav "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
  expect_run "PEFT applies the exported adapter to transformers' Gemma 4 with the same logits for a real clip" 0 \
    "ok    40 audio-encoder LoRA tensors.*ok    logits with the clip and the adapter.*ok    its audio-encoder adapters move" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" audio --base "$M" --adapter g4a_peft --ids "$IDS" --audio hello16k.wav \
       --ours results/g4a.txt --tol "$(tol TOL_ADAPTER_PEER_TINY_ABS)"
else
  skip_unless_ci "the PEFT round trip of the audio tower's adapters (the peers venv: tests/peers/setup.sh)"
fi
expect_run "generate --audio with the trained adapter: its tower's adapters run" 0 "audio encoder's included.*46 prompt tokens .* [1-4] new tokens" \
  -- "$GM" generate "$M" --adapter results/g4a --audio "$A/hello-world.wav" "Transcribe." --max-tokens 4
expect_run "... and with its PEFT export read back (the tower's layers.N modules)" 0 "58 modules \(audio encoder's included\).*46 prompt tokens" \
  -- "$GM" generate "$M" --adapter g4a_peft --audio "$A/hello-world.wav" "Transcribe." --max-tokens 1
# the shortest clips: Gemma 4's extractor gives 161 samples (10 ms) a frame and a soft token, 160 none
"${PY:-python3}" -c "
import struct, wave
for n in (100, 200):
    o = wave.open('s%d.wav' % n, 'wb'); o.setnchannels(1); o.setsampwidth(2); o.setframerate(16000)
    o.writeframes(struct.pack('<%dh' % n, *[(k * 997) % 8000 for k in range(n)])); o.close()"
expect_run "a 100-sample clip beside a real one: refused by name (it would take no soft token), not dropped" 2 \
  "s100.wav: 100 samples at 16 kHz .*shorter than the feature extractor's first frame \(161 samples\)" \
  -- "$GM" generate "$M" --audio "$A/hello-world.wav" --audio s100.wav "x"
(head -1 test.jsonl; printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "s200.wav"}, {"type": "text", "text": "T."}]}, {"role": "assistant", "content": "hi"}]}\n') > test2.jsonl
sed -e 's/name = "g4a"/name = "g4s"/' -e 's/test = "test.jsonl"/test = "test2.jsonl"/' g4a.lua > g4s.lua
expect_run "a 200-sample clip (12.5 ms: one soft token on Gemma 4, none on Gemma 3n) kept in a Gemma 4 data set" 0 \
  "data: 8 training and 2 test examples" -- "$GM" g4s.lua --dry-run
# a 31 s clip whose example max_length rejects: the run goes on, and its trial's audio path is sized for
# the clips it kept (2-digit MiB; sized for the 31 s clip it planned about 260)
"${PY:-python3}" -c "
import struct, wave
o = wave.open('long31.wav', 'wb'); o.setnchannels(1); o.setsampwidth(2); o.setframerate(16000)
o.writeframes(struct.pack('<%dh' % (31 * 16000), *[(k * 997) % 8000 for k in range(31 * 16000)])); o.close()"
(cat train.jsonl; printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "long31.wav"}, {"type": "text", "text": "T."}]}, {"role": "assistant", "content": "hi"}]}\n') > train3.jsonl
sed -e 's/name = "g4a"/name = "g4l"/' -e 's/train = "train.jsonl"/train = "train3.jsonl"/' -e 's/epochs = 4/epochs = 1/' g4a.lua > g4l.lua
expect_run "a clip max_length rejects: named, the run goes on" 0 \
  "1 examples rejected .*train3.jsonl:9: max_length = 128 cuts into audio clip 1.*written: results/g4l.md" -- "$GM" g4l.lua
if [ -n "$PY" ]; then
  expect_run "... and the trial's audio path is sized for the clips kept (its plan under 100 MiB)" 0 "^ok$" -- "$PY" -c "
import glob, h5py
p = [x for x in glob.glob('results/g4l/trial-*.h5') if not x.endswith('.ckpt.h5')][0]
pl = float(h5py.File(p, 'r')['memory'].attrs['planned_total'])
assert pl < 100 * 2**20, pl
print('ok')"
fi
sed -e 's/name = "g4a"/name = "g4q"/' -e 's/audio_targets = "all-linear"/audio_targets = "q_proj"/' g4a.lua > g4q.lua
expect_run "audio_targets naming a clipped linear's wrapper: refused, naming the inner module" 2 \
  "q_proj.*bypass the clamps.*q_proj.linear" -- "$GM" g4q.lua --dry-run
expect_run "gemmarun plan gemma4-e2b with 30 s of audio: exact, its audio tower item" 0 \
  "audio tower +[0-9.]+ MiB +\(8 clips of up to 2999 feature frames per micro-batch: weights bf16" -- "$GM" plan gemma4-e2b audio_seconds=30 max_length=1024
finish
