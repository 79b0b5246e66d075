#include "meshtrain/config/layout_check.h"

#include <algorithm>
#include <string>
#include <vector>

namespace meshtrain {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::vector<int64_t> divisors(int64_t n, int64_t limit = 16) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n && static_cast<int64_t>(out.size()) < limit; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Throws the deck's error, the deck's path first.
struct LayoutFail {
  const std::string& path;
  [[noreturn]] void operator()(const std::string& msg) const { throw DeckError(path + ": " + msg); }
};

// The ranks of the grid: parameter servers are ranks of the job outside it (the last `servers`
// ranks), which must leave the workers tp x pp ranks at least.
int grid_ranks(const Config& c, int job_size, const LayoutFail& fail) {
  const ParallelOptions& p = c.parallel;
  const int world_size = job_size - (p.async() ? p.servers : 0);
  if (p.async()) {
    const std::string servers = std::to_string(p.servers);
    if (world_size < p.tp * p.pp)
      fail("parallel.servers = " + servers + " leaves " + std::to_string(std::max(world_size, 0)) +
           " of the " + std::to_string(job_size) + " ranks of this job for the workers, fewer than "
           "tp x pp = " + std::to_string(p.tp * p.pp) + " (launch servers + dp x tp x pp ranks, at "
           "least " + std::to_string(p.servers + p.tp * p.pp) + ")");
    if (p.servers > c.model.parameter_count())
      fail("parallel.servers = " + servers + " is more than the model's " +
           std::to_string(c.model.parameter_count()) + " parameters: a server would hold no "
           "element (use at most that many servers)");
  }
  return world_size;
}

// parallel.dp: "auto" fills the grid's ranks; a given dp must fill them exactly.
void resolve_dp(Config& c, int world_size, const LayoutFail& fail) {
  ParallelOptions& p = c.parallel;
  const std::string tp = std::to_string(p.tp), pp = std::to_string(p.pp);
  // The grid without dp: the ranks one replica of the data takes.
  const int model_ranks = p.tp * p.pp * p.cp;
  const std::string model_axes = p.cp > 1 ? "tp x pp x cp" : "tp x pp";
  const std::string model_sizes = tp + " x " + pp + (p.cp > 1 ? " x " + std::to_string(p.cp) : std::string());
  if (p.dp == 0) {
    if (world_size % model_ranks != 0)
      fail("parallel.dp = \"auto\" cannot fill " + std::to_string(world_size) +
           " ranks with " + model_axes + " = " + model_sizes + " = " + std::to_string(model_ranks) +
           " (launch a multiple of " + std::to_string(model_ranks) + " ranks)");
    p.dp = world_size / model_ranks;
  } else if (p.dp * model_ranks != world_size) {
    fail("parallel.dp x " + model_axes + " = " + std::to_string(p.dp) + " x " + model_sizes + " = " +
         std::to_string(p.dp * model_ranks) + " does not match the " +
         std::to_string(world_size) + " ranks of this job" + (p.async() ? " besides the " + std::to_string(p.servers) + " server(s)" : std::string()) +
         " (launch " + std::to_string(p.dp * model_ranks + (p.async() ? p.servers : 0)) +
         " ranks, or set parallel.dp = \"auto\")");
  }
}

// tp divides the heads and the vocabulary, and divides or is a multiple of the key/value
// heads; every pipeline chunk gets a layer.
void check_tensor_and_pipeline_split(const Config& c, const LayoutFail& fail) {
  const ParallelOptions& p = c.parallel;
  const std::string tp = std::to_string(p.tp), pp = std::to_string(p.pp);
  if (c.model.heads % p.tp != 0)
    fail("parallel.tp = " + tp + " does not divide model.heads = " +
         std::to_string(c.model.heads) + " (tp must be one of " + join(divisors(c.model.heads)) +
         ")");
  // Each tensor rank holds whole key/value heads, or shares one with tp / kv_heads ranks
  // (model/qkv_projection.h); either way its query heads read one set of whole heads.
  const int64_t kv = c.model.kv_heads();
  if (kv % p.tp != 0 && p.tp % kv != 0) {
    std::vector<int64_t> allowed;
    for (int64_t d : divisors(c.model.heads))
      if (kv % d == 0 || d % kv == 0) allowed.push_back(d);
    fail("parallel.tp = " + tp + " neither divides model.kv_heads = " + std::to_string(kv) +
         " nor is a multiple of it (each tensor rank holds whole key/value heads, or shares one "
         "with tp / kv_heads ranks: tp must be one of " + join(allowed) + ")");
  }
  if (c.model.vocab_size % p.tp != 0) {
    const int64_t padded = (c.model.vocab_size + 64 * p.tp - 1) / (64 * p.tp) * (64 * p.tp);
    fail("parallel.tp = " + tp + " does not divide model.vocab_size = " +
         std::to_string(c.model.vocab_size) + " (pad the vocabulary to a multiple of tp, e.g. " +
         std::to_string(padded) + ", or use tp in " + join(divisors(c.model.vocab_size)) + ")");
  }
  const int chunks = p.pp * p.virtual_stages;
  if (c.model.layers < chunks)
    fail("model.layers = " + std::to_string(c.model.layers) +
         " is fewer than parallel.pp x virtual_stages = " + pp + " x " +
         std::to_string(p.virtual_stages) + " = " + std::to_string(chunks) +
         " (every pipeline chunk needs at least one layer)");
}

// The batch divides into the replicas' micro-batches (even or uneven shares), and speeds name every rank.
void check_batch_shares(const Config& c, int world_size, const LayoutFail& fail) {
  const ParallelOptions& p = c.parallel;
  const std::string pp = std::to_string(p.pp), dp = std::to_string(p.dp);
  const int granule = p.share_granule();
  if (p.uneven_shares()) {
    // Shares are whole micro-batches, multiples of pp under the interleaved schedule, at least
    // one such granule per replica (train/work_balance.h).
    const int total = c.total_microbatches();
    if (total % granule != 0 || total < p.dp * granule)
      fail("train.global_batch / micro_batch = " + std::to_string(c.train.global_batch) + " / " +
           std::to_string(c.train.micro_batch) + " = " + std::to_string(total) +
           " micro-batches cannot be shared among dp = " + dp + " replicas" +
           (granule > 1 ? " in multiples of parallel.pp = " + pp + " (the interleaved schedule)"
                        : std::string()) +
           " (uneven shares need at least " + std::to_string(p.dp * granule) +
           " micro-batches" + (granule > 1 ? ", a multiple of " + pp : std::string()) + ")");
  } else {
    const int per_step = p.dp * c.train.micro_batch;
    if (c.train.global_batch % per_step != 0)
      fail("train.global_batch = " + std::to_string(c.train.global_batch) +
           " is not divisible by dp x micro_batch = " + dp + " x " +
           std::to_string(c.train.micro_batch) + " = " + std::to_string(per_step) +
           " (global_batch must be a multiple of " + std::to_string(per_step) + ", e.g. " +
           std::to_string(per_step * ((c.train.global_batch + per_step - 1) / per_step)) + ")");
    const int m = c.microbatches();
    if (m % granule != 0)
      fail("parallel.schedule = \"interleaved\" needs the micro-batches per step (global_batch / "
           "(dp x micro_batch) = " + std::to_string(m) + ") to be a multiple of parallel.pp = " + pp);
  }
  if (!p.rank_speeds.empty() && static_cast<int>(p.rank_speeds.size()) != world_size)
    fail("parallel.speeds has " + std::to_string(p.rank_speeds.size()) +
         " numbers for the " + std::to_string(world_size) +
         " ranks of this job (give one speed per rank, or \"NODE-PATTERN=SPEED\" strings)");
}

// Context parallelism's sequence chunks, expert parallelism's experts and folding, sequence parallelism's tokens.
void check_context_and_expert_parallel(const Config& c, const LayoutFail& fail) {
  const ParallelOptions& p = c.parallel;
  const std::string tp = std::to_string(p.tp);
  if (p.cp > 1) {
    const std::string cp = std::to_string(p.cp);
    if (c.model.seq_len % (2 * p.cp) != 0)
      fail("parallel.cp = " + cp + " does not divide model.seq_len = " +
           std::to_string(c.model.seq_len) + " into 2 x cp = " + std::to_string(2 * p.cp) +
           " equal chunks (seq_len must be a multiple of " + std::to_string(2 * p.cp) + ")");
    if (p.async())
      fail("parallel.cp = " + cp + " does not combine with parallel.data_sync = \"async\" (the "
           "parameter servers take whole replicas' gradients; use cp = 1, or data_sync = \"sync\")");
  }
  if (p.ep > 1) {
    const std::string ep = std::to_string(p.ep);
    const int replicas = p.dp * p.cp;
    if (c.model.feed_forward != FeedForwardKind::Moe)
      fail("parallel.ep = " + ep + " splits a mixture of experts' experts, but model.feed_forward "
           "is \"" + feed_forward_name(c.model.feed_forward) + "\" (use ep = 1, or "
           "model.feed_forward = \"moe\")");
    if (c.model.moe.experts % p.ep != 0)
      fail("parallel.ep = " + ep + " does not divide model.moe_experts = " +
           std::to_string(c.model.moe.experts) + " (each expert rank holds the same number of "
           "experts: ep must be one of " + join(divisors(c.model.moe.experts)) + ")");
    if (replicas % p.ep != 0)
      fail("parallel.ep = " + ep + " does not divide dp" + std::string(p.cp > 1 ? " x cp" : "") +
           " = " + std::to_string(replicas) + " (expert parallelism folds over the data" +
           std::string(p.cp > 1 ? " and context" : "") + " ranks: ep must be one of " +
           join(divisors(replicas)) + ")");
    if (p.uneven_shares())
      fail("parallel.ep = " + ep + " does not combine with uneven data shares (parallel.balance "
           "or parallel.rebalance): the ranks of an expert group exchange tokens at every MoE "
           "layer of every micro-batch, so they must run the same micro-batches (use ep = 1, or "
           "balance = \"even\" without rebalance)");
    if (p.async())
      fail("parallel.ep = " + ep + " does not combine with parallel.data_sync = \"async\" (the "
           "parameter servers hold whole replicas; use ep = 1, or data_sync = \"sync\")");
  }
  const int64_t local_tokens = c.train.micro_batch * c.model.seq_len / p.cp;
  if (p.sequence_parallel && local_tokens % p.tp != 0)
    fail("parallel.sequence_parallel needs micro_batch x seq_len" +
         std::string(p.cp > 1 ? " / cp" : "") + " = " + std::to_string(local_tokens) +
         " tokens to divide by tp = " + tp);
}

// Ring attention (model/ring_attention.h) passes every earlier block of keys round the ring:
// under a window most of them are masked out whole, and its block kernels take no window yet.
void check_window_context_parallel(const Config& c, const LayoutFail& fail) {
  if (!c.model.windowed() || c.parallel.cp == 1) return;
  fail("model.attention_window = " + attention_window_text(c.model.attention_window) +
       " does not combine with parallel.cp = " + std::to_string(c.parallel.cp) + " yet (ring "
       "attention's blocks take no sliding window; use cp = 1, or attention_window = 0)");
}

}  // namespace

void check_layout(Config& c, int job_size) {
  const LayoutFail fail{c.deck_path};
  const int world_size = grid_ranks(c, job_size, fail);
  resolve_dp(c, world_size, fail);
  check_tensor_and_pipeline_split(c, fail);
  check_batch_shares(c, world_size, fail);
  check_context_and_expert_parallel(c, fail);
  check_window_context_parallel(c, fail);
}

}  // namespace meshtrain
