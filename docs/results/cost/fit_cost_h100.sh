#!/usr/bin/env bash
# Reproduces docs/results/cost/fit_cost_h100.txt: the shipped calibrations refitted from the
# committed H100 measurements, beside the FLOP presets at their best time scale.
# Usage (repository root, after building wlb-plan): docs/results/cost/fit_cost_h100.sh [WLB_PLAN]
set -euo pipefail
wlb_plan="${1:-build/tools/wlb-plan}"
echo "# commit $(git rev-parse --short HEAD); $(uname -m); $(date -u +%Y-%m-%d)"
for args in "docs/results/h100_layer_7b_128k_measurements.csv --cost llama2-7b" \
            "docs/results/h100_layer_550m_64k_measurements.csv --cost wlb-550m"; do
  echo
  echo "\$ wlb-plan --fit-cost ${args}"
  # shellcheck disable=SC2086
  "${wlb_plan}" --fit-cost ${args}
done
