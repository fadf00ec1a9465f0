#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, leaks checked (LSan), in a
# build folder of its own (build-asan/). Part of .ci/run; by hand: tests/sanitizers/run.sh
#
# Every test runs except the three that spend minutes in the real 270M's f32 forward passes
# (test_decoder_model, test_train_model, e2e_generate_real: ~5 min together normally, 3-5x that
# under ASan); the real model's loading, tokenizer and quantization tests do run. Any report —
# an ASan error, a UBSan runtime error (-fno-sanitize-recover: it aborts) or a leak not in
# lsan.supp — fails the test that triggered it. Resident-memory bounds are not checked under
# ASan (its shadow memory and quarantine are what they would measure): GM_SANITIZE=1 tells the
# tests so.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGM_CUDA=OFF -DGM_FUZZ=OFF -DGM_TEST_TIMEOUT=2400 \
  -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /dev/null
cmake --build build-asan -j"$(nproc)"
export GM_SANITIZE=1
# oneDNN (the CPU's bf16 GEMMs, loaded with dlopen) stays unloaded: LeakSanitizer's tracer crashes
# ("Tracer caught signal 11") scanning the thread-local storage it brings (GCC 12, glibc 2.36). Our
# side of those GEMMs - the bf16 staging, the panels, the f32 fallback - still runs and is checked.
export GEMMARUN_ONEDNN=0
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$(pwd)/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" \
  -E "^(test_decoder_model|test_train_model|e2e_generate_real|test_kernels_cuda)$"
