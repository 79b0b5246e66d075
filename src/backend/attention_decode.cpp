// The default Backend::attention_decode: one query row per head against the first `length`
// rows of a key/value cache, computed on the host in double. Generation runs it once per layer
// per token on (NH, length, HS) values, small beside the layer's GEMMs; doing it here keeps every
// backend (the CUDA one included, unchanged) able to generate without a kernel of its own.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/backend/host_doubles.h"

namespace meshtrain {


void Backend::do_attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache,
                                  const Tensor& v_cache, int64_t length, double scale) {
  const int64_t KVH = k_cache.dim(0), T_max = k_cache.dim(1), HS = k_cache.dim(2),
                HV = v_cache.dim(2);
  const int64_t NH = q.numel() / HS, group = NH / KVH;
  const std::vector<double> qh = to_host_doubles(*this, q, "attention_decode");
  std::vector<double> result(static_cast<size_t>(NH * HV), 0.0);
  std::vector<double> p(static_cast<size_t>(length));
  std::vector<double> k, v;
  for (int64_t h = 0; h < NH; ++h) {
    // Only the rows written so far: (length, HS) keys and (length, HV) values of this head's
    // key/value head, copied once per group of query heads.
    const int64_t g = h / group;
    if (h % group == 0) {
      k = to_host_doubles(*this, k_cache.view(g * T_max * HS, {length, HS}), "attention_decode");
      v = to_host_doubles(*this, v_cache.view(g * T_max * HV, {length, HV}), "attention_decode");
    }
    const double* qr = qh.data() + h * HS;
    double max = -INFINITY;
    for (int64_t j = 0; j < length; ++j) {
      double s = 0;
      for (int64_t c = 0; c < HS; ++c) s += qr[c] * k[j * HS + c];
      p[j] = s * scale;
      max = std::max(max, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < length; ++j) sum += (p[j] = std::exp(p[j] - max));
    double* o = result.data() + h * HV;
    for (int64_t j = 0; j < length; ++j)
      for (int64_t c = 0; c < HV; ++c) o[c] += p[j] / sum * v[j * HV + c];
  }
  from_host_doubles(*this, out, result, "attention_decode");
}

}  // namespace meshtrain
