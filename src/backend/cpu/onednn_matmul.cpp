#include "onednn_matmul.h"

#include <omp.h>

#include <stdexcept>
#include <string>

namespace meshtrain::cpu {

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dt data_type(MatmulType t) { return t == MatmulType::BF16 ? dt::bf16 : dt::f32; }

}  // namespace

// A (rows, cols) matrix with its strides, 2-D, or 4-D under the batch dimensions.
dnnl::memory::desc matmul_operand(const MatmulGeometry& g, int64_t rows, int64_t cols,
                                  const BatchedGemmShape::Strides& st, MatmulType type) {
  if (g.batch0 == 1 && g.batch1 == 1)
    return dnnl::memory::desc({rows, cols}, data_type(type), dims{st.row, st.col});
  return dnnl::memory::desc({g.batch0, g.batch1, rows, cols}, data_type(type),
                            dims{st.batch0, st.batch1, st.row, st.col});
}

dnnl::matmul::primitive_desc matmul_primitive_desc(const dnnl::engine& engine,
                                                   const MatmulGeometry& g, MatmulType in,
                                                   MatmulType out, bool bias, float alpha,
                                                   Accumulate accumulate, Epilogue epilogue,
                                                   bool addend, dnnl::scratchpad_mode scratchpad) {
  const auto a_md = matmul_operand(g, g.M, g.K, g.a, in);
  const auto b_md = matmul_operand(g, g.K, g.N, g.b, in);
  const auto c_md = matmul_operand(g, g.M, g.N, g.c, out);
  const bool batched = g.batch0 != 1 || g.batch1 != 1;
  const auto bias_md = !bias     ? dnnl::memory::desc()
                       : batched ? dnnl::memory::desc({1, 1, 1, g.N}, dt::f32, dims{g.N, g.N, g.N, 1})
                                 : dnnl::memory::desc({1, g.N}, dt::f32, dims{g.N, 1});
  dnnl::post_ops ops;
  if (accumulate == Accumulate::Add) ops.append_sum(1.0f);
  // The addend (a whole (M, N) tensor laid out as C) joins the sum before the epilogue.
  if (addend) ops.append_binary(dnnl::algorithm::binary_add, c_md);
  if (epilogue == Epilogue::GeluTanh)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(scratchpad);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr, engine);
}

std::string matmul_failure(const MatmulGeometry& g, MatmulType in, MatmulType out,
                           const dnnl::error& err) {
  const std::string what = (g.batch0 * g.batch1 > 1 ? std::to_string(g.batch0 * g.batch1) + " x " : "") +
                           std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K);
  return "backend 'cpu': oneDNN matmul " + what + (in == MatmulType::BF16 ? " bf16" : " fp32") +
         (out == MatmulType::BF16 ? " -> bf16" : "") + " failed: " + err.what() + " (status " +
         std::to_string(err.status) + "); ONEDNN_VERBOSE=1 shows what oneDNN tried";
}

MatmulGeometry MatmulGeometry::of(const GemmShape& s) {
  MatmulGeometry g;
  g.M = s.M;
  g.N = s.N;
  g.K = s.K;
  g.a = s.ta == Trans::No ? BatchedGemmShape::Strides{0, 0, s.lda, 1} : BatchedGemmShape::Strides{0, 0, 1, s.lda};
  g.b = s.tb == Trans::No ? BatchedGemmShape::Strides{0, 0, s.ldb, 1} : BatchedGemmShape::Strides{0, 0, 1, s.ldb};
  g.c = {0, 0, s.ldc, 1};
  return g;
}

MatmulGeometry MatmulGeometry::of(const BatchedGemmShape& s) {
  return MatmulGeometry{s.batch0, s.batch1, s.M, s.N, s.K, s.a, s.b, s.c};
}

OneDnnMatmul::OneDnnMatmul() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

OneDnnMatmul::Entry& OneDnnMatmul::find_or_create(const Key& k) {
  if (auto it = cache_.find(k); it != cache_.end()) return it->second;
  const MatmulGeometry& g = k.g;
  const auto pd = matmul_primitive_desc(engine_, g, k.in, k.out, k.bias, k.alpha, k.accumulate,
                                        k.epilogue, k.addend);
  const auto a_md = pd.src_desc(), b_md = pd.weights_desc(), c_md = pd.dst_desc();
  const auto bias_md = k.bias ? pd.bias_desc() : dnnl::memory::desc();
  const auto addend_md = k.addend ? matmul_operand(g, g.M, g.N, g.c, k.out) : dnnl::memory::desc();
  Entry e{dnnl::matmul(pd), dnnl::memory(a_md, engine_, nullptr),
          dnnl::memory(b_md, engine_, nullptr),
          k.bias ? dnnl::memory(bias_md, engine_, nullptr) : dnnl::memory(),
          dnnl::memory(c_md, engine_, nullptr),
          k.addend ? dnnl::memory(addend_md, engine_, nullptr) : dnnl::memory(),
          pd.impl_info_str()};
  return cache_.emplace(k, std::move(e)).first->second;
}

void OneDnnMatmul::run(const MatmulGeometry& g, MatmulType in, MatmulType out, const void* A,
                       const void* B, const float* bias, void* C, GemmOptions o, float alpha) {
  const Key key{g,          alpha,       in, out, bias != nullptr, o.addend != nullptr,
                o.accumulate, o.epilogue, omp_get_max_threads()};
  try {
    Entry& e = find_or_create(key);
    e.a.set_data_handle(const_cast<void*>(A));
    e.b.set_data_handle(const_cast<void*>(B));
    e.c.set_data_handle(C);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}};
    if (bias) {
      e.bias.set_data_handle(const_cast<float*>(bias));
      args.emplace(DNNL_ARG_BIAS, e.bias);
    }
    if (o.addend) {
      // The post-op's index: after the sum post-op when there is one.
      const int index = o.accumulate == Accumulate::Add ? 1 : 0;
      e.addend.set_data_handle(const_cast<void*>(o.addend));
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1, e.addend);
    }
    e.primitive.execute(stream_, args);
    stream_.wait();
    last_implementation_ = e.implementation;
  } catch (const dnnl::error& err) {
    throw std::runtime_error(matmul_failure(g, in, out, err));
  }
}

}  // namespace meshtrain::cpu
