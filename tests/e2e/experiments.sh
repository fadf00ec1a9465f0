#!/usr/bin/env bash
# The experiment runner end to end on the tiny random Gemma 3 with a tokenizer
# (tests/ref/tiny_gemma3_chat) and a small labelled folder of text files:
#   - validation: a table of bad experiment files, each with the error it must give (exit 2);
#   - data.folder: files below a label's subfolders count for it; `labels` picks and orders labels;
#   - sweep expansion (--dry-run), --set overrides, --trial;
#   - a full sweep, the rerun that keeps finished trials, `gemmarun table` from the stored files;
#   - a trial that fails (NaN) while the others complete (exit 1);
#   - kill -9 in the middle of a trial: the finished trial's file is untouched, the interrupted
#     one resumes from its checkpoint and ends bit-identical (loss, lr and grad-norm series,
#     every adapter tensor, the final evaluation) to the same trial run without interruption;
#     Ctrl-C checkpoints and exits cleanly;
#   - a runner trial's measured peak memory is within 5% of its plan.
set -u
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
tiny_fixture "$SRC" 2

# ---- validation: bad file -> the error it gives -------------------------------------------
bad() { # NAME PATTERN SED-EXPRESSION
  sed "$3" tiny.lua > bad.lua
  expect_run "invalid: $1" 2 "$2" -- "$GM" bad.lua
}
bad "unknown top-level key" "bad.lua:8: experiment: unknown key 'modle' \(did you mean 'model'\?\) \(allowed: name, model," 's/  seeds = {1, 2},/  seeds = {1, 2}, modle = 1,/'
bad "unknown training key" "bad.lua:5: train.rnak: unknown key \(did you mean 'rank'\?\) \(allowed: alpha, audio_targets, batch," 's/rank = 4,/rnak = 4,/'
bad "wrong type" "bad.lua:5: train.lr = \"fast\" \(a string\): must be a number >= 0" 's/lr = 1e-2, rank/lr = "fast", rank/'
bad "rank 0" "bad.lua:5: train.rank = 0: must be an integer 1..4096" 's/rank = 4,/rank = 0,/'
bad "negative lr in the sweep" "bad.lua:7: train.lr = -0.003: must be a number >= 0" 's/lr = {1e-2, 3e-3}/lr = {1e-2, -3e-3}/'
bad "unknown quant" "train.quant = nf5: allowed values are stored, gguf, f32, bf16, nf4, int8" 's/rank = 4,/rank = 4, quant = "nf5",/'
bad "dropout out of range" "train.dropout = 1: must be a number >= 0 and < 1" 's/rank = 4,/rank = 4, dropout = 1,/'
bad "unknown sweep key" "bad.lua:7: grid: unknown key 'rnak' \(did you mean 'rank'\?\) \(sweepable: model, alpha" 's/sweep = grid { lr = {1e-2, 3e-3} }/sweep = grid { rnak = {4} }/'
bad "seeds not a list" "experiment.seeds must be a list of integers" 's/seeds = {1, 2},/seeds = 3,/'
bad "bad name" "experiment.name = tiny run: must be a name" 's/name = "tiny"/name = "tiny run"/'
bad "max_length too short for the prompt" "bad.lua:1: train.max_length = 16 leaves no room for any training response: the shortest training prompt takes [0-9]+ tokens; raise max_length to at least" 's/max_length = 64/max_length = 16/'
expect_run "invalid: max_length too short, in the dry run" 2 "train.max_length = 16 leaves no room for any training response" -- "$GM" bad.lua --dry-run
# the hint is enough: the suggested max_length keeps the shortest training example
hint=$("$GM" bad.lua --dry-run 2>&1 | sed -n 's/.*raise max_length to at least \([0-9]*\).*/\1/p')
expect_run "the suggested max_length ($hint) is accepted" 0 "trial  4 .* plan [0-9.]+ MiB" -- "$GM" bad.lua --dry-run --set max_length="$hint"
bad "bad memory_limit" "memory_limit = \"lots\": expected a number with a unit" 's/  seeds = {1, 2},/  seeds = {1, 2}, memory_limit = "lots",/'
bad "missing data folder" "data.folder: nowhere is not a folder" 's/root = "data"/root = "nowhere"/'
bad "syntax error" "bad.lua:[0-9]+:" 's/return experiment {/return experiment {{/'
bad "classify on chat data" "classify\{\} needs labelled examples .*data.jsonl holds chat conversations: use it with sft" 's/data.folder { root = "data" }/data.jsonl { train = "chat.jsonl" }/'
bad "sft on labelled data" "sft\{\} trains on chat conversations .*use it with classify" 's/task = classify { data = data.folder { root = "data" }, prompt = "Which fruit?" }/task = sft { data = data.folder { root = "data" } }/'
bad "report row that is not a field" "table.rows: 'rnak' is not a field \(did you mean 'rank'\?\)" 's/rows = {"lr"}/rows = {"rnak"}/'
bad "report metric typo" "table.metric = acurracy: classify\{\} trials record accuracy, loss, .*\(did you mean 'accuracy'\?\)" 's/metric = "accuracy"/metric = "acurracy"/'
bad "fit without memory_limit" "experiment.fit = true needs a memory_limit" 's/  seeds = {1, 2},/  seeds = {1, 2}, fit = true,/'
mkdir -p one/only && echo "just one label" > one/only/1.txt && echo "and another" > one/only/2.txt
bad "one label only" "classify\{\} needs at least 2 labels; the data set has 1 \(only\)" 's/root = "data"/root = "one"/'
mkdir -p split/train/a split/train/b split/test/a split/test/b
for lab in a b; do echo "short $lab" > split/train/$lab/1.txt; head -c 400 /dev/zero | tr '\0' 'x' | sed 's/x/word /g' > split/test/$lab/1.txt; done
bad "no test example fits max_length" "train.max_length = 64 leaves no room for any test response: the shortest test prompt takes [0-9]+ tokens" 's/root = "data"/root = "split"/'
bad "a layer the model does not have" "train.layers: 99 is not a layer of .*tiny_gemma3_chat \(it has [0-9]+: 0\.\.[0-9]+\)" 's/rank = 4,/rank = 4, layers = {0, 99},/'
bad "a layer listed twice" "train.layers: 0 is listed twice" 's/rank = 4,/rank = 4, layers = {0, 0},/'
bad "a seed listed twice" "experiment.seeds: 1 is listed twice" 's/seeds = {1, 2},/seeds = {1, 1},/'
bad "infinite lr" "train.lr = inf: must be a finite number" 's/lr = 1e-2, rank/lr = math.huge, rank/'
mkdir -p withempty/a withempty/b withempty/empty && for lab in a b; do for i in 1 2 3 4 5; do echo "note $i $lab" > withempty/$lab/$i.txt; done; done
bad "an empty label folder" "data.folder: withempty/empty \(label 'empty'\) has no text file" 's/root = "data"/root = "withempty"/'
# a file anywhere below a label folder counts for it; labels keeps and orders label folders
cp -r data nested && mkdir -p nested/apple/more/older && echo "an older note about the apple" > nested/apple/more/older/11.txt
sed 's/root = "data"/root = "nested"/; s/name = "tiny"/name = "nested"/' tiny.lua > nested.lua
expect_run "data.folder: a file in a folder below a label counts for it (apple 9 + 2 test)" 0 \
  "data.folder: nested: examples per label \(train/test, every 5th of a label's is a test example\): apple 9/2, berry 8/2, cherry 8/2" -- "$GM" nested.lua --dry-run
sed 's/root = "nested"/root = "nested", labels = { "cherry", "apple" }/' nested.lua > nested2.lua
expect_run "data.folder: labels keeps those folders, in that order; the other named" 0 \
  "cherry 8/2, apple 9/2;.*left out: label folders not in labels: berry.*data: 17 training and 4 test examples, labels cherry, apple" -- "$GM" nested2.lua --dry-run
expect_run "invalid: a list for one value" 2 "--set lr=1e-4,2e-4: train.lr = \{0.0001, 0.0002\}: must be a number >= 0 \(one value; to try several, sweep it" -- "$GM" tiny.lua --set lr=1e-4,2e-4 --dry-run
expect_run "a built-in size plans in the dry run, with a note" 0 "note: model gemma3-1b is a built-in size .*trial  1 .* plan [0-9.]+ GiB" -- "$GM" tiny.lua --set model=gemma3-1b --dry-run
expect_run "invalid: a built-in size cannot train" 2 "--set model=gemma3-1b: model gemma3-1b is a built-in size .* training needs its weights" -- "$GM" tiny.lua --set model=gemma3-1b --trial 1
bad "a grid value listed twice (1e-2 and 0.01: one trial id)" "bad.lua:7: trials 1 and 5 are the same trial \(lr=0.01 seed=1\): a value is listed twice in the sweep" 's/lr = {1e-2, 3e-3}/lr = {1e-2, 3e-3, 0.01}/'
sed 's/max_length = 64,/max_length = 64, layers = {3},/' tiny.lua > tinyl.lua
l1=$("$GM" tiny.lua --dry-run --set layers=3 2>&1 | grep ' trial '); l2=$("$GM" tinyl.lua --dry-run 2>&1 | grep ' trial ')
[ -n "$l1" ] && [ "$l1" = "$l2" ] && { pass=$((pass + 1)); echo "ok    --set layers=3 is the list {3} (the same trials as layers = {3} in the file)"; } \
  || { fail=$((fail + 1)); echo "FAIL  --set layers=3: $l1 / $l2"; }
sed 's/sweep = grid { lr = {1e-2, 3e-3} }/sweep = random { n = 6, lr = {1e-2, 3e-3} }/' tiny.lua > rnd2.lua
expect_run "a random search that draws a point twice runs it once, and says so" 0 \
  "note: the random search drew some points more than once: each distinct trial runs once \(4 trials, not 12\).*trial  4  [0-9a-f]{12}  lr=" -- "$GM" rnd2.lua --dry-run
bad "results outside results/" 'experiment.results = "/tmp/elsewhere": must be results or a folder under it' 's/  seeds = {1, 2},/  seeds = {1, 2}, results = "\/tmp\/elsewhere",/'
bad "an empty layer list" "train.layers is empty" 's/rank = 4,/rank = 4, layers = {},/'
bad "labels given that miss a data label" "classify.labels: the data has label 'cherry', which is not among the labels given \(apple, berry\)" 's/prompt = "Which fruit?"/prompt = "Which fruit?", labels = {"apple", "berry"}/'
bad "a label given without data" "classify.labels: 'durian' has no example in the data" 's/prompt = "Which fruit?"/prompt = "Which fruit?", labels = {"apple", "berry", "cherry", "durian"}/'
sed 's/prompt = "Which fruit?"/prompt = "Which fruit?", labels = {"cherry", "apple", "berry"}/' tiny.lua > relabel.lua
expect_run "labels given in another order are matched by name" 0 "labels cherry, apple, berry" -- "$GM" relabel.lua --dry-run
mkdir -p samefirst/cat samefirst/category && for lab in cat category; do for i in 1 2 3 4 5; do echo "note $i $lab" > samefirst/$lab/$i.txt; done; done
sed 's/root = "data"/root = "samefirst"/; s/name = "tiny"/name = "samefirst"/' tiny.lua > samefirst.lua
expect_run "labels with the same first token: a note, then each whole label is scored" 0 "note: labels 'cat' and 'category' start with the same token: evaluation scores each whole label.*final accuracy" -- "$GM" samefirst.lua --trial 1
{ for i in 1 2 3 4 5 6 7 8 9 10; do echo '{"messages": [{"role": "user", "content": "say '$i'"}, {"role": "assistant", "content": "'$i'"}]}'; done
  echo '{"messages": [{"role": "user", "content": "no answer"}]}'
  echo '{"messages": []}'
  echo '{"messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "x"}]}'; } > mixed.jsonl
sed 's/task = classify { data = data.folder { root = "data" }, prompt = "Which fruit?" }/task = sft { data = data.jsonl { train = "mixed.jsonl" } }/; s/metric = "accuracy"/metric = "loss"/' tiny.lua > sftmixed.lua
expect_run "bad conversations are rejected with their line, the rest run" 0 "warning: 3 examples rejected while reading:.*mixed.jsonl:11: the conversation does not end with an assistant turn" -- "$GM" sftmixed.lua --dry-run
expect_run "invalid: a file returning a plain table" 2 "t.lua returns a table that is not an experiment" -- bash -c "echo 'return {name = \"x\"}' > t.lua; '$GM' t.lua"
sed 's/^return experiment/local e = experiment/' tiny.lua > noreturn.lua
expect_run "invalid: an experiment built but not returned" 2 "noreturn.lua builds experiment\{...\} but does not return it" -- "$GM" noreturn.lua
expect_run "invalid: a file returning something else" 2 "r42.lua returns a number, not an experiment" -- bash -c "echo 'return 42' > r42.lua; '$GM' r42.lua"
expect_run "invalid: --dry-run on a plain script" 2 "empty.lua: --dry-run, --trial, --set and --no-tables need an experiment file" -- bash -c ": > empty.lua; '$GM' empty.lua --dry-run"
expect_run "invalid: missing model (--set), in the dry run" 2 "--set model=/nope: model /nope: " -- "$GM" tiny.lua --set model=/nope --dry-run
expect_run "invalid: max_length beyond the model's positions, in the dry run" 2 "--set max_length=100000: train.max_length = 100000: .* has [0-9]+ positions; use at most" -- "$GM" tiny.lua --set max_length=100000 --dry-run
expect_run "invalid: a --set value names --set" 2 "--set quant=nf5: train.quant = nf5: allowed values" -- "$GM" tiny.lua --set quant=nf5 --dry-run
expect_run "invalid: unknown --set key" 2 "--set colour=red: unknown key 'colour'" -- "$GM" tiny.lua --set colour=red --dry-run
expect_run "invalid: --trial out of range" 2 "--trial 9: the experiment has trials 1..4" -- "$GM" tiny.lua --trial 9 --dry-run
expect_run "os.execute in an experiment file (exit 2: bad file)" 2 "x.lua:1: os.execute is not allowed" -- bash -c "printf 'os.execute(\"true\")\n' > x.lua; '$GM' x.lua"

# ---- expansion ------------------------------------------------------------------------------
expect_run "dry run lists 4 trials with plans" 0 "4 trials \(sweep over lr x 2 seeds\).*trial  4 .* lr=0.003 seed=2  plan [0-9.]+ MiB" -- "$GM" tiny.lua --dry-run
expect_run "--set replaces a swept field" 0 "2 trials \(2 seeds\).*trial  2 " -- "$GM" tiny.lua --dry-run --set lr=0.05
out1=$("$GM" tiny.lua --dry-run --set seeds=7 2>&1); out2=$("$GM" tiny.lua --dry-run --set seeds=7 2>&1)
[ "$out1" = "$out2" ] && echo "$out1" | grep -q "seed=7" && { pass=$((pass + 1)); echo "ok    trial ids are stable"; } \
  || { fail=$((fail + 1)); echo "FAIL  dry runs differ or --set seeds was ignored"; }
sed 's/sweep = grid { lr = {1e-2, 3e-3} }/sweep = random { n = 5, seed = 3, lr = log_uniform(1e-4, 1e-2), rank = {2, 4, 8} }/' tiny.lua > rnd.lua
r1=$("$GM" rnd.lua --dry-run 2>&1); r2=$("$GM" rnd.lua --dry-run 2>&1)
[ "$r1" = "$r2" ] && [ "$(echo "$r1" | grep -c ' trial ')" = 10 ] && { pass=$((pass + 1)); echo "ok    random search: 5 points x 2 seeds, reproducible"; } \
  || { fail=$((fail + 1)); echo "FAIL  random search expansion: $r1"; }

# ---- a full sweep, the rerun, the table from stored files ------------------------------------
expect_run "sweep runs" 0 "baseline \(no fine-tuning\).*0\.01 .*written: results/tiny.md, results/tiny.tex, results/tiny.csv" -- "$GM" tiny.lua
for f in results/tiny.md results/tiny.tex results/tiny.csv results/tiny.h5 results/tiny_loss.png; do
  [ -s "$f" ] && { pass=$((pass + 1)); echo "ok    $f written"; } || { fail=$((fail + 1)); echo "FAIL  $f missing"; }
done
[ "$(ls results/tiny/trial-*.h5 | grep -vc ckpt)" = 4 ] && [ -z "$(ls results/tiny/*.ckpt.h5 2>/dev/null)" ] \
  && { pass=$((pass + 1)); echo "ok    4 trial files, no checkpoints left"; } || { fail=$((fail + 1)); echo "FAIL  trial files: $(ls results/tiny)"; }
expect_run "rerun keeps finished trials" 0 "trial 4/4  [0-9a-f]+  lr=0.003 seed=2: done \(kept\)" -- "$GM" tiny.lua
table_md=$(cat results/tiny.md)
expect_run "gemmarun table re-renders from the stored files" 0 "baseline \(no fine-tuning\)" -- "$GM" table results/tiny
[ "$(cat results/tiny.md)" = "$table_md" ] && { pass=$((pass + 1)); echo "ok    same table from the stored files"; } \
  || { fail=$((fail + 1)); echo "FAIL  gemmarun table gave another table"; }
# every evaluation keeps its per-example results (what the tables' intervals and tests resample),
# consistent with its accuracy and confusion matrix
cat > per_example.py <<'PY'
import glob, h5py, numpy as np
n = 0
for path in sorted(glob.glob("results/tiny/trial-*.h5")):
    with h5py.File(path, "r") as f:
        for phase in ("baseline", "final"):
            e = f["eval"][phase]
            idx, pred, ref = e["example_index"][:], e["predictions"][:], e["references"][:]
            assert len(idx) == len(pred) == len(ref) == e.attrs["n_examples"], path
            assert list(idx) == list(range(len(idx))), (path, idx)
            assert abs(np.mean(pred == ref) - e.attrs["accuracy"]) < 1e-12, path
            conf = np.zeros_like(e["confusion"][:])
            np.add.at(conf, (ref, pred), 1)
            assert (conf == e["confusion"][:]).all(), path
            n += 1
print("per-example results consistent in", n, "evaluations")
PY
find_python "h5py, numpy"
if [ -n "$PY" ]; then
  expect_run "per-example results stored, consistent with accuracy and confusion" 0 "consistent in 8 evaluations" -- "$PY" per_example.py
else
  skip_unless_ci "per-example results check (no Python with h5py and numpy: run ./setup.sh)"
fi
expect_run "the table gives 95% intervals and the tests' caption" 0 "\\[95% interval\\].*\\| 0\\.01 \\| (\\*\\*)?[0-9.]+ ± [0-9.]+ \\[[0-9.]+, [0-9.]+\\].*paired bootstrap over the 6 test examples, two-sided" -- cat results/tiny.md

# ---- generation with a trained adapter ---------------------------------------------------------
TINY="$SRC/tests/ref/tiny_gemma3_chat"
expect_run "generate --adapter picks a trial of a results folder by index" 0 "adapter results/tiny/trial-[0-9a-f]+\.h5, trial [0-9a-f]+: 42 modules, rank 4, alpha 8" -- "$GM" generate "$TINY" --adapter results/tiny --trial 3 "a short note" --max-tokens 4
id3=$("$GM" generate "$TINY" --adapter results/tiny --trial 3 "a short note" --max-tokens 4 2>&1 >/dev/null | sed -n 's/.*, trial \([0-9a-f]*\):.*/\1/p')
expect_run "the same trial by a prefix of its id" 0 "trial $id3: 42 modules" -- "$GM" generate "$TINY" --adapter results/tiny --trial "${id3:0:6}" "a short note" --max-tokens 4
expect_run "a trial file directly" 0 "adapter results/tiny/trial-$id3.h5" -- "$GM" generate "$TINY" --adapter "results/tiny/trial-$id3.h5" "a short note" --max-tokens 4
# (that the adapter changes the logits, and exactly as training evaluates them, is checked in
# tests/unit/test_backend.c and test_adapter.c; the tiny random model's greedy text rarely moves)
tuned=$("$GM" generate "$TINY" --adapter results/tiny --trial 3 "a short note" --max-tokens 6 2>/dev/null)
expect_run "generate --adapter on a folder of several trials asks for --trial" 2 "several trials have an adapter; choose one with --trial \(its index or id\): 1 \([0-9a-f]+, completed\), 2 \(" -- "$GM" generate "$TINY" --adapter results/tiny "a short note"
expect_run "generate --adapter with a trial that does not exist lists the trials" 2 "no trial 9 \(by index or id\); trials: 1 \(" -- "$GM" generate "$TINY" --adapter results/tiny --trial 9 "a short note"
expect_run "generate --trial without --adapter" 2 "--trial picks a trial of --adapter RESULTS" -- "$GM" generate "$TINY" --trial 1 "a short note"
expect_run "generate --adapter on a file that is no results file" 2 "is not a gemmarun results or checkpoint file" -- "$GM" generate "$TINY" --adapter "$SRC/tests/ref/tiny_gemma3_ref.h5" "a short note"
printf 'local m <close> = gm.load_model("%s")\nprint("lua:" .. m:generate("a short note", { adapter = "results/tiny", trial = "%s", max_tokens = 6 }))\n' "$TINY" "$id3" > gen.lua
lua_out=$("$GM" gen.lua 2>&1)
[ -n "$tuned" ] && [ "$lua_out" = "lua:${tuned#a short note}" ] && { pass=$((pass + 1)); echo "ok    m:generate{adapter = ..., trial = ...} in Lua gives the command line's text"; } \
  || { fail=$((fail + 1)); echo "FAIL  Lua generate with an adapter: '$lua_out' vs 'lua:${tuned#a short note}'"; }
printf 'local m <close> = gm.load_model("%s")\nlocal ok, err = pcall(m.generate, m, "a short note", { adapter = "results/tiny", max_tokens = 2 })\nprint(ok, err)\n' "$TINY" > generr.lua
expect_run "m:generate{adapter} loads the adapter: a folder of several trials asks for one" 0 "false.*several trials have an adapter; choose one with --trial" -- "$GM" generr.lua
# the same experiment rerun with another prompt: a new trial, never pooled with the old ones (the
# prompt is part of what is tokenized, so the data hash differs too)
sed 's/prompt = "Which fruit?"/prompt = "Name the fruit."/' tiny.lua > reprompt.lua
expect_run "an edited prompt gives rows of its own" 0 "Rows also split by data_sha256, prompt: the trials differ in these fields" -- "$GM" reprompt.lua --trial 1

# ---- a NaN trial fails, the others complete ----------------------------------------------------
sed -e 's/name = "tiny"/name = "nan"/' -e 's/lr = {1e-2, 3e-3}/lr = {1e-2, 1e30}/' -e 's/seeds = {1, 2}/seeds = {1}/' tiny.lua > nan.lua
expect_run "a NaN trial is recorded as failed, the other completes" 1 "trial 2/2  FAILED: step [0-9]+: the loss is -?nan \(non-finite\); the adapters were not updated.*failed: trial [0-9a-f]+ \(lr=1e\+?30, seed=1\)" -- "$GM" nan.lua
grep -q "0.01" results/nan.csv 2>/dev/null \
  && { pass=$((pass + 1)); echo "ok    table written despite the failure"; } || { fail=$((fail + 1)); echo "FAIL  no table for the nan run"; }

# ---- kill -9 mid-trial, then resume --------------------------------------------------------------
sed -e 's/name = "tiny"/name = "killed"/' -e 's/seeds = {1, 2}/seeds = {1}/' tiny.lua > killed.lua
EPOCHS=60 "$GM" killed.lua > killed1.log 2>&1 &
pid=$!
for i in $(seq 1 6000); do # wait (up to 10 min on a loaded machine) until trial 1 is done and trial 2 has a checkpoint
  n_done=$(ls results/killed/trial-*.h5 2>/dev/null | grep -vc ckpt)
  [ -n "$(ls results/killed/*.ckpt.h5 2>/dev/null)" ] && [ "$n_done" = 2 ] && grep -q "trial 2/2" killed1.log && break
  sleep 0.1
done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
first=$(grep -o "trial 1/2  [0-9a-f]*" killed1.log | head -1 | awk '{print $3}')
before=$(sha256sum "results/killed/trial-$first.h5" | cut -c1-64)
expect_run "after kill -9 the interrupted trial resumes from its checkpoint" 0 "trial 1/2  $first  lr=0.01 seed=1: done \(kept\).*resuming from step [0-9]+" -- env EPOCHS=60 "$GM" killed.lua
after=$(sha256sum "results/killed/trial-$first.h5" | cut -c1-64)
[ -n "$first" ] && [ -n "$before" ] && [ "$before" = "$after" ] && { pass=$((pass + 1)); echo "ok    the finished trial's file is untouched"; } \
  || { fail=$((fail + 1)); echo "FAIL  the finished trial's file changed"; }
# the resumed trial against the same trial run straight through, in a folder of its own: the
# series and tensors must be equal value for value (h5diff without a tolerance)
second=$(grep -o "trial 2/2  [0-9a-f]*" killed1.log | head -1 | awk '{print $3}')
mkdir -p straight && ln -sfn ../data straight/data && cp killed.lua straight/
(cd straight && EPOCHS=60 "$GM" killed.lua --trial 2 > straight.log 2>&1)
differ=""
for obj in /metrics/step /metrics/loss /metrics/lr /metrics/grad_norm /metrics/supervised_tokens /adapter /eval/final; do
  h5diff -q "results/killed/trial-$second.h5" "straight/results/killed/trial-$second.h5" "$obj" "$obj" > /dev/null 2>&1 || differ="$differ $obj"
done
[ -n "$second" ] && [ -z "$differ" ] && [ "$(h5dump -d /metrics/step straight/results/killed/trial-$second.h5 | grep -c "DATASPACE.*SIMPLE")" = 1 ] \
  && { pass=$((pass + 1)); echo "ok    the resumed trial equals the uninterrupted one: step, loss, lr and grad-norm series, all adapter tensors, final evaluation"; } \
  || { fail=$((fail + 1)); echo "FAIL  the resumed trial '$second' differs from the uninterrupted one in:${differ:- (no trial)}"; }

# planned vs measured peak memory of a runner trial (the plan includes the runner's own share)
h5attr() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): *//p' | head -1; }
planned=$(h5attr "straight/results/killed/trial-$second.h5" /memory/planned_total)
measured=$(h5attr "straight/results/killed/trial-$second.h5" /memory/measured_peak_rss)
if [ -n "${GM_SANITIZE:-}" ] && [ -n "$planned" ] && [ -n "$measured" ]; then
  pass=$((pass + 1)); echo "ok    a runner trial's memory was planned and measured (the bound is not checked under ASan)"
elif [ -n "$planned" ] && [ -n "$measured" ] && awk -v p="$planned" -v m="$measured" -v t="$(tol TOL_PLAN_PEAK_REL)" 'BEGIN { d = (m - p) / p; exit !(d <= t && d >= -t) }'; then
  pass=$((pass + 1)); echo "ok    a runner trial's peak memory is within $(tol TOL_PLAN_PEAK_REL) of its plan ($measured vs $planned bytes)"
else
  fail=$((fail + 1)); echo "FAIL  a runner trial's peak memory '$measured' vs plan '$planned': outside $(tol TOL_PLAN_PEAK_REL)"
fi

# ---- Ctrl-C -------------------------------------------------------------------------------------
sed -e 's/name = "tiny"/name = "ctrlc"/' -e 's/seeds = {1, 2}/seeds = {1}/' -e 's/sweep = grid { lr = {1e-2, 3e-3} },//' tiny.lua > ctrlc.lua
EPOCHS=200 "$GM" ctrlc.lua > ctrlc.log 2>&1 &
pid=$!
for i in $(seq 1 3000); do grep -q "step 20/" ctrlc.log && break; sleep 0.1; done # up to 5 min on a loaded machine
kill -INT $pid
wait $pid
rc=$?
[ "$rc" = 1 ] && grep -q "interrupted at step [0-9]*: checkpoint saved" ctrlc.log && ls results/ctrlc/*.ckpt.h5 > /dev/null 2>&1 \
  && { pass=$((pass + 1)); echo "ok    Ctrl-C saves a checkpoint and exits 1"; } || { fail=$((fail + 1)); echo "FAIL  Ctrl-C: rc $rc"; tail -3 ctrlc.log; }
expect_run "the interrupted run resumes" 0 "resuming from step [0-9]+" -- env EPOCHS=200 "$GM" ctrlc.lua

finish
