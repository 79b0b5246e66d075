// cuDNN 9 backend-API graphs for causal attention. Notation: W = (NH + 2 KVH) HS, a qkv row of
// NH query, KVH key and KVH value heads (backend.h); Q is a strided view of qkv with dims
// (B, NH, T, HS) and strides (WT, HS, W, 1), K and V the same with KVH heads (grouped-query
// attention: cuDNN's matmul broadcasts each key/value head over its NH / KVH query heads, as
// the cuDNN frontend's SDPA graphs do); K^T swaps the last two; S-shaped tensors are
// (B, NH, T, T), row vectors (B, NH, T, 1).
//
// Forward:   S = Q K^T;  S *= scale;  S = select(row >= col, S, -inf);  M = max_j S;
//            E = exp(S - M);  Z = sum_j E;  stats = M + log Z;  P = E / Z (bf16);  O = P V
// Backward:  Dsum = sum_d dO * O  (non-virtual, in the workspace);
//            S = scale Q K^T;  S -= stats;  S = select(row >= col, S, -inf);  P = exp(S);
//            dV = P^T dO;  dP = dO V^T;  dS = P (dP - Dsum) scale;  dK = dS^T Q;  dQ = dS K
// With KVH < NH, dK and dV come out per query head into fp32 buffers in the workspace ("full
// head", (B, NH, T, HS)) and a sum reduction folds each group onto its key/value head, the
// frontend's construction for grouped-query backward.
// This is the composite form that cuDNN's fused flash-attention engines match (the same node
// sequence the public cuDNN frontend emits for cuDNN 9 before 9.21); every intermediate is a
// virtual fp32 tensor except P and dS^T, which feed the second-stage matmuls as bf16.
// dQ is written directly ("dP workspace" variant, deterministic); if no engine takes that graph
// the plan falls back to the variant that accumulates dQ in an fp32 buffer and copies it out.

#include "cudnn_attention.h"

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cuda_check.h"

namespace meshtrain::cuda {

namespace {

std::string cudnn_message(cudnnStatus_t status) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string s = cudnnGetErrorString(status);
  if (detail[0]) s += std::string(": ") + detail;
  return s;
}

void check_dnn(cudnnStatus_t status, const char* op, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  fail(op, std::string(call) + " failed: " + cudnn_message(status));
}
#define DNN_CHECK(op, call) check_dnn((call), (op), #call)

// Owns one backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    DNN_CHECK("attention", cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* value, const char* what) {
    check_dnn(cudnnBackendSetAttribute(d_, name, type, count, value), "attention", what);
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
                 const char* what) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void finalize(const char* what) { check_dnn(cudnnBackendFinalize(d_), "attention", what); }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kSoftmaxSum, kOne, kDQAccum,
  kDKFullHead, kDVFullHead, kFirstVirtual = 100
};

// Collects the descriptors of one operation graph; they stay alive as long as its plan.
class Graph {
 public:
  explicit Graph(cudnnHandle_t handle) : handle_(handle) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides,
                                  bool is_virtual = false, bool by_value = false) {
    Desc& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type")
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims")
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides")
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid")
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment")
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value)
      t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    t.finalize("cudnnBackendFinalize(tensor)");
    return t.get();
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x [, b [, t]]); `prec` is the math precision; `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode")
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
      pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    pw.finalize("cudnnBackendFinalize(pointwise)");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get(), "pointwise descriptor")
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x")
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y")
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1")
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    op.finalize("cudnnBackendFinalize(pointwise operation)");
    ops_.push_back(op.get());
  }

  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    Desc& r = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
          "reduction operator")
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction precision")
        .finalize("cudnnBackendFinalize(reduction)");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get(), "reduction descriptor")
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x")
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y")
        .finalize("cudnnBackendFinalize(reduction operation)");
    ops_.push_back(op.get());
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul precision")
        .finalize("cudnnBackendFinalize(matmul)");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c")
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get(), "matmul descriptor")
        .finalize("cudnnBackendFinalize(matmul operation)");
    ops_.push_back(op.get());
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x")
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y")
        .finalize("cudnnBackendFinalize(reshape operation)");
    ops_.push_back(op.get());
  }

  // The causal mask over an S-shaped tensor: select(row >= col, s, -inf).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, Dims sdims, Dims sstrides) {
    cudnnBackendDescriptor_t row = virt(CUDNN_DATA_INT32, sdims, sstrides);
    cudnnBackendDescriptor_t col = virt(CUDNN_DATA_INT32, sdims, sstrides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
    cudnnBackendDescriptor_t keep_mask = virt(CUDNN_DATA_BOOLEAN, sdims, sstrides);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep_mask, CUDNN_DATA_BOOLEAN);
    cudnnBackendDescriptor_t masked = virt(CUDNN_DATA_FLOAT, sdims, sstrides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, scalar(kNegInf), keep_mask, masked);
    return masked;
  }

  // Finalises the operation graph and picks the first engine configuration that finalises as a
  // plan, heuristics mode A first, then the fallback list.
  std::unique_ptr<Desc> build_plan(std::string* why) {
    Desc& graph = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "graph handle")
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(ops_.size()), ops_.data(), "graph operations");
    if (cudnnStatus_t st = graph.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
      *why = "operation graph rejected: " + cudnn_message(st);
      return nullptr;
    }
    std::string last = "no engine configuration offered";
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get(), "heuristics graph")
          .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
      if (cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
        last = "heuristics failed: " + cudnn_message(st);
        continue;
      }
      int64_t count = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr) !=
              CUDNN_STATUS_SUCCESS ||
          count == 0)
        continue;
      std::vector<std::unique_ptr<Desc>> configs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(configs.back()->get());
      }
      int64_t returned = 0;
      if (cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                                      &returned, raw.data());
          st != CUDNN_STATUS_SUCCESS) {
        last = "reading heuristics results failed: " + cudnn_message(st);
        continue;
      }
      for (int64_t i = 0; i < returned; ++i) {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "plan handle")
            .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i], "plan engine config");
        if (cudnnStatus_t st = plan->try_finalize(); st == CUDNN_STATUS_SUCCESS) return plan;
        else last = "engine configuration rejected: " + cudnn_message(st);
      }
    }
    *why = last;
    return nullptr;
  }

 private:
  Desc& keep(cudnnBackendDescriptorType_t type) {
    descs_.push_back(std::make_unique<Desc>(type));
    return *descs_.back();
  }

  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Desc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct Layouts {
  Dims qkv_dims, qkv_strides, kv_dims, kt_dims, kt_strides, o_strides, s_dims, s_strides,
      st_strides, row_dims, row_strides, packed_strides;
  explicit Layouts(const AttentionShape& s) {
    const int64_t C = s.NH * s.HS, W = (s.NH + 2 * s.KVH) * s.HS, T = s.T;
    qkv_dims = {s.B, s.NH, T, s.HS};
    qkv_strides = {W * T, s.HS, W, 1};
    kv_dims = {s.B, s.KVH, T, s.HS};  // K, V, dK, dV: strides qkv_strides
    kt_dims = {s.B, s.KVH, s.HS, T};
    kt_strides = {W * T, s.HS, 1, W};
    o_strides = {C * T, s.HS, C, 1};
    s_dims = {s.B, s.NH, T, T};
    s_strides = {s.NH * T * T, T * T, T, 1};
    st_strides = {s.NH * T * T, T * T, 1, T};  // the transpose of an S-shaped tensor
    row_dims = {s.B, s.NH, T, 1};
    row_strides = {s.NH * T, T, 1, 1};
    packed_strides = {s.NH * T * s.HS, T * s.HS, s.HS, 1};
  }
};

}  // namespace

struct CudnnAttention::Plan {
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Desc> plan;
  int64_t plan_workspace = 0;
  bool dq_accumulator = false;  // backward variant that accumulates dQ in fp32
  bool grouped = false;         // KVH < NH: dK, dV summed from full-head fp32 buffers
  size_t softmax_sum_offset = 0, dq_accum_offset = 0, dk_full_offset = 0, dv_full_offset = 0,
         total_workspace = 0;
  float scale = 1.f, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.f;
};

namespace {

std::unique_ptr<CudnnAttention::Plan> finish(std::unique_ptr<CudnnAttention::Plan> p,
                                             std::unique_ptr<Graph> graph, std::string* why) {
  p->plan = graph->build_plan(why);
  if (!p->plan) return nullptr;
  int64_t returned = 0;
  DNN_CHECK("attention", cudnnBackendGetAttribute(p->plan->get(),
                                                  CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &returned,
                                                  &p->plan_workspace));
  p->graph = std::move(graph);
  return p;
}

float negative_infinity() {
  // cuDNN before 9.10 expects the lowest finite value as the mask fill.
  return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                   : -std::numeric_limits<float>::infinity();
}

std::unique_ptr<CudnnAttention::Plan> build_forward(cudnnHandle_t handle, const AttentionShape& s,
                                                    std::string* why) {
  const Layouts L(s);
  auto g = std::make_unique<Graph>(handle);
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
  auto q = g->tensor(kQ, bf, L.qkv_dims, L.qkv_strides);
  auto kt = g->tensor(kK, bf, L.kt_dims, L.kt_strides);
  auto v = g->tensor(kV, bf, L.kv_dims, L.qkv_strides);
  auto o = g->tensor(kO, bf, L.qkv_dims, L.o_strides);
  auto stats = g->tensor(kStats, f, L.row_dims, L.row_strides);

  auto s0 = g->virt(f, L.s_dims, L.s_strides);
  g->matmul(q, kt, s0);
  auto s1 = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_MUL, s0, g->scalar(kScale), nullptr, s1);
  auto s2 = g->causal_mask(s1, L.s_dims, L.s_strides);
  auto m = g->virt(f, L.row_dims, L.row_strides);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
  auto centered = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_SUB, s2, m, nullptr, centered);
  auto e = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, nullptr, e);
  auto z = g->virt(f, L.row_dims, L.row_strides);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g->virt(f, L.row_dims, L.row_strides);
  g->pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, log_z);
  g->pointwise(CUDNN_POINTWISE_ADD, m, log_z, nullptr, stats);
  auto p = g->virt(bf, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, p);
  g->matmul(p, v, o);

  auto plan = std::make_unique<CudnnAttention::Plan>();
  plan->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.HS)));
  plan->neg_inf = negative_infinity();
  plan = finish(std::move(plan), std::move(g), why);
  if (plan) plan->total_workspace = align_up(static_cast<size_t>(plan->plan_workspace));
  return plan;
}

std::unique_ptr<CudnnAttention::Plan> build_backward(cudnnHandle_t handle,
                                                     const AttentionShape& s, bool dq_accumulator,
                                                     std::string* why) {
  const Layouts L(s);
  auto g = std::make_unique<Graph>(handle);
  const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
  auto q = g->tensor(kQ, bf, L.qkv_dims, L.qkv_strides);
  auto kt = g->tensor(kK, bf, L.kt_dims, L.kt_strides);
  auto vt = g->tensor(kV, bf, L.kt_dims, L.kt_strides);
  auto o = g->tensor(kO, bf, L.qkv_dims, L.o_strides);
  auto d_o = g->tensor(kDO, bf, L.qkv_dims, L.o_strides);
  auto stats = g->tensor(kStats, f, L.row_dims, L.row_strides);
  auto dq = g->tensor(kDQ, bf, L.qkv_dims, L.qkv_strides);
  auto dk = g->tensor(kDK, bf, L.kv_dims, L.qkv_strides);
  auto dv = g->tensor(kDV, bf, L.kv_dims, L.qkv_strides);
  const bool grouped = s.KVH != s.NH;
  // Grouped: the per-query-head products land in fp32 full-head buffers, then a sum over each
  // group gives dK, dV; otherwise the products write dK, dV directly.
  auto per_head = [&](int64_t uid, cudnnBackendDescriptor_t out,
                      cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b) {
    if (!grouped) return g->matmul(a, b, out);
    auto full = g->tensor(uid, f, L.qkv_dims, L.packed_strides);
    g->matmul(a, b, full);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  auto softmax_sum = g->tensor(kSoftmaxSum, f, L.row_dims, L.row_strides);
  auto scale = g->scalar(kScale);

  // Dsum = rowsum(dO * O) * 1
  auto d_o_o = g->virt(f, L.qkv_dims, L.packed_strides);
  g->pointwise(CUDNN_POINTWISE_MUL, d_o, o, nullptr, d_o_o);
  auto dsum = g->virt(f, L.row_dims, L.row_strides);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, dsum);
  g->pointwise(CUDNN_POINTWISE_MUL, dsum, g->scalar(kOne), nullptr, softmax_sum);

  // P = exp(scale Q K^T - stats), causally masked
  auto s0 = g->virt(f, L.s_dims, L.s_strides);
  g->matmul(q, kt, s0);
  auto s1 = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_MUL, s0, scale, nullptr, s1);
  auto s2 = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_SUB, s1, stats, nullptr, s2);
  auto s3 = g->causal_mask(s2, L.s_dims, L.s_strides);
  auto p = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_EXP, s3, nullptr, nullptr, p);

  // dV = P^T dO
  auto pt = g->virt(bf, L.s_dims, L.st_strides);
  g->reshape(p, pt);
  per_head(kDVFullHead, dv, pt, d_o);

  // dS = P (dO V^T - Dsum) scale
  auto dp = g->virt(f, L.s_dims, L.s_strides);
  g->matmul(d_o, vt, dp);
  auto dp1 = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp1);
  auto ds0 = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_MUL, dp1, p, nullptr, ds0);
  auto ds = g->virt(f, L.s_dims, L.s_strides);
  g->pointwise(CUDNN_POINTWISE_MUL, ds0, scale, nullptr, ds);

  // dK = dS^T Q
  auto dst = g->virt(bf, L.s_dims, L.st_strides);
  g->reshape(ds, dst);
  per_head(kDKFullHead, dk, dst, q);

  // dQ = dS K
  auto k = g->virt(bf, L.kv_dims, L.qkv_strides);
  g->reshape(kt, k);
  if (dq_accumulator) {
    auto acc = g->tensor(kDQAccum, f, L.qkv_dims, L.packed_strides);
    g->matmul(ds, k, acc);
    g->pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  } else {
    g->matmul(ds, k, dq);
  }

  auto plan = std::make_unique<CudnnAttention::Plan>();
  plan->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.HS)));
  plan->neg_inf = negative_infinity();
  plan->dq_accumulator = dq_accumulator;
  plan = finish(std::move(plan), std::move(g), why);
  if (!plan) return nullptr;
  size_t offset = align_up(static_cast<size_t>(plan->plan_workspace));
  plan->softmax_sum_offset = offset;
  offset += align_up(static_cast<size_t>(s.B * s.NH * s.T) * sizeof(float));
  plan->dq_accum_offset = offset;
  const size_t full_head = align_up(static_cast<size_t>(s.B * s.NH * s.T * s.HS) * sizeof(float));
  if (dq_accumulator) offset += full_head;
  plan->grouped = grouped;
  plan->dk_full_offset = offset;
  plan->dv_full_offset = offset + (grouped ? full_head : 0);
  if (grouped) offset += 2 * full_head;
  plan->total_workspace = offset;
  return plan;
}

void execute(cudnnHandle_t handle, const Desc& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const char* op) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data(), "variant pack uids")
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data(), "variant pack pointers")
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace,
           "variant pack workspace")
      .finalize("cudnnBackendFinalize(variant pack)");
  check_dnn(cudnnBackendExecute(handle, plan.get(), pack.get()), op, "cudnnBackendExecute");
}

}  // namespace

CudnnAttention::CudnnAttention() { DNN_CHECK("attention", cudnnCreate(&handle_)); }

CudnnAttention::~CudnnAttention() {
  cache_.clear();
  if (handle_) cudnnDestroy(handle_);
}

CudnnAttention::Entry& CudnnAttention::entry(const AttentionShape& s) {
  auto it = cache_.find(s);
  if (it != cache_.end()) return it->second;
  Entry e;
  // A descriptor this cuDNN rejects outright (an attribute it does not know) throws; that too
  // only means "no plan for this shape".
  try {
    std::string why;
    e.forward = build_forward(handle_, s, &why);
    if (!e.forward) {
      e.error = "forward: " + why;
    } else {
      std::string why_direct, why_accum;
      e.backward = build_backward(handle_, s, false, &why_direct);
      if (!e.backward) e.backward = build_backward(handle_, s, true, &why_accum);
      if (!e.backward)
        e.error = "backward: " + why_direct + "; with a dQ accumulator: " + why_accum;
    }
  } catch (const std::exception& ex) {
    e.error = ex.what();
  }
  if (!e.error.empty()) {
    e.forward.reset();
    e.backward.reset();
  }
  return cache_.emplace(s, std::move(e)).first->second;
}

bool CudnnAttention::prepare(const AttentionShape& shape, std::string* why) {
  Entry& e = entry(shape);
  if (why) *why = e.error;
  return e.error.empty();
}

CudnnAttention::Plan& CudnnAttention::plan(const AttentionShape& shape, bool backward,
                                           const char* op) {
  Entry& e = entry(shape);
  if (!e.error.empty())
    fail(op, "cuDNN has no fused attention plan for B=" + std::to_string(shape.B) + " T=" +
                 std::to_string(shape.T) + " NH=" + std::to_string(shape.NH) + " KVH=" +
                 std::to_string(shape.KVH) + " HS=" +
                 std::to_string(shape.HS) + ": " + e.error +
                 " (hint: attention = \"own\" uses the backend's own kernels)");
  return backward ? *e.backward : *e.forward;
}

size_t CudnnAttention::forward_workspace(const AttentionShape& shape) {
  return plan(shape, false, "attention_forward").total_workspace;
}

size_t CudnnAttention::backward_workspace(const AttentionShape& shape) {
  return plan(shape, true, "attention_backward").total_workspace;
}

void CudnnAttention::forward(void* out, float* stats, const void* qkv, const AttentionShape& s,
                             void* workspace, cudaStream_t stream) {
  Plan& p = plan(s, false, "attention_forward");
  DNN_CHECK("attention_forward", cudnnSetStream(handle_, stream));
  // Byte offsets of K and V in a qkv row: bf16 elements are 2 bytes.
  const int64_t k_at = 2 * s.NH * s.HS, v_at = 2 * (s.NH + s.KVH) * s.HS;
  auto* base = static_cast<char*>(const_cast<void*>(qkv));
  const std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  const std::vector<void*> ptrs = {base, base + k_at, base + v_at, out, stats, &p.scale,
                                   &p.neg_inf};
  execute(handle_, *p.plan, uids, ptrs, workspace, "attention_forward");
}

void CudnnAttention::backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* stats, const AttentionShape& s, void* workspace,
                              cudaStream_t stream) {
  Plan& p = plan(s, true, "attention_backward");
  DNN_CHECK("attention_backward", cudnnSetStream(handle_, stream));
  // Byte offsets of K and V in a qkv row: bf16 elements are 2 bytes.
  const int64_t k_at = 2 * s.NH * s.HS, v_at = 2 * (s.NH + s.KVH) * s.HS;
  auto* base = static_cast<char*>(const_cast<void*>(qkv));
  auto* dbase = static_cast<char*>(dqkv);
  auto* ws = static_cast<char*>(workspace);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kDO, kStats, kScale, kNegInf, kOne,
                               kDQ, kDK, kDV, kSoftmaxSum};
  std::vector<void*> ptrs = {base, base + k_at, base + v_at, const_cast<void*>(out),
                             const_cast<void*>(dout), const_cast<float*>(stats), &p.scale,
                             &p.neg_inf, &p.one, dbase, dbase + k_at, dbase + v_at,
                             ws + p.softmax_sum_offset};
  if (p.grouped) {
    uids.insert(uids.end(), {kDKFullHead, kDVFullHead});
    ptrs.insert(ptrs.end(), {ws + p.dk_full_offset, ws + p.dv_full_offset});
  }
  if (p.dq_accumulator) {
    uids.push_back(kDQAccum);
    ptrs.push_back(ws + p.dq_accum_offset);
    // cuDNN before 9.6 expects the accumulator zeroed by the caller.
    if (cudnnGetVersion() < 90600)
      MESHTRAIN_CUDA_CHECK("attention_backward",
                           cudaMemsetAsync(ws + p.dq_accum_offset, 0,
                                           static_cast<size_t>(s.B * s.NH * s.T * s.HS) * 4, stream));
  }
  execute(handle_, *p.plan, uids, ptrs, workspace, "attention_backward");
}

}  // namespace meshtrain::cuda
