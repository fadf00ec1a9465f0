#!/usr/bin/env bash
# The memory plans of Gemma 3 4B / 12B / 27B multimodal LoRA (bf16 base) and QLoRA (nf4 base) at
# the settings of experiments/pets_sweep.lua (batch 4, max_length 512, rank 64, alpha 64, LoRA on
# all-linear of the language model, one image per example, 2 threads as its runner uses by
# default), with and without activation checkpointing: the table of docs/memory.md ("Gemma 3
# multimodal at the pets settings"). Every number is `gemmarun plan`'s output, read back from it;
# nothing is loaded (the built-in sizes carry the SigLIP tower's config).
#   tests/bench/pets_plans.sh [path/to/gemmarun]     (default build/gemmarun)
set -euo pipefail
cd "$(dirname "$0")/../.."
GM=${1:-build/gemmarun}
SETTINGS=(images=1 batch=4 max_length=512 rank=64 alpha=64 targets=all-linear memory_limit=48GiB)
echo "# $GM plan MODEL ${SETTINGS[*]} quant=Q checkpointing=C"
echo "| model | base | ckpt | base weights | LoRA + grad + AdamW | saved activations | transient + workspace | vision tower: weights / activations / pixels | vision tower | runtime | total GiB | 48 GiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
gib() { awk -v m="$1" 'BEGIN { printf "%.2f", m / 1024 }'; }
for m in gemma3-4b gemma3-12b gemma3-27b; do
  for q in bf16 nf4; do
    for c in off on; do
      out=$("$GM" plan "$m" "${SETTINGS[@]}" quant=$q checkpointing=$c) || [ $? -eq 1 ] # 1: over the limit
      item() { printf '%s\n' "$out" | sed -n "s/^  $1 \{1,\}\([0-9.]\{1,\}\) MiB.*/\1/p"; }
      tower=$(printf '%s\n' "$out" | grep '^  vision tower') || { echo "no vision tower line for $m $q $c" >&2; exit 1; }
      tw=$(sed -n 's/.*weights [a-z0-9]* \([0-9.]*\) MiB.*/\1/p' <<< "$tower")
      ta=$(sed -n 's/.*activations \([0-9.]*\) MiB.*/\1/p' <<< "$tower")
      tp=$(sed -n 's/.*pixel staging \([0-9.]*\) MiB.*/\1/p' <<< "$tower")
      lora=$(awk -v a="$(item adapters)" -v g="$(item gradients)" -v o="$(item 'optimizer state')" 'BEGIN { print a + g + o }')
      tw_=$(awk -v t="$(item 'largest transient')" -v w="$(item workspace)" 'BEGIN { print t + w }')
      total=$(printf '%s\n' "$out" | sed -n 's/^  total \{1,\}\([0-9.]\{1,\}\) MiB.*/\1/p')
      fits=$(printf '%s\n' "$out" | grep -q 'memory_limit .*: fits' && echo fits || echo over)
      printf '| %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s | %s |\n' "$m" "$q" "$c" \
        "$(gib "$(item 'base weights')")" "$(gib "$lora")" "$(gib "$(item 'saved activations')")" "$(gib "$tw_")" \
        "$(gib "$tw")" "$(gib "$ta")" "$(gib "$tp")" "$(gib "$(item 'vision tower')")" "$(gib "$(item runtime)")" \
        "$(gib "$total")" "$fits"
    done
  done
done
echo
echo "# the whole plan of one row:"
"$GM" plan gemma3-4b "${SETTINGS[@]}" quant=nf4 checkpointing=off
