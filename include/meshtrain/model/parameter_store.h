#pragma once
// The parameters of this rank's model chunks, in forward order and grouped into units (the
// embedding, each block, the head). By default values and gradients live in one flat buffer
// each, so that optimizers and gradient reduction work on contiguous memory; the ZeRO stages
// replace that storage with sharded buffers and re-point the views.

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/parameter.h"

namespace meshtrain {

class ParameterStore {
 public:
  // Starts a new unit; parameters added after belong to it. Returns the unit's index.
  int begin_unit(std::string name);
  // Registers this rank's slice of a parameter: part `part` of `parts` along its split dimension
  // (spec.tp_split_dim: the tensor group's rank and size; spec.ep_split_dim: the expert
  // group's); the whole parameter when it has none.
  Parameter& add(ParamSpec spec, int part, int parts);

  // Marks parameters registered one after another as a stack: every flat buffer (this store's,
  // the training state's buckets, ZeRO's gathered units) keeps them back to back in this order,
  // so that their layers can run as one product (model/stacked_columns.h). Returns false, and
  // marks nothing, when they were not registered consecutively (a bias between two weights).
  bool stack(const std::vector<Parameter*>& params);
  // The current unit also uses `p`, owned by another unit (the head using tied embeddings).
  void use(Parameter& p);
  // Every parameter unit `u` reads in its forward and backward: its own, then borrowed ones.
  std::vector<Parameter*> unit_params(int u) const;

  std::vector<Parameter*>& params() { return view_; }
  const std::vector<Parameter*>& params() const { return view_; }
  Parameter* find(const std::string& name);
  int units() const { return static_cast<int>(unit_names_.size()); }
  const std::string& unit_name(int u) const { return unit_names_[u]; }
  int64_t numel() const;  // elements of all local slices

  // Allocates one flat value buffer and one flat gradient buffer and points every parameter's
  // views into them (each start aligned to 64 bytes).
  void materialize(Backend& be, DType dtype);
  Tensor& flat_values() { return flat_values_; }
  Tensor& flat_grads() { return flat_grads_; }
  // Offset, in elements, of each parameter inside the flat buffers.
  int64_t offset_of(const Parameter& p) const;

  // Fills every value from the counter-based generator (seed, name, global index).
  void initialize(Backend& be, uint64_t seed);
  void zero_grads(Backend& be);

 private:
  std::vector<std::unique_ptr<Parameter>> owned_;
  std::vector<Parameter*> view_;
  std::vector<std::string> unit_names_;
  std::vector<std::vector<Parameter*>> borrowed_;  // per unit
  std::vector<int64_t> offsets_;
  int stacks_ = 0;
  Tensor flat_values_, flat_grads_;
};

// Host values of a parameter slice as the initialiser defines them, in the given dtype.
std::vector<char> initial_values(const Parameter& p, uint64_t seed, DType dtype);

}  // namespace meshtrain
