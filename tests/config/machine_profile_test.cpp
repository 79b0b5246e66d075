// Machine profiles: the text round trip, every kind of bad input refused with the file, key and
// value named, and the two cost models (GEMM rate curve, ring alpha-beta) computed by hand.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {
namespace {

const char* kPath = "machines/test.toml";

// A complete profile; `replace` swaps one line (found by its start) for another.
std::string profile_text(const std::string& find = "", const std::string& replacement = "") {
  std::string text = R"([machine]
name = "test-node"
source = "measured"
notes = "two ranks"
device = "cpu"
ranks_per_node = 2
cores_per_node = 2
threads_per_rank = 1
memory_per_rank = 12000000000

[gemm.fp32]
peak = 1e11
sizes = [64, 256, 1024]
flops = [2e10, 6e10, 1e11]

[memory]
bytes_per_s = 2e10

[link.intra_node.all_reduce]
alpha = 2e-6
bus_bytes_per_s = 5e9
)";
  if (!find.empty()) {
    const size_t at = text.find(find);
    EXPECT_NE(at, std::string::npos) << find;
    const size_t end = text.find('\n', at);
    text.replace(at, end - at, replacement);
  }
  return text;
}

std::string refusal(const std::string& text) {
  try {
    parse_machine_profile(kPath, text);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "";
}

MachineProfile full_profile() {
  MachineProfile p;
  p.name = "node \"a\"\\b";
  p.source = "measured";
  p.notes = "measured 2026-11-23\non host x, MPI: Open MPI v4.1.4\t(tab)";
  p.device = "cpu";
  p.ranks_per_node = 2;
  p.cores_per_node = 96;
  p.threads_per_rank = 3;
  p.memory_per_rank = 12345678901.0;
  p.gemm_fp32 = GemmRates{1.0 / 3.0 * 1e11, {32, 64, 1024}, {0.1 / 3.0 * 1e11, 0.2e11, 1.0 / 3.0 * 1e11}};
  p.gemm_bf16 = GemmRates{2.718281828459045e11, {64}, {1.5e11}};
  p.gemm_fp64 = GemmRates{1e10, {16, 4096}, {1e9, 1e10}};
  p.memory_bytes_per_s = 1.2345678912345e10;
  for (int c = 0; c < kCollectiveKinds; ++c) {
    p.intra_node[c] = AlphaBeta{1.2345e-6 * (c + 1), 4.1e9 / (c + 1)};
    p.inter_node[c] = AlphaBeta{0.1 + c, 1e9 / 7.0};
  }
  return p;
}

TEST(MachineProfile, RoundTripsExactly) {
  const MachineProfile p = full_profile();
  const std::string text = format_machine_profile(p);
  const MachineProfile q = parse_machine_profile(kPath, text);
  EXPECT_EQ(q.path, kPath);
  EXPECT_EQ(q.name, p.name);
  EXPECT_EQ(q.source, p.source);
  EXPECT_EQ(q.notes, p.notes);
  EXPECT_EQ(q.device, p.device);
  EXPECT_EQ(q.ranks_per_node, p.ranks_per_node);
  EXPECT_EQ(q.cores_per_node, p.cores_per_node);
  EXPECT_EQ(q.threads_per_rank, p.threads_per_rank);
  EXPECT_EQ(q.memory_per_rank, p.memory_per_rank);
  EXPECT_EQ(q.memory_bytes_per_s, p.memory_bytes_per_s);
  for (DType d : {DType::F32, DType::F64, DType::BF16}) {
    EXPECT_EQ(q.gemm(d).peak, p.gemm(d).peak) << dtype_name(d);
    EXPECT_EQ(q.gemm(d).sizes, p.gemm(d).sizes) << dtype_name(d);
    EXPECT_EQ(q.gemm(d).flops, p.gemm(d).flops) << dtype_name(d);
  }
  for (int c = 0; c < kCollectiveKinds; ++c) {
    EXPECT_EQ(q.intra_node[c]->alpha, p.intra_node[c]->alpha);
    EXPECT_EQ(q.intra_node[c]->bus_bytes_per_s, p.intra_node[c]->bus_bytes_per_s);
    EXPECT_EQ(q.inter_node[c]->alpha, p.inter_node[c]->alpha);
    EXPECT_EQ(q.inter_node[c]->bus_bytes_per_s, p.inter_node[c]->bus_bytes_per_s);
  }
  EXPECT_EQ(format_machine_profile(q), text);
}

TEST(MachineProfile, ReadsTheExampleAndLeavesAbsentPartsAbsent) {
  const MachineProfile p = parse_machine_profile(kPath, profile_text());
  EXPECT_EQ(p.name, "test-node");
  EXPECT_EQ(p.memory_per_rank, 12e9);
  EXPECT_TRUE(p.gemm_fp32.has_value());
  EXPECT_FALSE(p.gemm_bf16.has_value());
  EXPECT_FALSE(p.has_inter_node());
  EXPECT_EQ(p.link(LinkClass::IntraNode, CollectiveKind::AllReduce).alpha, 2e-6);
}

TEST(MachineProfile, LinksAreOptional) {
  std::string text = profile_text();
  text = text.substr(0, text.find("[link"));
  const MachineProfile p = parse_machine_profile(kPath, text);
  try {
    p.link(LinkClass::IntraNode, CollectiveKind::AllGather);
    FAIL() << "a profile without links priced a collective";
  } catch (const DeckError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(kPath), std::string::npos) << what;
    EXPECT_NE(what.find("no link measurements"), std::string::npos) << what;
    EXPECT_NE(what.find("2 or more ranks"), std::string::npos) << what;
  }
}

TEST(MachineProfile, MissingDTypeIsRefusedNamingWhatThereIs) {
  const MachineProfile p = parse_machine_profile(kPath, profile_text());
  try {
    p.gemm(DType::BF16);
    FAIL();
  } catch (const DeckError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[gemm.bf16]"), std::string::npos) << what;
    EXPECT_NE(what.find("it has fp32"), std::string::npos) << what;
  }
}

TEST(MachineProfile, InterNodeFallsBackToIntraNode) {
  MachineProfile p = parse_machine_profile(kPath, profile_text());
  const AlphaBeta& intra = p.link(LinkClass::IntraNode, CollectiveKind::AllReduce);
  EXPECT_EQ(&p.link(LinkClass::InterNode, CollectiveKind::AllReduce), &intra);
  p.inter_node[0] = AlphaBeta{7e-6, 1e9};
  EXPECT_TRUE(p.has_inter_node());
  EXPECT_EQ(p.link(LinkClass::InterNode, CollectiveKind::AllReduce).alpha, 7e-6);
  EXPECT_EQ(p.link(LinkClass::IntraNode, CollectiveKind::AllReduce).alpha, 2e-6);
}

// Each bad input: the replaced line, then what the message must name besides the file.
struct BadInput {
  std::string find, replacement;
  std::vector<std::string> named;
};

TEST(MachineProfile, BadInputNamesFileKeyAndValue) {
  const BadInput cases[] = {
      {"name = ", "nmae = \"x\"", {"unknown key machine.nmae", "did you mean machine.name?"}},
      {"[memory]", "[memroy]", {"unknown key memroy", "did you mean memory?"}},
      {"[gemm.fp32]", "[gemm.fp23]", {"unknown key gemm.fp23", "did you mean gemm.fp32?"}},
      {"alpha = ", "alpah = 1e-6", {"unknown key link.intra_node.all_reduce.alpah", "did you mean"}},
      {"[link.intra_node.all_reduce]", "[link.intra_node.allreduce]",
       {"link.intra_node.allreduce", "did you mean link.intra_node.all_reduce?"}},
      {"source = ", "source = \"guess\"", {"machine.source = \"guess\"", "\"measured\", \"datasheet\""}},
      {"device = ", "device = \"tpu\"", {"machine.device = \"tpu\"", "\"cpu\", \"cuda\""}},
      {"ranks_per_node = ", "ranks_per_node = 0", {"machine.ranks_per_node = 0", "an integer from 1 to 2147483647"}},
      {"ranks_per_node = ", "ranks_per_node = 2.5", {"machine.ranks_per_node = 2.5", "a float"}},
      {"cores_per_node = ", "cores_per_node = \"two\"", {"machine.cores_per_node = \"two\"", "a string"}},
      {"threads_per_rank = ", "", {"machine.threads_per_rank is missing", "an integer from 1 to 2147483647"}},
      {"memory_per_rank = ", "memory_per_rank = -1", {"machine.memory_per_rank = -1", ">= 0"}},
      {"peak = ", "peak = 0", {"gemm.fp32.peak = 0", "> 0"}},
      {"sizes = ", "sizes = [64, 64, 1024]", {"gemm.fp32.sizes = [64, 64, 1024]", "strictly increasing"}},
      {"sizes = ", "sizes = [-64, 256, 1024]", {"gemm.fp32.sizes", "-64", "> 0"}},
      {"sizes = ", "sizes = []", {"gemm.fp32.sizes = []", "is empty"}},
      {"flops = ", "flops = [2e10, 6e10]", {"gemm.fp32.flops", "has 2 entries", "3 rates"}},
      {"flops = ", "flops = [2e10, 6e10, 2e11]", {"gemm.fp32.flops", "exceeds gemm.fp32.peak"}},
      {"flops = ", "flops = [2e10, \"x\", 1e11]", {"gemm.fp32.flops", "holds a string"}},
      {"bytes_per_s = ", "bytes_per_s = nan", {"memory.bytes_per_s = nan", "out of range"}},
      {"alpha = ", "alpha = -1e-6", {"link.intra_node.all_reduce.alpha = -1e-06", ">= 0"}},
      {"bus_bytes_per_s = ", "bus_bytes_per_s = 0", {"link.intra_node.all_reduce.bus_bytes_per_s = 0", "> 0"}},
      {"[gemm.fp32]", "[other]", {"unknown key other"}},
      {"notes = ", "notes = \"unterminated", {"not valid TOML"}},
      {"threads_per_rank = ", "threads_per_rank = 1\nidle_ranks = \"sleep\"",
       {"machine.idle_ranks = \"sleep\"", "\"yield\", \"spin\""}},
      {"threads_per_rank = ", "threads_per_rank = 1\ncores_per_rank = 0",
       {"machine.cores_per_rank = 0", "an integer from 1"}},
  };
  for (const BadInput& c : cases) {
    const std::string what = refusal(profile_text(c.find, c.replacement));
    ASSERT_FALSE(what.empty()) << c.replacement << " was accepted";
    EXPECT_EQ(what.rfind(std::string(kPath) + ":", 0), 0u) << what;
    for (const std::string& n : c.named) EXPECT_NE(what.find(n), std::string::npos) << n << " in: " << what;
  }
}

TEST(MachineProfile, RequiredTablesAreNamedWhenMissing) {
  std::string text = profile_text();
  const std::string no_memory = text.substr(0, text.find("[memory]")) + text.substr(text.find("[link"));
  EXPECT_NE(refusal(no_memory).find("[memory] is missing"), std::string::npos) << refusal(no_memory);
  EXPECT_NE(refusal("").find("[machine] is missing"), std::string::npos);
  const std::string scalar_memory = "memory = 3\n" + no_memory;
  EXPECT_NE(refusal(scalar_memory).find("memory = 3 is an integer (expected a table [memory])"),
            std::string::npos) << refusal(scalar_memory);
  const std::string empty_gemm = text.substr(0, text.find("[gemm.fp32]")) + "[gemm]\n" +
                                 text.substr(text.find("[memory]"));
  EXPECT_NE(refusal(empty_gemm).find("[gemm] has no rates"), std::string::npos) << refusal(empty_gemm);
}

TEST(MachineProfile, ReadingAMissingFileSaysHowToWriteOne) {
  try {
    read_machine_profile("/nonexistent/profile.toml");
    FAIL();
  } catch (const DeckError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/profile.toml"), std::string::npos) << what;
    EXPECT_NE(what.find("--suite calibrate"), std::string::npos) << what;
  }
}

// input/machines/: datasheet-derived DGX profiles, complete (both link classes, every
// collective), each rate curve below its peak, and the newer machine faster everywhere.
TEST(MachineProfile, DatasheetProfilesRead) {
  const std::string dir = MESHTRAIN_MACHINES_DIR;
  const MachineProfile a100 = read_machine_profile(dir + "/dgx-a100-80gb.toml");
  const MachineProfile h100 = read_machine_profile(dir + "/dgx-h100.toml");
  for (const MachineProfile* p : {&a100, &h100}) {
    SCOPED_TRACE(p->path);
    EXPECT_EQ(p->source, "datasheet");
    EXPECT_EQ(p->device, "cuda");
    EXPECT_EQ(p->ranks_per_node, 8);
    EXPECT_NE(p->notes.find("ASSUMPTIONS"), std::string::npos);
    EXPECT_TRUE(p->has_inter_node());
    // all_to_all is optional: no datasheet states it, and the time model falls back (and says so).
    for (int c = 0; c < kCollectiveKinds; ++c) {
      if (static_cast<CollectiveKind>(c) == CollectiveKind::AllToAll) continue;
      EXPECT_TRUE(p->intra_node[c].has_value()) << collective_name(static_cast<CollectiveKind>(c));
      EXPECT_TRUE(p->inter_node[c].has_value()) << collective_name(static_cast<CollectiveKind>(c));
    }
    EXPECT_EQ(parse_machine_profile(p->path, format_machine_profile(*p)).notes, p->notes);
  }
  EXPECT_EQ(a100.gemm(DType::BF16).peak, 312e12);
  EXPECT_EQ(h100.gemm(DType::BF16).peak, 989e12);
  for (DType d : {DType::F32, DType::BF16})
    EXPECT_LT(h100.gemm(d).seconds(4096, 4096, 4096), a100.gemm(d).seconds(4096, 4096, 4096));
  for (LinkClass l : {LinkClass::IntraNode, LinkClass::InterNode})
    EXPECT_LT(h100.link(l, CollectiveKind::AllReduce).seconds(CollectiveKind::AllReduce, 1e9, 8),
              a100.link(l, CollectiveKind::AllReduce).seconds(CollectiveKind::AllReduce, 1e9, 8));
  // NVLink is an order of magnitude faster than one GPU's InfiniBand port.
  EXPECT_GT(h100.link(LinkClass::IntraNode, CollectiveKind::AllReduce).bus_bytes_per_s,
            5 * h100.link(LinkClass::InterNode, CollectiveKind::AllReduce).bus_bytes_per_s);
}

// The launch a profile was calibrated under (config/launch_shape.h): optional keys, so that older
// profiles stay valid; recorded, read back, and compared with a run's launch.
TEST(MachineProfile, LaunchIsOptionalAndRoundTrips) {
  const MachineProfile old = parse_machine_profile(kPath, profile_text());
  EXPECT_EQ(old.cores_per_rank, 0);
  EXPECT_EQ(old.idle_ranks, "");
  const MachineProfile p = parse_machine_profile(
      kPath, profile_text("threads_per_rank = ", "threads_per_rank = 1\ncores_per_rank = 1\nidle_ranks = \"spin\""));
  EXPECT_EQ(p.cores_per_rank, 1);
  EXPECT_EQ(p.idle_ranks, "spin");
  const MachineProfile q = parse_machine_profile(kPath, format_machine_profile(p));
  EXPECT_EQ(q.cores_per_rank, 1);
  EXPECT_EQ(q.idle_ranks, "spin");
  const LaunchShape l = q.launch();
  EXPECT_EQ(l.ranks_per_node, 2);
  EXPECT_EQ(l.cores_per_node, 2);
  EXPECT_EQ(l.threads_per_rank, 1);
  EXPECT_EQ(l.cores_per_rank, 1);
  // A datasheet describes hardware, not a launch: nothing to compare.
  const MachineProfile sheet = parse_machine_profile(kPath, profile_text("source = ", "source = \"datasheet\""));
  EXPECT_EQ(sheet.launch().ranks_per_node, 0);
}

TEST(LaunchShape, SameLaunchSaysNothing) {
  const LaunchShape a{4, 1, 2, 1, "spin"};
  EXPECT_EQ(launch_difference("p.toml", a, a), "");
  // What either side does not know is not a difference (a profile from before launches were
  // recorded; a library that does not say how it waits).
  EXPECT_EQ(launch_difference("p.toml", LaunchShape{4, 1, 2, 0, ""}, a), "");
  EXPECT_EQ(launch_difference("p.toml", a, LaunchShape{4, 1, 2, 1, ""}), "");
  EXPECT_EQ(launch_difference("p.toml", LaunchShape{}, a), "");
}

TEST(LaunchShape, EachDifferenceIsNamedBothWaysInOneLine) {
  const LaunchShape calibrated{4, 1, 2, 1, "spin"};
  // The launch's fields as plain values, made into a LaunchShape per case: an array of
  // LaunchShapes (a string inside) draws a bogus -Wmaybe-uninitialized from GCC 12.
  struct Case {
    int ranks, threads, cores, bound;
    const char* idle;
    std::vector<std::string> named;
  };
  const Case cases[] = {
      {4, 1, 2, 2, "spin", {"each rank bound to 2 cores (calibrated: 1)"}},
      {4, 1, 2, 1, "yield", {"waiting ranks yield (calibrated: spin)"}},
      {8, 1, 2, 1, "spin", {"8 ranks per node (calibrated: 4)"}},
      {4, 2, 2, 1, "spin", {"2 threads per rank (calibrated: 1)"}},
      {4, 1, 4, 1, "spin", {"4 cores per node (calibrated: 2)"}},
      {4, 1, 2, 2, "yield",
       {"each rank bound to 2 cores (calibrated: 1)", "waiting ranks yield (calibrated: spin)"}},
  };
  for (const Case& c : cases) {
    const LaunchShape now{c.ranks, c.threads, c.cores, c.bound, c.idle};
    const std::string line = launch_difference("machines/cpu.toml", calibrated, now);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_NE(line.find("machines/cpu.toml"), std::string::npos) << line;
    EXPECT_NE(line.find("predicted times assume the calibrated launch (4 ranks x 1 thread on 2 cores, each "
                        "rank bound to 1 core, waiting ranks spin)"),
              std::string::npos) << line;
    for (const std::string& n : c.named) EXPECT_NE(line.find(n), std::string::npos) << n << " in: " << line;
  }
}

TEST(GemmRates, InterpolatesInLog2AndClamps) {
  const GemmRates g{1e11, {64, 256, 1024}, {2e10, 6e10, 1e11}};
  const double flops = 2.0 * 4096 * 4096 * 1024;
  EXPECT_DOUBLE_EQ(g.seconds(4096, 4096, 1024), flops / 1e11);
  // Smallest dimension 128: halfway between 64 and 256 in log2, so halfway in rate.
  EXPECT_DOUBLE_EQ(g.seconds(128, 512, 1024), 2.0 * 128 * 512 * 1024 / 4e10);
  // 512: halfway between 256 and 1024.
  EXPECT_DOUBLE_EQ(g.seconds(2048, 512, 4096), 2.0 * 2048 * 512 * 4096 / 8e10);
  // At a size exactly.
  EXPECT_DOUBLE_EQ(g.seconds(256, 300, 400), 2.0 * 256 * 300 * 400 / 6e10);
  // Clamped below the first and above the last size.
  EXPECT_DOUBLE_EQ(g.seconds(8, 64, 64), 2.0 * 8 * 64 * 64 / 2e10);
  EXPECT_DOUBLE_EQ(g.seconds(1 << 14, 1 << 14, 1 << 14), 2.0 * std::pow(2.0, 42) / 1e11);
  EXPECT_EQ(g.seconds(0, 10, 10), 0);
  // One size: that rate everywhere.
  const GemmRates one{5e10, {128}, {4e10}};
  EXPECT_DOUBLE_EQ(one.seconds(16, 16, 16), 2.0 * 16 * 16 * 16 / 4e10);
  EXPECT_DOUBLE_EQ(one.seconds(4096, 4096, 4096), 2.0 * std::pow(4096.0, 3) / 4e10);
}

TEST(AlphaBeta, RingStepCounts) {
  const AlphaBeta ab{3e-6, 1e10};
  const double bytes = 1 << 24;
  for (int n : {2, 3, 8}) {
    EXPECT_DOUBLE_EQ(ab.seconds(CollectiveKind::AllReduce, bytes, n),
                     2.0 * (n - 1) * 3e-6 + 2.0 * (n - 1) / n * bytes / 1e10) << n;
    EXPECT_DOUBLE_EQ(ab.seconds(CollectiveKind::AllGather, bytes, n),
                     (n - 1) * 3e-6 + (n - 1.0) / n * bytes / 1e10) << n;
    EXPECT_DOUBLE_EQ(ab.seconds(CollectiveKind::ReduceScatter, bytes, n),
                     (n - 1) * 3e-6 + (n - 1.0) / n * bytes / 1e10) << n;
    EXPECT_DOUBLE_EQ(ab.seconds(CollectiveKind::PointToPoint, bytes, n), 3e-6 + bytes / 1e10) << n;
    // Each rank keeps its own block of the send buffer: (n-1)/n of it crosses the link.
    EXPECT_DOUBLE_EQ(ab.seconds(CollectiveKind::AllToAll, bytes, n),
                     (n - 1) * 3e-6 + (n - 1.0) / n * bytes / 1e10) << n;
  }
  EXPECT_EQ(ab.seconds(CollectiveKind::AllToAll, bytes, 1), 0);
  EXPECT_EQ(ab.seconds(CollectiveKind::AllReduce, bytes, 1), 0);
  EXPECT_EQ(ab.seconds(CollectiveKind::AllReduce, 0, 8), 0);
}

TEST(MachineProfile, NamesOfLinksAndCollectives) {
  EXPECT_EQ(link_class_name(LinkClass::IntraNode), "intra_node");
  EXPECT_EQ(link_class_name(LinkClass::InterNode), "inter_node");
  EXPECT_EQ(collective_name(CollectiveKind::AllReduce), "all_reduce");
  EXPECT_EQ(collective_name(CollectiveKind::AllGather), "all_gather");
  EXPECT_EQ(collective_name(CollectiveKind::ReduceScatter), "reduce_scatter");
  EXPECT_EQ(collective_name(CollectiveKind::PointToPoint), "p2p");
  EXPECT_EQ(collective_name(CollectiveKind::AllToAll), "all_to_all");
}

// all_to_all came after the other kinds: a profile written before it (the example has the
// other kinds only) still reads, and says it lacks it rather than pricing it at zero; one
// with it reads it back on its link class.
TEST(MachineProfile, AllToAllIsOptional) {
  const MachineProfile old = parse_machine_profile(kPath, profile_text());
  EXPECT_TRUE(old.has_link(LinkClass::IntraNode, CollectiveKind::AllReduce));
  EXPECT_FALSE(old.has_link(LinkClass::IntraNode, CollectiveKind::AllToAll));
  EXPECT_FALSE(old.has_link(LinkClass::InterNode, CollectiveKind::AllToAll));
  EXPECT_THROW(old.link(LinkClass::IntraNode, CollectiveKind::AllToAll), DeckError);
  const MachineProfile now = parse_machine_profile(
      kPath, profile_text() + "\n[link.intra_node.all_to_all]\nalpha = 4e-6\nbus_bytes_per_s = 3e9\n");
  EXPECT_TRUE(now.has_link(LinkClass::IntraNode, CollectiveKind::AllToAll));
  // A single-node profile prices inter-node transfers at its intra-node link.
  EXPECT_TRUE(now.has_link(LinkClass::InterNode, CollectiveKind::AllToAll));
  EXPECT_EQ(now.link(LinkClass::InterNode, CollectiveKind::AllToAll).alpha, 4e-6);
  EXPECT_EQ(now.link(LinkClass::IntraNode, CollectiveKind::AllToAll).bus_bytes_per_s, 3e9);
  EXPECT_NE(format_machine_profile(now).find("[link.intra_node.all_to_all]"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
