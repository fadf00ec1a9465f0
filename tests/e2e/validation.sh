# End-to-end: validation-based model selection and early stopping (issue 14, part 3) on the tiny
# Gemma 3, a small chat (sft) task whose validation loss falls, then wobbles as it overfits.
#
#   - validation = {split = 0.25, eval_steps = 4, select = "best"}: the loss on the carved-out
#     validation set is logged every 4 steps (val_loss; NaN between), the final test evaluation
#     and the stored adapter are those of the step with the lowest validation loss (selected_step =
#     argmin, checked with h5py), and that adapter equals, bit for bit, the adapter of the same
#     trial trained with select = "last" and max_steps = that step;
#   - patience = 1: training stops at the first evaluation without improvement (the step named,
#     the series that long);
#   - validation = {data = ...}: a file of its own; the validation curve is drawn;
#   - bad validation settings are refused with the field and what it must be.
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
find_python "h5py, numpy"
if [ -z "$PY" ]; then
  skip_unless_ci "validation (the checks read the trial files with h5py: run ./setup.sh)"
  finish
fi
fruit() { case $(($1 % 3)) in 0) echo apple ;; 1) echo berry ;; *) echo cherry ;; esac; }
for i in $(seq 1 40); do
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"Which fruit is number $i?\"}, {\"role\": \"assistant\", \"content\": \"Fruit $((i % 3)) is $(fruit $i)\"}]}"
done > chat.jsonl
mk() { # NAME TRAIN-EXTRA VALIDATION
  cat > "$1.lua" <<EOF
return experiment {
  name = "$1",
  model = "$SRC/tests/ref/tiny_gemma3_chat",
  task = sft { data = data.jsonl { train = "chat.jsonl", test_fraction = 0.2 } },
  train = { epochs = 4, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64, schedule = "constant", warmup = 0 $2 },
  seeds = {1},
  validation = $3,
}
EOF
}
mk best "" '{ split = 0.25, eval_steps = 4, select = "best" }'
expect_run "select = best: the best step's adapter is selected" 0 "selected the adapter of step [0-9]+ \(val_loss [0-9.]+\).*final loss" -- "$GM" best.lua
step=$("$PY" -c "
import glob, h5py, numpy as np
f = h5py.File(glob.glob('results/best/trial-*.h5')[0], 'r')
v, s = f['metrics/val_loss'][:], f['metrics/step'][:]
ev = ~np.isnan(v)
assert list(s[ev]) == list(range(4, 49, 4)), s[ev]          # every 4 steps, NaN between
best = int(s[ev][np.argmin(v[ev])])
a = f['eval/final'].attrs
assert int(a['selected_step']) == best == int(a['best_step']), (dict(a), best)
assert abs(a['best_val_loss'] - np.nanmin(v)) == 0
print(best)" 2>&1)
expect_run "val_loss every 4 steps; selected_step = argmin of val_loss ($step)" 0 "^[0-9]+$" -- echo "$step"
if [[ "$step" =~ ^[0-9]+$ ]]; then
  [ "$step" -lt 48 ] && [ "$step" -gt 4 ] && { pass=$((pass + 1)); echo "ok    the best step ($step) is neither the first evaluation nor the last step"; } \
    || { fail=$((fail + 1)); echo "FAIL  the best step $step does not test selection"; }
  mk last ", max_steps = $step" '{ split = 0.25, eval_steps = 4, select = "last" }'
  expect_run "the same trial stopped at step $step" 0 "final loss" -- "$GM" last.lua
  expect_run "the selected adapter equals the step-$step adapter, bit for bit" 0 "^[0-9]+ tensors equal$" -- "$PY" -c "
import glob, h5py, numpy as np
a = h5py.File(glob.glob('results/best/trial-*.h5')[0], 'r')['adapter']
b = h5py.File(glob.glob('results/last/trial-*.h5')[0], 'r')['adapter']
assert sorted(a) == sorted(b) and len(a) > 0
for k in a: assert np.array_equal(a[k][:], b[k][:]), k
print(len(a), 'tensors equal')"
fi
expect_run "the validation curve is drawn" 0 "best_validation\.png" -- ls results
# reproduce checks the validation set too: line 4 of chat.jsonl is a validation example (split 0.25)
cp chat.jsonl chat.bak
sed -i '4s/Fruit/Frut/' chat.jsonl
expect_run "reproduce: an edited validation example is refused (exit 2)" 2 \
  "cannot reproduce: the validation data \(as tokenized\): sha256 [0-9a-f]{12}\.\.\. stored, [0-9a-f]{12}\.\.\. now" -- "$GM" reproduce results/best
cp chat.bak chat.jsonl

# early stopping: the first evaluation without improvement ends training
mk stop "" '{ split = 0.25, eval_steps = 4, patience = 1 }'
out=$("$GM" stop.lua 2>&1)
at=$(printf '%s' "$out" | sed -n 's/.*early stopping at step \([0-9]*\) of 48: no better val_loss (lower) in 1 evaluation.*/\1/p')
expect_run "patience = 1: stopped early, naming the step" 0 "^[0-9]+$" -- echo "$at"
expect_run "the series end at that step" 0 "^ok$" -- "$PY" -c "
import glob, h5py, numpy as np
f = h5py.File(glob.glob('results/stop/trial-*.h5')[0], 'r')
s, v = f['metrics/step'][:], f['metrics/val_loss'][:]
ev = v[~np.isnan(v)]
assert int(s[-1]) == $at and len(s) == $at, (s[-1], len(s))
assert ev[-1] >= ev[:-1].min() and all(np.diff(ev[:-1]) < 0), ev   # improved until the last one
print('ok')"

# a validation file of its own
head -8 chat.jsonl > val.jsonl
mk file ", epochs = 1" '{ data = data.jsonl { train = "val.jsonl" }, eval_steps = 100 }'
expect_run "validation.data: a file of its own" 0 "final loss" -- "$GM" file.lua
expect_run "its hash in the provenance, its loss at the last step" 0 "^8 ok$" -- "$PY" -c "
import glob, h5py, numpy as np
f = h5py.File(glob.glob('results/file/trial-*.h5')[0], 'r')
assert len(f['provenance'].attrs['data_validation_sha256']) == 64
v = f['metrics/val_loss'][:]
assert np.isnan(v[:-1]).all() and np.isfinite(v[-1])
print(8, 'ok')"

# bad settings
bad() { mk bad "" "$2"; expect_run "invalid: $1" 2 "$3" -- "$GM" bad.lua --dry-run; }
bad "split out of range" '{ split = 0.7 }' "validation.split = 0.7: must be a fraction of the training data in \(0, 0.5\]"
bad "split and data" '{ split = 0.1, data = data.jsonl { train = "val.jsonl" } }' "validation needs either split .* or data"
bad "unknown key" '{ split = 0.1, patiense = 2 }' "validation: unknown key 'patiense' \(did you mean 'patience'\?\)"
bad "select" '{ split = 0.1, select = "first" }' "validation.select = first: allowed values are last .*, best"
bad "metric" '{ split = 0.1, metric = "accuracy" }' "validation.metric = accuracy: sft\{\} trials are validated on loss"
bad "eval_steps" '{ split = 0.1, eval_steps = 0 }' "validation.eval_steps = 0: must be a positive integer"
bad "split as text" '{ split = "0.2" }' "validation.split = 0.2 \(a string\): must be a number"
bad "a labelled folder for a chat task" '{ data = data.folder { root = "." } }' "validation.data: sft\{\} validates on chat conversations \(data.jsonl\{...\}\), not data.folder"
finish
