#include "meshtrain/comm/mpi_communicator.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

namespace {

[[noreturn]] void unsupported(const std::string& op, DType t) {
  throw std::invalid_argument("communicator 'mpi' does not support " + op + " for dtype " +
                              std::string(dtype_name(t)));
}

void require_host(const char* op, const Tensor& t) {
  if (t.device() != Device::Cpu)
    throw std::invalid_argument(std::string("communicator 'mpi' does not support ") + op +
                                " on device buffers (use the NCCL communicator or host staging)");
}

// Element type for reductions: exact arithmetic types only.
MPI_Datatype reduce_type(const std::string& op, DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    default: unsupported(op, t);
  }
}

// Element type for data movement: any type moves as bytes of its size.
MPI_Datatype move_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

int count_of(const Tensor& t) {
  if (t.numel() > INT32_MAX)
    throw std::invalid_argument("communicator 'mpi': message of " + std::to_string(t.numel()) +
                                " elements exceeds MPI's int count; lower parallel.bucket_mb");
  return static_cast<int>(t.numel());
}

// The per-rank counts and offsets of an MPI_Ialltoallv, in rows, with the row datatype they
// count: MPI reads all of them until the operation completes, so they live as long as its Work.
struct RowExchange {
  std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
  MPI_Datatype row = MPI_DATATYPE_NULL;
  ~RowExchange() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (row != MPI_DATATYPE_NULL && !finalized) MPI_Type_free(&row);
  }
};

// Rows per peer as MPI's int counts and offsets. A block beyond int's range is refused rather
// than narrowed (a narrowed count would move the wrong rows without an error); an empty block's
// offset is not read, so it is 0 wherever its rows would start.
void rows_in_int(const std::vector<int64_t>& rows, const char* direction, const std::string& what,
                 std::vector<int>& counts, std::vector<int>& offsets) {
  const std::vector<int64_t> starts = row_block_starts(rows);
  for (size_t p = 0; p < rows.size(); ++p) {
    if (rows[p] > 0 && (rows[p] > INT32_MAX || starts[p] > INT32_MAX))
      throw std::invalid_argument(
          "communicator 'mpi': " + what + " " + direction + " " + std::to_string(rows[p]) +
          " rows from row " + std::to_string(starts[p]) + " for rank " + std::to_string(p) +
          ", beyond MPI's int count of rows (" + std::to_string(INT32_MAX) +
          "); route fewer tokens per step (lower train.micro_batch)");
    counts.push_back(static_cast<int>(rows[p]));
    offsets.push_back(rows[p] > 0 ? static_cast<int>(starts[p]) : 0);
  }
}

class MpiWork final : public Work::Impl {
 public:
  MpiWork(MPI_Request r, std::string what, std::function<void()> finish, bool patient)
      : request_(r), what_(std::move(what)), finish_(std::move(finish)), patient_(patient) {}
  bool test() override {
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    if (done && finish_) {
      finish_();
      finish_ = nullptr;
    }
    return done != 0;
  }
  std::string describe() const override { return what_; }
  bool patient() const override { return patient_; }

 private:
  MPI_Request request_;
  std::string what_;
  std::function<void()> finish_;
  bool patient_;
};

// A host fp32 copy of a bf16 tensor, for reductions in fp32.
std::shared_ptr<std::vector<float>> widened(const Tensor& t) {
  auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(t.numel()));
  const auto* in = static_cast<const uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) (*out)[static_cast<size_t>(i)] = bf16_bits_to_float(in[i]);
  return out;
}

void narrow_into(Tensor& t, const std::vector<float>& wide) {
  auto* out = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = float_to_bf16_bits(wide[static_cast<size_t>(i)]);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 std::chrono::duration<double> timeout)
    : comm_(comm), name_(std::move(name)), timeout_(timeout) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  owned_ = comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

namespace {
// The world rank of rank `r` of `comm`, for diagnoses that a user can act on.
int world_rank_of(MPI_Comm comm, int r) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int out = -1;
  MPI_Group_translate_ranks(group, 1, &r, world, &out);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}
}  // namespace

std::string MpiCommunicator::describe(const char* op, const Tensor& t) const {
  return std::string(op) + " of " + std::to_string(t.numel()) + " " +
         std::string(dtype_name(t.dtype())) + " on group '" + name_ + "' (rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

Work MpiCommunicator::make_work(MPI_Request request, std::string what,
                                std::function<void()> finish) {
  return Work(std::make_unique<MpiWork>(request, std::move(what), std::move(finish), patient_),
              timeout_);
}

void MpiCommunicator::check_supported(const std::string& op, const Tensor& t, Use use) const {
  require_host(op.c_str(), t);
  // bf16 reduces in fp32 (see the header); other dtypes only where MPI has exact arithmetic.
  if (use == Use::Reduce && t.dtype() != DType::BF16) reduce_type(op, t.dtype());
}

Work MpiCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  const std::string name = "all_reduce(" + std::string(reduce_op_name(op)) + ")";
  if (t.dtype() == DType::BF16) {
    auto wide = widened(t);
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, wide->data(), count_of(t), MPI_FLOAT, mpi_op(op), comm_, &r);
    return make_work(r, describe(name.c_str(), t) + " (in fp32)",
                     [t, wide]() mutable { narrow_into(t, *wide); });
  }
  const MPI_Datatype type = reduce_type(name, t.dtype());
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, t.raw(), count_of(t), type, mpi_op(op), comm_, &r);
  return make_work(r, describe(name.c_str(), t));
}

Work MpiCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string name = "reduce_scatter(" + std::string(reduce_op_name(op)) + ")";
  if (in.dtype() == DType::BF16) {
    auto wide_in = widened(in);
    auto wide_out = std::make_shared<std::vector<float>>(static_cast<size_t>(out.numel()));
    MPI_Request r;
    MPI_Ireduce_scatter_block(wide_in->data(), wide_out->data(), count_of(out), MPI_FLOAT,
                              mpi_op(op), comm_, &r);
    Tensor result = out;
    return make_work(r, describe(name.c_str(), in) + " (in fp32)",
                     [result, wide_in, wide_out]() mutable { narrow_into(result, *wide_out); });
  }
  const MPI_Datatype type = reduce_type(name, in.dtype());
  MPI_Request r;
  MPI_Ireduce_scatter_block(in.raw(), out.raw(), count_of(out), type, mpi_op(op), comm_, &r);
  return make_work(r, describe(name.c_str(), in));
}

Work MpiCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  MPI_Request r;
  const MPI_Datatype type = move_type(in.dtype());
  // In place when `in` already sits at this rank's slot of `out` (ZeRO parameter gathers).
  const void* send = static_cast<const char*>(out.raw()) + in.nbytes() * rank_ == in.raw()
                         ? MPI_IN_PLACE
                         : in.raw();
  MPI_Iallgather(send, count_of(in), type, out.raw(), count_of(in), type, comm_, &r);
  return make_work(r, describe("all_gather", out));
}

Work MpiCommunicator::do_broadcast(Tensor& t, int root) {
  MPI_Request r;
  MPI_Ibcast(t.raw(), count_of(t), move_type(t.dtype()), root, comm_, &r);
  return make_work(r, describe("broadcast", t));
}

Work MpiCommunicator::do_send(const Tensor& t, int dst, int tag) {
  MPI_Request r;
  MPI_Isend(t.raw(), count_of(t), move_type(t.dtype()), dst, tag, comm_, &r);
  return make_work(r, describe("send", t) + " to rank " + std::to_string(dst) + " (world rank " +
                          std::to_string(world_rank_of(comm_, dst)) + "), tag " + std::to_string(tag));
}

Work MpiCommunicator::do_recv(Tensor& t, int src, int tag) {
  MPI_Request r;
  MPI_Irecv(t.raw(), count_of(t), move_type(t.dtype()), src, tag, comm_, &r);
  return make_work(r, describe("recv", t) + " from rank " + std::to_string(src) + " (world rank " +
                          std::to_string(world_rank_of(comm_, src)) + "), tag " + std::to_string(tag));
}

Work MpiCommunicator::do_all_to_all(Tensor& out, const Tensor& in,
                                    const std::vector<int64_t>& send_rows,
                                    const std::vector<int64_t>& recv_rows) {
  const int64_t width = in.dim(1);
  const std::string what = "all_to_all of rows of " + std::to_string(width) + " " +
                           std::string(dtype_name(in.dtype())) + " on group '" + name_ +
                           "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                           "), send_rows " + row_counts_text(send_rows) + ", recv_rows " +
                           row_counts_text(recv_rows);
  if (width > INT32_MAX)
    throw std::invalid_argument("communicator 'mpi': " + what + ": a row of " +
                                std::to_string(width) + " elements exceeds MPI's int count");
  auto exchange = std::make_shared<RowExchange>();
  rows_in_int(send_rows, "sends", what, exchange->send_counts, exchange->send_offsets);
  rows_in_int(recv_rows, "receives", what, exchange->recv_counts, exchange->recv_offsets);
  MPI_Type_contiguous(static_cast<int>(width), move_type(in.dtype()), &exchange->row);
  MPI_Type_commit(&exchange->row);
  MPI_Request r;
  MPI_Ialltoallv(in.raw(), exchange->send_counts.data(), exchange->send_offsets.data(),
                 exchange->row, out.raw(), exchange->recv_counts.data(),
                 exchange->recv_offsets.data(), exchange->row, comm_, &r);
  return make_work(r, what, [exchange] {});  // holds the counts and the type until completion
}

std::vector<int64_t> MpiCommunicator::do_all_to_all_counts(const std::vector<int64_t>& send) {
  std::vector<int64_t> recv(send.size());
  const int per_peer = static_cast<int>(send.size() / static_cast<size_t>(size_));
  MPI_Request r;
  MPI_Ialltoall(send.data(), per_peer, MPI_INT64_T, recv.data(), per_peer, MPI_INT64_T, comm_, &r);
  make_work(r, "all_to_all of row counts on group '" + name_ + "' (rank " + std::to_string(rank_) +
                   " of " + std::to_string(size_) + "), sending " + row_counts_text(send))
      .wait();
  return recv;
}

void MpiCommunicator::do_barrier() {
  MPI_Request r;
  MPI_Ibarrier(comm_, &r);
  make_work(r, "barrier on group '" + name_ + "'").wait();
}

// The byte helpers run where ranks agree on decks and errors, so they wait with the timeout like
// every other operation: a rank that never arrives must not hang the others there either.
void MpiCommunicator::do_broadcast_bytes(std::string& bytes, int root) {
  unsigned long long n = bytes.size();
  MPI_Request r;
  MPI_Ibcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_, &r);
  make_work(r, "broadcast of a byte count from rank " + std::to_string(root) + " on group '" +
                   name_ + "'")
      .wait();
  bytes.resize(n);
  MPI_Ibcast(bytes.data(), static_cast<int>(n), MPI_CHAR, root, comm_, &r);
  make_work(r, "broadcast of " + std::to_string(n) + " bytes from rank " + std::to_string(root) +
                   " on group '" + name_ + "'")
      .wait();
}

std::vector<std::string> MpiCommunicator::do_all_gather_bytes(const std::string& mine) {
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(size_), displs(size_);
  MPI_Request r;
  MPI_Iallgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_, &r);
  make_work(r, "all_gather of byte counts on group '" + name_ + "'").wait();
  int total = 0;
  for (int i = 0; i < size_; ++i) {
    displs[i] = total;
    total += counts[i];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Iallgatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR,
                  comm_, &r);
  make_work(r, "all_gather of " + std::to_string(total) + " bytes on group '" + name_ + "'").wait();
  std::vector<std::string> out(size_);
  for (int i = 0; i < size_; ++i) out[i] = all.substr(displs[i], counts[i]);
  return out;
}

double MpiCommunicator::do_all_reduce_scalar(double value, ReduceOp op) {
  double out = 0;
  MPI_Request r;
  MPI_Iallreduce(&value, &out, 1, MPI_DOUBLE, mpi_op(op), comm_, &r);
  make_work(r, "scalar all_reduce(" + std::string(reduce_op_name(op)) + ") on group '" + name_ +
                   "'")
      .wait();
  return out;
}

}  // namespace meshtrain
