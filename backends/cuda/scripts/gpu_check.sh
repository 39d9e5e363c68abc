#!/usr/bin/env bash
# Runs wlb::cuda's prebuilt binaries on a GPU machine, in stages that each fit a short call.
#
#   backends/cuda/scripts/prebuild.sh                       # dev machine: fills .device/
#   backends/cuda/scripts/gpu_check.sh STAGE [STAGE ...]    # GPU machine, .device carried
#
# Stages (expected minutes on one H100/H200 are in backends/cuda/README.md once measured):
#   tests      every test binary directly (no ctest: carried paths differ), per-test verdicts;
#              a skipped test fails unless it is allowed below with its reason
#   sanitizer  compute-sanitizer memcheck and racecheck on the small-shape GPU tests
#   bench      flash (both block orders) and cudnn forward/backward TFLOP/s, then PyTorch SDPA
#              (flash, cuDNN, efficient) on the same shapes, and the ratio table
#   ncu        Nsight Compute on one 16K-document forward and backward (why the kernels are
#              where they are)
#   cp         kernel profile table (q_len,kv_len,ms), CP benchmark at C = 2, 4, 8 with it and
#              with the analytic model, the end-to-end example
#   layer      the decoder layer: its CPU tests, the GPU runner against the float64 reference
#              (and memcheck on small shapes), then layer_bench at 7B-128K (Table 2 from measured
#              latency, fitted profile, measured 1F1B speedup, CP at C = 2 and 4); 550M-64K too
#              when WLB_LAYER_KERNEL names an engine that takes head_dim 96 (flash and cudnn take 64 or 128)
#   cp_cudnn   the same on the cudnn engine: its own profile table (kernel_profile_cudnn.csv),
#              CP benchmark at C = 2, 4, 8 with it, the end-to-end example
#   build      fallback when the carried binaries do not run there: builds them there with
#              prebuild.sh from .deps (prepare_device_deps.sh) into /tmp/wlb-device
# The whole call shares one time budget, WLB_GPU_BUDGET_S (default 480 s): each binary's timeout
# is cut to what is left, and a stage that cannot start in time is reported NOT RUN, so a call
# always ends inside the device tool's 10 minutes with its files written.
#
# Results: $OUT (default <repo>/build-gpu-out) gets summary.md (also printed; the short table is
# last), one <stage>.tar.gz of that stage's logs, CSVs and JSON lines per stage, and
# kernel_profile.csv (cp) or kernel_profile_cudnn.csv (cp_cudnn). At most 7 files, so the device tool returns all of them.
# Exit status: 0 when every stage that ran passed; 1 otherwise; 2 for a usage error.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
dev="${WLB_DEVICE_DIR:-${repo}/.device}"
out="${OUT:-${repo}/build-gpu-out}"
budget="${WLB_GPU_BUDGET_S:-480}"
work="$(mktemp -d /tmp/wlb-gpu.XXXXXX)"
start=$(date +%s)
status=0
declare -a table=()

stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || { sed -n '2,27p' "$0"; exit 2; }
for s in "${stages[@]}"; do
  case "${s}" in
    tests|sanitizer|bench|ncu|cp|cp_cudnn|layer|build) ;;
    *) echo "gpu_check.sh: unknown stage '${s}' (allowed: tests sanitizer bench ncu cp cp_cudnn layer build)" >&2
       exit 2 ;;
  esac
done
mkdir -p "${out}"
summary="${out}/summary.md"
: >"${summary}"
say() { echo "$*" | tee -a "${summary}"; }
left() { echo $(( budget - ($(date +%s) - start) )); }

# Skips accepted on a one-GPU machine, with the reason (Suite.Name=reason). None today: the NCCL
# test runs over every visible GPU, so with one GPU it runs NCCL with C = 1.
allowed_skips=()

# ---- environment: carried libraries first, then pip's NCCL, cuDNN and NVRTC (the cudnn engine;
# nvidia.cu13 in CUDA 13 wheels, nvidia.cuda_nvrtc in CUDA 12 ones), cuBLASLt (the layer
# runner's GEMMs; not carried, hundreds of MiB: the toolkit's, else pip's), then the machine's own ----
pip_lib() {
  python3 -c 'import importlib, os, sys; m = importlib.import_module(sys.argv[1]); d = os.path.join(list(m.__path__)[0], "lib"); print(d if os.path.isdir(d) else "")' "$1" 2>/dev/null || true
}
nccl_lib=$(pip_lib nvidia.nccl)
cudnn_lib=$(pip_lib nvidia.cudnn)
nvrtc_lib=$(pip_lib nvidia.cu13)
[[ -n "${nvrtc_lib}" ]] || nvrtc_lib=$(pip_lib nvidia.cuda_nvrtc)
cublas_lib=$(dirname "$(ls /usr/local/cuda/lib64/libcublasLt.so.* 2>/dev/null | head -1)" 2>/dev/null)
if [[ -z "${cublas_lib}" || "${cublas_lib}" == "." ]]; then
  nvidia_dir=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
  cublas_lib=$( [[ -n "${nvidia_dir}" ]] && dirname "$(find "${nvidia_dir}" -name 'libcublasLt.so.*' | head -1)" 2>/dev/null || true)
  [[ "${cublas_lib}" == "." ]] && cublas_lib=""
fi
pip_libs=""
for d in "${nccl_lib}" "${cudnn_lib}" "${nvrtc_lib}" "${cublas_lib}"; do [[ -n "${d}" ]] && pip_libs="${pip_libs}:${d}"; done
export LD_LIBRARY_PATH="${dev}/lib${pip_libs}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
export PATH="${PATH}:/usr/local/cuda/bin"
say "# gpu_check $(date -u +%FT%TZ): stages ${stages[*]}, budget ${budget} s"
gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) x ${gpu_count}; pip libs: NCCL ${nccl_lib:-none}, cuDNN ${cudnn_lib:-none}, NVRTC ${nvrtc_lib:-none}, cuBLASLt ${cublas_lib:-none}"
nvidia-smi >"${work}/nvidia-smi.txt" 2>&1 || true

# run STAGE NAME CAP_S CMD...: runs CMD with a timeout of min(CAP_S, what is left - 15 s),
# output to $work/STAGE/NAME.log; prints and returns its exit status (124: timed out).
run() {
  local stage=$1 name=$2 cap=$3
  shift 3
  local t=$(( $(left) - 15 ))
  (( t > cap )) && t=${cap}
  if (( t < 10 )); then
    echo "NOT RUN (out of time)" >"${work}/${stage}/${name}.log"
    table+=("| ${stage} | ${name} | NOT RUN (out of time) | 0 |")
    return 125
  fi
  local t0
  t0=$(date +%s)
  timeout -k 5 "${t}" "$@" >"${work}/${stage}/${name}.log" 2>&1
  local rc=$?
  local verdict="rc ${rc}"
  (( rc == 0 )) && verdict="ok"
  (( rc == 124 || rc == 137 )) && verdict="TIMEOUT after ${t} s"
  table+=("| ${stage} | ${name} | ${verdict} | $(( $(date +%s) - t0 )) |")
  return ${rc}
}

binaries_checked=0
check_binaries() {
  (( binaries_checked )) && return 0
  if [[ ! -x "${dev}/bin/wlb_cuda_attention_gpu_test" ]]; then
    say "missing ${dev}/bin: run backends/cuda/scripts/prebuild.sh on the dev machine and carry .device (or run the build stage)"
    return 1
  fi
  if ldd "${dev}/bin/"* 2>/dev/null | grep -q "not found"; then
    say "unresolved libraries:"; ldd "${dev}/bin/"* | grep "not found" | sort -u | tee -a "${summary}"
    return 1
  fi
  say "binaries: ${dev}/bin; $(ldd "${dev}/bin/wlb_cuda_cp_gpu_test" | awk '/libnccl|libcudnn.so|libnvrtc.so/ {printf "%s => %s; ", $1, $3}')"
  binaries_checked=1
}

stage_build() {
  [[ -d "${repo}/.deps/root/usr" ]] || { say "build: no .deps (run prepare_device_deps.sh here and carry .deps)"; return 1; }
  local built=/tmp/wlb-device
  local deps_lib="${repo}/.deps/root/usr/lib/x86_64-linux-gnu"
  # GCC 13 and newer need <cstdint> included for Debian's Abseil 20220623.
  LD_LIBRARY_PATH="${deps_lib}:${LD_LIBRARY_PATH}" run build prebuild 420 \
    "${repo}/backends/cuda/scripts/prebuild.sh" --build /tmp/wlb-build --out "${built}" -- \
    -DCMAKE_PREFIX_PATH="${repo}/.deps/root/usr" -DCMAKE_CXX_FLAGS="-include cstdint" \
    -DWLB_CUDNN_FRONTEND_INCLUDE_DIR="${repo}/.deps/cudnn-frontend/include" \
    || return 1
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && cp "${dev}/data/doc_lengths_wlbllm_like.json" "${built}/data/"
  [[ -f "${repo}/.deps/doc_lengths_wlbllm_like.json" ]] && cp "${repo}/.deps/doc_lengths_wlbllm_like.json" "${built}/data/"
  dev="${built}"
  export LD_LIBRARY_PATH="${dev}/lib:${LD_LIBRARY_PATH}"
}

stage_tests() {
  check_binaries || return 1
  local logs=()
  for t in attention_problem_test attention_plan_test cpu_reference_test tensor_validation_test \
           cudnn_layout_test cp_maps_test communicator_test; do
    "${dev}/bin/wlb_cuda_${t}" --gtest_list_tests >"${work}/tests/${t}.list" 2>&1
    run tests "${t}" 120 "${dev}/bin/wlb_cuda_${t}"
    logs+=("cpu=${work}/tests/${t}.log=${work}/tests/${t}.list")
  done
  # GPU tests, most informative first; each binary prints its per-test times.
  for t in attention_gpu_test cp_gpu_test; do
    "${dev}/bin/wlb_cuda_${t}" --gtest_list_tests >"${work}/tests/${t}.list" 2>&1
    run tests "${t}" "$([[ ${t} == attention_gpu_test ]] && echo 300 || echo 240)" \
      "${dev}/bin/wlb_cuda_${t}"
    logs+=("gpu=${work}/tests/${t}.log=${work}/tests/${t}.list")
  done
  local allow=()
  for a in "${allowed_skips[@]}"; do allow+=(--allow-skip "${a}"); done
  python3 "${repo}/backends/cuda/scripts/gtest_report.py" "${allow[@]}" "${logs[@]}" \
    >"${work}/tests/report.md"
  local rc=$?
  cat "${work}/tests/report.md" >>"${summary}"
  tail -1 "${work}/tests/report.md"
  table+=("| tests | per-test verdicts | $(tail -1 "${work}/tests/report.md") | |")
  return ${rc}
}

stage_sanitizer() {
  check_binaries || return 1
  local sanitizer
  sanitizer=$(command -v compute-sanitizer \
    || ls /usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
  [[ -n "${sanitizer}" ]] || { say "sanitizer: compute-sanitizer not found"; return 1; }
  local gtest="${dev}/bin/wlb_cuda_attention_gpu_test" rc=0 r
  local small='AttentionGpu.SmallShapes*:AttentionGpu.RandomSegments*:AttentionGpu.BadTensors*'
  run sanitizer memcheck 240 "${sanitizer}" --tool memcheck --error-exitcode 9 \
    --print-limit 20 "${gtest}" --gtest_filter="${small}"
  r=$?; (( r != 0 )) && rc=1
  run sanitizer memcheck_collectives 60 "${sanitizer}" --tool memcheck --error-exitcode 9 \
    --print-limit 20 "${dev}/bin/wlb_cuda_cp_gpu_test" --gtest_filter='*LocalCollectives*'
  r=$?; (( r != 0 )) && rc=1
  run sanitizer racecheck 200 "${sanitizer}" --tool racecheck --error-exitcode 9 \
    --print-limit 20 "${gtest}" --gtest_filter='AttentionGpu.RandomSegments*'
  r=$?; (( r != 0 )) && rc=1
  for f in memcheck memcheck_collectives racecheck; do
    say "${f}: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|not supported|Error' "${work}/sanitizer/${f}.log" | tail -3 | tr '\n' ' ')"
  done
  return ${rc}
}

stage_bench() {
  check_binaries || return 1
  local b="${work}/bench" configs="512,2048,8192,16384,mix" mix=()
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && mix=(--mix="${dev}/data/doc_lengths_wlbllm_like.json")
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"${b}/device.csv" 2>&1
  run bench wlb_attention_bench 240 "${dev}/bin/wlb_cuda_attention_bench" --configs="${configs}" \
    --kernels=flash,cudnn --block_orders=heaviest_first,head_major --json="${b}/wlb_bench.jsonl" \
    --dump_mix="${b}/mix_lengths.json" "${mix[@]}" || return 1
  PYTHONUNBUFFERED=1 run bench torch_attention_bench 240 python3 \
    "${repo}/backends/cuda/bench/torch_attention_bench.py" --configs="${configs}" \
    --mix-lengths "${b}/mix_lengths.json" --backends flash,cudnn,efficient \
    --json "${b}/torch_bench.jsonl"
  local trc=$?
  python3 - "${b}/wlb_bench.jsonl" "${b}/torch_bench.jsonl" >"${b}/ratios.md" <<'PY'
import json, os, sys
wlb = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
torch = [json.loads(l) for l in open(sys.argv[2]) if l.strip()] if os.path.exists(sys.argv[2]) else []
print("| config | kernel | block order | wlb fwd TF/s | wlb bwd TF/s | best torch fwd (backend) | "
      "best torch bwd (backend) | fwd ratio | bwd ratio | fwd / torch cuDNN | bwd / torch cuDNN |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for w in wlb:
    rows = [t for t in torch if t["config"] == w["config"] and "fwd_tflops" in t]
    kernel = w.get("kernel", "flash")
    head = (f"| {w['config']} | {kernel} | {w['block_order']} | {w['fwd_tflops']:.1f} |"
            f" {w['bwd_tflops']:.1f} |")
    if not rows:
        print(head + " n/a | n/a | | | | |")
        continue
    bf = max(rows, key=lambda t: t["fwd_tflops"])
    bb = max(rows, key=lambda t: t.get("bwd_tflops", 0))
    tc = next((t for t in rows if t["impl"] == "torch_sdpa_cudnn"), None)
    vs_cudnn = (f" {w['fwd_tflops'] / tc['fwd_tflops']:.2f} | {w['bwd_tflops'] / tc['bwd_tflops']:.2f} |"
                if tc else " n/a | n/a |")
    print(head + f" {bf['fwd_tflops']:.1f} ({bf['impl']}) | {bb['bwd_tflops']:.1f} ({bb['impl']}) |"
          f" {w['fwd_tflops'] / bf['fwd_tflops']:.2f} | {w['bwd_tflops'] / bb['bwd_tflops']:.2f} |"
          + vs_cudnn)
by = {(w["config"], w.get("kernel", "flash"), w["block_order"]): w for w in wlb}
for c in dict.fromkeys(w["config"] for w in wlb):
    a, b = by.get((c, "flash", "heaviest_first")), by.get((c, "flash", "head_major"))
    if a and b:
        print(f"block order {c}: head_major / heaviest_first time, fwd "
              f"{b['fwd_ms'] / a['fwd_ms']:.3f}, bwd {b['bwd_ms'] / a['bwd_ms']:.3f}")
    f, d = by.get((c, "flash", "heaviest_first")), by.get((c, "cudnn", "-"))
    if f and d:
        print(f"engine {c}: cudnn / flash time, fwd {d['fwd_ms'] / f['fwd_ms']:.3f}, "
              f"bwd {d['bwd_ms'] / f['bwd_ms']:.3f}")
print("targets (issue 5): flash fwd >= 335 TFLOP/s and bwd >= 300 TFLOP/s at 16K, head_dim 128")
print("targets (issue 10): cudnn fwd >= 500 and bwd >= 400 TFLOP/s at 16K, and no slower than "
      "torch_sdpa_cudnn on every config")
d = by.get(("16384", "cudnn", "-"))
if d:
    met = d["fwd_tflops"] >= 500 and d["bwd_tflops"] >= 400
    print(f"cudnn at 16K: fwd {d['fwd_tflops']:.1f}, bwd {d['bwd_tflops']:.1f} TFLOP/s: "
          f"{'MET' if met else 'NOT MET'}")
PY
  cat "${b}/ratios.md" >>"${summary}"
  return ${trc}
}

stage_ncu() {
  check_binaries || return 1
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "${ncu}" ]] || { say "ncu: not found"; return 1; }
  # One forward and one backward of 16K documents (8 x 16K tokens), both block orders.
  run ncu ncu_16k 300 "${ncu}" --clock-control none --kernel-name regex:Flash \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    "${dev}/bin/wlb_cuda_attention_bench" --configs=16384 --warmup=0 --iters=1
  local rc=$?
  grep -E "Flash|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|L2 Hit Rate|Stall" \
    "${work}/ncu/ncu_16k.log" | head -60 >>"${summary}"
  return ${rc}
}

stage_cp() {
  check_binaries || return 1
  local c="${work}/cp" rc=0 lengths=()
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && lengths=(--lengths="${dev}/data/doc_lengths_wlbllm_like.json")
  run cp kernel_profiler 240 "${dev}/bin/wlb_cuda_kernel_profiler" --out="${c}/kernel_profile.csv" \
    --max_kv=131072 --max_q=32768 || rc=1
  tail -1 "${c}/kernel_profiler.log" | tee -a "${summary}"
  if [[ -s "${c}/kernel_profile.csv" ]]; then
    cp "${c}/kernel_profile.csv" "${out}/kernel_profile.csv"
    for cp_size in 2 4 8; do
      run cp "cp_bench_c${cp_size}" 120 "${dev}/bin/wlb_cuda_cp_bench" --cp=${cp_size} \
        --micro_batches=8 --profile="${c}/kernel_profile.csv" --json="${c}/cp_bench_c${cp_size}.jsonl" || rc=1
      tail -9 "${c}/cp_bench_c${cp_size}.log" >>"${summary}"
    done
  fi
  run cp cp_bench_analytic_c4 90 "${dev}/bin/wlb_cuda_cp_bench" --cp=4 --micro_batches=3 || rc=1
  tail -1 "${c}/cp_bench_analytic_c4.log" >>"${summary}"
  run cp cp_end_to_end 120 "${dev}/bin/wlb_cuda_cp_end_to_end" "${lengths[@]}" || rc=1
  tail -3 "${c}/cp_end_to_end.log" >>"${summary}"
  return ${rc}
}

stage_layer() {
  check_binaries || return 1
  local l="${work}/layer" rc=0 logs=() docs=() kernel="${WLB_LAYER_KERNEL:-flash}"
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && docs=(--docs="${dev}/data/doc_lengths_wlbllm_like.json")
  for t in layer_reference_test layer_runner_host_test layer_analysis_test layer_gpu_test; do
    "${dev}/bin/wlb_cuda_${t}" --gtest_list_tests >"${l}/${t}.list" 2>&1
    run layer "${t}" 150 "${dev}/bin/wlb_cuda_${t}" || rc=1
    logs+=("$([[ ${t} == layer_gpu_test ]] && echo gpu || echo cpu)=${l}/${t}.log=${l}/${t}.list")
  done
  python3 "${repo}/backends/cuda/scripts/gtest_report.py" "${logs[@]}" >"${l}/report.md" || rc=1
  cat "${l}/report.md" >>"${summary}"
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  if [[ -n "${sanitizer}" ]]; then
    run layer memcheck 90 "${sanitizer}" --tool memcheck --error-exitcode 9 --print-limit 20 \
      "${dev}/bin/wlb_cuda_layer_gpu_test" --gtest_filter='*RandomMicroBatches/flash:*RejectsRunOrder*' || rc=1
    say "layer memcheck: $(grep -E 'ERROR SUMMARY' "${l}/memcheck.log" | tail -1)"
  else
    say "layer memcheck: NOT RUN (compute-sanitizer not found)"
  fi
  run layer bench_7b_128k 300 "${dev}/bin/wlb_cuda_layer_bench" --out="${l}/7b-128k" \
    --kernel="${kernel}" "${docs[@]}" || rc=1
  cat "${l}/7b-128k/summary.md" >>"${summary}" 2>/dev/null
  if [[ "${kernel}" == reference ]]; then
    run layer bench_550m_64k 150 "${dev}/bin/wlb_cuda_layer_bench" --out="${l}/550m-64k" \
      --preset=wlb-550m --tp=2 --context=65536 --pp=4 --dp=2 --kernel="${kernel}" "${docs[@]}" \
      --cp=2 || rc=1
    cat "${l}/550m-64k/summary.md" >>"${summary}" 2>/dev/null
  else
    say "layer bench_550m_64k: NOT RUN (wlb-550m has head_dim 96; flash and cudnn take 64 or 128: WLB_LAYER_KERNEL=reference runs it on the slow reference engine)"
  fi
  return ${rc}
}

# The cudnn engine's own profile table and CP benchmark (as stage_cp does for flash).
stage_cp_cudnn() {
  check_binaries || return 1
  local c="${work}/cp_cudnn" rc=0 lengths=()
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && lengths=(--lengths="${dev}/data/doc_lengths_wlbllm_like.json")
  run cp_cudnn kernel_profiler 240 "${dev}/bin/wlb_cuda_kernel_profiler" --kernel=cudnn \
    --out="${c}/kernel_profile_cudnn.csv" --max_kv=131072 --max_q=32768 || rc=1
  tail -1 "${c}/kernel_profiler.log" | tee -a "${summary}"
  if [[ -s "${c}/kernel_profile_cudnn.csv" ]]; then
    cp "${c}/kernel_profile_cudnn.csv" "${out}/kernel_profile_cudnn.csv"
    for cp_size in 2 4 8; do
      run cp_cudnn "cp_bench_c${cp_size}" 120 "${dev}/bin/wlb_cuda_cp_bench" --kernel=cudnn \
        --cp=${cp_size} --micro_batches=8 --profile="${c}/kernel_profile_cudnn.csv" \
        --json="${c}/cp_bench_c${cp_size}.jsonl" || rc=1
      tail -9 "${c}/cp_bench_c${cp_size}.log" >>"${summary}"
    done
  fi
  run cp_cudnn cp_end_to_end 120 "${dev}/bin/wlb_cuda_cp_end_to_end" --kernel=cudnn \
    "${lengths[@]}" || rc=1
  tail -3 "${c}/cp_end_to_end.log" >>"${summary}"
  return ${rc}
}

for s in "${stages[@]}"; do
  mkdir -p "${work}/${s}"
  t0=$(date +%s)
  say ""
  say "## ${s} (started at +$(( t0 - start )) s, $(left) s left)"
  if (( $(left) < 30 )); then
    table+=("| ${s} | (stage) | NOT RUN (out of time) | 0 |")
    status=1
    continue
  fi
  "stage_${s}"
  rc=$?
  (( rc != 0 )) && status=1
  table+=("| ${s} | (stage) | $( (( rc == 0 )) && echo PASS || echo "FAIL (rc ${rc})") | $(( $(date +%s) - t0 )) |")
  cp "${work}/nvidia-smi.txt" "${work}/${s}/" 2>/dev/null
  tar -czf "${out}/${s}.tar.gz" -C "${work}" "${s}"
done

say ""
say "| stage | step | verdict | seconds |"
say "|---|---|---|---|"
for row in "${table[@]}"; do say "${row}"; done
say "gpu_check: status ${status}, $(( $(date +%s) - start )) s in all; files in ${out}"
exit ${status}
