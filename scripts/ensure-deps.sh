#!/usr/bin/env bash
# Makes sure the Debian packages meshtrain builds, tests and runs with are installed.
# As root with apt: installs what is missing. Otherwise: names the missing packages and fails.
#
#   scripts/ensure-deps.sh build   # compiler, MPI, BLAS, oneDNN, HDF5, toml++, CLI11, GoogleTest,
#                                  # zlib and zstd (compressed JSON Lines corpora), ICU
#                                  # (tokenizer.json normalizers)
#   scripts/ensure-deps.sh test    # build + what the tests drive (h5py, PyYAML, Slurm, munge, zstd)
#   scripts/ensure-deps.sh fuzz    # build + clang, libFuzzer and sanitizer runtimes, clang's OpenMP
#   scripts/ensure-deps.sh SET mpich   # the same with MPICH and its parallel HDF5 (`make MPI=mpich`)
set -euo pipefail

flavour=${2:-openmpi}
case "$flavour" in
  openmpi) mpi_packages=(openmpi-bin libopenmpi-dev libhdf5-openmpi-dev) ;;
  mpich) mpi_packages=(mpich libmpich-dev libhdf5-mpich-dev) ;;
  *) echo "meshtrain: unknown MPI flavour '$flavour' (expected openmpi or mpich)" >&2; exit 2 ;;
esac
build_packages=(
  build-essential cmake pkg-config
  "${mpi_packages[@]}"
  libopenblas-openmp-dev libdnnl-dev
  hdf5-tools
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev googletest
  libsentencepiece-dev libpcre2-dev nlohmann-json3-dev libicu-dev
  zlib1g-dev libzstd-dev
)
test_packages=(
  python3 python3-venv python3-h5py python3-numpy python3-yaml python3-matplotlib python3-regex zstd
  slurm-wlm munge
)
fuzz_packages=(
  clang libclang-rt-14-dev libomp-dev
)

want=("${build_packages[@]}")
case "${1:-build}" in
  test) want+=("${test_packages[@]}") ;;
  fuzz) want+=("${fuzz_packages[@]}") ;;
esac

missing=()
for p in "${want[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == installed ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "meshtrain: installing missing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Another MPI (MPICH) may share the machine; keep OpenMPI the default 'mpi' alternative.
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The list is read whole before it is matched: `| grep -q` under pipefail fails when grep
  # stops reading first.
  if [[ $(update-alternatives --list mpi 2>/dev/null || true) == *openmpi* ]]; then
    update-alternatives --set mpi /usr/bin/mpicc.openmpi >/dev/null
    update-alternatives --set mpirun /usr/bin/mpirun.openmpi >/dev/null
  fi
  exit 0
fi

echo "meshtrain: missing Debian packages: ${missing[*]}" >&2
echo "  install them with: sudo apt-get install ${missing[*]}" >&2
exit 1
