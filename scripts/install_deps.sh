#!/usr/bin/env bash
# Installs wlb's build dependencies from Debian's packages. Idempotent: does nothing when all are
# present. Runs apt-get as root directly, or through sudo when available.
set -euo pipefail
packages=(build-essential cmake ninja-build libabsl-dev libeigen3-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev coinor-libcbc-dev pkg-config
          python3 python3-dev python3-venv
          clang-14 clang libclang-rt-14-dev)  # clang: CI's second compiler, sanitizers, libFuzzer
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install_deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
