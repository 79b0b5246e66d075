# MPI and parallel HDF5 of one flavour: MESHTRAIN_MPI=openmpi|mpich (`make MPI=mpich`).
#
# Debian installs both side by side: compiler wrappers and launchers with a suffix
# (mpicxx.openmpi / mpicxx.mpich, mpiexec.openmpi / mpiexec.mpich), the unsuffixed names behind
# the 'mpi' alternative, and one parallel HDF5 per MPI (pkg-config hdf5-openmpi / hdf5-mpich).
# FindMPI looks for the flavour's suffixed names where they exist (MPI_EXECUTABLE_SUFFIX), HDF5
# comes from the flavour's own .pc file, and configuration fails when the mpi.h that
# MPI::MPI_CXX or PkgConfig::HDF5 would compile against is another MPI's: Open MPI headers with
# MPICH's HDF5 (or the reverse) build, then crash or hang at run time, since the two disagree on
# every handle. tests/support/check_mpi_flavour.py checks the linked libraries afterwards.
#
# Defines MPI::MPI_C, MPI::MPI_CXX, MPIEXEC_EXECUTABLE, PkgConfig::HDF5, MESHTRAIN_MPI (the
# flavour, also when it was left empty and found from the default 'mpi' alternative).

set(MESHTRAIN_MPI "" CACHE STRING
    "MPI flavour: openmpi or mpich (empty: the system's default mpicxx, whichever it is)")
set_property(CACHE MESHTRAIN_MPI PROPERTY STRINGS "" openmpi mpich)
if(MESHTRAIN_MPI AND NOT MESHTRAIN_MPI MATCHES "^(openmpi|mpich)$")
  message(FATAL_ERROR "MESHTRAIN_MPI=${MESHTRAIN_MPI} is not an MPI flavour meshtrain knows "
                      "(expected openmpi or mpich, or empty for the system's default)")
endif()
# Debian's suffixed wrappers where they exist; elsewhere (a cluster's module) the plain names,
# which the header check below holds to the flavour asked for.
if(MESHTRAIN_MPI AND NOT MPI_CXX_COMPILER)
  find_program(MESHTRAIN_MPICXX_${MESHTRAIN_MPI} NAMES mpicxx.${MESHTRAIN_MPI})
  if(MESHTRAIN_MPICXX_${MESHTRAIN_MPI})
    set(MPI_EXECUTABLE_SUFFIX ".${MESHTRAIN_MPI}")
  endif()
endif()

find_package(MPI REQUIRED COMPONENTS C CXX)

# Which MPI does mpi.h belong to, compiled with the imported targets `libs` (a list)? Sets `out`
# to openmpi, mpich or unknown.
include(CheckCXXSourceCompiles)
function(meshtrain_mpi_header_flavour libs out)
  string(MAKE_C_IDENTIFIER "${libs}" id)
  foreach(flavour openmpi mpich)
    if(flavour STREQUAL openmpi)
      set(macro OMPI_MAJOR_VERSION)
    else()
      set(macro MPICH_VERSION)
    endif()
    set(CMAKE_REQUIRED_LIBRARIES ${libs})
    set(CMAKE_REQUIRED_QUIET ON)
    unset(MESHTRAIN_MPI_HEADER_IS_${flavour}_${id} CACHE)
    check_cxx_source_compiles("
#include <mpi.h>
#ifndef ${macro}
#error not this flavour
#endif
int main() { return 0; }" MESHTRAIN_MPI_HEADER_IS_${flavour}_${id})
    if(MESHTRAIN_MPI_HEADER_IS_${flavour}_${id})
      set(${out} ${flavour} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} unknown PARENT_SCOPE)
endfunction()

meshtrain_mpi_header_flavour(MPI::MPI_CXX _mpi_found)
if(NOT MESHTRAIN_MPI)
  if(_mpi_found STREQUAL unknown)
    message(FATAL_ERROR "meshtrain: ${MPI_CXX_COMPILER} is neither Open MPI nor MPICH; set "
                        "-DMESHTRAIN_MPI=openmpi or mpich (Debian: openmpi-bin libopenmpi-dev, "
                        "or mpich libmpich-dev)")
  endif()
  set(MESHTRAIN_MPI ${_mpi_found} CACHE STRING "MPI flavour: openmpi or mpich" FORCE)
elseif(NOT _mpi_found STREQUAL MESHTRAIN_MPI)
  message(FATAL_ERROR "meshtrain: MESHTRAIN_MPI=${MESHTRAIN_MPI}, but ${MPI_CXX_COMPILER} "
                      "compiles against ${_mpi_found}'s mpi.h; install the flavour's wrappers "
                      "(scripts/ensure-deps.sh build ${MESHTRAIN_MPI}) or start from an empty "
                      "build directory")
endif()

# Parallel HDF5 (MPI-IO driver) built against the same MPI: Debian's libhdf5-<flavour>-dev.
pkg_check_modules(HDF5 REQUIRED IMPORTED_TARGET hdf5-${MESHTRAIN_MPI})
# Both together, HDF5's include path first: whichever mpi.h a file including hdf5.h finds.
meshtrain_mpi_header_flavour("PkgConfig::HDF5;MPI::MPI_CXX" _hdf5_found)
if(NOT _hdf5_found STREQUAL MESHTRAIN_MPI)
  message(FATAL_ERROR "meshtrain: parallel HDF5 (hdf5-${MESHTRAIN_MPI}: ${HDF5_INCLUDE_DIRS}) "
                      "brings ${_hdf5_found}'s mpi.h into a ${MESHTRAIN_MPI} build; install "
                      "libhdf5-${MESHTRAIN_MPI}-dev")
endif()
foreach(dir IN LISTS HDF5_INCLUDE_DIRS HDF5_LIBRARY_DIRS MPI_CXX_INCLUDE_DIRS)
  set(other openmpi)
  if(MESHTRAIN_MPI STREQUAL openmpi)
    set(other mpich)
  endif()
  if(dir MATCHES "/${other}([/]|$)")
    message(FATAL_ERROR "meshtrain: a ${MESHTRAIN_MPI} build would search ${dir}, which belongs "
                        "to ${other}")
  endif()
endforeach()

string(TOUPPER "${MESHTRAIN_MPI}" MESHTRAIN_MPI_UPPER)
message(STATUS "meshtrain: MPI flavour ${MESHTRAIN_MPI} (${MPI_CXX_COMPILER}, "
               "${MPIEXEC_EXECUTABLE}; HDF5 ${HDF5_VERSION} from hdf5-${MESHTRAIN_MPI})")
