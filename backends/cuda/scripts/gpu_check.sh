#!/usr/bin/env bash
# Runs wlb::cuda's prebuilt binaries on a GPU machine, in stages that each fit a short call.
#
#   backends/cuda/scripts/prebuild.sh                       # dev machine: fills .device/
#   backends/cuda/scripts/gpu_check.sh STAGE [STAGE ...]    # GPU machine, .device carried
#
# Stages (planned seconds: the sum of their steps' caps, printed at the start of every call):
#   tests      the GPU test binaries (attention, CP executor, decoder layer) directly (no ctest:
#              carried paths differ; the CPU tests run in CI, not here); per-test verdicts from
#              each log and its exit status; a skipped test fails unless allowed below
#   sanitizer  compute-sanitizer: memcheck over the small-shape tests on every engine and the
#              local collectives; racecheck over wlb's own kernels only (flash, reference:
#              WLB_TEST_KERNELS); memcheck over the cudnn engine alone
#   bench      flash (both block orders, every flash backward configuration: WLB_FLASH_BACKWARD,
#              default q64,q64_pass32,q32,q64_w8) and cudnn forward/backward TFLOP/s, then PyTorch
#              (SDPA flash, cuDNN, efficient on uniform shapes; varlen_attn on every shape, the
#              mix's only baseline) on the same shapes, and the ratio table (WLB_BENCH_CONFIGS,
#              WLB_BENCH_KERNELS and WLB_TORCH_BACKENDS narrow it)
#   ncu        Nsight Compute on one 16K-document forward and backward of the flash kernels, the
#              default backward (q64) and the 8-warp one (q64_w8) (why they are where they are)
#   profile    kernel profile tables (q_len,kv_len,ms) of flash and of cudnn
#   cp         CP benchmark at C = 2, 4, 8 (flash) with this call's profile table, else the
#              committed one, else the analytic model; once with the analytic model; the example
#              (sizes: WLB_CP_SIZES, WLB_CP_MICRO_BATCHES, WLB_CP_WARMUP, WLB_CP_ITERS)
#   cp_cudnn   the same on the cudnn engine
#   torch_cp   wlb.torch's CP attention (PyTorch varlen_attn): checked over NCCL and per strategy,
#              then timed per rank on cp_bench's plans and paired with the cp stages' rows
#              (this call's, else the device's committed docs/results/gpu rows;
#              WLB_TORCH_CP_MICRO_BATCHES)
#   layer      the decoder layer: memcheck on small shapes (WLB_LAYER_MEMCHECK=0 skips it), then
#              layer_bench at 7B-128K (Table 2 from measured latency, fitted profiles, measured
#              1F1B speedup, CP at C = 2 and 4); 550M-64K (head_dim 96) on the cudnn engine
#              (reference with WLB_LAYER_KERNEL=reference); WLB_LAYER_STEPS steps each, the first
#              WLB_LAYER_CP_STEPS of them under CP too (the measured CP speedup)
#   calibrated Table 2 planned two ways, with the FLOP preset and with the engine's shipped
#              calibration (layer_bench packer labels NAME@COST): WLB_CALIBRATED_REPEATS runs (1-3,
#              default 3) of 7B-128K on flash, then of 550M-64K on cudnn, WLB_CALIBRATED_STEPS_7B /
#              _550M steps each (default 6 / 4), no profile sweep, no CP; mean and spread over the
#              runs (table2_repeats.py)
#   build      fallback when the carried binaries do not run there: builds them there with
#              prebuild.sh from .deps (prepare_device_deps.sh) into /tmp/wlb-device
# Measured on one H100 on 2026-11-26 (backends/cuda/README.md): cp 31 s and cp_cudnn 24 s at the
# default 4 micro-batches (174 and 115 s at 12), layer 53 s at 3 steps (7B 238 s and 550M 140 s at
# 12 steps with all 12 under CP), torch_cp 132 s at 12 micro-batches.
# Every stage is sized to end well inside 9 minutes on its own. The whole call shares one time
# budget, WLB_GPU_BUDGET_S (default 530 s): each step's timeout is its cap cut to what is left,
# and a step or stage that cannot start in time is reported NOT RUN, so a call always ends inside
# the device tool's 10 minutes with its files written. Every program's output goes to its log
# line-buffered (stdbuf; Python unbuffered), so a step killed by its timeout keeps what it printed.
#
# Results: $OUT (default <repo>/build-gpu-out) gets summary.md (also printed; the short table is
# last; the versions every number was measured with first), one <stage>.tar.gz of that stage's
# logs, CSVs and JSON lines per stage, and the profile tables (profile stage). At most 8 files.
# Verdicts come from each log and its exit status together (gtest_report.py), never from the
# exit status alone. Exit status: 0 when every stage that ran passed; 1 otherwise; 2 for a usage
# error.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
dev="${WLB_DEVICE_DIR:-${repo}/.device}"
out="${OUT:-${repo}/build-gpu-out}"
budget="${WLB_GPU_BUDGET_S:-530}"
work="$(mktemp -d /tmp/wlb-gpu.XXXXXX)"
start=$(date +%s)
status=0
declare -a table=()
# Sizes of the CP stages, so that cp, layer, cp_cudnn and torch_cp fit one call together (about
# 0.4 s per forward + backward pass of a 128K micro-batch at 32 heads on the flash kernels): C
# sizes, micro-batches per C, untimed and timed passes per plan (medians of the timed ones).
read -r -a cp_sizes <<<"${WLB_CP_SIZES:-2 4 8}"
cp_mbs="${WLB_CP_MICRO_BATCHES:-4}"
cp_warmup="${WLB_CP_WARMUP:-1}"
cp_iters="${WLB_CP_ITERS:-3}"
torch_cp_mbs="${WLB_TORCH_CP_MICRO_BATCHES:-2}"
# The layer stage's memcheck on small shapes (0: skip it, once it has passed on this build), and
# the steps each layer_bench measures (3: about 25 s at 7B-128K on an H100, 2026-11-26).
layer_memcheck="${WLB_LAYER_MEMCHECK:-1}"
layer_steps="${WLB_LAYER_STEPS:-3}"
# Steps whose original and wlb micro-batches the layer stage also runs under CP (--cp_steps; the
# measured CP speedup covers these).
layer_cp_steps="${WLB_LAYER_CP_STEPS:-1}"
# The calibrated stage: runs per model (each a fresh process: a repeat) and steps per run.
calibrated_repeats="${WLB_CALIBRATED_REPEATS:-3}"
calibrated_steps_7b="${WLB_CALIBRATED_STEPS_7B:-6}"
calibrated_steps_550m="${WLB_CALIBRATED_STEPS_550M:-4}"
if [[ ! "${calibrated_repeats}" =~ ^[123]$ ]]; then
  echo "gpu_check.sh: WLB_CALIBRATED_REPEATS='${calibrated_repeats}' is not 1, 2 or 3" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1

# Each step's cap in seconds, STAGE:NAME -> cap: the one place a duration is set. Measured on one
# H100 on 2026-11-25 (see backends/cuda/README.md): tests 41 + 92 s, sanitizer 28 + 1 + 13 s.
declare -A caps=(
  [tests:attention_gpu_test]=150 [tests:cp_gpu_test]=200 [tests:layer_gpu_test]=150
  [sanitizer:memcheck]=150 [sanitizer:memcheck_collectives]=60 [sanitizer:racecheck_own]=200
  [sanitizer:memcheck_cudnn]=120
  [bench:wlb_attention_bench]=200 [bench:torch_attention_bench]=200
  [ncu:ncu_16k]=150 [ncu:ncu_cudnn_wlb]=120 [ncu:ncu_cudnn_torch]=150
  [profile:kernel_profiler_flash]=200 [profile:kernel_profiler_cudnn]=280
  [cp:cp_bench_c2]=70 [cp:cp_bench_c4]=70 [cp:cp_bench_c8]=70 [cp:cp_bench_analytic_c4]=25
  [cp:cp_bench_split_c4]=70 [cp_cudnn:cp_bench_split_c4]=60
  [cp:cp_end_to_end]=40
  [cp_cudnn:cp_bench_c2]=60 [cp_cudnn:cp_bench_c4]=60 [cp_cudnn:cp_bench_c8]=60
  [cp_cudnn:cp_end_to_end]=40
  [torch_cp:torch_cp_bench]=150
  [layer:memcheck]=90 [layer:bench_7b_128k]=280 [layer:bench_550m_64k]=150
  [calibrated:bench_7b_128k_r1]=90 [calibrated:bench_7b_128k_r2]=90
  [calibrated:bench_7b_128k_r3]=90 [calibrated:bench_550m_64k_r1]=70
  [calibrated:bench_550m_64k_r2]=70 [calibrated:bench_550m_64k_r3]=70
  [build:prebuild]=420
)
all_stages=(tests sanitizer bench ncu profile cp cp_cudnn torch_cp layer calibrated build)
planned() {  # planned seconds of stage $1: the sum of its steps' caps
  local total=0 k
  for k in "${!caps[@]}"; do [[ "${k%%:*}" == "$1" ]] && total=$(( total + caps[$k] )); done
  echo "${total}"
}

stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"; exit 2; }
for s in "${stages[@]}"; do
  if [[ " ${all_stages[*]} " != *" ${s} "* ]]; then
    echo "gpu_check.sh: unknown stage '${s}' (allowed: ${all_stages[*]})" >&2
    exit 2
  fi
  if (( $(planned "${s}") > 540 )); then  # a guard on the table above: no stage past 9 minutes
    echo "gpu_check.sh: stage ${s} plans $(planned "${s}") s, over 540" >&2
    exit 2
  fi
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
linebuf=()
command -v stdbuf >/dev/null && linebuf=(stdbuf -oL -eL)
say "# gpu_check $(date -u +%FT%TZ): stages ${stages[*]}, budget ${budget} s"
plan_line="planned seconds per stage:"
for s in "${stages[@]}"; do plan_line+=" ${s} $(planned "${s}")"; done
say "${plan_line}"
gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1) x ${gpu_count}"
nvidia-smi >"${work}/nvidia-smi.txt" 2>&1 || true

# The versions every number is measured with: the libraries the binaries resolve (ldd of
# libwlb_cuda.so through LD_LIBRARY_PATH above), asked for their versions through their own
# entry points, and PyTorch's (the baselines).
versions() {
  local lib="${dev}/lib/libwlb_cuda.so" resolved
  resolved=$(ldd "${lib}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1 "=" $3}')
  python3 - ${resolved} <<'PY' 2>&1
import ctypes, sys
paths = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    paths[name.split(".so")[0]] = path

def call(name, fn):
    if name not in paths:
        return f"{name}: not linked"
    try:
        return f"{name} {fn(ctypes.CDLL(paths[name]))} ({paths[name]})"
    except (OSError, AttributeError) as e:
        return f"{name}: unavailable ({e})"

def size_t(symbol):
    def f(lib):
        fn = getattr(lib, symbol)
        fn.restype = ctypes.c_size_t
        return fn()
    return f

def int_out(symbol):
    def f(lib):
        v = ctypes.c_int()
        rc = getattr(lib, symbol)(ctypes.byref(v))
        return v.value if rc == 0 else f"error {rc}"
    return f

def nvrtc(lib):
    major, minor = ctypes.c_int(), ctypes.c_int()
    rc = lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}" if rc == 0 else f"error {rc}"

print("; ".join([call("libcudart", int_out("cudaRuntimeGetVersion")),
                 call("libcudnn", size_t("cudnnGetVersion")),
                 call("libnccl", int_out("ncclGetVersion")),
                 call("libnvrtc", nvrtc),
                 call("libcublasLt", size_t("cublasLtGetVersion"))]))
try:
    import torch
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else "n/a"
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, NCCL {nccl})")
except Exception as e:  # the baselines need it; the binaries do not
    print(f"PyTorch: unavailable ({e})")
PY
  echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | tail -1); ncu: $(ncu --version 2>/dev/null | tail -1)"
}

# run STAGE NAME CMD...: runs CMD line-buffered with a timeout of min(its cap in `caps`, what is
# left - 15 s), output to $work/STAGE/NAME.log and its exit status to NAME.log.rc (124 or 137:
# timed out; gtest_report.py reads both); returns the exit status.
run() {
  local stage=$1 name=$2
  shift 2
  local cap=${caps[${stage}:${name}]:-}
  [[ -n "${cap}" ]] || { echo "gpu_check.sh: no cap for ${stage}:${name}" >&2; return 2; }
  local log="${work}/${stage}/${name}.log"
  local t=$(( $(left) - 15 ))
  (( t > cap )) && t=${cap}
  if (( t < 10 )); then
    echo "NOT RUN (out of time)" >"${log}"
    table+=("| ${stage} | ${name} | NOT RUN (out of time) | 0 |")
    return 125
  fi
  local t0
  t0=$(date +%s)
  timeout -k 5 "${t}" "${linebuf[@]}" "$@" >"${log}" 2>&1
  local rc=$?
  echo "${rc}" >"${log}.rc"
  local verdict="rc ${rc}"
  (( rc == 0 )) && verdict="ok"
  (( rc == 124 || rc == 137 )) && verdict="TIMEOUT after ${t} s"
  table+=("| ${stage} | ${name} | ${verdict} | $(( $(date +%s) - t0 )) |")
  return ${rc}
}

# report STAGE SPEC...: gtest_report.py over SPECs into STAGE/report.md and the summary; the
# stage's verdict row; returns its status.
report() {
  local stage=$1
  shift
  local allow=() a
  for a in "${allowed_skips[@]}"; do allow+=(--allow-skip "${a}"); done
  python3 "${repo}/backends/cuda/scripts/gtest_report.py" "${allow[@]}" "$@" \
    >"${work}/${stage}/report.md"
  local rc=$?
  grep -v '| OK |' "${work}/${stage}/report.md" >>"${summary}"
  echo "$(tail -1 "${work}/${stage}/report.md")"
  table+=("| ${stage} | verdicts (logs and exit codes) | $(tail -1 "${work}/${stage}/report.md") | |")
  return ${rc}
}

# The cuDNN graph builds each program reported ("cudnn graphs built: N in S s").
graph_builds() {
  local f
  for f in "$@"; do
    [[ -f "${f}" ]] && grep -H "cudnn graphs built" "${f}" | sed "s|${work}/||" >>"${summary}"
  done
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
  say "binaries: ${dev}/bin ($(grep -m1 '^commit' "${dev}/MANIFEST" 2>/dev/null))"
  if grep -q '^commit .*uncommitted changes' "${dev}/MANIFEST" 2>/dev/null; then
    say "PROVISIONAL: these binaries were built from uncommitted changes; do not commit this call's numbers as results"
  fi
  binaries_checked=1
}

stage_build() {
  [[ -d "${repo}/.deps/root/usr" ]] || { say "build: no .deps (run prepare_device_deps.sh here and carry .deps)"; return 1; }
  local built=/tmp/wlb-device
  local deps_lib="${repo}/.deps/root/usr/lib/x86_64-linux-gnu"
  # GCC 13 and newer need <cstdint> included for Debian's Abseil 20220623.
  LD_LIBRARY_PATH="${deps_lib}:${LD_LIBRARY_PATH}" run build prebuild \
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
  local specs=() t
  for t in attention_gpu_test cp_gpu_test layer_gpu_test; do
    "${dev}/bin/wlb_cuda_${t}" --gtest_list_tests >"${work}/tests/${t}.list" 2>&1
    run tests "${t}" "${dev}/bin/wlb_cuda_${t}"
    specs+=("gpu=${work}/tests/${t}.log=${work}/tests/${t}.list")
  done
  graph_builds "${work}"/tests/*.log
  report tests "${specs[@]}"
}

# sanitize NAME TOOL BINARY FILTER [ENV=VALUE]: one compute-sanitizer pass over a test filter;
# the list of what the filter selects goes beside the log, so a filter matching nothing fails.
# Appends the pass's report spec to the caller's `specs`.
sanitize() {
  local name=$1 tool=$2 bin=$3 filter=$4 env=()
  [[ $# -ge 5 ]] && env=("$5")
  "${dev}/bin/${bin}" --gtest_list_tests --gtest_filter="${filter}" >"${work}/sanitizer/${name}.list" 2>&1
  run sanitizer "${name}" env "${env[@]}" compute-sanitizer --tool "${tool}" --error-exitcode 9 \
    --print-limit 20 "${dev}/bin/${bin}" --gtest_filter="${filter}"
  specs+=("sanitizer=${work}/sanitizer/${name}.log=${work}/sanitizer/${name}.list")
}

stage_sanitizer() {
  check_binaries || return 1
  command -v compute-sanitizer >/dev/null || { say "sanitizer: compute-sanitizer not found"; return 1; }
  local specs=()
  local small='AttentionGpu.SmallShapes*:AttentionGpu.RandomSegments*:AttentionGpu.BadTensors*'
  sanitize memcheck memcheck wlb_cuda_attention_gpu_test "${small}" WLB_TEST_KERNELS=flash,reference
  sanitize memcheck_collectives memcheck wlb_cuda_cp_gpu_test '*LocalCollectives*'
  # racecheck on wlb's own kernels only: cuDNN's kernels are not ours (racecheck reports hazards
  # in their asynchronous-copy pipelines, 37 on 2026-11-25).
  sanitize racecheck_own racecheck wlb_cuda_attention_gpu_test \
    'AttentionGpu.SmallShapes*:AttentionGpu.RandomSegments*' WLB_TEST_KERNELS=flash,reference
  # One memcheck pass over the cudnn engine: wrong ragged offsets would show as bad accesses.
  sanitize memcheck_cudnn memcheck wlb_cuda_attention_gpu_test \
    'AttentionGpu.SmallShapes*:AttentionGpu.RandomSegments*' WLB_TEST_KERNELS=cudnn
  report sanitizer "${specs[@]}"
}

stage_bench() {
  check_binaries || return 1
  local b="${work}/bench" configs="${WLB_BENCH_CONFIGS:-512,2048,8192,16384,mix}" mix=() rc=0
  local kernels="${WLB_BENCH_KERNELS:-flash,cudnn}" torch_backends="${WLB_TORCH_BACKENDS:-flash,cudnn,efficient,varlen}"
  local flash_backward="${WLB_FLASH_BACKWARD:-q64,q64_pass32,q32,q64_w8}"
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && mix=(--mix="${dev}/data/doc_lengths_wlbllm_like.json")
  run bench wlb_attention_bench "${dev}/bin/wlb_cuda_attention_bench" --configs="${configs}" \
    --kernels="${kernels}" --block_orders=heaviest_first,head_major \
    --flash_backward="${flash_backward}" --json="${b}/wlb_bench.jsonl" \
    --dump_mix="${b}/mix_lengths.json" "${mix[@]}" || rc=1
  [[ -s "${b}/mix_lengths.json" ]] || { say "bench: no mix lengths written"; return 1; }
  run bench torch_attention_bench python3 "${repo}/backends/cuda/bench/torch_attention_bench.py" \
    --configs="${configs}" --mix-lengths "${b}/mix_lengths.json" \
    --backends "${torch_backends}" --json "${b}/torch_bench.jsonl" || rc=1
  graph_builds "${b}/wlb_attention_bench.log"
  python3 "${repo}/backends/cuda/scripts/bench_ratios.py" "${b}/wlb_bench.jsonl" \
    "${b}/torch_bench.jsonl" >"${b}/ratios.md" || rc=1
  cat "${b}/ratios.md" >>"${summary}"
  return ${rc}
}

stage_ncu() {
  check_binaries || return 1
  command -v ncu >/dev/null || { say "ncu: not found"; return 1; }
  local n="${work}/ncu" rc=0 f sections=(--section SpeedOfLight --section Occupancy --section LaunchStats)
  # One forward and one backward of 16K documents (8 x 16K tokens), both block orders, flash only,
  # the default backward and the 8-warp one that does not spill (docs/results/gpu/bwd_ptxas.md).
  run ncu ncu_16k ncu --clock-control none --kernel-name regex:Flash "${sections[@]}" \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section InstructionStats \
    "${dev}/bin/wlb_cuda_attention_bench" --configs=16384 --kernels=flash --flash_backward=q64,q64_w8 \
    --warmup=0 --iters=1 || rc=1
  grep -E "Flash|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|L2 Hit Rate|Local Memory Spilling Requests|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|highest-utilized" \
    "${n}/ncu_16k.log" | head -80 >>"${summary}"
  # The cudnn engine against PyTorch's cuDNN path on the same 16K shape: which cuDNN kernels each
  # runs and for how long (the engine's extra kernels: statistics layout, dK/dV zeroing).
  run ncu ncu_cudnn_wlb ncu --clock-control none --kernel-name 'regex:sdpa|Lse|Stats' \
    "${sections[@]}" "${dev}/bin/wlb_cuda_attention_bench" --configs=16384 --kernels=cudnn \
    --warmup=0 --iters=1 || rc=1
  run ncu ncu_cudnn_torch ncu --clock-control none --kernel-name regex:sdpa "${sections[@]}" \
    python3 "${repo}/backends/cuda/bench/torch_attention_bench.py" --configs=16384 \
    --backends cudnn --warmup 0 --iters 1 --no-check || rc=1
  for f in ncu_cudnn_wlb ncu_cudnn_torch; do
    say "${f}:"
    grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Block Size|Grid Size|Achieved Occupancy|Compute \(SM\) Throughput" \
      "${n}/${f}.log" | head -40 >>"${summary}"
  done
  return ${rc}
}

# Profile tables: the grid (q_len 16..8K, kv_len q..128K: 91 points) keeps the cudnn profiler's
# graph builds (one forward and one backward graph per shape class, about 0.4 s each) inside
# its cap.
stage_profile() {
  check_binaries || return 1
  local p="${work}/profile" rc=0 k
  for k in flash cudnn; do
    run profile "kernel_profiler_${k}" "${dev}/bin/wlb_cuda_kernel_profiler" --kernel="${k}" \
      --out="${p}/kernel_profile_${k}.csv" --max_kv=131072 --max_q=8192 || rc=1
    tail -2 "${p}/kernel_profiler_${k}.log" | tee -a "${summary}"
    [[ -s "${p}/kernel_profile_${k}.csv" ]] && cp "${p}/kernel_profile_${k}.csv" "${out}/"
  done
  return ${rc}
}

# The device's name as docs/results spells it (h100, h200).
device_slug() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
    sed -E 's/NVIDIA //; s/ .*//' | tr 'A-Z' 'a-z'
}

# The profile table the cp stages use: this call's (profile stage), else the committed one of
# this device (docs/results/gpu/<device>_kernel_profile_<kernel>.csv), else none (analytic model).
profile_for() {
  local kernel=$1 slug f
  slug=$(device_slug)
  for f in "${out}/kernel_profile_${kernel}.csv" \
           "${repo}/docs/results/gpu/${slug}_kernel_profile_${kernel}.csv"; do
    [[ -s "${f}" ]] && { echo "${f}"; return; }
  done
}

# cp_stage STAGE KERNEL: CP benchmark at each of cp_sizes (cp_mbs micro-batches each), the example.
cp_stage() {
  local stage=$1 kernel=$2 c="${work}/$1" rc=0 lengths=() profile=() n
  local passes=(--warmup="${cp_warmup}" --iters="${cp_iters}")
  check_binaries || return 1
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && lengths=(--lengths="${dev}/data/doc_lengths_wlbllm_like.json")
  local table_path
  table_path=$(profile_for "${kernel}")
  [[ -n "${table_path}" ]] && profile=(--profile="${table_path}")
  say "${stage}: kernel model from ${table_path:-the analytic default}; C = ${cp_sizes[*]}, ${cp_mbs} micro-batches, ${passes[*]}"
  for n in "${cp_sizes[@]}"; do
    [[ -n "${caps[${stage}:cp_bench_c${n}]:-}" ]] || { say "${stage}: no cap for C = ${n}"; rc=1; continue; }
    # --gather_gbps: adaptive with the key rows' copy priced at an H100's HBM3 peak, measured
    # beside unpriced adaptive on the same micro-batches (issue 57's default; the last line gives
    # the rate the copies ran at).
    run "${stage}" "cp_bench_c${n}" "${dev}/bin/wlb_cuda_cp_bench" --kernel="${kernel}" --cp=${n} \
      --micro_batches="${cp_mbs}" "${passes[@]}" "${profile[@]}" --gather_gbps=3350 \
      --json="${c}/cp_bench_c${n}.jsonl" || rc=1
    tail -12 "${c}/cp_bench_c${n}.log" >>"${summary}"
  done
  # The paths awaiting their first GPU run on the same plans at C = 4, against the default rows
  # above (whole schedule, all-gather, K and V one collective each: what ran): the split schedule,
  # the exchange the planner's rule picks (row-exact where it moves fewer rows), K and V in one
  # collective.
  run "${stage}" cp_bench_split_c4 "${dev}/bin/wlb_cuda_cp_bench" --kernel="${kernel}" --cp=4 \
    --schedule=split --exchange=rule --kv_one_collective=1 --micro_batches="${cp_mbs}" \
    "${passes[@]}" "${profile[@]}" --json="${c}/cp_bench_split_c4.jsonl" || rc=1
  tail -11 "${c}/cp_bench_split_c4.log" >>"${summary}"
  if [[ ${kernel} == flash ]]; then
    # The analytic model's error on the same kind of micro-batch (its plans may differ).
    run "${stage}" cp_bench_analytic_c4 "${dev}/bin/wlb_cuda_cp_bench" --cp=4 --micro_batches=1 \
      "${passes[@]}" --json="${c}/cp_bench_analytic_c4.jsonl" || rc=1
    tail -9 "${c}/cp_bench_analytic_c4.log" >>"${summary}"
  fi
  run "${stage}" cp_end_to_end "${dev}/bin/wlb_cuda_cp_end_to_end" --kernel="${kernel}" \
    "${lengths[@]}" || rc=1
  tail -3 "${c}/cp_end_to_end.log" >>"${summary}"
  graph_builds "${c}"/*.log
  return ${rc}
}
stage_cp() { cp_stage cp flash; }
stage_cp_cudnn() { cp_stage cp_cudnn cudnn; }

# wlb.torch's CP attention on this GPU (torch_cp_bench.py): cp_attention over NCCL (one rank: NCCL
# takes one rank per GPU) and every strategy's ranks emulated, each checked against the math
# backend; then per-rank times on cp_bench's micro-batches and plans (the flash kernel model, as
# the cp stage), paired with the cp stages' rows when they ran earlier in this call, else with
# this device's committed rows (docs/results/gpu/<device>_cp_bench_<kernel>.jsonl).
stage_torch_cp() {
  local t="${work}/torch_cp" table_path profile=() compare=()
  [[ -f "${dev}/python/wlb/__init__.py" ]] || {
    say "torch_cp: no ${dev}/python (prebuild.sh builds it when a Python 3.12 is found)"; return 1; }
  table_path=$(profile_for flash)
  [[ -n "${table_path}" ]] && profile=(--profile "${table_path}")
  compare=( $(ls "${work}"/cp/cp_bench_c*.jsonl "${work}"/cp_cudnn/cp_bench_c*.jsonl 2>/dev/null) )
  if [[ ${#compare[@]} -eq 0 ]]; then
    # No cp stage in this call: this device's committed rows (another call, same device class).
    compare=( $(ls "${repo}/docs/results/gpu/$(device_slug)"_cp_bench_{flash,cudnn}.jsonl 2>/dev/null) )
  fi
  say "torch_cp: kernel model from ${table_path:-the analytic default}; pairing with ${#compare[@]} cp_bench files: ${compare[*]##*/}"
  run torch_cp torch_cp_bench env PYTHONPATH="${dev}/python" python3 \
    "${repo}/backends/cuda/bench/torch_cp_bench.py" --cp "$(IFS=,; echo "${cp_sizes[*]}")" \
    --micro-batches "${torch_cp_mbs}" --warmup "${cp_warmup}" --iters "${cp_iters}" \
    "${profile[@]}" --json "${t}/torch_cp.jsonl" ${compare[@]+--compare "${compare[@]}"}
  local rc=$?
  grep -E "^check |^C=[0-9]+: |^  [a-z-]+ +[0-9.]+ ms|^\||not paired" "${t}/torch_cp_bench.log" >>"${summary}"
  return ${rc}
}

stage_layer() {
  check_binaries || return 1
  local l="${work}/layer" rc=0 docs=() kernel="${WLB_LAYER_KERNEL:-flash}"
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && docs=(--docs="${dev}/data/doc_lengths_wlbllm_like.json")
  if [[ "${layer_memcheck}" == 0 ]]; then
    say "layer memcheck: skipped (WLB_LAYER_MEMCHECK=0)"
  elif command -v compute-sanitizer >/dev/null; then
    local filter='*RandomMicroBatches/flash:*RejectsRunOrder*'
    "${dev}/bin/wlb_cuda_layer_gpu_test" --gtest_list_tests --gtest_filter="${filter}" >"${l}/memcheck.list" 2>&1
    run layer memcheck compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
      "${dev}/bin/wlb_cuda_layer_gpu_test" --gtest_filter="${filter}"
    report layer "sanitizer=${l}/memcheck.log=${l}/memcheck.list" || rc=1
  else
    say "layer memcheck: NOT RUN (compute-sanitizer not found)"
    rc=1
  fi
  run layer bench_7b_128k "${dev}/bin/wlb_cuda_layer_bench" --out="${l}/7b-128k" \
    --kernel="${kernel}" --steps="${layer_steps}" --cp_steps="${layer_cp_steps}" "${docs[@]}" || rc=1
  cat "${l}/7b-128k/summary.md" >>"${summary}" 2>/dev/null
  # wlb-550m has head_dim 96: the cudnn engine (or the reference one when asked) runs it.
  local kernel96=cudnn
  [[ "${kernel}" == reference ]] && kernel96=reference
  run layer bench_550m_64k "${dev}/bin/wlb_cuda_layer_bench" --out="${l}/550m-64k" \
    --preset=wlb-550m --tp=2 --context=65536 --pp=4 --dp=2 --kernel="${kernel96}" \
    --steps="${layer_steps}" --cp_steps="${layer_cp_steps}" "${docs[@]}" \
    --cp=2 || rc=1
  cat "${l}/550m-64k/summary.md" >>"${summary}" 2>/dev/null
  graph_builds "${l}"/*.log
  return ${rc}
}

# Table 2 planned with the FLOP preset and with the shipped calibration of the engine, repeated.
# calibrated_model NAME TITLE CALIBRATION STEPS LAYER_BENCH_FLAG...: the repeats of one model
# (step calibrated:bench_NAME_rR), then their mean and spread against the calibration.
calibrated_model() {
  local name="$1" title="$2" cal="$3" steps="$4" l="${work}/calibrated" rc=0 r p runs=()
  local packers=original
  shift 4
  for p in wlb wlb-refine wlb-lookahead; do packers+=",${p}"; done
  for p in wlb wlb-refine wlb-lookahead; do packers+=",${p}@${cal}"; done
  for r in $(seq 1 "${calibrated_repeats}"); do
    run calibrated "bench_${name}_r${r}" "${dev}/bin/wlb_cuda_layer_bench" \
      --out="${l}/${name}-r${r}" --steps="${steps}" --sweep=0 --cp_steps=0 \
      --packers="${packers}" "$@" || rc=1
    [[ -f "${l}/${name}-r${r}/summary.md" ]] && runs+=("${l}/${name}-r${r}")
  done
  if (( ${#runs[@]} > 0 )); then
    say ""
    say "### ${title} vs calibration ${cal}"
    python3 "${repo}/backends/cuda/scripts/table2_repeats.py" "${runs[@]}" \
      --pair "wlb=wlb-lookahead@${cal}" --pair "wlb=wlb@${cal}" \
      --pair "wlb-lookahead=wlb-lookahead@${cal}" 2>&1 | tee -a "${summary}" || rc=1
  fi
  return ${rc}
}

stage_calibrated() {
  check_binaries || return 1
  local rc=0 docs=()
  [[ -f "${dev}/data/doc_lengths_wlbllm_like.json" ]] && docs=(--docs="${dev}/data/doc_lengths_wlbllm_like.json")
  calibrated_model 7b_128k "7B-128K, flash: FLOP preset llama2-7b" h100-flash-llama2-7b-tp8 \
    "${calibrated_steps_7b}" --kernel=flash "${docs[@]}" || rc=1
  calibrated_model 550m_64k "550M-64K, cudnn: FLOP preset wlb-550m" h100-cudnn-wlb-550m-tp2 \
    "${calibrated_steps_550m}" --kernel=cudnn --preset=wlb-550m --tp=2 --context=65536 --pp=4 \
    --dp=2 "${docs[@]}" || rc=1
  graph_builds "${work}/calibrated"/*.log
  return ${rc}
}

say ""
say "## versions"
versions | tee -a "${summary}"

for s in "${stages[@]}"; do
  mkdir -p "${work}/${s}"
  t0=$(date +%s)
  say ""
  say "## ${s} (started at +$(( t0 - start )) s, $(left) s left, $(planned "${s}") s planned)"
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
