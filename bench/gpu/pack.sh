#!/usr/bin/env bash
# Packs what a bare GPU machine needs to run bench/gpu/checklist.sh, prepared on a build machine
# (Debian 12, no GPU needed): the CUDA build's binaries and CTest files in one archive, and the
# Debian runtime packages the binaries and Open MPI need (MPI, parallel HDF5, oneDNN, OpenBLAS,
# ...) as .deb files, to be unpacked there with dpkg -x into a private prefix. The C library, the
# C++ runtime and the CUDA libraries are the GPU machine's own.
#   bench/gpu/pack.sh BUILD_DIR OUT_DIR        e.g. bench/gpu/pack.sh build-gpu .gpu
set -euo pipefail
build=$(cd "${1:?build directory}" && pwd)
out=${2:?output directory}
mkdir -p "$out/debs"
out=$(cd "$out" && pwd)
grep -q '^MESHTRAIN_HAVE_CUDA:INTERNAL=ON\|MESHTRAIN_CUDA:STRING=ON' "$build/CMakeCache.txt" ||
  { echo "pack.sh: $build is not a CUDA build (configure with -DMESHTRAIN_CUDA=ON)" >&2; exit 1; }

# The binaries the checklist runs, and every CTest file (ctest -L cuda reads them all).
bins=(meshtrain tests/cuda_kernels_test tests/cuda_host_transfer_test tests/nccl_communicator_test)
for b in "${bins[@]}"; do
  [[ -x $build/$b ]] || { echo "pack.sh: $build/$b missing" >&2; exit 1; }
done
(cd "$build/.." && find "$(basename "$build")" -name CTestTestfile.cmake -print0 |
   tar --null -T - -cf "$out/build.tar" \
       $(printf "$(basename "$build")/%s " "${bins[@]}"))
xz -T0 -6 -f "$out/build.tar"

# The packages that own every library the binaries and Open MPI's plugins load, found through
# ldd; dpkg's database names some under /lib rather than /usr/lib (Debian's merged /usr).
owner() {
  dpkg -S "$1" 2>/dev/null || dpkg -S "${1/#\/usr\/lib/\/lib}" 2>/dev/null || true
}
files=$( { for b in "${bins[@]}"; do ldd "$build/$b"; done
           for p in /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so /usr/bin/orted \
                    /usr/bin/orterun; do ldd "$p"; done; } 2>/dev/null |
         awk '$3 ~ /^\// {print $3}' | sort -u | xargs -n1 readlink -f | sort -u)
pkgs=$( { for f in $files; do owner "$f"; done; } | cut -d: -f1 | sort -u)
# The GPU machine's own: C library, C++ runtime; MPI's programs, plugins and help texts added.
pkgs=$(printf '%s\n' $pkgs openmpi-bin openmpi-common libopenmpi3 |
       grep -v -x -E 'libc6|libgcc-s1|libstdc\+\+6' | sort -u)
(cd "$out/debs" && rm -f ./*.deb && apt-get download $pkgs >/dev/null)
echo "pack.sh: $(ls "$out/debs" | wc -l) packages ($(du -sh "$out/debs" | cut -f1)), build" \
     "$(du -sh "$out/build.tar.xz" | cut -f1) in $out"
