#!/usr/bin/env bash
# The Debian packages whose shared libraries BINARY loads, one a line: what a runtime image must
# install to run it (the Dockerfile's second stage installs exactly these, plus the MPI launcher
# and ssh). Found with ldd, each library mapped to its package with dpkg -S. Fails naming any
# library no package owns, or that ldd cannot find, except the GPU driver's (libcuda,
# libnvidia-ml), which the NVIDIA container runtime mounts from the host.
#
#   deploy/kubernetes/runtime-packages.sh build/meshtrain
set -euo pipefail
bin=${1:?usage: runtime-packages.sh BINARY}
[[ -x "$bin" ]] || { echo "runtime-packages.sh: $bin is not an executable" >&2; exit 1; }

driver='^lib(cuda|nvidia-ml)\.so'
missing=$(ldd "$bin" | awk '/=> not found/ {print $1}' | grep -Ev "$driver" || true)
if [[ -n "$missing" ]]; then
  echo "runtime-packages.sh: $bin: ldd finds no $(echo $missing)" >&2
  exit 1
fi

# "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)" and the loader "/lib64/ld-linux-x86-64.so.2 (0x...)"
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)

owner_of() {
  # Debian 12 merges /lib into /usr/lib, but dpkg knows each file by the path its package ships,
  # and alternatives (libblas, libopenblas) are links: try the path, its target, and both spellings.
  local lib=$1 real path
  real=$(readlink -f "$lib")
  for path in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do
    dpkg -S "$path" 2>/dev/null | grep -v '^diversion' | head -n1 | sed 's/: .*//; s/:[a-z0-9]*//g; s/, /\n/g' \
      && return 0
  done
  return 1
}

packages=() unowned=()
for lib in $libs; do
  if owners=$(owner_of "$lib"); then packages+=($owners); else unowned+=("$lib"); fi
done
if [[ ${#unowned[@]} -gt 0 ]]; then
  echo "runtime-packages.sh: no Debian package owns ${unowned[*]} (copied in by hand?)" >&2
  exit 1
fi
printf '%s\n' "${packages[@]}" | sort -u
