#!/bin/bash
# Runs Google Benchmark binaries alternately, round after round, and prints each benchmark's min
# and median CPU time per binary: on a shared, noisy machine only numbers from one such run
# compare (README "Standards": ratios measured side by side).
#
#   scripts/alternate_bench.sh 'BM_PlanStep/(wlb_refine|wlb_lookahead)/' 6 /tmp/before build/bench/plan_step_benchmark
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 FILTER ROUNDS BINARY..." >&2
  exit 2
fi
filter=$1
rounds=$2
shift 2
for ((i = 0; i < rounds; ++i)); do
  for b in "$@"; do
    "$b" --benchmark_filter="$filter" --benchmark_min_time=0.2 --benchmark_format=csv 2>/dev/null |
      awk -F, -v b="$b" 'NR > 1 && $1 ~ /^"BM_/ {gsub(/"/, "", $1); print b, $1, $4, $5}'
  done
done | python3 -c '
import collections, statistics, sys
times = collections.defaultdict(list)
unit = {}
for line in sys.stdin:
    binary, name, cpu, u = line.split()
    times[(name, binary)].append(float(cpu))
    unit[name] = u
for (name, binary), v in sorted(times.items()):
    print(f"{name:36s} {binary:44s} min {min(v):9.1f} median {statistics.median(v):9.1f} {unit[name]} ({len(v)} rounds)")
'
