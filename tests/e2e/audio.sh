#!/usr/bin/env bash
# End-to-end: audio through gemmarun on real speech (Debian's asterisk-core-sounds-en-wav: 8 kHz
# recordings of one speaker, their transcripts in asterisk-core-sounds-en, the CMU pronouncing
# dictionary of pocketsphinx-en-us; setup.sh installs them) with the tiny random Gemma 3n that has
# a real audio encoder (tests/ref/tiny_gemma3n_audio, make_gemma3n_audio_ref.py):
#   - generate --audio: a clip before the prompt; refused by name on a model without an audio
#     encoder, and for a file that is not audio;
#   - an sft experiment on chat JSONL with {"type": "audio"} parts: padded batches of 2 clips of
#     different lengths train, the loss falls, the trial's peak memory is within
#     TOL_PLAN_PEAK_REL of its plan (whose "audio tower" item is the encoder's own layout), and a
#     clip that is not audio rejects its example by name while the run goes on;
#   - audio data with a Gemma 3 model is refused by the dry run, naming the clip;
#   - `gemmarun plan` of the tiny model with audio_seconds: exact, with its audio tower item;
#   - LoRA on the audio encoder (audio_targets) beside the decoder's: trains; exported as a PEFT
#     folder that PeftModel applies to transformers' Gemma3nForConditionalGeneration with the same
#     logits for a prompt with a real clip (TOL_ADAPTER_PEER_TINY_ABS), the encoder's adapters
#     moving them; read back (the trial, the PEFT folder) with bit-identical logits; generate
#     --audio runs it; GGUF and merged exports, and audio_targets without audio or naming a module
#     the encoder lacks, refused by name;
#   - experiments/pronunciation.lua (data.speech + transcribe{}): trains on the real prompts and
#     reports word and phone error rates, in its table and its results file.
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
M=$SRC/tests/ref/tiny_gemma3n_audio
A=/usr/share/asterisk/sounds/en_US_f_Allison
T=/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz
if [ ! -r "$A/hello-world.wav" ] || [ ! -r "$T" ] || [ ! -r /usr/share/pocketsphinx/model/en-us/cmudict-en-us.dict ]; then
  skip_unless_ci "the real speech data (asterisk-core-sounds-en-wav, asterisk-core-sounds-en, pocketsphinx-en-us: ./setup.sh)"
  finish
  exit $?
fi

expect_run "generate --audio: the clip's 188 soft tokens in the prompt, then 6 new tokens" 0 "2[0-9][0-9] prompt tokens .* 6 new tokens" \
  -- "$GM" generate "$M" --audio "$A/hello-world.wav" "Transcribe." --max-tokens 6
echo "not audio" > bad.wav
expect_run "generate --audio with a file that is not audio: refused naming it" 2 "bad.wav: not an audio file: this looks like text" \
  -- "$GM" generate "$M" --audio bad.wav "x"
expect_run "generate --audio on a model without an audio encoder: refused" 2 "tiny_gemma3_chat: it has no audio encoder \(audio needs a checkpoint with one: Gemma 3n" \
  -- "$GM" generate "$SRC/tests/ref/tiny_gemma3_chat" --audio "$A/hello-world.wav" "x"

# chat JSONL with audio parts: 8 training clips (0.7-3.3 s) and a broken one, 4 test clips
zcat "$T" > t.txt
mkjson() {
  local n t
  for n in "$@"; do
    t=$(grep "^$n: " t.txt | sed "s/^$n: //")
    printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "%s/%s.wav"}, {"type": "text", "text": "Transcribe."}]}, {"role": "assistant", "content": "%s"}]}\n' "$A" "$n" "$t"
  done
}
mkjson activated added agent-loginok agent-pass auth-thankyou all-circuits-busy-now conf-muted conf-unmuted > train.jsonl
printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "bad.wav"}, {"type": "text", "text": "Transcribe."}]}, {"role": "assistant", "content": "nothing"}]}\n' >> train.jsonl
mkjson goodbye hello-world vm-goodbye vm-password > test.jsonl
cat > au.lua <<EOT
return experiment {
  name = "au", model = "$M",
  task = sft { data = data.jsonl { train = "train.jsonl", test = "test.jsonl" } },
  train = { epochs = 4, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 320 },
}
EOT
expect_run "an sft experiment on real clips trains (16 steps), the clip that is not audio rejected by name" 0 \
  "train.jsonl:9: .*bad.wav: not an audio file.*trial 1/1  16 steps, final loss.*written: results/au.md" -- "$GM" au.lua
PY=""
find_python h5py
if [ -n "$PY" ]; then
  expect_run "its loss falls and its peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 "^ok 1$" -- \
    trials_fall_and_fit results/au 4
else
  skip_unless_ci "the trial file's loss and memory (h5py: run ./setup.sh)"
fi
# LoRA on the audio encoder (audio_targets) beside the decoder's q_proj / v_proj
TGT="q_proj,k_proj,v_proj,post,ffw_layer_1,ffw_layer_2,linear_start,linear_end"
sed -e 's/name = "au"/name = "aua"/' -e "s/max_length = 320 }/max_length = 320, targets = \"q_proj,v_proj\", audio_targets = \"$TGT\" }/" \
    au.lua > aua.lua
expect_run "audio_targets: LoRA on the audio encoder's conformer trains beside the decoder's (16 steps)" 0 \
  "trial 1/1  16 steps, final loss.*written: results/aua.md" -- "$GM" aua.lua
expect_run "its dry run plans the encoder's adapters and records in the audio tower item" 0 "audio tower [0-9.]+ MiB" -- "$GM" aua.lua --dry-run
if [ -n "$PY" ]; then
  expect_run "its peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan" 0 "^ok$" -- "$PY" -c "
import glob, h5py, os
p = [x for x in glob.glob('results/aua/trial-*.h5') if not x.endswith('.ckpt.h5')][0]
m = h5py.File(p, 'r')['memory'].attrs
pl, r = float(m['planned_total']), float(m['measured_peak_rss'])
assert os.environ.get('GM_SANITIZE') or abs(r - pl) <= $(tol TOL_PLAN_PEAK_REL) * pl, (p, r, pl)
print('ok')"
fi
expect_run "export: a PEFT folder, the encoder's adapters in it" 0 \
  "30 LoRA modules \(20 on the audio encoder\).*Gemma3nForConditionalGeneration" -- "$GM" export results/aua aua_peft
IDS="2,431$(printf ',471%.0s' $(seq 188)),470,45,77,3"
peers_python
if [ -n "$PEERS" ]; then
  wav_16k "$A/hello-world.wav" hello16k.wav # both sides read the same samples, no resampling
  MODEL=$M IDS=$IDS OUT=results/aua.txt ADAPTER=results/aua AUDIO=hello16k.wav "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
  expect_run "PEFT applies the exported adapter to transformers' Gemma 3n with the same logits for a real clip" 0 \
    "ok    40 audio-encoder LoRA tensors.*ok    logits with the clip and the adapter.*ok    its audio-encoder adapters move" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" audio --base "$M" --adapter aua_peft --ids "$IDS" --audio hello16k.wav \
       --ours results/aua.txt --tol "$(tol TOL_ADAPTER_PEER_TINY_ABS)"
  MODEL=$M IDS=$IDS OUT=results/aua_peft.txt ADAPTER=aua_peft AUDIO=hello16k.wav "$GM" "$SRC/tests/peers/logits.lua" >/dev/null 2>&1
  expect_run "the PEFT folder read back: the trial's logits, bit for bit" 0 "^same$" -- bash -c "cmp -s results/aua.txt results/aua_peft.txt && echo same"
else
  skip_unless_ci "the PEFT round trip of the audio encoder's adapters (the peers venv: tests/peers/setup.sh)"
fi
expect_run "generate --audio with the trained adapter: its encoder's adapters run" 0 "audio encoder's included.*4 new tokens" \
  -- "$GM" generate "$M" --adapter results/aua --audio "$A/hello-world.wav" "Transcribe." --max-tokens 4
expect_run "a GGUF export of it: refused, naming the audio encoder" 2 "trained the audio encoder \(LoRA on 20 of its modules\): a llama.cpp LoRA adapter carries no audio encoder" \
  -- "$GM" export results/aua --format gguf aua.gguf
expect_run "a merged export of it: refused, not dropped" 2 "trained the audio encoder .*which a merged export does not merge yet" \
  -- "$GM" export results/aua --format merged aua_merged
printf '{"messages": [{"role": "user", "content": "T"}, {"role": "assistant", "content": "x"}]}\n' > text.jsonl
sed -e 's/name = "aua"/name = "aut"/' -e 's/train.jsonl/text.jsonl/' -e 's/test.jsonl/text.jsonl/' aua.lua > aut.lua
expect_run "audio_targets on data without audio: refused by the dry run" 2 "train.audio_targets is set, but the data has no audio" \
  -- "$GM" aut.lua --dry-run
sed -e 's/name = "aua"/name = "auc"/' -e 's/train = "train.jsonl"/train = "text.jsonl"/' aua.lua > auc.lua
expect_run "audio_targets with clips in the test data only: refused (the encoder would not learn)" 2 \
  "only the test data has audio: the audio encoder only learns from training clips" -- "$GM" auc.lua --dry-run
sed -e 's/name = "aut"/name = "aug"/' -e "s|$M|$SRC/tests/ref/tiny_gemma3_chat|" -e 's/max_length = 320/max_length = 100/' aut.lua > aug.lua
expect_run "audio_targets on a Gemma 3 model: refused, naming the model's lack" 2 "audio_targets: gemma3_text has no audio encoder to train" \
  -- "$GM" aug.lua --dry-run
# a report that names rows but no metric: the task's own (loss, for sft)
sed -e 's/name = "au"/name = "aur"/' -e 's/epochs = 4/epochs = 1/' \
    -e 's/max_length = 320 }/max_length = 320 }, sweep = grid { lr = {1e-2, 1e-3} }, report = table { rows = {"lr"} }/' au.lua > aur.lua
expect_run "a report with rows and no metric shows the task's own (loss), both trials" 0 \
  "aur: loss, final eval, single seed.*0\.001 +[0-9.]+.*0\.01 +[0-9.]+" -- "$GM" aur.lua
sed -e 's/name = "aua"/name = "aub"/' -e 's/linear_end/pos_proj/' aua.lua > aub.lua
expect_run "audio_targets naming pos_proj (derived once, not targetable): refused with the encoder's module names" 2 \
  "audio_targets.*pos_proj.*linear_start" -- "$GM" aub.lua --dry-run

expect_run "its dry run plans the audio tower (the encoder's own layout)" 0 "plan [0-9.]+ MiB \(.*audio tower [0-9.]+ MiB.*audio [0-9.]+ MiB\)" \
  -- "$GM" au.lua --dry-run
sed -e 's/name = "au"/name = "au3"/' -e "s|$M|$SRC/tests/ref/tiny_gemma3_chat|" -e 's/max_length = 320/max_length = 100/' au.lua > au3.lua
expect_run "audio data with a Gemma 3 model: refused by the dry run, naming the clip" 2 \
  "the data has audio \(first: train.jsonl:1, .*activated.wav\), but model .*tiny_gemma3_chat has no audio encoder" -- "$GM" au3.lua --dry-run
expect_run "plan with audio_seconds: exact, an audio tower item of 1 clip of 2997 frames" 0 \
  "audio tower .*1 clip of up to 2997 feature frames per micro-batch.*total .*MiB" -- "$GM" plan "$M" max_length=320 batch=1 audio_seconds=30

expect_run "plan with audio_seconds: the clip counts inside max_length (1024 of the model's 1024 positions)" 0 \
  "max_length 1024.*audio tower" -- "$GM" plan "$M" max_length=1024 batch=1 audio_seconds=30

# what a user gets wrong: audio in the model's turn; a clip over 30 s (its end unused: said)
printf '{"messages": [{"role": "user", "content": "T"}, {"role": "assistant", "content": [{"type": "audio", "path": "%s/added.wav"}, {"type": "text", "text": "x"}]}]}\n' "$A" > turn.jsonl
cat turn.jsonl train.jsonl > train2.jsonl
python3 -c "
import wave
w = wave.open('long31.wav', 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(8000)
w.writeframes(b'\\x00\\x01' * (8000 * 31)); w.close()"
printf '{"messages": [{"role": "user", "content": [{"type": "audio", "path": "long31.wav"}, {"type": "text", "text": "T"}]}, {"role": "assistant", "content": "x"}]}\n' >> train2.jsonl
sed -e 's/name = "au"/name = "au2"/' -e 's/train.jsonl/train2.jsonl/' au.lua > au2.lua
expect_run "audio in a model turn: its example refused, named; a 31 s clip: said that its first 30 s are used" 0 \
  "long31.wav is 31.0 s long; the feature extractor keeps its first 30 s.*train2.jsonl:1: message 2: an assistant turn holds an audio part; images and audio are read in user and system turns only" \
  -- "$GM" au2.lua --dry-run

sed -e 's/name = "au"/name = "au4"/' -e 's/max_length = 320/max_length = 150/' au.lua > au4.lua
expect_run "max_length cutting into every clip: the hint names a max_length that fits the clip and a response" 2 \
  "cuts into audio clip 1 .*whose tokens span positions 6\.\.195 \(its prompt: 213 tokens\).*raise max_length to at least 215" \
  -- "$GM" au4.lua --dry-run
sed -e 's/name = "au"/name = "au5"/' -e 's/max_length = 320/max_length = 215/' au.lua > au5.lua
expect_run "... and that max_length takes them" 0 "data: 8 training and 4 test examples" -- "$GM" au5.lua --dry-run

# data.speech on a folder of its own: a transcripts file with a byte-order mark, Kaldi lines (one
# with a colon in its text), a clip without a line, one with an empty text, a link back up (read once)
mkdir -p sp/sub && cp "$A/hello-world.wav" "$A/goodbye.wav" "$A/added.wav" "$A/activated.wav" sp/ && cp "$A/beep.wav" sp/sub/x.wav
ln -s .. sp/sub/up
printf '\xef\xbb\xbfhello-world Hello world.\ngoodbye Note: goodbye\nadded\nhello-world again\n' > sp.txt
cat > sp.lua <<EOT
return experiment {
  name = "sp", model = "$M",
  task = transcribe { data = data.speech { path = "sp", transcripts = "sp.txt", test = 2 }, prompt = "Transcribe." },
  train = { epochs = 1, batch = 1, lr = 1e-2, rank = 4, max_length = 320 },
}
EOT
expect_run "data.speech: a byte-order mark, Kaldi lines with a colon, a missing and an empty transcript, a repeated name, a link loop" 0 \
  "1 name is twice in sp.txt.*data.speech: 2 recordings with transcripts below sp \(3 more left out, listed below\); 1 in 2 is a test example: 1 train, 1 test.*sp/activated.wav: no transcript.*sp/added.wav: its transcript is empty.*sp/sub/x.wav: no transcript" \
  -- "$GM" sp.lua --dry-run
printf 'hello hallo\nworld W ER L D\n' > notcmu.dict
sed -e 's/name = "sp"/name = "sp2"/' -e 's/transcripts = "sp.txt"/transcripts = "sp.txt", phones = "notcmu.dict"/' sp.lua > sp2.lua
expect_run "data.speech: a phones file that is not a CMU dictionary stops the run naming its line" 2 \
  "notcmu.dict:1: 'hallo' is not a pronunciation of the CMU dictionary" -- "$GM" sp2.lua --dry-run

# the pronunciation experiment, small: 8 training and 3 test recordings
cp -r "$SRC/tests" "$TMP/" 2>/dev/null || true
expect_run "experiments/pronunciation.lua: transcription of real prompts, word and phone error rates in its tables" 0 \
  "final loss [0-9.]+, word error rate [0-9.]+%, phone error rate [0-9.]+%.*word_error_rate \(%\), final eval, single seed \[95% interval\].* [0-9.]+ \[[0-9.]+, [0-9.]+\].*the rate resampled as a ratio of sums.*phone_error_rate \(%\).*written: results/pronunciation.md" \
  -- env PRON_TRAIN=8 PRON_TEST=3 "$GM" "$SRC/experiments/pronunciation.lua" --set lr=1e-2
if [ -n "$PY" ]; then
  expect_run "its results file holds both rates, the counts they come from, and those counts per test example" 0 "^ok$" -- "$PY" -c "
import glob, h5py
p = [x for x in glob.glob('results/pronunciation/trial-*.h5') if not x.endswith('.ckpt.h5')][0]
g = h5py.File(p, 'r')['eval/final']
a = g.attrs
assert abs(a['word_error_rate'] - a['word_errors'] / a['words']) < 1e-12 and a['words'] > 0, dict(a)
assert abs(a['phone_error_rate'] - a['phone_errors'] / a['phones']) < 1e-12 and a['phones'] > a['words'], dict(a)
assert list(g['example_index'][:]) == [0, 1, 2], g['example_index'][:]
for k in ['word_errors', 'words', 'phone_errors', 'phones']:
    assert g['example_' + k][:].sum() == a[k] and (g['example_' + k][:] >= 0).all(), k
assert (g['example_words'][:] > 0).all()
print('ok')"
fi
finish
