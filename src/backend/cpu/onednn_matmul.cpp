#include "onednn_matmul.h"

#include <omp.h>

#include <stdexcept>
#include <string>

namespace meshtrain::cpu {

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dt data_type(MatmulType t) { return t == MatmulType::BF16 ? dt::bf16 : dt::f32; }

// A logical (rows, cols) matrix stored row-major with row stride ld, or its transpose.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, Trans t, dt type) {
  const dims strides = t == Trans::No ? dims{ld, 1} : dims{1, ld};
  return dnnl::memory::desc({rows, cols}, type, strides);
}

}  // namespace

OneDnnMatmul::OneDnnMatmul() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

OneDnnMatmul::Entry& OneDnnMatmul::find_or_create(const Key& k) {
  if (auto it = cache_.find(k); it != cache_.end()) return it->second;
  const auto a_md = matrix(k.M, k.K, k.lda, k.ta, data_type(k.in));
  const auto b_md = matrix(k.K, k.N, k.ldb, k.tb, data_type(k.in));
  const auto c_md = matrix(k.M, k.N, k.ldc, Trans::No, dt::f32);
  const auto bias_md = k.bias ? dnnl::memory::desc({1, k.N}, dt::f32, dims{k.N, 1})
                              : dnnl::memory::desc();
  dnnl::post_ops ops;
  if (k.accumulate == Accumulate::Add) ops.append_sum(1.0f);
  if (k.epilogue == Epilogue::GeluTanh)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, bias_md, c_md), attr,
                                        engine_);
  Entry e{dnnl::matmul(pd), dnnl::memory(a_md, engine_, nullptr),
          dnnl::memory(b_md, engine_, nullptr),
          k.bias ? dnnl::memory(bias_md, engine_, nullptr) : dnnl::memory(),
          dnnl::memory(c_md, engine_, nullptr)};
  return cache_.emplace(k, std::move(e)).first->second;
}

void OneDnnMatmul::run(const GemmShape& s, MatmulType in, const void* A, const void* B,
                       const float* bias, float* C, GemmOptions o) {
  const Key key{s.ta,        s.tb,         s.M,        s.N, s.K, s.lda, s.ldb, s.ldc, in,
                bias != nullptr, o.accumulate, o.epilogue, omp_get_max_threads()};
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
    e.primitive.execute(stream_, args);
    stream_.wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error("backend 'cpu': oneDNN matmul " + s.to_string() +
                             (in == MatmulType::BF16 ? " bf16" : " fp32") + " failed: " +
                             err.what() + " (status " + std::to_string(err.status) +
                             "); ONEDNN_VERBOSE=1 shows what oneDNN tried");
  }
}

}  // namespace meshtrain::cpu
