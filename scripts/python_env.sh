#!/usr/bin/env bash
# Makes the Python environment the tests run in: build/pyenv (a venv) with wlb installed from this
# tree, and the test dependencies of python/requirements-test.txt (PyTorch, pyarrow, hypothesis,
# ...). Those are large (PyTorch from PyPI brings its CUDA libraries, about 5 GB), so they are
# installed once per machine into a cache folder named by the file's hash
# (${WLB_PYDEPS_CACHE:-~/.cache/wlb}/pydeps-HASH) and the venv sees them through a .pth file;
# a new build tree or a fresh clone reuses them, a changed requirements file installs anew.
# Usage: scripts/python_env.sh [BUILD_DIR] [--deps-only | --reuse-build]   (default build)
#   (neither)      pip install . builds the extension alone in build/<wheel_tag> (scikit-build-core)
#   --deps-only    the venv and the test dependencies only: what a CMake tree configured with
#                  -DWLB_BUILD_PYTHON=ON -DPython_EXECUTABLE=BUILD_DIR/pyenv/bin/python needs
#   --reuse-build  pip install . over BUILD_DIR itself, a tree configured that way whose _wlb and
#                  _wlb_stub targets are built: scikit-build-core finds them up to date and only
#                  installs them (a real wheel: metadata, python/wlb, stubs); it is an error if
#                  the extension was compiled again (scripts/test.sh uses this)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build}"
mode="${2:-}"
case "${mode}" in
  ""|--deps-only|--reuse-build) ;;
  *) echo "python_env: unknown option '${mode}' (--deps-only or --reuse-build)" >&2; exit 2 ;;
esac
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
if [ "${mode}" = --deps-only ]; then
  exit 0
fi
if [ "${mode}" = --reuse-build ]; then
  extension=( "${build_dir}"/python/_wlb*.so )
  if [ ! -f "${extension[0]}" ] || [ ! -f "${build_dir}/python/_wlb.pyi" ]; then
    echo "python_env: ${build_dir} has no built extension (configure it with -DWLB_BUILD_PYTHON=ON" \
         "-DPython_EXECUTABLE=${build_dir}/pyenv/bin/python and build _wlb _wlb_stub)" >&2
    exit 1
  fi
  before="$(stat -c %Y "${extension[0]}")"
  "${build_dir}/pyenv/bin/python" -m pip install "${pip_flags[@]}" --no-build-isolation \
    -Cbuild-dir="${build_dir}" .
  if [ "$(stat -c %Y "${extension[0]}")" != "${before}" ]; then
    echo "python_env: pip compiled the extension in ${build_dir} again; expected to reuse it" >&2
    exit 1
  fi
else
  "${build_dir}/pyenv/bin/python" -m pip install "${pip_flags[@]}" --no-build-isolation .
fi
"${build_dir}/pyenv/bin/python" - <<'PY'
import importlib
# The integrations the tests need: a missing one fails here instead of skipping its tests.
for name in ("numpy", "pytest", "xdist", "torch", "pyarrow", "hypothesis", "transformers",
             "accelerate", "wlb"):
    module = importlib.import_module(name)
    print(f"python_env: {name} {getattr(module, '__version__', '?')}")
PY
