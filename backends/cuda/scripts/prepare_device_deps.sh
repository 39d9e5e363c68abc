#!/usr/bin/env bash
# Prepares <repo>/.deps (git-ignored) for a GPU machine that has nvcc, CMake, ninja and PyTorch but
# no Debian -dev packages and no package registry: downloads the Debian packages of wlb's build
# dependencies here (apt-get download needs no root) and unpacks them with dpkg -x into
# .deps/root. gpu_check.sh's build stage (the fallback when the binaries prebuild.sh made here do
# not load there) builds against .deps/root/usr. Run it here, then
# send .deps with the call (the device tool's `carry`). Idempotent: re-running replaces .deps.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
deps="${repo}/.deps"
packages=(libabsl-dev libabsl20220623 libgtest-dev libgmock-dev libbenchmark-dev
          libbenchmark1debian nlohmann-json3-dev libeigen3-dev)

rm -rf "${deps}"
mkdir -p "${deps}/debs" "${deps}/root"
(cd "${deps}/debs" && apt-get download "${packages[@]}")
for deb in "${deps}"/debs/*.deb; do
  dpkg -x "${deb}" "${deps}/root"
done
{
  echo "# Unpacked by backends/cuda/scripts/prepare_device_deps.sh on $(date -u +%FT%TZ)"
  (cd "${deps}/debs" && ls -1 ./*.deb)
} >"${deps}/MANIFEST"
# Keep only what a build needs: headers, libraries, CMake package files.
rm -rf "${deps}/debs" "${deps}/root/usr/share/doc" "${deps}/root/usr/share/lintian"
# The WLB-LLM-like length file is public data that must not enter the repository; a copy in the
# ignored .deps lets the GPU benchmark use the real mix (gpu_check.sh falls back to a seeded one).
mix="${repo}/../shared/data/doc_lengths_wlbllm_like.json"
if [[ -f "${mix}" ]]; then cp "${mix}" "${deps}/doc_lengths_wlbllm_like.json"; fi
# The cuDNN frontend headers (scripts/install_deps.sh installs them here), for the cudnn engine;
# the GPU machine has cuDNN itself from PyTorch's pip packages.
if [[ -d "${repo}/.cudnn-frontend/include" ]]; then
  mkdir -p "${deps}/cudnn-frontend"
  cp -r "${repo}/.cudnn-frontend/include" "${deps}/cudnn-frontend/"
else
  echo "prepare_device_deps.sh: no ${repo}/.cudnn-frontend (run scripts/install_deps.sh)" >&2
  exit 1
fi
du -sh "${deps}"
