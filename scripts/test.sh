#!/usr/bin/env bash
# Set-up + tests in one command: installs dependencies, then builds the library in two trees.
# (1) The Python test environment build/pyenv (PyTorch and the other test dependencies, installed
# once per machine). (2) The g++ release tree build/ with everything (the CUDA backend too when
# nvcc is found) and the Python extension, built with the venv's Python; the whole ctest suite,
# then the tests that skipped and why (GPU tests without a GPU, data tests without
# ../shared/data). (3) pip install . into build/pyenv over that same tree, which installs the
# extension without compiling it again, and pytest over the installed package. (4) The planning
# library's tests (no CUDA, bench or solver) with clang++, AddressSanitizer and
# UndefinedBehaviorSanitizer, which also replays the fuzz corpora (fuzz/corpus): the second
# compiler and the sanitizers in one tree, since every build of the header-only library's tests
# is slow on two cores (docs/guides/testing.md); there every public header is compiled once, in
# one file, with the warnings of the release tree's header-by-header check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
jobs="$(nproc)"
# Each phase's start, in seconds since the script began: the per-phase split of a CI run
# (docs/guides/testing.md) reads off these lines.
phase() { echo "== [${SECONDS} s] $*" >&2; }
library_only=(-G Ninja -DWLB_BUILD_CUDA=OFF -DWLB_BUILD_BENCH=OFF -DWLB_BUILD_EXAMPLES=OFF
              -DWLB_BUILD_SOLVER=OFF)

phase "Python test environment (build/pyenv)"
# PyTorch, pyarrow, hypothesis and nanobind come from python/requirements-test.txt, installed once
# per machine (scripts/python_env.sh), so the torch and data-format tests run here instead of
# skipping; nanobind is what the release tree builds the extension with.
scripts/python_env.sh build --deps-only

phase "release build (g++) with the Python extension, every test"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DWLB_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$PWD/build/pyenv/bin/python" "$@"
cmake --build build --parallel "$jobs"
ctest --test-dir build --output-on-failure --parallel "$jobs"
scripts/skipped_tests.py build

phase "Python package (pip install . over build/, no second compile), pytest"
# pytest runs over the real installed package (it also runs build/tools/wlb-plan and
# build/test/packer_state_tool). The CUDA backend's GPU scripts (the device verdicts of
# gtest_report.py, torch_attention_bench.py's signature handling) are tested here too: they run
# on a GPU machine only once a session has one.
scripts/python_env.sh build --reuse-build
# One pytest worker per core (pytest-xdist): the tests take about 1.2 cores on their own, so on
# two cores this took pytest from 261 to 177 s of wall (docs/guides/testing.md). At most 8: each
# worker imports PyTorch and the CP tests spawn up to 8 processes each.
pytest_workers=$(( jobs < 8 ? jobs : 8 ))
pytest_status=0
WLB_BUILD_DIR="$PWD/build" build/pyenv/bin/python -m pytest -n "$pytest_workers" python/tests \
  backends/cuda/scripts/gtest_report_test.py backends/cuda/scripts/table2_repeats_test.py \
  backends/cuda/scripts/kernel_resources_test.py \
  backends/cuda/bench/test_torch_attention_bench.py \
  backends/cuda/bench/test_torch_cp_bench.py \
  -q -rs || pytest_status=$?
if [ "$pytest_status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests from python/tests" >&2
fi
if [ "$pytest_status" -ne 0 ]; then exit "$pytest_status"; fi

phase "clang++ with ASan + UBSan, planning library tests and fuzz corpora"
# Line tables are all ASan's and UBSan's reports need (file:line in every frame); full -g debug
# info made each unity batch of the tests 37% dearer to compile (docs/guides/testing.md). The
# release tree checked every header alone; here clang++'s warnings check them all in one file.
cmake -S . -B build-clang-asan "${library_only[@]}" -DWLB_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DCMAKE_CXX_COMPILER=clang++ \
  -DWLB_HEADER_CHECK_EACH=OFF
cmake --build build-clang-asan --parallel "$jobs"
# The slow property tests run a quarter of their seeded inputs here (WLB_PROPERTY_SCALE,
# test/test_util.hpp): all of them ran in the release build above.
WLB_PROPERTY_SCALE=0.25 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-clang-asan --output-on-failure --parallel "$jobs" -E consumer_find_package
phase "done"
