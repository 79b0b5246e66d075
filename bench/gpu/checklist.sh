#!/usr/bin/env bash
# Runs the GPU checklist (bench/gpu/checklist.py) on a bare GPU machine from what
# bench/gpu/pack.sh prepared: unpacks the runtime packages into a private prefix, the CUDA build
# into the repository, finds the machine's CUDA, cuDNN and NCCL libraries, and runs the items.
#   bench/gpu/checklist.sh PACK_DIR OUT_DIR [checklist.py options, e.g. --only train,layouts]
# Writes OUT_DIR/summary.txt, OUT_DIR/logs.tar.gz (every log and run) and prints the summary last.
set -uo pipefail
pack=$(cd "${1:?pack directory}" && pwd)
out=${2:?output directory}
shift 2
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${MESHTRAIN_CHECKLIST_WORK:-/tmp/meshtrain-checklist}
rt=/opt/meshtrain-rt
mkdir -p "$rt" "$work"

if [[ ! -x $rt/usr/bin/orterun ]]; then
  for d in "$pack"/debs/*.deb; do dpkg -x "$d" "$rt"; done
fi
tar -xJf "$pack/build.tar.xz" -C "$repo"
build=$repo/$(tar -tJf "$pack/build.tar.xz" | head -1 | cut -d/ -f1)
# CTest files hold the build machine's absolute paths: make them name this checkout.
origin=$(sed -n 's/^# Build directory: //p' "$build/CTestTestfile.cmake")
if [[ -n $origin && $origin != "$build" ]]; then
  find "$build" -name CTestTestfile.cmake -exec sed -i "s#${origin%/*}#$repo#g" {} +
fi

# Libraries: the packages' prefix, then the CUDA toolkit's, then cuDNN and NCCL wherever they are
# (the toolkit, or the nvidia-* Python wheels beside PyTorch).
libdirs=$rt/usr/lib/x86_64-linux-gnu:$rt/usr/lib/x86_64-linux-gnu/openblas-openmp
for lib in libcudart.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  hit=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
  [[ -z $hit ]] && hit=$(find /usr/local/cuda*/ /opt /usr/lib /usr/local/lib -name "$lib" \
                              2>/dev/null | head -1)
  [[ -n $hit ]] && libdirs=$libdirs:$(dirname "$hit")
  echo "library $lib: ${hit:-NOT FOUND}"
done
# A wrapper, so that Python (PyTorch) keeps the machine's own libraries.
cat > "$work/meshtrain" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH=$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
exec "$build/meshtrain" "\$@"
EOF
chmod +x "$work/meshtrain"
export OPAL_PREFIX=$rt/usr PATH=$rt/usr/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
# PMIx looks for its plugins under its build-time prefix, where the machine may have its own
# (mismatched ones only print warnings; a singleton's PMIx still read them on the H100).
export PMIX_INSTALL_PREFIX=$rt/usr
export PMIX_MCA_mca_base_component_path=$rt/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export PMIX_MCA_pcompress_base_silence_warning=1
export LD_LIBRARY_PATH_MESHTRAIN=$libdirs
# ctest runs the test binaries directly, and the NCCL test under the build machine's mpiexec.
mkdir -p "$work/bin"
cat > "$work/bin/mpiexec" <<EOF
#!/bin/sh
exec env LD_LIBRARY_PATH=$libdirs "$rt/usr/bin/orterun" -x LD_LIBRARY_PATH "\$@"
EOF
chmod +x "$work/bin/mpiexec"
[[ -e /usr/bin/mpiexec ]] || ln -s "$work/bin/mpiexec" /usr/bin/mpiexec

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -1
  echo "ctest: $(command -v ctest), compute-sanitizer: $(command -v compute-sanitizer)," \
       "python3: $(command -v python3)"
  LD_LIBRARY_PATH=$libdirs ldd "$build/meshtrain" | grep -E "not found|cud|nccl|mpi"
} 2>&1 | tee "$out/machine.txt"

PYTHONUNBUFFERED=1 python3 "$repo/bench/gpu/checklist.py" --meshtrain "$work/meshtrain" \
  --mpiexec "$work/bin/mpiexec" --build "$build" --out "$work/out" "$@"
status=$?
cp "$work/out/summary.txt" "$out/summary.txt"
tar -czf "$out/logs.tar.gz" --exclude="*.h5" -C "$work" out
echo "--- summary"
cat "$out/summary.txt"
exit $status
