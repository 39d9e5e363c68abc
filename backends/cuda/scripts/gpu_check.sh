#!/usr/bin/env bash
# Builds, checks and benchmarks wlb::cuda on a GPU machine in one call.
#
# The machine needs nvcc, CMake, ninja, a host C++ compiler and (for the side-by-side) PyTorch;
# the Debian -dev packages it lacks come from <repo>/.deps, made here beforehand by
# prepare_device_deps.sh and carried along. Results go to $OUT (default <repo>/build-gpu/out):
#   build.log (with the ptxas register/spill report), test.log, sanitizer.log, wlb_bench.jsonl,
#   torch_bench.jsonl, mix_lengths.json, nvidia-smi.txt, summary.md (also printed last);
#   CP (issue 6): h200_kernel_profile.csv (the KernelModel table), profiler.log, cp_bench.log,
#   cp_bench.jsonl, cp_bench_analytic.log, cp_example.log.
# Exit status: non-zero if the build fails, a test fails, or the GPU tests skip (no device).
#
#   backends/cuda/scripts/prepare_device_deps.sh        # here, once
#   backends/cuda/scripts/gpu_check.sh [--quick] [--cp]  # there; --quick: fewer bench configs;
#                                                        # --cp: skip sanitizer and kernel benches
set -uo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
out="${OUT:-${repo}/build-gpu/out}"
mkdir -p "${out}"
build="${repo}/build-gpu"
deps="${repo}/.deps/root/usr"
quick=0
cp_only=0
for arg in "$@"; do
  [[ "${arg}" == "--quick" ]] && quick=1
  [[ "${arg}" == "--cp" ]] && cp_only=1
done
status=0
log() { echo "== $*" | tee -a "${out}/summary.md"; }

: >"${out}/summary.md"
log "gpu_check $(date -u +%FT%TZ) on $(hostname)"
if [[ ! -d "${deps}" ]]; then
  log "missing ${deps}: run backends/cuda/scripts/prepare_device_deps.sh first and carry .deps"
  exit 2
fi
export PATH="/usr/local/cuda/bin:${PATH}"
export LD_LIBRARY_PATH="${deps}/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
nvidia-smi >"${out}/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >>"${out}/nvidia-smi.txt"
{ nvcc --version | tail -2; cmake --version | head -1; c++ --version | head -1; } \
  | tee -a "${out}/summary.md"

# ---- build: only this backend's targets (the rest of the project needs more packages) ----
# "-include cstdint": Debian's Abseil 20220623 predates GCC 13's leaner <string>.
t0=$(date +%s)
cmake -S "${repo}" -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="${deps}" -DCMAKE_CXX_FLAGS="-include cstdint" \
  -DWLB_BUILD_TESTS=OFF -DWLB_BUILD_BENCH=OFF -DWLB_BUILD_EXAMPLES=OFF -DWLB_BUILD_TOOLS=OFF \
  -DWLB_BUILD_CUDA=ON -DWLB_CUDA_BUILD_TESTS=ON -DWLB_CUDA_BUILD_BENCH=ON -DWLB_CUDA_BUILD_EXAMPLES=ON \
  -DWLB_CUDA_PTXAS_VERBOSE=ON >"${out}/build.log" 2>&1 \
  && cmake --build "${build}" --parallel "$(nproc)" >>"${out}/build.log" 2>&1
if [[ $? -ne 0 ]]; then
  log "BUILD FAILED (tail of build.log follows)"
  tail -40 "${out}/build.log"
  exit 1
fi
log "build ok in $(( $(date +%s) - t0 )) s"
grep -E "Compiling entry function|registers|spill" "${out}/build.log" \
  | grep -E "Flash|registers|spill" | sed -E 's/_ZN3wlb[^ ]*(Flash[A-Za-z]*Kernel[A-Za-z0-9]*).*/\1/' \
  | head -12 >>"${out}/summary.md"

# ---- tests ----
tests="${build}/backends/cuda"
ctest --test-dir "${tests}" -L cpu --output-on-failure >"${out}/test.log" 2>&1 || status=1
ctest --test-dir "${tests}" -L gpu --output-on-failure --timeout 1200 >>"${out}/test.log" 2>&1 \
  || status=1
if grep -q "(Skipped)" "${out}/test.log"; then
  log "GPU TESTS SKIPPED: no usable device (see test.log); nothing was verified"
  status=1
fi
grep -E "tests passed|tests failed|Failed|Skipped" "${out}/test.log" | tee -a "${out}/summary.md"

# ---- CP (issue 6): profile table, CP benchmark, end-to-end example ----
bench="${build}/backends/cuda/bench"
profile="${out}/h200_kernel_profile.csv"
max_kv=131072
[[ ${quick} -eq 1 ]] && max_kv=32768
timeout 300 "${bench}/wlb_cuda_kernel_profiler" --out="${profile}" --max_kv="${max_kv}" \
  --max_q=$(( max_kv / 4 )) >"${out}/profiler.log" 2>&1 || status=1
tail -1 "${out}/profiler.log" | tee -a "${out}/summary.md"
cp_mbs=8
[[ ${quick} -eq 1 ]] && cp_mbs=3
if [[ -s "${profile}" ]]; then
  timeout 300 "${bench}/wlb_cuda_cp_bench" --cp=4 --micro_batches="${cp_mbs}" \
    --profile="${profile}" --json="${out}/cp_bench.jsonl" >"${out}/cp_bench.log" 2>&1 || status=1
  tail -9 "${out}/cp_bench.log" | tee -a "${out}/summary.md"
fi
timeout 200 "${bench}/wlb_cuda_cp_bench" --cp=4 --micro_batches=3 \
  >"${out}/cp_bench_analytic.log" 2>&1 || status=1
log "analytic kernel model:"
tail -1 "${out}/cp_bench_analytic.log" | tee -a "${out}/summary.md"
timeout 200 "${build}/backends/cuda/examples/wlb_cuda_cp_end_to_end" >"${out}/cp_example.log" 2>&1 \
  || status=1
tail -1 "${out}/cp_example.log" | tee -a "${out}/summary.md"

if [[ ${cp_only} -eq 0 ]]; then
# ---- memory checker on the small shapes (catches out-of-bounds and uninitialized reads) ----
gtest="${tests}/test/wlb_cuda_attention_gpu_test"
if command -v compute-sanitizer >/dev/null; then
  timeout 900 compute-sanitizer --tool memcheck --error-exitcode 9 "${gtest}" \
    --gtest_filter='*RandomSegments*' >"${out}/sanitizer.log" 2>&1
  rc=$?
  timeout 600 compute-sanitizer --tool racecheck --error-exitcode 9 "${gtest}" \
    --gtest_filter='*RandomSegments*' >>"${out}/sanitizer.log" 2>&1
  rc2=$?
  log "compute-sanitizer memcheck rc=${rc}, racecheck rc=${rc2} (0 = clean, 9 = errors, 124 = timeout)"
  [[ ${rc} -eq 9 || ${rc2} -eq 9 ]] && status=1
else
  log "compute-sanitizer not found; skipped"
fi

# ---- benchmark: wlb flash kernels, then PyTorch on the same shapes ----
configs="512,2048,8192,16384,mix"
[[ ${quick} -eq 1 ]] && configs="2048,16384,mix"
mix_args=()
if [[ -f "${repo}/.deps/doc_lengths_wlbllm_like.json" ]]; then
  mix_args=(--mix="${repo}/.deps/doc_lengths_wlbllm_like.json")
fi
: >"${out}/wlb_bench.jsonl"
: >"${out}/torch_bench.jsonl"
"${build}/backends/cuda/bench/wlb_cuda_attention_bench" --configs="${configs}" \
  --json="${out}/wlb_bench.jsonl" --dump_mix="${out}/mix_lengths.json" "${mix_args[@]}" \
  2>&1 | tee -a "${out}/summary.md" || status=1
PYTHONUNBUFFERED=1 python3 "${repo}/backends/cuda/bench/torch_attention_bench.py" \
  --configs="${configs}" --mix-lengths "${out}/mix_lengths.json" \
  --json "${out}/torch_bench.jsonl" 2>&1 | tee -a "${out}/summary.md" || status=1

# ---- side-by-side: wlb TFLOP/s over the best PyTorch backend per config ----
python3 - "${out}/wlb_bench.jsonl" "${out}/torch_bench.jsonl" <<'PY' | tee -a "${out}/summary.md"
import json, sys
wlb = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
torch = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
print("| config | wlb fwd TF/s | wlb bwd TF/s | best torch fwd (backend) | best torch bwd "
      "(backend) | fwd ratio | bwd ratio |")
print("|---|---|---|---|---|---|---|")
for w in wlb:
    rows = [t for t in torch if t["config"] == w["config"] and "fwd_tflops" in t]
    if not rows:
        print(f"| {w['config']} | {w['fwd_tflops']:.1f} | {w['bwd_tflops']:.1f} | n/a | n/a | | |")
        continue
    bf = max(rows, key=lambda t: t["fwd_tflops"])
    bb = max(rows, key=lambda t: t["bwd_tflops"])
    print(f"| {w['config']} | {w['fwd_tflops']:.1f} | {w['bwd_tflops']:.1f} | "
          f"{bf['fwd_tflops']:.1f} ({bf['impl']}) | {bb['bwd_tflops']:.1f} ({bb['impl']}) | "
          f"{w['fwd_tflops'] / bf['fwd_tflops']:.2f} | {w['bwd_tflops'] / bb['bwd_tflops']:.2f} |")
print("targets (issue 5): fwd >= 335 TFLOP/s and bwd >= 300 TFLOP/s at 16K, head_dim 128")
PY
fi
log "gpu_check done, status ${status}"
exit ${status}
