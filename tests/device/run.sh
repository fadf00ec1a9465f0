#!/usr/bin/env bash
# tests/device/run.sh - the one prepared script for the lent GPU machine (an H200; see
# docs/testing.md, "The GPU script", for the run tool's call). It runs THERE, in a copy of the
# working tree with device-carry/ (tests/device/pack.sh fills it here) carried along, and writes
# everything under $OUT:
#   1. unpack the carried Debian 12 packages into a prefix ($GM_PREFIX, /tmp/gmprefix) with
#      `dpkg -x` (never into /), repoint their absolute symbolic links and .pc files into it, and
#      give CMake and the compiler only that prefix's pkg-config files;
#   2. configure and build with CUDA for sm_90 into build-device/; every program gets the
#      prefix's library folders as its RPATH (DT_RPATH, which also covers the libraries' own
#      dependencies), so the prefix is used without a global LD_LIBRARY_PATH that would hand
#      Debian 12's libraries to the machine's own compiler, CMake and Python;
#   3. check that there is a GPU (stop here, with a clear message, when there is none);
#   4. nvidia-smi; test_kernels_cuda (the CUDA backend as a whole) and test_kernel_parity cuda
#      (every kernel against the CPU's) with GM_REQUIRE_GPU=1 (no device: a failure, not a skip);
#      once step 6's checkpoints exist, test_kernels_cuda again on the 270M shapes;
#   5. the CPU unit tests that need no model (ctest);
#   6. the benchmark (issue 11 item 5): random-weight checkpoints of the real 270M / 1B / 4B
#      shapes (make_checkpoints.py), LoRA rank 16 all-linear training in gemmarun
#      (tests/device/bench_cuda.lua, device = "cuda") and in transformers + PEFT
#      (tests/bench/peer_train.py --device cuda --dtype bf16 --attn sdpa) on the same card, one
#      Markdown table ($OUT/bench.md, also printed last).
# Each step after the build runs even when an earlier one failed; the exit code is 1 when any did.
# A time budget (GM_DEVICE_BUDGET_S, default 420 s from the start) skips the benchmark rows that
# would not fit, so the whole script ends in under 8 minutes on the H200 with its 16 cores; the
# table says which rows were skipped.
#   OUT=/tmp/devout bash tests/device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/device-out}
CARRY=${GM_CARRY:-$ROOT/device-carry}
P=${GM_PREFIX:-/tmp/gmprefix}
BUDGET=${GM_DEVICE_BUDGET_S:-420}
JOBS=$(nproc)
# $OUT brings back at most 8 files: run.log, test_kernels_cuda.log, ctest.log, bench.md there, the
# rest (configure and build logs, ldd, nvidia-smi, each benchmark row's logs) in logs.tgz
W=${GM_WORK:-/tmp/gmwork}
rm -rf "$W"
mkdir -p "$OUT" "$W"
exec > >(tee "$OUT/run.log") 2>&1
trap 'tar -czf "$OUT/logs.tgz" -C "$W" . 2>/dev/null || true' EXIT
T0=$SECONDS
FAILED=()
step() { echo; echo "=== [$((SECONDS - T0)) s] $*"; }
fail() { echo "FAIL: $*"; FAILED+=("$*"); }
left() { echo $((BUDGET - (SECONDS - T0))); }

# ---- 1. the carried packages into the prefix ---------------------------------------------------
step "unpacking $(ls "$CARRY"/debs/*.deb 2>/dev/null | wc -l) Debian packages from $CARRY into $P"
if ! ls "$CARRY"/debs/*.deb >/dev/null 2>&1; then
  echo "no packages in $CARRY/debs: run tests/device/pack.sh here first and name device-carry in carry"
  exit 1
fi
rm -rf "$P"
mkdir -p "$P"
for deb in "$CARRY"/debs/*.deb; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$P"
  else # no dpkg: a .deb is an ar archive holding data.tar.xz (or .zst / .gz)
    m=$(ar t "$deb" | grep '^data\.tar')
    case $m in
      *.xz) ar p "$deb" "$m" | tar -xJ -C "$P" ;;
      *.zst) ar p "$deb" "$m" | tar --zstd -x -C "$P" ;;
      *) ar p "$deb" "$m" | tar -xz -C "$P" ;;
    esac
  fi
done
# absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would leave the prefix
n_links=0
while IFS= read -r l; do
  t=$(readlink "$l")
  ln -sfn "$P$t" "$l"
  n_links=$((n_links + 1))
done < <(find "$P" -type l -lname '/*')
# Debian's alternatives system would provide openblas.pc; dpkg -x runs no maintainer scripts
ln -sfn ../openblas-openmp/pkgconfig/openblas.pc "$P/usr/lib/x86_64-linux-gnu/pkgconfig/openblas.pc"
# every /usr in the .pc files (prefix=/usr, hdf5-serial's absolute -I/-L) into the prefix
n_pc=0
while IFS= read -r f; do
  f=$(readlink -f "$f")
  sed -i "s|/usr|$P/usr|g" "$f"
  n_pc=$((n_pc + 1))
done < <(find "$P" -name '*.pc' ! -type l)
LIBDIRS="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu:$P/usr/lib/x86_64-linux-gnu/openblas-openmp"
# pkg-config is Debian's pkgconf from the prefix, which needs its own libpkgconf: a wrapper gives
# it that library alone (LD_LIBRARY_PATH for that one process)
mkdir -p "$P/bin"
cat > "$P/bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$LIBDIRS exec $P/usr/bin/pkgconf "\$@"
EOF
chmod +x "$P/bin/pkg-config"
ln -sfn pkg-config "$P/bin/pkgconf"
export PATH="$P/bin:$PATH"
export PKG_CONFIG="$P/bin/pkg-config"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
export PKG_CONFIG_LIBDIR="$P/usr/lib/x86_64-linux-gnu/pkgconfig:$P/usr/share/pkgconfig"
export CMAKE_PREFIX_PATH="$P/usr"
# the multiarch header folders (openssl/opensslconf.h, jconfig.h, cblas.h) and the link path
export CPATH="$P/usr/include/x86_64-linux-gnu:$P/usr/include"
export LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu:$P/lib/x86_64-linux-gnu"
# -rpath-link: the linker finds the libraries' own dependencies (libhdf5 -> libsz ...) there;
# --disable-new-dtags: DT_RPATH, which the loader also uses for those dependencies (DT_RUNPATH
# covers the program's direct ones only)
export LDFLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$LIBDIRS -Wl,-rpath-link,$LIBDIRS"
echo "prefix: $(du -sh "$P" | cut -f1), $n_links absolute links repointed, $n_pc .pc files rewritten"
for m in lua5.4 hdf5-serial openblas libcjson libzip libcrypto plplot libpng libjpeg libexif zlib; do
  printf '  %-12s %-8s %s\n' "$m" "$(pkg-config --modversion "$m")" "$(pkg-config --cflags --libs "$m")"
done

# ---- 2. configure and build --------------------------------------------------------------------
step "configure (CUDA on, sm_90, MPI and audio off, fuzzers as gcc-built replays)"
command -v ninja >/dev/null && GEN=(-G Ninja) || GEN=()
rm -rf build-device
cmake "${GEN[@]}" -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DGM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGM_MPI=OFF -DGM_FUZZ=OFF -DGM_AUDIO=OFF \
  -DOPENBLAS_OMP_LIB="$P/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so" \
  -DHDF5_HL_LIB="$P/usr/lib/x86_64-linux-gnu/libhdf5_serial_hl.so" >"$W/configure.log" 2>&1 ||
  { tail -40 "$W/configure.log"; echo "configure failed (whole log: configure.log in logs.tgz)"; exit 1; }
grep -E "gemmarun:|Found PkgConfig|Checking for module|Found CUDAToolkit" "$W/configure.log" || true
step "build (-j$JOBS)"
if ! cmake --build build-device -j"$JOBS" >"$W/build.log" 2>&1; then
  grep -E -m 30 "error|Error" "$W/build.log" || true
  tail -20 "$W/build.log"
  echo "build failed (whole log: build.log in logs.tgz)"
  exit 1
fi
tail -2 "$W/build.log"
step "the libraries the program loads (no LD_LIBRARY_PATH: the RPATH points into $P)"
ldd build-device/gemmarun | tee "$W/ldd.txt"
outside=$(grep -E "lib(lua5\.4|hdf5|openblas|cjson|zip|crypto|plplot|png16|jpeg|exif|sz|aec|curl)\b" "$W/ldd.txt" | grep -v "=> $P/" || true)
if [ -n "$outside" ] || grep -q "not found" "$W/ldd.txt"; then
  echo "$outside"
  echo "some carried library resolves outside $P (or not at all)"
  exit 1
fi
echo "every carried library resolves into $P"

# ---- 3. is there a GPU? -----------------------------------------------------------------------
step "GPU check"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  echo "no GPU: nvidia-smi found none; everything before this step worked"
  exit 1
fi

# ---- 4. GPU tests ------------------------------------------------------------------------------
step "nvidia-smi"
nvidia-smi | tee "$W/nvidia-smi.txt" || fail "nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$W/gpu.txt" 2>/dev/null || true
step "test_kernels_cuda (GM_REQUIRE_GPU=1: no device is a failure)"
GM_REQUIRE_GPU=1 timeout 240 build-device/tests/test_kernels_cuda >"$OUT/test_kernels_cuda.log" 2>&1 ||
  fail "test_kernels_cuda (exit $?; test_kernels_cuda.log)"
grep -E "FAIL|passed|device:" "$OUT/test_kernels_cuda.log" | tail -25 || true
step "test_kernel_parity cuda: every kernel against the CPU's (GM_REQUIRE_GPU=1)"
GM_REQUIRE_GPU=1 timeout 240 build-device/tests/test_kernel_parity cuda >"$W/test_kernel_parity.log" 2>&1 ||
  fail "test_kernel_parity cuda (exit $?; test_kernel_parity.log in logs.tgz)"
grep -E "^FAIL|passed" "$W/test_kernel_parity.log" | tail -40 || true

# ---- 5. the CPU unit tests that need no model, beside the checkpoints of step 6 ------------------
# make_checkpoints.py (the GPU and the disk, one core) runs in the background meanwhile: ctest's
# checks are pass/fail, not timings, and this saves the half minute the 4B checkpoint takes.
CK=${GM_CKPT_DIR:-/tmp/gmckpt}
SIZES=${GM_BENCH_SIZES:-270m,1b,4b}
PYTHONUNBUFFERED=1 timeout 240 python3 tests/device/make_checkpoints.py "$CK" --sizes "$SIZES" --device cuda \
  >"$W/make_checkpoints.log" 2>&1 &
CK_PID=$!
# Left out: *_model (the real 270M does not travel), e2e_* (the command line end to end: Python
# with Debian's h5py/pandas, the peers venv, Slurm, MPI), fuzz_* (replays: CI runs them),
# test_results (its plot checks need PLplot's pngcairo driver, not carried: pack.sh says why),
# test_memory (allocation counts and resident-memory bounds of the CPU trainer: 3.6 min on 2 cores,
# the longest test by far, and nothing a GPU machine adds; CI runs it) and test_kernels_cuda
# (step 4). The longest left, test_train, took 136 s on 2 cores here.
step "CPU unit tests that need no model (ctest -j$JOBS)"
ctest --test-dir build-device -j"$JOBS" -E "_model|e2e_|fuzz|test_results|test_memory|test_kernels_cuda|test_kernel_parity_cuda" --timeout 200 \
  --output-on-failure >"$OUT/ctest.log" 2>&1 || fail "ctest (model-free CPU tests; ctest.log)"
grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Total Test time" "$OUT/ctest.log" | tail -15 || true

# ---- 6. the benchmark --------------------------------------------------------------------------
step "random-weight checkpoints of the real shapes (make_checkpoints.py, on the GPU; started before ctest)"
wait "$CK_PID" || fail "make_checkpoints.py (exit $?)"
cat "$W/make_checkpoints.log"
if [ -f "$CK/gemma3-270m-random/model.safetensors" ]; then
  step "test_kernels_cuda on the 270M shapes (GM_PARITY_MODEL): 3 LoRA steps, CUDA vs CPU"
  GM_PARITY_MODEL="$CK/gemma3-270m-random" GM_REQUIRE_GPU=1 timeout 200 build-device/tests/test_kernels_cuda \
    >"$W/test_kernels_cuda_270m.log" 2>&1 || fail "test_kernels_cuda on the 270M shapes (test_kernels_cuda_270m.log in logs.tgz)"
  grep -E "FAIL|passed|LoRA steps" "$W/test_kernels_cuda_270m.log" | tail -10 || true
fi

# bitsandbytes for the peer's NF4 rows: the slimmed wheel from device-carry/whl, offline
BNB_OK=0
if ls "$CARRY"/whl/bitsandbytes-*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gmsite \
    "$CARRY"/whl/bitsandbytes-*.whl >"$W/bnb.log" 2>&1 &&
    PYTHONPATH=/tmp/gmsite python3 -c "import bitsandbytes" >>"$W/bnb.log" 2>&1; then
    BNB_OK=1
  else
    echo "bitsandbytes did not install or import (bnb.log): the NF4 peer rows are left out"
  fi
fi

B=$W/bench
mkdir -p "$B"
# chat examples longer than the longest max_length once tokenized by the fixture tokenizer (every
# example is truncated to exactly max_length tokens); one test example for the runner's evaluations
python3 - "$B" <<'EOF'
import json, sys
d = sys.argv[1]
fruit = ["apple", "berry", "cherry"]
resp = " ".join(f"Fruit {i % 3} is {fruit[i % 3]}." for i in range(1500))
with open(f"{d}/bench.jsonl", "w") as f:
    for i in range(64):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Which fruit is number {i}?"},
                                         {"role": "assistant", "content": resp}]}) + "\n")
with open(f"{d}/bench_test.jsonl", "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": "Which fruit is number 7?"},
                                     {"role": "assistant", "content": resp}]}) + "\n")
EOF

# The rows, most wanted first; the budget cuts from the end. SIZE:MAX_LEN:BATCH:QUANT (stored =
# the bf16 weights as written; nf4 = QLoRA's base). 2048 x 8 on 4B is left out by default:
# `gemmarun plan` (the CPU layout, f32 activations) puts it at 128 GiB of the card's 141, the peer
# without activation checkpointing is likely near that too (not measured), and the row would take
# a good part of the budget. GM_BENCH_ROWS replaces the list.
ROWS=${GM_BENCH_ROWS:-"270m:512:1:stored 270m:2048:8:stored 1b:512:1:stored 1b:2048:8:stored 4b:512:1:stored 4b:2048:1:stored 270m:2048:1:stored 270m:512:8:stored 1b:2048:1:stored 1b:512:8:stored 4b:512:8:stored 4b:2048:1:nf4 1b:512:1:nf4"}
STEPS=${GM_BENCH_STEPS:-4} # optimizer steps; the first is the warm-up
: >"$B/rows.txt"
for row in $ROWS; do
  IFS=: read -r size T bs q <<<"$row"
  tag="${size}_${T}_${bs}_${q}"
  model="$CK/gemma3-$size-random"
  # a row costs about 4 s of start-up and loading plus the steps; a rough guess by size
  case $size in 270m) need=25 ;; 1b) need=35 ;; *) need=60 ;; esac
  if [ ! -f "$model/model.safetensors" ]; then
    echo "$tag skipped no-checkpoint" >>"$B/rows.txt"
    continue
  fi
  if [ "$(left)" -lt "$need" ]; then
    echo "$tag skipped time" >>"$B/rows.txt"
    continue
  fi
  step "bench $tag: gemmarun"
  rm -rf "results/bench_$tag"
  GEMMA_MODEL="$model" BENCH_DATA="$B/bench.jsonl" BENCH_TEST="$B/bench_test.jsonl" BENCH_MAX_LEN="$T" \
    BENCH_BATCH="$bs" BENCH_STEPS="$STEPS" BENCH_QUANT="$q" BENCH_NAME="bench_$tag" BENCH_THREADS=8 \
    timeout "$(($(left) > 15 ? $(left) : 15))" build-device/gemmarun tests/device/bench_cuda.lua --no-tables \
    >"$B/gm_$tag.log" 2>&1 || fail "bench $tag: gemmarun (exit $?; gm_$tag.log in logs.tgz)"
  tail -4 "$B/gm_$tag.log"
  if [ "$q" = nf4 ] && [ "$BNB_OK" != 1 ]; then
    echo "$tag done peer-no-bnb" >>"$B/rows.txt"
    continue
  fi
  if [ "$(left)" -lt 10 ]; then
    echo "$tag done peer-skipped-time" >>"$B/rows.txt"
    continue
  fi
  step "bench $tag: transformers + PEFT"
  pq=none
  [ "$q" = nf4 ] && pq=nf4
  PYTHONPATH=/tmp/gmsite PYTHONUNBUFFERED=1 timeout "$(($(left) > 15 ? $(left) : 15))" python3 tests/bench/peer_train.py \
    "$model" --device cuda --dtype bf16 --attn sdpa --quant "$pq" --rank 16 --max-len "$T" --batch "$bs" \
    --steps $((STEPS - 1)) --ckpt 0 --threads 8 --json "$B/peer_$tag.json" >"$B/peer_$tag.log" 2>&1 ||
    { fail "bench $tag: peer (exit $?; peer_$tag.log in logs.tgz)"; tail -5 "$B/peer_$tag.log"; }
  echo "$tag done" >>"$B/rows.txt"
done

step "benchmark table"
python3 tests/device/bench_table.py "$B/rows.txt" "$CK" "$B" results "$W/gpu.txt" >"$OUT/bench.md" ||
  fail "bench_table.py"
cat "$OUT/bench.md"

echo
echo "=== [$((SECONDS - T0)) s] done; under \$OUT: $(ls "$OUT" | tr '\n' ' ')"
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "all steps passed"
