// Whole-model gradient check in double precision: every gradient element of a small GPT
// (2 layers, d 16, 2 heads, T 8, vocabulary 32) against central finite differences of the loss.
//
// Tolerance: with step h = 1e-5 in double, the central difference's truncation error is
// O(h^2 |f'''|) ~ 1e-10 and its rounding error ~ eps |f| / h ~ 1e-16 * 4 / 1e-5 ~ 4e-11, for a
// loss near log(32) ~ 3.5. A correct backward pass therefore agrees to ~1e-9 absolute; the bound
// 1e-7 absolute + 1e-5 relative leaves two orders of margin, while a wrong term (a missing
// factor, a transposed index) shows up as an error of the gradient's own size.
//
// Under the sanitizers every 7th element of each tensor (support/sanitized.h): each difference
// is two more forwards over the same code, and the Release run checks every element.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/model/decoder_model.h"
#include "meshtrain/tensor/bf16.h"
#include "meshtrain/train/document_starts.h"
#include "support/random.h"
#include "support/sanitized.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

struct Harness {
  CpuBackend be{2};
  MpiCommunicator tp_comm{MPI_COMM_SELF, "tp"};
  ModelSpec cfg;
  std::unique_ptr<DecoderModel> model;
  MicroBatchData mb;
  UnitHooks hooks;

  // `adjust` changes the spec from the small GPT-2 below (a variant's test).
  Harness(bool tied, uint64_t seed = 11, void (*adjust)(ModelSpec&) = nullptr) {
    cfg.layers = 2;
    cfg.d_model = 16;
    cfg.heads = 2;
    cfg.seq_len = 8;
    cfg.vocab_size = 32;
    cfg.tie_embeddings = tied;
    if (adjust) adjust(cfg);
    const TensorParallel tp{&tp_comm, SequenceParallel::Off};
    model = std::make_unique<DecoderModel>(be, tp, cfg, balanced_partition(cfg, 1), DType::F64);
    model->params().materialize(be, DType::F64);
    model->params().initialize(be, seed);
    // Larger than GPT-2's init, so that every nonlinearity works away from its linear regime.
    for (Parameter* p : model->params().params()) {
      std::vector<double> v = testing::to_host(be, p->value);
      const std::vector<double> noise = testing::random_normal(v.size(), hash_name(p->spec.name), 0.3);
      for (size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
      be.copy_from_host(p->value, v.data());
    }
    mb.shape = TokenShape{2, cfg.seq_len, {}};
    std::vector<int32_t> tokens(mb.shape.N()), targets(mb.shape.N());
    for (int64_t i = 0; i < mb.shape.N(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + 3) % cfg.vocab_size);
      targets[i] = static_cast<int32_t>((i * 5 + 1) % cfg.vocab_size);
    }
    mb.tokens = testing::make_tokens(be, tokens);
    mb.targets = testing::make_tokens(be, targets);
  }

  double loss() {
    ModelChunk::Saved saved;
    double sum = 0;
    model->chunk(0).forward(mb, {}, saved, Pass::Eval, Recompute::None, 0.0, &sum, hooks);
    return sum / static_cast<double>(mb.shape.N());
  }

  // The training objective: the eval loss plus the layers' own losses (a mixture of experts'
  // balancing losses), which only a training forward adds. A training forward also runs the
  // head's backward (lm_head.h): the gradients it adds to are put back as they were.
  double train_loss() {
    std::vector<std::vector<double>> grads;
    for (Parameter* p : model->params().params()) grads.push_back(testing::to_host(be, p->grad));
    ModelChunk::Saved saved;
    double sum = 0;
    const double dloss = 1.0 / static_cast<double>(mb.shape.N());
    model->chunk(0).forward(mb, {}, saved, Pass::Train, Recompute::None, dloss, &sum, hooks);
    model->moe_log().take();
    size_t i = 0;
    for (Parameter* p : model->params().params()) be.copy_from_host(p->grad, grads[i++].data());
    return sum * dloss + mtp_objective();
  }

  // The multi-token prediction depths' part of the objective (model/mtp_module.h), from their
  // cross-entropy sums over the micro-batch: (lambda / D) x each depth's mean.
  double mtp_objective() {
    MultiTokenPrediction* mtp = model->chunk(0).mtp();
    if (!mtp) return 0.0;
    const std::vector<double> sums = mtp->take_sums();
    double objective = 0;
    for (size_t k = 0; k < sums.size(); k += 2)
      objective += cfg.mtp_loss_weight / cfg.mtp_layers * sums[k] / sums[k + 1];
    return objective;
  }

  double loss_and_grads(Recompute recompute) {
    model->params().zero_grads(be);
    return accumulate_grads(recompute);
  }

  // As the training state starts a step (parallel/model_state.h): the gradient buffers keep
  // what they held (here NaN), every parameter marked unwritten; after backward, whatever
  // nothing wrote is zeroed, as a bucket does before its reduction.
  double loss_and_unfilled_grads(Recompute recompute) {
    for (Parameter* p : model->params().params()) {
      be.fill(p->grad, std::numeric_limits<double>::quiet_NaN());
      p->grad_unwritten = true;
    }
    const double loss = accumulate_grads(recompute);
    for (Parameter* p : model->params().params()) p->zero_grad_if_unwritten(be);
    return loss;
  }

  // One more micro-batch: forward and backward, adding to the gradients.
  double accumulate_grads(Recompute recompute) {
    ModelChunk::Saved saved;
    double sum = 0;
    const double dloss = 1.0 / static_cast<double>(mb.shape.N());
    model->chunk(0).forward(mb, {}, saved, Pass::Train, recompute, dloss, &sum, hooks);
    model->chunk(0).backward(mb, {}, saved, recompute, hooks);
    return sum * dloss + mtp_objective();
  }
};

// objective: the training loss (with the layers' own losses) in place of the evaluation loss.
enum class Objective { Eval, Train };

void check_all_gradients(Harness& h, Recompute recompute, Objective objective = Objective::Eval) {
  const double loss = h.loss_and_grads(recompute);
  const bool train = objective == Objective::Train;
  EXPECT_NEAR(loss, train ? h.train_loss() : h.loss(), 1e-12) << "the two forwards disagree";
  const double step = 1e-5;
  // Under the sanitizers every 23rd element: each check is two more forward passes over the
  // same code, which the sanitizers look at once; the Release run checks every element.
  const size_t stride = testing::kSanitized ? 23 : 1;
  for (Parameter* p : h.model->params().params()) {
    std::vector<double> value = testing::to_host(h.be, p->value);
    const std::vector<double> grad = testing::to_host(h.be, p->grad);
    double worst = 0;
    int64_t worst_i = -1;
    for (size_t i = 0; i < value.size(); i += stride) {
      const double saved = value[i];
      value[i] = saved + step;
      h.be.copy_from_host(p->value, value.data());
      const double up = train ? h.train_loss() : h.loss();
      value[i] = saved - step;
      h.be.copy_from_host(p->value, value.data());
      const double down = train ? h.train_loss() : h.loss();
      value[i] = saved;
      h.be.copy_from_host(p->value, value.data());
      const double numeric = (up - down) / (2 * step);
      const double excess = std::abs(numeric - grad[i]) - (1e-7 + 1e-5 * std::abs(numeric));
      if (excess > worst) {
        worst = excess;
        worst_i = static_cast<int64_t>(i);
      }
    }
    EXPECT_LE(worst, 0.0) << p->spec.name << " element " << worst_i;
  }
}

int count_named(ParameterStore& store, const std::string& name) {
  int n = 0;
  for (Parameter* p : store.params()) n += p->spec.name == name ? 1 : 0;
  return n;
}

// Whether parameter `name`'s gradient (after check_all_gradients) has an element other than 0.
bool has_nonzero_gradient(Harness& h, const std::string& name) {
  Parameter* p = h.model->params().find(name);
  if (!p) throw std::logic_error("no parameter " + name);
  for (double g : testing::to_host(h.be, p->grad))
    if (g != 0.0) return true;
  return false;
}

// Whether parameter `second` begins where `first` ends in the flat buffers, values and
// gradients: then the layers run as one product (model/stacked_columns.h).
bool adjacent(Harness& h, const std::string& first, const std::string& second) {
  Parameter* a = h.model->params().find(first);
  Parameter* b = h.model->params().find(second);
  if (!a || !b) throw std::logic_error("no parameter " + first + " or " + second);
  return adjacent_view({a->value, b->value}, {a->numel() + b->numel()}).defined() &&
         adjacent_view({a->grad, b->grad}, {a->numel() + b->numel()}).defined();
}

// Tied: one wte, read by the embedding and the head (the head unit borrows it), so its
// gradient — checked element by element below — holds both uses.
TEST(GradientCheck, TiedEmbeddingsEveryElement) {
  Harness h(true);
  EXPECT_EQ(count_named(h.model->params(), "wte"), 1);
  EXPECT_EQ(count_named(h.model->params(), "lm_head.weight"), 0);
  check_all_gradients(h, Recompute::None);
}

TEST(GradientCheck, UntiedEmbeddingsEveryElement) {
  Harness h(false);
  EXPECT_EQ(count_named(h.model->params(), "wte"), 1);
  EXPECT_EQ(count_named(h.model->params(), "lm_head.weight"), 1);
  check_all_gradients(h, Recompute::None);
}

// Attention at heads x head_dim channels other than d_model (Qwen 3's head_dim 128 whatever
// d_model / heads is), and a feed-forward width other than 4 d_model: the projections change
// shape, and every gradient still matches.
TEST(GradientCheck, HeadDimAndFeedForwardWidthOfTheirOwn) {
  Harness h(false, 11, [](ModelSpec& m) {
    m.head_dim_set = 12;
    m.ffn_hidden_set = 24;
  });
  for (Parameter* p : h.model->params().params()) {
    if (p->spec.name == "h.0.attn.qkv.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{3, 24, 16})); }
    if (p->spec.name == "h.0.attn.proj.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{16, 24})); }
    if (p->spec.name == "h.0.mlp.fc.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{24, 16})); }
    if (p->spec.name == "h.0.mlp.proj.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{16, 24})); }
  }
  check_all_gradients(h, Recompute::None);
}

// The sub-layers Llama and Qwen use: RMSNorm (its own eps) before attention, before the
// feed-forward and before the head; a SwiGLU feed-forward; no bias on any linear layer.
TEST(GradientCheck, RmsNormSwiGluWithoutBiasesEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) {
    m.norm.kind = NormKind::Rms;
    m.norm.eps = 1e-6;
    m.activation = ActivationKind::SwiGlu;
    m.linear_bias = false;
    m.ffn_hidden_set = 40;
  });
  for (Parameter* p : h.model->params().params()) {
    EXPECT_EQ(p->spec.name.find(".bias"), std::string::npos) << p->spec.name << " exists";
    if (p->spec.name == "h.1.mlp.gate.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{40, 16})); }
    if (p->spec.name == "h.1.mlp.down.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{16, 40})); }
  }
  EXPECT_EQ(count_named(h.model->params(), "h.0.mlp.up.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "ln_f.weight"), 1);
  EXPECT_TRUE(adjacent(h, "h.0.mlp.gate.weight", "h.0.mlp.up.weight")) << "gate and up not one product";
  check_all_gradients(h, Recompute::None);
}

// SwiGLU with biases: gate's bias lies between the two weights, so gate and up run one by one
// and their outputs are copied into the packed rows (model/stacked_columns.h).
TEST(GradientCheck, SwiGluWithBiasesOneByOneEveryElement) {
  Harness h(false, 12, [](ModelSpec& m) {
    m.norm.kind = NormKind::Rms;
    m.activation = ActivationKind::SwiGlu;
    m.ffn_hidden_set = 24;
  });
  EXPECT_FALSE(adjacent(h, "h.0.mlp.gate.weight", "h.0.mlp.up.weight"));
  check_all_gradients(h, Recompute::None);
}

// Grouped-query attention: separate q, k, v projections (k and v one head of 8 wide: the two
// query heads share it), packed into the row the kernels read; with biases, the key bias's
// gradient is exactly zero.
TEST(GradientCheck, GroupedQueryAttentionEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) { m.kv_heads_set = 1; });
  EXPECT_EQ(count_named(h.model->params(), "h.0.attn.qkv.weight"), 0);
  for (Parameter* p : h.model->params().params()) {
    if (p->spec.name == "h.0.attn.q.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{16, 16})); }
    if (p->spec.name == "h.0.attn.k.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{8, 16})); }
    if (p->spec.name == "h.0.attn.v.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{8, 16})); }
  }
  EXPECT_FALSE(adjacent(h, "h.0.attn.q.weight", "h.0.attn.k.weight")) << "biases between them";
  check_all_gradients(h, Recompute::None);
  for (Parameter* p : h.model->params().params())
    if (p->spec.name == "h.1.attn.k.bias") {
      for (double g : testing::to_host(h.be, p->grad)) EXPECT_EQ(g, 0.0);
    }
}

// Llama's block: rotary positions (no wpe; Llama 3 scaling, whose stretched and blended
// wavelengths the 8 positions reach with original_max_positions 4), grouped-query attention,
// RMSNorm, SwiGLU, no biases.
TEST(GradientCheck, LlamaBlockWithRotaryPositionsEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) {
    m.positions = PositionKind::Rotary;
    m.rope.scaling = RopeScalingKind::Llama3;
    m.rope.original_max_positions = 4;
    m.kv_heads_set = 1;
    m.norm.kind = NormKind::Rms;
    m.activation = ActivationKind::SwiGlu;
    m.linear_bias = false;
  });
  EXPECT_EQ(count_named(h.model->params(), "wpe"), 0);
  EXPECT_TRUE(adjacent(h, "h.1.attn.k.weight", "h.1.attn.v.weight")) << "q, k, v not one product";
  check_all_gradients(h, Recompute::None);
}

// Sliding windows as a pattern (model.attention_window = [3, 0]): block 0 sees 3 keys of the
// 8 positions, block 1 all of them (Gemma 3's local and global layers), with rotary positions
// and grouped-query heads.
TEST(GradientCheck, SlidingWindowPatternEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) {
    m.positions = PositionKind::Rotary;
    m.kv_heads_set = 1;
    m.attention_window = {3, 0};
  });
  EXPECT_EQ(h.cfg.window(0), 3);
  EXPECT_EQ(h.cfg.window(1), 0);
  check_all_gradients(h, Recompute::None);
  check_all_gradients(h, Recompute::Selective);
  // With biases: rotary positions turn the key bias by each key's position, so that it no
  // longer adds one amount to a query's scores: it is learnt (its gradient was zeroed, as for
  // learned positions, until this check failed on it).
  EXPECT_TRUE(has_nonzero_gradient(h, "h.1.attn.k.bias"));
}

// Qwen 3's block: the Llama block with each query and key head RMS-normalised (one head_dim
// weight each, shared by the heads) before the rotation; with kv_heads == heads the projections
// stay separate. With biases, so that the key bias (which the norm makes matter) is checked too.
TEST(GradientCheck, QwenBlockWithPerHeadQueryKeyNormEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) {
    m = family_defaults("qwen3", m);
    m.linear_bias = true;
    m.rope.theta = 50.0;  // turns the 8 positions by a visible amount in each of the 4 pairs
  });
  EXPECT_EQ(count_named(h.model->params(), "h.0.attn.qkv.weight"), 0);
  EXPECT_EQ(count_named(h.model->params(), "h.1.attn.q_norm.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "h.1.attn.k_norm.weight"), 1);
  for (Parameter* p : h.model->params().params())
    if (p->spec.name == "h.0.attn.k_norm.weight") { EXPECT_EQ(p->spec.global_shape, (Shape{8})); }
  check_all_gradients(h, Recompute::None);
  EXPECT_TRUE(has_nonzero_gradient(h, "h.1.attn.k.bias"));
}

// Multi-head latent attention (model/latent_attention.h) in Llama's block: 2 heads, queries
// through a rank-6 path (or straight from the input), a latent of 5, query/key heads of 4
// channels without positions and 4 rotary ones (the rotary key shared by both heads), value
// heads of 6 (not the query/key heads' 8). Base 50 turns the 8 positions by a visible amount in
// both pairs.
void latent_block(ModelSpec& m, int64_t q_lora_rank) {
  m = family_defaults("llama", m);
  m.attention = AttentionKind::Latent;
  m.latent = LatentSpec{q_lora_rank, 5, 4, 4, 6};  // q_lora, kv_lora, nope, rope, value
  m.rope.theta = 50.0;
}

TEST(GradientCheck, LatentAttentionWithLowRankQueriesEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) { latent_block(m, 6); });
  const std::pair<const char*, Shape> shapes[] = {
      {"h.1.attn.q_a.weight", {6, 16}},  {"h.1.attn.q_a_norm.weight", {6}},
      {"h.1.attn.q_b.weight", {16, 6}},  {"h.1.attn.kv_a.weight", {9, 16}},
      {"h.1.attn.kv_a_norm.weight", {5}}, {"h.1.attn.kv_b.weight", {20, 5}},
      {"h.1.attn.proj.weight", {16, 12}}};
  for (const auto& [name, shape] : shapes) {
    const Parameter* p = h.model->params().find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->spec.global_shape, shape) << name;
  }
  EXPECT_EQ(count_named(h.model->params(), "h.1.attn.q.weight"), 0);
  check_all_gradients(h, Recompute::None);
}

// Queries straight from the input, and YaRN as DeepSeek-V3 has it (mscale = mscale_all_dim):
// cos and sin keep amplitude 1 and the softmax scale gains m^2 = (0.1 ln 4 + 1)^2, which the
// backward must apply too.
TEST(GradientCheck, LatentAttentionWithQueriesFromTheInputEveryElement) {
  Harness h(false, 12, [](ModelSpec& m) {
    latent_block(m, 0);
    m.rope.scaling = RopeScalingKind::Yarn;
    m.rope.factor = 4.0;
    m.rope.original_max_positions = 4;
    m.rope.mscale = m.rope.mscale_all_dim = 1.0;
  });
  EXPECT_EQ(count_named(h.model->params(), "h.0.attn.q_a.weight"), 0);
  EXPECT_EQ(count_named(h.model->params(), "h.0.attn.q.weight"), 1);
  check_all_gradients(h, Recompute::None);
}

TEST(GradientCheck, LatentAttentionRecomputedGivesIdenticalGradients) {
  std::vector<std::vector<double>> grads[3];
  const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int m = 0; m < 3; ++m) {
    Harness h(false, 11, [](ModelSpec& s) { latent_block(s, 6); });
    h.loss_and_grads(modes[m]);
    for (Parameter* p : h.model->params().params()) grads[m].push_back(testing::to_host(h.be, p->grad));
  }
  EXPECT_EQ(grads[0], grads[1]) << "selective";
  EXPECT_EQ(grads[0], grads[2]) << "full";
}

// A mixture of experts in each block (Llama's block otherwise): 4 SwiGLU experts of width 12,
// top 2, renormalised, a shared expert of width 8, and balancing losses large enough that their
// gradients are a visible part of the router's. The objective is the training loss, which holds
// the balancing losses; the perturbations (1e-5) move no token's choice here.
void moe_block(ModelSpec& m) {
  m = family_defaults("llama", m);
  m.feed_forward = FeedForwardKind::Moe;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_hidden_set = 12;
  m.moe.shared_ffn_hidden = 8;
  m.moe.aux_loss = 0.3;
  m.moe.z_loss = 0.05;
}

TEST(GradientCheck, MixtureOfExpertsWithBalancingLossesEveryElement) {
  Harness h(false, 11, moe_block);
  EXPECT_EQ(count_named(h.model->params(), "h.1.mlp.router.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "h.1.mlp.experts.down.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "h.0.mlp.shared.gate.weight"), 1);
  EXPECT_GT(h.train_loss() - h.loss(), 1e-3) << "the balancing losses add nothing";
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// Gates as the softmax's probabilities (Qwen3-MoE's norm_topk_prob false), top 1 of 3, no shared
// expert, the first block dense (DeepSeek's first_k_dense_replace).
TEST(GradientCheck, MixtureOfExpertsTopOneUnnormalisedAfterADenseBlockEveryElement) {
  Harness h(false, 12, [](ModelSpec& m) {
    moe_block(m);
    m.moe.experts = 3;
    m.moe.top_k = 1;
    m.moe.normalize_top_k = false;
    m.moe.shared_ffn_hidden = 0;
    m.moe.first_dense_layers = 1;
  });
  EXPECT_EQ(count_named(h.model->params(), "h.0.mlp.router.weight"), 0);
  EXPECT_EQ(count_named(h.model->params(), "h.0.mlp.gate.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "h.1.mlp.router.weight"), 1);
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// DeepSeek-V3's router: sigmoid scores, gates scaled by 2.5, and an expert bias (set here, as
// training would have moved it) that changes which experts tokens choose: the gradient flows
// through the chosen sigmoid scores and the balancing losses over the normalised scores, none
// to the bias, which is no parameter.
TEST(GradientCheck, MixtureOfExpertsSigmoidRouterWithABiasEveryElement) {
  Harness h(false, 13, [](ModelSpec& m) {
    moe_block(m);
    m.moe.router = RouterKind::Sigmoid;
    m.moe.route_scale = 2.5;
  });
  // The tokens each expert received in a training step.
  auto loads = [&] {
    h.loss_and_grads(Recompute::None);
    return h.model->moe_log().take();
  };
  const std::map<int, ExpertLoad> unbiased = loads();
  h.model->expert_bias().values_of(0) = {0.3, -0.2, 0.1, -0.25};
  h.model->expert_bias().values_of(1) = {-0.3, 0.25, -0.1, 0.2};
  const std::map<int, ExpertLoad> biased = loads();
  EXPECT_NE(unbiased.at(0).tokens, biased.at(0).tokens) << "the bias changes no choice";
  EXPECT_NE(unbiased.at(1).tokens, biased.at(1).tokens) << "the bias changes no choice";
  EXPECT_EQ(count_named(h.model->params(), "h.1.mlp.router.expert_bias"), 0) << "not a parameter";
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// DeepSeek-V3's group-limited routing (noaux_tc): 8 experts in 4 groups, the experts of the best
// 2 groups eligible for each token's top 2. The group choice is discrete like the top k: the
// gradient flows through the chosen sigmoid scores as without groups (the perturbations, 1e-5,
// move no token's groups here), and the limit changes the experts tokens reach.
void sigmoid_moe_block(ModelSpec& m) {
  moe_block(m);
  m.moe.experts = 8;
  m.moe.router = RouterKind::Sigmoid;
  m.moe.route_scale = 2.5;
}

TEST(GradientCheck, MixtureOfExpertsGroupLimitedRoutingEveryElement) {
  auto loads = [](Harness& h) {
    h.loss_and_grads(Recompute::None);
    return h.model->moe_log().take();
  };
  Harness plain(false, 15, sigmoid_moe_block);
  Harness h(false, 15, [](ModelSpec& m) {
    sigmoid_moe_block(m);
    m.moe.groups = 4;
    m.moe.top_groups = 2;
  });
  EXPECT_NE(loads(plain).at(1).tokens, loads(h).at(1).tokens) << "the group limit changes no choice";
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// Multi-token prediction (model/mtp_module.h): the depths' losses join the training objective
// (the eval loss leaves them out), and every parameter's gradient holds them: the depths' own,
// the head's weight read twice (once per depth too), the embedding's rows looked up again, and
// the main stack's through the head's normed state. The last k positions have no label at
// depth k.
TEST(GradientCheck, MultiTokenPredictionOneDepthUntiedEveryElement) {
  Harness h(false, 21, [](ModelSpec& m) {
    m = family_defaults("llama", m);
    m.layers = 1;  // one main block keeps the finite differences few
    m.mtp_layers = 1;
  });
  const std::pair<const char*, Shape> shapes[] = {
      {"mtp.0.enorm.weight", {16}}, {"mtp.0.hnorm.weight", {16}}, {"mtp.0.eh_proj.weight", {16, 32}},
      {"mtp.0.norm.weight", {16}},  {"mtp.0.block.attn.proj.weight", {16, 16}}};
  for (const auto& [name, shape] : shapes) {
    const Parameter* p = h.model->params().find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->spec.global_shape, shape) << name;
  }
  EXPECT_GT(h.train_loss() - h.loss(), 0.3) << "the depth adds no loss";
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// Two depths (the second reads the first's normed state) on GPT-2's tied embedding, with weight
// 0.5: the embedding's gradient holds three lookups' and three heads' uses. One main block keeps
// the finite differences few.
TEST(GradientCheck, MultiTokenPredictionTwoDepthsTiedEveryElement) {
  Harness h(true, 22, [](ModelSpec& m) {
    m.layers = 1;
    m.mtp_layers = 2;
    m.mtp_loss_weight = 0.5;
  });
  EXPECT_EQ(count_named(h.model->params(), "mtp.1.block.mlp.fc.weight"), 1);
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// DeepSeek-V3's depth: latent attention, and the sigmoid-routed mixture in the depth's block
// (layer `layers`, with an expert bias of its own) after one dense main block.
TEST(GradientCheck, MultiTokenPredictionLatentMixtureEveryElement) {
  Harness h(false, 23, [](ModelSpec& m) {
    sigmoid_moe_block(m);
    m.attention = AttentionKind::Latent;
    m.latent = LatentSpec{6, 5, 4, 4, 6};  // latent_block's sizes (family_defaults would reset them)
    m.rope.theta = 50.0;
    m.layers = 1;
    m.moe.first_dense_layers = 1;
    m.mtp_layers = 1;
  });
  EXPECT_EQ(count_named(h.model->params(), "mtp.0.block.attn.kv_b.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "mtp.0.block.mlp.router.weight"), 1);
  EXPECT_EQ(count_named(h.model->params(), "h.0.mlp.gate.weight"), 1);
  EXPECT_EQ(h.model->expert_bias().layers(), (std::vector<int>{1}));
  h.model->expert_bias().values_of(1) = {0.3, -0.2, 0.1, -0.25, 0.2, -0.1, 0.05, -0.3};
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// A capacity (model.moe_capacity_factor 1: 8 of the 16 tokens' 32 choices per expert) that drops
// choices here: a dropped choice adds nothing and gets no gradient, the kept gates are not
// renormalised, so the router's gradient still reaches the dropped scores through the
// normalisation; the balancing losses count what was chosen.
TEST(GradientCheck, MixtureOfExpertsWithCapacityDropsEveryElement) {
  Harness h(false, 14, [](ModelSpec& m) {
    moe_block(m);
    m.moe.capacity_factor = 1.0;
  });
  h.loss_and_grads(Recompute::None);
  const std::map<int, ExpertLoad> log = h.model->moe_log().take();
  EXPECT_GT(log.at(0).dropped + log.at(1).dropped, 0) << "nothing dropped: the case proves nothing";
  check_all_gradients(h, Recompute::None, Objective::Train);
}

// Full recomputation re-runs the mixture's forward in backward: the same gradients, and the
// balancing losses counted once.
TEST(GradientCheck, MixtureOfExpertsRecomputedGivesIdenticalGradientsAndLoss) {
  std::vector<std::vector<double>> grads[3];
  double losses[3];
  const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int m = 0; m < 3; ++m) {
    Harness h(false, 11, moe_block);
    losses[m] = h.loss_and_grads(modes[m]);
    const std::map<int, ExpertLoad> log = h.model->moe_log().take();
    ASSERT_EQ(log.size(), 2u);
    EXPECT_EQ(log.at(1).sequences, 2.0) << "mode " << m;
    EXPECT_EQ(log.at(1).routed_tokens, static_cast<double>(h.mb.shape.N())) << "mode " << m;
    double tokens = 0;
    for (double t : log.at(1).tokens) tokens += t;
    EXPECT_EQ(tokens, 2.0 * static_cast<double>(h.mb.shape.N())) << "top 2 of every token";
    for (Parameter* p : h.model->params().params()) grads[m].push_back(testing::to_host(h.be, p->grad));
  }
  EXPECT_EQ(grads[0], grads[1]) << "selective";
  EXPECT_EQ(grads[0], grads[2]) << "full";
  EXPECT_EQ(losses[0], losses[2]);
}

// Document masking (data.document_mask): block-causal attention over documents separated by an
// end-of-text token (here 31), which closes its document; with learned positions (GPT-2's) and
// with Llama's block, and under selective recomputation, which rebuilds the masked softmax.
void mask_documents(Harness& h) {
  constexpr int32_t kEnd = 31;
  std::vector<int32_t> tokens(h.mb.shape.N());
  for (int64_t i = 0; i < h.mb.shape.N(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % h.cfg.vocab_size) % kEnd;  // no stray 31
  tokens[0] = tokens[3] = kEnd;            // row 0: documents of 1, 3 and 4 tokens
  tokens[h.cfg.seq_len + 4] = kEnd;        // row 1: 5 and 3
  std::vector<int32_t> starts(tokens.size());
  for (int64_t b = 0; b < h.mb.shape.B; ++b)
    document_starts(tokens.data() + b * h.cfg.seq_len, h.cfg.seq_len, kEnd,
                    starts.data() + b * h.cfg.seq_len);
  h.mb.tokens = testing::make_tokens(h.be, tokens);
  Tensor t = h.be.empty({h.mb.shape.N()}, DType::I32, MemoryCategory::Activations);
  h.be.copy_from_host(t, starts.data());
  const double causal = h.loss();
  h.mb.shape.document_starts = t;
  EXPECT_GT(std::abs(h.loss() - causal), 1e-6) << "the mask changed nothing";
}

TEST(GradientCheck, DocumentMaskedGpt2EveryElement) {
  Harness h(true);
  mask_documents(h);
  check_all_gradients(h, Recompute::None);
  // Selective recomputation rebuilds the masked softmax: the same bits.
  std::vector<std::vector<double>> grads[2];
  for (int m = 0; m < 2; ++m) {
    h.loss_and_grads(m == 0 ? Recompute::None : Recompute::Selective);
    for (Parameter* p : h.model->params().params()) grads[m].push_back(testing::to_host(h.be, p->grad));
  }
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(GradientCheck, DocumentMaskedLlamaBlockEveryElement) {
  Harness h(false, 11, [](ModelSpec& m) {
    m.positions = PositionKind::Rotary;
    m.kv_heads_set = 1;
    m.norm.kind = NormKind::Rms;
    m.activation = ActivationKind::SwiGlu;
    m.linear_bias = false;
  });
  mask_documents(h);
  check_all_gradients(h, Recompute::None);
}

// No pass fills the gradients with zeros before a step (issue 40): each parameter's first
// writer in the step assigns its gradient (a GEMM with beta 0) or zeroes it before adding (norms,
// column sums, the embedding's scatter, experts that may get no rows). In every variant the
// gradients from buffers of NaN equal, bit for bit, those from zeroed buffers, and a second
// micro-batch then adds to them.
TEST(GradientCheck, FirstWritesNeedNoZeroedGradients) {
  using Adjust = void (*)(ModelSpec&);
  const std::pair<const char*, Adjust> variants[] = {
      {"gpt2", nullptr},
      {"llama", [](ModelSpec& m) { m = family_defaults("llama", m); }},
      {"qwen3 with biases", [](ModelSpec& m) { m = family_defaults("qwen3", m); m.linear_bias = true; }},
      {"swiglu with biases", [](ModelSpec& m) { m.activation = ActivationKind::SwiGlu; m.ffn_hidden_set = 24; }},
      {"grouped-query with biases", [](ModelSpec& m) { m.kv_heads_set = 1; }},
      {"mixture of experts", moe_block},
  };
  for (const auto& [name, adjust] : variants) {
    SCOPED_TRACE(name);
    for (bool tied : {true, false}) {
      SCOPED_TRACE(tied ? "tied" : "untied");
      std::vector<std::vector<double>> zeroed[2], unfilled[2];
      double losses[2];
      for (int run = 0; run < 2; ++run) {
        Harness h(tied, 11, adjust);
        std::vector<std::vector<double>>* grads = run == 0 ? zeroed : unfilled;
        losses[run] = run == 0 ? h.loss_and_grads(Recompute::None)
                               : h.loss_and_unfilled_grads(Recompute::None);
        for (Parameter* p : h.model->params().params()) {
          EXPECT_FALSE(p->grad_unwritten) << p->spec.name;
          grads[0].push_back(testing::to_host(h.be, p->grad));
        }
        h.accumulate_grads(Recompute::None);
        for (Parameter* p : h.model->params().params()) grads[1].push_back(testing::to_host(h.be, p->grad));
      }
      EXPECT_EQ(losses[0], losses[1]);
      EXPECT_EQ(zeroed[0], unfilled[0]) << "first micro-batch";
      EXPECT_EQ(zeroed[1], unfilled[1]) << "second micro-batch";
    }
  }
}

// Recomputation must not change a single bit of the gradients: it re-runs the same kernels on
// the same inputs.
TEST(GradientCheck, RecomputeModesGiveIdenticalGradients) {
  std::vector<std::vector<double>> grads[3];
  const Recompute modes[3] = {Recompute::None, Recompute::Selective, Recompute::Full};
  for (int m = 0; m < 3; ++m) {
    Harness h(true);
    h.loss_and_grads(modes[m]);
    for (Parameter* p : h.model->params().params()) grads[m].push_back(testing::to_host(h.be, p->grad));
  }
  EXPECT_EQ(grads[0], grads[1]) << "selective";
  EXPECT_EQ(grads[0], grads[2]) << "full";
}

// bf16 mixed precision. A finite difference of a bf16 loss would measure its rounding (a bf16
// loss moves in steps of 2^-8 of itself), not the gradient; instead the bf16 model's gradients
// must follow the fp32 model's, both computed from the same parameter values (rounded to bf16,
// so that only the arithmetic differs). A model of GPT-2's proportions, small: 2 layers, d 64,
// 4 heads, T 32, vocabulary 96, 4 sequences.
//
// Tolerance: every bf16 activation and activation gradient carries a relative rounding error of
// up to 2^-8 = 3.9e-3 (8 significant bits), about 1.5e-3 root-mean-square; a parameter gradient
// collects the errors of the roundings on its path from the loss (dlogits, each block's dinp,
// the residual sums, LayerNorm, attention's P and dS: some 10-20 of them here), largely
// independent, so norm-wise per tensor the difference is about 1e-2 (measured 2.4e-3 for ln_f
// to 1.2e-2). Held to 3e-2 per tensor, and the loss (fp32 statistics of bf16 logits; measured
// 4e-5) to 1e-3: a wrong term — a missing factor, a bf16 gradient accumulation, a dropped cast —
// shows up as an error of order 1.
struct PrecisionRun {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

PrecisionRun run_in(DType dtype, const std::map<std::string, std::vector<double>>& values,
                    const ModelSpec& cfg) {
  CpuBackend be(2);
  MpiCommunicator tp_comm(MPI_COMM_SELF, "tp");
  const TensorParallel tp{&tp_comm, SequenceParallel::Off};
  DecoderModel model(be, tp, cfg, balanced_partition(cfg, 1), dtype);
  const DType grad_dtype = dtype == DType::BF16 ? DType::F32 : dtype;  // as ModelState keeps them
  for (Parameter* p : model.params().params()) {
    p->value = testing::make_tensor(be, values.at(p->spec.name), p->shape, dtype,
                                    MemoryCategory::Parameters);
    p->grad = be.zeros(p->shape, grad_dtype, MemoryCategory::Gradients);
  }
  MicroBatchData mb;
  mb.shape = TokenShape{4, cfg.seq_len, {}};
  std::vector<int32_t> tokens(mb.shape.N()), targets(mb.shape.N());
  for (int64_t i = 0; i < mb.shape.N(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % cfg.vocab_size);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % cfg.vocab_size);
  }
  mb.tokens = testing::make_tokens(be, tokens);
  mb.targets = testing::make_tokens(be, targets);
  UnitHooks hooks;
  ModelChunk::Saved saved;
  double sum = 0;
  const double dloss = 1.0 / static_cast<double>(mb.shape.N());
  model.chunk(0).forward(mb, {}, saved, Pass::Train, Recompute::None, dloss, &sum, hooks);
  model.chunk(0).backward(mb, {}, saved, Recompute::None, hooks);
  PrecisionRun r;
  r.loss = sum * dloss;
  for (Parameter* p : model.params().params()) r.grads[p->spec.name] = testing::to_host(be, p->grad);
  return r;
}

TEST(GradientCheck, Bf16GradientsFollowTheFp32Model) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    ModelSpec cfg;
    cfg.layers = 2;
    cfg.d_model = 64;
    cfg.heads = 4;
    cfg.seq_len = 32;
    cfg.vocab_size = 96;
    cfg.tie_embeddings = tied;
    // Initial values (GPT-2's init plus the noise of Harness), rounded to bf16 for both runs.
    std::map<std::string, std::vector<double>> values;
    {
      CpuBackend be(1);
      MpiCommunicator tp_comm(MPI_COMM_SELF, "tp");
      DecoderModel model(be, TensorParallel{&tp_comm, SequenceParallel::Off}, cfg,
                     balanced_partition(cfg, 1), DType::F32);
      model.params().materialize(be, DType::F32);
      model.params().initialize(be, 13);
      for (Parameter* p : model.params().params()) {
        std::vector<double> v = testing::to_host(be, p->value);
        const std::vector<double> noise = testing::random_normal(v.size(), hash_name(p->spec.name), 0.1);
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v[i] + noise[i])));
        values[p->spec.name] = v;
      }
    }
    const PrecisionRun f32 = run_in(DType::F32, values, cfg), b16 = run_in(DType::BF16, values, cfg);
    const double loss_error = std::abs(b16.loss - f32.loss) / std::abs(f32.loss);
    std::printf("# %s: loss fp32 %.6f bf16 %.6f (relative %.1e)\n", tied ? "tied" : "untied",
                f32.loss, b16.loss, loss_error);
    EXPECT_LT(loss_error, 1e-3);
    for (const auto& [name, want] : f32.grads) {
      const std::vector<double>& got = b16.grads.at(name);
      double diff2 = 0, ref2 = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        diff2 += (got[i] - want[i]) * (got[i] - want[i]);
        ref2 += want[i] * want[i];
      }
      const double rel = std::sqrt(diff2 / ref2);
      std::printf("#   %-24s %.2e\n", name.c_str(), rel);
      EXPECT_LT(rel, 3e-2) << name;
    }
  }
}

}  // namespace
}  // namespace meshtrain
