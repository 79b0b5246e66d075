#pragma once
// How this rank's parameters are grouped for gradient reduction and ZeRO sharding.
//
// A bucket is a set of whole parameters laid out contiguously (each start aligned to 64 bytes)
// and padded to a multiple of dp x 16 elements, so that it splits into dp equal shards: rank r
// of the data group owns shard r of every bucket. Buckets are formed in reverse forward order —
// the order in which backward finishes gradients — closing when one reaches bucket_mb (PyTorch
// DDP's scheme, Li et al., arXiv 2006.15704). Under ZeRO-3 each unit (embedding, block, head)
// is one bucket, the granularity at which parameters are gathered. The token embedding (tagged
// ParamRole::TokenEmbedding, as is the head's tied copy of it) is always a bucket of its own:
// the first and last pipeline stage both hold it (tied embeddings), and equal buckets there give
// equal shards to sum over the embedding group.
//
// A bucket holds the parameters of one replica group (ParamSpec::group) and is split into as
// many shards as that group has ranks: its gradients are reduced, and under ZeRO sharded, over
// that group alone (the dense data group; a mixture of experts' expert-data group).

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/model/parameter_store.h"

namespace meshtrain {

struct Bucket {
  ReplicaGroup group = ReplicaGroup::Data;  // every parameter's in it
  std::vector<Parameter*> params;
  std::vector<int64_t> offsets;  // element offset of each parameter inside the bucket
  int64_t size = 0;              // elements, padded: a multiple of its group's shards * 16
  int64_t shard_size = 0;        // size / shards of its group
  std::vector<int> units;        // units that write these parameters' gradients
};

struct BucketPlan {
  std::vector<Bucket> buckets;
  // For each unit: the buckets holding parameters it reads (its own and borrowed ones).
  std::vector<std::vector<int>> unit_buckets;
  int64_t total_size() const;
};

enum class BucketBy { Size, Unit };

// shards(g): how many shards a bucket of replica group g splits into (1 without ZeRO).
BucketPlan make_bucket_plan(ParameterStore& store, const std::function<int(ReplicaGroup)>& shards,
                            double bucket_mb, BucketBy by, DType dtype);
// Every group split into `shards` (a single-group model, or no ZeRO).
BucketPlan make_bucket_plan(ParameterStore& store, int shards, double bucket_mb, BucketBy by,
                            DType dtype);

}  // namespace meshtrain
