// The deck's schema (deck_schema.h): the key builders and the table of every key.

#include "deck_schema.h"
#include "deck_keys.h"
#include "meshtrain/config/deck.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "meshtrain/backend/thread_limit.h"
#include "toml_value.h"

namespace meshtrain {

std::string repr(const toml::node& n) {
  std::ostringstream os;
  if (auto s = n.as_string()) {
    os << '"' << escape_control(s->get()) << '"';
  } else if (auto a = n.as_array()) {
    os << *a;
  } else if (n.is_table()) {
    os << "{...}";
  } else {
    n.visit([&](auto&& v) { os << v; });
  }
  return os.str();
}

using namespace deck_keys;

namespace {

// An integer key without an upper bound.
constexpr int64_t big = INT64_MAX;

// The [run] keys: device, threads, logging, the run directory, fault checks.
void add_run_keys(std::vector<KeySpec>& k) {
  k.push_back(choice_key("run", "device", "auto", {"auto", "cpu", "cuda"},
                         "Where to compute: \"auto\" uses a GPU per rank when this build has "
                         "the CUDA backend and the node has GPUs, else the CPU.",
                         [](Config& c, const std::string& v) {
                           c.run.device = v == "cpu"    ? DeviceChoice::Cpu
                                          : v == "cuda" ? DeviceChoice::Cuda
                                                        : DeviceChoice::Auto;
                         }));
  k.push_back(choice_key("run", "attention", "auto", {"auto", "cudnn", "own"},
                         "CUDA attention: cuDNN's fused scaled-dot-product attention (bf16), "
                         "meshtrain's own kernels, or the best available.",
                         [](Config& c, const std::string& v) { c.run.attention = v; }));
  k.push_back(choice_key("run", "epilogues", "fused", {"fused", "unfused"},
                         "CUDA: the MLP's GELU and the residual adds inside cuBLASLt's matrix "
                         "products where cuBLASLt offers them, or as kernels of their own (for "
                         "comparing numerics).",
                         [](Config& c, const std::string& v) {
                           c.run.fused_epilogues = v == "fused";
                         }));
  k.push_back(string_key("run", "name", "\"meshtrain\"",
                         "letters, digits, '.', '_', '-'; not \".\" and without \"..\"",
                         "Run name; names the run directory and the logs.",
                         [](const std::string& s) {
                           // No separators and no dot-dot: the name must stay inside runs/.
                           return std::regex_match(s, std::regex("[A-Za-z0-9._-]+")) &&
                                  s != "." && s.find("..") == std::string::npos;
                         },
                         [](Config& c, const std::string& v) { c.run.name = v; }));
  k.push_back(string_key("run", "dir", "\"runs/<name>\"", "a directory path",
                         "Run directory: metrics.jsonl, traces, default checkpoint directory.",
                         nonempty, [](Config& c, const std::string& v) { c.run.dir = v; }));
  k.push_back(int_key("run", "seed", 1234, 0, big,
                      "Seed of parameter initialisation and data order (with the step).",
                      [](Config& c) -> auto& { return c.run.seed; }));
  k.push_back(int_key("run", "log_every", 10, 1, big, "Log a progress line every N steps.",
                      [](Config& c) -> auto& { return c.run.log_every; }));
  k.push_back(bool_key("run", "tensorboard", false,
                       "Write the run's scalars as TensorBoard event files in <run.dir>/tensorboard "
                       "(rank 0, at each log line; a new file per run; tags: docs/running.md).",
                       [](Config& c, bool v) { c.run.tensorboard = v; }));
  k.push_back(int_key("run", "threads", 0, 0, kMaxThreads,
                      "Threads per rank for kernels and BLAS; 0: OMP_NUM_THREADS if set, else "
                      "the rank's share of the cores it is bound to (split with the node's "
                      "ranks bound to the same cores).",
                      [](Config& c) -> auto& { return c.run.threads; }));
  k.push_back(bool_key("run", "trace", false,
                       "Write a Chrome-trace timeline per rank (trace_rank<N>.json).",
                       [](Config& c, bool v) { c.run.trace = v; }));
  k.push_back(float_key("run", "comm_timeout", "600.0", 0.0, true,
                        "Seconds a communication may wait before the job is aborted with a "
                        "diagnosis (a dead or stalled rank).",
                        [](Config& c, double v) { c.run.comm_timeout = v; }));
  k.push_back(int_key("run", "flight_records", 4096, 0, 1 << 24,
                      "Communication operations each rank's flight recorder keeps in "
                      "<run.dir>/flight/ for `meshtrain diagnose` (64 bytes each); 0: off.",
                      [](Config& c) -> auto& { return c.run.flight_records; }));
  // Not 1 or below: every rank, or none, would be slower than the median.
  k.push_back(ratio_key("run", "straggler_threshold", "1.25", 1e9,
                        "Straggler report: at each log step, a rank whose compute time per step "
                        "exceeds this times the median of the ranks' is named (in the log after "
                        "2 consecutive windows, and in metrics.jsonl); 0: no report.",
                        [](Config& c, double v) { c.run.straggler_threshold = v; }));
  k.push_back(int_key("run", "replica_check_every", 100, 0, big,
                      "Every N steps, and before each checkpoint, the copies of the same "
                      "parameters (data-parallel replicas; tensor-parallel copies of unsplit "
                      "parameters; tied embeddings) compare a hash of their bits, and the job "
                      "stops (exit status 6) naming the ranks and nodes that differ (silent "
                      "data corruption); 0: off. Not under asynchronous data parallelism, whose "
                      "replicas differ by design.",
                      [](Config& c) -> auto& { return c.run.replica_check_every; }));
  // Not 1 or below: that would re-run about every other step (the median's own level).
  k.push_back(ratio_key("run", "rerun_spike_factor", "10.0", 1e300,
                        "A step whose gradient norm exceeds this times the median of the last "
                        "20 steps' is re-run on the same data before it is applied (as a step "
                        "with a NaN or infinite loss always is): results that differ on the "
                        "re-run stop the job as a hardware fault naming the ranks; the same "
                        "results continue training; 0: re-run only non-finite steps.",
                        [](Config& c, double v) { c.run.rerun_spike_factor = v; }));
}

// The [train] keys: batch, precision, schedule of the learning rate, evaluation.
void add_train_keys(std::vector<KeySpec>& k) {
  k.push_back(choice_key("train", "precision", "auto", {"auto", "fp32", "fp64", "bf16"},
                         "Arithmetic: bf16 mixed precision (bf16 parameters and activations; "
                         "fp32 gradients, master weights and optimizer state), fp32, or fp64 "
                         "to verify (CPU only: every layout then matches the single-rank run "
                         "to round-off). \"auto\": bf16 on GPUs and on CPUs with bf16 "
                         "instructions (AVX512-BF16, AMX), fp32 on other CPUs; the device "
                         "line says which and why.",
                         [](Config& c, const std::string& v) {
                           c.train.precision_auto = v == "auto";
                           c.train.precision = v == "fp64"   ? DType::F64
                                               : v == "bf16" ? DType::BF16
                                                             : DType::F32;
                         }));
  k.push_back(int_key("train", "steps", 200, 1, big, "Optimizer steps.",
                      [](Config& c) -> auto& { return c.train.steps; }));
  k.push_back(int_key("train", "global_batch", 16, 1, big,
                      "Sequences per optimizer step, over all data-parallel ranks.",
                      [](Config& c) -> auto& { return c.train.global_batch; }));
  k.push_back(int_or_auto_key("train", "micro_batch", "4", 1, big,
                              "Sequences per micro-batch on each data-parallel rank; \"auto\": "
                              "the strategy advisor's choice (see parallel.profile).",
                              [](Config& c) -> auto& { return c.train.micro_batch; },
                              [](Config& c) -> bool& { return c.parallel.automatic.micro_batch; }, 1));
  k.push_back(float_key("train", "lr", "1e-3", 0.0, true, "Peak learning rate.",
                        [](Config& c, double v) { c.train.lr = v; }));
  k.push_back(float_key("train", "min_lr", "1e-4", 0.0, false,
                        "Learning rate at the end of the cosine decay.",
                        [](Config& c, double v) { c.train.min_lr = v; }));
  k.push_back(int_key("train", "warmup_steps", 20, 0, big, "Linear warm-up steps.",
                      [](Config& c) -> auto& { return c.train.warmup_steps; }));
  k.push_back(float_key("train", "weight_decay", "0.1", 0.0, false,
                        "AdamW decoupled weight decay (not on biases and LayerNorm).",
                        [](Config& c, double v) { c.train.weight_decay = v; }));
  k.push_back(float_key("train", "grad_clip", "1.0", 0.0, false,
                        "Clip the global gradient norm to this; 0 turns clipping off.",
                        [](Config& c, double v) { c.train.grad_clip = v; }));
  k.push_back(int_key("train", "eval_every", 50, 0, big,
                      "Validate every N steps (and after the last); 0: only after the last.",
                      [](Config& c) -> auto& { return c.train.eval_every; }));
  k.push_back(int_key("train", "eval_batches", 4, 1, big,
                      "Global batches of validation data per evaluation.",
                      [](Config& c) -> auto& { return c.train.eval_batches; }));
  k.push_back({"train", "eval_tasks", "array of strings", "[]", "an array of JSON Lines task file paths",
               "Multiple-choice tasks scored at each evaluation (every train.eval_every steps and "
               "after the last), as `meshtrain eval --task` scores them: acc and acc_norm per task "
               "on the progress line and in metrics.jsonl. Each file holds {\"context\", "
               "\"choices\", \"gold\"} objects or HellaSwag's published form. Not under ZeRO-3 "
               "or asynchronous data parallelism.",
               [](const toml::node& n, Config& c) -> std::string {
                 const toml::array* a = n.as_array();
                 if (!a) return "is " + toml_type_of(n);
                 std::vector<std::string> out;
                 for (const toml::node& e : *a) {
                   if (!e.is_string()) return "holds " + toml_type_of(e);
                   if (e.as_string()->get().empty()) return "holds an empty path";
                   out.push_back(e.as_string()->get());
                 }
                 c.train.eval_tasks = out;
                 return "";
               }});
  k.push_back(int_key("train", "sample_every", 0, 0, big,
                      "Every N steps, print a short text the model writes (32 greedy tokens "
                      "from an empty prompt, decoded with data.tokenizer; every rank generates, "
                      "outside the timed step; pipeline stages pass each token along); 0: "
                      "never. Not under ZeRO-3 (skipped, with a note).",
                      [](Config& c) -> auto& { return c.train.sample_every; }));
  k.push_back(float_key("train", "beta1", "0.9", 0.0, false, "AdamW beta1, below 1.",
                        [](Config& c, double v) { c.train.beta1 = v; }));
  k.push_back(float_key("train", "beta2", "0.95", 0.0, false, "AdamW beta2, below 1.",
                        [](Config& c, double v) { c.train.beta2 = v; }));
  k.push_back(float_key("train", "eps", "1e-8", 0.0, true, "AdamW epsilon.",
                        [](Config& c, double v) { c.train.eps = v; }));
}

// [parallel], the grid: dp, tp, pp, cp and ep.
void add_grid_keys(std::vector<KeySpec>& k) {
  k.push_back({"parallel", "dp", "integer or \"auto\"", "\"auto\"", "integer from 1 to 2147483647, or \"auto\"",
               "Data-parallel ranks; \"auto\": world size / (tp x pp x cp).",
               [](const toml::node& n, Config& c) -> std::string {
                 if (auto s = n.as_string()) {
                   if (s->get() != "auto") return "is not a known value";
                   c.parallel.dp = 0;
                   return "";
                 }
                 if (!n.is_integer()) return "is " + toml_type_of(n);
                 if (n.as_integer()->get() < 1 || n.as_integer()->get() > INT32_MAX) return "is out of range";
                 c.parallel.dp = static_cast<int>(n.as_integer()->get());
                 return "";
               }});
  k.push_back(int_or_auto_key("parallel", "tp", "1", 1, 1 << 16,
                              "Tensor-parallel ranks; divides model.heads and model.vocab_size, and "
                              "divides model.kv_heads or is a multiple of it (then each key/value "
                              "head is shared by tp / kv_heads ranks); "
                              "\"auto\": the strategy advisor's choice.",
                              [](Config& c) -> auto& { return c.parallel.tp; },
                              [](Config& c) -> bool& { return c.parallel.automatic.tp; }, 1));
  k.push_back(int_or_auto_key("parallel", "pp", "1", 1, 1 << 16,
                              "Pipeline stages; \"auto\": the strategy advisor's choice.",
                              [](Config& c) -> auto& { return c.parallel.pp; },
                              [](Config& c) -> bool& { return c.parallel.automatic.pp; }, 1));
  k.push_back(int_key("parallel", "cp", 1, 1, 1 << 16,
                      "Context-parallel ranks: each splits every sequence into 2 x cp chunks "
                      "and holds two of them (i and 2 cp - 1 - i) through the whole model, "
                      "attention included (ring attention); divides model.seq_len / 2. CPU "
                      "backend only.",
                      [](Config& c) -> auto& { return c.parallel.cp; }));
  k.push_back(int_or_auto_key("parallel", "ep", "1", 1, 1 << 16,
                              "Expert-parallel ranks of a mixture of experts (model.feed_forward = "
                              "\"moe\"): each holds moe_experts / ep of every MoE layer's experts "
                              "and sends each token to the ranks of its experts (all-to-all). "
                              "Folded over the data and context ranks, not added to them: divides "
                              "dp x cp and moe_experts. \"auto\": the strategy advisor's choice "
                              "(1 for a dense model).",
                              [](Config& c) -> auto& { return c.parallel.ep; },
                              [](Config& c) -> bool& { return c.parallel.automatic.ep; }, 1));
}

// [parallel], the pipeline schedule and what trades memory for time: zero, recompute.
void add_schedule_keys(std::vector<KeySpec>& k) {
  k.push_back(choice_key("parallel", "schedule", "1f1b",
                         {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "auto"},
                         "Pipeline schedule; \"zb-h1\": 1F1B with each backward split in two "
                         "and the weight-gradient halves filling the bubble; \"zb-v\": the same "
                         "split over two chunks per rank placed in a V (needs virtual_stages = "
                         "2); \"auto\": the strategy advisor's choice (with virtual_stages).",
                         [](Config& c, const std::string& v) {
                           c.parallel.automatic.schedule = v == "auto";
                           c.parallel.schedule = v == "gpipe"          ? ScheduleKind::GPipe
                                                 : v == "interleaved" ? ScheduleKind::Interleaved
                                                 : v == "zb-h1"       ? ScheduleKind::ZeroBubbleH1
                                                 : v == "zb-v"        ? ScheduleKind::ZeroBubbleV
                                                                       : ScheduleKind::OneFOneB;
                         }));
  k.push_back(int_key("parallel", "virtual_stages", 1, 1, 1024,
                      "Model chunks per pipeline rank (interleaved and gpipe; zb-v: 2).",
                      [](Config& c) -> auto& { return c.parallel.virtual_stages; }));
  k.push_back(choice_key("parallel", "schedule_costs", "unit", {"unit", "measured"},
                         "zb-v: \"measured\" re-plans the schedule after the second step for "
                         "the time each chunk's forward, input gradient and weight gradient "
                         "took and for the transfers' delay (same arithmetic; CPU backend); "
                         "\"unit\" keeps the schedule planned for equal costs.",
                         [](Config& c, const std::string& v) {
                           c.parallel.measured_schedule_costs = v == "measured";
                         }));
  k.push_back(int_or_auto_key("parallel", "zero", "0", 0, 3,
                              "ZeRO stage over the data-parallel group: 1 shards optimizer "
                              "state, 2 also gradients, 3 also parameters; \"auto\": the "
                              "strategy advisor's choice.",
                              [](Config& c) -> auto& { return c.parallel.zero; },
                              [](Config& c) -> bool& { return c.parallel.automatic.zero; }, 0));
  k.push_back(bool_key("parallel", "sequence_parallel", false,
                       "Shard LayerNorm and residual regions along the sequence over the "
                       "tensor group (Megatron sequence parallelism).",
                       [](Config& c, bool v) { c.parallel.sequence_parallel = v; }));
  k.push_back(choice_key("parallel", "recompute", "none", {"none", "selective", "full", "auto"},
                         "Activation recomputation in the backward pass; \"auto\": the "
                         "strategy advisor's choice.",
                         [](Config& c, const std::string& v) {
                           c.parallel.automatic.recompute = v == "auto";
                           c.parallel.recompute = v == "selective" ? Recompute::Selective
                                                  : v == "full"    ? Recompute::Full
                                                                   : Recompute::None;
                         }));
  k.push_back(string_key("parallel", "profile", "\"\"",
                         "\"\", or a machine profile (TOML) from `meshtrain bench --suite "
                         "calibrate --out FILE` or input/machines/",
                         "The machine the \"auto\" layout choices are predicted on; \"\": "
                         "measured on the launched ranks at start-up (a few seconds).",
                         [](const std::string&) { return true; },
                         [](Config& c, const std::string& v) { c.parallel.profile = v; }));
}

// [parallel], where things go: rank order, buckets, the partition, the communicator, offload.
void add_placement_keys(std::vector<KeySpec>& k) {
  k.push_back(string_key("parallel", "order", "\"tp-dp-pp\"",
                         "the axes dp, tp, pp and optionally cp joined by '-', fastest-varying "
                         "first (without cp, cp follows tp)",
                         "Rank order of the process grid.",
                         [](const std::string& s) {
                           try {
                             GridShape::parse_order(s);
                             return true;
                           } catch (const std::invalid_argument&) {
                             return false;
                           }
                         },
                         [](Config& c, const std::string& v) { c.parallel.order = v; }));
  k.push_back(float_key("parallel", "bucket_mb", "25.0", 0.0, true,
                        "Gradient reduction bucket size in MiB.",
                        [](Config& c, double v) { c.parallel.bucket_mb = v; }));
  k.push_back({"parallel", "partition", "array of integers", "balanced by cost",
               "pp x virtual_stages positive layer counts summing to model.layers",
               "Layers of each model chunk, in model order.",
               [](const toml::node& n, Config& c) -> std::string {
                 auto a = n.as_array();
                 if (!a) return "is " + toml_type_of(n);
                 std::vector<int> out;
                 for (const toml::node& e : *a) {
                   if (!e.is_integer()) return "holds " + toml_type_of(e);
                   if (e.as_integer()->get() < 1) return "holds a count below 1";
                   if (e.as_integer()->get() > INT32_MAX) return "holds a count above 2147483647";
                   out.push_back(static_cast<int>(e.as_integer()->get()));
                 }
                 if (out.empty()) return "is empty";
                 c.parallel.partition = out;
                 return "";
               }});
  k.push_back(choice_key("parallel", "communicator", "auto", {"auto", "mpi", "nccl"},
                         "Collectives and pipeline transfers of device tensors: NCCL, or MPI "
                         "through host buffers; \"auto\": NCCL when every rank has a GPU of its "
                         "own. The CPU backend always uses MPI.",
                         [](Config& c, const std::string& v) {
                           c.parallel.communicator = v == "mpi"    ? CommChoice::Mpi
                                                     : v == "nccl" ? CommChoice::Nccl
                                                                   : CommChoice::Auto;
                         }));
  k.push_back(choice_key("parallel", "offload", "none", {"none", "optimizer"},
                         "Keep fp32 master weights and AdamW moments in pinned host memory and "
                         "update them on the CPU (CUDA only).",
                         [](Config& c, const std::string& v) {
                           c.parallel.offload = v == "optimizer" ? Offload::Optimizer : Offload::None;
                         }));
}

// [parallel], uneven ranks and asynchronous data parallelism: balance, speeds, rebalance, parameter servers.
void add_balance_keys(std::vector<KeySpec>& k) {
  k.push_back(choice_key("parallel", "balance", "even", {"even", "declared", "measured"},
                         "How work is divided among ranks of different speeds: \"even\" "
                         "shares; \"declared\": data-parallel shares of the global batch and "
                         "pipeline layer counts in proportion to parallel.speeds; \"measured\": "
                         "in proportion to a probe timed on every rank at start-up.",
                         [](Config& c, const std::string& v) {
                           c.parallel.balance = v == "declared"   ? Balance::Declared
                                                : v == "measured" ? Balance::Measured
                                                                  : Balance::Even;
                         }));
  k.push_back({"parallel", "speeds", "array", "[]",
               "numbers > 0, one per rank of the job; or strings \"NODE-PATTERN=SPEED\" "
               "(shell pattern on node names, SPEED > 0)",
               "Relative speeds of the ranks for parallel.balance = \"declared\"; with "
               "patterns, the first that matches a rank's node gives its speed, other ranks 1.",
               [](const toml::node& n, Config& c) -> std::string {
                 auto a = n.as_array();
                 if (!a) return "is " + toml_type_of(n);
                 c.parallel.rank_speeds.clear();
                 c.parallel.node_speeds.clear();
                 for (const toml::node& e : *a) {
                   if (e.is_integer() || e.is_floating_point()) {
                     const double v = e.is_integer() ? static_cast<double>(e.as_integer()->get())
                                                     : e.as_floating_point()->get();
                     if (!std::isfinite(v)) return "holds a speed that is not a finite number";
                     if (!(v > 0)) return "holds a speed that is not > 0";
                     c.parallel.rank_speeds.push_back(v);
                   } else if (e.is_string()) {
                     const std::string t = e.as_string()->get();
                     const size_t eq = t.rfind('=');
                     if (eq == std::string::npos || eq == 0)
                       return "holds \"" + t + "\", not NODE-PATTERN=SPEED";
                     char* end = nullptr;
                     const std::string num = t.substr(eq + 1);
                     const double v = std::strtod(num.c_str(), &end);
                     if (num.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v))
                       return "holds \"" + t + "\", whose speed is not a number > 0";
                     c.parallel.node_speeds.emplace_back(t.substr(0, eq), v);
                   } else {
                     return "holds " + toml_type_of(e);
                   }
                 }
                 if (!c.parallel.rank_speeds.empty() && !c.parallel.node_speeds.empty())
                   return "mixes numbers and NODE-PATTERN=SPEED strings";
                 return "";
               }});
  k.push_back(bool_key("parallel", "rebalance", false,
                       "Re-divide the data-parallel shares at a step boundary when the measured "
                       "compute times of the replicas differ (each log window).",
                       [](Config& c, bool v) { c.parallel.rebalance = v; }));
  k.push_back(choice_key("parallel", "data_sync", "sync", {"sync", "async"},
                         "\"sync\": every replica waits for the summed gradient each step; "
                         "\"async\": replicas push gradients to parameter servers "
                         "(parallel.servers extra ranks) and go on with parameters at most "
                         "parallel.staleness versions old.",
                         [](Config& c, const std::string& v) {
                           c.parallel.data_sync = v == "async" ? DataSync::Async : DataSync::Sync;
                         }));
  k.push_back(int_key("parallel", "servers", 0, 0, 1 << 20,
                      "Parameter-server ranks for parallel.data_sync = \"async\", launched "
                      "beyond dp x tp x pp (the job has servers + dp x tp x pp ranks).",
                      [](Config& c) -> auto& { return c.parallel.servers; }));
  k.push_back(int_key("parallel", "staleness", 0, 0, 1000,
                      "Asynchronous data parallelism: the most server versions a gradient's "
                      "parameters may lag the newest (0 reproduces synchronous training).",
                      [](Config& c) -> auto& { return c.parallel.staleness; }));
}

// The [checkpoint] keys.
void add_checkpoint_keys(std::vector<KeySpec>& k) {
  k.push_back(string_key("checkpoint", "dir", "\"<run.dir>/checkpoints\"", "a directory path",
                         "Where checkpoints are written and looked for.", nonempty,
                         [](Config& c, const std::string& v) { c.checkpoint.dir = v; }));
  k.push_back(int_key("checkpoint", "every", 0, 0, big,
                      "Write a checkpoint every N steps (and after the last); 0: never.",
                      [](Config& c) -> auto& { return c.checkpoint.every; }));
  k.push_back(int_key("checkpoint", "keep", 3, 1, big, "Complete checkpoints to keep.",
                      [](Config& c) -> auto& { return c.checkpoint.keep; }));
  k.push_back(string_key("checkpoint", "resume", "\"auto\"",
                         "\"auto\" (newest complete checkpoint, if any), \"none\", or a path",
                         "Where to resume from.", nonempty,
                         [](Config& c, const std::string& v) { c.checkpoint.resume = v; }));
  k.push_back(choice_key("checkpoint", "io", "auto", {"auto", "collective", "independent"},
                         "How ranks move their parts of each tensor: \"collective\" MPI-IO "
                         "(aggregated by MPI, for many small strided pieces), \"independent\" "
                         "(each rank its own runs, no synchronisation per tensor); \"auto\": "
                         "independent when every rank's pieces average 256 KiB or more, and "
                         "for loads also lie in sequential stretches of 32 MiB or more.",
                         [](Config& c, const std::string& v) {
                           c.checkpoint.io = v == "collective"    ? CheckpointIo::Collective
                                             : v == "independent" ? CheckpointIo::Independent
                                                                  : CheckpointIo::Auto;
                         }));
  k.push_back(bool_key("checkpoint", "async", false,
                       "Copy the state to host memory at the step boundary and write, flush, "
                       "verify and rename the checkpoint in the background while training goes "
                       "on; the next save, a stop and the end of the run wait for it. Costs "
                       "host memory for one copy of this rank's parameters and moments.",
                       [](Config& c, bool v) { c.checkpoint.async = v; }));
  k.push_back(int_key("checkpoint", "async_nice", 10, 0, 19,
                      "The nice value of the background write's threads once the state is "
                      "copied: training threads get most of a core they share with the write, "
                      "which takes longer (0: the write competes as an equal).",
                      [](Config& c) -> auto& { return c.checkpoint.async_nice; }));
}

}  // namespace

const std::vector<KeySpec>& schema() {
  // In the order `meshtrain keys` lists them, section by section.
  static const std::vector<KeySpec> keys = [] {
    std::vector<KeySpec> k;
    add_run_keys(k);
    add_model_keys(k);
    add_data_keys(k);
    add_train_keys(k);
    add_optimizer_keys(k);
    add_grid_keys(k);
    add_schedule_keys(k);
    add_placement_keys(k);
    add_balance_keys(k);
    add_checkpoint_keys(k);
    return k;
  }();
  return keys;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const KeySpec& k : schema())
    if (std::find(out.begin(), out.end(), k.section) == out.end()) out.push_back(k.section);
  return out;
}

IntegerRange deck_integer_range(const std::string& section, const std::string& key) {
  for (const KeySpec& k : schema())
    if (k.section == section && k.key == key && k.type == "integer") return {k.min, k.max};
  throw std::invalid_argument(section + "." + key + " is not an integer key of the deck");
}

}  // namespace meshtrain
