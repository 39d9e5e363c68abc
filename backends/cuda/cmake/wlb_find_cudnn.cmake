# cuDNN 9 and NVIDIA's header-only cuDNN frontend, for the `cudnn` attention engine.
#
# cuDNN (cudnn.h, libcudnn.so): $CUDNN_HOME, next to the CUDA toolkit (the dev machine's toolkit
# ships it), the system paths, then the pip package of python3 (nvidia-cudnn-cu1x, what a machine
# with PyTorch has: site-packages/nvidia/cudnn/{include,lib}, libcudnn.so.9 only).
# The frontend (cudnn_frontend.h): WLB_CUDNN_FRONTEND_INCLUDE_DIR if set, $CUDNN_FRONTEND_HOME,
# <repo>/.cudnn-frontend/include (where scripts/install_deps.sh pip-installs the PyPI package
# nvidia-cudnn-frontend), then python3's installed nvidia-cudnn-frontend.
# Sets WLB_CUDNN_INCLUDE_DIR, WLB_CUDNN_LIBRARY, WLB_CUDNN_FRONTEND_INCLUDE_DIR and
# WLB_CUDNN_VERSION ("" when cudnn_version.h is missing).
set(_wlb_cudnn_pip "")
set(_wlb_cudnn_frontend_pip "")
find_program(WLB_PYTHON3 python3)
if(WLB_PYTHON3)
  execute_process(
    COMMAND ${WLB_PYTHON3} -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])"
    OUTPUT_VARIABLE _wlb_cudnn_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # The frontend wheel installs its headers into <site-packages>/include.
  execute_process(
    COMMAND ${WLB_PYTHON3} -c
            "import cudnn, os; print(os.path.dirname(os.path.dirname(cudnn.__file__)))"
    OUTPUT_VARIABLE _wlb_cudnn_frontend_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(WLB_CUDNN_INCLUDE_DIR cudnn.h
  HINTS $ENV{CUDNN_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
  PATHS ${_wlb_cudnn_pip}/include)
find_library(WLB_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
  HINTS $ENV{CUDNN_HOME}/lib $ENV{CUDNN_HOME}/lib64 ${CUDAToolkit_LIBRARY_DIR}
        ${CUDAToolkit_LIBRARY_ROOT}/lib /usr/local/cuda/lib /usr/local/cuda/lib64
  PATHS ${_wlb_cudnn_pip}/lib)
find_path(WLB_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS $ENV{CUDNN_FRONTEND_HOME}/include ${PROJECT_SOURCE_DIR}/.cudnn-frontend/include
  PATHS ${_wlb_cudnn_frontend_pip}/include
  DOC "Folder holding cudnn_frontend.h (the PyPI package nvidia-cudnn-frontend's include/)")
set(WLB_CUDNN_VERSION "")
if(WLB_CUDNN_INCLUDE_DIR AND EXISTS ${WLB_CUDNN_INCLUDE_DIR}/cudnn_version.h)
  file(STRINGS ${WLB_CUDNN_INCLUDE_DIR}/cudnn_version.h _wlb_cudnn_version_lines
       REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${part} +([0-9]+)" _ "${_wlb_cudnn_version_lines}")
    set(_wlb_cudnn_${part} ${CMAKE_MATCH_1})
  endforeach()
  set(WLB_CUDNN_VERSION "${_wlb_cudnn_MAJOR}.${_wlb_cudnn_MINOR}.${_wlb_cudnn_PATCHLEVEL}")
endif()
