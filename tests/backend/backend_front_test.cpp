// The Backend's non-virtual front checks every operation's contract before any device sees the
// call: a backend whose hooks only record that they ran proves it. A call that breaks a contract
// throws a message naming the backend, the operation and what is wrong, and reaches no hook; the
// same call made right reaches its hook once. One test per family of operations.

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"

namespace meshtrain {
namespace {

// Computes in fp32 and bf16 (as a GPU does): fp64 is refused by the front. Its memory is a
// MetaAllocator's, on `device`: no hook touches an element.
class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(Device device = Device::Cpu)
      : Backend(std::make_unique<MetaAllocator>(device)) {}
  std::string name() const override { return "recording"; }
  bool computes_in(DType a) const override { return a == DType::F32 || a == DType::BF16; }

  std::vector<std::string> calls;

 protected:
  void record(const char* hook) { calls.emplace_back(hook); }
  void do_fill(Tensor&, double) override { record("fill"); }
  void do_copy(Tensor&, const Tensor&) override { record("copy"); }
  void do_cast(Tensor&, const Tensor&) override { record("cast"); }
  void do_copy_from_host(Tensor&, const void*) override { record("copy_from_host"); }
  void do_copy_to_host(void*, const Tensor&) override { record("copy_to_host"); }
  void do_add_inplace(Tensor&, const Tensor&) override { record("add_inplace"); }
  void do_scale_inplace(Tensor&, double) override { record("scale_inplace"); }
  void do_residual_forward(Tensor&, const Tensor&, const Tensor&) override {
    record("residual_forward");
  }
  double do_sum_squares(const Tensor&) override { return record("sum_squares"), 0.0; }
  double do_sum(const Tensor&) override { return record("sum"), 0.0; }
  void do_reduce_into(Tensor&, int64_t, const Tensor&, Reduction) override {
    record("reduce_into");
  }
  void do_embedding_forward(Tensor&, const Tensor&, const Tensor&, int64_t) override {
    record("embedding_forward");
  }
  void do_embedding_backward(Tensor&, const Tensor&, const Tensor&, int64_t) override {
    record("embedding_backward");
  }
  void do_position_forward(Tensor&, const Tensor&, int64_t) override { record("position_forward"); }
  void do_position_backward(Tensor&, const Tensor&, int64_t) override {
    record("position_backward");
  }
  void do_layernorm_forward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) override {
    record("layernorm_forward");
  }
  // A hook with an optional addend records the front that reached it by whether it came.
  void do_layernorm_backward(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor* residual) override {
    record(residual ? "layernorm_backward_add" : "layernorm_backward");
  }
  void do_matmul_forward(Tensor&, const Tensor&, const Tensor&, const Tensor*,
                         const Tensor* residual) override {
    record(residual ? "matmul_forward_add" : "matmul_forward");
  }
  void do_matmul_backward(Tensor*, Tensor*, Tensor*, const Tensor&, const Tensor&,
                          const Tensor&, GradWrite) override {
    record("matmul_backward");
  }
  void do_bias_forward(Tensor&, const Tensor&) override { record("bias_forward"); }
  void do_bias_backward(Tensor&, const Tensor&) override { record("bias_backward"); }
  void do_gelu_forward(Tensor&, const Tensor&) override { record("gelu_forward"); }
  void do_gelu_backward(Tensor&, const Tensor&, const Tensor&) override { record("gelu_backward"); }
  void do_rmsnorm_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, double) override {
    record("rmsnorm_forward");
  }
  void do_rmsnorm_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor* residual) override {
    record(residual ? "rmsnorm_backward_add" : "rmsnorm_backward");
  }
  void do_swiglu_forward(Tensor&, const Tensor&, const Tensor&) override {
    record("swiglu_forward");
  }
  void do_swiglu_backward(Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
    record("swiglu_backward");
  }
  void do_rotary(Tensor&, const Tensor&, const Tensor&, const Tensor&, const RotaryHeads&,
                 Rotation rotation) override {
    record(rotation == Rotation::ByAngle ? "rotary_forward" : "rotary_backward");
  }
  void do_attention_forward(Tensor&, Tensor&, const Tensor&, int64_t, int64_t,
                            const AttentionDims&, const Tensor*) override {
    record("attention_forward");
  }
  void do_attention_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             int64_t, int64_t, const AttentionDims&, const Tensor*) override {
    record("attention_backward");
  }
  void do_attention_block_forward(Tensor&, Tensor&, const Tensor&, const Tensor&, int64_t,
                                  const AttentionDims&, const AttentionBlock&,
                                  const Tensor*) override {
    record("attention_block_forward");
  }
  void do_attention_decode(Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                           double) override {
    record("attention_decode");
  }
  void do_copy_columns(Tensor&, int64_t, const Tensor&, int64_t, int64_t) override {
    record("copy_columns");
  }
  void do_mla_pack(Tensor&, const Tensor&, const Tensor&, const Tensor&, const MlaHeads&) override {
    record("mla_pack");
  }
  void do_mla_unpack(Tensor&, Tensor&, Tensor&, const Tensor&, const MlaHeads&) override {
    record("mla_unpack");
  }
  void do_gather_rows(Tensor&, const Tensor&, const Tensor&, const Tensor*) override {
    record("gather_rows");
  }
  void do_gathered_row_dots(Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
    record("gathered_row_dots");
  }
  void do_crossentropy_stats(Tensor&, Tensor&, const Tensor&) override {
    record("crossentropy_stats");
  }
  void do_crossentropy_rebase(Tensor&, const Tensor&, const Tensor&) override {
    record("crossentropy_rebase");
  }
  void do_crossentropy_target_logit(Tensor&, const Tensor&, const Tensor&, int64_t) override {
    record("crossentropy_target_logit");
  }
  void do_crossentropy_losses(Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
    record("crossentropy_losses");
  }
  void do_crossentropy_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                int64_t, double) override {
    record("crossentropy_backward");
  }
  // "adamw_update [0, 4) 0.1 [4, 10) 0 rounded": each piece and its weight decay.
  void do_adamw_update(Tensor&, const Tensor&, Tensor&, Tensor&,
                       const std::vector<FlatPiece>& pieces, const std::vector<double>& decays,
                       const AdamWStep&, Tensor* rounded) override {
    std::string call = "adamw_update";
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::ostringstream decay;
      decay << decays[k];
      call += " [" + std::to_string(pieces[k].offset) + ", " +
              std::to_string(pieces[k].offset + pieces[k].count) + ") " + decay.str();
    }
    if (rounded) call += " rounded";
    calls.push_back(call);
  }
};

class BackendFrontTest : public ::testing::Test {
 protected:
  // A tensor that lives as long as the test, so that a call may take it by reference.
  Tensor& make(Shape shape, DType dtype = DType::F32) {
    return kept_.emplace_back(be.empty(shape, dtype, MemoryCategory::Workspace));
  }

  // `call` is refused with a message holding every one of `words`, and no hook ran.
  void expect_refused(const std::function<void()>& call, std::initializer_list<const char*> words) {
    be.calls.clear();
    try {
      call();
      ADD_FAILURE() << "not refused; expected: " << *words.begin();
    } catch (const std::invalid_argument& e) {
      for (const char* w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << "'" << w << "' not in: " << e.what();
    }
    EXPECT_TRUE(be.calls.empty()) << "a refused call reached the hook " << be.calls.front();
  }
  // `call` keeps its contract: it reaches the hook `hook`, once, and no other.
  void expect_reaches(const std::function<void()>& call, const char* hook) {
    be.calls.clear();
    call();
    EXPECT_EQ(be.calls, std::vector<std::string>{hook});
  }

  RecordingBackend be;
  std::deque<Tensor> kept_;  // after `be`: released before its allocator
};

TEST_F(BackendFrontTest, DataMovementChecksSizesDtypesAndHostSides) {
  Tensor a = make({4, 8}), b = make({32}), c = make({4, 4});
  Tensor wide = make({4, 8}, DType::F64), narrow = make({4, 8}, DType::BF16);
  expect_reaches([&] { be.copy(a, b); }, "copy");
  expect_refused([&] { be.copy(a, c); }, {"backend 'recording': copy", "(4, 8)", "(4, 4)"});
  expect_refused([&] { be.copy(a, narrow); }, {"copy: tensors differ", "bf16"});
  expect_reaches([&] { be.cast(narrow, a); }, "cast");
  expect_refused([&] { be.cast(narrow, c); }, {"cast: element counts differ"});
  expect_reaches([&] { be.add_inplace(a, narrow); }, "add_inplace");  // bf16 into fp32
  expect_refused([&] { be.add_inplace(narrow, a); },
                 {"does not support add_inplace for dtype bf16: src is fp32, expected bf16"});
  expect_refused([&] { be.residual_forward(a, a, c); }, {"residual_forward: size mismatch"});
  // The activation dtype: this backend has no fp64 kernels.
  expect_refused([&] { be.scale_inplace(wide, 2.0); },
                 {"backend 'recording' does not support scale_inplace for dtype fp64"});
  expect_reaches([&] { be.fill(wide, 0.0); }, "fill");  // fp64 slots are filled anyway
  expect_refused(
      [&] {
        be.copy_from_host_async(a, make({4, 4}));
      },
      {"copy_from_host_async: source (4, 4) fp32 must be a host tensor"});
  expect_refused([&] { be.snapshot_to_host(c, a); }, {"snapshot_to_host: destination (4, 4)"});
}

TEST_F(BackendFrontTest, EveryTensorMustLiveOnTheBackendsDevice) {
  RecordingBackend gpu(Device::Cuda);
  Tensor on_gpu = gpu.empty({4, 8}, DType::F32, MemoryCategory::Workspace);
  Tensor here = make({4, 8});
  expect_refused([&] { be.copy(here, on_gpu); },
                 {"copy: src (4, 8) lives on the cuda, not where this backend computes"});
  expect_refused([&] { be.gelu_forward(on_gpu, here); }, {"gelu_forward", "lives on the cuda"});
  EXPECT_TRUE(gpu.calls.empty());
}

TEST_F(BackendFrontTest, ReductionsCheckSlotsAndPieces) {
  Tensor out = make({3}, DType::F64), t = make({10}), f32_out = make({3});
  expect_reaches([&] { be.reduce_into(out, 2, t, Reduction::Sum); }, "reduce_into");
  expect_refused([&] { be.reduce_into(out, 3, t, Reduction::Sum); }, {"reduce_into", "[3, 4)"});
  expect_refused([&] { be.reduce_into(f32_out, 0, t, Reduction::Sum); }, {"must be fp64"});
  expect_refused(
      [&] {
        be.reduce_pieces_into(out, 0, t, {{0, 4}, {6, 5}}, Reduction::Sum);
      },
      {"reduce_pieces_into: piece [6, 11) outside (10)"});
  expect_refused([&] { be.sum(make({2}, DType::F64)); }, {"does not support sum for dtype fp64"});
}

TEST_F(BackendFrontTest, EmbeddingsCheckRowsChannelsAndTokenIds) {
  Tensor tokens = make({6}, DType::I32), table = make({50, 8}), out = make({6, 8});
  Tensor dtable = make({50, 8}), position_table = make({16, 8});
  expect_reaches([&] { be.embedding_forward(out, tokens, table, 0); }, "embedding_forward");
  expect_refused([&] { be.embedding_forward(out, make({5}, DType::I32), table, 0); },
                 {"embedding_forward: out must be (N, C) = (5, 8)", "out (6, 8)"});
  expect_refused([&] { be.embedding_forward(out, make({6}), table, 0); },
                 {"tokens is fp32, expected int32 (token ids are int32)"});
  expect_reaches([&] { be.embedding_backward(dtable, out, tokens, 0); }, "embedding_backward");
  Tensor out16 = make({6, 8}, DType::BF16), dtable16 = make({50, 8}, DType::BF16);
  expect_refused([&] { be.embedding_backward(dtable16, out16, tokens, 0); },
                 {"does not support embedding_backward for dtype bf16: dtable is bf16, expected "
                  "fp32 (parameter gradients are fp32)"});
  expect_reaches([&] { be.position_forward(out, position_table, 3); }, "position_forward");
  expect_refused(
      [&] {
        be.position_forward(out, make({16, 4}), 3);
      },
      {"position_forward: channel mismatch: out (6, 8) table (16, 4)"});
  expect_refused(
      [&] {
        be.position_backward(make({16, 4}), out, 3);
      },
      {"position_backward: channel mismatch"});
}

TEST_F(BackendFrontTest, LayerNormChecksShapesAndWideStatistics) {
  const DType h = DType::BF16;
  Tensor inp = make({6, 8}, h), out = make({6, 8}, h), w = make({8}, h), b = make({8}, h);
  Tensor mean = make({6}), rstd = make({6}), dw = make({8}), db = make({8});
  expect_reaches([&] { be.layernorm_forward(out, mean, rstd, inp, w, b); }, "layernorm_forward");
  expect_refused([&] { be.layernorm_forward(out, mean, rstd, inp, make({7}, h), b); },
                 {"layernorm_forward: shape mismatch for inp (6, 8)", "weight (7)"});
  Tensor mean16 = make({6}, h);
  expect_refused([&] { be.layernorm_forward(out, mean16, rstd, inp, w, b); },
                 {"does not support layernorm_forward for dtype bf16: mean is bf16, expected fp32 "
                  "(statistics are fp32)"});
  expect_reaches([&] { be.layernorm_backward(out, dw, db, inp, inp, w, mean, rstd); },
                 "layernorm_backward");
  expect_refused([&] { be.layernorm_backward(out, dw, db, inp, inp, w, mean, make({5})); },
                 {"layernorm_backward: shape mismatch", "rstd (5)"});
  expect_reaches([&] { be.layernorm_backward_add(out, dw, db, inp, inp, w, mean, rstd, inp); },
                 "layernorm_backward_add");
  expect_refused(
      [&] {
        be.layernorm_backward_add(out, dw, db, inp, inp, w, mean, rstd, make({6, 8}));
      },
      {"layernorm_backward_add for dtype bf16: residual is fp32, expected bf16"});
}

TEST_F(BackendFrontTest, RmsNormChecksShapesEpsAndWideStatistics) {
  const DType h = DType::BF16;
  Tensor inp = make({6, 8}, h), out = make({6, 8}, h), w = make({8}, h), rstd = make({6});
  Tensor dinp = make({6, 8}, h), dw = make({8});
  expect_reaches([&] { be.rmsnorm_forward(out, rstd, inp, w, 1e-5); }, "rmsnorm_forward");
  expect_refused([&] { be.rmsnorm_forward(out, rstd, inp, make({7}, h), 1e-5); },
                 {"rmsnorm_forward: shape mismatch for inp (6, 8)", "weight (7)"});
  expect_refused([&] { be.rmsnorm_forward(out, rstd, inp, w, 0.0); },
                 {"rmsnorm_forward: eps 0.000000 must be > 0"});
  expect_refused([&] { be.rmsnorm_forward(out, make({6}, h), inp, w, 1e-5); },
                 {"rmsnorm_forward for dtype bf16: rstd is bf16, expected fp32 (statistics are "
                  "fp32)"});
  expect_reaches([&] { be.rmsnorm_backward(dinp, dw, out, inp, w, rstd); }, "rmsnorm_backward");
  expect_refused([&] { be.rmsnorm_backward(dinp, make({8}, h), out, inp, w, rstd); },
                 {"rmsnorm_backward for dtype bf16: dweight is bf16, expected fp32"});
  expect_reaches([&] { be.rmsnorm_backward_add(dinp, dw, out, inp, w, rstd, out); },
                 "rmsnorm_backward_add");
  expect_refused([&] { be.rmsnorm_backward_add(dinp, dw, out, inp, w, rstd, make({6, 7}, h)); },
                 {"rmsnorm_backward_add: shape mismatch", "residual (6, 7)"});
  expect_refused([&] { be.rmsnorm_backward(dinp, dw, out, inp, w, make({5})); },
                 {"rmsnorm_backward: shape mismatch", "rstd (5)"});
}

TEST_F(BackendFrontTest, SwigluChecksThatGateAndUpAreAlike) {
  Tensor gate = make({6, 16}), up = make({6, 16}), out = make({6, 16});
  expect_reaches([&] { be.swiglu_forward(out, gate, up); }, "swiglu_forward");
  // One (N, 2F) tensor is not gate and up: the halves are separate column-parallel outputs.
  expect_refused([&] { be.swiglu_forward(out, make({6, 32}), up); },
                 {"swiglu_forward: gate and up", "gate (6, 32) up (6, 16)"});
  expect_refused([&] { be.swiglu_forward(out, gate, make({6, 16}, DType::BF16)); },
                 {"swiglu_forward for dtype fp32: up is bf16"});
  Tensor dgate = make({6, 16}), dup = make({6, 16});
  expect_reaches([&] { be.swiglu_backward(dgate, dup, out, gate, up); }, "swiglu_backward");
  expect_refused([&] { be.swiglu_backward(dgate, make({16, 6}), out, gate, up); },
                 {"swiglu_backward: every tensor has gate's shape", "dup (16, 6)"});
}

TEST_F(BackendFrontTest, RotaryChecksHeadsInsideRowsAndItsTable) {
  // 5 rows of a packed (q: 4 heads, k: 2 heads, v: 2 heads) x head_dim 8 row = 64 wide.
  Tensor qkv = make({5, 64}), positions = make({5}, DType::I32);
  Tensor cos = make({32, 4}), sin = make({32, 4});
  const Backend::RotaryHeads qk{0, 6, 8};
  expect_reaches([&] { be.rotary_forward(qkv, positions, cos, sin, qk); }, "rotary_forward");
  expect_reaches([&] { be.rotary_backward(qkv, positions, cos, sin, {32, 2, 8}); },
                 "rotary_backward");
  // Heads `stride` apart: the last head's channels end inside the row, heads never overlap.
  expect_reaches([&] { be.rotary_forward(qkv, positions, cos, sin, {4, 4, 8, 16}); },
                 "rotary_forward");
  expect_refused([&] { be.rotary_forward(qkv, positions, cos, sin, {10, 4, 8, 16}); },
                 {"rotary_forward: x must hold one row per position", "stride 16"});
  expect_refused([&] { be.rotary_forward(qkv, positions, cos, sin, {0, 4, 8, 6}); },
                 {"rotary_forward: stride must be 0 (head_dim) or at least head_dim"});
  expect_refused([&] { be.rotary_forward(qkv, positions, cos, sin, {40, 6, 8}); },
                 {"rotary_forward: x must hold one row per position", "column 40, heads 6"});
  expect_refused([&] { be.rotary_forward(qkv, make({3}, DType::I32), cos, sin, qk); },
                 {"x must hold one row per position", "positions (3)"});
  expect_refused([&] { be.rotary_forward(qkv, positions, cos, sin, {0, 8, 7}); },
                 {"head_dim must be even"});
  expect_refused([&] { be.rotary_forward(qkv, positions, make({32, 8}), make({32, 8}), qk); },
                 {"cos and sin must both be (positions, head_dim / 2)"});
  expect_refused([&] { be.rotary_forward(qkv, make({5}), cos, sin, qk); },
                 {"positions is fp32, expected int32 (token positions are int32)"});
  Tensor q16 = make({5, 64}, DType::BF16);
  expect_reaches([&] { be.rotary_forward(q16, positions, cos, sin, qk); }, "rotary_forward");
  expect_refused(
      [&] {
        be.rotary_forward(q16, positions, make({32, 4}, DType::BF16), sin, qk);
      },
      {"rotary_forward for dtype bf16: cos is bf16, expected fp32"});
  expect_refused([&] { be.rotary_forward(make({5, 64}, DType::F64), positions, cos, sin, qk); },
                 {"rotary_forward for dtype fp64: cos is fp32, expected fp64"});
}

TEST_F(BackendFrontTest, ExpertRowGathersCheckTheirIndexAndWeights) {
  // 6 expert-sorted rows of 8 channels combined into 3 tokens, top-2, under bf16.
  const DType h = DType::BF16;
  Tensor out = make({3, 8}, h), src = make({6, 8}, h), index = make({3, 2}, DType::I32);
  Tensor gates = make({3, 2}), dgates = make({3, 2});
  expect_reaches([&] { be.gather_rows(out, src, index, &gates); }, "gather_rows");
  expect_reaches([&] { be.gather_rows(out, src, index, nullptr); }, "gather_rows");
  expect_reaches([&] { be.gathered_row_dots(dgates, out, src, index); }, "gathered_row_dots");
  // No rows (no token reached this rank): checked, then nothing for the device to do.
  Tensor none = make({0, 8}, h), no_index = make({0, 2}, DType::I32), no_gates = make({0, 2});
  expect_refused([&] { be.gather_rows(none, src, no_index, &gates); },
                 {"gather_rows: weights must be (R, K) like index", "weights (3, 2)"});
  expect_refused([&] { be.gather_rows(out, src, no_index, nullptr); },
                 {"gather_rows: index (R, K) holds the terms of each row of out"});
  be.calls.clear();
  be.gather_rows(none, src, no_index, &no_gates);
  be.gathered_row_dots(no_gates, none, src, no_index);
  EXPECT_TRUE(be.calls.empty()) << be.calls.front();
  expect_refused([&] { be.gather_rows(out, src, index, &out); },
                 {"weights must be (R, K) like index", "weights (3, 8)"});
  expect_refused([&] { be.gathered_row_dots(gates, out, make({6, 4}, h), index); },
                 {"gathered_row_dots: index (R, K) holds the terms of each row of a (R, C)"});
  // This backend has no fp64 kernels.
  Tensor out64 = make({3, 8}, DType::F64), src64 = make({6, 8}, DType::F64);
  Tensor gates64 = make({3, 2}, DType::F64);
  expect_refused([&] { be.gather_rows(out64, src64, index, &gates64); },
                 {"backend 'recording' does not support gather_rows for dtype fp64"});
}

TEST_F(BackendFrontTest, MatmulChecksTheProductsShapesAndGradientDtypes) {
  Tensor inp = make({6, 8}), w = make({16, 8}), bias = make({16}), out = make({6, 16});
  Tensor dinp = make({6, 8}), dw = make({16, 8}), db = make({16});
  expect_reaches([&] { be.matmul_forward(out, inp, w, &bias); }, "matmul_forward");
  expect_reaches([&] { be.matmul_forward(out, inp, w, nullptr); }, "matmul_forward");
  expect_refused(
      [&] {
        be.matmul_forward(out, inp, make({16, 7}), &bias);
      },
      {"matmul_forward: inp (6, 8) weight (16, 7) out (6, 16) bias (16)"});
  expect_refused([&] { be.matmul_forward(out, inp, w, &dinp); }, {"matmul_forward", "bias (6, 8)"});
  expect_reaches([&] { be.matmul_backward(&dinp, &dw, &db, out, inp, w); }, "matmul_backward");
  // A weight-gradient-only call never reads the (released) weight: its shape is not checked.
  expect_reaches([&] { be.matmul_backward(nullptr, &dw, nullptr, out, inp, make({0})); },
                 "matmul_backward");
  expect_refused(
      [&] {
        be.matmul_backward(&dinp, &dw, &db, make({5, 16}), inp, w);
      },
      {"matmul_backward", "dout (5, 16)"});
  const DType h = DType::BF16;
  Tensor inp16 = make({6, 8}, h), out16 = make({6, 16}, h), dw16 = make({16, 8}, h);
  expect_refused([&] { be.matmul_backward(nullptr, &dw16, nullptr, out16, inp16, w); },
                 {"does not support matmul_backward for dtype bf16: dweight is bf16, expected fp32 "
                  "(parameter gradients are fp32)"});
  expect_reaches([&] { be.matmul_forward_add(out, inp, w, &bias, out); }, "matmul_forward_add");
  expect_refused(
      [&] {
        be.matmul_forward_add(out, inp, w, &bias, make({6, 15}));
      },
      {"matmul_forward_add: residual (6, 15) for out (6, 16)"});
  Tensor pre = make({6, 16});
  expect_refused([&] { be.matmul_gelu_forward(out, dinp, inp, w, bias); },
                 {"matmul_gelu_forward: pre (6, 8) for out (6, 16)"});
  expect_refused([&] { be.matmul_gelu_backward(dinp, out, w, pre); },
                 {"matmul_gelu_backward", "dpre (6, 8)"});
}

TEST_F(BackendFrontTest, BiasAndGeluCheckShapes) {
  Tensor out = make({6, 16}), bias = make({16}), inp = make({6, 16});
  expect_reaches([&] { be.bias_forward(out, bias); }, "bias_forward");
  expect_refused([&] { be.bias_forward(out, make({15})); }, {"bias_forward: bias of (15)"});
  expect_refused([&] { be.bias_backward(make({16}, DType::BF16), out); },
                 {"bias_backward for dtype fp32: dbias is bf16, expected fp32"});
  expect_reaches([&] { be.gelu_forward(out, inp); }, "gelu_forward");
  expect_refused(
      [&] {
        be.gelu_forward(out, make({16, 6}));
      },
      {"gelu_forward: out (6, 16) for inp (16, 6)"});
  expect_refused(
      [&] {
        be.gelu_backward(out, inp, make({6, 16}, DType::BF16));
      },
      {"gelu_backward for dtype fp32: dout is bf16"});
}

TEST_F(BackendFrontTest, AttentionChecksItsPackedShapes) {
  const int64_t B = 2, T = 4, NH = 2, HS = 3;
  Tensor qkv = make({B, T, 3 * NH * HS}), out = make({B, T, NH * HS}), probs = make({B, NH, T, T});
  expect_reaches([&] { be.attention_forward(out, probs, qkv, B, T, NH, NH, HS); },
                 "attention_forward");
  expect_refused(
      [&] {
        be.attention_forward(out, make({B, NH, T, T - 1}), qkv, B, T, NH, NH, HS);
      },
      {"attention_forward: stash (2, 2, 4, 3)", "not what this backend keeps", "T=4",
       "(2, 2, 4, 4)", "Backend::attention_stash"});
  expect_refused(
      [&] {
        be.attention_backward(make({B, T, NH * HS}), out, qkv, out, probs, B, T, NH, NH, HS);
      },
      {"attention_backward: dqkv (2, 4, 6) must match qkv (2, 4, 18)"});
  expect_refused(
      [&] {
        be.attention_backward(qkv, out, qkv, make({B, T, NH * HS + 1}), probs, B, T, NH, NH, HS);
      },
      {"attention_backward: out (2, 4, 7) must match dout (2, 4, 6)"});
  Tensor q = make({NH, HS}), cache = make({NH, 8, HS});
  expect_refused([&] { be.attention_decode(q, q, cache, cache, 9); },
                 {"attention_decode: length 9 must be in [1, 8]"});
}

// Grouped-query attention: qkv rows of NH + 2 KVH heads, KVH dividing NH, caches of KVH heads.
TEST_F(BackendFrontTest, GroupedQueryAttentionChecksItsHeads) {
  const int64_t B = 2, T = 4, NH = 4, KVH = 2, HS = 3;
  Tensor qkv = make({B, T, (NH + 2 * KVH) * HS}), out = make({B, T, NH * HS});
  Tensor probs = make({B, NH, T, T});
  expect_reaches([&] { be.attention_forward(out, probs, qkv, B, T, NH, KVH, HS); },
                 "attention_forward");
  expect_reaches([&] { be.attention_backward(qkv, out, qkv, out, probs, B, T, NH, KVH, HS); },
                 "attention_backward");
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, NH, 3, HS); },
                 {"attention_forward: heads NH=4, key/value heads KVH=3", "KVH must divide NH"});
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, NH, 0, HS); },
                 {"key/value heads KVH=0"});
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, NH, 1, HS); },
                 {"attention_forward: shape mismatch", "qkv (2, 4, 24)", "KVH=1",
                  "(NH + KVH) * HS + KVH * HV"});
  Tensor q = make({NH, HS}), cache = make({KVH, 8, HS}), odd = make({3, 8, HS});
  expect_refused([&] { be.attention_decode(q, q, odd, odd, 8); },
                 {"attention_decode:", "(KVH, T_max, HV) with KVH dividing NH"});
}

// Value heads of their own size HV (multi-head latent attention) and an explicit softmax scale.
TEST_F(BackendFrontTest, AttentionDimsCheckValueHeadsAndScale) {
  const int64_t B = 2, T = 4, NH = 4, KVH = 2, HS = 6, HV = 4;
  const AttentionDims dims{NH, KVH, HS, HV, 0.25};
  Tensor qkv = make({B, T, (NH + KVH) * HS + KVH * HV}), out = make({B, T, NH * HV});
  Tensor probs = make({B, NH, T, T});
  expect_reaches([&] { be.attention_forward(out, probs, qkv, B, T, dims); }, "attention_forward");
  expect_reaches([&] { be.attention_backward(qkv, out, qkv, out, probs, B, T, dims); },
                 "attention_backward");
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, NH, KVH, HS); },
                 {"attention_forward: shape mismatch", "HS=6 HV=6"});
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, {NH, KVH, HS, HV, -1.0}); },
                 {"attention_forward: softmax scale -1 must be finite and positive"});
  expect_refused([&] { be.attention_forward(out, probs, qkv, B, T, {NH, KVH, HS, -2, 0.0}); },
                 {"attention_forward: value head size HV=-2"});
  Tensor q = make({NH, HS}), k = make({KVH, 8, HS}), v = make({KVH, 8, HV}), o = make({NH, HV});
  expect_reaches([&] { be.attention_decode(o, q, k, v, 8, 0.5); }, "attention_decode");
  expect_refused([&] { be.attention_decode(q, q, k, v, 8); },
                 {"attention_decode:", "out (NH, HV)"});
  expect_refused([&] { be.attention_decode(o, q, k, v, 8, -0.5); },
                 {"attention_decode: softmax scale -0.5"});
  const int64_t Tq = 4;
  Tensor bq = make({B * Tq, (NH + KVH) * HS + KVH * HV}), bkv = make({B * Tq, KVH * (HS + HV)});
  Tensor bout = make({B * Tq, NH * HV}), lse = make({B, NH, Tq});
  const Backend::AttentionBlock square{0, 4, 0, 4, true};
  expect_reaches([&] { be.attention_block_forward(bout, lse, bq, bkv, B, dims, square); },
                 "attention_block_forward");
  expect_refused(
      [&] { be.attention_block_forward(bout, lse, bq, make({B * Tq, 2 * KVH * HS}), B, dims,
                                       square); },
      {"kv is (8, 24), expected (B * Tk, KVH * HS + KVH * HV)", "KVH * HS + KVH * HV = 20"});
}

// The packed row of multi-head latent attention: q, kv and the shared rope key against qkv.
TEST_F(BackendFrontTest, MlaPackChecksItsWidths) {
  const int64_t N = 5;
  const MlaHeads m{2, 3, 2, 4};  // Dq = 5, kv head 7, qkv 2*2*5 + 2*4 = 28
  Tensor qkv = make({N, 28}), q = make({N, 10}), kv = make({N, 14}), pe = make({N, 2});
  expect_reaches([&] { be.mla_pack(qkv, q, kv, pe, m); }, "mla_pack");
  expect_reaches([&] { be.mla_unpack(q, kv, pe, qkv, m); }, "mla_unpack");
  expect_refused([&] { be.mla_pack(qkv, q, make({N, 12}), pe, m); },
                 {"mla_pack: shape mismatch", "kv (5, 12)", "heads 2, nope 3, rope 2, value 4"});
  expect_refused([&] { be.mla_unpack(q, kv, make({N + 1, 2}), qkv, m); },
                 {"mla_unpack: shape mismatch", "dk_rope (6, 2)"});
  expect_refused([&] { be.mla_pack(qkv, q, kv, pe, {2, 3, 0, 4}); },
                 {"mla_pack: heads 2, nope 3, rope 0, value 4", "must be positive"});
  expect_refused([&] { be.mla_pack(qkv, q, kv, make({N, 2}, DType::F64), m); },
                 {"mla_pack for dtype fp32: k_rope is fp64"});
}

TEST_F(BackendFrontTest, RingAttentionBlocksCheckTheirGeometry) {
  const int64_t B = 2, NH = 2, HS = 3, C = NH * HS, Tq = 4, Tk = 4;
  Tensor qkv = make({B * Tq, 3 * C}), kv = make({B * Tk, 2 * C}), out = make({B * Tq, C});
  Tensor lse = make({B, NH, Tq});
  const Backend::AttentionBlock square{0, 4, 0, 4, true}, oblong{0, 4, 0, 3, true};
  expect_reaches([&] { be.attention_block_forward(out, lse, qkv, kv, B, NH, NH, HS, square); },
                 "attention_block_forward");
  expect_refused([&] { be.attention_block_forward(out, lse, qkv, kv, B, NH, NH, HS, oblong); },
                 {"attention_block_forward: a causal block is square: rows = 4, keys = 3"});
  expect_refused(
      [&] {
        be.attention_block_forward(out, make({B, NH, Tq + 1}), qkv, kv, B, NH, NH, HS, square);
      },
      {"lse is (2, 2, 5), expected (B, NH, Tq) = (2, 2, 4)"});
  // Grouped-query blocks: kv rows hold KVH heads of K then of V; KVH must divide NH.
  expect_refused([&] { be.attention_block_forward(out, lse, qkv, kv, B, NH, 3, HS, square); },
                 {"KVH must divide NH, got 2, 2, 3, 3"});
  Tensor gqa_qkv = make({B * Tq, (NH + 2) * HS}), gqa_kv = make({B * Tk, 2 * HS});
  expect_reaches(
      [&] { be.attention_block_forward(out, lse, gqa_qkv, gqa_kv, B, NH, 1, HS, square); },
      "attention_block_forward");
  expect_refused([&] { be.attention_block_forward(out, lse, gqa_qkv, kv, B, NH, 1, HS, square); },
                 {"kv is (8, 12), expected (B * Tk, KVH * HS + KVH * HV)",
                  "KVH * HS + KVH * HV = 6"});
  // The default hook refuses by name, once the geometry holds.
  expect_refused(
      [&] { be.attention_block_backward(qkv, kv, out, out, lse, qkv, kv, B, NH, NH, HS, square); },
      {"does not support attention_block_backward (ring attention"});
  expect_reaches([&] { be.copy_columns(out, 0, kv, C, C); }, "copy_columns");
  expect_refused([&] { be.copy_columns(out, 1, kv, C, C); },
                 {"copy_columns: 6 columns", "do not fit"});
}

TEST_F(BackendFrontTest, CrossEntropyChecksRowsAndStatistics) {
  const DType h = DType::BF16;
  Tensor logits = make({6, 50}, h), targets = make({6}, DType::I32), stat = make({6});
  expect_reaches([&] { be.crossentropy_stats(stat, stat, logits); }, "crossentropy_stats");
  expect_refused([&] { be.crossentropy_stats(stat, make({5}), logits); },
                 {"crossentropy_stats: shape mismatch", "row_sumexp (5)"});
  expect_refused([&] { be.crossentropy_rebase(make({6}, h), make({6}, h), make({6}, h)); },
                 {"does not support crossentropy_rebase for dtype bf16"});
  expect_refused([&] { be.crossentropy_target_logit(stat, logits, make({6}), 0); },
                 {"targets is fp32, expected int32"});
  expect_refused([&] { be.crossentropy_losses(stat, stat, stat, make({7})); },
                 {"crossentropy_losses: size mismatch", "target_logit (7)"});
  expect_refused(
      [&] {
        be.crossentropy_backward(make({6, 49}, h), logits, stat, stat, targets, 0, 1.0);
      },
      {"crossentropy_backward: shape mismatch", "dlogits (6, 49)"});
  expect_refused(
      [&] { be.crossentropy_loss_and_backward(logits, make({6}, h), logits, targets, 1.0); },
      {"crossentropy_loss_and_backward for dtype bf16: losses is bf16, expected fp32"});
}

TEST_F(BackendFrontTest, OptimizerChecksMasterDtypesAndPieces) {
  Tensor p = make({10}), g = make({10}), m = make({10}), v = make({10});
  const Backend::AdamWStep s{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
  // One hook for every form: adamw_update is the whole tensor as one piece with s's decay.
  expect_reaches([&] { be.adamw_update(p, g, m, v, s); }, "adamw_update [0, 10) 0.1");
  Tensor p16 = make({10}, DType::BF16);
  expect_refused([&] { be.adamw_update(p16, g, m, v, s); },
                 {"adamw_update for dtype bf16: param is bf16, expected fp32 (master parameters"});
  expect_refused([&] { be.adamw_update(p, g, m, make({9}), s); },
                 {"adamw_update: size mismatch", "exp_avg_sq (9)"});
  expect_reaches(
      [&] {
        be.adamw_update_pieces(p, g, m, v, {{0, 4}, {4, 6}}, {0.1, 0.0}, s);
      },
      "adamw_update [0, 4) 0.1 [4, 10) 0");
  Tensor rounded = make({10}, DType::BF16);
  expect_reaches([&] { be.adamw_update_pieces(p, g, m, v, {{4, 6}}, {0.0}, s, &rounded); },
                 "adamw_update [4, 10) 0 rounded");
  expect_refused([&] { be.adamw_update_pieces(p, g, m, v, {{4, 6}}, {0.0}, s, &p); },
                 {"adamw_update_pieces", "rounded is fp32, expected bf16"});
  expect_refused(
      [&] {
        be.adamw_update_pieces(p, g, m, v, {{0, 4}, {4, 6}}, {0.1}, s);
      },
      {"adamw_update_pieces: 2 pieces but 1 weight decays"});
  expect_refused(
      [&] {
        be.adamw_update_pieces(p, g, m, v, {{8, 4}}, {0.1}, s);
      },
      {"adamw_update_pieces: piece [8, 12) outside (10)"});
}

}  // namespace
}  // namespace meshtrain
