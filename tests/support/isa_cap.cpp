#include "support/isa_cap.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

namespace meshtrain::testing {

namespace {

// oneDNN's names of the caps CTest sets, lower-cased as ONEDNN_MAX_CPU_ISA accepts any case.
constexpr std::pair<const char*, dnnl::cpu_isa> kIsas[] = {
    {"avx2", dnnl::cpu_isa::avx2},
    {"avx2_vnni", dnnl::cpu_isa::avx2_vnni},
    {"avx512_core", dnnl::cpu_isa::avx512_core},
    {"avx512_core_vnni", dnnl::cpu_isa::avx512_core_vnni},
    {"avx512_core_bf16", dnnl::cpu_isa::avx512_core_bf16},
    {"avx512_core_amx", dnnl::cpu_isa::avx512_core_amx},
};

std::string name_of(dnnl::cpu_isa isa) {
  for (const auto& [name, value] : kIsas)
    if (value == isa) return name;
  return "other (dnnl::cpu_isa " + std::to_string(static_cast<int>(isa)) + ")";
}

}  // namespace

IsaCap onednn_isa_cap() {
  IsaCap cap;
  const char* env = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!env) env = std::getenv("DNNL_MAX_CPU_ISA");
  cap.effective = name_of(dnnl::get_effective_cpu_isa());
  if (!env || !*env) return cap;
  cap.requested = env;
  std::transform(cap.requested.begin(), cap.requested.end(), cap.requested.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  // Under a cap oneDNN dispatches to min(cap, CPU): the cap is reached exactly when the two agree.
  cap.reached = cap.effective == cap.requested;
  return cap;
}

}  // namespace meshtrain::testing
