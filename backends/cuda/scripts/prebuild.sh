#!/usr/bin/env bash
# Builds wlb::cuda's test, benchmark, profiler and example binaries (Release, sm_90) and collects
# them with the shared libraries they need into one folder that a GPU machine can run without a
# build (gpu_check.sh reads it there). Run it on the dev machine, then send the folder with the
# device call (`carry: [".device"]`; .gitignore ignores it).
#
#   backends/cuda/scripts/prebuild.sh [--build DIR] [--out DIR] [--allow-dirty] [-- extra cmake args]
#
# Results must name a clean commit: the script refuses a tree whose tracked files differ from
# HEAD unless --allow-dirty (a try-out build; its MANIFEST and every gpu_check.sh summary then say
# the numbers are provisional and must not be committed as results).
#
# Defaults: --build <repo>/build-device, --out <repo>/.device. The folder holds
#   bin/      the binaries, stripped (run directly: ctest's absolute paths do not travel)
#   lib/      every shared library they load that the GPU machine lacks: libwlb_cuda.so (built
#             shared here, so the kernels and the cuDNN frontend are carried once, not once per
#             binary), libcudart.so.13 (the toolkit's, which the shared build uses) and Abseil's
#             .so's; not
#             libc/libstdc++/libgcc_s/libm (the machine's own), libcuda (the driver),
#             libnccl.so.2, libcudnn.so.9, libnvrtc.so.13 (the machine's pip nvidia-nccl-cu13,
#             nvidia-cudnn-cu13 and CUDA 13 runtime wheels of PyTorch) and libcublasLt/libcublas
#             (the layer runner's GEMMs; the machine's CUDA toolkit or pip wheel); gpu_check.sh puts
#             them on LD_LIBRARY_PATH. The cuDNN frontend is header-only: compiled into
#             libwlb_cuda.so, nothing else of it is carried.
#   python/   the wlb Python package (python/wlb) with its extension built for the GPU machine's
#             Python (3.12: WLB_DEVICE_PYTHON, else pyenv's python3.12), so gpu_check.sh can run
#             wlb.torch's CP attention there (PYTHONPATH); left out with a message when no such
#             interpreter is found here
#   data/     doc_lengths_wlbllm_like.json when ../shared/data has it (public data that must not
#             enter the repository; the attention benchmark's WLB-LLM-like mix)
#   ptxas.txt registers, shared memory and spills of the kernels that the last build compiling
#             any kernel compiled (all of them after a clean --build folder); ptxas.md, the same
#             as kernel_resources.py's table
#   MANIFEST  commit, date, compilers, per-binary NEEDED libraries and newest GLIBC and GLIBCXX
#             symbol versions (the machine's libc and libstdc++ must be at least those)
# The script fails if a binary needs a library that is neither collected nor on the allow-list
# above, or if the folder exceeds 48 MiB (the device call carries at most 64 MiB in all).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
build="${repo}/build-device"
out="${repo}/.device"
extra=()
allow_dirty=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --allow-dirty) allow_dirty=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "prebuild.sh: unknown argument '$1' (allowed: --build DIR, --out DIR, --allow-dirty, -- cmake args)" >&2
       exit 2 ;;
  esac
done
if ! git -C "${repo}" diff --quiet HEAD; then
  if (( ! allow_dirty )); then
    echo "prebuild.sh: tracked files differ from HEAD ($(git -C "${repo}" diff --name-only HEAD | wc -l) files):" \
         "commit first, so results name a clean commit, or pass --allow-dirty for a try-out build" >&2
    exit 2
  fi
  echo "prebuild.sh: --allow-dirty: building uncommitted changes; results are provisional" >&2
fi

tests=(wlb_cuda_attention_problem_test wlb_cuda_attention_plan_test wlb_cuda_cpu_reference_test
       wlb_cuda_tensor_validation_test wlb_cuda_cudnn_layout_test wlb_cuda_cp_maps_test
       wlb_cuda_communicator_test
       wlb_cuda_attention_gpu_test wlb_cuda_cp_gpu_test wlb_cuda_layer_reference_test
       wlb_cuda_layer_runner_host_test wlb_cuda_layer_analysis_test wlb_cuda_layer_gpu_test)
benches=(wlb_cuda_attention_bench wlb_cuda_kernel_profiler wlb_cuda_cp_bench wlb_cuda_layer_bench)
examples=(wlb_cuda_cp_end_to_end)

mkdir -p "${build}"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "${repo}" -B "${build}" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DWLB_BUILD_TESTS=OFF -DWLB_BUILD_BENCH=OFF -DWLB_BUILD_EXAMPLES=OFF -DWLB_BUILD_TOOLS=OFF \
  -DWLB_BUILD_CUDA=ON -DWLB_CUDA_SHARED=ON -DWLB_CUDA_BUILD_TESTS=ON -DWLB_CUDA_BUILD_BENCH=ON \
  -DWLB_CUDA_BUILD_EXAMPLES=ON -DWLB_CUDA_ARCHITECTURES=90 -DWLB_CUDA_PTXAS_VERBOSE=ON \
  "${extra[@]}" >"${build}/configure.log" 2>&1 \
  || { tail -30 "${build}/configure.log"; echo "prebuild.sh: configure failed" >&2; exit 1; }
grep -E "NCCL|cuDNN|CUDA compiler" "${build}/configure.log" || true
if ! grep -q "building the cudnn attention engine" "${build}/configure.log"; then
  echo "prebuild.sh: the cudnn attention engine is not built (see ${build}/configure.log); run" \
       "scripts/install_deps.sh for the cuDNN frontend headers" >&2
  exit 1
fi
if ! cmake --build "${build}" --parallel "$(nproc)" --target "${tests[@]}" "${benches[@]}" \
    "${examples[@]}" >"${build}/build.log" 2>&1; then
  tail -40 "${build}/build.log"
  echo "prebuild.sh: build failed (see ${build}/build.log)" >&2
  exit 1
fi
# ptxas reports a kernel only when its file compiles: keep the last complete report.
if grep -q "Compiling entry function" "${build}/build.log"; then
  grep -E "Compiling entry function|Function properties for|Used [0-9]+ registers|spill stores" \
    "${build}/build.log" >"${build}/ptxas.txt" || true
fi

rm -rf "${out}"
mkdir -p "${out}/bin" "${out}/lib" "${out}/data"
for t in "${tests[@]}"; do cp "${build}/backends/cuda/test/${t}" "${out}/bin/"; done
for t in "${benches[@]}"; do cp "${build}/backends/cuda/bench/${t}" "${out}/bin/"; done
for t in "${examples[@]}"; do cp "${build}/backends/cuda/examples/${t}" "${out}/bin/"; done
if [[ -f "${build}/ptxas.txt" ]]; then
  cp "${build}/ptxas.txt" "${out}/ptxas.txt"
  python3 "${repo}/backends/cuda/scripts/kernel_resources.py" --log "${build}/ptxas.txt" \
    >"${out}/ptxas.md" || echo "prebuild.sh: no ptxas table (kernel_resources.py failed)" >&2
fi
# The static symbol tables are not needed to run (and the cudnn engine's frontend code made them
# large): stripping keeps the folder inside its budget. Dynamic symbols and the kernels' -lineinfo
# (in the fatbins) stay.
strip --strip-unneeded "${out}"/bin/*

# The Python package for the device's Python (3.12 there, 3.11 here): its own build tree and a
# venv with nanobind; only the extension target is built (type stubs are not needed to run), then
# the package's sources are copied beside it. Its libraries (Abseil) join lib/ through the same
# ldd closure check below.
device_python="${WLB_DEVICE_PYTHON:-}"
if [[ -z "${device_python}" ]] && command -v pyenv >/dev/null; then
  device_python=$(PYENV_VERSION="$(pyenv versions --bare | grep -E '^3\.12' | tail -1)" pyenv which python3.12 2>/dev/null || true)
fi
if [[ -n "${device_python}" && -x "${device_python}" ]]; then
  pybuild="${build}-python"
  mkdir -p "${pybuild}"
  [[ -x "${pybuild}/venv/bin/python" ]] || "${device_python}" -m venv "${pybuild}/venv"
  "${pybuild}/venv/bin/python" -m pip install -q "nanobind>=2.2,<4" >"${pybuild}/pip.log" 2>&1 \
    || { tail -5 "${pybuild}/pip.log"; echo "prebuild.sh: pip install nanobind failed" >&2; exit 1; }
  if ! { cmake -S "${repo}" -B "${pybuild}" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
           -DWLB_BUILD_TESTS=OFF -DWLB_BUILD_BENCH=OFF -DWLB_BUILD_EXAMPLES=OFF \
           -DWLB_BUILD_TOOLS=OFF -DWLB_BUILD_CUDA=OFF -DWLB_BUILD_SOLVER=OFF -DWLB_BUILD_PYTHON=ON \
           -DPython_EXECUTABLE="${pybuild}/venv/bin/python" &&
         cmake --build "${pybuild}" --parallel "$(nproc)" --target _wlb; } >"${pybuild}/build.log" 2>&1; then
    tail -30 "${pybuild}/build.log"
    echo "prebuild.sh: the Python extension for ${device_python} failed to build" >&2
    exit 1
  fi
  mkdir -p "${out}/python"
  cp -r "${repo}/python/wlb" "${out}/python/"
  find "${out}/python" -name __pycache__ -prune -exec rm -rf {} +
  cp "${pybuild}"/python/_wlb*.so "${out}/python/wlb/"
  strip --strip-unneeded "${out}"/python/wlb/_wlb*.so
  python_note="python: wlb package with _wlb for $("${device_python}" --version 2>&1)"
else
  echo "prebuild.sh: no Python 3.12 here (set WLB_DEVICE_PYTHON): .device/python left out" >&2
fi

# Libraries the GPU machine has (its system, its driver, its pip NCCL): everything else is copied.
provided='^(linux-vdso|libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libcuda|libnccl|libcudnn|libnvrtc|libcublasLt|libcublas)\.so'
{
  echo "# wlb::cuda prebuilt binaries, made by backends/cuda/scripts/prebuild.sh"
  echo "commit $(git -C "${repo}" rev-parse HEAD)$(git -C "${repo}" diff --quiet HEAD || echo " (with uncommitted changes, diff sha256 $(git -C "${repo}" diff HEAD | sha256sum | cut -c1-16): provisional, not for committed results)")"
  echo "date $(date -u +%FT%TZ) on $(hostname)"
  echo "compilers: $(c++ --version | head -1); $(nvcc --version | tail -1)"
  echo "CUDA architectures 90 (sm_90), Release; wlb::cuda and cudart shared (carried in lib/); binaries and libwlb_cuda stripped (--strip-unneeded)"
  echo "${python_note:-python: not built (no Python 3.12 here)}"
} >"${out}/MANIFEST"
missing=0
for bin in "${out}"/bin/* "${out}"/python/wlb/_wlb*.so; do
  [[ -e "${bin}" ]] || continue
  needed=$(objdump -p "${bin}" | awk '/NEEDED/ {print $2}')
  glibc=$(objdump -T "${bin}" | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)
  glibcxx=$(objdump -T "${bin}" | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -1)
  echo "$(basename "${bin}"): ${glibc}, ${glibcxx}; needs $(echo ${needed})" >>"${out}/MANIFEST"
  # Copy every non-provided library ldd resolves, transitively (ldd lists the whole closure).
  while read -r name arrow path _; do
    [[ "${arrow}" == "=>" ]] || continue
    if [[ "${name}" =~ ${provided} ]]; then continue; fi
    if [[ "${path}" == "not" ]]; then
      echo "prebuild.sh: $(basename "${bin}") needs ${name}, not found here" >&2
      missing=1
      continue
    fi
    [[ -e "${out}/lib/${name}" ]] || cp -L "${path}" "${out}/lib/${name}"
  done < <(ldd "${bin}")
done
[[ ${missing} -eq 0 ]] || exit 1
# The library holding the kernels and the cuDNN frontend: stripped like the binaries, and its own
# GLIBC/GLIBCXX needs recorded.
strip --strip-unneeded "${out}"/lib/libwlb_cuda.so*
for lib in "${out}"/lib/libwlb_cuda.so*; do
  echo "$(basename "${lib}"): $(objdump -T "${lib}" | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1), $(objdump -T "${lib}" | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -1)" >>"${out}/MANIFEST"
done

mix="${repo}/../shared/data/doc_lengths_wlbllm_like.json"
if [[ -f "${mix}" ]]; then cp "${mix}" "${out}/data/"; fi

# Every binary must resolve all its libraries from the folder plus the provided ones.
for bin in "${out}"/bin/* "${out}"/python/wlb/_wlb*.so; do
  [[ -e "${bin}" ]] || continue
  if LD_LIBRARY_PATH="${out}/lib" ldd "${bin}" | grep -q "not found"; then
    echo "prebuild.sh: $(basename "${bin}") has unresolved libraries" >&2
    exit 1
  fi
done
size_kib=$(du -sk "${out}" | cut -f1)
echo "libraries: $(ls "${out}/lib" | wc -l) ($(du -sh "${out}/lib" | cut -f1)); binaries: $(du -sh "${out}/bin" | cut -f1)" \
  >>"${out}/MANIFEST"
echo "total ${size_kib} KiB" >>"${out}/MANIFEST"
cat "${out}/MANIFEST"
if [[ ${size_kib} -gt $((48 * 1024)) ]]; then
  echo "prebuild.sh: ${out} is ${size_kib} KiB, over the 48 MiB budget" >&2
  exit 1
fi
