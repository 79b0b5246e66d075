# The CUDA backend and the device communicators (NCCL, staged MPI; their sources are in src/comm/
# and listed in MESHTRAIN_CUDA_COMM_SOURCES), built into the static library meshtrain_cuda when
# MESHTRAIN_CUDA resolves to enabled. Sets MESHTRAIN_HAVE_CUDA (ON/OFF) in the including scope.
#
#   MESHTRAIN_CUDA=AUTO (default)  build it when nvcc, cuDNN and NCCL are found, else CPU only
#   MESHTRAIN_CUDA=ON              build it or fail configuration, saying what is missing
#   MESHTRAIN_CUDA=OFF             CPU only
#
# CMAKE_CUDA_ARCHITECTURES defaults to "80;90" (Ampere and Hopper: sm_80 and sm_90 machine code
# plus PTX); override with -DCMAKE_CUDA_ARCHITECTURES=90 (or 90a, 100, ...).

set(MESHTRAIN_CUDA AUTO CACHE STRING "Build the CUDA backend and NCCL communicator (AUTO, ON, OFF)")
set_property(CACHE MESHTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${MESHTRAIN_CUDA}" _mt_cuda_mode)
set(MESHTRAIN_HAVE_CUDA OFF)

function(_meshtrain_cuda_missing what)
  if(_mt_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON but ${what}. Install it, point CMake at it "
                        "(CMAKE_CUDA_COMPILER, CUDAToolkit_ROOT, MESHTRAIN_CUDNN_ROOT, "
                        "MESHTRAIN_NCCL_ROOT), or configure with -DMESHTRAIN_CUDA=OFF.")
  endif()
  message(STATUS "meshtrain: CUDA backend disabled: ${what}")
endfunction()

if(NOT _mt_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MESHTRAIN_CUDA=${MESHTRAIN_CUDA} is not one of AUTO, ON, OFF")
endif()

if(NOT _mt_cuda_mode STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    _meshtrain_cuda_missing("no CUDA compiler (nvcc) was found")
  else()
    find_package(CUDAToolkit QUIET)
    set(_mt_cuda_hints ${MESHTRAIN_CUDNN_ROOT} ${MESHTRAIN_NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
                       ${CUDAToolkit_TARGET_DIR})
    find_path(MESHTRAIN_CUDNN_INCLUDE_DIR cudnn.h
              HINTS ${_mt_cuda_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(MESHTRAIN_CUDNN_LIBRARY cudnn
                 HINTS ${_mt_cuda_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
    find_path(MESHTRAIN_NCCL_INCLUDE_DIR nccl.h
              HINTS ${_mt_cuda_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(MESHTRAIN_NCCL_LIBRARY nccl
                 HINTS ${_mt_cuda_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
    if(NOT CUDAToolkit_FOUND)
      _meshtrain_cuda_missing("the CUDA toolkit libraries were not found")
    elseif(NOT MESHTRAIN_CUDNN_INCLUDE_DIR OR NOT MESHTRAIN_CUDNN_LIBRARY)
      _meshtrain_cuda_missing("cuDNN (cudnn.h, libcudnn.so) was not found")
    elseif(NOT MESHTRAIN_NCCL_INCLUDE_DIR OR NOT MESHTRAIN_NCCL_LIBRARY)
      _meshtrain_cuda_missing("NCCL (nccl.h, libnccl.so) was not found")
    else()
      set(MESHTRAIN_HAVE_CUDA ON)
    endif()
  endif()
endif()

if(NOT MESHTRAIN_HAVE_CUDA)
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures to compile for" FORCE)
endif()
enable_language(CUDA)
# The .cu files hold kernels and launchers only (C++17 suffices); CMake 3.25 does not know nvcc's
# C++20 flag, so host code that needs C++20 lives in the .cpp files.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
message(STATUS "meshtrain: CUDA backend enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${MESHTRAIN_CUDNN_LIBRARY}, "
               "NCCL ${MESHTRAIN_NCCL_LIBRARY})")

file(GLOB MESHTRAIN_CUDA_KERNELS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)
file(GLOB MESHTRAIN_CUDA_HOST CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cpp)
# The NCCL and staged-MPI communicators (src/comm/, listed in the top-level CMakeLists.txt).
list(APPEND MESHTRAIN_CUDA_HOST ${MESHTRAIN_CUDA_COMM_SOURCES})

# Kernels: only the CUDA runtime and their own launcher header, so none of the host libraries'
# compile flags (MPI, OpenMP, ...) reach nvcc.
add_library(meshtrain_cuda_kernels OBJECT ${MESHTRAIN_CUDA_KERNELS})
target_include_directories(meshtrain_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(meshtrain_cuda_kernels PRIVATE CUDA::cudart)
target_compile_options(meshtrain_cuda_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr -lineinfo>)
set_target_properties(meshtrain_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)

add_library(meshtrain_cuda STATIC ${MESHTRAIN_CUDA_HOST} $<TARGET_OBJECTS:meshtrain_cuda_kernels>)
target_include_directories(meshtrain_cuda PUBLIC ${PROJECT_SOURCE_DIR}/include
                           ${MESHTRAIN_CUDNN_INCLUDE_DIR} ${MESHTRAIN_NCCL_INCLUDE_DIR})
target_compile_options(meshtrain_cuda PRIVATE ${MESHTRAIN_WARNINGS} ${MESHTRAIN_OPT})
target_compile_definitions(meshtrain_cuda PUBLIC MESHTRAIN_HAVE_CUDA=1)
meshtrain_precompile(meshtrain_cuda)
# meshtrain_core and meshtrain_cuda need each other (the backend implements core interfaces;
# core's consumers see the backend): CMake repeats such static libraries on the link line.
target_link_libraries(meshtrain_cuda PUBLIC
  meshtrain_core CUDA::cudart CUDA::cublas CUDA::cublasLt
  ${MESHTRAIN_CUDNN_LIBRARY} ${MESHTRAIN_NCCL_LIBRARY})
target_link_libraries(meshtrain_core PUBLIC meshtrain_cuda)
