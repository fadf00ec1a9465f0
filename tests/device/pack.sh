#!/usr/bin/env bash
# tests/device/pack.sh - runs HERE (Debian 12, network): fills device-carry/ (git-ignored) with
# what tests/device/run.sh needs on the GPU machine and that machine lacks. The GPU machine has
# the CUDA toolkit, gcc, CMake, ninja and Python 3.12 with torch / transformers / peft, but no
# Lua, HDF5, OpenBLAS, PLplot, cJSON, libzip, libexif, libjpeg, OpenSSL headers, pkg-config,
# bitsandbytes, and no network. So:
#   device-carry/debs/*.deb     Debian 12 packages, unpacked there with `dpkg -x` into a prefix
#                               (never into /: the device README says that can break the machine)
#   device-carry/whl/*.whl      bitsandbytes, slimmed to the CUDA 13.0 library (torch there is
#                               cu130), for the peer's NF4 rows; installed with pip --no-index
#   device-carry/MANIFEST       file names, sizes, sha256
# Fails when the folder is over LIMIT_MIB: the run tool carries 64 MiB in all, the working tree
# included, so the default is 64 MiB less the tracked files (17.3 MiB on 2026-12-05, most of it
# tests/ref and tests/fuzz fixtures) less 4 MiB for untracked files, and never over 48.
#   bash tests/device/pack.sh            (about 30 s; needs apt-get's package lists and PyPI)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-device-carry}
tree_bytes=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
LIMIT_MIB=${LIMIT_MIB:-$(awk -v t="$tree_bytes" 'BEGIN { l = 64 - t / 1048576 - 4; printf "%d", (l > 48 ? 48 : l) }')}

# ---- the Debian packages, each with why it is there -------------------------------------------
# Found with `ldd build/gemmarun build/tests/test_*` (runtime) and CMakeLists.txt's
# pkg_check_modules / find_library (build). Left out on purpose: libc6, libgcc-s1, libstdc++6,
# libgomp1 (the machine's compiler brings its own and they are newer), Open MPI and its hwloc /
# libevent / libudev (run.sh configures -DGM_MPI=OFF), and the CUDA libraries (the toolkit there).
BUILD_DEBS=(
  pkgconf pkgconf-bin libpkgconf3   # pkg-config: CMakeLists.txt's find_package(PkgConfig REQUIRED)
  liblua5.4-dev                     # lua5.4.pc, lua.h, liblua5.4.so (pkg_check_modules lua5.4)
  libhdf5-dev                       # hdf5-serial.pc, hdf5.h, libhdf5_serial{,_hl}.so (find_library HDF5_HL_LIB)
  libopenblas-openmp-dev            # cblas.h, libopenblas.so under openblas-openmp/ (run.sh links openblas.pc to it)
  libcjson-dev                      # libcjson.pc, cJSON.h
  libzip-dev                        # libzip.pc, zip.h
  libssl-dev                        # libcrypto.pc, openssl/*.h (sha256 of model and data files)
  libplplot-dev                     # plplot.pc, plplot.h, libplplot.so (gm.plot; linked into gm_lua)
  libpng-dev                        # libpng.pc, png.h
  zlib1g-dev                        # zlib.pc: libpng16.pc Requires.private zlib (pkg-config fails without it)
  libjpeg62-turbo-dev               # libjpeg.pc, jpeglib.h (core/image)
  libexif-dev                       # libexif.pc, libexif/*.h (core/image: EXIF orientation)
)
RUNTIME_DEBS=(
  liblua5.4-0                                   # the Lua VM (experiment files)
  libhdf5-103-1 libhdf5-hl-100                  # HDF5 serial + high-level (checkpoints, results)
  libaec0 libsz2                                # HDF5's szip filter (libhdf5 NEEDED)
  libcurl4 libnghttp2-14 libidn2-0 librtmp1 libssh2-1 libpsl5 libbrotli1  # libhdf5 NEEDED libcurl (ROS3 driver)
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1  # libcurl's Kerberos
  libldap-2.5-0 libsasl2-2                      # libcurl's LDAP
  libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libtasn1-6 libunistring2 libffi8  # librtmp / libcurl TLS
  libopenblas0-openmp libgfortran5 libquadmath0 # OpenBLAS (OpenMP build) and its Fortran runtime
  libcjson1 libzip4 libbz2-1.0 libzstd1 zlib1g  # JSON; zip; libzip's / libcurl's compressors
  libssl3                                       # libcrypto / libssl
  libplplot17 libltdl7 libcsirocsa0 libcsironn0 libqhull-r8.0 libqsastime0 libshp2 libfreetype6  # PLplot and its NEEDED
  libpng16-16 libjpeg62-turbo libexif12         # images
)
# Not carried: plplot-driver-cairo (the pngcairo device PLplot loads at run time, with cairo,
# pango, glib, X11 and fonts: ~15 MiB more). Without it gm.plot raises "PLplot has no pngcairo
# device", which the runner catches: the trials and tables are written, the plots are not; run.sh
# leaves out test_results, whose plot checks need it.

rm -rf "$DEST"
mkdir -p "$DEST/debs" "$DEST/whl"
# apt-get download warns when it runs as root and _apt cannot write the folder: harmless.
(cd "$DEST/debs" && apt-get download "${BUILD_DEBS[@]}" "${RUNTIME_DEBS[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" | grep -v "^Get:" || true)
n_want=$(printf '%s\n' "${BUILD_DEBS[@]}" "${RUNTIME_DEBS[@]}" | sort -u | wc -l)
n_got=$(ls "$DEST/debs"/*.deb | wc -l)
if [ "$n_got" -ne "$n_want" ]; then
  echo "pack.sh: downloaded $n_got of $n_want packages" >&2
  exit 1
fi

# ---- bitsandbytes for the peer's NF4 rows (QLoRA), slimmed ------------------------------------
# The manylinux wheel (0.50.2: 43 MB) holds one library per CUDA / ROCm version; torch on the GPU
# machine is 2.11.0+cu130, which loads libbitsandbytes_cuda130.so. Keep that one and the CPU one,
# rewrite RECORD, zip it again: about 2 MB. BNB=0 leaves it out (the NF4 peer rows then say so).
BNB_VERSION=${BNB_VERSION:-0.50.2}
if [ "${BNB:-1}" = 1 ]; then
  PYBIN=${PYBIN:-python3}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$PYBIN" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$tmp" "bitsandbytes==$BNB_VERSION"
  "$PYBIN" - "$tmp"/bitsandbytes-*.whl "$DEST/whl" <<'EOF'
import base64, hashlib, os, re, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
keep = re.compile(r"libbitsandbytes_(cuda130|cpu)\.so$")
out = os.path.join(dest, os.path.basename(src))
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zo:
    names = [n for n in zi.namelist() if not (re.search(r"libbitsandbytes_\w+\.so$", n) and not keep.search(n))]
    record = [n for n in names if n.endswith(".dist-info/RECORD")][0]
    lines = []
    for n in names:
        if n == record:
            continue
        data = zi.read(n)
        zo.writestr(zi.getinfo(n), data)
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{n},sha256={h},{len(data)}")
    lines.append(f"{record},,")
    zo.writestr(record, "\n".join(lines) + "\n")
print(f"bitsandbytes: {os.path.getsize(src) / 2**20:.1f} MiB wheel -> {os.path.getsize(out) / 2**20:.1f} MiB (CUDA 13.0 + CPU libraries only)")
EOF
fi

(cd "$DEST" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2 | while read -r s p; do
  echo "$s $(sha256sum "$p" | cut -c1-16) $p"; done) > "$DEST/MANIFEST"
bytes=$(du -sb "$DEST" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "pack.sh: $n_got Debian packages + $(ls "$DEST/whl" | wc -l) wheel in $DEST/: $mib MiB (limit $LIMIT_MIB MiB;" \
  "tracked files $(awk -v b="$tree_bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB; the run tool carries 64 MiB in all)"
if awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN { exit !(b > l * 1048576) }'; then
  echo "pack.sh: $DEST is over $LIMIT_MIB MiB: the run tool carries 64 MiB with the working tree" >&2
  exit 1
fi
