# Precompiled headers. Most of a translation unit's compile time is spent in the standard
# library's and MPI's headers, which nearly every source includes: parsed once per target (once
# for all tests, REUSE_FROM meshtrain_test_main) they are not parsed again per file. A fresh
# clone builds the sources three times in CI (sanitizers, MPICH, Release), so this is CI time.
# The headers are force-included into every C++ source of the target; a source still includes
# what it uses, so that -DMESHTRAIN_PCH=OFF builds the same code (no CI run checks it).
option(MESHTRAIN_PCH "Precompile the standard library and MPI headers most sources include" ON)
# GCC 12 misreports std::string's copies as out of bounds where the string headers come
# precompiled (GCC PR 105651, the family of PR 105329 that CMakeLists.txt's -Wno-restrict is
# for): some 25 such warnings, none real. The sanitizer runs check bounds at run time.
if(MESHTRAIN_PCH)
  foreach(bogus array-bounds stringop-overflow stringop-overread)
    list(APPEND MESHTRAIN_WARNINGS $<$<CXX_COMPILER_ID:GNU>:-Wno-${bogus}>)
  endforeach()
endif()

# Open MPI's mpi.h also declares its deprecated C++ bindings (and MPICH's may), which no source
# uses; skipping them is most of mpi.h's parse time.
set(MESHTRAIN_MPI_C_ONLY OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)

# The headers included by at least about a tenth of src/, directly or through include/.
set(MESHTRAIN_PCH_HEADERS
  <mpi.h> <algorithm> <array> <chrono> <cmath> <cstdint> <cstdio> <cstdlib> <cstring>
  <filesystem> <fstream> <functional> <iostream> <limits> <map> <memory> <mutex> <optional>
  <set> <sstream> <stdexcept> <string> <string_view> <thread> <utility> <vector>)

# meshtrain_precompile(TARGET [HEADERS...]): the headers above and any others, for TARGET's C++
# (a target's CUDA sources are compiled apart, in meshtrain_cuda_kernels).
function(meshtrain_precompile target)
  if(MESHTRAIN_PCH)
    target_precompile_headers(${target} PRIVATE ${MESHTRAIN_PCH_HEADERS} ${ARGN})
  endif()
endfunction()

# meshtrain_precompile_like(TARGET FROM): TARGET reuses FROM's precompiled header (same flags).
function(meshtrain_precompile_like target from)
  if(MESHTRAIN_PCH)
    target_precompile_headers(${target} REUSE_FROM ${from})
  endif()
endfunction()
