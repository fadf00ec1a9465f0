#!/usr/bin/env bash
# Provenance of trial files (issue 14, part 1) on the tiny Gemma 3 with a tokenizer:
#   - /provenance holds the model files' sha256 (checked against sha256sum of the very files),
#     the tokenized data's sha256, the build (version, git commit), the libraries, the machine,
#     threads, device, compute dtype, the command line and the --set overrides;
#   - `gemmarun table` pools seeds only when model and data hashes agree: the same sweep point
#     run on edited data gets a row of its own, with the note saying why;
#   - a trial resumed from its checkpoint after its data changed stops with a message naming what
#     changed, instead of continuing the old run on new data.
source "$(dirname "$0")/lib.bash"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
cd "$TMP"
tiny_fixture "$SRC" 2
sed -i 's/sweep = grid { lr = {1e-2, 3e-3} },//' tiny.lua # one point, seeds 1 and 2

attr() { h5dump -a "/provenance/$2" "$1" 2>/dev/null | sed -n 's/^ *(0): *"\(.*\)"$/\1/p' | head -1; }
expect_run "trial 1 with an override" 0 "trial 1/2" -- "$GM" tiny.lua --trial 1 --set lr=0.02
f=$(ls results/tiny/trial-*.h5 | head -1)

# the model's identity from the files themselves
M="$SRC/tests/ref/tiny_gemma3_chat"
want_model=$(for n in config.json model.safetensors tokenizer.json; do printf '%s %s\n' "$n" "$(sha256sum < "$M/$n" | cut -c1-64)"; done | sha256sum | cut -c1-64)
[ "$(attr "$f" model_sha256)" = "$want_model" ] && { pass=$((pass + 1)); echo "ok    model_sha256 is the sha256 of the files' own sha256 lines (sha256sum)"; } \
  || { fail=$((fail + 1)); echo "FAIL  model_sha256 '$(attr "$f" model_sha256)' vs '$want_model'"; }
[ "$(attr "$f" model_files)" = "config.json=$(sha256sum < "$M/config.json" | cut -c1-12) model.safetensors=$(sha256sum < "$M/model.safetensors" | cut -c1-12) tokenizer.json=$(sha256sum < "$M/tokenizer.json" | cut -c1-12)" ] \
  && { pass=$((pass + 1)); echo "ok    model_files lists each file with its hash"; } || { fail=$((fail + 1)); echo "FAIL  model_files '$(attr "$f" model_files)'"; }
ok=1
for k in data_sha256 data_train_sha256 data_test_sha256; do [[ "$(attr "$f" $k)" =~ ^[0-9a-f]{64}$ ]] || { ok=0; echo "      $k: '$(attr "$f" $k)'"; }; done
[ $ok = 1 ] && { pass=$((pass + 1)); echo "ok    data hashes (train, test, both)"; } || { fail=$((fail + 1)); echo "FAIL  data hashes"; }
head=$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[[ "$(attr "$f" git_commit)" =~ ^$head(-dirty)?$ ]] && { pass=$((pass + 1)); echo "ok    git_commit $(attr "$f" git_commit) is the checkout's"; } \
  || { fail=$((fail + 1)); echo "FAIL  git_commit '$(attr "$f" git_commit)' vs HEAD $head"; }
[[ "$(attr "$f" command_line)" == *"tiny.lua --trial 1 --set lr=0.02" ]] && [ "$(attr "$f" set_overrides_json)" = '["lr=0.02"]' ] \
  && { pass=$((pass + 1)); echo "ok    the command line and the --set overrides"; } \
  || { fail=$((fail + 1)); echo "FAIL  command line '$(attr "$f" command_line)', overrides '$(attr "$f" set_overrides_json)'"; }
ok=1
for k in gemmarun_version compiler blas hdf5 lua cjson libc cpu; do [ -n "$(attr "$f" $k)" ] && [ "$(attr "$f" $k)" != unknown ] || { ok=0; echo "      $k: '$(attr "$f" $k)'"; }; done
# compute = "auto": f32 on the CPU unless it multiplies bf16 faster (kernels.h, gm_k_cpu_bf16_auto), as --version says
auto_dtype=$("$GM" --version | sed -n 's/.*compute = "auto" trains in \([a-z0-9]*\).*/\1/p')
[ "$(attr "$f" threads)" = 2 ] && [ "$(attr "$f" device)" = cpu ] && [ -n "$auto_dtype" ] && [ "$(attr "$f" compute_dtype)" = "$auto_dtype" ] || ok=0
[[ "$(attr "$f" hdf5)" =~ ^1\.[0-9]+\.[0-9]+$ ]] && [[ "$(attr "$f" blas)" == OpenBLAS* ]] && [[ "$(attr "$f" lua)" == "Lua 5.4"* ]] || ok=0
[ $ok = 1 ] && { pass=$((pass + 1)); echo "ok    build, libraries ($(attr "$f" blas | cut -d' ' -f1-2), HDF5 $(attr "$f" hdf5), $(attr "$f" lua)), cpu, threads, device, dtype"; } \
  || { fail=$((fail + 1)); echo "FAIL  build and machine fields"; }

# ---- pooling: same data pools, edited data splits ----------------------------------------------
expect_run "trial 2 on the same data" 0 "trial 2/2" -- "$GM" tiny.lua --trial 2 --set lr=0.02
out=$("$GM" table results/tiny 2>&1)
printf '%s' "$out" | grep -q "mean ± std over 2 seeds" && ! printf '%s' "$out" | grep -q "split by" \
  && { pass=$((pass + 1)); echo "ok    same model and data: the two seeds pool"; } || { fail=$((fail + 1)); echo "FAIL  same data did not pool:"; printf '%s\n' "$out" | head; }
mkdir edited && cp -r data tiny.lua edited/
cd edited
mkdir -p results/tiny && cp ../"$f" results/tiny/ # trial 1 as run on the original data
echo "a short note 1 about the apple, edited" > data/apple/1.txt
expect_run "trial 2 on edited data" 0 "trial 2/2" -- "$GM" tiny.lua --trial 2 --set lr=0.02
expect_run "a kept trial trained on other data says so" 0 "trial 1/2  [0-9a-f]+  seed=1: done \(kept; trained on other data than the data set now: sha256 [0-9a-f]{12}\.\.\. then, [0-9a-f]{12}\.\.\. now; delete results/tiny/trial-[0-9a-f]+\.h5 to run it again\).*trial 2/2  [0-9a-f]+  seed=2: done \(kept\)" -- "$GM" tiny.lua --set lr=0.02
out=$("$GM" table results/tiny 2>&1)
printf '%s' "$out" | grep -q "Rows also split by data_sha256" \
  && { pass=$((pass + 1)); echo "ok    edited data: the seeds are not pooled, and the note says data_sha256"; } \
  || { fail=$((fail + 1)); echo "FAIL  edited data was pooled:"; printf '%s\n' "$out" | head -12; }
cd ..

# ---- resuming on changed data --------------------------------------------------------------------
mkdir resume && cp -r data tiny.lua resume/
cd resume
EPOCHS=200 "$GM" tiny.lua --trial 1 > run1.log 2>&1 &
pid=$!
for i in $(seq 1 3000); do grep -q "step 12/" run1.log && break; sleep 0.1; done
kill -INT $pid
wait $pid
echo "a short note 1 about the apple, edited" > data/apple/1.txt
expect_run "a trial resumed after its data changed stops and says what changed" 1 \
  "FAILED: the data \(as tokenized\) changed since this trial started \(sha256 [0-9a-f]{12}\.\.\. then, [0-9a-f]{12}\.\.\. now\): its checkpoint belongs to the old ones; restore them, or delete results/tiny/trial-[0-9a-f]+\.ckpt\.h5 to start this trial over" \
  -- env EPOCHS=200 "$GM" tiny.lua --trial 1
cd ..

finish
