#!/usr/bin/env bash
# `gemmarun submit --slurm` on a real Slurm (issue 17): this test starts a one-node Slurm from
# Debian's packages (slurm-wlm, munge) - munged, slurmctld and slurmd with a slurm.conf, key and
# state of its own under a temporary folder, on ports of its own - and on the tiny Gemma 3:
#   - submits the 4-trial sweep as a job array + tables job, waits, and checks that every trial
#     file equals a local run's (h5diff, no tolerance) and the merged table is the same;
#   - submits another copy, cancels one array task mid-trial (scancel: SIGTERM), lets the rest
#     end, submits again: only that trial is submitted, it resumes from its checkpoint, the
#     finished trials' files are untouched and everything ends equal to the local run;
#   - a trial no node can hold is refused by Slurm itself (a partition of a 48 MiB node), with
#     a message naming the memory asked for and what to change, nothing submitted;
#   - `srun -n 2` runs one trial data-parallel (the world from Slurm's PMIx environment), equal to one
#     process with grad_accum 2;
#   - two processes on one trial: the second leaves it to the first (the trial lock).
# Without the daemons (not root, packages missing) the test says why: a skip on a developer's
# machine, a failure under CI. It stops its daemons and jobs on exit.
source "$(dirname "$0")/lib.bash"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
cd "$TMP"

check() { # check NAME CONDITION...: ok when the command succeeds
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); echo "ok    $name"; else fail=$((fail + 1)); echo "FAIL  $name"; fi
}
finish() { echo "$pass passed, $fail failed"; [ "$fail" = 0 ]; exit $?; }

# ---- the daemons --------------------------------------------------------------------------------
why=""
for tool in munged slurmctld slurmd sbatch squeue scancel sinfo h5diff; do
  command -v $tool > /dev/null || why="$why $tool"
done
[ -n "$why" ] && why="not installed:$why (setup.sh installs slurm-wlm and munge)"
[ -z "$why" ] && [ "$(id -u)" != 0 ] && why="slurmd runs jobs as root here (SlurmdUser=root): run the test as root"
if [ -n "$why" ]; then
  skip_unless_ci "a real Slurm: $why"
  finish
fi

SL=$TMP/slurm
mkdir -p "$SL/state" "$SL/spool" "$SL/munge" "$SL/sock"
chmod 700 "$SL/munge"
# munged wants every folder above its socket searchable by all (mktemp -d makes $TMP 0700)
chmod 711 "$TMP" "$SL" "$SL/sock"
head -c 1024 /dev/urandom > "$SL/munge/munge.key"
chmod 600 "$SL/munge/munge.key"
HOST=$(hostname -s)
PORT=$((20000 + RANDOM % 20000))
export SLURM_CONF=$SL/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=gmtest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SL/sock/munge
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
StateSaveLocation=$SL/state
SlurmdSpoolDir=$SL/spool
SlurmctldPidFile=$SL/slurmctld.pid
SlurmdPidFile=$SL/slurmd.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmdLogFile=$SL/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=20
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2048 State=UNKNOWN
NodeName=small NodeAddr=127.0.0.2 CPUs=$(nproc) RealMemory=48 State=FUTURE
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=small Nodes=small MaxTime=INFINITE State=UP
EOF
stop_slurm() {
  scancel --quiet --user=root > /dev/null 2>&1 || true
  local p
  for p in "$SL/slurmd.pid" "$SL/slurmctld.pid" "$SL/munge/pid"; do
    [ -f "$p" ] && kill "$(cat "$p")" 2> /dev/null
  done
  sleep 1
  for p in "$SL/slurmd.pid" "$SL/slurmctld.pid" "$SL/munge/pid"; do
    [ -f "$p" ] && kill -9 "$(cat "$p")" 2> /dev/null
  done
  rm -rf "$TMP"
}
trap stop_slurm EXIT
started=""
munged --socket="$SL/sock/munge" --key-file="$SL/munge/munge.key" --log-file="$SL/munge/log" \
  --pid-file="$SL/munge/pid" --seed-file="$SL/munge/seed" 2> "$SL/munged.err" \
  && slurmctld -f "$SLURM_CONF" 2> "$SL/slurmctld.err" && slurmd -f "$SLURM_CONF" -N "$HOST" 2> "$SL/slurmd.err" && started=1
for _ in $(seq 1 60); do
  [ -z "$started" ] && break
  sinfo -h -p debug -o %t 2> /dev/null | grep -q idle && break
  sleep 0.5
done
if ! sinfo -h -p debug -o %t 2> /dev/null | grep -q idle; then
  fail=$((fail + 1))
  echo "FAIL  the one-node Slurm did not start (munged, slurmctld, slurmd; ports $PORT-$((PORT + 1))):"
  tail -n 5 "$SL"/*.err "$SL"/*.log "$SL/munge/log" 2> /dev/null | sed 's/^/      /'
  finish
fi
echo "      Slurm $(sinfo --version | cut -d' ' -f2): node $HOST idle, ports $PORT-$((PORT + 1))"

# wait_jobs: until the queue is empty (at most 300 s)
wait_jobs() {
  local i
  for i in $(seq 1 600); do
    [ -z "$(squeue -h -o %i 2> /dev/null)" ] && return 0
    sleep 0.5
  done
  echo "      (jobs still queued after 300 s: $(squeue -h -o '%i %t %r' | tr '\n' ';'))"
  return 1
}

# ---- a local run to compare with ------------------------------------------------------------------
tiny_fixture "$SRC" 40
mkdir straight && cp -r data tiny.lua straight/
(cd straight && "$GM" tiny.lua --threads 1 > run.log 2>&1)
check "a local run of the sweep: 4 trials" [ "$(ls straight/results/tiny/trial-*.h5 | grep -vc ckpt)" = 4 ]

# ---- usage ------------------------------------------------------------------------------------------
expect_run "submit without a scheduler says which" 2 "say which scheduler: --slurm" -- "$GM" submit tiny.lua
expect_run "an unknown option names it and where sbatch's go" 2 "unknown option or missing value: --acount.*options for sbatch itself go after --" \
  -- "$GM" submit tiny.lua --slurm --acount x
expect_run "a bad --max-parallel" 2 "bad value for --max-parallel: 0 \(expected a positive integer\)" -- "$GM" submit tiny.lua --slurm --max-parallel 0
expect_run "--trial names an id no trial has" 2 "--trial abcdef123456: no trial of this experiment has that id" -- "$GM" tiny.lua --trial abcdef123456

# ---- --print: the scripts, nothing submitted ------------------------------------------------------
mkdir printed && cp -r data tiny.lua printed/
cd printed
expect_run "--print writes the scripts and prints the sbatch commands" 0 \
  "4 of 4 trials pending.*sbatch --parsable --array=1-4%2 --mem=64M --time=5:00 .*/results/tiny/slurm/trials.sbatch.*--dependency=afterany:\\\$a1.*not submitted" \
  -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1 --max-parallel 2 --print -- --time=5:00
check "the array script maps each index to its trial id and runs it with --no-tables" \
  grep -q "exec .*gemmarun' .*tiny.lua' --trial \"\$trial\" --no-tables\|exec .*gemmarun .*tiny.lua --trial \"\$trial\" --no-tables" results/tiny/slurm/trials.sbatch
ids=$(sed -n 's/^  [0-9]*) trial=\([0-9a-f]*\) ;;$/\1/p' results/tiny/slurm/trials.sbatch | sort | tr '\n' ' ')
want=$(ls ../straight/results/tiny/ | sed -n 's/^trial-\([0-9a-f]*\)\.h5$/\1/p' | sort | tr '\n' ' ')
check "the script's trial ids are the local run's ($want)" [ "$ids" = "$want" ]
check "nothing was submitted" [ -z "$(squeue -h -o %i)" ]
# trials on a GPU: planned and submitted from a host without one, each asking Slurm for a GPU
expect_run "--set device=cuda: submitted from a host without a GPU, one GPU per trial" 0 "4 of 4 trials pending" \
  -- env CUDA_VISIBLE_DEVICES= "$GM" submit tiny.lua --slurm --cpus-per-trial 1 --print --set device=cuda
check "the array script asks for one GPU per trial and passes the device on" \
  bash -c "grep -q '^#SBATCH --gres=gpu:1$' results/tiny/slurm/trials.sbatch && grep -q 'device=cuda' results/tiny/slurm/trials.sbatch"
expect_run "the same without --set device: no GPU asked for" 0 "4 of 4 trials pending" \
  -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1 --print
check "the array script asks for no GPU" bash -c "! grep -q 'gres=gpu' results/tiny/slurm/trials.sbatch"
# the file's sweep reordered after the script was written: index 1's id (lr 0.01, seed 1) is now
# the sweep's trial 3 (seeds vary fastest), and --trial ID still finds it
id1=$(sed -n 's/^  1) trial=\([0-9a-f]*\) ;;$/\1/p' results/tiny/slurm/trials.sbatch)
sed -i 's/lr = {1e-2, 3e-3}/lr = {3e-3, 1e-2}/' tiny.lua
expect_run "after the sweep is reordered, the script's id still names its trial (now the 3rd)" 0 "trial  3  $id1  lr=0.01 seed=1" \
  -- "$GM" tiny.lua --trial "$id1" --dry-run
cd ..

# ---- submit, wait, compare ------------------------------------------------------------------------
mkdir cluster && cp -r data tiny.lua cluster/
cd cluster
expect_run "submit: one array (4 trials, one memory class) and the tables job after it" 0 \
  "4 of 4 trials pending.*submitted: array job [0-9]+, tables job [0-9]+ after it" -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1
check "the jobs end (within 300 s)" wait_jobs
n_done=0
for f in results/tiny/trial-*.h5; do
  case "$f" in *.ckpt.h5) continue ;; esac
  h5dump -a /status "$f" 2> /dev/null | grep -q '"completed"' && n_done=$((n_done + 1))
done
check "4 trial files, completed, one per array task" [ "$n_done" = 4 ] && [ "$(ls results/tiny/slurm/trial-*.out | wc -l)" = 4 ]
d=$(same_trials ../straight/results/tiny results/tiny)
check "every trial equals the local run's: series, adapters, evaluations${d:+ (differ:$d)}" [ -z "$d" ]
check "the tables job wrote the table, equal to the local run's" \
  bash -c '[ -s results/tiny.md ] && [ "$(sed "/^Peak memory/,\$d" results/tiny.md)" = "$(sed "/^Peak memory/,\$d" ../straight/results/tiny.md)" ]'
expect_run "submitting again when every trial is done submits nothing" 0 "nothing to submit: 4 of 4 trials are done" \
  -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1
cd ..

# ---- a task cancelled mid-trial, then submitted again ---------------------------------------------
mkdir killed && cp -r data tiny.lua killed/
cd killed
out=$("$GM" submit tiny.lua --slurm --cpus-per-trial 1 --max-parallel 1 2>&1)
job=$(printf '%s' "$out" | sed -n 's/.*submitted: array job \([0-9]*\),.*/\1/p')
first=$(sed -n 's/^  1) trial=\([0-9a-f]*\) ;;$/\1/p' results/tiny/slurm/trials.sbatch)
expect_run "submitting again while its tasks are queued submits nothing, naming the jobs" 1 \
  "jobs of this experiment, submitted from this folder, are still in the queue: ${job}_.*Nothing submitted" \
  -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1
# trial 1 runs first (--max-parallel 1); its first checkpoint (step 5) says it is mid-trial
for _ in $(seq 1 2400); do
  [ -f "results/tiny/trial-$first.ckpt.h5" ] && break
  sleep 0.05
done
check "trial 1 is mid-trial (a checkpoint, not completed) when it is cancelled" \
  bash -c "[ -f results/tiny/trial-$first.ckpt.h5 ] && ! h5dump -a /status results/tiny/trial-$first.h5 2> /dev/null | grep -q completed"
scancel "${job}_1"
check "the other jobs end" wait_jobs
check "the cancelled task saved a checkpoint and stopped (SIGTERM)" grep -q "interrupted at step [0-9]*: checkpoint saved" results/tiny/slurm/trial-1.job-$job.out
check "its log says to submit again" grep -q "resumes from its checkpoint when you submit the experiment again" results/tiny/slurm/trial-1.job-$job.out
declare -A kept
for f in results/tiny/trial-*.h5; do
  case "$f" in *.ckpt.h5) continue ;; esac
  h5dump -a /status "$f" 2> /dev/null | grep -q '"completed"' && kept[$f]=$(sha256sum "$f" | cut -c1-64)
done
check "the other 3 trials completed" [ "${#kept[@]}" = 3 ]
expect_run "submitting again submits the interrupted trial alone, to resume" 0 \
  "trial  1  $first .*\(interrupted: resumes from its checkpoint\).*1 of 4 trials pending \(3 done\).*submitted: array job" \
  -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1
check "its jobs end" wait_jobs
check "the trial resumed from its checkpoint" bash -c "cat results/tiny/slurm/trial-1.job-*.out | grep -q 'resuming from step [1-9]'"
changed=""
for f in "${!kept[@]}"; do [ "$(sha256sum "$f" | cut -c1-64)" = "${kept[$f]}" ] || changed="$changed $f"; done
check "the finished trials' files are untouched${changed:+ (changed:$changed)}" [ -z "$changed" ]
d=$(same_trials ../straight/results/tiny results/tiny)
check "every trial equals the local run's, the resumed one too${d:+ (differ:$d)}" [ -z "$d" ]
check "the tables (rendered again after the resumed trial) equal the local run's" \
  bash -c '[ "$(sed "/^Peak memory/,\$d" results/tiny.md)" = "$(sed "/^Peak memory/,\$d" ../straight/results/tiny.md)" ]'
cd ..

# ---- sbatch options that would break the submission; Ctrl-C between two sbatch calls ---------------
mkdir opts && cp -r data tiny.lua opts/
cd opts
for o in --dependency=afterok:1 --array=1-2 -o%j.out --output=x.out; do
  expect_run "sbatch option $o after --: refused, nothing submitted" 2 "sbatch option $o after --: gemmarun submit sets --[a-z]+ itself" \
    -- "$GM" submit tiny.lua --slurm -- --time=5:00 "$o"
done
check "nothing of those is queued" [ -z "$(squeue -h -o %i)" ]
# a slow sbatch (2 s) on PATH: Ctrl-C while the array's sbatch runs stops before the tables job's
mkdir -p slow && printf '#!/bin/sh\nsleep 2\nexec %s "$@"\n' "$(command -v sbatch)" > slow/sbatch && chmod +x slow/sbatch
PATH=$PWD/slow:$PATH "$GM" submit tiny.lua --slurm --cpus-per-trial 1 --set epochs=1 > int.log 2>&1 &
pid=$!
sleep 1
kill -INT $pid
wait $pid && rc=0 || rc=$?
check "Ctrl-C during submit: exit 1, the tables job not submitted, the array named for scancel" \
  bash -c "[ $rc = 1 ] && grep -q 'interrupted (Ctrl-C or SIGTERM) before it the tables' int.log && grep -q 'submitted before it: a1 = job [0-9]*; scancel them' int.log"
scancel --quiet --user=root
check "its array ends (cancelled)" wait_jobs
cd ..

# ---- a % in the folder: sbatch's --output patterns kept literal ----------------------------------------
mkdir 'pct%j' && cp -r data tiny.lua 'pct%j'/
cd 'pct%j'
expect_run "submit from a folder with % in its name" 0 "submitted: array job" -- "$GM" submit tiny.lua --slurm --cpus-per-trial 1 --set epochs=1
check "its jobs end" wait_jobs
check "the tasks' logs and trial files are in that folder" \
  bash -c "[ \"\$(ls results/tiny/slurm/trial-*.out | wc -l)\" = 4 ] && [ \"\$(ls results/tiny/trial-*.h5 | grep -vc ckpt)\" = 4 ] && [ -s results/tiny.md ]"
# four renders of one experiment at once take turns (the tables lock): all succeed
for i in 1 2 3 4; do "$GM" table results/tiny > render$i.log 2>&1 & done
wait
check "four renders at once all write the tables, no .tmp left" \
  bash -c "[ \"\$(grep -l '^wrote results/tiny.md' render*.log | wc -l)\" = 4 ] && ! ls results | grep -q tmp"
cd ..

# ---- a trial no node can hold ------------------------------------------------------------------------
mkdir small && cp -r data tiny.lua small/
cd small
expect_run "a trial no node of the partition can hold: Slurm refuses it, the message says what to change" 1 \
  "--mem=64M.*sbatch failed \(exit 1\) for trials 1, 2, 3, 4 \(plan up to [0-9.]+ MiB; 64 MiB each\): .*(node configuration is not available|Memory specification).*hint: a node of the partition must hold the memory.*nothing was submitted" \
  -- "$GM" submit tiny.lua --slurm --partition small
check "nothing of it is queued" [ -z "$(squeue -h -o %i)" ]
sh results/tiny/slurm/submit.sh > bysh.log 2>&1 && rc=0 || rc=$?
check "its submit.sh, run by hand, stops at the failed sbatch (exit $rc, no tables job)" \
  bash -c "[ $rc != 0 ] && grep -q 'node configuration is not available' bysh.log && ! grep -q 'tables: job' bysh.log"
cd ..

# ---- a data-parallel trial under srun: the world from Slurm's environment (PMIx) -----------------------
# 2 ranks x grad_accum 1 train as 1 process x grad_accum 2 (docs/scaling.md): bit-identical here, as in
# e2e_data_parallel under mpirun (its tolerance table entry allows 1e-5 for longer accumulations)
if command -v mpirun > /dev/null; then
  mkdir srun && cp -r data tiny.lua srun/
  cd srun
  # (under the sanitizer run the ranks do not check leaks: Open MPI never frees its own allocations,
  # as in e2e_data_parallel)
  SRUN_ENV=()
  [ -n "${GM_SANITIZE:-}" ] && SRUN_ENV=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
  expect_run "srun -n 2 --mpi=pmix: one trial on 2 ranks, rank 0 writes the tables" 0 "final accuracy.*written: results/tiny.md" \
    -- "${SRUN_ENV[@]}" timeout 300 srun -n 2 --mpi=pmix --mem=1G "$GM" tiny.lua --trial 1 --threads 1
  f=$(ls results/tiny/trial-*.h5 | grep -v ckpt | head -1)
  check "the trial file says world_size 2 over mpi" bash -c "h5dump -a /provenance/world_size $f | grep -q '\"2\"' && h5dump -a /provenance/dist_transport $f | grep -q '\"mpi\"'"
  mkdir one && cp -r data tiny.lua one/
  (cd one && "$GM" tiny.lua --trial 1 --threads 1 --set grad_accum=2 > run.log 2>&1)
  g=$(ls one/results/tiny/trial-*.h5 | grep -v ckpt | head -1)
  check "it equals one process with grad_accum 2: adapter and loss series (h5diff, no tolerance)" \
    bash -c "h5diff -q $f $g /adapter /adapter && h5diff -q $f $g /metrics/loss /metrics/loss"
  cd ..
else
  skip_unless_ci "srun with a data-parallel trial: mpirun (Open MPI) is not installed"
fi

# ---- two processes on one trial -----------------------------------------------------------------------
mkdir twice && cp -r data tiny.lua twice/
cd twice
"$GM" tiny.lua --trial 1 --threads 1 > first.log 2>&1 &
pid=$!
for _ in $(seq 1 2400); do
  ls results/tiny/trial-*.ckpt.h5 > /dev/null 2>&1 && break
  sleep 0.05
done
# the first is paused while the second looks (it holds its lock stopped as running): the tiny trial
# can otherwise finish before the second process has loaded the model (it did, once training got
# faster, 2026-12-06)
kill -STOP $pid 2> /dev/null
expect_run "a second process on a running trial leaves it to the first" 1 \
  "trial 1/4  [0-9a-f]+  lr=0.01 seed=1: running in another process \(pid $pid on [^)]*\): left to it" -- "$GM" tiny.lua --trial 1 --threads 1
kill -CONT $pid 2> /dev/null
wait $pid
check "the first finishes its trial, equal to the local run's" \
  bash -c "[ \"\$(ls results/tiny/trial-*.h5 | grep -vc ckpt)\" = 1 ] && f=\$(ls results/tiny/trial-*.h5 | grep -v ckpt) && h5diff -q ../straight/results/tiny/\$(basename \$f) \$f /adapter /adapter"
cd ..

finish
