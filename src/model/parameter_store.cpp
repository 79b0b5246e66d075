#include "meshtrain/model/parameter_store.h"

#include <algorithm>
#include <stdexcept>

#include "meshtrain/tensor/philox.h"

namespace meshtrain {

namespace {
constexpr int64_t kAlignElements = 16;  // 64 bytes of fp32
int64_t align_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }
}  // namespace

int ParameterStore::begin_unit(std::string name) {
  unit_names_.push_back(std::move(name));
  borrowed_.emplace_back();
  return units() - 1;
}

bool ParameterStore::stack(const std::vector<Parameter*>& params) {
  if (params.size() < 2) return false;
  const auto first = std::find(view_.begin(), view_.end(), params.front());
  if (first == view_.end() || view_.end() - first < static_cast<std::ptrdiff_t>(params.size()))
    return false;
  for (size_t i = 0; i < params.size(); ++i)
    if (first[static_cast<std::ptrdiff_t>(i)] != params[i] || params[i]->stack >= 0) return false;
  for (Parameter* p : params) p->stack = stacks_;
  ++stacks_;
  return true;
}

void ParameterStore::use(Parameter& p) { borrowed_.back().push_back(&p); }

std::vector<Parameter*> ParameterStore::unit_params(int u) const {
  std::vector<Parameter*> out;
  for (Parameter* p : view_)
    if (p->unit == u) out.push_back(p);
  out.insert(out.end(), borrowed_[u].begin(), borrowed_[u].end());
  return out;
}

Parameter& ParameterStore::add(ParamSpec spec, int part, int parts) {
  if ((spec.tp_split == TpSplit::None) != (spec.tp_split_dim < 0))
    throw std::logic_error("ParameterStore: " + spec.name + " has tp_split_dim " +
                           std::to_string(spec.tp_split_dim) + " but a TpSplit that disagrees");
  if (spec.tp_split_dim >= 0 && spec.ep_split_dim >= 0)
    throw std::logic_error("ParameterStore: " + spec.name + " is split over both the tensor and "
                           "the expert group");
  if (unit_names_.empty()) begin_unit("model");
  auto p = std::make_unique<Parameter>();
  p->spec = std::move(spec);
  const int dim = p->split_dim();
  p->shape = split_shape(p->spec.global_shape, dim, dim < 0 ? 1 : parts);
  if (dim >= 0) p->split_begin = part * p->shape[dim];
  p->unit = units() - 1;
  view_.push_back(p.get());
  owned_.push_back(std::move(p));
  return *view_.back();
}

Parameter* ParameterStore::find(const std::string& name) {
  for (Parameter* p : view_)
    if (p->spec.name == name) return p;
  return nullptr;
}

int64_t ParameterStore::numel() const {
  int64_t n = 0;
  for (const Parameter* p : view_) n += p->numel();
  return n;
}

void ParameterStore::materialize(Backend& be, DType dtype) {
  offsets_.clear();
  int64_t total = 0;
  for (const Parameter* p : view_) {
    offsets_.push_back(total);
    total += align_up(p->numel());
  }
  flat_values_ = be.zeros({total}, dtype, MemoryCategory::Parameters);
  flat_grads_ = be.zeros({total}, dtype, MemoryCategory::Gradients);
  for (size_t i = 0; i < view_.size(); ++i) {
    view_[i]->value = flat_values_.view(offsets_[i], view_[i]->shape);
    view_[i]->grad = flat_grads_.view(offsets_[i], view_[i]->shape);
  }
}

int64_t ParameterStore::offset_of(const Parameter& p) const {
  for (size_t i = 0; i < view_.size(); ++i)
    if (view_[i] == &p) return offsets_.at(i);
  throw std::logic_error("ParameterStore: unknown parameter " + p.spec.name);
}

std::vector<char> initial_values(const Parameter& p, uint64_t seed, DType dtype) {
  const int64_t n = p.numel();
  std::vector<char> bytes(static_cast<size_t>(n) * dtype_size(dtype));
  const Philox rng(seed, p.spec.name);
  const Init init = p.spec.init;
  const double std_dev = p.spec.init_std;
  auto value = [&](int64_t i) -> double {
    switch (init) {
      case Init::Zeros: return 0.0;
      case Init::Ones: return 1.0;
      case Init::Normal: return std_dev * rng.normal(static_cast<uint64_t>(p.global_index(i)));
    }
    return 0.0;
  };
  if (dtype == DType::F32) {
    float* out = reinterpret_cast<float*>(bytes.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(value(i));
  } else if (dtype == DType::F64) {
    double* out = reinterpret_cast<double*>(bytes.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = value(i);
  } else {
    throw std::invalid_argument("initial_values: parameters are kept in fp32 or fp64, not " +
                                std::string(dtype_name(dtype)));
  }
  return bytes;
}

void ParameterStore::initialize(Backend& be, uint64_t seed) {
  for (Parameter* p : view_) {
    const std::vector<char> host = initial_values(*p, seed, p->value.dtype());
    be.copy_from_host(p->value, host.data());
  }
}

void ParameterStore::zero_grads(Backend& be) { be.fill(flat_grads_, 0.0); }

}  // namespace meshtrain
