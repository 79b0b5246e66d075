# libFuzzer harnesses (fuzz/*_fuzz.cpp) under AddressSanitizer + UndefinedBehaviorSanitizer.
# MESHTRAIN_FUZZ=ON needs clang: the core is built with -fsanitize=fuzzer-no-link (coverage
# for the fuzzer, no main) and each harness links -fsanitize=fuzzer (libFuzzer's main).
# `make fuzz` configures build-fuzz with this on and runs each harness on fuzz/corpus/<name>/.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MESHTRAIN_FUZZ=ON needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                      "configure with -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
endif()

# -fno-sanitize-recover: a UB report is a crash the fuzzer stops on, not a line in the log.
set(MESHTRAIN_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer -g -O1)

# The harnesses link meshtrain_fuzz_core: the core without src/app/ and src/train/, the layers
# above everything the harnesses parse (dependencies point down, so no object below them calls
# into them). A static library lends a harness only the objects it uses, so it holds the same
# code either way; the fuzz build just does not compile the commands and the trainer, which no
# harness links. A harness that comes to need them fails to link.
set(MESHTRAIN_FUZZ_CORE_SOURCES ${MESHTRAIN_SOURCES})
list(FILTER MESHTRAIN_FUZZ_CORE_SOURCES EXCLUDE REGEX "/src/(app|train)/")
meshtrain_library(meshtrain_fuzz_core ${MESHTRAIN_FUZZ_CORE_SOURCES})
foreach(core meshtrain_core meshtrain_fuzz_core)
  target_compile_options(${core} PRIVATE ${MESHTRAIN_SANITIZE} -fsanitize=fuzzer-no-link)
  target_link_options(${core} PUBLIC -fsanitize=address,undefined)
endforeach()

set(MESHTRAIN_FUZZ_HARNESSES deck token_shard flight_record schedule checkpoint safetensors)
foreach(name IN LISTS MESHTRAIN_FUZZ_HARNESSES)
  add_executable(${name}_fuzz ${PROJECT_SOURCE_DIR}/fuzz/${name}_fuzz.cpp)
  target_compile_options(${name}_fuzz PRIVATE ${MESHTRAIN_SANITIZE} -fsanitize=fuzzer)
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name}_fuzz PRIVATE meshtrain_fuzz_core)
endforeach()
