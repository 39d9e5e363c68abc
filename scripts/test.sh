#!/usr/bin/env bash
# Set-up + tests in one command: installs dependencies, builds everything (the CUDA backend too
# when nvcc is found), runs the whole ctest suite (GPU tests skip with a reason without a GPU),
# then installs the Python package into build/pyenv and runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)"
ctest --test-dir build --output-on-failure --parallel "$(nproc)"

# The Python package: `pip install .` from this tree into a virtual environment under build/, then
# pytest over the real extension (it also runs build/tools/wlb-plan and build/test/packer_state_tool).
python3 -m venv build/pyenv
build/pyenv/bin/pip install --quiet --disable-pip-version-check \
  "scikit-build-core>=0.10" "nanobind>=2.2" "numpy>=1.21" "pytest>=7"
build/pyenv/bin/pip install --quiet --disable-pip-version-check --no-build-isolation .
pytest_status=0
WLB_BUILD_DIR="$PWD/build" build/pyenv/bin/python -m pytest python/tests -q -rs || pytest_status=$?
if [ "$pytest_status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests from python/tests" >&2
fi
exit "$pytest_status"
