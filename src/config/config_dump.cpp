#include "meshtrain/config/config_dump.h"

#include <charconv>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "meshtrain/io/metrics_writer.h"

namespace meshtrain {

namespace {

// A TOML basic string: its escapes are JSON's (io/metrics_writer.h).
std::string quoted(std::string_view s) { return json_string(s); }

// Shortest text that reads back as the same double, always a TOML float ("25.0", "1e-08").
std::string real(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "n": inf, nan
  return s;
}

const char* boolean(bool v) { return v ? "true" : "false"; }

std::string precision(DType t) {
  switch (t) {
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    default: return "fp32";
  }
}

// [run]
void dump_run(std::ostream& os, const Config& c) {
  const RunOptions& r = c.run;
  os << "[run]\n"
     << "device = " << quoted(r.device == DeviceChoice::Cpu    ? "cpu"
                              : r.device == DeviceChoice::Cuda ? "cuda"
                                                               : "auto") << "\n"
     << "attention = " << quoted(r.attention) << "\n"
     << "epilogues = " << quoted(r.fused_epilogues ? "fused" : "unfused") << "\n"
     << "name = " << quoted(r.name) << "\n"
     << "dir = " << quoted(r.dir) << "\n"
     << "seed = " << r.seed << "\n"
     << "log_every = " << r.log_every << "\n"
     << "tensorboard = " << boolean(r.tensorboard) << "\n"
     << "threads = " << r.threads << "\n"
     << "trace = " << boolean(r.trace) << "\n"
     << "comm_timeout = " << real(r.comm_timeout) << "\n"
     << "flight_records = " << r.flight_records << "\n"
     << "straggler_threshold = " << real(r.straggler_threshold) << "\n"
     << "replica_check_every = " << r.replica_check_every << "\n"
     << "rerun_spike_factor = " << real(r.rerun_spike_factor) << "\n";
}

// [model]: the family's keys as its spec reads them.
void dump_model(std::ostream& os, const Config& c) {
  const ModelSpec& m = c.model;
  os << "\n[model]\n"
     << "family = " << quoted(m.family) << "\n"
     << "layers = " << m.layers << "\n"
     << "d_model = " << m.d_model << "\n"
     << "heads = " << m.heads << "\n"
     << "seq_len = " << m.seq_len << "\n"
     << "vocab_size = " << m.vocab_size << "\n"
     << "tie_embeddings = " << boolean(m.tie_embeddings) << "\n";
  for (const SpecField& f : spec_fields(m))
    if (f.key != "family") os << f.key << " = " << f.value << "\n";
}

// A blend as TOML: an array of inline tables, one a line.
void dump_blend(std::ostream& os, const std::vector<DataSource>& blend) {
  os << "[\n";
  for (const DataSource& s : blend) {
    os << "  {path = [";
    for (size_t i = 0; i < s.paths.size(); ++i) os << (i ? ", " : "") << quoted(s.paths[i]);
    os << "], weight = " << real(s.weight) << ", name = " << quoted(s.name) << "},\n";
  }
  os << "]";
}

// [data]
void dump_data(std::ostream& os, const Config& c) {
  const DataOptions& d = c.data;
  os << "\n[data]\ntrain = ";
  if (!d.train_blend.empty()) {
    dump_blend(os, d.train_blend);
  } else {
    os << "[";
    for (size_t i = 0; i < d.train.size(); ++i) os << (i ? ", " : "") << quoted(d.train[i]);
    os << "]";
  }
  os << "\nval = ";
  if (!d.val_blend.empty()) dump_blend(os, d.val_blend);
  else os << quoted(d.val);
  os << "\non_exhausted = " << quoted(d.on_exhausted == OnExhausted::Stop ? "stop" : "wrap") << "\n"
     << "tokenizer = " << quoted(d.tokenizer) << "\n"
     << "document_mask = " << boolean(d.document_mask) << "\n"
     << "synthetic_bytes = " << d.synthetic_bytes << "\n";
}

// [train]
void dump_train(std::ostream& os, const Config& c) {
  const TrainOptions& t = c.train;
  os << "\n[train]\n"
     // "auto" until resolve_device() settled it with the device (a run's Config always is).
     << "precision = " << quoted(t.precision_auto && c.run.device == DeviceChoice::Auto ? "auto"
                                                                                     : precision(t.precision)) << "\n"
     << "steps = " << t.steps << "\n"
     << "global_batch = " << t.global_batch << "\n"
     << "micro_batch = " << (c.parallel.automatic.micro_batch ? quoted("auto") : std::to_string(t.micro_batch)) << "\n"
     << "lr = " << real(t.lr) << "\n"
     << "min_lr = " << real(t.min_lr) << "\n"
     << "warmup_steps = " << t.warmup_steps << "\n"
     << "weight_decay = " << real(t.weight_decay) << "\n"
     << "grad_clip = " << real(t.grad_clip) << "\n"
     << "eval_every = " << t.eval_every << "\n"
     << "eval_batches = " << t.eval_batches << "\n"
     << "sample_every = " << t.sample_every << "\n"
     << "beta1 = " << real(t.beta1) << "\n"
     << "beta2 = " << real(t.beta2) << "\n"
     << "eps = " << real(t.eps) << "\n";
  // Only a run with tasks names them: the configuration other runs record (in every checkpoint)
  // stays what it was before there were tasks.
  if (!t.eval_tasks.empty()) {
    os << "eval_tasks = [";
    for (size_t i = 0; i < t.eval_tasks.size(); ++i) os << (i ? ", " : "") << quoted(t.eval_tasks[i]);
    os << "]\n";
  }
  // Only a Muon run names its optimizer: the configuration an AdamW run records (in every
  // checkpoint) stays what it was before there was a choice.
  if (t.optimizer == OptimizerKind::Muon)
    os << "optimizer = " << quoted(optimizer_name(t.optimizer)) << "\n"
       << "muon_momentum = " << real(t.muon.momentum) << "\n"
       << "muon_nesterov = " << (t.muon.nesterov ? "true" : "false") << "\n"
       << "muon_ns_steps = " << t.muon.ns_steps << "\n"
       << "muon_ns_a = " << real(t.muon.ns_a) << "\n"
       << "muon_ns_b = " << real(t.muon.ns_b) << "\n"
       << "muon_ns_c = " << real(t.muon.ns_c) << "\n"
       << "muon_rms_scale = " << real(t.muon.rms_scale) << "\n";
  // Likewise only a run that clips names its threshold.
  if (t.qk_clip_threshold > 0) os << "qk_clip_threshold = " << real(t.qk_clip_threshold) << "\n";
}

// [parallel]
void dump_parallel(std::ostream& os, const Config& c) {
  const ParallelOptions& p = c.parallel;
  const AutoLayout& a = p.automatic;  // "auto" until the strategy advisor settled it
  const auto number_or_auto = [&](bool automatic, int v) { return automatic ? quoted("auto") : std::to_string(v); };
  os << "\n[parallel]\n"
     << "dp = " << (p.dp == 0 ? quoted("auto") : std::to_string(p.dp)) << "\n"
     << "tp = " << number_or_auto(a.tp, p.tp) << "\n"
     << "pp = " << number_or_auto(a.pp, p.pp) << "\n"
     << "cp = " << p.cp << "\n"
     << "ep = " << number_or_auto(a.ep, p.ep) << "\n"
     << "schedule = " << quoted(a.schedule ? std::string_view("auto") : schedule_name(p.schedule)) << "\n"
     << "virtual_stages = " << p.virtual_stages << "\n"
     << "schedule_costs = " << quoted(p.measured_schedule_costs ? "measured" : "unit") << "\n"
     << "zero = " << number_or_auto(a.zero, p.zero) << "\n"
     << "sequence_parallel = " << boolean(p.sequence_parallel) << "\n"
     << "recompute = " << quoted(a.recompute                      ? "auto"
                                 : p.recompute == Recompute::Selective ? "selective"
                                 : p.recompute == Recompute::Full    ? "full"
                                                                     : "none") << "\n"
     << "profile = " << quoted(p.profile) << "\n"
     << "order = " << quoted(p.order) << "\n"
     << "bucket_mb = " << real(p.bucket_mb) << "\n";
  if (!p.partition.empty()) {
    os << "partition = [";
    for (size_t i = 0; i < p.partition.size(); ++i) os << (i ? ", " : "") << p.partition[i];
    os << "]\n";
  }
  os << "communicator = " << quoted(p.communicator == CommChoice::Mpi    ? "mpi"
                                    : p.communicator == CommChoice::Nccl ? "nccl"
                                                                         : "auto") << "\n"
     << "offload = " << quoted(p.offload == Offload::Optimizer ? "optimizer" : "none") << "\n"
     << "balance = " << quoted(p.balance == Balance::Declared   ? "declared"
                               : p.balance == Balance::Measured ? "measured"
                                                                : "even") << "\n"
     << "speeds = [";
  for (size_t i = 0; i < p.rank_speeds.size(); ++i) os << (i ? ", " : "") << real(p.rank_speeds[i]);
  for (size_t i = 0; i < p.node_speeds.size(); ++i) {
    std::ostringstream entry;
    entry << p.node_speeds[i].first << "=" << real(p.node_speeds[i].second);
    os << (i ? ", " : "") << quoted(entry.str());
  }
  os << "]\n"
     << "rebalance = " << boolean(p.rebalance) << "\n"
     << "data_sync = " << quoted(p.async() ? "async" : "sync") << "\n"
     << "servers = " << p.servers << "\n"
     << "staleness = " << p.staleness << "\n";
}

// [checkpoint]
void dump_checkpoint(std::ostream& os, const Config& c) {
  const CheckpointOptions& k = c.checkpoint;
  os << "\n[checkpoint]\n"
     << "dir = " << quoted(k.dir) << "\n"
     << "every = " << k.every << "\n"
     << "keep = " << k.keep << "\n"
     << "resume = " << quoted(k.resume) << "\n"
     << "io = " << quoted(k.io == CheckpointIo::Collective    ? "collective"
                          : k.io == CheckpointIo::Independent ? "independent"
                                                              : "auto") << "\n"
     << "async = " << boolean(k.async) << "\n"
     << "async_nice = " << k.async_nice << "\n";
}

}  // namespace

std::string dump_config(const Config& c) {
  std::ostringstream os;
  dump_run(os, c);
  dump_model(os, c);
  dump_data(os, c);
  dump_train(os, c);
  dump_parallel(os, c);
  dump_checkpoint(os, c);
  return os.str();
}

}  // namespace meshtrain
