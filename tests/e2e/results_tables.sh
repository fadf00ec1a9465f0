# End-to-end: trial results files written from Lua (gm.results), rendered by `gemmarun table`.
#
# A Lua script writes 8 trial files of a small known sweep (quant x lr x 2 seeds, one trial
# failed) into results/e2e_sweep/; `gemmarun table` must print and write the exact Markdown and
# CSV below (mean ± sample std over seeds, best marked, one baseline row per quant, the failed
# trial in a footnote), valid 1024x640 PNG plots, a confusion matrix PNG per completed trial
# (one that cannot be written is a warning, not a lost table), and the merged
# results/e2e_sweep.h5, which renders the same tables again. Then the sandbox's write rule (only under results/), the exit
# codes for a missing or corrupt RESULTS, and that h5py and pandas (Debian's python3-h5py,
# -pandas and -tables, installed by setup.sh) read the files as results/README.md promises.
source "$(dirname "$0")/lib.bash"
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
W="$TMP/work"
mkdir -p "$W"
cd "$W"

cat > make.lua <<'EOF'
local trials = {
  {quant = "nf4", lr = 1e-4, seed = 1, acc = 0.80, base = 0.60},
  {quant = "nf4", lr = 1e-4, seed = 2, acc = 0.90, base = 0.60},
  {quant = "nf4", lr = 2e-4, seed = 1, acc = 0.92, base = 0.60},
  {quant = "nf4", lr = 2e-4, seed = 2, acc = 0.94, base = 0.60},
  {quant = "bf16", lr = 1e-4, seed = 1, acc = 0.70, base = 0.62},
  {quant = "bf16", lr = 1e-4, seed = 2, acc = 0.75, base = 0.62},
  {quant = "bf16", lr = 2e-4, seed = 1, acc = 0.88, base = 0.62},
  {quant = "bf16", lr = 2e-4, seed = 2, fail = "out of memory at step 7", base = 0.62},
}
for i, c in ipairs(trials) do
  local id = string.format("%02d%s", 9 - i, c.quant)   -- file names sort against trial order
  local r <close> = gm.results("results/e2e_sweep/trial-" .. id .. ".h5")
  r:set{experiment = "e2e_sweep", trial_id = id, trial_index = i, n_trials = #trials,
        report_json = {rows = {"quant"}, cols = {"lr"}, metric = "accuracy"},
        swept_json = {"quant", "lr", "seed"}}
  r:set_config{quant = c.quant, lr = c.lr, seed = c.seed, rank = 16, checkpointing = false}
  for step = 1, 20 do
    r:append{step = step, lr = c.lr,
             loss = 2.5 * math.exp(-step * c.lr * 1e3) + 0.1 * c.seed + (c.quant == "bf16" and 0.2 or 0)}
  end
  r:set_eval("baseline", {accuracy = c.base, n_examples = 50})
  if c.fail then
    r:set{status = "failed", reason = c.fail}
  else
    r:set_eval("final", {accuracy = c.acc, loss = 1 - c.acc, n_examples = 50, labels = {"cat", "dog"},
                         per_class = {c.acc, c.acc}, confusion = {{20, 5}, {5, 20}}})
    r:set{status = "completed", wall_seconds = 10 + i}
  end
  -- planned 800 + i MiB; measured 1% over (2% over for trial 6), so the grid shows each cell's largest
  local mib = 1024 * 1024
  r:set_memory{planned = {["base weights"] = 300 * mib, total = (800 + i) * mib},
               measured_peak_rss = math.floor((800 + i) * mib * (i == 6 and 1.02 or 1.01))}
  r:set_data{n_train = 200, n_test = 50, rejections = {{example = 7, reason = "too long"}}}
  r:save()
end
print("wrote " .. #gm.results_list("results/e2e_sweep") .. " trial files")
EOF
expect_run "a Lua script writes 8 trial files" 0 "wrote 8 trial files" -- "$GM" make.lua

expect_run "gemmarun table renders the folder" 0 "nf4 +85\.0 ± 7\.1 +93\.0 ± 1\.4 \*" -- "$GM" table results/e2e_sweep/

cat > want.md <<'EOF'
**e2e_sweep: accuracy (%), final eval, mean ± std over 2 seeds**

| quant | lr=1e-4 | lr=2e-4 |
|:--|--:|--:|
| baseline (no fine-tuning), quant=nf4 | 60.0 ± 0.0 | 60.0 ± 0.0 |
| baseline (no fine-tuning), quant=bf16 | 62.0 ± 0.0 | 62.0 ± 0.0 |
| nf4 | 85.0 ± 7.1 | **93.0 ± 1.4** |
| bf16 | 72.5 ± 3.5 | 88.0 (n=1) |

Bold: best (highest) mean.

Excluded from the means (1 trial):

- failed: trial 01bf16 (quant=bf16, lr=2e-4, seed=2): out of memory at step 7

Peak memory (MiB): planned / measured (measured vs planned), largest over the cell's trials:

| quant | lr=1e-4 | lr=2e-4 |
|:--|--:|--:|
| nf4 | 802 / 810 (+1.0%) | 804 / 812 (+1.0%) |
| bf16 | 806 / 822 (+2.0%) | 807 / 815 (+1.0%) |
EOF
cat > want.csv <<'EOF'
kind,quant,lr,metric,phase,mean,std,n,best,ci_low,ci_high,ci_method,p_vs_baseline,p_vs_best
baseline,nf4,1e-4,accuracy_percent,baseline,60,0,4,0,,,,,
baseline,nf4,2e-4,accuracy_percent,baseline,60,0,4,0,,,,,
baseline,bf16,1e-4,accuracy_percent,baseline,62,0,3,0,,,,,
baseline,bf16,2e-4,accuracy_percent,baseline,62,0,3,0,,,,,
fine-tuned,nf4,1e-4,accuracy_percent,final,85,7.07107,2,0,,,,,
fine-tuned,nf4,2e-4,accuracy_percent,final,93,1.41421,2,1,,,,,
fine-tuned,bf16,1e-4,accuracy_percent,final,72.5,3.53553,2,0,,,,,
fine-tuned,bf16,2e-4,accuracy_percent,final,88,,1,0,,,,,
memory,nf4,1e-4,planned_peak_mib,train,802,,2,0,,,,,
memory,nf4,1e-4,measured_peak_mib,train,810.02,,2,0,,,,,
memory,nf4,2e-4,planned_peak_mib,train,804,,2,0,,,,,
memory,nf4,2e-4,measured_peak_mib,train,812.04,,2,0,,,,,
memory,bf16,1e-4,planned_peak_mib,train,806,,2,0,,,,,
memory,bf16,1e-4,measured_peak_mib,train,822.12,,2,0,,,,,
memory,bf16,2e-4,planned_peak_mib,train,807,,1,0,,,,,
memory,bf16,2e-4,measured_peak_mib,train,815.07,,1,0,,,,,
EOF
same() { diff -u "$1" "$2" && echo same; }
expect_run "Markdown table exactly as expected" 0 "^same$" -- same want.md results/e2e_sweep.md
expect_run "CSV exactly as expected" 0 "^same$" -- same want.csv results/e2e_sweep.csv
expect_run "LaTeX booktabs with the best cell bold" 0 'nf4 & 85\.0 \$\\pm\$ 7\.1 & \\textbf\{93\.0 \$\\pm\$ 1\.4\} \\\\' -- cat results/e2e_sweep.tex
oneline() { tr '\n' ' ' < "$1"; }
expect_run "LaTeX has toprule, midrule, bottomrule" 0 "toprule.*midrule.*bottomrule" -- oneline results/e2e_sweep.tex

# PNG: signature and IHDR width/height (big-endian at bytes 16..23; default 1024x640)
png_ok() {
  local f=$1 want=${2:-0000040000000280} sig dims
  [ -s "$f" ] || { echo "missing $f"; return 1; }
  sig=$(od -An -tx1 -N8 "$f" | tr -d ' \n')
  dims=$(od -An -tx1 -j16 -N8 "$f" | tr -d ' \n')
  [ "$sig" = "89504e470d0a1a0a" ] || { echo "$f: not a PNG ($sig)"; return 1; }
  [ "$dims" = "$want" ] || { echo "$f: IHDR size $dims, not $want"; return 1; }
  echo "$f ok"
}
expect_run "loss curves PNG (1024x640)" 0 "ok$" -- png_ok results/e2e_sweep_loss.png
expect_run "accuracy vs lr PNG (1024x640)" 0 "ok$" -- png_ok results/e2e_sweep_accuracy_vs_lr.png
expect_run "merged results/e2e_sweep.h5 written" 0 "e2e_sweep\.h5" -- ls results
# confusion matrices: one per trial and phase that has one (the 7 completed trials' final), square
# (1024x1024 for 2 classes); one that cannot be written (a folder where it goes) is a warning
# naming it, and the tables and the other matrices are still written
for i in 1 2 3 4 5 6 7; do
  expect_run "confusion matrix of trial $i (1024x1024)" 0 "ok$" -- png_ok "results/e2e_sweep_confusion_${i}_final.png" 0000040000000400
done
expect_run "no confusion matrix for the failed trial without one" 0 "^none$" -- \
  bash -c '[ -e results/e2e_sweep_confusion_8_final.png ] && echo found || echo none'
rm results/e2e_sweep_confusion_3_final.png results/e2e_sweep_confusion_5_final.png results/e2e_sweep.md
mkdir results/e2e_sweep_confusion_3_final.png
"$GM" table results/e2e_sweep/ > blocked.out 2>&1; echo "exit $?" >> blocked.out
expect_run "a confusion matrix that cannot be written: a warning naming it, exit 0" 0 \
  "warning: confusion matrix of trial 3 \(final\) not drawn: .*results/e2e_sweep_confusion_3_final\.png.*exit 0$" -- cat blocked.out
expect_run "... the others listed together in the output" 0 "wrote .*results/e2e_sweep_confusion_\*\.png \(6 confusion matrices\)" -- cat blocked.out
after_block() {
  [ -s results/e2e_sweep.md ] || { echo "results/e2e_sweep.md missing"; return 1; }
  [ -z "$(ls results | grep tmp)" ] || { echo "left behind: $(ls results | grep tmp)"; return 1; }
  png_ok results/e2e_sweep_confusion_5_final.png 0000040000000400
}
expect_run "... and the tables and the other matrices written, no .tmp left" 0 "ok$" -- after_block
rmdir results/e2e_sweep_confusion_3_final.png

mkdir -p again && cp results/e2e_sweep.h5 again/
expect_run "the merged file renders the same table" 0 "wrote again/e2e_sweep\.md" -- "$GM" table again/e2e_sweep.h5
expect_run "same Markdown from the merged file" 0 "^same$" -- same want.md again/e2e_sweep.md

# errors: exit 2 with a message naming the path
expect_run "missing RESULTS: exit 2" 2 "results/nope: no such file or folder" -- "$GM" table results/nope
printf 'not hdf5' > corrupt.h5
expect_run "corrupt RESULTS: exit 2" 2 "corrupt\.h5: not an HDF5 file" -- "$GM" table corrupt.h5
mkdir -p results/empty
expect_run "folder without trial files: exit 2" 2 "no trial files" -- "$GM" table results/empty

# the write rule: only below results/, never "..", never elsewhere
cat > escape1.lua <<'EOF'
gm.write_text("notes.md", "x")
EOF
cat > escape2.lua <<'EOF'
gm.results("results/../trial-x.h5")
EOF
cat > escape3.lua <<'EOF'
gm.plot{file = "/tmp/gm_escape.png", series = {{x = {1, 2}, y = {1, 2}}}}
EOF
expect_run "write_text outside results/ refused" 2 "outside the results folder" -- "$GM" escape1.lua
expect_run "'..' refused" 2 "contains a '\.\.' component" -- "$GM" escape2.lua
expect_run "plot outside results/ refused" 2 "outside the results folder" -- "$GM" escape3.lua
expect_run "nothing was written outside" 0 "^none$" -- bash -c '[ -e notes.md ] || [ -e trial-x.h5 ] || [ -e /tmp/gm_escape.png ] && echo found || echo none'

# Python readers
find_python "pandas, h5py, tables"
if [ -n "$PY" ]; then
  cat > read.py <<'EOF'
import h5py, json, pandas as pd
df = pd.read_hdf("results/e2e_sweep.h5", "trials")
assert len(df) == 8, len(df)
assert list(df.columns[:7]) == ["trial_id", "trial_index", "status", "reason", "seed", "quant", "lr"], list(df.columns)
assert df.loc[df.status == "completed", "final_accuracy"].round(2).tolist() == [0.8, 0.9, 0.92, 0.94, 0.7, 0.75, 0.88]
assert df.groupby(["quant", "lr"]).final_accuracy.mean().round(4).to_dict()[("nf4", 2e-4)] == 0.93
with h5py.File("results/e2e_sweep/trial-08nf4.h5", "r") as f:
    assert isinstance(f.attrs["status"], str) and f.attrs["status"] == "completed"
    assert json.loads(f.attrs["report_json"])["metric"] == "accuracy"
    assert f["metrics/loss"].shape == (20,) and f["metrics/loss"].maxshape == (None,)
    assert list(f["eval/final/labels"].asstr()[:]) == ["cat", "dog"]
    assert f["eval/final/confusion"][:].tolist() == [[20, 5], [5, 20]]
    assert int(f["config"].attrs["checkpointing"]) == 0 and f["config"].attrs["quant"] == "nf4"
    m = pd.DataFrame({k: f["metrics"][k][:] for k in f["metrics"]})
    assert m.shape == (20, 3)
print("python readers ok")
EOF
  expect_run "pandas.read_hdf and h5py read the files" 0 "python readers ok" -- "$PY" read.py
else
  skip_unless_ci "pandas/h5py check (no Python with pandas, h5py and tables: run ./setup.sh)"
fi

# Trials that differ in a field the report does not name (max_length edited between two runs of
# the same experiment) are never pooled as seeds: max_length becomes a row field, and a note says so.
cat > edited.lua <<'EOF'
for i, c in ipairs({{ml = 64, seed = 1, acc = 0.5}, {ml = 128, seed = 1, acc = 0.7}, {ml = 128, seed = 2, acc = 0.9}}) do
  local id = "edit" .. i
  local r <close> = gm.results("results/edited/trial-" .. id .. ".h5")
  r:set{experiment = "edited", trial_id = id, trial_index = 1, n_trials = 1,
        report_json = {rows = {"quant"}, cols = {}, metric = "accuracy"}, swept_json = {"seed"}}
  r:set_config{quant = "nf4", lr = 1e-4, seed = c.seed, max_length = c.ml}
  r:set_eval("final", {accuracy = c.acc, n_examples = 10})
  r:set{status = "completed"}
  r:save()
end
print("wrote " .. #gm.results_list("results/edited") .. " trial files")
EOF
expect_run "trials of an edited field are written" 0 "wrote 3 trial files" -- "$GM" edited.lua
expect_run "edited field: its own rows, never pooled" 0 "nf4 +64 +50\.0 .*nf4 +128 +80\.0 ± 14\.1.*Rows also split by max_length" -- "$GM" table results/edited/

finish
