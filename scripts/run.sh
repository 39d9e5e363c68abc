#!/usr/bin/env bash
# Set-up + the main job in one command: installs dependencies, builds wlb-plan and plans 100 steps
# of the embedded default document distribution (S = 128K, N = 4), printing a per-step summary
# and the imbalance of original vs WLB packing. Extra arguments go to wlb-plan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --parallel "$(nproc)" --target wlb-plan
build/tools/wlb-plan "$@"
