#!/usr/bin/env bash
# Data-parallel training of one trial (issue 17, part 3; docs/scaling.md) on the tiny Gemma 3 with
# a tokenizer, under Open MPI's mpirun (2 processes on this machine's cores):
#   - 2 ranks x grad_accum 1 == 1 process x grad_accum 2: the same optimizer steps, learning
#     rates, supervised tokens, losses, gradient norms and adapter, exactly (a sum of two terms is
#     the same in either order);
#   - 2 ranks x grad_accum 2 == 1 process x grad_accum 4, with LoRA dropout (keyed by the
#     micro-batch's place in the whole step), and with batch 5, whose short last step leaves
#     rank 1 no example: steps, lr and tokens exactly, adapter and loss within
#     TOL_DATA_PARALLEL_ADAPTER_ABS / _LOSS_REL (tests/unit/test_util.h: the gradients' f32 sums
#     in another order);
#   - only rank 0 writes and prints: rank 1 runs in a folder of its own (an MPMD launch) that
#     stays as it was, and its stdout and stderr are empty; the trial records world_size 2, and
#     rank 0's peak memory stays within the plan, which has an item for MPI's own state;
#   - rank 1 killed (-9) mid-training: the run ends (no rank left waiting), the rerun resumes
#     from rank 0's checkpoint and ends equal to the run that was never interrupted; a resume on
#     another number of processes is refused with the reason; Ctrl-C on rank 0 alone stops every
#     rank at the same step with the checkpoint saved, and the rerun ends equal too; a write
#     failing on rank 0 alone stops every rank (MPI_Abort) instead of leaving rank 1 waiting.
# Without mpirun (or a gemmarun built without MPI) the checks skip, and fail under CI.
source "$(dirname "$0")/lib.bash"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
TOL_AD=$(tol TOL_DATA_PARALLEL_ADAPTER_ABS) TOL_LOSS=$(tol TOL_DATA_PARALLEL_LOSS_REL)
cd "$TMP"

if ! command -v mpirun > /dev/null; then
  skip_unless_ci "data-parallel training: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
  finish
  exit $?
fi
# root in containers and CI: Open MPI refuses root without these two
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# more ranks than cores is fine here (oversubscribe); no pinning, the ranks share the cores, and a
# rank waiting in a collective (while rank 0 evaluates) yields its core instead of spinning
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
# Under the sanitizer run (GM_SANITIZE, tests/sanitizers/run.sh): Open MPI never frees what
# MPI_Init, its progress threads and its plugins allocate (83 reports at exit, many from plugins
# already unloaded: no module to suppress by), so the ranks run with leak checking off; ASan's
# and UBSan's other checks stay on, and the single-process runs here keep leak checking.
# (through mpirun's environment, which it passes on to every rank; -x would reach only the first
# program of an MPMD launch)
[ -n "${GM_SANITIZE:-}" ] && MPIRUN=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "${MPIRUN[@]}")
tiny_fixture "$SRC" 4
# one trial of the fixture's sweep: lr 1e-2, seed 1; 24 training examples
# one thread per process: the two ranks share this machine's 2 cores
T1=(--trial 1 --threads 1)

EXACT="/metrics/step /metrics/lr /metrics/supervised_tokens"
# compare A B [ADAPTER_ABS LOSS_REL]: h5diff of the one trial file of results folders A and B:
# EXACT series exactly, /adapter within ADAPTER_ABS (h5diff -d), /metrics/loss within LOSS_REL
# (h5diff -p; both exactly when not given). Sets DIFFER to what differs and MAXD to the largest
# differences found ("adapter X abs, loss Y rel").
compare() {
  local a b obj
  DIFFER=""
  a=$(ls "$1"/results/tiny/trial-*.h5 | grep -v ckpt) b=$(ls "$2"/results/tiny/trial-*.h5 | grep -v ckpt)
  for obj in $EXACT; do
    h5diff -q "$a" "$b" "$obj" "$obj" > /dev/null 2>&1 || DIFFER="$DIFFER $obj"
  done
  h5diff -q -d "${3:-0}" "$a" "$b" /adapter /adapter > /dev/null 2>&1 || DIFFER="$DIFFER /adapter"
  h5diff -q -p "${4:-0}" "$a" "$b" /metrics/loss /metrics/loss > /dev/null 2>&1 || DIFFER="$DIFFER /metrics/loss"
  # h5diff -r rows: [ i ] a b |a - b| (the absolute difference, also under -p)
  MAXD="adapter $(h5diff -r "$a" "$b" /adapter /adapter 2>/dev/null |
    awk '/^\[/ { v = $NF; if (v < 0) v = -v; if (v > m) m = v } END { printf "%.2g", m + 0 }') abs, loss $(
    h5diff -r "$a" "$b" /metrics/loss /metrics/loss 2>/dev/null |
    awk '/^\[/ && $(NF - 2) != 0 { v = $NF / $(NF - 2); if (v < 0) v = -v; if (v > m) m = v } END { printf "%.2g", m + 0 }') rel"
}
rows() { h5dump -H -d /metrics/step "$(ls "$1"/results/tiny/trial-*.h5 | grep -v ckpt)" | sed -n 's/.*SIMPLE { ( \([0-9]*\) ).*/\1/p'; }

# ---- 2 ranks x grad_accum 1 == grad_accum 2; rank 1 in a folder of its own --------------------
mkdir one r0 r1 out && cp -r data tiny.lua one/ && cp -r data tiny.lua r0/ && cp -r data tiny.lua r1/
(cd one && "$GM" tiny.lua "${T1[@]}" --set grad_accum=2 > run.log 2>&1) \
  && { pass=$((pass + 1)); echo "ok    one process, grad_accum 2: $(rows one) steps"; } \
  || { fail=$((fail + 1)); echo "FAIL  one process, grad_accum 2"; tail -5 one/run.log; }
touch stamp
sleep 1 # (file times have a second's resolution on some file systems)
t0=$(date +%s.%N)
"${MPIRUN[@]}" --output-filename "$TMP/out" -np 1 --wdir "$TMP/r0" "$GM" "$TMP/r0/tiny.lua" "${T1[@]}" --set grad_accum=1 \
  : -np 1 --wdir "$TMP/r1" "$GM" "$TMP/r0/tiny.lua" "${T1[@]}" --set grad_accum=1 > mpi.log 2>&1
rc=$?
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if grep -q "built without MPI" mpi.log out/1/rank.*/stderr 2>/dev/null; then
  skip_unless_ci "data-parallel training: this gemmarun was built without MPI"
  finish
  exit $?
fi
[ $rc = 0 ] && { pass=$((pass + 1)); echo "ok    mpirun -np 2, grad_accum 1: exit 0 ($wall s)"; } \
  || { fail=$((fail + 1)); echo "FAIL  mpirun -np 2: exit $rc"; tail -5 mpi.log; cat out/1/rank.*/stderr 2>/dev/null | tail -5; }
compare one r0 ""
d=$DIFFER
[ -z "$d" ] && [ "$(rows r0)" = 24 ] \
  && { pass=$((pass + 1)); echo "ok    2 ranks x grad_accum 1 == grad_accum 2: 24 steps, lr, tokens, loss, adapter bit for bit"; } \
  || { fail=$((fail + 1)); echo "FAIL  2 ranks x grad_accum 1 differ from grad_accum 2:$d (largest: $MAXD, $(rows r0) steps)"; }
[ -z "$(find r1 -newer stamp)" ] && [ ! -e r1/results ] \
  && { pass=$((pass + 1)); echo "ok    rank 1 wrote nothing (its folder is as it was)"; } \
  || { fail=$((fail + 1)); echo "FAIL  rank 1 wrote: $(find r1 -newer stamp | head -5 | tr '\n' ' ')"; }
[ -s out/1/rank.0/stdout ] && grep -q "final accuracy" out/1/rank.0/stdout && [ ! -s out/1/rank.1/stdout ] \
  && [ ! -s out/1/rank.1/stderr ] \
  && { pass=$((pass + 1)); echo "ok    rank 0 printed the run, rank 1 printed nothing"; } \
  || { fail=$((fail + 1)); echo "FAIL  printing: rank 1 said '$(head -c 300 out/1/rank.1/stdout out/1/rank.1/stderr 2>&1)'"; }
attr() { h5dump -a "$1" "$(ls "$2"/results/tiny/trial-*.h5)" 2>/dev/null | sed -n 's/.*(0): "*\([^"]*\)"*.*/\1/p'; }
meas=$(attr /memory/measured_peak_rss r0) plan=$(attr /memory/planned_total r0) mpi=$(attr /memory/planned_mpi r0)
# (not under ASan, whose shadow memory is what it would measure: GM_SANITIZE, docs/testing.md)
[ -n "$mpi" ] && [ -n "$meas" ] && { [ "$meas" -le "$plan" ] || [ -n "${GM_SANITIZE:-}" ]; } \
  && { pass=$((pass + 1)); echo "ok    rank 0's peak within the plan with MPI's item: $((meas / 1024)) KiB measured, $((plan / 1024)) KiB planned"; } \
  || { fail=$((fail + 1)); echo "FAIL  rank 0's peak $meas over the plan $plan (planned_mpi '$mpi')"; }
ws=$(h5dump -a /provenance/world_size "$(ls r0/results/tiny/trial-*.h5)" 2>/dev/null | sed -n 's/.*(0): "\(.*\)".*/\1/p')
[ "$ws" = 2 ] && { pass=$((pass + 1)); echo "ok    the trial records world_size 2 (/provenance)"; } \
  || { fail=$((fail + 1)); echo "FAIL  /provenance world_size is '$ws'"; }

# ---- 2 ranks x grad_accum 2 == grad_accum 4 (dropout; a short last step) ----------------------
for variant in "dropout:--set dropout=0.1 --set lr=1e-3" "batch 5, rank 1 without a share of the last step:--set batch=5 --set lr=1e-3"; do
  name=${variant%%:*}
  read -ra extra <<< "${variant#*:}"
  rm -rf a b && mkdir a b && cp -r data tiny.lua a/ && cp -r data tiny.lua b/
  (cd a && "$GM" tiny.lua "${T1[@]}" "${extra[@]}" --set grad_accum=4 > run.log 2>&1) || { echo "      one process failed:"; tail -3 a/run.log; }
  (cd b && "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${T1[@]}" "${extra[@]}" --set grad_accum=2 > run.log 2>&1) || { echo "      mpirun failed:"; tail -3 b/run.log; }
  compare a b "$TOL_AD" "$TOL_LOSS"
  d=$DIFFER
  [ -z "$d" ] && [ -n "$(rows b)" ] \
    && { pass=$((pass + 1)); echo "ok    2 ranks x grad_accum 2 == grad_accum 4 ($name): $(rows b) steps, lr, tokens exactly; adapter within $TOL_AD, loss within $TOL_LOSS relative (largest: $MAXD)"; } \
    || { fail=$((fail + 1)); echo "FAIL  2 ranks x grad_accum 2 vs grad_accum 4 ($name):$d (largest: $MAXD; bounds $TOL_AD abs, $TOL_LOSS rel)"; }
done

# ---- rank 1 killed mid-training; the rerun resumes; another world size is refused -------------
rm -rf straight killed && mkdir straight killed && cp -r data tiny.lua straight/ && cp -r data tiny.lua killed/
LONG=("${T1[@]}" --set grad_accum=1 --set lr=1e-3)
(cd straight && EPOCHS=8 "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${LONG[@]}" > run.log 2>&1) \
  || { echo "      the uninterrupted run failed:"; tail -3 straight/run.log; }
# a failure on rank 0 alone (its first checkpoint cannot be written: a folder where the .tmp
# goes): rank 1, already in the next step's all-reduce, must not wait forever
id=$(ls straight/results/tiny/ | grep -v ckpt | sed -n 's/\.h5$//p' | head -1)
rm -rf wfail && mkdir wfail && cp -r data tiny.lua wfail/ && mkdir -p "wfail/results/tiny/$id.ckpt.h5.tmp"
expect_run "a write failing on rank 0 alone stops every rank (MPI_Abort) with the reason, no rank left waiting" 1 \
  "rank 0 of 2: trial 1/2 failed: saving checkpoint .*ckpt\.h5.*stopping every rank of the run \(MPI_Abort\)" \
  -- bash -c "cd wfail && EPOCHS=8 exec timeout 120 ${MPIRUN[*]} -np 2 '$GM' tiny.lua ${LONG[*]}"
status=$(h5dump -a /status "wfail/results/tiny/$id.h5" 2>/dev/null | sed -n 's/.*(0): "\(.*\)".*/\1/p')
[ "$status" = interrupted ] && { pass=$((pass + 1)); echo "ok    rank 0 recorded the trial as interrupted before stopping"; } \
  || { fail=$((fail + 1)); echo "FAIL  the trial's status after the failed write: '$status'"; }
# signal_rank_after_checkpoint RANK SIGNAL: once rank 0 has written a checkpoint, sends SIGNAL to
# the child of mpirun ($mpid) whose environment says OMPI_COMM_WORLD_RANK=RANK; sets victim
signal_rank_after_checkpoint() {
  victim=""
  local c
  for _ in $(seq 1 600); do
    if ls results/tiny/trial-*.ckpt.h5 > /dev/null 2>&1; then
      for c in $(pgrep -P $mpid); do
        tr '\0' '\n' < /proc/$c/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && victim=$c
      done
      [ -n "$victim" ] && kill "$2" "$victim" && break
    fi
    kill -0 $mpid 2>/dev/null || break
    sleep 0.05
  done
}
cd killed
EPOCHS=8 "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${LONG[@]}" > run.log 2>&1 &
mpid=$!
# rank 1: the child of mpirun whose environment says OMPI_COMM_WORLD_RANK=1; killed once rank 0
# has written a checkpoint (every 5 steps; 48 steps in all)
signal_rank_after_checkpoint 1 -9
# the run must end by itself: rank 0 must not wait forever for the dead rank
ended=""
for _ in $(seq 1 600); do kill -0 $mpid 2>/dev/null || { ended=1; break; }; sleep 0.1; done
[ -z "$ended" ] && kill -TERM $mpid 2>/dev/null
wait $mpid
krc=$?
[ -n "$victim" ] && [ -n "$ended" ] && [ $krc != 0 ] && ls results/tiny/trial-*.ckpt.h5 > /dev/null 2>&1 \
  && { pass=$((pass + 1)); echo "ok    rank 1 killed (-9) mid-training: the run ended by itself (exit $krc), the checkpoint is there"; } \
  || { fail=$((fail + 1)); echo "FAIL  kill of rank 1: victim '$victim', ended '${ended:-no: hung 60 s}', exit $krc"; tail -3 run.log; }
expect_run "a resume on 1 process of a trial started on 2 is refused, naming world_size" 1 \
  "started on 2 processes \(world_size\) and is resumed on 1" -- env EPOCHS=8 "$GM" tiny.lua "${LONG[@]}"
expect_run "the rerun on 2 processes resumes from the checkpoint and completes" 0 "resuming from step [1-9][0-9]*.*final accuracy" \
  -- env EPOCHS=8 "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${LONG[@]}"
cd ..
# Ctrl-C reaching rank 0 only: every rank stops at the same step, rank 0 saves the checkpoint
# and the trial as interrupted, all exit 1 together; the rerun resumes and ends equal
rm -rf ctrlc && mkdir ctrlc && cp -r data tiny.lua ctrlc/
cd ctrlc
EPOCHS=8 "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${LONG[@]}" > run.log 2>&1 &
mpid=$!
signal_rank_after_checkpoint 0 -INT
ended=""
for _ in $(seq 1 600); do kill -0 $mpid 2>/dev/null || { ended=1; break; }; sleep 0.1; done
[ -z "$ended" ] && kill -TERM $mpid 2>/dev/null
wait $mpid
irc=$?
status=$(h5dump -a /status "$(ls results/tiny/trial-*.h5 | grep -v ckpt)" 2>/dev/null | sed -n 's/.*(0): "\(.*\)".*/\1/p')
[ -n "$victim" ] && [ -n "$ended" ] && [ $irc = 1 ] && [ "$status" = interrupted ] \
  && grep -q "interrupted at step [0-9]*: checkpoint saved" run.log && ! grep -q MPI_ABORT run.log \
  && { pass=$((pass + 1)); echo "ok    Ctrl-C on rank 0: every rank stopped ($(grep -o 'interrupted at step [0-9]*' run.log | head -1)), checkpoint saved, exit 1 without MPI_Abort"; } \
  || { fail=$((fail + 1)); echo "FAIL  Ctrl-C on rank 0: victim '$victim', ended '${ended:-no: hung 60 s}', exit $irc, status '$status'"; tail -5 run.log; }
expect_run "after Ctrl-C, the rerun on 2 processes resumes and completes" 0 "resuming from step [1-9][0-9]*.*final accuracy" \
  -- env EPOCHS=8 "${MPIRUN[@]}" -np 2 "$GM" tiny.lua "${LONG[@]}"
cd ..
compare straight ctrlc ""
d=$DIFFER
[ -z "$d" ] && [ "$(rows ctrlc)" = 48 ] \
  && { pass=$((pass + 1)); echo "ok    the run resumed after Ctrl-C equals the uninterrupted one bit for bit"; } \
  || { fail=$((fail + 1)); echo "FAIL  the run resumed after Ctrl-C differs:$d (largest: $MAXD, $(rows ctrlc) steps)"; }
compare straight killed ""
d=$DIFFER
[ -z "$d" ] && [ "$(rows killed)" = 48 ] \
  && { pass=$((pass + 1)); echo "ok    the resumed run equals the uninterrupted one bit for bit (48 steps)"; } \
  || { fail=$((fail + 1)); echo "FAIL  the resumed run differs from the uninterrupted one:$d (largest: $MAXD, $(rows killed) steps)"; }
[ -z "$(ls killed/results/tiny | grep -E 'ckpt|tmp')" ] && { pass=$((pass + 1)); echo "ok    no checkpoint or .tmp left"; } \
  || { fail=$((fail + 1)); echo "FAIL  left behind: $(ls killed/results/tiny | grep -E 'ckpt|tmp')"; }

finish
