#!/usr/bin/env bash
# Planned vs measured peak memory of LoRA training, across base precision x activation
# checkpointing x max_length x batch, on the real Gemma 3 270M and the tiny fixture (docs/memory.md).
# "planned" is `gemmarun plan`'s total, computed from the config alone before loading; "measured"
# is the process's peak resident memory (VmHWM) after 3 training steps. One process per row.
#   tests/bench/memory_table.sh [real|tiny|both]
set -euo pipefail
cd "$(dirname "$0")/../.."
which=${1:-both}
echo "# $(date -u +%F) $(nproc) cores"
echo "| model | quant | ckpt | rank | batch | max_length | step s | planned MiB | measured MiB | difference |"
echo "|---|---|---|---|---|---|---|---|---|---|"
run() { # model label rank
  for q in stored bf16 nf4; do for c in 0 1; do for t in $4; do for b in 1 2; do
    printf "| %s " "$2"
    GEMMA_MODEL=$1 QUANT=$q CKPT=$c RANK=$3 MAX_LEN=$t BATCH=$b STEPS=3 build/gemmarun tests/bench/train_step.lua
  done; done; done; done
}
[ "$which" != tiny ] && run gemma3-270m "270M" 16 "128 256"
[ "$which" != real ] && run tests/ref/tiny_gemma3_chat "tiny" 4 "32 64"
