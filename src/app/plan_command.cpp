// `meshtrain plan DECK --world N [--all] [--memory SIZE] [--config] [--time --profile P
// [--json] [--top K]]`: memory per rank before launching, and with --time the predicted step
// time on a machine profile (with --all: every layout ranked by it, the strategy advisor);
// --config then prints the effective configuration (what deploy checks read).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/device_check.h"
#include "meshtrain/config/machine_profile.h"
#include "meshtrain/model/model_costs.h"
#include "meshtrain/model/parameter_table.h"
#include "meshtrain/parallel/schedule.h"
#include "meshtrain/train/layout_advisor.h"
#include "meshtrain/train/planner.h"
#include "meshtrain/train/time_model.h"
#include "meshtrain/train/work_balance.h"

#include <nlohmann/json.hpp>

namespace meshtrain {

namespace {

// "16GiB", "16G" (binary, as Slurm's --mem), "16GB" (decimal), "512MiB", "1e9".
size_t parse_size(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit(end);
  double scale = 1;
  const std::string units = "KMGTP";
  if (!unit.empty()) {
    const size_t pos = units.find(static_cast<char>(std::toupper(unit[0])));
    if (pos == std::string::npos) throw DeckError("--memory " + text + ": unknown unit (use e.g. 16GiB, 16G, 16GB, 512MiB)");
    const std::string rest = unit.substr(1);
    const double base = rest == "B" ? 1000.0 : 1024.0;
    if (!rest.empty() && rest != "B" && rest != "iB" && rest != "ib")
      throw DeckError("--memory " + text + ": unknown unit (use e.g. 16GiB, 16G, 16GB, 512MiB)");
    scale = std::pow(base, static_cast<double>(pos + 1));
  }
  if (!(v > 0)) throw DeckError("--memory " + text + ": expected a positive size");
  // inf (or 1e400) would convert to size_t undefined; 2^63 bytes (8 EiB) is beyond any rank.
  const double bytes = v * scale;
  if (!std::isfinite(bytes) || bytes >= 0x1p63)
    throw DeckError("--memory " + text + ": not a size a rank can have (expected a finite "
                    "positive size below 8 EiB, e.g. 16GiB)");
  return static_cast<size_t>(bytes);
}

std::string pct(size_t part, size_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

// 671026404352 -> "671,026,404,352".
std::string grouped(int64_t n) {
  std::string text = std::to_string(n);
  for (int i = static_cast<int>(text.size()) - 3; i > 0; i -= 3) text.insert(static_cast<size_t>(i), ",");
  return text;
}

// The multi-token prediction depths' share of the count. DeepSeek's checkpoints (layer L + k)
// hold each depth with its own copies of the token embedding and the output head, which the
// depths here share with the main model: their count adds 2 V C per depth (DeepSeek-V3: 11.61B
// here, 13.46B as its checkpoints hold it, the "14B MTP module" of its model card).
void print_multi_token_module(const ModelSpec& m, int64_t with_depths) {
  ModelSpec main_model = m;
  main_model.mtp_layers = 0;
  const int64_t main = main_model.parameter_count(), depths = with_depths - main;
  const int64_t copies = static_cast<int64_t>(m.mtp_layers) * 2 * m.vocab_size * m.d_model;
  std::printf("# multi-token prediction: %d depth(s), %s parameters beyond the main model's %s; "
              "%s (%.2fB) with the embedding and head copies DeepSeek's checkpoints hold per depth\n",
              m.mtp_layers, grouped(depths).c_str(), grouped(main).c_str(), grouped(depths + copies).c_str(),
              static_cast<double>(depths + copies) / 1e9);
}

// The model's size as the published model cards give it (Llama 3 8B: 8.03B), from the
// parameter table of the layers as built: a spec that differs from the card shows here first.
void print_model(const ModelSpec& m) {
  const int64_t n = m.parameter_count();
  // A mixture of experts: the parameters one token multiplies by (top_k of each layer's experts).
  char active[64] = "";
  if (m.feed_forward == FeedForwardKind::Moe)
    std::snprintf(active, sizeof active, ", %.2fB active", m.active_parameter_count() / 1e9);
  std::printf("# model: %s, %d layers, %s parameters (%.2fB%s), %.1f GFLOP per token trained\n",
              m.family.c_str(), m.layers, grouped(n).c_str(), static_cast<double>(n) / 1e9, active,
              m.flops_per_token() / 1e9);
  if (m.mtp_layers > 0) print_multi_token_module(m, n);
}

// Generation's cache (model/generator.h) on this layout, one line per pipeline stage: each layer
// the stage holds keeps, per token of the context, its cache width on one tensor rank (the
// blocks' DecodeCacheCost: standard attention's keys and values split with their heads, latent
// attention's latent and rotary key whole on every rank) in the activation dtype. DeepSeek-V3 in
// bf16 on one stage: 576 x 2 x 61 = 70,272 bytes per token. train.sample_every generates on this
// layout; `sample` itself loads the model on one stage (the sum of these lines).
void print_sample_cache(const Config& config) {
  const ParallelOptions& p = config.parallel;
  const ModelCostSheet& sheets = model_cost_sheet(config.model);
  const std::vector<ChunkRange> chunks =
      p.partition.empty() ? default_partition(config) : explicit_partition(p.partition);
  const std::vector<int> owners = chunk_owners(p.pp, p.virtual_stages, schedule_placement(p.schedule));
  const int64_t T = config.model.seq_len;
  // Per stage: elements per token of the context, and per sequence (sliding windows bound theirs).
  std::vector<double> elements(static_cast<size_t>(p.pp), 0.0), per_sequence = elements;
  for (size_t k = 0; k < chunks.size(); ++k)
    for (int l = chunks[k].first_layer; l < chunks[k].end_layer; ++l) {
      const CostSheet& block = sheets.blocks[static_cast<size_t>(l)];
      elements[static_cast<size_t>(owners[k])] += block.decode_cache_width(p.tp);
      per_sequence[static_cast<size_t>(owners[k])] += block.decode_cache_elements(p.tp, static_cast<double>(T));
    }
  const auto bytes = static_cast<int64_t>(dtype_size(config.train.precision));
  const std::string windows =
      config.model.windowed() ? ", sliding windows keeping at most model.attention_window = " +
                                    attention_window_text(config.model.attention_window) + " tokens"
                              : "";
  for (int stage = 0; stage < p.pp; ++stage) {
    const auto per_token = static_cast<int64_t>(elements[static_cast<size_t>(stage)]) * bytes;
    const double sequence = per_sequence[static_cast<size_t>(stage)] * static_cast<double>(bytes);
    std::printf("# sample: cache of %s per sequence of seq_len %lld (%s bytes per token%s) on each "
                "rank of stage pp %d\n", format_bytes(sequence).c_str(), static_cast<long long>(T),
                grouped(per_token).c_str(), windows.c_str(), stage);
  }
}

// Under train.optimizer = "muon": which parameters Muon steps (the hidden matrices, by their
// role in the parameter table) and which AdamW does, with the names of each kind, a block's
// number written as "*" (the same names repeat in every block).
void print_optimizer_split(const ModelSpec& m) {
  struct Side {
    int64_t tensors = 0, matrices = 0, elements = 0;
    std::vector<std::string> names;
  } muon, adamw;
  for (const ParamEntry& e : parameter_table(m)) {
    const bool hidden = e.role == ParamRole::HiddenMatrix;
    Side& side = hidden ? muon : adamw;
    ++side.tensors;
    side.matrices += hidden && e.shape.rank() == 3 ? e.shape[0] : 1;
    side.elements += e.numel();
    std::string name = e.name;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1)) {
      const size_t end = name.find('.', dot + 1);
      if (end == std::string::npos) break;
      const std::string part = name.substr(dot + 1, end - dot - 1);
      if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos)
        name.replace(dot + 1, part.size(), "*");
    }
    if (std::find(side.names.begin(), side.names.end(), name) == side.names.end()) side.names.push_back(name);
  }
  const auto names = [](const Side& s) {
    std::string out;
    for (const std::string& n : s.names) out += (out.empty() ? "" : ", ") + n;
    return out;
  };
  std::printf("# optimizer: muon for %lld matrices in %lld tensors (%lld parameters): %s\n",
              static_cast<long long>(muon.matrices), static_cast<long long>(muon.tensors),
              static_cast<long long>(muon.elements), names(muon).c_str());
  std::printf("# optimizer: adamw for %lld tensors (%lld parameters): %s\n",
              static_cast<long long>(adamw.tensors), static_cast<long long>(adamw.elements),
              names(adamw).c_str());
}

void print_stages(const LayoutPlan& plan) {
  std::printf("# %-8s", "stage");
  for (size_t c = 0; c < kMemoryCategories; ++c)
    std::printf(" %12s", std::string(category_name(static_cast<MemoryCategory>(c))).c_str());
  std::printf(" %12s\n", "peak");
  for (const StagePlan& s : plan.stages) {
    std::printf("  pp %-5d", s.pp_rank);
    for (size_t c = 0; c < kMemoryCategories; ++c) std::printf(" %12s", format_bytes(static_cast<double>(s.peak[c])).c_str());
    std::printf(" %12s\n", format_bytes(static_cast<double>(s.peak_total)).c_str());
  }
  const StagePlan& worst = plan.stages[static_cast<size_t>(plan.peak_stage())];
  std::printf("# every rank of stage pp %d needs %s; at that moment %s holds %s of it\n", worst.pp_rank,
              format_bytes(static_cast<double>(worst.peak_total)).c_str(),
              std::string(category_name(worst.dominant())).c_str(),
              pct(worst.at_peak[static_cast<size_t>(worst.dominant())], worst.peak_total).c_str());
}

std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", seconds * 1e3);
  return buf;
}

// A measured profile's rates hold for the launch it was measured under; plan runs outside that
// launch, so it says which one its times assume (train compares its own launch with it).
void print_launch(const MachineProfile& profile) {
  const LaunchShape launch = profile.launch();
  if (launch.ranks_per_node == 0) return;
  std::printf("# launch: times assume the launch %s was calibrated under (%s); `train` warns when "
              "its launch differs\n", profile.path.empty() ? profile.name.c_str() : profile.path.c_str(),
              describe_launch(launch).c_str());
}

// `peak` over `limit` (bytes per rank; 0: none) is said before the times: an MFU printed bare
// for a layout that cannot run on the machine read as a layout to take (Megatron's 1T layout
// without recomputation, 125.84 GiB per rank, timed on an 80 GB A100).
void print_time(const StepTimePrediction& t, const MachineProfile& profile, size_t peak, size_t limit,
                const std::string& limit_source) {
  if (limit > 0 && peak > limit)
    std::printf("# does not fit: %s > %s per rank (%s): this layout cannot run on %s; the time below "
                "is what a step would take if it fit\n", format_bytes(static_cast<double>(peak)).c_str(),
                format_bytes(static_cast<double>(limit)).c_str(), limit_source.c_str(), profile.name.c_str());
  std::printf("# time on %s (%s, %s): %s%s\n", profile.name.c_str(), profile.source.c_str(),
              profile.path.c_str(), limit > 0 && peak > limit ? "does not fit, " : "",
              describe_prediction(t).c_str());
  std::printf("# %-8s %12s %12s %12s %12s %12s %12s\n", "stage", "compute_ms", "tp_ms", "pipeline_ms",
              "dp_exposed_ms", "optimizer_ms", "end_ms");
  for (const StageTime& s : t.stages)
    std::printf("  pp %-5d %12s %12s %12s %12s %12s %12s\n", s.pp_rank, ms(s.compute_s).c_str(),
                ms(s.tp_comm_s).c_str(), ms(s.pipeline_end_s).c_str(), ms(s.dp_exposed_s).c_str(),
                ms(s.optimizer_s).c_str(), ms(s.end_s).c_str());
  for (const std::string& c : t.caveats) std::printf("# note: %s\n", c.c_str());
  print_launch(profile);
}

nlohmann::json layout_json(const RankedLayout& r) {
  const Config& c = r.config;
  const ParallelOptions& p = c.parallel;
  const char* rc[] = {"none", "selective", "full"};
  nlohmann::json j = {{"dp", p.dp},
                      {"tp", p.tp},
                      {"pp", p.pp},
                      {"cp", p.cp},
                      {"micro_batch", c.train.micro_batch},
                      {"schedule", std::string(schedule_name(p.schedule))},
                      {"virtual_stages", p.virtual_stages},
                      {"zero", p.zero},
                      {"recompute", rc[static_cast<int>(p.recompute)]},
                      {"sequence_parallel", p.sequence_parallel && p.tp > 1},
                      {"step_ms", r.time.step_s * 1e3},
                      {"mfu", r.time.mfu},
                      {"compute_ms", r.time.compute_s * 1e3},
                      {"tp_ms", r.time.tp_comm_s * 1e3},
                      {"bubble_ms", r.time.bubble_s * 1e3},
                      {"dp_exposed_ms", r.time.dp_exposed_s * 1e3},
                      {"optimizer_ms", r.time.optimizer_s * 1e3}};
  // A mixture of experts' expert parallelism (fields absent for dense models, whose ep is 1).
  if (c.model.feed_forward == FeedForwardKind::Moe) {
    j["ep"] = p.ep;
    j["ep_ms"] = r.time.ep_comm_s * 1e3;
  }
  j["peak_bytes"] = r.planned ? nlohmann::json(r.peak_bytes) : nlohmann::json(nullptr);
  j["fits"] = r.planned ? nlohmann::json(r.fits) : nlohmann::json(nullptr);
  return j;
}

// `plan --all --time`: every layout ranked by predicted time among those that fit.
int print_ranking(const PlanArgs& args, const Config& config, const MachineProfile& profile,
                  size_t budget, int threads) {
  const AdvisorResult result = advise_layouts(config, args.world, profile, LayoutFreedom{}, budget, threads,
                                              static_cast<size_t>(args.top));
  if (args.json) {
    for (const RankedLayout& r : result.ranked) {
      if (args.top > 0 && !r.planned) break;
      std::printf("%s\n", layout_json(r).dump().c_str());
    }
    return result.fitting ? kExitOk : kExitInput;
  }
  std::printf("# plan: layouts of %s on %d ranks by predicted step time on %s (%s), memory %s per rank\n",
              args.deck.c_str(), args.world, profile.name.c_str(), profile.source.c_str(),
              budget ? format_bytes(static_cast<double>(budget)).c_str() : "unlimited");
  print_launch(profile);
  // A mixture of experts' layouts also show their exchanges' share (dense ones have none).
  const bool moe = config.model.feed_forward == FeedForwardKind::Moe;
  std::printf("# %-4s %-52s %10s %7s %11s %8s %6s%s %7s %6s %6s\n", "rank", "layout", "step_ms", "MFU", "peak",
              "compute", "tp", moe ? "     ep" : "", "bubble", "dp", "optim");
  int shown = 0;
  for (const RankedLayout& r : result.ranked) {
    if (!r.planned || (args.top > 0 && shown >= args.top)) break;
    const StepTimePrediction& t = r.time;
    const auto share = [&](double part) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%.0f%%", t.step_s > 0 ? 100 * part / t.step_s : 0.0);
      return std::string(buf);
    };
    char ep[16] = "";
    if (moe) std::snprintf(ep, sizeof ep, " %6s", share(t.ep_comm_s).c_str());
    std::printf("  %-4s %-52s %10s %6.1f%% %11s %8s %6s%s %7s %6s %6s\n",
                r.fits ? std::to_string(++shown).c_str() : "-", layout_name(r.config).c_str(), ms(t.step_s).c_str(),
                100 * t.mfu, format_bytes(static_cast<double>(r.peak_bytes)).c_str(), share(t.compute_s).c_str(),
                share(t.tp_comm_s).c_str(), ep, share(t.bubble_s).c_str(), share(t.dp_exposed_s).c_str(),
                share(t.optimizer_s).c_str());
  }
  std::printf("# %zu layouts, %zu of them simulated (the rest bounded: slower than those listed); memory "
              "planned for %zu in time order (and %zu more stopped once past the budget), %zu fit",
              result.layouts, result.predicted, result.planned, result.stopped_over_budget, result.fitting);
  if (!result.ranked.empty())
    for (const std::string& c : result.ranked.front().time.caveats) std::printf("\n# note: %s", c.c_str());
  std::printf("\n");
  if (result.fitting == 0) {
    std::fprintf(stderr, "error: %s: no layout of %d ranks fits %s per rank\n", args.deck.c_str(), args.world,
                 format_bytes(static_cast<double>(budget)).c_str());
    return kExitInput;
  }
  return kExitOk;
}

// The planned run's device, not this machine's: a login node plans a GPU job. Settles the
// config's device and precision as a run there would.
DeviceFacts planned_device(Config& config, const PlanArgs& args) {
  const bool cuda = args.device == "cuda" || (args.device.empty() && config.run.device == DeviceChoice::Cuda);
  DeviceFacts facts;
  facts.cuda_built = cuda;
  facts.devices = cuda ? 1 << 20 : 0;
  facts.local_ranks = 1;
  facts.node_gpus = {"GPU-planned"};  // one rank per GPU, as a planned GPU job runs
  // A CPU job's "auto" precision follows its CPU's bf16 instructions: taken to be this one's
  // (the header says which it chose; --set train.precision=... plans another).
  if (!cuda) facts.cpu_bf16 = cpu_bf16_instructions();
  config.run.device = cuda ? DeviceChoice::Cuda : DeviceChoice::Cpu;
  resolve_device(config, facts);
  return facts;
}

// The options that only go together.
void check_plan_options(const PlanArgs& args) {
  if ((args.json || !args.profile.empty()) && !args.time)
    throw DeckError("--json and --profile go with --time (predict the step time)");
  if (args.time && args.profile.empty())
    throw DeckError("--time needs --profile PROFILE.toml: measure this machine with `meshtrain bench "
                    "--suite calibrate --out PROFILE.toml`, or take a datasheet profile from "
                    "input/machines/ (dgx-a100-80gb.toml, dgx-h100.toml)");
  if (args.json && !args.all) throw DeckError("--json goes with --all --time (one object per layout)");
}

// A deck with "auto" layout choices: plan what `train` would take on this world.
void settle_auto_layout_for_plan(Config& config, const PlanArgs& args, const MachineProfile& profile,
                                 size_t limit, int threads) {
  refuse_impossible_auto_layout(config, args.world);
  const AutoLayoutChoice choice = choose_auto_layout(config, args.world, profile, limit, threads);
  const AdvisorResult& advice = choice.advice;
  if (!choice.config)
    throw DeckError(args.deck + ": no layout of " + std::to_string(args.world) + " ranks that its \"auto\" "
                    "choices allow fits " + format_bytes(static_cast<double>(limit)) + " per rank");
  std::printf("# \"auto\" takes %s (%s ms)", layout_name(advice.ranked[0].config).c_str(),
              ms(advice.ranked[0].time.step_s).c_str());
  if (advice.fitting > 1)
    std::printf("; runner-up %s (%s ms)", layout_name(advice.ranked[1].config).c_str(),
                ms(advice.ranked[1].time.step_s).c_str());
  std::printf("\n");
  config = *choice.config;
}

// --all: every valid layout, lowest peak first, and which fit --memory.
int print_all_layouts(const PlanArgs& args, const Config& config, int threads, size_t budget) {
  std::vector<LayoutPlan> plans = plan_layouts(enumerate_layouts(config, args.world), args.world, threads);
  std::sort(plans.begin(), plans.end(), [](const LayoutPlan& a, const LayoutPlan& b) { return a.peak() < b.peak(); });
  std::printf("# plan: every valid layout of %s on %d ranks, %d thread(s) per rank, lowest peak first\n",
              args.deck.c_str(), args.world, threads);
  std::printf("# %-52s %12s %14s %8s\n", "layout", "peak", "dominant", "fits");
  int fitting = 0;
  for (const LayoutPlan& p : plans) {
    const StagePlan& s = p.stages[static_cast<size_t>(p.peak_stage())];
    const bool fits = budget == 0 || p.peak() <= budget;
    fitting += fits ? 1 : 0;
    std::printf("  %-52s %12s %14s %8s\n", p.layout().c_str(), format_bytes(static_cast<double>(p.peak())).c_str(),
                std::string(category_name(s.dominant())).c_str(), budget == 0 ? "-" : fits ? "yes" : "no");
  }
  std::printf("# %zu layouts", plans.size());
  if (budget) std::printf(", %d fit %s", fitting, format_bytes(static_cast<double>(budget)).c_str());
  std::printf("\n");
  return budget && fitting == 0 ? kExitInput : kExitOk;
}

// Over --memory: the error names the stage, what dominates, and the fitting layout that changes
// the fewest knobs of the deck's (then the smallest): usually one key to edit, e.g. parallel.zero
// or parallel.recompute.
[[noreturn]] void refuse_over_budget(const PlanArgs& args, const Config& config, const LayoutPlan& plan,
                                     int threads, size_t budget) {
  const StagePlan& worst = plan.stages[static_cast<size_t>(plan.peak_stage())];
  const auto distance = [&](const Config& c) {
    const ParallelOptions &a = c.parallel, &b = plan.config.parallel;
    return (a.dp != b.dp) + (a.tp != b.tp) + (a.pp != b.pp) + (a.schedule != b.schedule) +
           (a.zero != b.zero) + (a.recompute != b.recompute) +
           (a.sequence_parallel != b.sequence_parallel) +
           (c.train.micro_batch != plan.config.train.micro_batch);
  };
  std::string hint;
  std::pair<int, size_t> best{1 << 20, 0};
  for (const LayoutPlan& p : plan_layouts(enumerate_layouts(config, args.world), args.world, threads)) {
    const std::pair<int, size_t> key{distance(p.config), p.peak()};
    if (p.peak() <= budget && key < best) {
      best = key;
      hint = p.layout() + " (" + format_bytes(static_cast<double>(p.peak())) + ")";
    }
  }
  throw DeckError(args.deck + ": the layout needs " + format_bytes(static_cast<double>(plan.peak())) +
                  " per rank on pipeline stage " + std::to_string(worst.pp_rank) + ", more than --memory " +
                  args.memory + "; " + std::string(category_name(worst.dominant())) + " dominates (" +
                  pct(worst.at_peak[static_cast<size_t>(worst.dominant())], worst.peak_total) +
                  ")" + (hint.empty() ? "; no layout of " + std::to_string(args.world) + " ranks fits"
                                      : "; the nearest layout that fits: " + hint));
}

}  // namespace

int plan_command(const PlanArgs& args) {
  MpiSession mpi;  // one process: plans need no launch, but the communicator layer wants MPI
  return run_reporting_errors([&] {
    Config config = parse_deck(args.deck, read_deck_file(args.deck), args.overrides);
    const DeviceFacts facts = planned_device(config, args);
    const bool cuda = config.run.device == DeviceChoice::Cuda;
    const int threads = args.threads > 0 ? args.threads : config.run.threads > 0 ? config.run.threads : 1;
    const size_t budget = args.memory.empty() ? 0 : parse_size(args.memory);
    check_plan_options(args);
    std::optional<MachineProfile> profile;
    size_t limit = 0;  // what --time holds a layout to: --memory, else the profile's memory per rank
    if (args.time) {
      profile = read_machine_profile(args.profile);
      // Without --memory, the profile's memory per rank is the budget the ranking keeps to.
      limit = budget ? budget : static_cast<size_t>(std::max(0.0, profile->memory_per_rank));
      if (args.all) return print_ranking(args, config, *profile, limit, threads);
      if (config.parallel.automatic.any()) settle_auto_layout_for_plan(config, args, *profile, limit, threads);
    } else if (config.parallel.automatic.any() && !args.all) {
      throw DeckError(args.deck + " leaves layout choices to the strategy advisor (\"auto\"): plan it with "
                      "--time --profile PROFILE.toml (what `train` would take), or --all");
    }
    if (args.all) return print_all_layouts(args, config, threads, budget);

    const LayoutPlan plan = plan_layout(config, args.world, threads);
    const std::string why = auto_precision_reason(config, facts);
    std::printf("# plan: %s on %d ranks: %s, %s, %s%s, %d thread(s) per rank\n", args.deck.c_str(),
                args.world, plan.layout().c_str(), cuda ? "cuda" : "cpu",
                std::string(dtype_name(config.train.precision)).c_str(),
                why.empty() ? "" : (" (" + why + ")").c_str(), threads);
    print_model(config.model);
    if (config.train.optimizer == OptimizerKind::Muon) print_optimizer_split(config.model);
    if (cuda)
      std::printf("# kernels' scratch as on the CPU backend; a GPU adds the cuBLASLt workspace (32 MiB) "
                  "and cuDNN's\n");
    print_stages(plan);
    print_sample_cache(plan.config);
    if (profile)
      print_time(predict_step_time(plan.config, *profile), *profile, plan.peak(), limit,
                 budget ? "--memory " + args.memory : "the profile's memory_per_rank");
    if (args.config) std::printf("# effective configuration\n%s", dump_config(plan.config).c_str());
    if (budget && plan.peak() > budget) refuse_over_budget(args, config, plan, threads, budget);
    return kExitOk;
  });
}

}  // namespace meshtrain
