// The Backend's public layer operations (backend.h): LayerNorm, the matrix products with their
// bias, residual and GELU variants, GELU, and attention, each checking its call's contract once
// for every device before the device's do_* hook runs (the front's other operations are in
// backend_front.cpp).

#include <cmath>
#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::cols_of;
using contract::OpContract;
using contract::rows_of;
using contract::shapes;
using contract::str;

// ---- layers -------------------------------------------------------------------------------

void Backend::layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                const Tensor& weight, const Tensor& bias) {
  const OpContract c(*this, "layernorm_forward");
  const int64_t N = rows_of(inp), C = cols_of(inp);
  if (out.numel() != N * C || mean.numel() != N || rstd.numel() != N || weight.numel() != C ||
      bias.numel() != C)
    c.fail("shape mismatch for inp " + inp.shape().to_string() + ": " +
           shapes({{"out", &out},
                   {"mean", &mean},
                   {"rstd", &rstd},
                   {"weight", &weight},
                   {"bias", &bias}}));
  const DType a = inp.dtype();
  c.same_dtype(a, "out", out);
  c.same_dtype(a, "weight", weight);
  c.same_dtype(a, "bias", bias);
  c.wide_stat(a, "mean", mean);
  c.wide_stat(a, "rstd", rstd);
  c.on_device({&out, &mean, &rstd, &inp, &weight, &bias});
  c.computes_in(a);
  do_layernorm_forward(out, mean, rstd, inp, weight, bias);
}

namespace {
// layernorm_backward's checks; `residual` (layernorm_backward_add) may be null.
void check_layernorm_backward(const OpContract& c, const Tensor& dinp, const Tensor& dweight,
                              const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              const Tensor* residual) {
  const int64_t N = rows_of(inp), C = cols_of(inp);
  if (dinp.numel() != N * C || dout.numel() != N * C || dweight.numel() != C ||
      dbias.numel() != C || mean.numel() != N || rstd.numel() != N ||
      (residual != nullptr && residual->numel() != N * C))
    c.fail("shape mismatch for inp " + inp.shape().to_string() + ": " +
           shapes({{"dinp", &dinp},
                   {"dweight", &dweight},
                   {"dbias", &dbias},
                   {"dout", &dout},
                   {"mean", &mean},
                   {"rstd", &rstd},
                   {"residual", residual}}));
  const DType a = inp.dtype();
  c.same_dtype(a, "dinp", dinp);
  c.same_dtype(a, "dout", dout);
  c.same_dtype(a, "weight", weight);
  if (residual != nullptr) c.same_dtype(a, "residual", *residual);
  c.wide_grad(a, "dweight", dweight);
  c.wide_grad(a, "dbias", dbias);
  c.wide_stat(a, "mean", mean);
  c.wide_stat(a, "rstd", rstd);
  c.on_device({&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd});
  if (residual != nullptr) c.on_device("residual", *residual);
  c.computes_in(a);
}
}  // namespace

void Backend::layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                 const Tensor& rstd) {
  check_layernorm_backward(OpContract(*this, "layernorm_backward"), dinp, dweight, dbias, dout, inp,
                           weight, mean, rstd, nullptr);
  do_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, nullptr);
}

void Backend::layernorm_backward_add(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor& residual) {
  check_layernorm_backward(OpContract(*this, "layernorm_backward_add"), dinp, dweight, dbias, dout,
                           inp, weight, mean, rstd, &residual);
  do_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, &residual);
}

namespace {
// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC).
void check_matmul_forward(const OpContract& c, const Tensor& out, const Tensor& inp,
                          const Tensor& weight, const Tensor* bias) {
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  if (cols_of(weight) != C || out.numel() != N * OC || (bias && bias->numel() != OC))
    c.fail(shapes({{"inp", &inp}, {"weight", &weight}, {"out", &out}, {"bias", bias}}));
  const DType a = inp.dtype();
  c.same_dtype(a, "weight", weight);
  c.same_dtype(a, "out", out);
  if (bias) c.same_dtype(a, "bias", *bias);
  c.on_device({&out, &inp, &weight});
  if (bias) c.on_device("bias", *bias);
  c.computes_in(a);
}
}  // namespace

void Backend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                             const Tensor* bias) {
  check_matmul_forward(OpContract(*this, "matmul_forward"), out, inp, weight, bias);
  do_matmul_forward(out, inp, weight, bias, nullptr);
}

void Backend::matmul_forward_add(Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor* bias, const Tensor& residual) {
  const OpContract c(*this, "matmul_forward_add");
  check_matmul_forward(c, out, inp, weight, bias);
  if (residual.numel() != out.numel())
    c.fail("residual " + residual.shape().to_string() + " for out " + out.shape().to_string());
  c.same_dtype(inp.dtype(), "residual", residual);
  c.on_device("residual", residual);
  do_matmul_forward(out, inp, weight, bias, &residual);
}

void Backend::matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, GradWrite dweight_write) {
  const OpContract c(*this, "matmul_backward");
  // OC from dout: a weight-gradient-only call (zero-bubble schedules) may come after ZeRO-3 has
  // released the weight, which only the input gradient reads.
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = cols_of(dout);
  if (rows_of(dout) != N || (dweight && dweight->numel() != OC * C) ||
      (dinp && (dinp->numel() != N * C || weight.numel() != OC * C)) ||
      (dbias && dbias->numel() != OC))
    c.fail(shapes({{"inp", &inp},
                   {"weight", &weight},
                   {"dout", &dout},
                   {"dinp", dinp},
                   {"dweight", dweight},
                   {"dbias", dbias}}));
  const DType a = inp.dtype();
  c.same_dtype(a, "dout", dout);
  if (dinp) {
    c.same_dtype(a, "weight", weight);
    c.same_dtype(a, "dinp", *dinp);
    c.on_device("weight", weight);
    c.on_device("dinp", *dinp);
  }
  if (dweight) c.wide_grad(a, "dweight", *dweight);
  if (dbias) c.wide_grad(a, "dbias", *dbias);
  c.on_device("dout", dout);
  c.on_device("inp", inp);
  if (dweight) c.on_device("dweight", *dweight);
  if (dbias) c.on_device("dbias", *dbias);
  c.computes_in(a);
  do_matmul_backward(dinp, dweight, dbias, dout, inp, weight, dweight_write);
}

void Backend::bias_forward(Tensor& out, const Tensor& bias) {
  const OpContract c(*this, "bias_forward");
  if (cols_of(out) != bias.numel())
    c.fail("bias of " + bias.shape().to_string() + " for out " + out.shape().to_string());
  c.same_dtype(out.dtype(), "bias", bias);
  c.on_device("out", out);
  c.on_device("bias", bias);
  c.computes_in(out.dtype());
  do_bias_forward(out, bias);
}

void Backend::bias_backward(Tensor& dbias, const Tensor& dout) {
  const OpContract c(*this, "bias_backward");
  if (cols_of(dout) != dbias.numel())
    c.fail("dbias of " + dbias.shape().to_string() + " for dout " + dout.shape().to_string());
  c.wide_grad(dout.dtype(), "dbias", dbias);
  c.on_device("dbias", dbias);
  c.on_device("dout", dout);
  c.computes_in(dout.dtype());
  do_bias_backward(dbias, dout);
}

void Backend::gelu_forward(Tensor& out, const Tensor& inp) {
  const OpContract c(*this, "gelu_forward");
  if (out.shape() != inp.shape())
    c.fail("out " + out.shape().to_string() + " for inp " + inp.shape().to_string());
  c.same_dtype(inp.dtype(), "out", out);
  c.on_device("out", out);
  c.on_device("inp", inp);
  c.computes_in(inp.dtype());
  do_gelu_forward(out, inp);
}

void Backend::gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const OpContract c(*this, "gelu_backward");
  if (dinp.shape() != inp.shape() || dout.shape() != inp.shape())
    c.fail("dinp " + dinp.shape().to_string() + ", dout " + dout.shape().to_string() + " for inp " +
           inp.shape().to_string());
  c.same_dtype(inp.dtype(), "dinp", dinp);
  c.same_dtype(inp.dtype(), "dout", dout);
  c.on_device({&dinp, &inp, &dout});
  c.computes_in(inp.dtype());
  do_gelu_backward(dinp, inp, dout);
}

void Backend::matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight,
                                  const Tensor& bias) {
  const OpContract c(*this, "matmul_gelu_forward");
  check_matmul_forward(c, out, inp, weight, &bias);
  if (pre.shape() != out.shape())
    c.fail("pre " + pre.shape().to_string() + " for out " + out.shape().to_string());
  c.same_dtype(inp.dtype(), "pre", pre);
  c.on_device("pre", pre);
  do_matmul_gelu_forward(out, pre, inp, weight, bias);
}

void Backend::matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                   const Tensor& pre) {
  const OpContract c(*this, "matmul_gelu_backward");
  const int64_t N = rows_of(pre), C = cols_of(pre), OC = cols_of(dout);
  if (dpre.shape() != pre.shape() || rows_of(dout) != N || weight.numel() != OC * C)
    c.fail(shapes({{"dpre", &dpre}, {"dout", &dout}, {"weight", &weight}, {"pre", &pre}}));
  const DType a = pre.dtype();
  c.same_dtype(a, "dpre", dpre);
  c.same_dtype(a, "dout", dout);
  c.same_dtype(a, "weight", weight);
  c.on_device({&dpre, &dout, &weight, &pre});
  c.computes_in(a);
  do_matmul_gelu_backward(dpre, dout, weight, pre);
}

double AttentionDims::softmax_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(HS));
}

namespace {
// The head counts every attention operation shares: KVH key/value heads, each serving a group of
// NH / KVH query heads, query/key heads of HS, value heads of HV (0: HS), a softmax scale
// (0: 1/sqrt(HS)).
void check_heads(const OpContract& c, const AttentionDims& d) {
  if (d.NH < 1 || d.KVH < 1 || d.HS < 1 || d.NH % d.KVH != 0)
    c.fail("heads NH=" + str(d.NH) + ", key/value heads KVH=" + str(d.KVH) + ", head size HS=" +
           str(d.HS) + ": all must be positive and KVH must divide NH (KVH == NH for multi-head "
           "attention, 1 for multi-query)");
  if (d.HV < 0)
    c.fail("value head size HV=" + str(d.HV) + " must be positive (0: the head size HS=" +
           str(d.HS) + ")");
  if (!(d.scale >= 0.0) || !std::isfinite(d.scale))
    c.fail("softmax scale " + contract::real(d.scale) + " must be finite and positive (0: 1/sqrt(HS))");
}

// qkv (B, T, NH HS + KVH HS + KVH HV), `out` (B, T, NH, HV) (the output, or its gradient), the
// stash as attention_stash says.
void check_attention(const OpContract& c, const Backend& be, const Tensor& qkv,
                     const char* out_name, const Tensor& out, const Tensor& stash, int64_t B,
                     int64_t T, const AttentionDims& d) {
  check_heads(c, d);
  if (d.window < 0)
    c.fail("sliding window " + str(d.window) + " must be 0 (none) or a positive number of keys");
  const int64_t HV = d.value_size();
  if (B < 0 || T < 0 || qkv.numel() != B * T * ((d.NH + d.KVH) * d.HS + d.KVH * HV) ||
      out.numel() != B * T * d.NH * HV)
    c.fail("shape mismatch: " + shapes({{"qkv", &qkv}, {out_name, &out}}) + " for B=" + str(B) +
           " T=" + str(T) + " NH=" + str(d.NH) + " KVH=" + str(d.KVH) + " HS=" + str(d.HS) +
           " HV=" + str(HV) + " (qkv holds B * T * ((NH + KVH) * HS + KVH * HV) elements, " +
           out_name + " B * T * NH * HV)");
  const DType a = qkv.dtype();
  const Backend::AttentionStash want = be.attention_stash(B, T, d.NH, a);
  if (stash.shape() != want.shape || stash.dtype() != want.dtype)
    c.fail("stash " + stash.shape().to_string() + " " + std::string(dtype_name(stash.dtype())) +
           " is not what this backend keeps for B=" + str(B) + " T=" + str(T) + " NH=" +
           str(d.NH) + ": " + want.shape.to_string() + " " + std::string(dtype_name(want.dtype)) +
           " (allocate it as Backend::attention_stash says)");
  c.same_dtype(a, out_name, out);
  c.on_device({&qkv, &out, &stash});
  c.computes_in(a);
}
}  // namespace

Backend::AttentionStash Backend::attention_stash(int64_t B, int64_t T, int64_t NH,
                                                 DType activations) const {
  return {{B, NH, T, T}, activations};
}

void Backend::attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B,
                                int64_t T, const AttentionDims& dims,
                                const Tensor* document_starts) {
  const OpContract c(*this, "attention_forward");
  check_attention(c, *this, qkv, "out", out, stash, B, T, dims);
  contract::check_document_starts(c, document_starts, B * T);
  do_attention_forward(out, stash, qkv, B, T, dims, document_starts);
}

void Backend::attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& stash, int64_t B, int64_t T,
                                 const AttentionDims& dims, const Tensor* document_starts) {
  const OpContract c(*this, "attention_backward");
  check_attention(c, *this, qkv, "dout", dout, stash, B, T, dims);
  contract::check_document_starts(c, document_starts, B * T);
  if (out.shape() != dout.shape())
    c.fail("out " + out.shape().to_string() + " must match dout " + dout.shape().to_string() +
           " (forward's output)");
  c.same_dtype(qkv.dtype(), "out", out);
  c.on_device("out", out);
  if (dqkv.shape() != qkv.shape())
    c.fail("dqkv " + dqkv.shape().to_string() + " must match qkv " + qkv.shape().to_string());
  c.same_dtype(qkv.dtype(), "dqkv", dqkv);
  c.on_device("dqkv", dqkv);
  do_attention_backward(dqkv, dout, qkv, out, stash, B, T, dims, document_starts);
}

void Backend::attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache,
                               const Tensor& v_cache, int64_t length, double scale) {
  const OpContract c(*this, "attention_decode");
  const bool caches = k_cache.shape().rank() == 3 && v_cache.shape().rank() == 3 &&
                      v_cache.dim(0) == k_cache.dim(0) && v_cache.dim(1) == k_cache.dim(1);
  const int64_t KVH = caches ? k_cache.dim(0) : 0, T_max = caches ? k_cache.dim(1) : 0,
                HS = caches ? k_cache.dim(2) : 0, HV = caches ? v_cache.dim(2) : 0;
  const int64_t NH = HS > 0 ? q.numel() / HS : 0;
  if (!caches || length < 1 || length > T_max || HS < 1 || HV < 1 || q.numel() != NH * HS ||
      out.numel() != NH * HV || KVH < 1 || NH % KVH != 0)
    c.fail("length " + str(length) + " must be in [1, " + str(T_max) +
           "], q (NH, HS), out (NH, HV), k_cache (KVH, T_max, HS) and v_cache (KVH, T_max, HV) "
           "with KVH dividing NH; got " +
           shapes({{"out", &out}, {"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}}));
  if (!(scale >= 0.0) || !std::isfinite(scale))
    c.fail("softmax scale " + contract::real(scale) + " must be finite and positive (0: 1/sqrt(HS))");
  c.on_device({&out, &q, &k_cache, &v_cache});
  do_attention_decode(out, q, k_cache, v_cache, length,
                      AttentionDims{NH, KVH, HS, HV, scale}.softmax_scale());
}

}  // namespace meshtrain
