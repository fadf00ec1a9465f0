#!/usr/bin/env bash
# Forward-pass speed and memory of gemmarun beside its peers, in one run, same prompt ids,
# same thread count (docs/benchmarks.md records the results).
#   tests/bench/bench_forward.sh [TOKENS] [THREADS]
# Peers need the reference venv (tests/ref/README.md): GEMMARUN_REF_PY=/opt/refvenv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${1:-128}
N=${2:-2}
PY=${GEMMARUN_REF_PY:-/opt/refvenv/bin/python}
MODEL=$(build/gemmarun fetch gemma3-270m 2>/dev/null)
echo "# $(date -u +%F) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# prompt $T tokens, $N threads, model $MODEL"
build/tests/bench/bench_forward "$MODEL" --tokens "$T" --threads "$N" --repeat 3 --decode 32
# the int8 dots of decoding (what `gemmarun generate` decodes with unless --dot f32): llama.cpp's scheme, not the f32 numbers
build/tests/bench/bench_forward "$MODEL" --tokens "$T" --threads "$N" --repeat 3 --decode 32 --int8-dot 1 | grep decode
# the same with OpenMP waits that never spin (gemmarun's default before 2026-12-06: kernels.h, gm_kernels_startup)
echo "GOMP_SPINCOUNT=0: $(GOMP_SPINCOUNT=0 build/tests/bench/bench_forward "$MODEL" --tokens "$T" --threads "$N" --repeat 3 --decode 32 --int8-dot 1 | grep decode)"
if [ -x "$PY" ]; then
  OMP_NUM_THREADS=$N "$PY" tests/bench/peer_forward.py "$MODEL" --tokens "$T" --threads "$N" --peer transformers
  "$PY" tests/bench/peer_forward.py "$MODEL" --tokens "$T" --threads "$N" --peer llamacpp
else
  echo "peers skipped: no Python at $PY (set GEMMARUN_REF_PY)"
fi
# decoding beside one competing busy process (a shell loop that keeps one core busy), gemmarun and
# llama.cpp in the same minutes (docs/benchmarks.md "Fused projections")
sh -c 'while :; do :; done' &
BUSY=$!
trap 'kill $BUSY 2>/dev/null || true' EXIT
echo "beside a busy process: $(build/tests/bench/bench_forward "$MODEL" --tokens "$T" --threads "$N" --repeat 3 --decode 32 --int8-dot 1 | grep decode)"
echo "beside a busy process: $(build/tests/bench/bench_forward "$MODEL" --tokens "$T" --threads "$N" --repeat 3 --decode 32 | grep decode)"
if [ -x "$PY" ]; then
  echo "beside a busy process: $("$PY" tests/bench/peer_forward.py "$MODEL" --tokens "$T" --threads "$N" --peer llamacpp)"
fi
