#!/usr/bin/env bash
# Runs wlb's libFuzzer harnesses (fuzz/*_fuzzer.cc), each for a set time, one after the other:
#
#   scripts/fuzz.sh                      # every harness, 600 s each
#   scripts/fuzz.sh 60 state_fuzzer      # one harness for a minute
#
# Builds them with clang++ (ASan + UBSan + libFuzzer) in build-fuzz/. Each run starts from the
# committed corpus fuzz/corpus/<harness>/ (read only) and keeps what it finds in
# build-fuzz/corpus/<harness>/; a crash is written to build-fuzz/artifacts/ and stops the script
# with a non-zero status. Copy a crash into fuzz/corpus/<harness>/ once fixed: every ctest run
# replays that folder.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=(lengths_fuzzer state_fuzzer profile_fuzzer cli_fuzzer megatron_index_fuzzer shard_fuzzer)
fi
CXX=${FUZZ_CXX:-clang++} cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DWLB_BUILD_CUDA=OFF -DWLB_BUILD_FUZZERS=ON -DWLB_BUILD_TESTS=OFF -DWLB_BUILD_BENCH=OFF \
  -DWLB_BUILD_EXAMPLES=OFF -DWLB_BUILD_SOLVER=OFF >/dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target "${harnesses[@]}"
mkdir -p build-fuzz/artifacts
for h in "${harnesses[@]}"; do
  mkdir -p "build-fuzz/corpus/$h"
  echo "fuzz.sh: $h for ${seconds}s" >&2
  "build-fuzz/fuzz/$h" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$h-" \
    "build-fuzz/corpus/$h" "fuzz/corpus/$h"
done
