# End-to-end: the tables' 95% intervals and paired significance marks (issue 14, part 2).
#
# A Lua script writes trial files whose evaluations carry per-example results (40 test examples,
# 2 classes; a trial "right on the first k" examples), so every number below follows from k:
#   baseline: right on 20 (50%)            nf4, lr=1e-4: 3 seeds right on 28, 30, 32 (75 ± 5)
#   nf4, lr=2e-4: 36 (90%, the best)       bf16, lr=1e-4: 35 (87.5%, one example from the best)
#   bf16, lr=2e-4: 22 (55%, two examples from its baseline)
# The 3-seed cell gets Student t (75 ± t95(2)·5/√3, computed here with awk from scipy's t95(2));
# the others the percentile bootstrap, whose bounds for a 0/1 score are the binomial quantiles
# (k/40 with Bin(40, p): 90% -> [80.0, 97.5], 50% -> [35.0, 65.0]; test_stats checks the method).
# The marks: † where the cell differs from its baseline (not 55% vs 50%), ≈ where it does not
# differ from the best (87.5% vs 90%: they disagree on one example). Then: cells without
# per-example results (older files) get no bootstrap and no marks; trials scored on different
# examples are not paired; bad per-example lists are refused with their name.
source "$(dirname "$0")/lib.bash"
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
cd "$TMP"

cat > make.lua <<'EOF'
local N = 40
local function right_first(k, n, offset)
  n, offset = n or N, offset or 0
  local idx, pred, ref = {}, {}, {}
  for i = 1, n do
    idx[i], ref[i] = i - 1 + offset, (i - 1) % 2
    pred[i] = i <= k and ref[i] or 1 - ref[i]
  end
  return {accuracy = k / n, n_examples = n, example_index = idx, predictions = pred, references = ref}
end
local dir = env("E2E_NAME", "e2e_ci")
local trials = {
  {quant = "nf4", lr = 1e-4, seed = 1, k = 28}, {quant = "nf4", lr = 1e-4, seed = 2, k = 30},
  {quant = "nf4", lr = 1e-4, seed = 3, k = 32}, {quant = "nf4", lr = 2e-4, seed = 1, k = 36},
  {quant = "bf16", lr = 1e-4, seed = 1, k = 35}, {quant = "bf16", lr = 2e-4, seed = 1, k = 22},
}
for i, c in ipairs(trials) do
  local id = string.format("%02d", i)
  local r <close> = gm.results("results/" .. dir .. "/trial-" .. id .. ".h5")
  r:set{experiment = dir, trial_id = id, trial_index = i, n_trials = #trials,
        report_json = {rows = {"quant"}, cols = {"lr"}, metric = "accuracy"},
        swept_json = {"quant", "lr", "seed"}}
  r:set_config{quant = c.quant, lr = c.lr, seed = c.seed}
  local base, final = right_first(20), right_first(c.k)
  if dir == "e2e_old" and c.quant == "bf16" then -- an older file: no per-example lists
    for _, e in ipairs({base, final}) do e.example_index, e.predictions, e.references = nil, nil, nil end
  end
  if dir == "e2e_other" and c.quant == "bf16" and c.lr == 1e-4 then final = right_first(c.k, N, 100) end
  -- 3 seeds near 0: 5%, 0%, 45% (mean 16.7, t interval reaching below 0)
  if dir == "e2e_clip" and c.quant == "nf4" and c.lr == 1e-4 then final = right_first(({2, 0, 18})[c.seed]) end
  -- lists that contradict the stored accuracy (a hand-written file)
  if dir == "e2e_bad" and c.quant == "bf16" and c.lr == 2e-4 then final.accuracy = 0.9 end
  r:set_eval("baseline", base)
  r:set_eval("final", final)
  r:set{status = "completed"}
  r:save()
end
print("wrote " .. #gm.results_list("results/" .. dir) .. " trial files")
EOF
expect_run "trial files with per-example results" 0 "wrote 6 trial files" -- "$GM" make.lua

cat > want.txt <<'EOF'
e2e_ci: accuracy (%), final eval, single seed [95% interval]
quant                                                        lr=1e-4                     lr=2e-4
-------------------------------------  --------------------------------  --------------------------
baseline (no fine-tuning), quant=nf4         50.0 ± 0.0 [35.0, 65.0]     50.0 ± 0.0 [35.0, 65.0]
baseline (no fine-tuning), quant=bf16        50.0 ± 0.0 [35.0, 65.0]     50.0 ± 0.0 [35.0, 65.0]
-------------------------------------  --------------------------------  --------------------------
nf4                                    75.0 ± 5.0 [62.6, 87.4] (n=3) †         90.0 [80.0, 97.5] *†
bf16                                               87.5 [77.5, 97.5] ≈†        55.0 [40.0, 70.0]
* best (highest) mean
[a, b]: 95% interval, Student t over the seeds (fine-tuned cells with 3 or more); percentile bootstrap over the 40 test examples (the other cells; 10,000 resamples, each example scored by the fraction of the cell's seeds right on it)
† differs from its baseline, ≈ does not differ from the best: paired bootstrap over the 40 test examples, two-sided, α = 0.05
EOF
"$GM" table results/e2e_ci > out.txt 2>&1
same() { diff -u "$1" "$2" && echo same; }
expect_run "the text table, intervals and marks exactly" 0 "^same$" -- same want.txt <(head -11 out.txt)

# the t interval from its definition (scipy.stats.t.ppf(0.975, 2) = 4.302652729911275)
t_lo=$(awk 'BEGIN { printf "%.4f", 75 - 4.302652729911275 * 5 / sqrt(3) }')
t_hi=$(awk 'BEGIN { printf "%.4f", 75 + 4.302652729911275 * 5 / sqrt(3) }')
expect_run "CSV: the t interval ($t_lo, $t_hi), p-values of the 3-seed cell" 0 \
  "^fine-tuned,nf4,1e-4,accuracy_percent,final,75,5,3,0,$t_lo[0-9]*,$t_hi[0-9]*,t,0\.0[0-4][0-9]*,0\.0[0-4][0-9]*$" -- \
  grep "^fine-tuned,nf4,1e-4" results/e2e_ci.csv
# p against the best for a one-example difference, against the baseline for a two-example one:
# far above 0.05; p for 36 vs 20 right: the smallest a 10,000-resample test gives, 1/10001
csvp() { awk -F, -v q="$1" '$1 "," $2 "," $3 == q { print $13 " " $14 }' results/e2e_ci.csv; }
expect_run "CSV: 87.5 vs best 90 not significant, vs baseline significant" 0 "^9\.999e-05 0\.[1-9][0-9]*$" -- csvp "fine-tuned,bf16,1e-4"
expect_run "CSV: 55 vs baseline 50 not significant, vs best significant" 0 "^0\.[1-9][0-9]* 9\.999e-05$" -- csvp "fine-tuned,bf16,2e-4"
expect_run "CSV: the best has no test against itself" 0 "^9\.999e-05 $" -- csvp "fine-tuned,nf4,2e-4"
expect_run "Markdown: best bold with its mark, the ≈† cell, the caption" 0 \
  "\| nf4 \| 75\.0 ± 5\.0 \[62\.6, 87\.4\] \(n=3\) † \| \*\*90\.0 \[80\.0, 97\.5\]\*\* † \|.*\| bf16 \| 87\.5 \[77\.5, 97\.5\] ≈† \| 55\.0 \[40\.0, 70\.0\] \|.*paired bootstrap over the 40 test examples, two-sided, α = 0\.05\." \
  -- cat results/e2e_ci.md
expect_run "LaTeX: marks as superscripts" 0 'bf16 & 87\.5 \[77\.5, 97\.5\]\$\^\{\\approx\}\$\$\^\{\\dagger\}\$ & 55\.0 \[40\.0, 70\.0\] \\\\' -- cat results/e2e_ci.tex
mkdir -p again && cp results/e2e_ci.h5 again/
"$GM" table again/e2e_ci.h5 > again.txt 2>&1
expect_run "the merged file keeps the per-example results: the same table" 0 "^same$" -- same want.txt <(head -11 again.txt)

# files without per-example results (written before them): those cells get no bootstrap, no marks
E2E_NAME=e2e_old "$GM" make.lua > /dev/null 2>&1
expect_run "older files: t interval and the other cells' bootstrap only" 0 \
  "bf16 +87\.5 +55\.0" -- "$GM" table results/e2e_old
expect_run "older files: the nf4 cells still get theirs" 0 \
  "nf4 +75\.0 ± 5\.0 \[62\.6, 87\.4\] \(n=3\) † +90\.0 \[80\.0, 97\.5\] \*†" -- "$GM" table results/e2e_old
# a trial scored on other examples (positions 100..139) is not paired with the rest
E2E_NAME=e2e_other "$GM" make.lua > /dev/null 2>&1
expect_run "other examples: an interval but no test" 0 "bf16 +87\.5 \[77\.5, 97\.5\] +55\.0 \[40\.0, 70\.0\]$" -- "$GM" table results/e2e_other

# a t interval of an accuracy stays within [0, 100]
E2E_NAME=e2e_clip "$GM" make.lua > /dev/null 2>&1
clip_hi=$(awk 'BEGIN { m = 50 / 3; s = sqrt(((5 - m)^2 + m^2 + (45 - m)^2) / 2); printf "%.1f", m + 4.302652729911275 * s / sqrt(3) }')
expect_run "t interval cut to [0, 100] (upper bound $clip_hi by awk)" 0 "nf4 +16\.7 ± 24\.7 \[0\.0, $clip_hi\] \(n=3\)" -- "$GM" table results/e2e_clip
# per-example lists that contradict the stored accuracy are not used, and the table says so
E2E_NAME=e2e_bad "$GM" make.lua > /dev/null 2>&1
expect_run "inconsistent lists: no interval for that cell, a note names the trial" 0 \
  "bf16 +87\.5 \[77\.5, 97\.5\] ≈† +90\.0 \*?.*per-example results not used \(they disagree with the stored accuracy or list an example twice\) in trial 06" \
  -- "$GM" table results/e2e_bad

# bad per-example lists: refused with their name, nothing written
cat > bad.lua <<'EOF'
local cases = {
  {predictions = {0, 1}, references = {0, 1}},
  {example_index = {0, 1}, predictions = {0, 1, 1}},
  {example_index = {0, 1}, predictions = {0, 2}, references = {0, 1}, labels = {"a", "b"}},
  {example_index = {0, -1}},
  {example_index = {0, 0.5}},
}
for i, c in ipairs(cases) do
  local r <close> = gm.results("results/bad/trial-" .. i .. ".h5")
  local ok, err = pcall(r.set_eval, r, "final", c)
  print(i, ok and "accepted" or err)
end
EOF
expect_run "per-example lists: refused with what is wrong" 0 \
  "1	.*per-example lists need example_index.*2	.*predictions has 3 entries, example_index 2.*3	.*eval 'final': example 1: class out of range.*4	.*example 1: example_index out of range.*5	.*example_index\[2\] must be an integer" \
  -- "$GM" bad.lua
finish
