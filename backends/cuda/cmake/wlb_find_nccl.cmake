# NCCL, searched in order: $NCCL_HOME, next to the CUDA toolkit (nccl.h beside cuda_runtime.h, as
# on the dev machine), the system paths, then the pip package nvidia-nccl-cu13 of python3 (what
# a machine with PyTorch has: site-packages/nvidia/nccl/{include,lib}, with libnccl.so.2 and no
# unversioned libnccl.so). Without it the backend builds without NcclCommunicator
# (WLB_CUDA_HAVE_NCCL=0); LocalCommunicator always exists.
set(_wlb_nccl_pip "")
find_program(WLB_PYTHON3 python3)
if(WLB_PYTHON3)
  execute_process(
    COMMAND ${WLB_PYTHON3} -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
    OUTPUT_VARIABLE _wlb_nccl_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(WLB_NCCL_INCLUDE_DIR nccl.h
  HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
  PATHS ${_wlb_nccl_pip}/include)
find_library(WLB_NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
        /usr/local/cuda/lib /usr/local/cuda/lib64
  PATHS ${_wlb_nccl_pip}/lib)
