#!/usr/bin/env bash
# tests/peers/setup.sh - install the real peer tools that the round-trip tests check gemmarun's
# exported adapters against (Hugging Face transformers + PEFT, the gguf package, llama.cpp through
# llama-cpp-python) into a cached Python venv. CI calls it from .ci/run; users never need it.
#
#   tests/peers/setup.sh          build the venv if it is missing or stale, else say it is ready
#   tests/peers/setup.sh --check  the same, but the cached venv must also import everything
#                                 (torch + transformers + peft: ~6 s, so not done by default)
#   tests/peers/setup.sh --force  rebuild it from scratch
#
# The venv is ${GEMMARUN_HOME:-$HOME/.cache/gemmarun}/peers-venv. The last line printed is
# always PEERS_PY=<the venv's python>, so a caller can do:
#   PEERS_PY=$(tests/peers/setup.sh | tail -n 1 | sed 's/^PEERS_PY=//')
#
# Besides the packages, the venv keeps llama.cpp's own conversion scripts, taken from the same
# llama-cpp-python source distribution that the library is built from (one llama.cpp version):
#   <venv>/share/llama.cpp/convert_lora_to_gguf.py   PEFT adapter -> GGUF LoRA
#   <venv>/share/llama.cpp/convert_hf_to_gguf.py     HF model -> GGUF (the LoRA script imports it)
#   <venv>/share/llama.cpp/conversion/, gguf-py/     what both import, found beside them
set -euo pipefail

# --- what gets installed ---------------------------------------------------------------------
# The same versions as the reference environment the peer numbers were checked with. torch's
# Linux wheels on PyPI are the CUDA build and pull the nvidia-* runtime wheels (about 3 GB of the
# venv); PyPI is the only registry reached here, so the CPU-only wheel is not an option. The
# CUDA libraries are only loaded, never used: there is no GPU.
PINS=(
  torch==2.15.0
  transformers==5.24.0
  peft==0.21.2
  safetensors==0.8.0
  gguf==0.19.0
  numpy==2.4.6
  accelerate==1.15.0
)
LLAMA_VERSION=0.3.36
LLAMA_PIN=llama-cpp-python==$LLAMA_VERSION
LLAMA_SDIST=llama_cpp_python-$LLAMA_VERSION.tar.gz
# Build tools for llama-cpp-python, installed into the venv and used without build isolation, so
# the build is pinned too and runs offline from the downloaded files.
BUILD_PINS=(scikit-build-core==1.1.2 ninja==1.13.2)
# CPU only: this machine has the CUDA toolkit (nvcc on PATH) but no GPU, and llama.cpp must not
# pick CUDA up. GGML_NATIVE=OFF builds for a generic x86-64 with AVX2 instead of -march=native,
# so a cached library cannot die with SIGILL on another CPU. LLAVA_BUILD=OFF skips the multimodal
# library, LLAMA_BUILD_COMMON=OFF (see step 4) the command-line tools' library: the Python
# package uses neither, and they were most of the compile time.
LLAMA_CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_COMMON=OFF"
# Bump when the recipe below changes in a way the lists above do not show.
RECIPE=2

PEERS_HOME="${GEMMARUN_HOME:-$HOME/.cache/gemmarun}"
VENV="$PEERS_HOME/peers-venv"
PY="$VENV/bin/python"
STAMP="$VENV/gemmarun-peers.stamp"
PYTHON="${PEERS_PYTHON:-python3}"   # the interpreter the venv is made from

force=0
check=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check|--force]" >&2; exit 2 ;;
esac

die() { echo "peers: FAILED at step '$1': $2" >&2; exit 1; }

# The stamp is the whole recipe: any change to a pin, the build flags or the recipe rebuilds.
stamp_text() {
  printf '%s\n' "recipe=$RECIPE" "${PINS[@]}" "$LLAMA_PIN" "${BUILD_PINS[@]}" "CMAKE_ARGS=$LLAMA_CMAKE_ARGS"
}

FULL_IMPORT='import torch, transformers, peft, gguf, llama_cpp'
# The cached path runs at the start of every CI run, so it must stay fast: importing peft pulls
# in torch and transformers (~6 s), so by default it checks that every pinned distribution is
# installed at its pinned version and can be found, and imports only gguf and llama_cpp (which
# loads libllama.so). --check and every build do the full import.
QUICK_IMPORT='
import importlib.metadata as md, importlib.util as iu, sys
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    got = md.version(name)
    if got != want:
        sys.exit(f"{name} is {got}, not {want}")
for mod in ("torch", "transformers", "peft", "accelerate", "safetensors", "numpy"):
    if iu.find_spec(mod) is None:
        sys.exit(f"cannot find {mod}")
import gguf, llama_cpp
'
venv_ready() {
  [ "$force" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_text)" ] || return 1
  if [ "$check" = 1 ]; then
    "$PY" -c "$FULL_IMPORT" >/dev/null 2>&1
  else
    "$PY" -c "$QUICK_IMPORT" "${PINS[@]}" "$LLAMA_PIN" >/dev/null 2>&1
  fi
}
if venv_ready; then
  echo "peers: venv ready at $VENV"
  echo "PEERS_PY=$PY"
  exit 0
fi

# --- (re)build ----------------------------------------------------------------------------------
mkdir -p "$PEERS_HOME"
# One build at a time: two CI jobs on one machine would otherwise delete each other's venv.
exec 9>"$PEERS_HOME/peers-venv.lock"
flock 9
# Another process may have finished the build while this one waited for the lock.
if venv_ready; then
  echo "peers: venv ready at $VENV"
  echo "PEERS_PY=$PY"
  exit 0
fi

# Downloads (~3 GB) and the unpacked source live here; removed on success, kept (its path
# printed) on failure so the logs can be read. The next build starts it afresh.
WORK="$PEERS_HOME/peers-build"
rm -rf "$WORK"
mkdir -p "$WORK/dl" "$WORK/logs"
LOGS="$WORK/logs"

declare -a TIMES=()
step=""
step_start=0
step_cpu=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# CPU seconds (user + system) used so far by this script's finished child processes, compilers
# included, into $cpu: with the wall time it shows whether a slow step was slow or only starved
# by other work on the machine. `times` must run in this shell, not in a $(...) subshell.
cpu=0
read_cpu() {
  times >"$WORK/times"
  cpu=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$WORK/times")
}
begin() { step=$1; step_start=$(now); read_cpu; step_cpu=$cpu; echo "peers: $step ..."; }
end() {
  local t c
  t=$(since "$step_start")
  read_cpu
  c=$(awk -v a="$step_cpu" -v b="$cpu" 'BEGIN { printf "%.1f", b - a }')
  TIMES+=("$(printf '%-13s %6s s wall %6s s CPU' "$step" "$t" "$c")")
  echo "peers: $step done in $t s (CPU $c s)"
}
# Runs a command with its output in $LOGS/<step>.log; on failure shows the log's tail and stops.
logged() {
  local log="$LOGS/$step.log"
  if ! "$@" >>"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "$step" "'$*' failed (full log: $log; work folder kept: $WORK)"
  fi
}
total_start=$(now)

# 1. The venv. A stale or half-built one is removed first: upgrading torch and its CUDA wheels in
#    place is not worth the risk when a rebuild takes minutes.
begin venv
rm -rf "$VENV"
command -v "$PYTHON" >/dev/null || die venv "no $PYTHON on PATH (set PEERS_PYTHON)"
if ! "$PYTHON" -m venv "$VENV" >"$LOGS/venv.log" 2>&1; then
  # Debian's python3 ships venv's ensurepip in a separate package; install it as the repo's
  # setup.sh installs its packages (apt-get, through sudo when not root), then try again.
  if grep -q ensurepip "$LOGS/venv.log" && command -v apt-get >/dev/null; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "peers: $PYTHON -m venv needs python3-venv; installing it with apt-get"
    rm -rf "$VENV"
    logged $SUDO apt-get update -qq
    logged $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
    logged "$PYTHON" -m venv "$VENV"
  else
    cat "$LOGS/venv.log" >&2
    die venv "'$PYTHON -m venv $VENV' failed"
  fi
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die venv "$("$PY" -V 2>&1) is too old: gguf and torch need Python 3.10 or newer"
end

# pip's own cache is bypassed: it would keep a second ~3 GB copy of the wheels in ~/.cache/pip.
PIP=("$PY" -m pip --no-cache-dir --disable-pip-version-check --no-input)

# 2. Download everything once (the wheels with their dependencies, llama-cpp-python as source),
#    so the install and build steps below run offline and their times are their own.
begin download
logged "${PIP[@]}" download -d "$WORK/dl" \
  "${PINS[@]}" "$LLAMA_PIN" "${BUILD_PINS[@]}" --no-binary llama-cpp-python
[ -f "$WORK/dl/$LLAMA_SDIST" ] || die download "pip did not fetch the source distribution $LLAMA_SDIST"
end

# 3. The Python packages, from the downloaded files only.
begin install
logged "${PIP[@]}" install --no-index --find-links "$WORK/dl" "${PINS[@]}" "${BUILD_PINS[@]}"
end

# 4. llama-cpp-python from its source distribution, for the CPU.
begin llama-build
logged tar -xzf "$WORK/dl/$LLAMA_SDIST" -C "$WORK"
SRC="$WORK/${LLAMA_SDIST%.tar.gz}"
# llama-cpp-python's CMakeLists.txt forces llama.cpp's "common" library on, although the package
# neither installs nor loads it (ctypes loads libllama and libggml only). With the HTTP client it
# pulls in, it was 62% of the compile time (13 of 21 CPU-minutes), so the force is switched to
# off here: the only change made to the source, checked so that a new version that moves the
# line stops the build instead of silently building everything.
force_line='set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
grep -qF "$force_line" "$SRC/CMakeLists.txt" \
  || die llama-build "the LLAMA_BUILD_COMMON line to switch off is not in $LLAMA_SDIST's CMakeLists.txt"
sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL/set(LLAMA_BUILD_COMMON OFF CACHE BOOL/' "$SRC/CMakeLists.txt"
# Only the flags above reach CMake: CMAKE_ARGS or a CUDA setting from the caller's environment
# must not turn a GPU backend on. The venv's bin comes first on PATH for the pinned ninja.
logged env -u CUDACXX -u GGML_CUDA -u FORCE_CMAKE \
  PATH="$VENV/bin:$PATH" \
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "${PIP[@]}" install -v --no-index --find-links "$WORK/dl" --no-build-isolation "$SRC"
got=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))') \
  || die llama-build "llama-cpp-python is not installed after the build"
[ "$got" = "$LLAMA_VERSION" ] || die llama-build "installed llama-cpp-python is $got, not $LLAMA_VERSION"
end

# 5. llama.cpp's conversion scripts, from the same source. convert_lora_to_gguf.py imports
#    convert_hf_to_gguf, both import the conversion package, and both put the gguf-py beside
#    them first on sys.path: copied together they run on the gguf code they were written for,
#    whatever gguf the venv has. (The source also has tools/export-lora, llama-export-lora; it
#    needs the "common" library switched off above, so it is not built: llama_cpp applies a GGUF
#    LoRA at load time through llama_adapter_lora_init instead.)
begin llama-scripts
LLAMA_SRC="$SRC/vendor/llama.cpp"
SHARE="$VENV/share/llama.cpp"
mkdir -p "$SHARE"
for f in convert_lora_to_gguf.py convert_hf_to_gguf.py LICENSE; do
  [ -f "$LLAMA_SRC/$f" ] || die llama-scripts "$f is not in $LLAMA_SDIST (vendor/llama.cpp/$f)"
  cp "$LLAMA_SRC/$f" "$SHARE/"
done
cp -r "$LLAMA_SRC/conversion" "$LLAMA_SRC/gguf-py" "$SHARE/"
end

# 6. Check what was built: the full import, a CPU-only llama.cpp, and that the scripts start.
begin check
logged "$PY" -c "$FULL_IMPORT"
"$PY" - >"$LOGS/check.log" 2>&1 <<'EOF' || { cat "$LOGS/check.log" >&2; die check "llama-cpp-python is not the CPU build expected"; }
import glob, os, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
print("llama_cpp", llama_cpp.__version__, "in", lib + ":", " ".join(sorted(os.path.basename(p) for p in glob.glob(lib + "/*.so"))))
assert os.path.exists(os.path.join(lib, "libllama.so")), "no libllama.so in " + lib
assert not glob.glob(lib + "/*cuda*"), "a CUDA backend was built"
assert not llama_cpp.llama_supports_gpu_offload(), "llama.cpp reports GPU offload"
EOF
cat "$LOGS/check.log"
LLAMA_LIB=$("$PY" -c 'import os, llama_cpp; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))') \
  || die check "cannot import llama_cpp"
if ldd "$LLAMA_LIB"/*.so | grep -i -E 'libcuda|libcublas|libcudart'; then
  die check "llama.cpp's libraries link CUDA libraries"
fi
logged "$PY" "$SHARE/convert_lora_to_gguf.py" --help
logged "$PY" "$SHARE/convert_hf_to_gguf.py" --help
end

# Record exactly what was installed, then write the stamp last: a build that stopped half-way
# has no stamp and is redone on the next call.
"${PIP[@]}" freeze >"$VENV/gemmarun-peers-freeze.txt" || die check "pip freeze failed"
mkdir -p "$VENV/share/gemmarun-peers"
cp "$LOGS"/*.log "$VENV/share/gemmarun-peers/"
read_cpu
rm -rf "$WORK"
stamp_text >"$STAMP"

echo "peers: built $VENV ($(du -sh "$VENV" | cut -f1)) in $(since "$total_start") s wall, $cpu s CPU:"
printf 'peers:   %s\n' "${TIMES[@]}"
echo "peers: venv ready at $VENV"
echo "PEERS_PY=$PY"
