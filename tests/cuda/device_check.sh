#!/usr/bin/env bash
# The one prepared script for a GPU machine (see the device tool's README): configure with
# CUDA, build, run the CUDA-vs-CPU kernel parity test and the CPU suite that needs no model,
# and write everything under $OUT (or ./device-out). No network, no model download there.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
{
  nvidia-smi || true
  cmake -S . -B build-device -DGM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGM_FUZZ=OFF
  cmake --build build-device -j"$(nproc)"
  build-device/tests/test_kernels_cuda
  ctest --test-dir build-device -E "_model|e2e_|fuzz" --output-on-failure
} 2>&1 | tee "$OUT/device_check.log"
