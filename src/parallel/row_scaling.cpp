#include "meshtrain/parallel/row_scaling.h"

#include <algorithm>

#include "meshtrain/backend/host_doubles.h"

namespace meshtrain {

namespace {
// Scales the elements of bucket b's owned values that belong to `s.param`; whether any did.
bool scale_in_bucket(const Bucket& bk, int64_t owned_begin, int64_t owned_size,
                     const RowScale& s, std::vector<double>& values) {
  bool touched = false;
  for (size_t i = 0; i < bk.params.size(); ++i) {
    if (bk.params[i] != s.param) continue;
    const int64_t first = bk.offsets[i], end = first + s.param->numel();
    const int64_t lo = std::max(first, owned_begin), hi = std::min(end, owned_begin + owned_size);
    for (int64_t at = lo; at < hi; ++at)
      values[static_cast<size_t>(at - owned_begin)] *=
          s.factors[static_cast<size_t>((at - first) / s.row_elements)];
    touched = touched || lo < hi;
  }
  return touched;
}
}  // namespace

void scale_parameter_rows(StateLayout& layout, ShardedOptimizer& optimizer,
                          const std::vector<RowScale>& scales) {
  optimizer.pass_update_fence();
  const char* op = "QK-clip's scaling of parameter rows";
  for (int b = 0; b < layout.buckets(); ++b) {
    const Bucket& bk = layout.plan().buckets[static_cast<size_t>(b)];
    const int64_t lo = layout.owned_begin(b), n = layout.owned_size(b);
    if (n == 0) continue;
    Tensor owned = optimizer.values(b);
    std::vector<double> values;
    bool touched = false;
    for (const RowScale& s : scales) {
      if (std::find(bk.params.begin(), bk.params.end(), s.param) == bk.params.end()) continue;
      if (values.empty()) values = to_host_doubles(layout.state_backend(), owned, op);
      touched = scale_in_bucket(bk, lo, n, s, values) || touched;
    }
    if (touched) from_host_doubles(layout.state_backend(), owned, values, op);
  }
  optimizer.sync_after_load();
}

}  // namespace meshtrain
