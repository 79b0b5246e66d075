#include "meshtrain/model/expert_bias.h"

#include <algorithm>
#include <stdexcept>

namespace meshtrain {

ExpertBias::ExpertBias(const ModelSpec& spec) {
  if (spec.feed_forward != FeedForwardKind::Moe || spec.moe.router != RouterKind::Sigmoid) return;
  experts_ = spec.moe.experts;
  blocks_ = spec.layers;
  for (int l = 0; l < spec.layers + spec.mtp_layers; ++l)
    if (spec.moe_layer(l)) {
      layers_.push_back(l);
      values_.emplace_back(static_cast<size_t>(experts_), 0.0);
    }
}

const double* ExpertBias::of_layer(int layer) const {
  const auto it = std::find(layers_.begin(), layers_.end(), layer);
  return it == layers_.end() ? nullptr : values_[static_cast<size_t>(it - layers_.begin())].data();
}

std::vector<double>& ExpertBias::values_of(int layer) {
  const auto it = std::find(layers_.begin(), layers_.end(), layer);
  if (it == layers_.end())
    throw std::logic_error("expert bias: layer " + std::to_string(layer) + " has none");
  return values_[static_cast<size_t>(it - layers_.begin())];
}

namespace {
constexpr const char* kSuffix = ".mlp.router.expert_bias";
}  // namespace

std::string ExpertBias::name(int layer) { return "h." + std::to_string(layer) + kSuffix; }

std::string ExpertBias::name_in_model(int layer) const {
  if (layer < blocks_) return name(layer);
  return "mtp." + std::to_string(layer - blocks_) + ".block" + kSuffix;
}

bool ExpertBias::is_name(const std::string& tensor) {
  const std::string suffix = kSuffix;
  return (tensor.rfind("h.", 0) == 0 || tensor.rfind("mtp.", 0) == 0) && tensor.size() > suffix.size() &&
         tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<StageBuffer> ExpertBias::buffers() {
  std::vector<StageBuffer> out;
  for (size_t i = 0; i < layers_.size(); ++i)
    out.push_back({name_in_model(layers_[i]), Shape{experts_}, &values_[i], "the router's expert bias"});
  return out;
}

void ExpertBias::update(const std::vector<int>& layers, const std::vector<double>& tokens, double rate) {
  const size_t E = static_cast<size_t>(experts_);
  if (tokens.size() != layers.size() * E)
    throw std::logic_error("expert bias: " + std::to_string(tokens.size()) + " loads for " +
                           std::to_string(layers.size()) + " layers of " + std::to_string(E) + " experts");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto it = std::find(layers.begin(), layers.end(), layers_[i]);
    if (it == layers.end())
      throw std::logic_error("expert bias: no loads of layer " + std::to_string(layers_[i]));
    const double* load = tokens.data() + static_cast<size_t>(it - layers.begin()) * E;
    double total = 0;
    for (size_t e = 0; e < E; ++e) total += load[e];
    const double mean = total / static_cast<double>(E);
    // sign(mean - load): an underloaded expert's bias rises, an overloaded one's falls, an
    // expert exactly at the mean keeps its own.
    for (size_t e = 0; e < E; ++e)
      values_[i][e] += rate * static_cast<double>((mean > load[e]) - (mean < load[e]));
  }
}

}  // namespace meshtrain
