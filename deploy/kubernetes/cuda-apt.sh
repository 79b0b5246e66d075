#!/usr/bin/env bash
# Adds NVIDIA's CUDA apt repository for Debian 12 (its signing key comes in NVIDIA's
# cuda-keyring package) and, for `build`, installs the CUDA compiler and the libraries meshtrain's
# CUDA backend builds against: cuBLAS/cuBLASLt, cuDNN 9 and NCCL. For `runtime` it only adds the
# repository: the runtime stage installs what runtime-packages.sh found the binary to load.
# Debian's own nvidia-cuda-toolkit (CUDA 11.8, non-free) is too old for meshtrain (CUDA 12+).
#
#   cuda-apt.sh 12-6 build | runtime        (CUDA major-minor as NVIDIA's package names spell it)
set -euo pipefail
version=${1:?usage: cuda-apt.sh MAJOR-MINOR build|runtime}
what=${2:?usage: cuda-apt.sh MAJOR-MINOR build|runtime}
major=${version%%-*}
export DEBIAN_FRONTEND=noninteractive

apt-get update -qq
apt-get install -y -qq --no-install-recommends ca-certificates curl >/dev/null
curl -fsSL -o /tmp/cuda-keyring.deb \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
dpkg -i /tmp/cuda-keyring.deb >/dev/null
rm /tmp/cuda-keyring.deb
apt-get update -qq

if [[ "$what" == build ]]; then
  apt-get install -y -qq --no-install-recommends \
    "cuda-nvcc-$version" "cuda-cudart-dev-$version" "libcublas-dev-$version" \
    "libcudnn9-dev-cuda-$major" libnccl-dev >/dev/null
fi
