// Layout invariance (DESIGN invariant 1): the same deck trained on any dp x tp x pp x cp layout,
// with any schedule, micro-batch count, sequence parallelism, ZeRO stage or recomputation, follows
// the single-rank trajectory (one micro-batch, no ZeRO) over 5 AdamW steps, in fp64, fp32 and
// bf16 mixed precision, to within what the precision's own rounding does to that trajectory
// (support/parity_tolerance.h derives each bound; the reference's distance from a finer
// precision measures that rounding on this deck, under whatever ISA oneDNN runs). The same
// layout run twice is bitwise identical, in fp32 and bf16.
//
// One binary, launched by CTest under mpiexec with 1, 2, 4 and 8 ranks; each launch runs the
// layouts of its world size.

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/model/expert_load.h"
#include "meshtrain/parallel/muon_matrices.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/slowdown.h"
#include "meshtrain/train/trainer.h"
#include "support/isa_cap.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/parity_tolerance.h"
#include "support/sanitized.h"
#include "support/temp_dir.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

struct Layout {
  int dp, tp, pp;
  ScheduleKind schedule;
  int virtual_stages;
  int micro_batch;  // sequences per micro-batch; global batch 16
  bool sequence_parallel;
  int zero = 0;
  Recompute recompute = Recompute::None;
  // Declared rank speeds (parallel.balance = "declared"): uneven data-parallel shares and a
  // speed-weighted pipeline partition (train/work_balance.h).
  std::vector<double> speeds = {};
  int cp = 1;  // context-parallel ranks: each holds 2 of the 2 cp chunks of every sequence
  // A model of its own (model_variant below); empty: the tiny GPT-2 of testing::tiny_config.
  std::string model = {};
  int ep = 1;  // expert-parallel ranks of a mixture of experts, folded over dp x cp

  std::string name() const {
    const char* rc[] = {"none", "selective", "full"};
    return "dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) +
           "_" + std::string(schedule_name(schedule)) + "_v" + std::to_string(virtual_stages) +
           "_m" + std::to_string(16 / (dp * micro_batch)) + (sequence_parallel ? "_sp" : "") +
           "_zero" + std::to_string(zero) + "_rc-" + rc[static_cast<int>(recompute)] +
           (speeds.empty() ? "" : "_uneven") + (cp > 1 ? "_cp" + std::to_string(cp) : "") +
           (model.empty() ? "" : "_" + model) + (ep > 1 ? "_ep" + std::to_string(ep) : "");
  }
  Config apply(Config c) const {
    c.parallel.dp = dp;
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.ep = ep;
    c.parallel.schedule = schedule;
    c.parallel.virtual_stages = virtual_stages;
    c.parallel.sequence_parallel = sequence_parallel;
    c.parallel.zero = zero;
    c.parallel.recompute = recompute;
    c.parallel.bucket_mb = 0.01;  // several buckets even for the tiny model
    c.train.micro_batch = micro_batch;
    if (!speeds.empty()) {
      c.parallel.balance = Balance::Declared;
      c.parallel.rank_speeds = speeds;
    }
    return c;
  }
};

using S = ScheduleKind;
using R = Recompute;

// `l` with its sequences split over `cp` ranks besides its dp x tp x pp.
Layout context_parallel(Layout l, int cp) {
  l.cp = cp;
  return l;
}

// `l` with a mixture of experts' experts split over `ep` of its dp x cp ranks.
Layout expert_parallel(Layout l, int ep) {
  l.ep = ep;
  return l;
}

// `l` on another model than the tiny GPT-2 (model_variant).
Layout on_model(Layout l, std::string model) {
  l.model = std::move(model);
  return l;
}

// A variant named "<model>_muon" (or "muon", the tiny GPT-2) trains <model> with
// train.optimizer = "muon" (optim/muon_hyper.h): its owners of matrices over the replica groups
// (parallel/muon_matrices.h) against the single rank's Muon, in fp64 (muon_runs below).
bool trains_with_muon(const std::string& model) {
  return model == "muon" || (model.size() > 5 && model.compare(model.size() - 5, 5, "_muon") == 0);
}

// The models the matrix trains besides the tiny GPT-2, each against its own single rank: every
// axis meets each variant of a sub-layer once, not every product.
ModelSpec model_variant(const std::string& name, ModelSpec m) {
  if (trains_with_muon(name)) return name == "muon" ? m : model_variant(name.substr(0, name.size() - 5), m);
  if (name == "hd12_ffn80") {
    // Attention wider than d_model (4 heads x 12 = 48 channels from 32) and an MLP 2.5 x wide:
    // tp splits both, cp rotates 12-channel heads.
    m.head_dim_set = 12;
    m.ffn_hidden_set = 80;
  } else if (name == "rms_swiglu") {
    // Llama's sub-layers: RMSNorm, SwiGLU (gate and up split by columns), no biases, untied.
    m = testing::tiny_rms_swiglu(m);
  } else if (name == "llama") {
    // Llama's block: rotary positions (Llama 3 scaling reached within the 16 positions), RMSNorm,
    // SwiGLU, no biases, untied, and grouped-query attention (4 query heads on 2 key/value
    // heads: tp 2 gives each rank one of each group).
    m.positions = PositionKind::Rotary;
    m.rope.scaling = RopeScalingKind::Llama3;
    m.rope.original_max_positions = 8;
    m.norm.kind = NormKind::Rms;
    m.norm.eps = 1e-5;
    m.activation = ActivationKind::SwiGlu;
    m.linear_bias = false;
    m.tie_embeddings = false;
    m.ffn_hidden_set = 88;
    m.kv_heads_set = 2;
  } else if (name == "llama_kv1") {
    // Llama's block with one key/value head: tp 2 goes beyond it, each rank computing the shared
    // head from the whole (replicated) k and v weights and the two summing their gradients.
    m = model_variant("llama", m);
    m.kv_heads_set = 1;
  } else if (name == "qwen3") {
    // Qwen 3's block: the family's defaults (Llama's, with each query and key head
    // RMS-normalised: weights replicated over tp, whose ranks normalise different heads), with
    // grouped-query attention and a head_dim of its own (4 x 12 query channels from 32).
    m = family_defaults("qwen3", m);
    m.rope.theta = 1000.0;  // 16 positions turn even the slowest pair visibly
    m.ffn_hidden_set = 72;
    m.kv_heads_set = 2;
    m.head_dim_set = 12;
  } else if (name == "qwen3_yarn") {
    // Qwen 3's block with YaRN's rotary scaling: cos and sin times 0.1 ln 4 + 1, and with head_dim
    // 12, theta 1000 and an original context of 4096 the ramp runs from pair 2 to pair 6 (pairs
    // 3 to 5 blended: YaRN's frequencies do not depend on how far the positions reach).
    m = model_variant("qwen3", m);
    m.rope.scaling = RopeScalingKind::Yarn;
    m.rope.factor = 4.0;
    m.rope.original_max_positions = 4096;
  } else if (name == "moe") {
    m = testing::tiny_moe(m);
  } else if (name == "moe_sigmoid") {
    // DeepSeek-V3's router on the same mixture: sigmoid scores, gates scaled, the expert bias
    // moved by a gamma large enough to change choices within the run, from the loads of the
    // whole job (every rank's copy alike, every layer's on every pipeline stage).
    m = model_variant("moe", m);
    m.moe.router = RouterKind::Sigmoid;
    m.moe.route_scale = 2.5;
    m.moe.bias_update_rate = 0.01;
  } else if (name == "moe_grouped") {
    // DeepSeek-V3's group-limited routing on the sigmoid router: 8 experts in 4 groups of 2, each
    // token's top 2 from the best 2 groups (ranked with the expert bias the job moves).
    m = model_variant("moe_sigmoid", m);
    m.moe.experts = 8;
    m.moe.groups = 4;
    m.moe.top_groups = 2;
  } else if (name == "moe_skewed") {
    // Eight experts (ep 2 and 4 hold 4 and 2 each) and no balancing loss to even them out.
    m = model_variant("moe", m);
    m.moe.experts = 8;
    m.moe.aux_loss = 0;
  } else if (name == "llama_docs") {
    // Llama's block under document masking (with_documents): the vocabulary grows to hold the
    // tokenizer's end-of-text token.
    m = model_variant("llama", m);
    m.vocab_size = 272;
  } else if (name == "llama_swa" || name == "llama_swa_docs") {
    // Sliding windows (model.attention_window, Gemma 3's pattern): blocks 0 and 2 see 16 keys
    // of 64, blocks 1 and 3 all; with documents (llama_swa_docs) the later of the window's and
    // the document's start bounds a query's keys.
    m = model_variant(name == "llama_swa" ? "llama" : "llama_docs", m);
    m.seq_len = 64;
    m.attention_window = {16, 0};
  } else if (name == "mla" || name == "mla_yarn") {
    // Multi-head latent attention (model/latent_attention.h) in Llama's dense block: queries
    // through a rank-24 path, a latent of 16, query/key heads of 8 + 4 rotary channels (the
    // rotary key one head shared by all four), value heads of 10: the ring carries keys and
    // values of unequal widths. The down-projections and their norms are replicated over tp,
    // the up-projections split by heads.
    m = model_variant("llama", m);
    m.kv_heads_set = 0;
    m.attention = AttentionKind::Latent;
    m.latent = LatentSpec{24, 16, 8, 4, 10};  // q_lora, kv_lora, nope, rope, value
    // mla_yarn: YaRN as DeepSeek-V3 has it, the softmax scale gains m^2 (the 2-rank rows).
    if (name == "mla") return m;
    m.rope.scaling = RopeScalingKind::Yarn;
    m.rope.factor = 4.0;
    m.rope.original_max_positions = 4;
    m.rope.mscale = m.rope.mscale_all_dim = 1.0;
  } else if (name == "dsv3_mtp") {
    // DeepSeek-V3's model with one multi-token prediction depth (model/mtp_module.h): latent
    // attention, sigmoid-routed experts in 4 groups of 2 (top 2 of the best 2 groups) with a
    // shared expert after a dense first block, and the depth's block a mixture too (its own
    // expert bias); the depth runs inside the head, its eh_proj replicated over tp.
    const ModelSpec latent = model_variant("mla", m);
    m = model_variant("moe_grouped", m);
    m.attention = latent.attention;
    m.latent = latent.latent;
    m.positions = latent.positions;
    m.rope = latent.rope;
    m.kv_heads_set = 0;
    m.moe.shared_ffn_hidden = 16;
    m.moe.first_dense_layers = 1;
    m.mtp_layers = 1;
  } else if (name == "blend") {
    // The tiny GPT-2 on a weighted blend of two sources (with_blend): the data, not the model.
  } else if (!name.empty()) {
    ADD_FAILURE() << "unknown model variant " << name;
  }
  return m;
}

// Variants whose routing is a discrete choice (a mixture of experts): bf16's rounding of the
// router logits turns near-ties into other experts on another layout, a jump that no rounding
// bound describes; fp64 and fp32 keep their routing.
bool routes_discretely(const std::string& model) { return model.rfind("moe", 0) == 0; }

// "moe_skewed": its routers start with every row but those of experts 0 and 1 zeroed, so that
// the other experts' logits tie at 0 and the ties go to the lower index: each token takes expert
// 0 or 1 where its logit is positive and experts 2 and 3 otherwise, experts 4 to 7 nothing, and
// the expert ranks receive very different row counts from each peer (some none).
testing::InitialChange initial_change(const std::string& model) {
  if (model != "moe_skewed") return nullptr;
  return [](Trainer& trainer, Backend& backend) {
    testing::scale_rows_from(trainer, backend, ".router.weight", 2, 0.0);
  };
}

// Variants trained with data.document_mask = true on documents_data's shard.
bool masks_documents(const std::string& model) {
  return model.size() > 5 && model.compare(model.size() - 5, 5, "_docs") == 0;
}

// A shard of packed documents of 1 to 9 tokens (several per 16-token sequence, ending on every
// position, cp's chunk boundaries included), each closed by the end-of-text token of a small
// GPT-2 tokenizer (testing::tiny_gpt2_files, id 265) written beside it; `c` reads them with
// data.document_mask on. Each rank writes its own copy (its TempDir), the same bytes.
Config with_documents(Config c, const std::string& dir) {
  const std::unique_ptr<Tokenizer> tokenizer =
      make_gpt2_bpe_tokenizer(testing::tiny_gpt2_files(), "tiny GPT-2");
  const uint32_t end = *tokenizer->end_of_text();
  std::mt19937 rng(2407);
  std::vector<uint32_t> tokens;
  while (tokens.size() < 8192) {
    const int length = std::uniform_int_distribution<int>(1, 9)(rng);
    for (int i = 1; i < length; ++i) tokens.push_back(std::uniform_int_distribution<uint32_t>(0, 264)(rng));
    tokens.push_back(end);
  }
  write_token_shard(dir + "/documents.bin", tokens, tokenizer->vocab_size());
  tokenizer->save(dir + "/documents_tokenizer.json");
  c.data.train = {dir + "/documents.bin"};
  c.data.tokenizer = dir + "/documents_tokenizer.json";
  c.data.document_mask = true;
  return c;
}

// data.train as a blend (train/blended_dataset.h) of two shards of disjoint token ranges, weighted
// 0.7 and 0.3, the small one short enough to wrap within the run: every layout must draw the
// same sources and samples at every position. Each rank writes its own copy, the same bytes.
Config with_blend(Config c, const std::string& dir) {
  std::mt19937 rng(56);
  const auto vocab = static_cast<uint32_t>(c.model.vocab_size);
  std::vector<uint32_t> wide, narrow;
  for (int i = 0; i < 4096; ++i) wide.push_back(std::uniform_int_distribution<uint32_t>(0, vocab / 2 - 1)(rng));
  for (int i = 0; i < 300; ++i) narrow.push_back(std::uniform_int_distribution<uint32_t>(vocab / 2, vocab - 1)(rng));
  write_token_shard(dir + "/blend_wide.bin", wide, vocab);
  write_token_shard(dir + "/blend_narrow.bin", narrow, vocab);
  c.data.train.clear();
  c.data.train_blend = {{{dir + "/blend_wide.bin"}, 0.7, "wide"}, {{dir + "/blend_narrow.bin"}, 0.3, "narrow"}};
  return c;
}

// Every axis alone and combined; 1 to 8 micro-batches; all schedules; SP on and off; each ZeRO
// stage and recompute mode, alone and with tp and pp.
std::vector<Layout> layouts_for(int world) {
  switch (world) {
    case 1: return {
        {1, 1, 1, S::OneFOneB, 1, 2, false},            // 8 micro-batches of gradient accumulation
        {1, 1, 1, S::GPipe, 2, 4, false},               // two chunks on one rank
        {1, 1, 1, S::OneFOneB, 1, 4, false, 1},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 2},
        {1, 1, 1, S::GPipe, 1, 4, false, 3},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Selective},
        {1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Full},
        {1, 1, 1, S::ZeroBubbleH1, 1, 2, false},        // I and W apart on one rank
        {1, 1, 1, S::ZeroBubbleH1, 1, 4, false, 3, R::Full},
        {1, 1, 1, S::ZeroBubbleV, 2, 2, false},         // both V chunks on one rank
        on_model({1, 1, 1, S::OneFOneB, 1, 2, false, 0, R::Full}, "moe"),
    };
    case 2: return {
        {2, 1, 1, S::OneFOneB, 1, 8, false},
        {2, 1, 1, S::OneFOneB, 1, 2, false},
        {1, 2, 1, S::OneFOneB, 1, 8, false},
        {1, 2, 1, S::GPipe, 1, 4, true},
        {1, 1, 2, S::GPipe, 1, 2, false},
        {1, 1, 2, S::OneFOneB, 1, 4, false},
        {1, 1, 2, S::OneFOneB, 1, 16, false},           // one micro-batch
        {1, 1, 2, S::Interleaved, 2, 2, false},
        {1, 1, 2, S::Interleaved, 4, 4, false},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 1},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 2},
        {2, 1, 1, S::OneFOneB, 1, 4, false, 3},
        {2, 1, 1, S::GPipe, 1, 2, false, 3, R::Full},
        {1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective},
        {1, 1, 2, S::OneFOneB, 1, 2, false, 0, R::Full},
        {2, 1, 1, S::OneFOneB, 1, 2, false, 0, R::None, {1.0, 0.4}},   // shares 6 and 2
        {2, 1, 1, S::GPipe, 1, 1, false, 1, R::Selective, {0.3, 1.0}},  // ZeRO-1, shares 4 and 12
        {1, 1, 2, S::OneFOneB, 1, 2, false, 0, R::None, {1.0, 0.5}},   // 3 + 1 layers
        {1, 1, 2, S::ZeroBubbleH1, 1, 2, false},
        {1, 1, 2, S::ZeroBubbleH1, 1, 4, false, 0, R::Selective},
        {1, 1, 2, S::ZeroBubbleV, 2, 2, false},         // embedding and head on rank 0
        {1, 1, 2, S::ZeroBubbleV, 2, 4, false, 0, R::Selective},
        context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2),
        // Document masking: ring blocks masked by document across the two ranks' chunks, and
        // the plain masked attention in a pipeline whose selective recomputation rebuilds it.
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Selective}, 2),
                 "llama_docs"),
        on_model({1, 1, 2, S::OneFOneB, 1, 4, false, 0, R::Selective}, "llama_docs"),
        // A blend of two weighted sources: data parallelism (uneven shares) and a pipeline.
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 1, R::None, {1.0, 0.4}}, "blend"),
        on_model({1, 1, 2, S::OneFOneB, 1, 4, false}, "blend"),
        context_parallel({1, 1, 1, S::GPipe, 1, 16, false, 1, R::Full}, 2),
        context_parallel({1, 1, 1, S::OneFOneB, 1, 2, false, 3, R::Selective}, 2),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true}, "hd12_ffn80"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "hd12_ffn80"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "rms_swiglu"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 3}, "rms_swiglu"),
        on_model({1, 1, 2, S::ZeroBubbleV, 2, 2, false, 0, R::Full}, "rms_swiglu"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true}, "llama"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false, 0, R::Selective}, 2), "llama"),
        on_model({2, 1, 1, S::GPipe, 1, 2, false, 3, R::Full}, "llama"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "qwen3"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 0, R::None, {1.0, 0.4}}, "qwen3"),  // shares 6, 2
        // tp beyond the key/value heads (2 ranks share the one head), with sp.
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true}, "llama_kv1"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "qwen3_yarn"),
        // Sliding windows over tp (with sp), pp (recomputed) and dp (ZeRO-1), with documents.
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true}, "llama_swa"),
        on_model({1, 1, 2, S::OneFOneB, 1, 4, false, 0, R::Selective}, "llama_swa"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 1}, "llama_swa"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, false}, "llama_swa_docs"),
        on_model({2, 1, 1, S::GPipe, 1, 2, false, 0, R::Full}, "llama_swa_docs"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, false}, "moe"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "moe"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 3}, "moe"),
        on_model({1, 1, 2, S::ZeroBubbleV, 2, 2, false, 0, R::Full}, "moe"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "moe"),
        on_model(expert_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 1}, 2), "moe_sigmoid"),
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "moe_grouped"),
        // Expert parallelism: over the data ranks, over the context ranks, with ZeRO-3 and full
        // recomputation (the dispatch re-run), and under skewed routing with ZeRO-1.
        on_model(expert_parallel({2, 1, 1, S::OneFOneB, 1, 2, false}, 2), "moe"),
        on_model(expert_parallel(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), 2), "moe"),
        on_model(expert_parallel({2, 1, 1, S::GPipe, 1, 2, false, 3, R::Full}, 2), "moe"),
        on_model(expert_parallel({2, 1, 1, S::OneFOneB, 1, 4, false, 1}, 2), "moe_skewed"),
        // Muon: matrices owned across the data group (GPT-2's fused qkv, Llama's separate
        // projections and SwiGLU), across dp x cp, and experts across the expert-data group.
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false}, "muon"),
        on_model({2, 1, 1, S::GPipe, 1, 2, false, 0, R::Full}, "llama_muon"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "llama_muon"),
        on_model(expert_parallel({2, 1, 1, S::OneFOneB, 1, 2, false}, 2), "moe_muon"),
        // Muon's matrices gathered whole: tp (GPT-2's fused qkv split by rows, the projection
        // by columns), ZeRO-1's pieces (Llama) and ZeRO-3's (GPT-2).
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true}, "muon"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 1}, "llama_muon"),
        on_model({2, 1, 1, S::GPipe, 1, 2, false, 3}, "muon"),
        // Latent attention: tp with sp (the latents all-gathered at the region's entry) and
        // selective recomputation; the ring; zb-v with full recomputation; ZeRO-3.
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "mla_yarn"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "mla_yarn"),
        on_model({1, 1, 2, S::ZeroBubbleV, 2, 2, false, 0, R::Full}, "mla_yarn"),
        on_model({2, 1, 1, S::GPipe, 1, 2, false, 3, R::Full}, "mla_yarn"),
        // Multi-token prediction: tp with sp (the depth's embedding reduce-scattered, its labelled
        // rows gathered); its mixture's experts split over the data ranks under ZeRO-1 and full
        // recomputation (which leaves the depth be).
        on_model({1, 2, 1, S::OneFOneB, 1, 4, true, 0, R::Selective}, "dsv3_mtp"),
        on_model(expert_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 1, R::Full}, 2), "dsv3_mtp"),
        // ... on a pipeline: the last stage's copy of the (untied) embedding, its gradient summed
        // with the first stage's; under zb-v the head's chunk shares rank 0 with the embedding.
        on_model({1, 1, 2, S::OneFOneB, 1, 2, false}, "dsv3_mtp"),
        on_model({1, 1, 2, S::ZeroBubbleV, 2, 2, false, 0, R::Full}, "dsv3_mtp"),
        on_model({2, 1, 1, S::OneFOneB, 1, 2, false, 3}, "dsv3_mtp"),
        on_model(context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 2), "dsv3_mtp"),
    };
    case 4: return {
        {1, 1, 4, S::GPipe, 1, 2, false},
        {1, 1, 4, S::OneFOneB, 1, 2, false},
        {1, 1, 4, S::Interleaved, 2, 4, false},
        {2, 2, 1, S::OneFOneB, 1, 4, false},
        {2, 2, 1, S::OneFOneB, 1, 2, true},
        {2, 1, 2, S::OneFOneB, 1, 2, false},
        {2, 1, 2, S::GPipe, 1, 8, false},
        {1, 2, 2, S::OneFOneB, 1, 4, true},
        {1, 2, 2, S::Interleaved, 2, 4, false},
        {4, 1, 1, S::OneFOneB, 1, 1, false},
        {2, 2, 1, S::OneFOneB, 1, 4, true, 1},
        {2, 2, 1, S::OneFOneB, 1, 4, true, 2},
        {2, 2, 1, S::OneFOneB, 1, 2, true, 3},
        {2, 1, 2, S::OneFOneB, 1, 2, false, 2, R::Selective},
        {2, 1, 2, S::Interleaved, 2, 4, false, 3, R::Full},
        {1, 2, 2, S::OneFOneB, 1, 4, true, 1, R::Full},
        {4, 1, 1, S::OneFOneB, 1, 1, false, 0, R::None, {1.0, 1.0, 1.0, 0.5}},  // 5 5 4 2
        {2, 1, 2, S::OneFOneB, 1, 1, false, 1, R::None, {1.0, 0.5, 1.0, 1.0}},  // stage and replica
        {2, 1, 2, S::Interleaved, 2, 1, false, 0, R::Full, {0.5, 1.0, 1.0, 1.0}},  // shares of 2
        {1, 1, 4, S::ZeroBubbleH1, 1, 2, false},
        {2, 1, 2, S::ZeroBubbleH1, 1, 2, false, 3, R::Full},
        {1, 2, 2, S::ZeroBubbleH1, 1, 4, true, 2},
        {2, 1, 2, S::ZeroBubbleH1, 1, 1, false, 1, R::None, {1.0, 0.5, 1.0, 1.0}},
        {1, 1, 4, S::ZeroBubbleV, 2, 2, false},
        {2, 1, 2, S::ZeroBubbleV, 2, 2, false, 1},
        {1, 2, 2, S::ZeroBubbleV, 2, 4, true, 0, R::Full},
        context_parallel({1, 1, 1, S::OneFOneB, 1, 4, false}, 4),
        context_parallel({1, 1, 1, S::GPipe, 1, 2, false, 3, R::Full}, 4),  // ZeRO-3 over cp
        context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true}, 2),
        context_parallel({1, 1, 2, S::ZeroBubbleH1, 1, 2, false, 1}, 2),
        context_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 2}, 2),
        on_model({2, 1, 2, S::ZeroBubbleH1, 1, 2, false, 3}, "hd12_ffn80"),
        on_model({2, 2, 1, S::OneFOneB, 1, 2, true, 1}, "rms_swiglu"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true}, 2), "rms_swiglu"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true, 1}, 2), "llama"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true, 1}, 2), "llama_docs"),
        on_model({1, 2, 2, S::ZeroBubbleH1, 1, 4, true, 2}, "llama"),
        on_model({2, 2, 1, S::OneFOneB, 1, 2, true, 3}, "blend"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 2, true, 3}, 2), "qwen3"),
        // tp 4 beyond Qwen 3's 2 key/value heads: pairs of ranks share one, with q/k norms.
        on_model({1, 4, 1, S::OneFOneB, 1, 4, false}, "qwen3"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true, 1}, 2), "moe"),
        on_model({2, 1, 2, S::ZeroBubbleH1, 1, 2, false, 2}, "moe"),
        // ep 4 with ZeRO-1; ep 2 x tp 2 (sequence-parallel) with ZeRO-2; ep 2 x pp 2 under 1F1B
        // and zb-v; ep 4 over dp 2 x cp 2 with ZeRO-3; ep 2 of 4 replicas (expert-data groups of
        // two) under skewed routing.
        on_model(expert_parallel({4, 1, 1, S::OneFOneB, 1, 1, false, 1}, 4), "moe"),
        on_model(expert_parallel({2, 2, 1, S::OneFOneB, 1, 2, true, 2}, 2), "moe"),
        on_model(expert_parallel({2, 1, 2, S::OneFOneB, 1, 2, false}, 2), "moe"),
        on_model(expert_parallel({2, 1, 2, S::ZeroBubbleV, 2, 2, false, 0, R::Selective}, 2), "moe"),
        on_model(expert_parallel(context_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 3}, 2), 4), "moe"),
        on_model(expert_parallel({4, 1, 1, S::OneFOneB, 1, 2, false, 2}, 2), "moe_skewed"),
        on_model(context_parallel({1, 2, 1, S::OneFOneB, 1, 4, true, 1}, 2), "mla"),
        // Muon over tp 2 x dp 2 with ZeRO-2: owners across both, experts whole on each tp rank.
        on_model({2, 2, 1, S::OneFOneB, 1, 4, true, 2}, "moe_muon"),
    };
    case 8: return {
        {2, 2, 2, S::GPipe, 1, 2, false},
        {2, 2, 2, S::OneFOneB, 1, 2, true},
        {2, 2, 2, S::OneFOneB, 1, 8, false},
        {2, 2, 2, S::Interleaved, 2, 4, true},
        {2, 2, 2, S::Interleaved, 4, 2, false},
        {1, 2, 4, S::OneFOneB, 1, 2, true},
        {2, 1, 4, S::Interleaved, 2, 2, false},
        {2, 2, 2, S::OneFOneB, 1, 2, true, 1},
        {2, 2, 2, S::OneFOneB, 1, 4, true, 2, R::Selective},
        {2, 2, 2, S::Interleaved, 2, 2, true, 3, R::Full},
        {2, 2, 2, S::OneFOneB, 1, 1, true, 1, R::Selective, {1, 1, 1, 1, 1, 1, 0.5, 0.5}},
        {2, 2, 2, S::ZeroBubbleH1, 1, 2, true, 3, R::Selective},
        {1, 2, 4, S::ZeroBubbleH1, 1, 2, true, 1},
        context_parallel({1, 2, 2, S::OneFOneB, 1, 2, true}, 2),
        context_parallel({1, 2, 2, S::ZeroBubbleV, 2, 4, true, 1, R::Selective}, 2),
        context_parallel({2, 1, 1, S::OneFOneB, 1, 2, false, 3, R::Full}, 4),
        context_parallel({1, 1, 2, S::Interleaved, 2, 4, false, 2}, 4),
        on_model(context_parallel({1, 2, 2, S::OneFOneB, 1, 2, true, 3}, 2), "llama"),
        on_model({2, 2, 2, S::ZeroBubbleV, 2, 2, true, 1, R::Full}, "qwen3"),
        on_model({2, 2, 2, S::OneFOneB, 1, 2, true, 3}, "moe"),
        on_model(expert_parallel({2, 2, 2, S::ZeroBubbleH1, 1, 2, true, 1}, 2), "moe"),
        on_model({4, 1, 2, S::OneFOneB, 1, 2, false}, "llama_muon"),  // Muon: dp 4 x pp 2
    };
    default: return {};
  }
}

// What a layout exercises that another may not: each parallel axis, schedule, ZeRO stage and
// recomputation mode, sequence parallelism, virtual stages, uneven shares, one micro-batch.
std::vector<std::string> features_of(const Layout& l) {
  std::vector<std::string> f = {std::string(schedule_name(l.schedule)), "zero" + std::to_string(l.zero),
                                "rc" + std::to_string(static_cast<int>(l.recompute))};
  if (l.dp > 1) f.push_back("dp");
  if (l.tp > 1) f.push_back(l.sequence_parallel ? "tp-sp" : "tp");
  if (l.pp > 1) f.push_back("pp");
  if (l.cp > 1) f.push_back("cp");
  if (l.virtual_stages > 1) f.push_back("virtual");
  if (!l.speeds.empty()) f.push_back("uneven");
  if (l.dp * l.micro_batch == 16) f.push_back("one-micro-batch");
  if (!l.model.empty()) f.push_back(l.model);
  if (l.ep > 1) f.push_back("ep");
  return f;
}

// MESHTRAIN_PARITY_SUBSET=each-feature: the layouts, in order, that each bring a feature no
// earlier one had. CTest runs the whole matrix at the CPU's own ISA and this subset under every
// lower cap (tests/CMakeLists.txt): each axis meets each ISA, in a fraction of the time.
std::vector<Layout> selected_layouts(int world) {
  std::vector<Layout> layouts = layouts_for(world);
  const char* subset = std::getenv("MESHTRAIN_PARITY_SUBSET");
  if (!subset || std::string(subset) != "each-feature") return layouts;
  std::vector<std::string> covered;
  std::vector<Layout> out;
  for (const Layout& l : layouts) {
    bool brings = false;
    for (const std::string& f : features_of(l))
      if (std::find(covered.begin(), covered.end(), f) == covered.end()) {
        covered.push_back(f);
        brings = true;
      }
    if (brings) out.push_back(l);
  }
  return out;
}

// Steps of every run. Under the sanitizers 3 (support/sanitized.h): the first step allocates and
// starts the optimizer state, the second reuses every buffer, and after it zb-v re-plans for the
// measured costs, which the third runs; the fourth and fifth take the same paths again, which
// the sanitizers do not look at twice. The Release run keeps all 5 for the numbers.
constexpr int kSteps = testing::kSanitized ? 3 : 5;

using testing::Tolerances;

// The unit round-off of the sums (bf16 products accumulate in fp32).
double accumulation_roundoff(DType precision) { return precision == DType::F64 ? 0x1p-53 : 0x1p-24; }

// How many times `l` rounds a stored value where the single rank rounds it once
// (parity_tolerance.h): in bf16, tensor parallelism rounds each row-parallel GEMM's partial sums
// before the group adds them and rounds again, and context parallelism rounds a query row's
// attention at each of its cp merges. fp32 and fp64 only reorder their sums.
int roundings(DType precision, const Layout& l) {
  if (precision != DType::BF16) return 1;
  return std::max({1, l.tp > 1 ? 2 : 1, l.cp});
}

// What the single-rank reference's own rounding does to each metric: its distance from the same
// run in a finer precision (fp64 from fp32's, scaled by the ratio of unit round-offs).
Tolerances reference_rounding(const Config& base, const testing::Reference& ref,
                              const testing::InitialChange& change) {
  Config fine = base, coarse = base;
  fine.train.precision = base.train.precision == DType::BF16 ? DType::F32 : DType::F64;
  if (base.train.precision != DType::F64)
    return testing::rounding_effect(ref, testing::run_reference(fine, kSteps, change));
  coarse.train.precision = DType::F32;
  return testing::rounding_effect(testing::run_reference(coarse, kSteps, change), ref, 0x1p-53 / 0x1p-24);
}

// Every layout of this world size against the single rank, each held to the tolerance the
// arithmetic gives it (parity_tolerance.h).
void check_matrix(DType precision) {
  const std::vector<Layout> layouts = selected_layouts(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  if (precision == DType::BF16 && !cpu_runs_bf16())
    GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (" << testing::onednn_isa_cap().effective
                 << "; it needs AVX512_CORE): training refuses bf16 here";
  // Under the sanitizers (memory errors and undefined behaviour, not numbers: the Release run
  // proves those in every precision) 2 ranks run fp32 and bf16, whose kernels are their own
  // (mixed dtypes, roundings), and not fp64, whose kernels are fp32's templates and run under
  // the sanitizers in the unit tests; more than 2 ranks run fp32 alone: what 4 or 8 ranks add
  // (3-D meshes, ep 4, their communicators) is the same code in every precision.
  if (testing::kSanitized && precision == DType::F64)
    GTEST_SKIP() << "under the sanitizers the fp64 matrix is left to the Release run "
                    "(fp32's kernels, instantiated for double)";
  if (testing::kSanitized && world_size() > 2 && precision != DType::F32)
    GTEST_SKIP() << "under the sanitizers, " << world_size()
                 << " ranks run the fp32 matrix alone (2 ranks run fp32 and bf16)";
  testing::TempDir dir;
  // MESHTRAIN_PARITY_LAYOUTS=zb-v runs only the layouts whose name holds that text (a quick
  // check of one schedule; CTest sets nothing and runs them all).
  const char* only = std::getenv("MESHTRAIN_PARITY_LAYOUTS");
  std::vector<std::string> models;  // in order of first use: each has its own reference
  for (const Layout& l : layouts)
    if (std::find(models.begin(), models.end(), l.model) == models.end()) models.push_back(l.model);
  for (const std::string& model : models) {
    if (precision == DType::BF16 && routes_discretely(model)) continue;
    // The skewed router starts from exact ties, whose successors are near-ties that fp32's own
    // rounding decides differently on different layouts: fp64 (to round-off) is its proof.
    if (precision != DType::F64 && model == "moe_skewed") continue;
    // Muon's layouts are held to round-off in fp64 (the proof of its distribution); fp32 and
    // bf16 add nothing of Muon's that the AdamW rows do not test.
    if (precision != DType::F64 && trains_with_muon(model)) continue;
    // Latent attention under YaRN (its softmax scale m^2 / sqrt(d_qk)) is proven to round-off in
    // fp64 on each 2-rank axis. In fp32 its trajectory on tp 2 and cp 2 drifts from the single
    // rank by up to 1.5x the tolerance that fp32's own rounding of the reference gives (seen
    // under the sanitizers' build: 2.1e-5 against 1.4e-5 on h.7.attn.proj.weight), a
    // sensitivity of the trajectory, not a layout error (fp64 holds it to 1e-16); fp32 and bf16
    // of latent attention are held by the 4-rank "mla" row.
    if (precision != DType::F64 && model == "mla_yarn") continue;
    // Multi-token prediction's rows are held to round-off in fp64 (CI's time is short; its
    // kernels are the head's and the blocks' own, which the other rows run in every precision).
    if (precision != DType::F64 && model == "dsv3_mtp") continue;
    // tp beyond the key/value heads is proven in fp64 (its logic: replicated rows, summed
    // gradients); its arithmetic is the GQA projections' of the other rows.
    if (precision != DType::F64 && model == "llama_kv1") continue;
    Config base = testing::tiny_config(dir.path());
    base.train.precision = precision;
    base.model = model_variant(model, base.model);
    if (trains_with_muon(model)) base.train.optimizer = OptimizerKind::Muon;
    if (masks_documents(model)) base = with_documents(base, dir.path());
    if (model == "blend") base = with_blend(base, dir.path());
    const testing::InitialChange change = initial_change(model);
    const testing::Reference ref = testing::run_reference(base, kSteps, change);
    const Tolerances rounding = reference_rounding(base, ref, change);
    const std::string dtype(dtype_name(precision));
    if (world_rank() == 0)
      std::printf("# %s%s: the reference's own rounding moves %10.2e %10.2e %10.2e %10.2e\n"
                  "# %s: %-46s %10s %10s %10s %10s  (tolerance: rounding x 2 x (roundings + 1))\n",
                  dtype.c_str(), model.empty() ? "" : (" " + model).c_str(), rounding.loss,
                  rounding.params, rounding.each_tensor, rounding.each_element, dtype.c_str(),
                  "layout", "loss", "params", "tensor", "element");
    for (const Layout& l : layouts) {
      if (l.model != model || (only && l.name().find(only) == std::string::npos)) continue;
      SCOPED_TRACE(l.name());
      const int k = roundings(precision, l);
      const Tolerances t = testing::parity_tolerances(
          rounding, k, accumulation_roundoff(precision),
          static_cast<double>(base.train.global_batch * base.model.seq_len));
      const testing::ParityResult r = testing::run_parallel(l.apply(base), kSteps, ref, change);
      if (world_rank() == 0)
        std::printf("  %-52s %10.2e %10.2e %10.2e %10.2e  %s (k %d: %.1e %.1e %.1e %.1e)\n",
                    l.name().c_str(), r.max_loss_error, r.params_l2_error, r.max_param_l2_error,
                    r.max_param_error, r.worst_l2_param.c_str(), k, t.loss, t.params, t.each_tensor,
                    t.each_element);
      EXPECT_LT(r.max_loss_error, t.loss);
      EXPECT_LT(r.params_l2_error, t.params);
      EXPECT_LT(r.max_param_l2_error, t.each_tensor) << "worst tensor: " << r.worst_l2_param;
      EXPECT_LT(r.max_param_error, t.each_element) << "worst element in: " << r.worst_param;
    }
  }
}

// The proof of the logic: in double precision a layout only reorders sums, so it agrees with the
// single rank to fp64's rounding, element by element. A wrong slice, a missing micro-batch or a
// double-counted gradient shows up as 1e-3 or worse.
TEST(LayoutParity, Fp64EveryLayoutMatchesSingleRankToRoundoff) {
  check_matrix(DType::F64);
}

// The statement for training precision: the loss after every step and all parameters follow the
// single rank to within what fp32's own rounding does to it. Element by element that rounding is
// large under Adam (an element whose gradient is a sum that nearly cancels carries a large
// relative rounding error, and Adam normalises it into a full-size update), and so is the bound.
TEST(LayoutParity, Fp32EveryLayoutFollowsTheSingleRankTrajectory) {
  check_matrix(DType::F32);
}

// bf16 mixed precision against the single-rank bf16 run, within what bf16's own rounding does to
// that run (its distance from the fp32 one). bf16 keeps 8 significant bits: a value rounded to
// bf16 from fp32 sums that differ in their last bits (reordered by another layout, or blocked
// otherwise by another ISA's GEMM) lands on a neighbouring bf16 value now and then, which Adam
// turns into a full-size update of an element whose gradient is within bf16 noise of zero
// (zero-initialised biases): per tensor and per element the bounds catch a tensor gone wrong as
// a whole and blow-ups, no more; the loss and the parameters as a whole carry the check. Tensor
// and context parallelism round twice (partial sums, merges) where the single rank rounds once,
// and get the bound of k = 2.
TEST(LayoutParity, Bf16EveryLayoutFollowsTheSingleRankBf16Trajectory) {
  check_matrix(DType::BF16);
}

// The "moe_skewed" rows test uneven routing only if its router is skewed: in its first step
// (one rank) experts 4 to 7 of every MoE layer take no token and the busiest at least twice the
// mean.
TEST(LayoutParity, SkewedRouterFavoursTwoExperts) {
  if (world_size() != 1) GTEST_SKIP() << "runs on one rank";
  testing::TempDir dir;
  Config c = testing::tiny_config(dir.path());
  c.model = model_variant("moe_skewed", c.model);
  c.train.precision = DType::F64;
  check_layout(c, 1);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  initial_change("moe_skewed")(trainer, backend);
  const StepResult r = trainer.train_step(0);
  // The step statistics the stage reported, as the log reads them.
  const ExpertLoadReport experts = expert_load_report(r.layer_statistics, c.model);
  ASSERT_FALSE(experts.empty());
  const int64_t E = experts.experts;
  for (size_t l = 0; l < experts.layers.size(); ++l) {
    EXPECT_GE(experts.max_over_mean[l], 2.0) << "layer " << experts.layers[l];
    for (int64_t e = 4; e < E; ++e)
      EXPECT_EQ(experts.tokens[l * static_cast<size_t>(E) + static_cast<size_t>(e)], 0.0)
          << "layer " << experts.layers[l] << " expert " << e;
  }
  std::printf("  moe_skewed first step, busiest expert over the mean per layer:");
  for (double b : experts.max_over_mean) std::printf(" %.2f", b);
  std::printf("\n");
}

// Muon's Newton-Schulz divides over the replicas times the tensor ranks (parallel/
// muon_matrices.h): on tp 2 x dp 2 (ZeRO-1) every one of the 4 ranks owns matrices, no rank
// more than twice another's share of the cost, and each matrix has one owner: the owners' costs
// add up over the 4 ranks to the stage's whole matrices' cost.
TEST(LayoutParity, MuonOwnersShareTheWorkOverDpAndTp) {
  if (world_size() != 4) GTEST_SKIP() << "runs on 4 ranks (tp 2 x dp 2)";
  testing::TempDir dir;
  Config c = testing::tiny_config(dir.path());
  c = Layout{2, 2, 1, ScheduleKind::OneFOneB, 1, 4, true, 1}.apply(c);
  c.train.optimizer = OptimizerKind::Muon;
  check_layout(c, 4);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  StateLayout& layout = trainer.state().layout();
  double mine = 0, all = 0;
  for (const MuonMatrix& m : trainer.state().optimizer().muon_matrices()) {
    all += m.cost();
    if (m.owner == owner_index(layout, m.bucket)) mine += m.cost();
  }
  double least = mine, most = mine, total = mine;
  MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GT(least, 0.0);
  EXPECT_LE(most, 2 * least);
  EXPECT_DOUBLE_EQ(total, all);  // one stage: every rank lists the same whole matrices
}

// The same losses, and the same parameter bits on every rank.
void expect_bitwise_equal(const testing::ParityResult& a, const testing::ParityResult& b) {
  EXPECT_EQ(a.losses, b.losses);
  int same = a.owned_values == b.owned_values ? 1 : 0, all_same = 0;
  MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_same, 1) << "parameters differ bitwise on some rank";
}

// The layouts of the tiny GPT-2 (the bitwise checks below run on it alone).
std::vector<Layout> gpt2_layouts(int world) {
  std::vector<Layout> out;
  for (const Layout& l : layouts_for(world))
    if (l.model.empty()) out.push_back(l);
  return out;
}

TEST(LayoutParity, SameLayoutTwiceIsBitwiseIdentical) {
  const std::vector<Layout> layouts = gpt2_layouts(world_size());
  if (layouts.empty()) GTEST_SKIP() << "no layouts for " << world_size() << " ranks";
  for (DType precision : {DType::F32, DType::BF16}) {
    if (precision == DType::BF16 && !cpu_runs_bf16()) continue;  // refused here (check_matrix)
    testing::TempDir dir;
    Config base = testing::tiny_config(dir.path());
    base.train.precision = precision;
    const testing::Reference ref = testing::run_reference(base, kSteps);
    for (const Layout& l : {layouts.front(), layouts.back()}) {
      SCOPED_TRACE(l.name() + " " + std::string(dtype_name(precision)));
      const testing::ParityResult a = testing::run_parallel(l.apply(base), kSteps, ref);
      const testing::ParityResult b = testing::run_parallel(l.apply(base), kSteps, ref);
      expect_bitwise_equal(a, b);
    }
  }
}

// A zero-bubble schedule only moves each weight gradient later; every rank still adds its
// micro-batches' gradients into each element in micro-batch order. So where the gradients are
// reduced once per step (ZeRO 0 and 1) ZB-H1 and 1F1B of the same layout agree bit for bit.
TEST(LayoutParity, ZeroBubbleIsBitwiseOneFOneB) {
  std::vector<Layout> pairs;
  for (const Layout& l : gpt2_layouts(world_size()))
    if (l.schedule == S::ZeroBubbleH1 && l.zero <= 1) pairs.push_back(l);
  if (pairs.empty()) GTEST_SKIP() << "no zb-h1 layouts with ZeRO 0 or 1 for " << world_size() << " ranks";
  testing::TempDir dir;
  const Config base = testing::tiny_config(dir.path());
  const testing::Reference ref = testing::run_reference(base, kSteps);
  for (const Layout& zb : pairs) {
    Layout one_f_one_b = zb;
    one_f_one_b.schedule = S::OneFOneB;
    SCOPED_TRACE(zb.name());
    const testing::ParityResult a = testing::run_parallel(zb.apply(base), kSteps, ref);
    const testing::ParityResult b = testing::run_parallel(one_f_one_b.apply(base), kSteps, ref);
    expect_bitwise_equal(a, b);
  }
}

// Under ZB-H1 the executor pulls a weight gradient forward while it waits for a transfer, so
// which actions a weight gradient runs between depends on timing. The sums must not: a rank
// slowed four-fold (its peers then wait, and pull) gives the bits of an unslowed run. ZB-V pulls
// none; re-planned for measured costs (parallel.schedule_costs), each timing gives it its own
// schedule, and the bits of the unit schedule.
TEST(LayoutParity, ZeroBubbleIsBitwiseWhateverTheTiming) {
  // Under the sanitizers, the first layout of each zero-bubble schedule and one slowed rank: the
  // pulls and re-plans take the same paths again on the others.
  std::vector<Layout> zero_bubble;
  for (const Layout& l : gpt2_layouts(world_size()))
    if ((l.schedule == S::ZeroBubbleH1 || l.schedule == S::ZeroBubbleV) && l.pp > 1 &&
        !(testing::kSanitized && std::any_of(zero_bubble.begin(), zero_bubble.end(),
                                             [&](const Layout& z) { return z.schedule == l.schedule; })))
      zero_bubble.push_back(l);
  const int slowed_ranks = testing::kSanitized ? 1 : 2;
  if (zero_bubble.empty()) GTEST_SKIP() << "no zero-bubble pipelines for " << world_size() << " ranks";
  testing::TempDir dir;
  const Config base = testing::tiny_config(dir.path());
  const testing::Reference ref = testing::run_reference(base, kSteps);
  for (const Layout& l : zero_bubble) {
    SCOPED_TRACE(l.name());
    const testing::ParityResult even = testing::run_parallel(l.apply(base), kSteps, ref);
    // zb-v re-planned for the measured costs (after the second of the kSteps steps): another
    // schedule for every timing, the same bits.
    Config run = l.apply(base);
    run.parallel.measured_schedule_costs = l.schedule == S::ZeroBubbleV;
    if (run.parallel.measured_schedule_costs)
      expect_bitwise_equal(even, testing::run_parallel(run, kSteps, ref));
    for (int slowed = 0; slowed < slowed_ranks; ++slowed) {
      SCOPED_TRACE("world rank " + std::to_string(slowed) + " four times slower");
      if (world_rank() == slowed) set_compute_slowdown(4);
      const testing::ParityResult skewed = testing::run_parallel(run, kSteps, ref);
      set_compute_slowdown(1);
      expect_bitwise_equal(even, skewed);
    }
  }
}

}  // namespace
}  // namespace meshtrain
