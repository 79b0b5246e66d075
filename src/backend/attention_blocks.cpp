// Ring-attention blocks (backend.h): the front's checks of a block's geometry and of
// copy_columns, and the Backend defaults — devices without these kernels refuse context
// parallelism by name, and copy_columns copies row by row.

#include <cmath>
#include <stdexcept>
#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::OpContract;
using contract::str;

namespace {

// The checks both passes share: qkv (B * Tq, NH HS + KVH HS + KVH HV), kv (B * Tk, KVH HS +
// KVH HV), the block's rows inside them, out-like tensors (B * Tq, NH HV) and lse (B, NH, Tq).
// Messages name the op, the value and the expectation.
void check_block(const OpContract& c, const Tensor& qkv, const Tensor& kv, const Tensor& out,
                 const char* out_name, const Tensor& lse, int64_t B, const AttentionDims& d,
                 const Backend::AttentionBlock& blk) {
  const int64_t NH = d.NH, KVH = d.KVH, HS = d.HS, HV = d.value_size();
  if (B <= 0 || NH <= 0 || KVH <= 0 || HS <= 0 || d.HV < 0 || NH % KVH != 0)
    c.fail("B, NH, KVH, HS must be positive, HV positive or 0 (HS) and KVH must divide NH, got " +
           str(B) + ", " + str(NH) + ", " + str(KVH) + ", " + str(HS) + ", " + str(d.HV));
  if (d.window != 0)
    c.fail("a sliding window of " + str(d.window) + " keys: ring attention's blocks take none "
           "yet (model.attention_window needs parallel.cp = 1)");
  if (!(d.scale >= 0.0) || !std::isfinite(d.scale))
    c.fail("softmax scale " + contract::real(d.scale) +
           " must be finite and positive (0: 1/sqrt(HS))");
  const int64_t C = NH * HV, KC = KVH * HS, VC = KVH * HV, row = NH * HS + KC + VC;
  if (qkv.shape().rank() != 2 || qkv.dim(1) != row || qkv.dim(0) % B != 0)
    c.fail("qkv is " + qkv.shape().to_string() +
           ", expected (B * Tq, NH * HS + KVH * HS + KVH * HV) with B = " + str(B) +
           ", NH * HS + KVH * HS + KVH * HV = " + str(row));
  if (kv.shape().rank() != 2 || kv.dim(1) != KC + VC || kv.dim(0) % B != 0)
    c.fail("kv is " + kv.shape().to_string() +
           ", expected (B * Tk, KVH * HS + KVH * HV) with B = " + str(B) +
           ", KVH * HS + KVH * HV = " + str(KC + VC));
  const int64_t Tq = qkv.dim(0) / B, Tk = kv.dim(0) / B;
  auto range = [&](const char* what, int64_t begin, int64_t count, int64_t T) {
    if (begin < 0 || count < 0 || begin + count > T)
      c.fail(std::string(what) + " rows [" + str(begin) + ", " + str(begin + count) +
             ") are outside the sequence of " + str(T) + " rows");
  };
  range("query", blk.q_begin, blk.rows, Tq);
  range("key", blk.k_begin, blk.keys, Tk);
  if (blk.causal && blk.rows != blk.keys)
    c.fail("a causal block is square: rows = " + str(blk.rows) + ", keys = " + str(blk.keys));
  if (blk.rows > 0 && blk.keys <= 0)
    c.fail(str(blk.rows) + " query rows against no keys have no softmax");
  const Shape rows_c{B * Tq, C};
  if (out.shape() != rows_c)
    c.fail(std::string(out_name) + " is " + out.shape().to_string() +
           ", expected (B * Tq, NH * HV) = " + rows_c.to_string());
  if (lse.shape() != Shape{B, NH, Tq})
    c.fail("lse is " + lse.shape().to_string() +
           ", expected (B, NH, Tq) = " + Shape{B, NH, Tq}.to_string());
  const DType a = qkv.dtype();
  c.same_dtype(a, "kv", kv);
  c.same_dtype(a, out_name, out);
  c.wide_stat(a, "lse", lse);
  c.on_device({&qkv, &kv, &out, &lse});
  c.computes_in(a);
}

[[noreturn]] void refuse(const std::string& backend, const char* op) {
  throw std::invalid_argument("backend '" + backend + "' does not support " + op +
                              " (ring attention: context parallelism, parallel.cp > 1)");
}

}  // namespace

void Backend::attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                                      int64_t B, const AttentionDims& dims,
                                      const AttentionBlock& block, const Tensor* document_starts) {
  const OpContract c(*this, "attention_block_forward");
  check_block(c, qkv, kv, out, "out", lse, B, dims, block);
  contract::check_document_starts(c, document_starts, qkv.dim(0));
  do_attention_block_forward(out, lse, qkv, kv, B, dims, block, document_starts);
}

void Backend::attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout,
                                       const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                       const Tensor& kv, int64_t B, const AttentionDims& dims,
                                       const AttentionBlock& block,
                                       const Tensor* document_starts) {
  const OpContract c(*this, "attention_block_backward");
  check_block(c, qkv, kv, out, "out", lse, B, dims, block);
  contract::check_document_starts(c, document_starts, qkv.dim(0));
  if (dout.shape() != out.shape())
    c.fail("dout is " + dout.shape().to_string() + ", expected out's " + out.shape().to_string());
  if (dqkv.shape() != qkv.shape())
    c.fail("dqkv is " + dqkv.shape().to_string() + ", expected qkv's " + qkv.shape().to_string());
  if (dkv.shape() != kv.shape())
    c.fail("dkv is " + dkv.shape().to_string() + ", expected kv's " + kv.shape().to_string());
  const DType a = qkv.dtype();
  c.same_dtype(a, "dqkv", dqkv);
  c.same_dtype(a, "dkv", dkv);
  c.same_dtype(a, "dout", dout);
  c.on_device({&dqkv, &dkv, &dout});
  do_attention_block_backward(dqkv, dkv, dout, out, lse, qkv, kv, B, dims, block,
                              document_starts);
}

void Backend::copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                           int64_t cols) {
  const OpContract c(*this, "copy_columns");
  const bool matrices = dst.shape().rank() == 2 && src.shape().rank() == 2;
  if (!matrices || src.dim(0) != dst.dim(0) || dst_col < 0 || src_col < 0 || cols < 0 ||
      dst_col + cols > dst.dim(1) || src_col + cols > src.dim(1))
    c.fail(str(cols) + " columns from " + str(src_col) + " of " + src.shape().to_string() + " to " +
           str(dst_col) + " of " + dst.shape().to_string() + " do not fit");
  c.same_dtype(src.dtype(), "dst", dst);
  c.on_device("dst", dst);
  c.on_device("src", src);
  do_copy_columns(dst, dst_col, src, src_col, cols);
}

void Backend::do_attention_block_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, int64_t,
                                         const AttentionDims&, const AttentionBlock&,
                                         const Tensor*) {
  refuse(name(), "attention_block_forward");
}

void Backend::do_attention_block_backward(Tensor&, Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const Tensor&, const Tensor&, int64_t,
                                          const AttentionDims&, const AttentionBlock&,
                                          const Tensor*) {
  refuse(name(), "attention_block_backward");
}

void Backend::do_copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                              int64_t cols) {
  if (planning()) return;
  const int64_t dst_ld = dst.dim(1), src_ld = src.dim(1);
  for (int64_t r = 0; r < dst.dim(0); ++r) {
    Tensor to = dst.view(r * dst_ld + dst_col, {cols});
    copy(to, src.view(r * src_ld + src_col, {cols}));
  }
}

}  // namespace meshtrain
