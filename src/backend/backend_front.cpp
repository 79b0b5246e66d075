// The Backend's public operations: each checks its call's contract (backend.h) once, here, for
// every device, then hands the call to the device's do_* hook. Shapes are checked before
// dtypes, and the dtype rules before the activation dtype, so that a call wrong in one way is
// refused for it. This file: data movement, reductions, embeddings, cross-entropy and the
// optimizer; the layers' checks are in layer_front.cpp, the ring-attention blocks' in
// attention_blocks.cpp.

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::cols_of;
using contract::OpContract;
using contract::rows_of;
using contract::shapes;
using contract::str;

namespace contract {

void OpContract::fail(const std::string& what) const {
  throw std::invalid_argument("backend '" + backend_.name() + "': " + op_ + ": " + what);
}

void OpContract::unsupported(DType t) const {
  throw std::invalid_argument("backend '" + backend_.name() + "' does not support " + op_ +
                              " for dtype " + std::string(dtype_name(t)));
}

void OpContract::wrong_dtype(DType act, const char* tensor, const Tensor& t, DType want,
                             const char* rule) const {
  std::string why = rule;
  if (why.size() >= 4 && why.compare(why.size() - 4, 4, " are") == 0)
    why += " " + std::string(dtype_name(want));
  throw std::invalid_argument("backend '" + backend_.name() + "' does not support " + op_ +
                              " for dtype " + std::string(dtype_name(act)) + ": " + tensor +
                              " is " + std::string(dtype_name(t.dtype())) + ", expected " +
                              std::string(dtype_name(want)) + " (" + why + ")");
}

void OpContract::wrong_device(const char* tensor, const Tensor& t, const char* hint) const {
  fail(std::string(tensor) + " " + t.shape().to_string() + " lives on the " +
       std::string(device_name(t.device())) + ", not where this backend computes (" + hint + ")");
}

}  // namespace contract

bool Backend::computes_in(DType activation) const {
  return activation == DType::F32 || activation == DType::F64;
}

// ---- data movement and elementwise ------------------------------------------------------

void Backend::fill(Tensor& t, double value) {
  const OpContract c(*this, "fill");
  c.on_device("t", t);
  // Integers (token buffers) and doubles (reduce_into's slots) as well as the activations.
  if (t.dtype() != DType::I32 && t.dtype() != DType::F64) c.computes_in(t.dtype());
  do_fill(t, value);
}

void Backend::copy(Tensor& dst, const Tensor& src) {
  const OpContract c(*this, "copy");
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype())
    c.fail("tensors differ: " + dst.shape().to_string() + " " +
           std::string(dtype_name(dst.dtype())) + " vs " + src.shape().to_string() + " " +
           std::string(dtype_name(src.dtype())));
  c.on_device("dst", dst);
  c.on_device("src", src);
  do_copy(dst, src);
}

void Backend::cast(Tensor& dst, const Tensor& src) {
  const OpContract c(*this, "cast");
  if (dst.numel() != src.numel())
    c.fail("element counts differ: " + dst.shape().to_string() + " vs " + src.shape().to_string());
  c.on_device("dst", dst);
  c.on_device("src", src);
  do_cast(dst, src);
}

void Backend::copy_from_host(Tensor& dst, const void* src) {
  const OpContract c(*this, "copy_from_host");
  c.on_device("dst", dst);
  // An empty tensor copies nothing, and its host side may be an empty vector's null data():
  // memcpy must not see it.
  if (dst.numel() == 0) return;
  do_copy_from_host(dst, src);
}

void Backend::copy_to_host(void* dst, const Tensor& src) {
  const OpContract c(*this, "copy_to_host");
  c.on_device("src", src);
  if (src.numel() == 0) return;  // as copy_from_host
  do_copy_to_host(dst, src);
}

void Backend::copy_from_host_async(Tensor& dst, Tensor src) {
  const OpContract c(*this, "copy_from_host_async");
  c.on_device("dst", dst);
  if (src.nbytes() != dst.nbytes() || src.device() != Device::Cpu)
    c.fail("source " + src.shape().to_string() + " " + std::string(dtype_name(src.dtype())) +
           " must be a host tensor of the destination's size " + dst.shape().to_string() + " " +
           std::string(dtype_name(dst.dtype())));
  do_copy_from_host_async(dst, std::move(src));
}

void Backend::snapshot_to_host(Tensor& dst, const Tensor& src) {
  const OpContract c(*this, "snapshot_to_host");
  c.on_device("src", src);
  if (dst.nbytes() != src.nbytes() || dst.device() != Device::Cpu)
    c.fail("destination " + dst.shape().to_string() +
           " must be a host tensor of the source's size " + src.shape().to_string());
  do_snapshot_to_host(dst, src);
}

void Backend::add_inplace(Tensor& dst, const Tensor& src) {
  const OpContract c(*this, "add_inplace");
  if (dst.numel() != src.numel())
    c.fail("size mismatch: " + shapes({{"dst", &dst}, {"src", &src}}));
  const DType a = dst.dtype();
  // A bf16 gradient into an fp32 accumulator is the one mixed case.
  if (!(a == DType::F32 && src.dtype() == DType::BF16))
    c.expect_dtype(a, "src", src, a, "src matches dst, or is bf16 into an fp32 dst");
  c.on_device("dst", dst);
  c.on_device("src", src);
  c.computes_in(a);
  do_add_inplace(dst, src);
}

void Backend::scale_inplace(Tensor& t, double factor) {
  const OpContract c(*this, "scale_inplace");
  c.on_device("t", t);
  c.computes_in(t.dtype());
  do_scale_inplace(t, factor);
}

void Backend::residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  const OpContract c(*this, "residual_forward");
  if (out.numel() != a.numel() || a.numel() != b.numel())
    c.fail("size mismatch: " + shapes({{"out", &out}, {"a", &a}, {"b", &b}}));
  const DType act = out.dtype();
  c.same_dtype(act, "a", a);
  c.same_dtype(act, "b", b);
  c.on_device({&out, &a, &b});
  c.computes_in(act);
  do_residual_forward(out, a, b);
}

double Backend::sum_squares(const Tensor& t) {
  const OpContract c(*this, "sum_squares");
  c.on_device("t", t);
  c.computes_in(t.dtype());
  return do_sum_squares(t);
}

double Backend::sum(const Tensor& t) {
  const OpContract c(*this, "sum");
  c.on_device("t", t);
  c.computes_in(t.dtype());
  return do_sum(t);
}

namespace {
// `out` holds fp64 slots [first, first + count) of a reduction of `t`.
void check_slots(const OpContract& c, const Tensor& out, int64_t first, int64_t count,
                 const Tensor& t) {
  if (out.dtype() != DType::F64 || first < 0 || count < 0 || first + count > out.numel())
    c.fail("out must be fp64 with slots [" + str(first) + ", " + str(first + count) +
           ") in range, got " + out.shape().to_string() + " " +
           std::string(dtype_name(out.dtype())));
  c.on_device("out", out);
  c.on_device("t", t);
  c.computes_in(t.dtype());
}

// Each piece inside [0, t.numel()): a piece outside would read or write past the tensor.
void check_pieces(const OpContract& c, const Tensor& t, const std::vector<FlatPiece>& pieces) {
  for (const FlatPiece& piece : pieces)
    if (piece.offset < 0 || piece.count < 0 || piece.offset + piece.count > t.numel())
      c.fail("piece [" + str(piece.offset) + ", " + str(piece.offset + piece.count) + ") outside " +
             t.shape().to_string());
}
}  // namespace

void Backend::reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) {
  const OpContract c(*this, "reduce_into");
  check_slots(c, out, slot, 1, t);
  do_reduce_into(out, slot, t, what);
}

void Backend::reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                                 const std::vector<FlatPiece>& pieces, Reduction what) {
  const OpContract c(*this, "reduce_pieces_into");
  check_slots(c, out, first_slot, static_cast<int64_t>(pieces.size()), t);
  check_pieces(c, t, pieces);
  do_reduce_pieces_into(out, first_slot, t, pieces, what);
}

// ---- embeddings ---------------------------------------------------------------------------

void Backend::embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                                int64_t vocab_begin) {
  const OpContract c(*this, "embedding_forward");
  const int64_t N = tokens.numel(), C = cols_of(table);
  if (rows_of(out) != N || cols_of(out) != C)
    c.fail("out must be (N, C) = (" + str(N) + ", " + str(C) + "), got " +
           shapes({{"out", &out}, {"tokens", &tokens}, {"table", &table}}));
  const DType a = out.dtype();
  c.same_dtype(a, "table", table);
  c.token_ids(a, "tokens", tokens);
  c.on_device({&out, &tokens, &table});
  c.computes_in(a);
  do_embedding_forward(out, tokens, table, vocab_begin);
}

void Backend::embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                                 int64_t vocab_begin) {
  const OpContract c(*this, "embedding_backward");
  const int64_t N = tokens.numel(), C = cols_of(dtable);
  if (rows_of(dout) != N || cols_of(dout) != C)
    c.fail("dout must be (N, C) = (" + str(N) + ", " + str(C) + "), got " +
           shapes({{"dout", &dout}, {"tokens", &tokens}, {"dtable", &dtable}}));
  const DType a = dout.dtype();
  c.wide_grad(a, "dtable", dtable);
  c.token_ids(a, "tokens", tokens);
  c.on_device({&dtable, &dout, &tokens});
  c.computes_in(a);
  do_embedding_backward(dtable, dout, tokens, vocab_begin);
}

void Backend::position_forward(Tensor& out, const Tensor& table, int64_t token_begin) {
  const OpContract c(*this, "position_forward");
  if (cols_of(out) != cols_of(table))
    c.fail("channel mismatch: " + shapes({{"out", &out}, {"table", &table}}));
  const DType a = out.dtype();
  c.same_dtype(a, "table", table);
  c.on_device("out", out);
  c.on_device("table", table);
  c.computes_in(a);
  do_position_forward(out, table, token_begin);
}

void Backend::position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin) {
  const OpContract c(*this, "position_backward");
  if (cols_of(dout) != cols_of(dtable))
    c.fail("channel mismatch: " + shapes({{"dtable", &dtable}, {"dout", &dout}}));
  const DType a = dout.dtype();
  c.wide_grad(a, "dtable", dtable);
  c.on_device("dtable", dtable);
  c.on_device("dout", dout);
  c.computes_in(a);
  do_position_backward(dtable, dout, token_begin);
}

// ---- vocabulary-parallel softmax cross-entropy -------------------------------------------

void Backend::crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) {
  const OpContract c(*this, "crossentropy_stats");
  const int64_t N = rows_of(logits);
  if (row_max.numel() != N || row_sumexp.numel() != N)
    c.fail("shape mismatch: " +
           shapes({{"row_max", &row_max}, {"row_sumexp", &row_sumexp}, {"logits", &logits}}));
  const DType a = logits.dtype();
  c.wide_stat(a, "row_max", row_max);
  c.wide_stat(a, "row_sumexp", row_sumexp);
  c.on_device({&row_max, &row_sumexp, &logits});
  c.computes_in(a);
  do_crossentropy_stats(row_max, row_sumexp, logits);
}

namespace {
// Operations on statistics alone: fp32 or fp64 (the statistics of bf16 logits are fp32).
void check_statistics(const OpContract& c, DType s) {
  if (s == DType::BF16) c.unsupported(s);
  c.computes_in(s);
}
}  // namespace

void Backend::crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                  const Tensor& global_max) {
  const OpContract c(*this, "crossentropy_rebase");
  if (local_max.numel() != row_sumexp.numel() || global_max.numel() != row_sumexp.numel())
    c.fail("size mismatch: " + shapes({{"row_sumexp", &row_sumexp},
                                       {"local_max", &local_max},
                                       {"global_max", &global_max}}));
  const DType s = row_sumexp.dtype();
  c.wide_stat(s, "local_max", local_max);
  c.wide_stat(s, "global_max", global_max);
  c.on_device({&row_sumexp, &local_max, &global_max});
  check_statistics(c, s);
  do_crossentropy_rebase(row_sumexp, local_max, global_max);
}

void Backend::crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                        const Tensor& targets, int64_t vocab_begin) {
  const OpContract c(*this, "crossentropy_target_logit");
  const int64_t N = rows_of(logits);
  if (target_logit.numel() != N || targets.numel() != N)
    c.fail("shape mismatch: " +
           shapes({{"target_logit", &target_logit}, {"logits", &logits}, {"targets", &targets}}));
  const DType a = logits.dtype();
  c.wide_stat(a, "target_logit", target_logit);
  c.token_ids(a, "targets", targets);
  c.on_device({&target_logit, &logits, &targets});
  c.computes_in(a);
  do_crossentropy_target_logit(target_logit, logits, targets, vocab_begin);
}

void Backend::crossentropy_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                                  const Tensor& target_logit) {
  const OpContract c(*this, "crossentropy_losses");
  const int64_t N = losses.numel();
  if (row_max.numel() != N || row_sumexp.numel() != N || target_logit.numel() != N)
    c.fail("size mismatch: " + shapes({{"losses", &losses},
                                       {"row_max", &row_max},
                                       {"row_sumexp", &row_sumexp},
                                       {"target_logit", &target_logit}}));
  const DType s = losses.dtype();
  c.wide_stat(s, "row_max", row_max);
  c.wide_stat(s, "row_sumexp", row_sumexp);
  c.wide_stat(s, "target_logit", target_logit);
  c.on_device({&losses, &row_max, &row_sumexp, &target_logit});
  check_statistics(c, s);
  do_crossentropy_losses(losses, row_max, row_sumexp, target_logit);
}

void Backend::crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                                    const Tensor& row_sumexp, const Tensor& targets,
                                    int64_t vocab_begin, double dloss) {
  const OpContract c(*this, "crossentropy_backward");
  const int64_t N = rows_of(logits);
  if (dlogits.shape() != logits.shape() || row_max.numel() != N || row_sumexp.numel() != N ||
      targets.numel() != N)
    c.fail("shape mismatch: " + shapes({{"dlogits", &dlogits},
                                        {"logits", &logits},
                                        {"row_max", &row_max},
                                        {"row_sumexp", &row_sumexp},
                                        {"targets", &targets}}));
  const DType a = logits.dtype();
  c.same_dtype(a, "dlogits", dlogits);
  c.wide_stat(a, "row_max", row_max);
  c.wide_stat(a, "row_sumexp", row_sumexp);
  c.token_ids(a, "targets", targets);
  c.on_device({&dlogits, &logits, &row_max, &row_sumexp, &targets});
  c.computes_in(a);
  do_crossentropy_backward(dlogits, logits, row_max, row_sumexp, targets, vocab_begin, dloss);
}

void Backend::crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses, const Tensor& logits,
                                             const Tensor& targets, double dloss) {
  const OpContract c(*this, "crossentropy_loss_and_backward");
  const int64_t N = rows_of(logits);
  if (dlogits.shape() != logits.shape() || losses.numel() != N || targets.numel() != N)
    c.fail("shape mismatch: " + shapes({{"dlogits", &dlogits},
                                        {"losses", &losses},
                                        {"logits", &logits},
                                        {"targets", &targets}}));
  const DType a = logits.dtype();
  c.same_dtype(a, "dlogits", dlogits);
  c.wide_stat(a, "losses", losses);
  c.token_ids(a, "targets", targets);
  c.on_device({&dlogits, &losses, &logits, &targets});
  c.computes_in(a);
  do_crossentropy_loss_and_backward(dlogits, losses, logits, targets, dloss);
}

// ---- optimizer ----------------------------------------------------------------------------

namespace {
// Master weights, gradients and moments: all fp32 or all fp64. A bf16 model's optimizer updates
// its fp32 master weights; the bf16 parameters are a cast of them (ModelState).
void check_adamw(const OpContract& c, const Tensor& param, const Tensor& grad,
                 const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  if (param.numel() != grad.numel() || param.numel() != exp_avg.numel() ||
      param.numel() != exp_avg_sq.numel())
    c.fail("size mismatch: " + shapes({{"param", &param},
                                       {"grad", &grad},
                                       {"exp_avg", &exp_avg},
                                       {"exp_avg_sq", &exp_avg_sq}}));
  const DType p = param.dtype();
  const char* rule = "master parameters, gradients and moments are fp32 (or all fp64)";
  if (p == DType::BF16) c.expect_dtype(p, "param", param, DType::F32, rule);
  c.expect_dtype(p, "grad", grad, p, rule);
  c.expect_dtype(p, "exp_avg", exp_avg, p, rule);
  c.expect_dtype(p, "exp_avg_sq", exp_avg_sq, p, rule);
  c.on_device({&param, &grad, &exp_avg, &exp_avg_sq});
  c.computes_in(p);
}
}  // namespace

void Backend::adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                           const AdamWStep& s) {
  check_adamw(OpContract(*this, "adamw_update"), param, grad, exp_avg, exp_avg_sq);
  do_adamw_update(param, grad, exp_avg, exp_avg_sq, {FlatPiece{0, param.numel()}},
                  {s.weight_decay}, s, nullptr);
}

void Backend::adamw_update_pieces(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                  Tensor& exp_avg_sq, const std::vector<FlatPiece>& pieces,
                                  const std::vector<double>& decays, const AdamWStep& s,
                                  Tensor* rounded) {
  const OpContract c(*this, "adamw_update_pieces");
  check_adamw(c, param, grad, exp_avg, exp_avg_sq);
  if (decays.size() != pieces.size())
    c.fail(str(static_cast<int64_t>(pieces.size())) + " pieces but " +
           str(static_cast<int64_t>(decays.size())) + " weight decays");
  check_pieces(c, param, pieces);
  if (rounded) {
    if (rounded->numel() != param.numel())
      c.fail("size mismatch: " + shapes({{"rounded", rounded}, {"param", &param}}));
    const char* rule = "the rounded copy of fp32 masters is bf16";
    c.expect_dtype(param.dtype(), "param", param, DType::F32, rule);
    c.expect_dtype(param.dtype(), "rounded", *rounded, DType::BF16, rule);
    c.on_device("rounded", *rounded);
  }
  do_adamw_update(param, grad, exp_avg, exp_avg_sq, pieces, decays, s, rounded);
}

}  // namespace meshtrain
