#!/usr/bin/env bash
# Set-up + tests in one command: installs dependencies, builds everything (the CUDA backend too
# when nvcc is found) and runs the whole ctest suite. GPU tests skip with a reason without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)"
ctest --test-dir build --output-on-failure --parallel "$(nproc)"
