#include "meshtrain/model/cost_sheet.h"

#include "meshtrain/model/parameter.h"

namespace meshtrain {

ParameterCost parameter_cost(const ParamSpec& spec) {
  ParameterCost c;
  c.numel = spec.global_shape.numel();
  c.tp_split = spec.tp_split_dim >= 0;
  return c;
}

AttentionCost attention_core_cost(int64_t heads, int64_t head_size, int64_t value_size) {
  AttentionCost core;
  core.heads = heads;
  core.head_size = head_size;
  core.value_size = value_size;
  core.forward_score_accesses = 2;
  core.backward_score_accesses = 3;
  return core;
}

void CostSheet::add(const CostSheet& other) {
  linears.insert(linears.end(), other.linears.begin(), other.linears.end());
  elementwise.insert(elementwise.end(), other.elementwise.begin(), other.elementwise.end());
  attention.insert(attention.end(), other.attention.begin(), other.attention.end());
  parameters.insert(parameters.end(), other.parameters.begin(), other.parameters.end());
  exchanges.insert(exchanges.end(), other.exchanges.begin(), other.exchanges.end());
  decode_cache.insert(decode_cache.end(), other.decode_cache.begin(), other.decode_cache.end());
}

double CostSheet::decode_cache_width(double tp) const {
  double width = 0;
  for (const DecodeCacheCost& c : decode_cache) width += c.local_width(tp);
  return width;
}

double CostSheet::decode_cache_elements(double tp, double seq_len) const {
  double elements = 0;
  for (const DecodeCacheCost& c : decode_cache) elements += c.local_width(tp) * c.tokens(seq_len);
  return elements;
}

void CostSheet::add_pass_over_last_outputs(double forward_accesses, double backward_accesses) {
  ElementwiseCost pass;
  pass.width = linears.back().out;
  pass.width_split = linears.back().split == TpSplitOf::Outputs;
  pass.tokens = ElementwiseCost::Tokens::All;
  pass.forward_accesses = forward_accesses;
  pass.backward_accesses = backward_accesses;
  elementwise.push_back(pass);
}

double CostSheet::local_parameters(double tp, bool include_shared) const {
  double n = 0;
  for (const ParameterCost& p : parameters)
    if (include_shared || !p.shared) n += p.local_numel(tp);
  return n;
}

double CostSheet::multiplying_parameters() const {
  double n = 0;
  for (const ParameterCost& p : parameters)
    if (!p.lookup_only && !p.shared) n += p.active_share * static_cast<double>(p.numel);
  return n;
}

double CostSheet::training_flops_per_token(double seq_len) const {
  double flops = 0;
  for (const LinearCost& l : linears) flops += l.training_flops_per_token();
  for (const AttentionCost& a : attention) flops += a.training_flops_per_token(seq_len);
  return flops;
}

int CostSheet::column_parallel_linears() const {
  int n = 0;
  for (const LinearCost& l : linears) n += l.split == TpSplitOf::Outputs;
  return n;
}

int CostSheet::row_parallel_linears() const {
  int n = 0;
  for (const LinearCost& l : linears) n += l.split == TpSplitOf::Inputs;
  return n;
}

double ModelCostSheet::flops_per_token(double seq_len) const {
  double n = embedding.multiplying_parameters(), attention = 0;
  for (const CostSheet& b : blocks) {
    n += b.multiplying_parameters();
    for (const AttentionCost& a : b.attention) attention += a.training_flops_per_token(seq_len);
  }
  n += head.multiplying_parameters();
  return 6.0 * n + attention;
}

}  // namespace meshtrain
