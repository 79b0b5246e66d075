// Cost sheets (model/cost_sheet.h, model/model_costs.h): the totals a model's layers report
// equal counts made here from first principles, and a layer of another width reports another
// sheet, so that the time model, the partition and the FLOP counts follow the layers.

#include "meshtrain/model/cost_sheet.h"

#include <gtest/gtest.h>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/model/mlp.h"
#include "meshtrain/model/model_costs.h"
#include "meshtrain/model/parameter_table.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/model/qkv_projection.h"

namespace meshtrain {
namespace {

std::vector<ModelSpec> shapes() {
  const auto spec = [](int layers, int64_t d, int64_t heads, int64_t T, int64_t V, bool tied) {
    ModelSpec m = gpt2_spec(layers, d, heads, T, V);
    m.tie_embeddings = tied;
    return m;
  };
  return {spec(3, 8, 2, 5, 12, true), spec(3, 8, 2, 5, 12, false), spec(12, 768, 12, 1024, 50257, true),
          spec(5, 96, 3, 64, 1000, false)};
}

double sheet_parameters(const ModelCostSheet& s) {
  double n = s.embedding.multiplying_parameters() + s.head.multiplying_parameters();
  for (const CostSheet& b : s.blocks) n += b.multiplying_parameters();
  return n;
}

TEST(CostSheet, ParametersAreTheParameterTables) {
  for (const ModelSpec& cfg : shapes()) {
    const ModelCostSheet& s = model_cost_sheet(cfg);
    ASSERT_EQ(s.blocks.size(), static_cast<size_t>(cfg.layers));
    const double position_table = static_cast<double>(cfg.seq_len * cfg.d_model);
    // An untied token table is only looked up: the head's own weight multiplies.
    const double lookup_table = cfg.tie_embeddings ? 0.0 : static_cast<double>(cfg.vocab_size * cfg.d_model);
    // Every parameter once: the multiplying ones and the lookup tables.
    EXPECT_EQ(sheet_parameters(s) + position_table + lookup_table,
              static_cast<double>(total_numel(parameter_table(cfg))))
        << cfg.layers << " " << cfg.d_model << " tied " << cfg.tie_embeddings;
    // The head's weight is the embedding's exactly when tied.
    double shared = 0;
    for (const ParameterCost& p : s.head.parameters) shared += p.shared ? static_cast<double>(p.numel) : 0;
    EXPECT_EQ(shared, cfg.tie_embeddings ? static_cast<double>(cfg.vocab_size * cfg.d_model) : 0.0);
  }
}

TEST(CostSheet, FlopsPerTokenAreSixNPlusAttention) {
  for (const ModelSpec& cfg : shapes()) {
    // PaLM's count, from the table: every parameter but the lookup tables (positions, and the
    // token table when the head has a weight of its own) multiplies once forward and twice
    // backward; attention's q k^T and p v, 2 T C FLOPs each per token and layer forward, three
    // times over for training.
    const double N = static_cast<double>(total_numel(parameter_table(cfg)) - cfg.seq_len * cfg.d_model -
                                         (cfg.tie_embeddings ? 0 : cfg.vocab_size * cfg.d_model));
    const double attention = 3.0 * 2.0 * (2.0 * cfg.seq_len * cfg.d_model) * cfg.layers;
    // Exactly: the sums are of whole numbers, as the closed form 6 N + 12 L C T gave them.
    EXPECT_EQ(cfg.flops_per_token(), 6 * N + attention) << cfg.d_model;
    // A block's GEMM FLOPs: 6 per weight (the biases add, multiply nothing) plus its attention.
    const double C = static_cast<double>(cfg.d_model);
    const double block_weights = 3 * C * C + C * C + 4 * C * C + 4 * C * C;
    EXPECT_EQ(block_cost(cfg), 6 * block_weights + attention / cfg.layers);
    EXPECT_EQ(head_cost(cfg), 6 * C * static_cast<double>(cfg.vocab_size));
  }
}

TEST(CostSheet, GemmsSplitAsTheirLayersDo) {
  const ModelSpec cfg = gpt2_spec(2, 16, 4, 8, 32);
  const CostSheet& block = model_cost_sheet(cfg).blocks.front();
  ASSERT_EQ(block.linears.size(), 4u);
  EXPECT_EQ(block.column_parallel_linears(), 2);
  EXPECT_EQ(block.row_parallel_linears(), 2);
  // The QKV projection on one of two tensor-parallel ranks, 10 tokens: (10 x 16) (16 x 24).
  const LinearCost& qkv = block.linears.front();
  EXPECT_EQ(qkv.forward(10, 2), (GemmShape{10, 24, 16, GemmPass::Forward}));
  EXPECT_EQ(qkv.backward_data(10, 2), (GemmShape{10, 16, 24, GemmPass::BackwardData}));
  EXPECT_EQ(qkv.backward_weight(10, 2), (GemmShape{16, 24, 10, GemmPass::BackwardWeight}));
  // The output projection splits its inputs instead.
  EXPECT_EQ(block.linears[1].forward(10, 2), (GemmShape{10, 16, 8, GemmPass::Forward}));
  ASSERT_EQ(block.attention.size(), 1u);
  EXPECT_EQ(block.attention.front().heads, 4);
  EXPECT_EQ(block.attention.front().head_size, 4);
  // On two ranks: the split weights and column biases halve, LayerNorms and row biases do not.
  const double C = 16;
  EXPECT_EQ(block.local_parameters(2), 12 * C * C / 2 + 7 * C / 2 + 6 * C);
}

// Multi-head latent attention at DeepSeek-V3's shapes (hidden 7168, 128 heads, q_lora_rank
// 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; HF DeepseekV3Config): per layer
// q_a 1536 x 7168, its norm 1536, q_b 128 x 192 x 1536, kv_a 576 x 7168, its norm 512, kv_b
// 128 x 256 x 512 and o_proj 7168 x 128 x 128: 187,107,328 parameters, every one in the sheet;
// the core scores with 192-wide heads and sums 128-wide values.
TEST(CostSheet, LatentAttentionAtDeepSeekV3Shapes) {
  ModelSpec m = gpt2_spec(1, 7168, 128, 16, 64);
  m.norm = {NormKind::Rms, 1e-6};
  m.positions = PositionKind::Rotary;
  m.activation = ActivationKind::SwiGlu;
  m.linear_bias = false;
  m.tie_embeddings = false;
  m.ffn_hidden_set = 8;
  m.attention = AttentionKind::Latent;
  m.latent = LatentSpec{1536, 512, 128, 64, 128};
  const double C = 7168, V = 64, F = 8, T = 16;
  const double latent = 1536 * C + 1536 + 128 * 192 * 1536 + 576 * C + 512 + 128 * 256 * 512 + C * 128 * 128;
  EXPECT_EQ(latent, 187107328.0);
  // The token table, the head, three norms and the SwiGLU MLP besides.
  const double total = 2 * V * C + 3 * C + 3 * C * F + latent;
  EXPECT_EQ(static_cast<double>(m.parameter_count()), total);
  const ModelCostSheet& s = model_cost_sheet(m);
  EXPECT_EQ(sheet_parameters(s) + V * C, total) << "the untied token table is only looked up";
  ASSERT_EQ(s.blocks.front().attention.size(), 1u);
  const AttentionCost& core = s.blocks.front().attention.front();
  EXPECT_EQ(core.heads, 128);
  EXPECT_EQ(core.head_size, 192);
  EXPECT_EQ(core.value_size, 128);
  EXPECT_EQ(core.weighted_sum(10, 20), (GemmShape{10, 128, 20}));
  EXPECT_EQ(m.flops_per_token(), 6 * (total - V * C) + 6 * T * 128 * (192 + 128));
  // Over two tensor ranks the down-projections and their norms stay whole.
  const double replicated = 1536 * C + 1536 + 576 * C + 512;
  const double local = s.blocks.front().local_parameters(2);
  EXPECT_EQ(local, replicated + (latent - replicated) / 2 + 2 * C + (3 * C * F) / 2);
  // Generation's cache: the latent and the rotary key, 512 + 64 per token, whole on every tp
  // rank (expanded keys and values would be 128 x (192 + 128) = 40960, split).
  ASSERT_EQ(s.blocks.front().decode_cache.size(), 1u);
  EXPECT_EQ(s.blocks.front().decode_cache_width(1), 576.0);
  EXPECT_EQ(s.blocks.front().decode_cache_width(8), 576.0);
}

// Standard attention's cache: keys and values of every key/value head, split with the heads.
// GPT-2 small: 2 x 12 x 64 per token and layer; Llama's grouped query, 2 x kv_heads x head_dim.
TEST(CostSheet, DecodeCacheOfStandardAttention) {
  const ModelSpec gpt2 = gpt2_spec(12, 768, 12, 1024, 50257);
  const ModelCostSheet& s = model_cost_sheet(gpt2);
  EXPECT_EQ(s.blocks.front().decode_cache_width(1), 1536.0);
  EXPECT_EQ(s.blocks.front().decode_cache_width(4), 384.0);
  EXPECT_EQ(s.embedding.decode_cache_width(1) + s.head.decode_cache_width(1), 0.0);
  ModelSpec gqa = gpt2_spec(2, 128, 8, 64, 256);
  gqa.kv_heads_set = 2;
  EXPECT_EQ(model_cost_sheet(gqa).blocks.back().decode_cache_width(2), 2.0 * 2 * 16 / 2);
  // tp beyond the key/value heads: each rank caches the one head its queries read.
  EXPECT_EQ(model_cost_sheet(gqa).blocks.back().decode_cache_width(4), 2.0 * 16);
  EXPECT_EQ(model_cost_sheet(gqa).blocks.back().decode_cache_width(8), 2.0 * 16);
}

// Sliding windows (model.attention_window = [256, 0] at T 1024): a windowed block's attention
// FLOPs count 256 keys a query (what the kernel computes, O(T W)), a full block's 1024; the
// windowed block's generation cache keeps 256 tokens, the full one's 1024.
TEST(CostSheet, SlidingWindowsBoundAttentionAndTheCache) {
  ModelSpec m = gpt2_spec(2, 128, 4, 1024, 256);
  const ModelCostSheet full = model_cost_sheet(m);
  const double full_flops = m.flops_per_token();
  m.attention_window = {256, 0};
  const ModelCostSheet& s = model_cost_sheet(m);
  const double C = 128, T = 1024;
  const double attention = [&](const CostSheet& b) {
    double f = 0;
    for (const AttentionCost& a : b.attention) f += a.training_flops_per_token(T);
    return f;
  }(s.blocks[0]);
  EXPECT_EQ(attention, 3.0 * 2.0 * 2.0 * 256 * C);
  EXPECT_EQ(s.blocks[1].training_flops_per_token(T), full.blocks[1].training_flops_per_token(T));
  EXPECT_EQ(full.blocks[0].training_flops_per_token(T) - s.blocks[0].training_flops_per_token(T),
            3.0 * 2.0 * 2.0 * (1024 - 256) * C);
  EXPECT_EQ(s.blocks[0].decode_cache_elements(1, T), 2 * C * 256);
  EXPECT_EQ(s.blocks[1].decode_cache_elements(1, T), 2 * C * 1024);
  EXPECT_EQ(s.blocks[0].decode_cache_elements(1, 100), 2 * C * 100);  // a shorter context
  EXPECT_EQ(full_flops - m.flops_per_token(), 3.0 * 2.0 * 2.0 * (1024 - 256) * C);
}

// tp beyond the key/value heads (issue 55): 8 query heads of 8 channels on 2 key/value heads,
// with biases. On tp 4 and 8 each rank holds its query heads' rows and the whole k and v (each
// of its ranks computes one head of them): the layer as built (what the memory planner builds)
// holds that, the cost sheet the time model reads says it, and k's GEMM makes one head's rows.
TEST(CostSheet, KeyValueHeadsSharedBeyondTpAreWholeOnEveryRank) {
  ModelSpec m = gpt2_spec(1, 64, 8, 16, 64);
  m.kv_heads_set = 2;
  CpuBackend planning(0, Execution::Plan);
  const auto held_on_rank_0 = [&](int tp, CostSheet* sheet) {
    MetaCommunicator group("tp", 0, tp);
    ParameterStore store;
    LayerContext ctx;
    ctx.backend = &planning;
    ctx.store = &store;
    ctx.tp = TensorParallel{&group, SequenceParallel::Off};
    const QkvProjection qkv(ctx, "attn", m);
    if (sheet) qkv.add_costs(*sheet);
    return static_cast<double>(store.numel());
  };
  CostSheet sheet;
  held_on_rank_0(1, &sheet);
  const double q = 64 * 64 + 64, kv = 2 * (16 * 64 + 16);
  for (int tp : {1, 2, 4, 8}) {
    const double expected = q / tp + (tp <= 2 ? kv / tp : kv);
    EXPECT_EQ(held_on_rank_0(tp, nullptr), expected) << "tp " << tp;
    EXPECT_EQ(sheet.local_parameters(tp), expected) << "tp " << tp;
  }
  ASSERT_EQ(sheet.linears.size(), 3u);
  EXPECT_EQ(sheet.linears[1].forward(10, 4), (GemmShape{10, 8, 64, GemmPass::Forward}));
  EXPECT_EQ(sheet.linears[2].backward_weight(10, 8), (GemmShape{64, 8, 10, GemmPass::BackwardWeight}));
  EXPECT_EQ(sheet.linears[0].forward(10, 8), (GemmShape{10, 8, 64, GemmPass::Forward}));
}

TEST(CostSheet, AnMlpOfAnotherWidthReportsIt) {
  CpuBackend planning(0, Execution::Plan);
  MetaCommunicator one_rank("tp", 0, 1);
  ParameterStore store;
  LayerContext ctx;
  ctx.backend = &planning;
  ctx.store = &store;
  ctx.tp = TensorParallel{&one_rank, SequenceParallel::Off};
  const int64_t C = 8;
  for (int64_t hidden : {32, 20}) {
    const Mlp mlp(ctx, "mlp" + std::to_string(hidden), C, hidden, 1.0);
    CostSheet sheet;
    mlp.add_costs(sheet);
    ASSERT_EQ(sheet.linears.size(), 2u);
    EXPECT_EQ(sheet.linears[0].in, C);
    EXPECT_EQ(sheet.linears[0].out, hidden);
    EXPECT_EQ(sheet.linears[1].in, hidden);
    EXPECT_EQ(sheet.linears[1].out, C);
    EXPECT_EQ(sheet.multiplying_parameters(), static_cast<double>(2 * C * hidden + hidden + C));
    EXPECT_DOUBLE_EQ(sheet.training_flops_per_token(1), 6.0 * 2 * C * hidden);
    ASSERT_EQ(sheet.elementwise.size(), 1u);  // the GELU, over the hidden width
    EXPECT_EQ(sheet.elementwise.front().width, hidden);
  }
}

}  // namespace
}  // namespace meshtrain
