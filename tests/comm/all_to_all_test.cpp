// The communicator's all-to-all with per-rank row counts (expert parallelism's token dispatch)
// over MPI, under mpiexec with 1, 2 and 4 ranks: the counts' exchange, uneven blocks of every
// dtype (empty blocks, a rank that sends nothing, one that receives nothing), the round trip
// back to the sender, the flight recorder's entries, and the refusals: arguments that disagree,
// and blocks beyond MPI's int count of rows.
//
// Every rank draws the same matrix of counts (rows from rank s to rank d) from one seed, so each
// knows what all the others send. An element's value encodes (source, destination, row, column)
// as an integer below 256, exact in every dtype, so a row that lands in the wrong place shows.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/comm/recording_communicator.h"
#include "meshtrain/tensor/allocator.h"
#include "meshtrain/tensor/bf16.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

constexpr int64_t kWidth = 3;
constexpr int64_t kMostRows = 4;  // per block: with 4 ranks, 4 x 4 x 5 x 3 codes fit below 256

using Counts = std::vector<std::vector<int64_t>>;  // [source][destination]

MpiCommunicator world() {
  return MpiCommunicator(MPI_COMM_WORLD, "world", std::chrono::duration<double>(60));
}

// Unique per element for up to 4 ranks, rows below kMostRows + 1 and kWidth columns.
int code(int64_t src, int64_t dst, int64_t row, int64_t col) {
  return static_cast<int>(((src * 4 + dst) * (kMostRows + 1) + row) * kWidth + col);
}

Tensor matrix(HostAllocator& alloc, int64_t rows, DType dtype) {
  return Tensor(alloc.allocate(static_cast<size_t>(rows * kWidth) * dtype_size(dtype),
                               MemoryCategory::Activations),
                0, {rows, kWidth}, dtype);
}

void put(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32: static_cast<float*>(t.raw())[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(t.raw())[i] = v; break;
    case DType::I32: static_cast<int32_t*>(t.raw())[i] = static_cast<int32_t>(v); break;
    case DType::BF16:
      static_cast<uint16_t*>(t.raw())[i] = float_to_bf16_bits(static_cast<float>(v));
      break;
    default: FAIL() << "no test values for " << dtype_name(t.dtype());
  }
}

double get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return static_cast<const float*>(t.raw())[i];
    case DType::F64: return static_cast<const double*>(t.raw())[i];
    case DType::I32: return static_cast<const int32_t*>(t.raw())[i];
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(t.raw())[i]);
    default: return -1;
  }
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Counts from 0 to kMostRows, zeros included, the same on every rank. With `empty`, the last
// rank sends nothing and rank 0 receives nothing (at 2 or more ranks).
Counts draw_counts(int n, unsigned seed, bool empty) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> rows(0, kMostRows);
  Counts c(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(n)));
  for (auto& from : c)
    for (int64_t& x : from) x = rows(rng);
  if (empty && n > 1) {
    for (int64_t& x : c.back()) x = 0;
    for (auto& from : c) from.front() = 0;
  }
  return c;
}

void expect_moves_blocks(DType dtype, unsigned seed, bool empty) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const int n = comm.size(), me = comm.rank();
  const Counts c = draw_counts(n, seed, empty);
  const std::vector<int64_t>& send = c[static_cast<size_t>(me)];
  std::vector<int64_t> recv;
  for (int s = 0; s < n; ++s) recv.push_back(c[static_cast<size_t>(s)][static_cast<size_t>(me)]);
  ASSERT_EQ(comm.all_to_all_counts(send), recv) << "seed " << seed;

  Tensor in = matrix(alloc, sum(send), dtype);
  int64_t row = 0;
  for (int d = 0; d < n; ++d)
    for (int64_t r = 0; r < send[static_cast<size_t>(d)]; ++r, ++row)
      for (int64_t col = 0; col < kWidth; ++col) put(in, row * kWidth + col, code(me, d, r, col));
  Tensor out = matrix(alloc, sum(recv), dtype);
  for (int64_t i = 0; i < out.numel(); ++i) put(out, i, 255);  // no code: shows an unwritten row

  Work work = comm.all_to_all(out, in, send, recv);
  work.wait();
  row = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t r = 0; r < recv[static_cast<size_t>(s)]; ++r, ++row)
      for (int64_t col = 0; col < kWidth; ++col)
        ASSERT_EQ(get(out, row * kWidth + col), code(s, me, r, col))
            << dtype_name(dtype) << " seed " << seed << ": row " << r << " from rank " << s
            << ", column " << col;

  // Sent back with the counts swapped, every row returns to where it started.
  Tensor back = matrix(alloc, sum(send), dtype);
  comm.all_to_all(back, out, recv, send).wait();
  EXPECT_EQ(std::memcmp(back.raw(), in.raw(), in.nbytes()), 0) << dtype_name(dtype);
}

TEST(AllToAll, CountsReachTheRankTheyAreFor) {
  MpiCommunicator comm = world();
  const int n = comm.size(), me = comm.rank();
  std::vector<int64_t> send, expected;
  for (int p = 0; p < n; ++p) {
    // Rank 1 sends nothing to anyone; counts beyond int's range travel unchanged.
    send.push_back(me == 1 ? 0 : (int64_t{1} << 40) + 100 * me + p);
    expected.push_back(p == 1 ? 0 : (int64_t{1} << 40) + 100 * p + me);
  }
  EXPECT_EQ(comm.all_to_all_counts(send), expected);
}

std::string refusal(const std::function<void()>& call);

// Several counts per peer (an expert group's per-expert counts): block p of k counts reaches
// rank p whole and in order.
TEST(AllToAll, BlocksOfCountsReachTheRankTheyAreFor) {
  MpiCommunicator comm = world();
  const int n = comm.size(), me = comm.rank();
  constexpr int k = 3;
  std::vector<int64_t> send, expected;
  for (int p = 0; p < n; ++p)
    for (int j = 0; j < k; ++j) {
      send.push_back(1000 * me + 10 * p + j);
      expected.push_back(1000 * p + 10 * me + j);
    }
  EXPECT_EQ(comm.all_to_all_counts(send), expected);
  if (n > 1) {  // a length that is no multiple of the group's size is refused
    send.pop_back();
    EXPECT_NE(refusal([&] { comm.all_to_all_counts(send); }).find("the same number"), std::string::npos);
  }
}

TEST(AllToAll, MovesUnevenBlocksOfEveryDtypeAndBack) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I32})
    for (unsigned seed : {1u, 2u, 3u}) expect_moves_blocks(dtype, seed, seed == 3);
}

TEST(AllToAll, MovesNothingWhenNoRankSendsAnything) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const std::vector<int64_t> none(static_cast<size_t>(comm.size()), 0);
  EXPECT_EQ(comm.all_to_all_counts(none), none);
  Tensor in = matrix(alloc, 0, DType::F32), out = matrix(alloc, 0, DType::F32);
  comm.all_to_all(out, in, none, none).wait();
}

std::string refusal(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no refusal)";
}

TEST(AllToAll, RefusesArgumentsThatDoNotAgree) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const int n = comm.size(), me = comm.rank();
  const std::string where = "all_to_all on group 'world' (rank " + std::to_string(me) + " of " +
                            std::to_string(n) + ")";
  std::vector<int64_t> two(static_cast<size_t>(n), 0);
  two[static_cast<size_t>(me)] = 2;  // two rows to itself, nothing to the others
  Tensor in = matrix(alloc, 2, DType::F32), out = matrix(alloc, 2, DType::F32);

  std::string e = refusal([&] { comm.all_to_all(out, in, {2, 0, 0, 0, 0}, two); });
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_NE(e.find("needs one row count per rank of the group (" + std::to_string(n) +
                   "); got 5 in send_rows [2, 0, 0, 0, 0]"),
            std::string::npos)
      << e;

  std::vector<int64_t> three = two;
  three[static_cast<size_t>(me)] = 3;
  e = refusal([&] { comm.all_to_all(out, in, three, three); });
  EXPECT_NE(e.find("sends send_rows " + row_counts_text(three) + " but in (2, 3) has 2 rows"),
            std::string::npos)
      << e;

  Tensor out3 = matrix(alloc, 3, DType::F32);
  e = refusal([&] { comm.all_to_all(out3, in, two, three); });
  EXPECT_NE(e.find("sends itself 2 rows"), std::string::npos) << e;
  EXPECT_NE(e.find("but receives 3 from itself"), std::string::npos) << e;

  e = refusal([&] { comm.all_to_all(out3, in, two, two); });
  EXPECT_NE(e.find("receives recv_rows " + row_counts_text(two) + " but out (3, 3) has 3 rows"),
            std::string::npos)
      << e;

  std::vector<int64_t> negative = two;
  negative[0] -= 5;
  e = refusal([&] { comm.all_to_all(out, in, negative, two); });
  EXPECT_NE(e.find("negative row count in send_rows " + row_counts_text(negative)),
            std::string::npos)
      << e;

  Tensor out_f64 = matrix(alloc, 2, DType::F64);
  e = refusal([&] { comm.all_to_all(out_f64, in, two, two); });
  EXPECT_NE(e.find("needs one dtype; got in fp32 and out fp64"), std::string::npos) << e;

  Tensor narrow(alloc.allocate(8, MemoryCategory::Activations), 0, {2, 1}, DType::F32);
  e = refusal([&] { comm.all_to_all(narrow, in, two, two); });
  EXPECT_NE(e.find("needs rows of one width; got in (2, 3) and out (2, 1)"), std::string::npos)
      << e;

  Tensor flat = in.reshape({6});
  e = refusal([&] { comm.all_to_all(out, flat, two, two); });
  EXPECT_NE(e.find("moves rows of 2-D tensors (rows, width); got in (6)"), std::string::npos) << e;

  // Overlapping halves of one buffer.
  Tensor both = matrix(alloc, 3, DType::F32);
  Tensor first = both.rows(0, 2), last = both.rows(1, 3);
  e = refusal([&] { comm.all_to_all(last, first, two, two); });
  EXPECT_NE(e.find("cannot work in place"), std::string::npos) << e;

  e = refusal([&] { comm.all_to_all_counts({1}); });
  if (n == 1) {
    EXPECT_EQ(e, "(no refusal)");
  } else {
    EXPECT_NE(e.find("all_to_all_counts on group 'world'"), std::string::npos) << e;
    EXPECT_NE(e.find("needs the same number (at least one) of non-negative counts per rank of "
                     "the group; got [1]"),
              std::string::npos)
        << e;
  }
  e = refusal([&] { comm.all_to_all_counts(negative); });
  EXPECT_NE(e.find("got " + row_counts_text(negative)), std::string::npos) << e;

  // Every rank refused the same calls before communicating: the group still works.
  comm.all_to_all(out, in, two, two).wait();
}

// 2^31 rows to one peer: more than MPI's int counts, even counted in rows. The tensors are
// fake addresses (MetaAllocator): the refusal comes before any byte is read.
TEST(AllToAll, RefusesABlockBeyondMpisIntCountOfRows) {
  MpiCommunicator comm = world();
  const int n = comm.size(), me = comm.rank();
  if (n == 1) GTEST_SKIP() << "a group of one copies locally: MPI's counts are not involved";
  MetaAllocator fake(Device::Cpu);
  const int64_t rows = int64_t{1} << 31;
  const auto huge = [&] {
    return Tensor(fake.allocate(static_cast<size_t>(rows) * 4, MemoryCategory::Activations), 0,
                  {rows, 1}, DType::F32);
  };
  Tensor in = huge(), out = huge();
  std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
  send[static_cast<size_t>((me + 1) % n)] = rows;
  recv[static_cast<size_t>((me + n - 1) % n)] = rows;
  const std::string e = refusal([&] { comm.all_to_all(out, in, send, recv); });
  EXPECT_NE(e.find("sends 2147483648 rows from row 0 for rank " + std::to_string((me + 1) % n) +
                   ", beyond MPI's int count of rows (2147483647)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("lower train.micro_batch"), std::string::npos) << e;
}

// The flight recorder sees both halves of a dispatch, as collectives of the group with the bytes
// this rank sends, so that a rank stuck in one is named like a rank stuck in an all-reduce.
TEST(AllToAll, IsRecordedLikeTheOtherCollectives) {
  const int n = world().size(), me = world().rank();
  if (n == 1) GTEST_SKIP() << "a group of one is not recorded: it never waits";
  testing::TempDir dir;
  const std::string path = flight_record_path(dir.path(), me);
  {
    FlightRecorder recorder(path, me, n, 8);
    recorder.publish();
    RecordingCommunicator comm(
        std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "ep", std::chrono::duration<double>(60)),
        recorder, 0);
    HostAllocator alloc;
    const std::vector<int64_t> send(static_cast<size_t>(n), 1);
    const std::vector<int64_t> recv = comm.all_to_all_counts(send);
    Tensor in = matrix(alloc, n, DType::F64), out = matrix(alloc, n, DType::F64);
    for (int64_t i = 0; i < in.numel(); ++i) put(in, i, me);
    comm.all_to_all(out, in, send, recv).wait();
    for (int s = 0; s < n; ++s) EXPECT_EQ(get(out, s * kWidth), s);
  }
  const FlightRecord r = read_flight_record(path);
  ASSERT_EQ(r.entries.size(), 2u);
  EXPECT_EQ(r.entries[0].op, FlightOp::AllToAllCounts);
  EXPECT_EQ(r.entries[0].bytes, static_cast<uint64_t>(n) * 8);
  EXPECT_EQ(r.entries[1].op, FlightOp::AllToAll);
  EXPECT_EQ(r.entries[1].bytes, static_cast<uint64_t>(n * kWidth) * 8);
  EXPECT_EQ(r.entries[1].seq, 2u);  // the group's second collective
  for (const FlightEntry& e : r.entries) EXPECT_EQ(e.state, FlightState::Completed);
  EXPECT_EQ(r.header.groups[0].collectives_completed, 2u);
  EXPECT_EQ(flight_op_name(FlightOp::AllToAll), "all_to_all");
}

// A plan (`meshtrain plan`) runs the real code over groups that move nothing: the counts come
// back as balanced routing would have them, and the exchange completes without reading its
// tensors (fake addresses), after the same checks as a real group's.
TEST(AllToAll, APlannedGroupAssumesBalancedRoutingAndMovesNothing) {
  MetaCommunicator plan("ep", 1, 4);
  const std::vector<int64_t> send = {5, 0, 7, 2};
  EXPECT_EQ(plan.all_to_all_counts(send), send);
  MetaAllocator fake(Device::Cpu);
  const auto planned = [&](int64_t rows) {
    const auto bytes = static_cast<size_t>(rows * kWidth) * 4;
    return Tensor(fake.allocate(bytes, MemoryCategory::Activations), 0, {rows, kWidth}, DType::F32);
  };
  Tensor in = planned(14), out = planned(14);
  Work work = plan.all_to_all(out, in, send, send);
  EXPECT_FALSE(work.pending());
  const std::string e = refusal([&] { plan.all_to_all(out, in, send, {5, 1, 7, 1}); });
  EXPECT_NE(
      e.find("communicator 'meta': all_to_all on group 'ep' (rank 1 of 4) sends itself 0 rows"),
      std::string::npos)
      << e;
}

}  // namespace
}  // namespace meshtrain
