# oneDNN (Debian's libdnnl-dev) for the CPU backend's matmuls: the imported target DNNL::dnnl.
#
# Debian's package ships a CMake config (lib/<arch>/cmake/dnnl), but that config insists on the
# OpenCL headers (its GPU runtime is OpenCL) which the package does not depend on, and a nested
# REQUIRED find_package cannot be made optional from here. The CPU backend needs only the header
# and the library (built for OpenMP, the runtime OpenBLAS and the kernels share), so they are
# found directly.
find_path(MESHTRAIN_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(MESHTRAIN_DNNL_LIBRARY NAMES dnnl)
if(NOT MESHTRAIN_DNNL_INCLUDE_DIR OR NOT MESHTRAIN_DNNL_LIBRARY)
  message(FATAL_ERROR "oneDNN not found (header oneapi/dnnl/dnnl.hpp: ${MESHTRAIN_DNNL_INCLUDE_DIR}, "
                      "library libdnnl: ${MESHTRAIN_DNNL_LIBRARY}): install Debian's libdnnl-dev "
                      "(scripts/ensure-deps.sh build does), or put another oneDNN on CMAKE_PREFIX_PATH")
endif()
if(NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES
    IMPORTED_LOCATION "${MESHTRAIN_DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${MESHTRAIN_DNNL_INCLUDE_DIR}")
endif()
message(STATUS "oneDNN: ${MESHTRAIN_DNNL_LIBRARY}")
