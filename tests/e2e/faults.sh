#!/usr/bin/env bash
# Faults at the runner (issue 9, part 4), on the tiny Gemma 3 with a tokenizer:
#   - kill -9 at random points across a whole sweep (loading, training, saving, evaluating,
#     between trials, rendering the tables), rerun after each kill until the sweep completes:
#     every trial file, once completed, never changes again, and every trial - the interrupted
#     ones resumed from their checkpoints - ends equal, value for value, to the same sweep run
#     straight through (loss, lr, grad-norm and token series, all adapter tensors, evaluations),
#     with the same table;
#   - a write that fails (a file-size limit: EFBIG, as a full disk gives ENOSPC) stops the sweep
#     with one message naming the file and the reason, keeps the finished trials, and the rerun
#     completes the sweep equal to the straight one; tables that cannot be written leave the
#     trials kept and say how to render them later.
# The exhaustive per-call write and allocation faults are tests/unit/test_faults.c.
source "$(dirname "$0")/lib.bash"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
cd "$TMP"
tiny_fixture "$SRC" 12

mkdir straight && cp -r data tiny.lua straight/
t0=$(date +%s.%N)
(cd straight && "$GM" tiny.lua > run.log 2>&1) && [ "$(ls straight/results/tiny/trial-*.h5 | wc -l)" = 4 ] \
  && { pass=$((pass + 1)); echo "ok    the sweep straight through: 4 trials"; } \
  || { fail=$((fail + 1)); echo "FAIL  the straight sweep"; tail -5 straight/run.log; }

# the kills' delays scale with the straight sweep's wall time (~6 s here, minutes under ASan)
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')

# ---- kill -9 at random points --------------------------------------------------------------
mkdir killed && cp -r data tiny.lua killed/
cd killed
RANDOM=${GM_FAULT_SEED:-20261202}
declare -A kept # trial file -> sha256 once completed
kills=0 rounds=0 resumed=0 changed="" done_rc="" trials_hit=""
phases=""
# at most 30 kills (20 under ASan, where each run is several times slower, with longer delays to
# cover the sweep), then a run goes through. Under ASan a run's start-up is a larger share of each
# delay: with 12 kills and delays up to wall / 6 the kills all landed in the first 2 of 4 trials
# once training got faster (CI, 2026-12-06, beside another test under ctest -j2)
max_kills=30 span=8 min_kills=8
[ -n "${GM_SANITIZE:-}" ] && max_kills=20 span=5 min_kills=5
while [ $rounds -le $max_kills ]; do
  rounds=$((rounds + 1))
  "$GM" tiny.lua > round.log 2>&1 &
  pid=$!
  # a delay in [0.05, wall/span) s: the startup, the trials (a quarter of the wall time each) and
  # the tables all get hit
  [ $rounds -le $max_kills ] && sleep "$(awk -v r=$RANDOM -v w="$wall" -v k=$span 'BEGIN { printf "%.3f", 0.05 + (w / k) * r / 32768 }')"
  if [ $rounds -le $max_kills ] && kill -9 $pid 2>/dev/null; then
    wait $pid 2>/dev/null
    kills=$((kills + 1))
    last=$(tr '\r' '\n' < round.log | grep -v '^$' | tail -1 | sed -E 's/step [0-9]+\/[0-9]+ .*/training/; s/[0-9]+(\.[0-9]+)?%/N%/; s/step [0-9]+ \(.*/step N/' | cut -c1-60)
    phases="$phases|${last:-(nothing printed yet)}"
    trials_hit="$trials_hit $(grep -o 'trial [0-9]/4' round.log | tail -1)"
  else
    wait $pid
    done_rc=$?
  fi
  grep -q "resuming from step" round.log && resumed=$((resumed + 1))
  # completed trial files never change once completed
  for f in results/tiny/trial-*.h5; do
    [ -f "$f" ] || continue
    case "$f" in *.ckpt.h5) continue ;; esac
    sum=$(sha256sum "$f" | cut -c1-64)
    if [ -n "${kept[$f]:-}" ]; then
      [ "${kept[$f]}" = "$sum" ] || changed="$changed $f"
    elif h5dump -a /status "$f" 2>/dev/null | grep -q '"completed"'; then
      kept[$f]=$sum
    fi
  done
  [ -n "$done_rc" ] && break
done
echo "      $kills kills in $rounds runs (delays up to $(awk -v w="$wall" -v k=$span 'BEGIN { printf "%.1f", w / k }') s; seed ${GM_FAULT_SEED:-20261202}); $resumed runs resumed a trial from its checkpoint; last lines before the kills:"
printf '%s\n' "$phases" | tr '|' '\n' | grep -v '^$' | sort | uniq -c | sort -rn | head -12 | sed 's/^/       /'
[ "$done_rc" = 0 ] && { pass=$((pass + 1)); echo "ok    the sweep completes after $kills kills"; } \
  || { fail=$((fail + 1)); echo "FAIL  the sweep did not complete after $rounds runs (rc '$done_rc')"; tail -5 round.log; }
n_hit=$(printf '%s\n' $trials_hit | grep -c /4 | tr -d ' ')
n_distinct=$(printf '%s\n' $trials_hit | grep /4 | sort -u | wc -l)
[ "$kills" -ge $min_kills ] && [ "$resumed" -ge 2 ] && [ "$n_distinct" -ge 3 ] \
  && { pass=$((pass + 1)); echo "ok    kills landed throughout the sweep: $kills kills in $n_distinct different trials, $resumed runs resumed from a checkpoint"; } \
  || { fail=$((fail + 1)); echo "FAIL  too few kills to prove anything: $kills kills in $n_distinct trials, $resumed resumes"; }
[ -z "$changed" ] && [ "${#kept[@]}" = 4 ] && { pass=$((pass + 1)); echo "ok    no completed trial file changed after it completed"; } \
  || { fail=$((fail + 1)); echo "FAIL  completed trial files changed:$changed (${#kept[@]} seen completed)"; }
d=$(same_trials ../straight/results/tiny results/tiny)
[ -z "$d" ] && { pass=$((pass + 1)); echo "ok    every trial equals the straight sweep's: series, adapters, evaluations"; } \
  || { fail=$((fail + 1)); echo "FAIL  trials differ from the straight sweep:$d"; }
[ -z "$(ls results/tiny/ | grep -E 'ckpt|tmp')" ] && { pass=$((pass + 1)); echo "ok    no checkpoint or .tmp left"; } \
  || { fail=$((fail + 1)); echo "FAIL  left behind: $(ls results/tiny | grep -E 'ckpt|tmp')"; }
[ -s results/tiny.md ] && [ "$(acc_table results/tiny.md)" = "$(acc_table ../straight/results/tiny.md)" ] \
  && { pass=$((pass + 1)); echo "ok    the same table"; } || { fail=$((fail + 1)); echo "FAIL  the tables differ"; diff <(acc_table results/tiny.md) <(acc_table ../straight/results/tiny.md) | head; }
# then kills while every trial is kept and only the tables are rendered (~0.3 s a run)
tkills=0
for i in $(seq 1 $((max_kills < 12 ? max_kills / 2 : 12))); do
  "$GM" tiny.lua > round.log 2>&1 &
  pid=$!
  sleep "$(awk -v r=$RANDOM -v w="$wall" 'BEGIN { printf "%.3f", 0.01 + (w / 30) * r / 32768 }')"
  kill -9 $pid 2>/dev/null && tkills=$((tkills + 1))
  wait $pid 2>/dev/null
done
expect_run "after $tkills kills while rendering, the tables render" 0 "written: results/tiny.md" -- "$GM" tiny.lua
[ "$(acc_table results/tiny.md)" = "$(acc_table ../straight/results/tiny.md)" ] && [ -z "$(ls results | grep tmp)" ] \
  && { pass=$((pass + 1)); echo "ok    the same table, no .tmp left"; } || { fail=$((fail + 1)); echo "FAIL  tables after the render kills: $(ls results)"; }
cd ..

# ---- a write fails: the sweep stops, finished trials are kept, the rerun completes -----------
mkdir full && cp -r data tiny.lua full/
cd full
"$GM" tiny.lua --trial 1 > /dev/null 2>&1
first=$(ls results/tiny/trial-*.h5 | head -1)
before=$(sha256sum "$first" | cut -c1-64)
# a limit on file size: trial files (~180 KiB) fit, checkpoints (~400 KiB) do not; SIGXFSZ
# ignored so the write returns EFBIG, as a full disk returns ENOSPC
expect_run "a failed write stops the sweep with one message naming the file and the reason" 1 \
  "trial 1/4 .*done \(kept\).*trial 2/4  STOPPED: cannot write: saving checkpoint results/tiny/trial-[0-9a-f]+\.ckpt\.h5: .*not replaced \(the previous file there, if any, is untouched\).*File too large.*stopped: a checkpoint or results file could not be written \(above\)\. Finished trials are kept" \
  -- bash -c "trap '' XFSZ; ulimit -f 300; exec '$GM' tiny.lua"
out=$(bash -c "trap '' XFSZ; ulimit -f 300; exec '$GM' tiny.lua" 2>&1 || true)
printf '%s' "$out" | grep -q "traceback" && { fail=$((fail + 1)); echo "FAIL  a traceback on a failed write"; } \
  || { pass=$((pass + 1)); echo "ok    no traceback"; }
[ "$(sha256sum "$first" | cut -c1-64)" = "$before" ] && { pass=$((pass + 1)); echo "ok    the finished trial's file is untouched"; } \
  || { fail=$((fail + 1)); echo "FAIL  the finished trial's file changed"; }
[ -z "$(ls results/tiny/ | grep tmp)" ] && { pass=$((pass + 1)); echo "ok    no .tmp left by the failed writes"; } \
  || { fail=$((fail + 1)); echo "FAIL  .tmp left: $(ls results/tiny)"; }
# the tables cannot be written (a folder where the merged file goes): the trials stay done
rm -f results/tiny.h5 && mkdir results/tiny.h5
expect_run "tables that cannot be written: the trials are kept, and it says how to render them later" 1 \
  "the trials are done and kept, but the tables could not be written: .*results/tiny\.h5.*run \`gemmarun table results/tiny\` once it can be" \
  -- "$GM" tiny.lua
rmdir results/tiny.h5
expect_run "the rerun completes the sweep" 0 "trial 1/4 .*done \(kept\)" -- "$GM" tiny.lua
d=$(same_trials ../straight/results/tiny results/tiny)
[ -z "$d" ] && { pass=$((pass + 1)); echo "ok    after the failed writes, every trial equals the straight sweep's"; } \
  || { fail=$((fail + 1)); echo "FAIL  trials differ from the straight sweep:$d"; }
cd ..

finish
