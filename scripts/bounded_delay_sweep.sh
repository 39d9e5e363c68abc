#!/bin/bash
# wlb-lookahead's mean token delay against wlb-refine's on 72 streams at S = 128K (docs/guides/
# packers.md, "Bounded delay"): the embedded heavy-tailed and default distributions, N = 4, 16, 64,
# 20 and 60 steps, seeds 1 to 6. Prints each stream that ends above wlb-refine's delay and a
# summary line (streams, how many ended above, mean imbalance of both packers).
#
#   scripts/bounded_delay_sweep.sh [WLB_PLAN] [EXTRA wlb-lookahead flags, e.g. --bound_delay=false]
set -euo pipefail
wlb_plan=${1:-build/tools/wlb-plan}
shift || true
summary() {
  python3 -c 'import json, sys; s = json.load(sys.stdin)["summary"]; print(s["imbalance_mean"], s["delay_mean"])'
}
for dist in heavy-tail default; do
  for n in 4 16 64; do
    for steps in 20 60; do
      for seed in 1 2 3 4 5 6; do
        args=(--distribution "$dist" --micro-batches "$n" --steps "$steps" --seed "$seed"
              --format json --timing=false)
        refine=$("$wlb_plan" "${args[@]}" --packer wlb-refine | summary)
        lookahead=$("$wlb_plan" "${args[@]}" --packer wlb-lookahead "$@" | summary)
        echo "$dist $n $steps $seed $refine $lookahead"
      done
    done
  done
done | awk '{
  n++; refine += $5; lookahead += $7
  if ($8 > $6 + 1e-9) { over++; print "above wlb-refine:", $1, "N =", $2, $3, "steps, seed", $4, "delay", $8, "vs", $6 }
} END {
  printf "streams %d, above wlb-refine'"'"'s delay %d, mean imbalance wlb-refine %.4f, wlb-lookahead %.4f\n", n, over, refine / n, lookahead / n
}'
