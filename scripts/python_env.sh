#!/usr/bin/env bash
# Makes the Python environment the tests run in: build/pyenv (a venv) with wlb installed from this
# tree, and the test dependencies of python/requirements-test.txt (PyTorch, pyarrow, hypothesis,
# ...). Those are large (PyTorch from PyPI brings its CUDA libraries, about 5 GB), so they are
# installed once per machine into a cache folder named by the file's hash
# (${WLB_PYDEPS_CACHE:-~/.cache/wlb}/pydeps-HASH) and the venv sees them through a .pth file;
# a new build tree or a fresh clone reuses them, a changed requirements file installs anew.
# Usage: scripts/python_env.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
requirements=python/requirements-test.txt
cache_root="${WLB_PYDEPS_CACHE:-${HOME}/.cache/wlb}"
deps_dir="${cache_root}/pydeps-$(sha256sum "${requirements}" | cut -c1-16)"
pip_flags=(--quiet --disable-pip-version-check)

if [ ! -f "${deps_dir}/.complete" ]; then
  echo "python_env: installing ${requirements} into ${deps_dir} (once per machine)" >&2
  rm -rf "${deps_dir}.partial"
  mkdir -p "${cache_root}"
  python3 -m pip install "${pip_flags[@]}" --target "${deps_dir}.partial" -r "${requirements}"
  rm -rf "${deps_dir}"
  mv "${deps_dir}.partial" "${deps_dir}"
  touch "${deps_dir}/.complete"
fi

python3 -m venv "${build_dir}/pyenv"
site="$("${build_dir}/pyenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "${deps_dir}" > "${site}/wlb-test-deps.pth"
"${build_dir}/pyenv/bin/python" -m pip install "${pip_flags[@]}" --no-build-isolation .
"${build_dir}/pyenv/bin/python" - <<'PY'
import importlib
for name in ("numpy", "pytest", "torch", "pyarrow", "hypothesis", "wlb"):
    module = importlib.import_module(name)
    print(f"python_env: {name} {getattr(module, '__version__', '?')}")
PY
