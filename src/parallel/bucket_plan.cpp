#include "meshtrain/parallel/bucket_plan.h"

#include <algorithm>
#include <set>

namespace meshtrain {

namespace {
constexpr int64_t kAlign = 16;
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

int64_t BucketPlan::total_size() const {
  int64_t n = 0;
  for (const Bucket& b : buckets) n += b.size;
  return n;
}

BucketPlan make_bucket_plan(ParameterStore& store, int shards, double bucket_mb, BucketBy by,
                            DType dtype) {
  return make_bucket_plan(store, [shards](ReplicaGroup) { return shards; }, bucket_mb, by, dtype);
}

BucketPlan make_bucket_plan(ParameterStore& store, const std::function<int(ReplicaGroup)>& shards,
                            double bucket_mb, BucketBy by, DType dtype) {
  BucketPlan plan;
  const int64_t limit =
      std::max<int64_t>(kAlign, static_cast<int64_t>(bucket_mb * 1024 * 1024) / dtype_size(dtype));
  // Backward order, so that buckets fill as backward writes them; a stack's parameters
  // (ParameterStore::stack) stay in their own order, back to back in one bucket: their layers
  // read and write them as one tensor.
  std::vector<Parameter*> params = store.params();
  std::reverse(params.begin(), params.end());
  for (auto run = params.begin(); run != params.end();) {
    auto end = run + 1;
    if ((*run)->stack >= 0)
      while (end != params.end() && (*end)->stack == (*run)->stack) ++end;
    std::reverse(run, end);
    run = end;
  }

  Bucket open;
  auto close = [&] {
    if (open.params.empty()) return;
    const int parts = shards(open.group);
    open.size = align_up(std::max<int64_t>(open.size, 1), kAlign * parts);
    open.shard_size = open.size / parts;
    plan.buckets.push_back(std::move(open));
    open = Bucket{};
  };
  auto add = [&](Parameter* p) {
    open.group = p->spec.group;
    open.offsets.push_back(open.size);
    open.params.push_back(p);
    open.size += align_up(p->numel(), kAlign);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter* p = params[i];
    const bool alone = p->spec.role == ParamRole::TokenEmbedding;
    const bool new_unit = !open.params.empty() && open.params.back()->unit != p->unit;
    // A bucket is reduced over one communicator, so a parameter of another group starts a new one.
    const bool new_group = !open.params.empty() && open.group != p->spec.group;
    const bool inside_stack = !open.params.empty() && p->stack >= 0 &&
                              open.params.back()->stack == p->stack;
    if (alone || new_group || (by == BucketBy::Unit && new_unit) ||
        (by == BucketBy::Size && open.size >= limit && !inside_stack))
      close();
    add(p);
    if (alone) close();
  }
  close();

  // Which units write each bucket, and which buckets each unit reads.
  plan.unit_buckets.resize(store.units());
  for (int u = 0; u < store.units(); ++u) {
    std::set<int> mine;
    for (Parameter* p : store.unit_params(u))
      for (size_t b = 0; b < plan.buckets.size(); ++b)
        for (Parameter* q : plan.buckets[b].params)
          if (q == p) mine.insert(static_cast<int>(b));
    plan.unit_buckets[u].assign(mine.begin(), mine.end());
    for (int b : mine) plan.buckets[b].units.push_back(u);
  }
  return plan;
}

}  // namespace meshtrain
