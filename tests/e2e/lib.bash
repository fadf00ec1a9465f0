# Shared helpers for the end-to-end tests (sourced). Each test prints one line per check and a
# closing "N passed, N failed" line; exit status 1 if anything failed.
GM=${1:?usage: test.sh path/to/gemmarun}
pass=0
fail=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# expect_run NAME WANT_EXIT PATTERN -- command...: runs the command, checks its exit status and
# that its combined output matches the extended regex PATTERN.
expect_run() {
  local name=$1 want=$2 pat=$3
  shift 4
  local out rc
  out=$("$@" 2>&1) && rc=0 || rc=$?
  # the pattern may match within a line, or span lines (-z: the whole output as one record)
  if [ "$rc" = "$want" ] && { printf '%s' "$out" | grep -Eq -- "$pat" || printf '%s' "$out" | grep -Ezq -- "$pat"; }; then
    pass=$((pass + 1))
    echo "ok    $name"
  else
    fail=$((fail + 1))
    echo "FAIL  $name: exit $rc (want $want), output did not match /$pat/:"
    printf '%s\n' "$out" | head -20 | sed 's/^/      /'
  fi
}

# skip_unless_ci WHAT: a check that cannot run here (a missing tool) is a skip on a developer's
# machine and a failure under CI (CI set, not 0/false), where setup.sh installs every tool.
skip_unless_ci() {
  case "${CI:-}" in
    "" | 0 | false) echo "skip  $1" ;;
    *) fail=$((fail + 1)); echo "FAIL  $1 (CI is set: a skip is a failure here)" ;;
  esac
}

# find_python IMPORTS: sets PY to the first Python that can run "import IMPORTS": Debian's
# python3-h5py/-pandas/-tables (setup.sh installs them) or the reference venv; PATH may hold a
# python without them (pyenv). PY is empty when none can.
find_python() {
  PY=""
  local p
  for p in python3 /usr/bin/python3 /opt/refvenv/bin/python; do
    if command -v "$p" >/dev/null && "$p" -c "import $1" 2>/dev/null; then PY=$p; return 0; fi
  done
}

# peers_python: sets PEERS to a Python with the real peers - torch, transformers, PEFT (the venv
# tests/peers/setup.sh installs for CI, else the reference venv of tests/ref/README.md); empty when
# neither is there.
peers_python() {
  PEERS=""
  local p
  for p in "${GEMMARUN_HOME:-$HOME/.cache/gemmarun}/peers-venv/bin/python" /opt/refvenv/bin/python; do
    if [ -x "$p" ] && "$p" -c "import torch, transformers, peft" 2>/dev/null; then PEERS=$p; return 0; fi
  done
}

# tol NAME: the tolerance NAME from the one table of tolerances (tests/unit/test_util.h).
# wav_16k SRC DST: the 8 kHz 16-bit mono recording SRC as a 16 kHz one in DST, linearly interpolated
# (with $PEERS: peers_python first), so that gemmarun and transformers read the same samples without
# either resampling.
wav_16k() {
  "$PEERS" -c "
import sys, wave, numpy as np
w = wave.open(sys.argv[1]); x = np.frombuffer(w.readframes(w.getnframes()), dtype='<i2').astype(np.float64)
y = np.interp(np.arange(2 * len(x)) / 2.0, np.arange(len(x)), x).round().astype('<i2')
o = wave.open(sys.argv[2], 'wb'); o.setnchannels(1); o.setsampwidth(2); o.setframerate(16000); o.writeframes(y.tobytes()); o.close()" "$1" "$2"
}

tol() {
  sed -n "s/^#define $1 \([^ ]*\).*/\1/p" "$(dirname "${BASH_SOURCE[0]}")/../unit/test_util.h"
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

# The real model's path in the cache; fails (does not download) when it is missing.
real_model() {
  local p="${GEMMARUN_HOME:-$HOME/.cache/gemmarun}/models/gemma-3-270m-q4_k_m.gguf"
  if [ ! -r "$p" ]; then
    echo "the real model is not in the cache ($p): run \`$GM fetch gemma3-270m\`" >&2
    return 1
  fi
  echo "$p"
}

# tiny_fixture SRC EPOCHS: writes, in the working folder, data/ (a labelled folder: apple, berry,
# cherry, 10 short notes each) and tiny.lua (classify them with the tiny random Gemma 3 with a
# tokenizer, SRC/tests/ref/tiny_gemma3_chat: a grid of 2 lr x 2 seeds; $EPOCHS epochs, by
# default EPOCHS).
tiny_fixture() {
  local lab i
  for lab in apple berry cherry; do
    mkdir -p data/$lab
    for i in 1 2 3 4 5 6 7 8 9 10; do echo "a short note $i about the $lab" > data/$lab/$i.txt; done
  done
  cat > tiny.lua <<EOF
return experiment {
  name = "tiny",
  model = "$1/tests/ref/tiny_gemma3_chat",
  task = classify { data = data.folder { root = "data" }, prompt = "Which fruit?" },
  train = { epochs = math.tointeger(tonumber(env("EPOCHS", "$2"))), batch = 2, lr = 1e-2, rank = 4, alpha = 8,
            max_length = 64, checkpoint_every = 5 },
  sweep = grid { lr = {1e-2, 3e-3} },
  seeds = {1, 2},
  report = table { rows = {"lr"}, metric = "accuracy" },
}
EOF
}

# Series and tensors of a trial file that must come out equal when the same trial runs again
# (elapsed time, tokens/s and memory are measurements).
DETERMINISTIC="/metrics/step /metrics/loss /metrics/lr /metrics/grad_norm /metrics/supervised_tokens /adapter /eval/baseline /eval/final"
# same_trials A B: every trial file of results folder A equals B's on DETERMINISTIC (h5diff, no
# tolerance); prints the differences (nothing when equal)
same_trials() {
  local f id differ="" n=0
  for f in "$2"/trial-*.h5; do
    case "$f" in *.ckpt.h5) continue ;; esac
    id=$(basename "$f")
    n=$((n + 1))
    [ -f "$1/$id" ] || { differ="$differ $id:missing"; continue; }
    for obj in $DETERMINISTIC; do
      h5diff -q "$1/$id" "$f" "$obj" "$obj" > /dev/null 2>&1 || differ="$differ $id:$obj"
    done
  done
  [ "$n" -gt 0 ] || differ=" (no trial files in $2)"
  printf '%s' "$differ"
}
# acc_table FILE.md: the accuracy table of a rendered results file (the memory table below it holds
# measurements)
acc_table() { sed '/^Peak memory/,$d' "$1"; }

# trials_fall_and_fit DIR [W]: with $PY (find_python h5py), checks every trial file of results
# folder DIR: the mean loss of its last W logged steps below that of its first W (W = 1: the last
# step below the first), and its measured peak memory within TOL_PLAN_PEAK_REL of its plan (not
# compared in sanitizer builds, GM_SANITIZE). Prints "ok N" (N trials), or the first failure.
trials_fall_and_fit() {
  "$PY" - "$1" "${2:-1}" "$(tol TOL_PLAN_PEAK_REL)" <<'PYEOF'
import glob, h5py, os, sys
d, w, tol = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
n = 0
for p in sorted(glob.glob(d + '/trial-*.h5')):
    if p.endswith('.ckpt.h5'): continue
    f = h5py.File(p, 'r')
    loss = f['metrics/loss'][:]
    assert loss[-w:].mean() < loss[:w].mean(), (p, loss)
    m = f['memory'].attrs
    pl, r = float(m['planned_total']), float(m['measured_peak_rss'])
    assert os.environ.get('GM_SANITIZE') or abs(r - pl) <= tol * pl, (p, r, pl)
    n += 1
print('ok', n)
PYEOF
}

# same_ckpt_trial DIR CKPT_DIR LR: the trial of results folder DIR trained at learning rate LR and
# the only trial of CKPT_DIR (the same one with activation checkpointing on) have the same loss and
# grad-norm series, adapter and final evaluation, bit for bit; counts one check.
same_ckpt_trial() {
  local f plain="" ck differ=""
  for f in "$1"/trial-*.h5; do
    case "$f" in *.ckpt.h5) continue ;; esac
    h5dump -a /config_json "$f" 2>/dev/null | grep -q "lr.:$3[^0-9]" && plain=$f
  done
  ck=$(ls "$2"/trial-*.h5 2>/dev/null | grep -v '\.ckpt\.h5' | head -1)
  for obj in /metrics/loss /metrics/grad_norm /adapter /eval/final; do
    h5diff -q "$plain" "$ck" "$obj" "$obj" > /dev/null 2>&1 || differ="$differ $obj"
  done
  if [ -n "$plain" ] && [ -n "$ck" ] && [ -z "$differ" ]; then
    pass=$((pass + 1)); echo "ok    checkpointing on == off: loss and grad-norm series, adapter, final evaluation bit for bit"
  else
    fail=$((fail + 1)); echo "FAIL  checkpointing on vs off ($plain vs $ck) differ in:${differ:- (no trial file)}"
  fi
}

# A small data set in Oxford-IIIT Pet's official layout under ./pets (images/<Breed>_<n>.jpg,
# annotations/trainval.txt and test.txt): 2 real JPEGs per breed (tests/ref/images, cycled), the
# first of each breed for training, the second of every 9th breed for testing (5). $1: the source tree.
pets_layout() {
  local classes jpgs k c id name n
  classes=(Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay boxer
    British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired great_pyrenees
    havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland Persian pomeranian pug Ragdoll
    Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese Sphynx staffordshire_bull_terrier
    wheaten_terrier yorkshire_terrier)
  jpgs=("$1"/tests/ref/images/*.jpg)
  mkdir -p pets/images pets/annotations
  : > pets/annotations/trainval.txt
  : > pets/annotations/test.txt
  k=0
  for c in "${!classes[@]}"; do
    id=$((c + 1)) name=${classes[$c]}
    for n in 1 2; do
      cp "${jpgs[$((k % ${#jpgs[@]}))]}" "pets/images/${name}_$n.jpg"
      k=$((k + 1))
    done
    echo "${name}_1 $id $((c % 2 + 1)) $id" >> pets/annotations/trainval.txt
    # a test image for every 9th breed (5 in all: 5 x 37 scored label sequences per evaluation)
    [ $((c % 9)) -eq 0 ] && echo "${name}_2 $id $((c % 2 + 1)) $id" >> pets/annotations/test.txt
  done
}
