#pragma once
// A device tensor's elements as host doubles, and back: for what the host computes in fp64 beside
// a device (generation's attention_decode, a mixture of experts' router). Through the device's
// own copies; fp64, fp32 and bf16 (widened exactly; narrowed to bf16 nearest-even, as cast does).

#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"

namespace meshtrain {

// The elements of `t` (contiguous). Another dtype is refused naming `op`, the backend's
// operation or layer that asked.
std::vector<double> to_host_doubles(Backend& be, const Tensor& t, const std::string& op);
// t = v (t.numel() values), rounded to t's dtype.
void from_host_doubles(Backend& be, Tensor& t, const std::vector<double>& v, const std::string& op);

}  // namespace meshtrain
