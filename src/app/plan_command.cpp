// `meshtrain plan DECK --world N [--all] [--memory SIZE] [--config]`: memory per rank before
// launching; --config then prints the effective configuration (what deploy checks read).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "meshtrain/app/commands.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/device_check.h"
#include "meshtrain/train/planner.h"

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
  return static_cast<size_t>(v * scale);
}

std::string pct(size_t part, size_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
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

}  // namespace

int plan_command(const PlanArgs& args) {
  MpiSession mpi;  // one process: plans need no launch, but the communicator layer wants MPI
  return run_reporting_errors([&] {
    Config config = parse_deck(args.deck, read_deck_file(args.deck), args.overrides);
    // The planned run's device, not this machine's: a login node plans a GPU job.
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
    const int threads = args.threads > 0 ? args.threads : config.run.threads > 0 ? config.run.threads : 1;
    const size_t budget = args.memory.empty() ? 0 : parse_size(args.memory);

    if (args.all) {
      std::vector<LayoutPlan> plans;
      for (const Config& c : enumerate_layouts(config, args.world)) plans.push_back(plan_layout(c, args.world, threads));
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

    const LayoutPlan plan = plan_layout(config, args.world, threads);
    const std::string why = auto_precision_reason(config, facts);
    std::printf("# plan: %s on %d ranks: %s, %s, %s%s, %d thread(s) per rank\n", args.deck.c_str(),
                args.world, plan.layout().c_str(), cuda ? "cuda" : "cpu",
                std::string(dtype_name(config.train.precision)).c_str(),
                why.empty() ? "" : (" (" + why + ")").c_str(), threads);
    if (cuda)
      std::printf("# kernels' scratch as on the CPU backend; a GPU adds the cuBLASLt workspace (32 MiB) "
                  "and cuDNN's\n");
    print_stages(plan);
    if (args.config) std::printf("# effective configuration\n%s", dump_config(plan.config).c_str());
    if (budget && plan.peak() > budget) {
      const StagePlan& worst = plan.stages[static_cast<size_t>(plan.peak_stage())];
      // Suggest the fitting layout that changes the fewest knobs of the deck's (then the
      // smallest): usually one key to edit, e.g. parallel.zero or parallel.recompute.
      const auto distance = [&](const Config& c) {
        const ParallelOptions &a = c.parallel, &b = plan.config.parallel;
        return (a.dp != b.dp) + (a.tp != b.tp) + (a.pp != b.pp) + (a.schedule != b.schedule) +
               (a.zero != b.zero) + (a.recompute != b.recompute) +
               (a.sequence_parallel != b.sequence_parallel) +
               (c.train.micro_batch != plan.config.train.micro_batch);
      };
      std::string hint;
      std::pair<int, size_t> best{1 << 20, 0};
      for (const Config& c : enumerate_layouts(config, args.world)) {
        const LayoutPlan p = plan_layout(c, args.world, threads);
        const std::pair<int, size_t> key{distance(c), p.peak()};
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
    return kExitOk;
  });
}

}  // namespace meshtrain
