#!/usr/bin/env bash
# Installs the Debian packages kiln's build needs, only those that are missing. Idempotent; safe to run
# on every `make`. The CUDA toolkit is not installed here: it is optional (KILN_CUDA=AUTO builds the CUDA
# backend only when nvcc is found).
#
#   scripts/install-deps.sh           the build and the tests
#   scripts/install-deps.sh --fuzz    also clang with libFuzzer and OpenMP (the fuzz build: make fuzz)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-openmp-dev liblapacke-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev
  libpcre2-dev libutf8proc-dev libdnnl-dev
)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev libomp-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
