#!/usr/bin/env bash
# Step time and peak memory of LoRA training on the real Gemma 3 270M for each base precision
# with activation checkpointing off and on (docs/benchmarks.md). One process per configuration.
#   tests/bench/bench_train.sh [RANK] [MAX_LEN] [BATCH] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
export RANK=${1:-16} MAX_LEN=${2:-256} BATCH=${3:-1} STEPS=${4:-4}
echo "# $(date -u +%F) $(nproc) cores; LoRA rank $RANK all-linear, batch $BATCH, max_length $MAX_LEN"
echo "| quant | ckpt | rank | batch | max_length | step s | planned MiB | measured MiB | difference |"
echo "|---|---|---|---|---|---|---|---|---|"
for q in ${QUANTS:-stored f32 bf16 nf4}; do
  for c in 0 1; do
    QUANT=$q CKPT=$c build/gemmarun tests/bench/train_step.lua
  done
done
