#!/usr/bin/env bash
# Step time and peak memory of LoRA training on the real Gemma 3 270M for each base precision
# with activation checkpointing off and on, and the peer (transformers + PEFT, f32) on the same
# configuration in the same run (docs/benchmarks.md). One process per configuration.
#   tests/bench/bench_train.sh [RANK] [MAX_LEN] [BATCH] [STEPS]
# The peer needs the reference venv (tests/ref/README.md): GEMMARUN_REF_PY=/opt/refvenv/bin/python.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RANK=${1:-16} MAX_LEN=${2:-256} BATCH=${3:-1} STEPS=${4:-4}
THREADS=${THREADS:-2}
PY=${GEMMARUN_REF_PY:-/opt/refvenv/bin/python}
echo "# $(date -u +%F) $(nproc) cores, $THREADS threads; LoRA rank $RANK all-linear, batch $BATCH, max_length $MAX_LEN"
echo "| quant | ckpt | rank | batch | max_length | step s | planned MiB | measured MiB | difference |"
echo "|---|---|---|---|---|---|---|---|---|"
for q in ${QUANTS:-stored f32 bf16 nf4}; do
  for c in 0 1; do
    QUANT=$q CKPT=$c build/gemmarun tests/bench/train_step.lua --threads "$THREADS"
  done
done
if [ -x "$PY" ]; then
  MODEL=$(build/gemmarun fetch gemma3-270m 2>/dev/null)
  echo
  echo "| peer | ckpt | rank | batch | max_length | step s | peak RSS MiB |"
  echo "|---|---|---|---|---|---|---|"
  for c in 0 1; do
    OMP_NUM_THREADS=$THREADS "$PY" tests/bench/peer_train.py "$MODEL" --rank "$RANK" --max-len "$MAX_LEN" \
      --batch "$BATCH" --steps "$STEPS" --ckpt "$c" --threads "$THREADS" 2>/dev/null
  done
else
  echo "peer skipped: no Python at $PY (set GEMMARUN_REF_PY)"
fi
