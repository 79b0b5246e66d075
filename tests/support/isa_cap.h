#pragma once
// The instruction-set cap a test runs under. oneDNN dispatches each kernel to the best ISA the
// CPU has, capped by ONEDNN_MAX_CPU_ISA, and the ISA decides how a GEMM blocks and rounds (AMX
// sums tiles of bf16 pairs, AVX512-BF16 pairs in registers, AVX512 and AVX2 emulate bf16 in
// fp32). CTest runs the numerics tests once per cap (tests/CMakeLists.txt) so that one machine
// proves them for every ISA it has; a cap above what the CPU has would silently test a lower
// ISA twice, so that run is skipped and says why.

#include <string>

namespace meshtrain::testing {

struct IsaCap {
  std::string requested;  // ONEDNN_MAX_CPU_ISA as set ("" when unset: no cap)
  std::string effective;  // the ISA oneDNN dispatches to under it ("avx512_core_bf16", ...)
  bool reached = true;    // the CPU has the requested ISA (always true without a cap)
};
IsaCap onednn_isa_cap();

// For CTest's SKIP_REGULAR_EXPRESSION: printed (by rank 0) when the cap is not reached.
inline constexpr const char* kIsaUnavailable = "ISA not available on this CPU";

}  // namespace meshtrain::testing
