// Machine profiles: reading (with the deck's standard of error messages), writing (exact round
// trip), and the two cost models the time model prices work with.
//
// Which parts are required: [machine] (name, source, device, ranks_per_node, cores_per_node,
// threads_per_rank; notes and memory_per_rank optional), [gemm] with at least one dtype, and
// [memory]. [link] is optional as a whole and per collective: a calibration on one rank
// measures no link, one on one node no inter-node link. What is absent is refused when asked
// for (MachineProfile::link, ::gemm), with what to run to measure it.

#include "meshtrain/config/machine_profile.h"
#include "meshtrain/io/regular_file.h"

#include "toml_value.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/nearest_name.h"

namespace meshtrain {

namespace {

constexpr CollectiveKind kCollectives[] = {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                                           CollectiveKind::ReduceScatter,
                                           CollectiveKind::PointToPoint, CollectiveKind::AllToAll};
constexpr LinkClass kLinks[] = {LinkClass::IntraNode, LinkClass::InterNode};
// GEMM tables by name, in the order they are written.
constexpr std::pair<std::string_view, DType> kGemmDTypes[] = {
    {"fp32", DType::F32}, {"fp64", DType::F64}, {"bf16", DType::BF16}};

std::optional<GemmRates>& gemm_slot(MachineProfile& p, DType d) {
  return d == DType::F64 ? p.gemm_fp64 : d == DType::BF16 ? p.gemm_bf16 : p.gemm_fp32;
}
const std::optional<GemmRates>& gemm_slot(const MachineProfile& p, DType d) {
  return gemm_slot(const_cast<MachineProfile&>(p), d);
}

std::string join(const std::vector<std::string>& names) {
  std::string all;
  for (const std::string& s : names) all += (all.empty() ? "" : ", ") + s;
  return all;
}

// The reading of one file: every error names the file and line, the dotted key, the value and
// what would be accepted.
class ProfileReader {
 public:
  explicit ProfileReader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const toml::node& at, const std::string& message) const {
    const auto line = at.source().begin.line;
    throw DeckError((line == 0 ? path_ : path_ + ":" + std::to_string(line)) + ": " + message);
  }
  [[noreturn]] void bad_value(const toml::node& n, const std::string& name,
                              const std::string& problem, const std::string& expected) const {
    fail(n, name + " = " + toml_repr(n) + " " + problem + " (expected " + expected + ")");
  }

  // Refuses keys of `table` (called `name`, "" at the top) that are not `known`.
  void refuse_unknown(const toml::table& table, const std::string& name,
                      const std::vector<std::string>& known) const {
    for (auto&& [k, node] : table) {
      const std::string key(k.str());
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      const std::string prefix = name.empty() ? "" : name + ".";
      const std::string hint = nearest_name(key, known);
      fail(node, "unknown key " + prefix + key +
                     (hint.empty() ? "" : " (did you mean " + prefix + hint + "?)") + "; keys of " +
                     (name.empty() ? "a machine profile" : "[" + name + "]") + " are " + join(known));
    }
  }

  // The sub-table `key` of `parent` (called `name`); null when absent and not required.
  const toml::table* table(const toml::table& parent, const std::string& name,
                           const std::string& key, bool required) const {
    const std::string full = name.empty() ? key : name + "." + key;
    const toml::node* n = parent.get(key);
    if (!n) {
      if (required) fail(parent, "[" + full + "] is missing (a machine profile needs it)");
      return nullptr;
    }
    if (!n->is_table()) bad_value(*n, full, "is " + toml_type_of(*n), "a table [" + full + "]");
    return n->as_table();
  }

  const toml::node* value(const toml::table& t, const std::string& name, const std::string& key,
                          const std::string& expected, bool required) const {
    const toml::node* n = t.get(key);
    if (!n && required) fail(t, name + "." + key + " is missing (expected " + expected + ")");
    return n;
  }

  static bool number_of(const toml::node& n, double& v) {
    if (n.is_floating_point()) v = n.as_floating_point()->get();
    else if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
    else return false;
    return true;
  }

  // A finite number above `lo` (or at least `lo` when `lo_inclusive`).
  double number(const toml::table& t, const std::string& name, const std::string& key,
                double lo, bool lo_inclusive, bool required, double fallback = 0) const {
    std::ostringstream expected;
    expected << "a number " << (lo_inclusive ? ">= " : "> ") << lo;
    const toml::node* n = value(t, name, key, expected.str(), required);
    if (!n) return fallback;
    double v = 0;
    if (!number_of(*n, v)) bad_value(*n, name + "." + key, "is " + toml_type_of(*n), expected.str());
    if (!std::isfinite(v) || (lo_inclusive ? v < lo : v <= lo))
      bad_value(*n, name + "." + key, "is out of range", expected.str());
    return v;
  }

  int integer(const toml::table& t, const std::string& name, const std::string& key,
              int lo) const {
    // The field is an int: the range says so rather than narrowing what lies beyond it.
    const std::string expected =
        "an integer from " + std::to_string(lo) + " to " + std::to_string(INT32_MAX);
    const toml::node* n = value(t, name, key, expected, true);
    if (!n->is_integer()) bad_value(*n, name + "." + key, "is " + toml_type_of(*n), expected);
    const int64_t v = n->as_integer()->get();
    if (v < lo || v > INT32_MAX) bad_value(*n, name + "." + key, "is out of range", expected);
    return static_cast<int>(v);
  }

  // A string; one of `choices` unless that is empty (then any non-empty string, or any string
  // when not required).
  std::string string(const toml::table& t, const std::string& name, const std::string& key,
                     const std::vector<std::string>& choices, bool required) const {
    std::string expected = "a non-empty string";
    if (!choices.empty()) {
      expected = "one of";
      for (size_t i = 0; i < choices.size(); ++i)
        expected += (i ? ", \"" : " \"") + choices[i] + "\"";
    }
    const toml::node* n = value(t, name, key, expected, required);
    if (!n) return "";
    if (!n->is_string()) bad_value(*n, name + "." + key, "is " + toml_type_of(*n), expected);
    const std::string v = n->as_string()->get();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      bad_value(*n, name + "." + key, "is not a known value", expected);
    if (required && v.empty()) bad_value(*n, name + "." + key, "is empty", expected);
    return v;
  }

  // A non-empty array of finite numbers > 0.
  std::vector<double> numbers(const toml::table& t, const std::string& name,
                              const std::string& key, const std::string& expected) const {
    const toml::node* n = value(t, name, key, expected, true);
    const toml::array* a = n->as_array();
    if (!a) bad_value(*n, name + "." + key, "is " + toml_type_of(*n), expected);
    if (a->empty()) bad_value(*n, name + "." + key, "is empty", expected);
    std::vector<double> out;
    for (const toml::node& e : *a) {
      double v = 0;
      if (!number_of(e, v)) bad_value(*n, name + "." + key, "holds " + toml_type_of(e), expected);
      if (!std::isfinite(v) || v <= 0)
        bad_value(*n, name + "." + key, "holds " + toml_repr(e) + ", out of range", expected);
      out.push_back(v);
    }
    return out;
  }

 private:
  std::string path_;
};

void read_machine(const ProfileReader& r, const toml::table& t, MachineProfile& p) {
  r.refuse_unknown(t, "machine",
                   {"name", "source", "notes", "device", "ranks_per_node", "cores_per_node",
                    "threads_per_rank", "memory_per_rank", "sync_seconds", "waiting_ranks_lend",
                    "cores_per_rank", "idle_ranks"});
  p.name = r.string(t, "machine", "name", {}, true);
  p.source = r.string(t, "machine", "source", {"measured", "datasheet"}, true);
  p.notes = r.string(t, "machine", "notes", {}, false);
  p.device = r.string(t, "machine", "device", {"cpu", "cuda"}, true);
  p.ranks_per_node = r.integer(t, "machine", "ranks_per_node", 1);
  p.cores_per_node = r.integer(t, "machine", "cores_per_node", 1);
  p.threads_per_rank = r.integer(t, "machine", "threads_per_rank", 1);
  p.memory_per_rank = r.number(t, "machine", "memory_per_rank", 0, true, false, 0);
  p.sync_seconds = r.number(t, "machine", "sync_seconds", 0, true, false, 0);
  p.waiting_ranks_lend = r.number(t, "machine", "waiting_ranks_lend", 0, true, false, 1);
  if (p.waiting_ranks_lend > 1)
    r.bad_value(*t.get("waiting_ranks_lend"), "machine.waiting_ranks_lend", "is out of range",
                "a number from 0 (waiting ranks keep their cores) to 1 (they lend them whole)");
  if (t.contains("cores_per_rank")) p.cores_per_rank = r.integer(t, "machine", "cores_per_rank", 1);
  p.idle_ranks = r.string(t, "machine", "idle_ranks", {"yield", "spin"}, false);
}

GemmRates read_gemm(const ProfileReader& r, const toml::table& t, const std::string& name) {
  r.refuse_unknown(t, name, {"peak", "sizes", "flops"});
  GemmRates g;
  g.peak = r.number(t, name, "peak", 0, false, true);
  g.sizes = r.numbers(t, name, "sizes", "strictly increasing smallest dimensions > 0");
  for (size_t i = 1; i < g.sizes.size(); ++i)
    if (g.sizes[i] <= g.sizes[i - 1])
      r.bad_value(*t.get("sizes"), name + ".sizes", "is not strictly increasing",
                  "strictly increasing smallest dimensions > 0");
  std::ostringstream expected;
  expected << g.sizes.size() << " rates in FLOP/s, one per size, each > 0 and <= peak";
  g.flops = r.numbers(t, name, "flops", expected.str());
  if (g.flops.size() != g.sizes.size())
    r.bad_value(*t.get("flops"), name + ".flops", "has " + std::to_string(g.flops.size()) +
                " entries", expected.str());
  for (double f : g.flops)
    if (f > g.peak)
      r.bad_value(*t.get("flops"), name + ".flops", "exceeds " + name + ".peak", expected.str());
  return g;
}

AlphaBeta read_alpha_beta(const ProfileReader& r, const toml::table& t, const std::string& name) {
  r.refuse_unknown(t, name, {"alpha", "bus_bytes_per_s"});
  AlphaBeta ab;
  ab.alpha = r.number(t, name, "alpha", 0, true, true);
  ab.bus_bytes_per_s = r.number(t, name, "bus_bytes_per_s", 0, false, true);
  return ab;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string exact_list(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + exact_number(values[i]);
  return out + "]";
}

std::string profile_name(const MachineProfile& p) {
  return p.path.empty() ? "machine profile \"" + p.name + "\"" : p.path;
}

}  // namespace

std::string_view link_class_name(LinkClass l) {
  return l == LinkClass::IntraNode ? "intra_node" : "inter_node";
}

std::string_view collective_name(CollectiveKind c) {
  switch (c) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::PointToPoint: return "p2p";
    case CollectiveKind::AllToAll: return "all_to_all";
  }
  return "?";
}

double AlphaBeta::seconds(CollectiveKind kind, double bytes, int ranks) const {
  if (bytes <= 0) return 0;
  if (kind == CollectiveKind::PointToPoint) return alpha + bytes / bus_bytes_per_s;
  if (ranks <= 1) return 0;  // a group of one rank moves nothing
  const double n = ranks;
  const double steps = kind == CollectiveKind::AllReduce ? 2 * (n - 1) : n - 1;
  return steps * alpha + steps / n * bytes / bus_bytes_per_s;
}

double GemmRates::seconds(double m, double n, double k) const {
  const double work = 2 * m * n * k;
  if (work <= 0) return 0;
  if (sizes.empty()) return work / peak;
  const double s = std::min({m, n, k});
  double rate = flops.front();
  if (s >= sizes.back()) {
    rate = flops.back();
  } else if (s > sizes.front()) {
    const size_t hi = std::upper_bound(sizes.begin(), sizes.end(), s) - sizes.begin();
    const double x0 = std::log2(sizes[hi - 1]), x1 = std::log2(sizes[hi]);
    const double t = (std::log2(s) - x0) / (x1 - x0);
    rate = flops[hi - 1] + t * (flops[hi] - flops[hi - 1]);
  }
  return work / rate;
}

const GemmRates& MachineProfile::gemm(DType dtype) const {
  const auto& rates = gemm_slot(*this, dtype);
  if (rates) return *rates;
  std::string have;
  for (const auto& [name, d] : kGemmDTypes)
    if (gemm_slot(*this, d)) have += (have.empty() ? "" : ", ") + std::string(name);
  throw DeckError(profile_name(*this) + ": the machine profile has no [gemm." +
                  std::string(dtype_name(dtype)) + "] rates (it has " +
                  (have.empty() ? "none" : have) +
                  "); measure them with `meshtrain bench --suite calibrate` on a machine that "
                  "computes in " + std::string(dtype_name(dtype)) + ", or add the table");
}

const AlphaBeta& MachineProfile::link(LinkClass link, CollectiveKind kind) const {
  const auto k = static_cast<size_t>(kind);
  if (link == LinkClass::InterNode && inter_node[k]) return *inter_node[k];
  if (intra_node[k]) return *intra_node[k];
  throw DeckError(profile_name(*this) + ": the machine profile has no link measurements for " +
                  std::string(collective_name(kind)) + " ([link." +
                  std::string(link_class_name(link)) + "." + std::string(collective_name(kind)) +
                  "]); run `meshtrain bench --suite calibrate` on 2 or more ranks to measure "
                  "them");
}

LaunchShape MachineProfile::launch() const {
  LaunchShape l;
  // A datasheet describes the hardware, not a launch: nothing to compare a run's launch with.
  if (source != "measured") return l;
  l.ranks_per_node = ranks_per_node;
  l.threads_per_rank = threads_per_rank;
  l.cores_per_node = cores_per_node;
  l.cores_per_rank = cores_per_rank;
  l.idle_ranks = idle_ranks;
  return l;
}

bool MachineProfile::has_link(LinkClass link, CollectiveKind kind) const {
  const auto k = static_cast<size_t>(kind);
  return (link == LinkClass::InterNode && inter_node[k].has_value()) || intra_node[k].has_value();
}

bool MachineProfile::has_inter_node() const {
  return std::any_of(inter_node.begin(), inter_node.end(), [](const auto& l) { return l.has_value(); });
}

MachineProfile parse_machine_profile(const std::string& path, const std::string& text) {
  toml::table root = parse_toml(text, path);
  const ProfileReader r(path);
  MachineProfile p;
  p.path = path;
  r.refuse_unknown(root, "", {"machine", "gemm", "memory", "link"});
  read_machine(r, *r.table(root, "", "machine", true), p);

  const toml::table& gemm = *r.table(root, "", "gemm", true);
  std::vector<std::string> dtypes;
  for (const auto& [name, d] : kGemmDTypes) dtypes.emplace_back(name);
  r.refuse_unknown(gemm, "gemm", dtypes);
  for (const auto& [name, d] : kGemmDTypes)
    if (const toml::table* t = r.table(gemm, "gemm", std::string(name), false))
      gemm_slot(p, d) = read_gemm(r, *t, "gemm." + std::string(name));
  if (gemm.empty()) r.fail(gemm, "[gemm] has no rates (expected one or more of [gemm.fp32], "
                                 "[gemm.fp64], [gemm.bf16])");

  const toml::table& memory = *r.table(root, "", "memory", true);
  r.refuse_unknown(memory, "memory", {"bytes_per_s"});
  p.memory_bytes_per_s = r.number(memory, "memory", "bytes_per_s", 0, false, true);

  if (const toml::table* link = r.table(root, "", "link", false)) {
    r.refuse_unknown(*link, "link", {"intra_node", "inter_node"});
    for (const LinkClass l : kLinks) {
      const std::string lname = "link." + std::string(link_class_name(l));
      const toml::table* lt = r.table(*link, "link", std::string(link_class_name(l)), false);
      if (!lt) continue;
      std::vector<std::string> kinds;
      for (const CollectiveKind c : kCollectives) kinds.emplace_back(collective_name(c));
      r.refuse_unknown(*lt, lname, kinds);
      auto& slots = l == LinkClass::IntraNode ? p.intra_node : p.inter_node;
      for (const CollectiveKind c : kCollectives)
        if (const toml::table* ct = r.table(*lt, lname, std::string(collective_name(c)), false))
          slots[static_cast<size_t>(c)] =
              read_alpha_beta(r, *ct, lname + "." + std::string(collective_name(c)));
    }
  }
  return p;
}

MachineProfile read_machine_profile(const std::string& path) {
  // A directory reads as empty text; a FIFO's open would block `plan --profile` forever.
  const std::string not_regular = non_regular_file_problem(
      path, "a machine profile", "a TOML file, e.g. input/machines/dgx-h100.toml");
  if (!not_regular.empty()) throw DeckError(not_regular);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DeckError(path + ": cannot read the machine profile (does the file exist? "
                    "`meshtrain bench --suite calibrate --out " + path + "` writes one)");
  std::ostringstream os;
  os << in.rdbuf();
  return parse_machine_profile(path, os.str());
}

std::string format_machine_profile(const MachineProfile& p) {
  std::ostringstream os;
  os << "# A machine profile (include/meshtrain/config/machine_profile.h): every rate is per rank.\n"
     << "[machine]\n"
     << "name = " << quoted(p.name) << "\n"
     << "source = " << quoted(p.source) << "\n"
     << "notes = " << quoted(p.notes) << "\n"
     << "device = " << quoted(p.device) << "\n"
     << "ranks_per_node = " << p.ranks_per_node << "\n"
     << "cores_per_node = " << p.cores_per_node << "\n"
     << "threads_per_rank = " << p.threads_per_rank << "\n"
     << "memory_per_rank = " << exact_number(p.memory_per_rank) << "\n"
     << "sync_seconds = " << exact_number(p.sync_seconds) << "\n"
     << "waiting_ranks_lend = " << exact_number(p.waiting_ranks_lend) << "\n";
  if (p.cores_per_rank > 0) os << "cores_per_rank = " << p.cores_per_rank << "\n";
  if (!p.idle_ranks.empty()) os << "idle_ranks = " << quoted(p.idle_ranks) << "\n";
  for (const auto& [name, d] : kGemmDTypes) {
    const auto& g = gemm_slot(p, d);
    if (!g) continue;
    os << "\n[gemm." << name << "]\n"
       << "peak = " << exact_number(g->peak) << "\n"
       << "sizes = " << exact_list(g->sizes) << "\n"
       << "flops = " << exact_list(g->flops) << "\n";
  }
  os << "\n[memory]\nbytes_per_s = " << exact_number(p.memory_bytes_per_s) << "\n";
  for (const LinkClass l : kLinks) {
    const auto& slots = l == LinkClass::IntraNode ? p.intra_node : p.inter_node;
    for (const CollectiveKind c : kCollectives) {
      const auto& ab = slots[static_cast<size_t>(c)];
      if (!ab) continue;
      os << "\n[link." << link_class_name(l) << "." << collective_name(c) << "]\n"
         << "alpha = " << exact_number(ab->alpha) << "\n"
         << "bus_bytes_per_s = " << exact_number(ab->bus_bytes_per_s) << "\n";
    }
  }
  return os.str();
}

}  // namespace meshtrain
