#!/usr/bin/env bash
# Training step time on a quiet machine and beside one competing busy process (a shell loop that
# keeps one core busy), for gemmarun and for transformers + PEFT, in one run (docs/benchmarks.md,
# "A busy machine"). LoRA rank 16 all-linear on the real Gemma 3 270M (stored Q4_K_M base for
# gemmarun, f32 for the peer as transformers loads the GGUF), batch 1, every token supervised.
#   tests/bench/bench_busy.sh [MAX_LEN] [STEPS]
# Rows: gemmarun as shipped (OpenMP waits spin 3000 iterations, then sleep: kernels/kernels.h,
# gm_kernels_startup), gemmarun never spinning (GOMP_SPINCOUNT=0, as OMP_WAIT_POLICY=passive), with
# 10000 spins, with libgomp's own default (GOMP_SPINCOUNT=300000), the peer in f32 / sdpa and with bf16
# autocast / sdpa. The peer needs a Python with torch + transformers + peft: the peers venv
# (tests/peers/setup.sh) or GEMMARUN_REF_PY.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RANK=16 MAX_LEN=${1:-256} BATCH=1 STEPS=${2:-3}
THREADS=${THREADS:-2}
PY=${GEMMARUN_REF_PY:-${GEMMARUN_HOME:-$HOME/.cache/gemmarun}/peers-venv/bin/python}
MODEL=$(build/gemmarun fetch gemma3-270m 2>/dev/null)
BUSY=
stop_busy() { if [ -n "$BUSY" ]; then kill "$BUSY" 2>/dev/null || true; wait "$BUSY" 2>/dev/null || true; BUSY=; fi; }
trap stop_busy EXIT
start_busy() { sh -c 'while :; do :; done' & BUSY=$!; }
# step s (median of STEPS after a warm-up) of one configuration
gm_step() { env "$@" QUANT=stored CKPT=0 build/gemmarun tests/bench/train_step.lua --threads "$THREADS" | awk -F'|' '{gsub(/ /, "", $7); print $7}'; }
peer_step() {
  OMP_NUM_THREADS=$THREADS "$PY" tests/bench/peer_train.py "$MODEL" --rank "$RANK" --max-len "$MAX_LEN" \
    --batch 1 --steps "$STEPS" --ckpt 0 --threads "$THREADS" "$@" 2>/dev/null | awk -F'|' '{gsub(/ /, "", $7); print $7}'
}
row() { # NAME QUIET BUSY
  printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$(awk -v q="$2" -v b="$3" 'BEGIN { printf "%.2fx", b / q }')"
}
NATIVE_BF16=$(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo yes || echo no)
echo "# $(date -u +%F) $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); native bf16: $NATIVE_BF16), $THREADS threads; LoRA rank $RANK all-linear, batch 1, max_length $MAX_LEN, median of $STEPS steps"
echo "| engine | quiet step s | step s beside a busy process | slowdown |"
echo "|---|---|---|---|"
declare -A Q B
run_all() { # KEY: fills $KEY[...] in the current condition
  local k=$1
  eval "$k[gm]=\$(gm_step X=shipped)"
  eval "$k[passive]=\$(gm_step GOMP_SPINCOUNT=0)"
  eval "$k[spin10k]=\$(gm_step GOMP_SPINCOUNT=10000)"
  eval "$k[spin]=\$(gm_step GOMP_SPINCOUNT=300000)"
  if [ -x "$PY" ]; then
    eval "$k[f32]=\$(peer_step --attn sdpa)"
    # bf16 autocast is the strongest peer setting only where the CPU has bf16 dot products: on an
    # AVX2-only CPU, a warm-up and 3 steps with it had not finished after 9 minutes on one thread (2026-12-04)
    if [ "$NATIVE_BF16" = yes ]; then eval "$k[bf16]=\$(peer_step --attn sdpa --autocast bf16)"; fi
  fi
}
run_all Q
start_busy
run_all B
stop_busy
row "gemmarun (OpenMP waits spin 3000 iterations then sleep, as shipped)" "${Q[gm]}" "${B[gm]}"
row "gemmarun, waits that never spin (GOMP_SPINCOUNT=0)" "${Q[passive]}" "${B[passive]}"
row "gemmarun, 10000 spins (GOMP_SPINCOUNT=10000)" "${Q[spin10k]}" "${B[spin10k]}"
row "gemmarun, libgomp's default spinning waits (GOMP_SPINCOUNT=300000)" "${Q[spin]}" "${B[spin]}"
if [ -x "$PY" ]; then
  V=$("$PY" -c 'import transformers, peft; print(f"transformers {transformers.__version__} + PEFT {peft.__version__}")')
  row "$V, f32, sdpa" "${Q[f32]}" "${B[f32]}"
  if [ "$NATIVE_BF16" = yes ]; then row "$V, sdpa, bf16 autocast" "${Q[bf16]}" "${B[bf16]}"
  else echo "(no bf16 autocast row: this CPU has no native bf16 dot products, where f32 is the peer's fastest setting)"; fi
else
  echo "peer skipped: no Python at $PY (tests/peers/setup.sh, or set GEMMARUN_REF_PY)"
fi
