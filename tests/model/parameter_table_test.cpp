// device-independent: the decks parsed here are only counted; the models run on the CPU backend.
// The parameter table (model/parameter_table.h): the parameters a model of any layout
// registers, once each; GPT-2's count as its closed form gave it; the tags that code outside
// the layers reads (split, group, role); and gradient buckets that follow the role tag.

#include "meshtrain/model/parameter_table.h"

#include <gtest/gtest.h>

#include <tuple>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/model/decoder_model.h"
#include "meshtrain/parallel/bucket_plan.h"

namespace meshtrain {
namespace {

ModelSpec small(bool tied) {
  ModelSpec m = gpt2_spec(3, 8, 2, 5, 12);
  m.tie_embeddings = tied;
  return m;
}

// GPT-2's parameters in closed form, as model_spec.cpp computed them before the table: the
// table must give the same number for every shape.
int64_t gpt2_closed_form(const ModelSpec& m) {
  const int64_t C = m.d_model;
  const int64_t block = 2 * 2 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C;
  return m.vocab_size * C * (m.tie_embeddings ? 1 : 2) + m.seq_len * C + m.layers * block + 2 * C;
}

bool same(const ParamEntry& a, const ParamEntry& b) {
  return a.name == b.name && a.shape == b.shape && a.tp_split_dim == b.tp_split_dim &&
         a.tp_split == b.tp_split && a.group == b.group && a.role == b.role;
}

TEST(ParameterTable, IsWhatEveryChunkOfAnyLayoutRegisters) {
  for (bool tied : {true, false})
    for (int tp : {1, 2})
      for (int chunks : {1, 2, 3}) {
        const ModelSpec cfg = small(tied);
        const std::vector<ParamEntry> table = parameter_table(cfg);
        CpuBackend planning(0, Execution::Plan);
        MetaCommunicator tp_comm("tp", tp - 1, tp);
        // Every chunk on one rank: together they register the whole model, and the head's
        // chunk a tied copy of the embedding when it is not the embedding's.
        DecoderModel model(planning, TensorParallel{&tp_comm, SequenceParallel::Off}, cfg,
                       balanced_partition(cfg, chunks), DType::F32);
        std::vector<ParamEntry> registered;
        int tied_copies = 0;
        for (const Parameter* p : model.params().params()) {
          if (p->tied_copy) {
            ++tied_copies;
            EXPECT_EQ(p->spec.role, ParamRole::TokenEmbedding);
            EXPECT_EQ(p->spec.global_shape, table.front().shape);
            continue;
          }
          registered.push_back(entry_of(p->spec));
          EXPECT_EQ(p->shape, split_shape(p->spec.global_shape, p->spec.tp_split_dim,
                                          p->spec.tp_split_dim < 0 ? 1 : tp));
        }
        EXPECT_EQ(tied_copies, 0) << "one rank holding every chunk shares its wte";
        ASSERT_EQ(registered.size(), table.size()) << tied << tp << chunks;
        for (size_t i = 0; i < table.size(); ++i)
          EXPECT_TRUE(same(registered[i], table[i])) << registered[i].name << " vs " << table[i].name;
      }
}

TEST(ParameterTable, CountsGpt2AsItsClosedForm) {
  for (bool tied : {true, false})
    for (int layers : {1, 2, 12})
      for (int64_t C : {8, 96, 768}) {
        ModelSpec m = small(tied);
        m.layers = layers;
        m.d_model = C;
        m.heads = C / 8;
        m.seq_len = 1024;
        m.vocab_size = 50257;
        EXPECT_EQ(m.parameter_count(), gpt2_closed_form(m)) << tied << " " << layers << " " << C;
      }
  // GPT-2 small, as published: 124,439,808 parameters.
  const ModelSpec gpt2 = gpt2_spec(12, 768, 12, 1024, 50257);
  EXPECT_EQ(gpt2.parameter_count(), 124439808);
}

TEST(ParameterTable, TagsSplitGroupAndRole) {
  for (bool tied : {true, false}) {
    const std::vector<ParamEntry> table = parameter_table(small(tied));
    auto find = [&](const std::string& name) -> const ParamEntry* {
      for (const ParamEntry& e : table)
        if (e.name == name) return &e;
      return nullptr;
    };
    ASSERT_TRUE(find("wte"));
    EXPECT_EQ(find("wte")->role, ParamRole::TokenEmbedding);
    EXPECT_EQ(find("wte")->tp_split, TpSplit::Vocab);
    EXPECT_EQ(find("h.1.attn.qkv.weight")->shape, (Shape{3, 8, 8}));
    EXPECT_EQ(find("h.1.attn.qkv.weight")->tp_split, TpSplit::OutputFeatures);
    EXPECT_EQ(find("h.1.attn.qkv.weight")->tp_split_dim, 1);
    EXPECT_EQ(find("h.1.attn.qkv.bias")->tp_split, TpSplit::OutputFeatures);
    EXPECT_EQ(find("h.2.mlp.proj.weight")->tp_split, TpSplit::InputFeatures);
    EXPECT_EQ(find("h.2.mlp.proj.bias")->tp_split, TpSplit::None);
    EXPECT_EQ(find("h.0.ln_1.weight")->tp_split, TpSplit::None);
    EXPECT_EQ(find("ln_f.bias")->tp_split_dim, -1);
    EXPECT_EQ(tied, find("lm_head.weight") == nullptr);
    if (!tied) {
      EXPECT_EQ(find("lm_head.weight")->role, ParamRole::Plain);
      EXPECT_EQ(find("lm_head.weight")->tp_split, TpSplit::Vocab);
    }
    int embeddings = 0;
    for (const ParamEntry& e : table) {
      EXPECT_EQ(e.group, ReplicaGroup::Data) << e.name;
      EXPECT_EQ(e.tp_split == TpSplit::None, e.tp_split_dim < 0) << e.name;
      embeddings += e.role == ParamRole::TokenEmbedding;
    }
    EXPECT_EQ(embeddings, 1);
  }
}

// Muon's split (train.optimizer = "muon") reads the role: every linear layer's weight inside a
// block and every expert tensor is a HiddenMatrix, and nothing else is: not the embeddings, the
// untied head, norms, biases or a mixture's router.
TEST(ParameterTable, HiddenMatricesAreTheBlocksLinearWeightsAndExperts) {
  ModelSpec llama = family_defaults("llama", small(false));
  llama.kv_heads_set = 1;
  ModelSpec moe = llama;
  moe.feed_forward = FeedForwardKind::Moe;
  moe.moe.experts = 4;
  moe.moe.top_k = 2;
  moe.moe.shared_ffn_hidden = 8;
  ModelSpec latent = family_defaults("llama", small(false));  // replicated down-projections
  latent.attention = AttentionKind::Latent;
  latent.latent = LatentSpec{6, 5, 4, 4, 6};  // q_lora, kv_lora, nope, rope, value
  for (const ModelSpec& m : {small(true), small(false), llama, moe, latent}) {
    int hidden = 0;
    for (const ParamEntry& e : parameter_table(m)) {
      const bool in_block = e.name.rfind("h.", 0) == 0;
      const bool weight = e.name.size() > 7 && e.name.compare(e.name.size() - 7, 7, ".weight") == 0;
      const bool matrix = e.shape.rank() >= 2 && in_block && weight &&
                          e.name.find(".router.") == std::string::npos;
      EXPECT_EQ(e.role == ParamRole::HiddenMatrix, matrix) << m.family << " " << e.name;
      hidden += matrix;
    }
    EXPECT_GE(hidden, 4 * m.layers) << m.family;  // attention's and the feed-forward's at least
  }
}

TEST(BucketPlan, TheTokenEmbeddingRoleNotTheNameGetsABucketAlone) {
  ParameterStore store;
  auto add = [&](const std::string& name, ParamRole role) {
    ParamSpec s;
    s.name = name;
    s.global_shape = Shape{4, 4};
    s.role = role;
    store.add(s, 0, 1);
  };
  add("a", ParamRole::Plain);
  add("embedding_of_another_family", ParamRole::TokenEmbedding);
  add("wte", ParamRole::Plain);  // a name alone means nothing
  add("b", ParamRole::Plain);
  const BucketPlan plan = make_bucket_plan(store, 1, 64.0, BucketBy::Size, DType::F32);
  // Reverse order: {b, wte}, {embedding}, {a}.
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].params.size(), 2u);
  ASSERT_EQ(plan.buckets[1].params.size(), 1u);
  EXPECT_EQ(plan.buckets[1].params[0]->spec.name, "embedding_of_another_family");
}

// A stack (q, k, v run as one product) keeps its own order inside the buckets' backward order,
// back to back, and a size limit does not cut it; parameters registered apart are no stack.
TEST(BucketPlan, AStackStaysInItsOrderInOneBucket) {
  ParameterStore store;
  auto add = [&](const std::string& name) -> Parameter& {
    ParamSpec s;
    s.name = name;
    s.global_shape = Shape{16, 16};
    return store.add(s, 0, 1);
  };
  Parameter& a = add("a");
  Parameter& q = add("q");
  Parameter& k = add("k");
  Parameter& v = add("v");
  Parameter& b = add("b");
  EXPECT_FALSE(store.stack({&a, &q, &v})) << "not registered one after another";
  EXPECT_EQ(q.stack, -1);
  ASSERT_TRUE(store.stack({&q, &k, &v}));
  EXPECT_FALSE(store.stack({&k, &v})) << "already in a stack";
  // A limit of one parameter per bucket (256 fp32 elements = 1/1024 MiB).
  const BucketPlan plan = make_bucket_plan(store, 1, 1.0 / 1024, BucketBy::Size, DType::F32);
  std::vector<std::vector<std::string>> names;
  for (const Bucket& bucket : plan.buckets) {
    names.emplace_back();
    for (const Parameter* p : bucket.params) names.back().push_back(p->spec.name);
  }
  const std::vector<std::vector<std::string>> expected{{"b"}, {"q", "k", "v"}, {"a"}};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(plan.buckets[1].offsets, (std::vector<int64_t>{0, 256, 512}));
  (void)b;
}

TEST(ParameterStore, RefusesASplitKindThatDisagreesWithTheSplitDimension) {
  ParameterStore store;
  ParamSpec s;
  s.name = "w";
  s.global_shape = Shape{4, 4};
  s.tp_split_dim = 0;  // split, but tagged TpSplit::None
  EXPECT_THROW(store.add(s, 0, 2), std::logic_error);
}

// The decks of published models count what the model cards say (Hugging Face's
// num_parameters(): Llama 3 8B 8.03B, Llama 3.2 1B 1.24B, Qwen 3 0.6B 0.60B), from the layers as
// built: a shape or a sub-layer the deck gets wrong shows here.
TEST(ParameterTable, PublishedModelsCountTheirCardsParameters) {
  for (const auto& [deck, count] : std::vector<std::pair<std::string, int64_t>>{
           {"llama3-8b.toml", 8030261248}, {"llama3.2-1b.toml", 1235814400}, {"qwen3-0.6b.toml", 596049920}}) {
    const std::string path = std::string(MESHTRAIN_INPUT_DIR) + "/" + deck;
    const Config c = parse_deck(path, read_deck_file(path), {});
    EXPECT_EQ(c.model.parameter_count(), count) << deck;
  }
}

// Mixtures of experts as published (Hugging Face's num_parameters(), and the active count the
// cards give: Mixtral 8x7B 46.7B of which 12.9B active; Qwen3-30B-A3B 30.5B, 3.3B active).
TEST(ParameterTable, MixturesOfExpertsCountTheirCardsParametersAndActiveOnes) {
  ModelSpec sizes;
  sizes.layers = 32;
  sizes.d_model = 4096;
  sizes.heads = 32;
  sizes.seq_len = 4096;
  sizes.vocab_size = 32000;
  ModelSpec mixtral = family_defaults("llama", sizes);
  mixtral.kv_heads_set = 8;
  mixtral.ffn_hidden_set = 14336;
  mixtral.feed_forward = FeedForwardKind::Moe;
  mixtral.moe.experts = 8;
  mixtral.moe.top_k = 2;
  EXPECT_EQ(mixtral.parameter_count(), 46702792704);
  EXPECT_EQ(mixtral.active_parameter_count(), 12879925248.0);
  const std::vector<ParamEntry> table = parameter_table(mixtral);
  int experts = 0;
  for (const ParamEntry& e : table)
    if (e.name == "h.31.mlp.experts.gate.weight") {
      EXPECT_EQ(e.shape, (Shape{8, 14336, 4096}));
      ++experts;
    }
  EXPECT_EQ(experts, 1);

  sizes.layers = 48;
  sizes.d_model = 2048;
  sizes.vocab_size = 151936;
  ModelSpec qwen = family_defaults("qwen3", sizes);
  qwen.kv_heads_set = 4;
  qwen.head_dim_set = 128;
  qwen.ffn_hidden_set = 6144;
  qwen.feed_forward = FeedForwardKind::Moe;
  qwen.moe.experts = 128;
  qwen.moe.top_k = 8;
  qwen.moe.ffn_hidden_set = 768;
  EXPECT_EQ(qwen.parameter_count(), 30532122624);
  EXPECT_EQ(qwen.active_parameter_count(), 3353032704.0);
  // A dense model's active parameters are all of them.
  EXPECT_EQ(family_defaults("llama", sizes).active_parameter_count(),
            static_cast<double>(family_defaults("llama", sizes).parameter_count()));
}

// DeepSeek-V3's family decks as published (their config.json shapes): DeepSeek-V3's main model
// without its multi-token prediction module, 671,026,404,352 (the technical report's 671B; the
// experts' balancing bias is a buffer, not a parameter, in HF's count as in ours), 37.55B active;
// Moonlight-16B-A3B 15.96B, 2.91B active (its paper's 15.29B and 2.24B leave out the 0.67B of
// embedding and head).
TEST(ParameterTable, DeepSeekV3DecksCountTheirPublishedParameters) {
  for (const auto& [deck, count, active] : std::vector<std::tuple<std::string, int64_t, double>>{
           {"deepseek-v3.toml", 671026404352, 37552282624.0},
           {"moonlight-16b-a3b.toml", 15960108544, 2914774528.0}}) {
    const std::string path = std::string(MESHTRAIN_INPUT_DIR) + "/" + deck;
    const Config c = parse_deck(path, read_deck_file(path), {});
    EXPECT_EQ(c.model.parameter_count(), count) << deck;
    EXPECT_EQ(c.model.active_parameter_count(), active) << deck;
    const std::vector<ParamEntry> table = parameter_table(c.model);
    int64_t without_embeddings = 0;
    for (const ParamEntry& e : table) {
      if (e.name != "wte" && e.name != "lm_head.weight") without_embeddings += e.numel();
    }
    if (deck == "moonlight-16b-a3b.toml") {
      EXPECT_EQ(without_embeddings, 15289019904) << deck;
    }
  }
}

// DeepSeek-V3 with its one multi-token prediction depth (num_nextn_predict_layers 1): the depth
// adds 11,610,067,968 here (enorm, hnorm, eh_proj, a mixture block, the final norm), and DeepSeek's
// checkpoints hold it with its own embedding and head as well, 2 x 129,280 x 7,168 more:
// 13,463,426,048, the model card's "14B MTP module" (plan prints both).
TEST(ParameterTable, DeepSeekV3MultiTokenModuleCountsAsPublished) {
  const std::string path = std::string(MESHTRAIN_INPUT_DIR) + "/deepseek-v3.toml";
  const Config c = parse_deck(path, read_deck_file(path), {"model.mtp_layers=1"});
  const int64_t depth = c.model.parameter_count() - 671026404352;
  EXPECT_EQ(depth, 11610067968);
  EXPECT_EQ(depth + 2 * c.model.vocab_size * c.model.d_model, 13463426048);
}

}  // namespace
}  // namespace meshtrain
