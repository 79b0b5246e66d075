#pragma once
// The typed configuration of a run: the input deck (TOML) after parsing, defaults and
// validation. Passed down to every layer; nothing reads the deck or the environment again.
// The keys, their defaults and what they accept are listed once, in deck_schema.cpp, which
// also prints the deck reference (docs/deck-reference.md) (`meshtrain keys`).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/model/recompute.h"
#include "meshtrain/optim/muon_hyper.h"
#include "meshtrain/parallel/grid_shape.h"
#include "meshtrain/parallel/schedule_kind.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain {

enum class DeviceChoice { Auto, Cpu, Cuda };
enum class CommChoice { Auto, Mpi, Nccl };
enum class CheckpointIo { Auto, Collective, Independent };
enum class Offload { None, Optimizer };
// Where data-parallel shares and pipeline layer counts come from (train/work_balance.h).
enum class Balance { Even, Declared, Measured };
// Data parallelism: replicas wait for each other's gradients every step, or push them to
// parameter servers and go on (parallel/parameter_server.h).
enum class DataSync { Sync, Async };

struct RunOptions {
  DeviceChoice device = DeviceChoice::Auto;  // resolved by resolve_device() before training
  std::string attention = "auto";            // CUDA attention: auto, cudnn, own
  bool fused_epilogues = true;               // CUDA: GELU, residuals in cuBLASLt's epilogues
  std::string name = "meshtrain";
  std::string dir;  // default runs/<name>
  uint64_t seed = 1234;
  int log_every = 10;
  int threads = 0;  // 0: automatic
  bool trace = false;
  bool tensorboard = false;  // TensorBoard event files in <dir>/tensorboard (io/tensorboard_writer.h)
  double comm_timeout = 600.0;  // seconds
  int flight_records = 4096;    // communication operations each rank's flight recorder keeps
  double straggler_threshold = 1.25;  // compute x the median that flags a rank; 0: no report
  int replica_check_every = 100;      // steps between replica hash checks; 0: off
  double rerun_spike_factor = 10.0;   // gradient norm x the recent median that re-runs a step; 0: off
};

// One weighted source of a blend (data.train = [{path = "a/*.bin", weight = 0.7}, ...];
// io/blend_schedule.h draws each sample's source).
struct DataSource {
  std::vector<std::string> paths;  // token-shard paths / glob patterns, in order
  double weight = 1.0;             // finite, >= 0; the blend's weights sum to more than 0
  std::string name;                // metrics and messages; default: the first path
};

// data.on_exhausted: what a source whose samples have all been drawn does next.
enum class OnExhausted { Wrap, Stop };

struct DataOptions {
  std::vector<std::string> train = {"synthetic"};
  // Set when data.train is a weighted list (a blend), which `train` then is not.
  std::vector<DataSource> train_blend;
  std::string val = "synthetic";
  std::vector<DataSource> val_blend;  // likewise for data.val
  OnExhausted on_exhausted = OnExhausted::Wrap;
  int64_t synthetic_bytes = 4000000;
  std::string tokenizer = "bytes";  // io/tokenizer.h: "bytes" or a tokenizer file
  // Block-causal attention over the documents of a packed sequence (train/document_starts.h).
  bool document_mask = false;
  bool synthetic_train() const {
    return train_blend.empty() && train.size() == 1 && train[0] == "synthetic";
  }
  bool synthetic_val() const { return val_blend.empty() && val == "synthetic"; }
  bool has_val() const { return !val_blend.empty() || val != "none"; }
};

struct TrainOptions {
  // fp32; fp64 verifies (CPU); bf16 mixed precision with fp32 master weights. The deck's "auto"
  // is resolved with the device (resolve_device): bf16 on CUDA and on CPUs with bf16
  // instructions, fp32 on other CPUs.
  DType precision = DType::F32;
  bool precision_auto = false;  // decks start from "auto" (parse_deck); code sets precision
  int steps = 200;
  int global_batch = 16;  // sequences per optimizer step
  int micro_batch = 4;    // sequences per micro-batch per data-parallel rank
  double lr = 1e-3, min_lr = 1e-4;
  int warmup_steps = 20;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0: off
  int eval_every = 50;     // 0: only after the last step
  int eval_batches = 4;
  int sample_every = 0;    // print a text sample every N steps; 0: never
  // Multiple-choice task files (io/choice_tasks.h) scored at each evaluation (eval_every).
  std::vector<std::string> eval_tasks;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  // AdamW for every parameter, or Muon for the hidden matrices and AdamW for the rest
  // (optim/muon_hyper.h); muon.weight_decay is weight_decay, set by the trainer.
  OptimizerKind optimizer = OptimizerKind::AdamW;
  MuonHyper muon;
  // MuonClip's QK-clip (Kimi K2, arXiv 2507.20534): after each step, the attention heads whose
  // largest pre-softmax logit exceeded this get their query and key rows scaled back to it
  // (model/qk_clip.h). 0: off.
  double qk_clip_threshold = 0;
};

// Layout choices a deck leaves to the strategy advisor ("auto"; train/layout_advisor.h), which
// settles them at start-up for the world the job was launched on (parallel.dp "auto" is dp = 0).
struct AutoLayout {
  bool tp = false, pp = false, ep = false, micro_batch = false, schedule = false, zero = false,
       recompute = false;
  bool any() const { return tp || pp || ep || micro_batch || schedule || zero || recompute; }
};

struct ParallelOptions {
  int dp = 0;  // 0: "auto", world / (tp * pp * cp)
  int tp = 1, pp = 1;
  int cp = 1;  // context parallelism: each sequence split over cp ranks (model/ring_attention.h)
  int ep = 1;  // expert parallelism, folded over dp x cp (parallel/grid_shape.h)
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int virtual_stages = 1;
  // zb-v: re-plan the schedule for the costs measured in the second step
  // (parallel.schedule_costs = "measured"; off by default: no faster step measured yet).
  bool measured_schedule_costs = false;
  int zero = 0;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::None;
  std::string order = "tp-dp-pp";
  double bucket_mb = 25.0;
  std::vector<int> partition;  // layers per model chunk; empty: balanced
  CommChoice communicator = CommChoice::Auto;
  Offload offload = Offload::None;
  AutoLayout automatic;  // what is "auto" (the fields above hold placeholders until settled)
  std::string profile;   // machine profile the "auto" choices are predicted on; "": measured
  // Heterogeneous ranks (train/work_balance.h): parallel.balance, parallel.speeds (numbers, one
  // per world rank, or "NODE-PATTERN=SPEED" entries) and parallel.rebalance.
  Balance balance = Balance::Even;
  std::vector<double> rank_speeds;
  std::vector<std::pair<std::string, double>> node_speeds;
  bool rebalance = false;
  // Asynchronous data parallelism: `servers` ranks beyond dp x tp x pp hold the optimizer; a
  // gradient is computed on parameters at most `staleness` server versions old.
  DataSync data_sync = DataSync::Sync;
  int servers = 0;
  int staleness = 0;
  bool async() const { return data_sync == DataSync::Async; }
  // Ranks of the job: the grid's, and the servers'.
  int world_ranks() const { return dp * tp * pp + (async() ? servers : 0); }
  // Data-parallel replicas may take different numbers of micro-batches.
  bool uneven_shares() const { return balance != Balance::Even || rebalance; }
  // Shares are whole micro-batches in multiples of this: pp under the interleaved schedule,
  // whose every rank takes the micro-batches in groups of pp.
  int share_granule() const { return schedule == ScheduleKind::Interleaved ? pp : 1; }
};

struct CheckpointOptions {
  std::string dir;  // default <run.dir>/checkpoints
  int every = 0;    // 0: never
  int keep = 3;
  std::string resume = "auto";  // "auto", "none" or a path
  CheckpointIo io = CheckpointIo::Auto;
  // Copy the state to host memory at the step boundary and write it in the background while
  // training goes on (the next save, a stop and the end of the run wait for it).
  bool async = false;
  // The nice value of the background write's threads once the copy is taken (the copy itself,
  // which the next update waits for, runs at the training's priority): training threads then
  // get most of a core they share with the write, and the write takes longer.
  int async_nice = 10;
};

struct Config {
  std::string deck_path;  // as given on the command line
  std::string deck_text;  // the deck as read (stored in checkpoints)
  std::vector<std::string> overrides;  // the --set overrides applied to it, as given (likewise)
  RunOptions run;
  ModelSpec model;
  DataOptions data;
  TrainOptions train;
  ParallelOptions parallel;
  CheckpointOptions checkpoint;

  // Micro-batches per optimizer step on each data-parallel rank.
  // With parallel.balance or rebalance, a replica's own count is the trainer's (its share).
  int microbatches() const { return train.global_batch / (parallel.dp * train.micro_batch); }
  // Micro-batches per optimizer step over all data-parallel replicas.
  int total_microbatches() const { return train.global_batch / train.micro_batch; }
  GridShape grid_shape() const;
};

}  // namespace meshtrain
