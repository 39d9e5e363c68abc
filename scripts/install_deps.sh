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
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA backend's cuDNN attention engine is built on NVIDIA's header-only cuDNN frontend, which
# ships in the PyPI package nvidia-cudnn-frontend (headers under include/ of the wheel). Install it
# into <repo>/.cudnn-frontend (git-ignored), where backends/cuda/cmake/wlb_find_cudnn.cmake looks.
# Only when nvcc is present: without CUDA the backend is not built.
cudnn_frontend_version=1.32.0
cudnn_frontend_dir="$(cd "$(dirname "$0")/.." && pwd)/.cudnn-frontend"
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  if [ ! -d "${cudnn_frontend_dir}/nvidia_cudnn_frontend-${cudnn_frontend_version}.dist-info" ]; then
    echo "install_deps: installing nvidia-cudnn-frontend==${cudnn_frontend_version} into ${cudnn_frontend_dir}" >&2
    rm -rf "${cudnn_frontend_dir}"
    # Not fatal: without the headers the backend builds without the cudnn engine and says so.
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
      --target "${cudnn_frontend_dir}" "nvidia-cudnn-frontend==${cudnn_frontend_version}" \
      || echo "install_deps: WARNING: nvidia-cudnn-frontend not installed; the CUDA backend" \
              "will build without its cudnn engine" >&2
  fi
fi
