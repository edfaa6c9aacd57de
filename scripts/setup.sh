#!/usr/bin/env bash
# Installs the Debian packages Prism builds against. Idempotent and quiet when all are present.
#   scripts/setup.sh [fuzz]    fuzz: also clang and its runtimes (libclang-rt-dev holds libFuzzer) for test-fuzz
set -euo pipefail
pkgs=(cmake g++ make libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgmock-dev libprotobuf-dev protobuf-compiler iproute2)
[ "${1:-}" = fuzz ] && pkgs+=(clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "setup: note: nvcc not found (expected /usr/local/cuda/bin/nvcc); GPU kernels are skipped" >&2
fi
