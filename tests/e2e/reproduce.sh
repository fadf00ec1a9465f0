# End-to-end: `gemmarun reproduce RESULTS --trial ID` (issue 14, part 4) on the tiny Gemma 3.
#
# One trial runs; reproduce reruns it from the experiment text stored in its file and must report
# bit-identity (same build, threads, device). Then: a stored loss value and git commit altered in
# the stored file (as another build would have left them): reproduce reports NOT bit-identical,
# names the dataset and the size of the difference and the build field that differs (exit 1); a
# data file edited: refused before any training, naming the split and both hashes (exit 2); an
# experiment that now evaluates to another config (--set model=...): the field named; bad
# --trial, a missing folder, a trial that did not complete, a file without its experiment text.
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
tiny_fixture "$SRC" 1
sed -i 's/seeds = {1, 2},/seeds = {1},/; s/sweep = grid { lr = {1e-2, 3e-3} },/sweep = grid { rank = {2, 4} },/' tiny.lua
expect_run "two trials run" 0 "written: results/tiny.md" -- "$GM" tiny.lua
stored_before=$(cat results/tiny/trial-*.h5 | sha256sum)
expect_run "reproduce: bit-identical" 0 "reproducing trial 2 \([0-9a-f]+\) of results/tiny/trial-[0-9a-f]+\.h5 from tiny\.lua.*bit-identical: every logged series \(12 steps\), every evaluation \(accuracy [0-9.]+%\) and the adapter: [0-9]+ datasets, [0-9]+ values, no difference" -- "$GM" reproduce results/tiny --trial 2
expect_run "the reproduction is a trial file of its own" 0 "^trial-[0-9a-f]+\.h5$" -- ls results/tiny/reproduce
expect_run "the stored trial files are untouched" 0 "^same$" -- bash -c "[ \"\$(cat results/tiny/trial-*.h5 | sha256sum)\" = '$stored_before' ] && echo same"
expect_run "--trial by id prefix" 0 "bit-identical" -- "$GM" reproduce results/tiny --trial "$(ls results/tiny/reproduce | sed 's/^trial-\(....\).*/\1/')"

# the stored trial altered as another build would have left it: the last loss 0.25 higher, another commit
cat > tamper.lua <<'EOF'
local path = gm.results_list("results/tiny")[1]
for _, p in ipairs(gm.results_list("results/tiny")) do if gm.results_read(p).trial_index == 2 then path = p end end
local t = gm.results_read(path)
local r <close> = gm.results(path)
local n = r:rows()
local row = {}
for k, v in pairs(t.metrics) do row[k] = v[n] end
row.loss = row.loss + 0.25
r:truncate(n - 1)
r:append(row)
r:set_provenance{git_commit = "0123456789ab"}
r:save()
print("altered " .. path)
EOF
expect_run "alter the stored trial" 0 "altered" -- "$GM" tamper.lua
expect_run "reproduce: not bit-identical, the difference and the build named (exit 1)" 1 \
  "NOT bit-identical: 1 of [0-9]+ datasets differ, the largest \|difference\| 0\.25 in /metrics/loss; final accuracy [0-9.]+% then, [0-9.]+% now; what differs from when it ran: git_commit 0123456789ab then, [0-9a-f]+[^ ]* now" \
  -- "$GM" reproduce results/tiny --trial 2

# the data edited: refused before any training
rm -rf results/tiny/reproduce
cp data/apple/3.txt apple3.bak
echo "a short note 3 about the banana" > data/apple/3.txt
expect_run "edited data: refused, naming the split and both hashes (exit 2)" 2 \
  "cannot reproduce: the training data \(as tokenized\): sha256 [0-9a-f]{12}\.\.\. stored, [0-9a-f]{12}\.\.\. now \(24 examples stored, 24 now\) differs from what the trial ran on; nothing was run" \
  -- "$GM" reproduce results/tiny --trial 1
expect_run "edited data: nothing trained" 0 "^none$" -- bash -c "ls results/tiny/reproduce/*.h5 2>/dev/null || echo none"
cp apple3.bak data/apple/3.txt
expect_run "restored data: bit-identical again" 0 "bit-identical" -- "$GM" reproduce results/tiny --trial 1

# an experiment that evaluates to another config now
expect_run "another config now: the field named (exit 2)" 2 \
  "the stored experiment no longer gives trial [0-9a-f]+: now model = \"/nowhere\" \(stored \"[^\"]*tiny_gemma3_chat\"\)" \
  -- "$GM" reproduce results/tiny --trial 1 --set model=/nowhere

# bad requests
expect_run "two trials and no --trial: they are listed (exit 2)" 2 "results/tiny holds 2 trials: give --trial INDEX or ID \(1 \([0-9a-f]+, completed\), 2 \([0-9a-f]+, completed\)\)" -- "$GM" reproduce results/tiny
expect_run "no such trial (exit 2)" 2 "--trial 7: no such trial in results/tiny" -- "$GM" reproduce results/tiny --trial 7
expect_run "no such folder (exit 2)" 2 "results/nope: no such file or folder" -- "$GM" reproduce results/nope
expect_run "no RESULTS (exit 2)" 2 "usage: gemmarun reproduce RESULTS" -- "$GM" reproduce
expect_run "a merged file: refused, not compared (exit 2)" 2 "results/tiny\.h5 is a merged results file: give its results folder" -- "$GM" reproduce results/tiny.h5
expect_run "a checkpoint: refused (exit 2)" 2 "x\.ckpt\.h5 is a checkpoint, not a trial file" -- bash -c "touch results/tiny/x.ckpt.h5; '$GM' reproduce results/tiny/x.ckpt.h5"
expect_run "not a results file (exit 2)" 2 "^gemmarun: error: tiny\.lua: not an HDF5 file \(no HDF5 signature; [0-9]+ bytes\)$" -- "$GM" reproduce tiny.lua
expect_run "not a results file: one line, no traceback" 0 "^1$" -- bash -c "'$GM' reproduce tiny.lua 2>&1 | wc -l"
cat > old.lua <<'EOF'
local r <close> = gm.results("results/old/trial-abc.h5")
r:set{experiment = "old", trial_id = "abc", trial_index = 1, n_trials = 1, status = "completed"}
r:save()
local f <close> = gm.results("results/failed/trial-def.h5")
f:set{experiment = "failed", trial_id = "def", trial_index = 1, n_trials = 1, status = "failed", reason = "nan"}
f:save()
EOF
"$GM" old.lua > /dev/null 2>&1
expect_run "a file without its experiment text: what to do instead (exit 2)" 2 "results/old/trial-abc.h5: this trial file does not hold its experiment's text .*run its experiment file again with --trial 1 instead" -- "$GM" reproduce results/old
expect_run "a failed trial: refused (exit 2)" 2 "trial 1 is failed: only a completed trial can be reproduced" -- "$GM" reproduce results/failed/trial-def.h5
finish
