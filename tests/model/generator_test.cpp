// Text generation (model/generator.h) against the model's own training forward.
//
//  - CacheMatchesFullForward: the logits the key/value cache gives for every position equal
//    row t of a full forward (no cache) over the same prefix: the cached path shares the
//    layers' weights and ops but not their attention kernel, so this checks the cache layout,
//    the position embedding offset and attention_decode. Bounds: 1e-5 relative in fp32 (seven
//    digits, accumulated over the layers), 1e-12 in fp64.
//  - Latent*: multi-head latent attention's cache of compressed latents and rotary keys, read
//    through the absorbed products, against the full forward that expands keys and values
//    (with and without the query's low-rank path, under YaRN's softmax correction); its greedy
//    tokens against the argmax of a full forward recomputed at every position; its window
//    sliding; tp = 2 (with and without sequence parallelism) against one rank.
//  - SlidingWindow: past seq_len the logits equal a full forward over the kept window.
//  - Sampling: greedy is argmax, top_k 1 is greedy at any temperature, a seed gives the same
//    tokens twice.
//  - TensorParallelMatchesOneRank (2 ranks): tp = 2, heads split, gives the same tokens, sampled
//    with temperature and top-k, as the whole model on one rank; logits within 1e-12 (fp64).
//  - SequenceParallelMatchesOneRank (2 ranks): the same with sequence parallelism on.
//  - PipelineMatchesOneRank (2 ranks): two stages pass each token along; the same logits and
//    tokens as one rank. VPlacedPipelineMatchesOneRank: the same over four chunks in zb-v's V.

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/model/generator.h"
#include "meshtrain/model/decoder_model.h"
#include "meshtrain/model/partition.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Model {
  CpuBackend be{1};
  MpiCommunicator tp_comm;
  ModelSpec cfg;
  std::unique_ptr<DecoderModel> model;

  // stages > 1: this rank's stage (its rank in MPI_COMM_WORLD) of a pipeline over the world.
  // Placement::V: 2 x stages chunks in zb-v's V, rank r holding chunks r and 2 stages - 1 - r.
  enum class Placement { Looped, V };
  Model(MPI_Comm comm, DType dtype, SequenceParallel sequence = SequenceParallel::Off,
        int stages = 1, int layers = 2, Placement placement = Placement::Looped,
        void (*adjust)(ModelSpec&) = nullptr)
      : tp_comm(comm, "tp") {
    cfg.layers = layers;
    cfg.d_model = 32;
    cfg.heads = 4;
    cfg.seq_len = 16;
    cfg.vocab_size = 64;
    if (adjust) adjust(cfg);
    const TensorParallel tp{&tp_comm, sequence};
    const bool v = placement == Placement::V;
    std::vector<ChunkRange> ranges = balanced_partition(cfg, v ? 2 * stages : stages);
    if (stages > 1) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      const size_t r = static_cast<size_t>(rank), last = static_cast<size_t>(2 * stages - 1);
      ranges = v ? std::vector<ChunkRange>{ranges[r], ranges[last - r]} : std::vector<ChunkRange>{ranges[r]};
    }
    model = std::make_unique<DecoderModel>(be, tp, cfg, ranges, dtype);
    model->params().materialize(be, dtype);
    model->params().initialize(be, 5);
    // GPT-2's init leaves the logits nearly flat; noise keyed by name and global index (the same
    // on every layout: the element at split_begin offset) makes every term matter.
    for (Parameter* p : model->params().params()) {
      std::vector<double> v = testing::to_host(be, p->value);
      const std::vector<double> noise =
          testing::random_normal(static_cast<size_t>(p->spec.global_shape.numel()),
                                 hash_name(p->spec.name), 0.2);
      const int64_t tp_size = tp_comm.size();
      if (tp_size == 1 || p->spec.tp_split_dim < 0) {
        for (size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
      } else {  // this rank's slice of the global tensor
        const Shape& g = p->spec.global_shape;
        const int d = p->spec.tp_split_dim;
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < d; ++i) outer *= g[i];
        for (int i = d + 1; i < g.rank(); ++i) inner *= g[i];
        const int64_t local = g[d] / tp_size;
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t j = 0; j < local; ++j)
            for (int64_t i = 0; i < inner; ++i)
              v[(o * local + j) * inner + i] +=
                  noise[(o * g[d] + p->split_begin + j) * inner + i];
      }
      if (p->value.dtype() == DType::F32) {
        std::vector<float> f(v.begin(), v.end());
        be.copy_from_host(p->value, f.data());
      } else {
        be.copy_from_host(p->value, v.data());
      }
    }
  }
};

std::vector<int32_t> text_tokens(int n, int vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 11 + 5) % vocab);
  return t;
}

double max_relative(const double* a, const double* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// The largest relative difference of two generators' logits, fed `tokens` step by step.
double worst_step_difference(Generator& one, Generator& two, const std::vector<int32_t>& tokens) {
  double worst = 0;
  for (int32_t t : tokens) {
    const std::vector<double> a = one.step(t), b = two.step(t);
    worst = std::max(worst, max_relative(b.data(), a.data(), static_cast<int64_t>(a.size())));
  }
  return worst;
}

void check_cache(DType dtype, double bound, void (*adjust)(ModelSpec&) = nullptr) {
  Model m(MPI_COMM_SELF, dtype, SequenceParallel::Off, 1, 2, Model::Placement::Looped, adjust);
  Generator gen(*m.model);
  const int64_t V = m.cfg.vocab_size, T = m.cfg.seq_len;
  const std::vector<int32_t> tokens = text_tokens(static_cast<int>(T), static_cast<int>(V));
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> cached = gen.step(tokens[t]);
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + t + 1);
    const std::vector<double> full = gen.full_logits(prefix);
    worst = std::max(worst, max_relative(cached.data(), full.data() + t * V, V));
  }
  std::printf("[ measured ] %s: max relative difference cache vs full forward %.3g\n",
              dtype == DType::F32 ? "fp32" : "fp64", worst);
  EXPECT_LT(worst, bound);
}

TEST(Generator, CacheMatchesFullForwardFp32) { check_cache(DType::F32, 1e-5); }
TEST(Generator, CacheMatchesFullForwardFp64) { check_cache(DType::F64, 1e-12); }
// Llama's block: the cache holds kv_heads heads of rotated keys, and one token's query rotates
// at its position.
TEST(Generator, LlamaCacheMatchesFullForwardFp64) {
  check_cache(DType::F64, 1e-12, [](ModelSpec& m) {
    m.positions = PositionKind::Rotary;
    m.kv_heads_set = 2;
    m.norm.kind = NormKind::Rms;
    m.activation = ActivationKind::SwiGlu;
    m.linear_bias = false;
    m.tie_embeddings = false;
  });
}

// Sliding windows (model.attention_window = [5, 0]): block 0's cache is a ring of its 5 keys
// (row position % 5), block 1's the whole context; every position's cached logits equal the
// full forward's, which masks the band explicitly in the kernel. Then the context slides (the
// cache rebuilt at positions 0 ..) and the ring is refilled from row 0.
void windowed(ModelSpec& m) {
  m.positions = PositionKind::Rotary;
  m.kv_heads_set = 2;
  m.attention_window = {5, 0};
}
TEST(Generator, WindowedCacheMatchesFullForwardFp64) { check_cache(DType::F64, 1e-12, windowed); }
TEST(Generator, WindowedCacheKeepsTheWindowsRows) {
  Model m(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 1, 2, Model::Placement::Looped, windowed);
  const DecodeCache local = m.model->chunk(0).block(0).attention().decode_cache(m.be, DType::F64, 16);
  const DecodeCache global = m.model->chunk(0).block(1).attention().decode_cache(m.be, DType::F64, 16);
  EXPECT_EQ(local.keys.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(global.keys.shape(), (Shape{2, 16, 8}));
}

// Multi-head latent attention (model/latent_attention.h) in Llama's block: queries through a
// rank-12 path, a latent of 16, query/key heads of 8 + 4 rotary channels, value heads of 6 (not
// 8: the values' width is its own). Its cache holds the latent and the rotary key, and the
// cached step attends through the absorbed products; the full forward expands keys and values.
void latent(ModelSpec& m) {
  m.positions = PositionKind::Rotary;
  m.norm.kind = NormKind::Rms;
  m.activation = ActivationKind::SwiGlu;
  m.linear_bias = false;
  m.tie_embeddings = false;
  m.attention = AttentionKind::Latent;
  m.latent = LatentSpec{12, 16, 8, 4, 6};  // q_lora, kv_lora, nope, rope, value
}
// Queries straight from the block input (q_lora_rank 0, HF's q_proj).
void latent_without_query_path(ModelSpec& m) {
  latent(m);
  m.latent.q_lora_rank = 0;
}
// YaRN with DeepSeek's softmax correction: scores scaled by m^2 / sqrt(d_qk), m = 0.1 ln 4 + 1,
// and the ramp inside the 16 positions (original 4).
void latent_yarn(ModelSpec& m) {
  latent(m);
  m.rope.scaling = RopeScalingKind::Yarn;
  m.rope.factor = 4.0;
  m.rope.original_max_positions = 4;
  m.rope.mscale = m.rope.mscale_all_dim = 1.0;
}

TEST(Generator, LatentCacheMatchesFullForwardFp32) { check_cache(DType::F32, 1e-5, latent); }
TEST(Generator, LatentCacheMatchesFullForwardFp64) { check_cache(DType::F64, 1e-12, latent); }
TEST(Generator, LatentCacheWithoutQueryPathMatchesFullForwardFp64) {
  check_cache(DType::F64, 1e-12, latent_without_query_path);
}
TEST(Generator, LatentCacheUnderYarnMatchesFullForwardFp64) {
  check_cache(DType::F64, 1e-12, latent_yarn);
}

// Greedy tokens from `prompt`, each the argmax of a full forward (no cache) recomputed from
// scratch over every token so far: what the cached generator must reproduce.
std::vector<int32_t> greedy_by_full_forward(Generator& gen, std::vector<int32_t> tokens, int count,
                                            int64_t vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) {
    const std::vector<double> full = gen.full_logits(tokens);
    const std::vector<double> last(full.end() - vocab, full.end());
    out.push_back(choose_token(last, SamplingOptions{}, static_cast<int64_t>(tokens.size())));
    tokens.push_back(out.back());
  }
  return out;
}

// Up to seq_len = 16 positions, so that no window slides: 3 prompt tokens, 13 new ones.
TEST(Generator, LatentGreedyTokensEqualFullForwardAtEveryPosition) {
  Model m(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 1, 2, Model::Placement::Looped, latent_yarn);
  Generator gen(*m.model);
  const std::vector<int32_t> prompt = {7, 1, 30};
  const std::vector<int32_t> cached = gen.generate(prompt, 13, SamplingOptions{});
  EXPECT_EQ(cached, greedy_by_full_forward(gen, prompt, 13, m.cfg.vocab_size));
  EXPECT_GT(std::set<int32_t>(cached.begin(), cached.end()).size(), 4u) << "a repetitive continuation proves little";
}

void check_sliding_window(void (*adjust)(ModelSpec&)) {
  Model m(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 1, 2, Model::Placement::Looped, adjust);
  Generator gen(*m.model);
  const int64_t V = m.cfg.vocab_size, T = m.cfg.seq_len;
  const std::vector<int32_t> tokens = text_tokens(static_cast<int>(T + 5), static_cast<int>(V));
  std::vector<double> logits;
  for (int32_t t : tokens) logits = gen.step(t);
  // After T tokens the window kept the last T / 2; five more were added after it.
  EXPECT_EQ(gen.cached(), T / 2 + 5);
  const std::vector<int32_t> window(tokens.end() - (T / 2 + 5), tokens.end());
  const std::vector<double> full = gen.full_logits(window);
  EXPECT_LT(max_relative(logits.data(), full.data() + (window.size() - 1) * V, V), 1e-12);
}

TEST(Generator, SlidingWindow) { check_sliding_window(nullptr); }
TEST(Generator, SlidingContextWithAttentionWindow) { check_sliding_window(windowed); }
// The latent cache is rebuilt from the kept window at positions 0 .. like the key/value cache.
TEST(Generator, LatentSlidingWindow) { check_sliding_window(latent_yarn); }

TEST(Generator, Sampling) {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 2.0, 1.5};
  EXPECT_EQ(choose_token(logits, SamplingOptions{0.0, 0, 1}, 0), 1);  // lowest id of the maxima
  for (int64_t pos = 0; pos < 50; ++pos)
    EXPECT_EQ(choose_token(logits, SamplingOptions{5.0, 1, 9}, pos), 1);
  int counts[5] = {0, 0, 0, 0, 0};
  for (int64_t pos = 0; pos < 400; ++pos) {
    const int32_t t = choose_token(logits, SamplingOptions{1.0, 3, 9}, pos);
    ASSERT_TRUE(t == 1 || t == 3 || t == 4) << t;  // the top 3
    ++counts[t];
    EXPECT_EQ(t, choose_token(logits, SamplingOptions{1.0, 3, 9}, pos));
  }
  EXPECT_GT(counts[4], 0);
  EXPECT_GT(counts[1], counts[4]);
}

TEST(Generator, DeterministicForASeed) {
  Model m(MPI_COMM_SELF, DType::F32);
  Generator gen(*m.model);
  const std::vector<int32_t> prompt = {3, 1, 4};
  const SamplingOptions opt{0.9, 20, 42};
  const std::vector<int32_t> a = gen.generate(prompt, 24, opt);
  const std::vector<int32_t> b = gen.generate(prompt, 24, opt);
  EXPECT_EQ(a, b);
  const std::vector<int32_t> c = gen.generate(prompt, 24, SamplingOptions{0.9, 20, 43});
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 24u);  // past seq_len = 16 with the prompt: the window slid
}

TEST(Generator, TensorParallelMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (tp = 2), have " << world_size();
  Model whole(MPI_COMM_SELF, DType::F64);
  Model split(MPI_COMM_WORLD, DType::F64);
  Generator one(*whole.model), two(*split.model);
  EXPECT_LT(worst_step_difference(one, two, text_tokens(10, static_cast<int>(whole.cfg.vocab_size))), 1e-12);
  const SamplingOptions opt{0.8, 10, 7};
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(one.generate(prompt, 30, opt), two.generate(prompt, 30, opt));
  EXPECT_EQ(one.generate(prompt, 30, SamplingOptions{}), two.generate(prompt, 30, SamplingOptions{}));
}

// Latent attention on tp = 2: each rank holds two of the four heads and the whole latent cache
// (the down-projections are replicated); the logits, greedy tokens from a full forward
// recomputed at every position, and sampled tokens equal the whole model's on one rank. With
// sequence parallelism the decode path runs the same group without it.
void expect_latent_tp_matches_one_rank(SequenceParallel sequence) {
  Model whole(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 1, 2, Model::Placement::Looped, latent_yarn);
  Model split(MPI_COMM_WORLD, DType::F64, sequence, 1, 2, Model::Placement::Looped, latent_yarn);
  Generator one(*whole.model), two(*split.model);
  EXPECT_LT(worst_step_difference(one, two, text_tokens(10, static_cast<int>(whole.cfg.vocab_size))), 1e-12);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};  // 4 + 12: seq_len, and a multiple of tp
  const std::vector<int32_t> greedy = two.generate(prompt, 12, SamplingOptions{});
  EXPECT_EQ(greedy, one.generate(prompt, 12, SamplingOptions{}));
  if (sequence == SequenceParallel::Off) {
    EXPECT_EQ(greedy, greedy_by_full_forward(two, prompt, 12, whole.cfg.vocab_size));
  }
  const SamplingOptions opt{0.8, 10, 7};
  EXPECT_EQ(one.generate({1, 2, 3}, 30, opt), two.generate({1, 2, 3}, 30, opt));  // past seq_len
}

TEST(Generator, LatentTensorParallelMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (tp = 2), have " << world_size();
  expect_latent_tp_matches_one_rank(SequenceParallel::Off);
}

TEST(Generator, LatentSequenceParallelMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (tp = 2), have " << world_size();
  expect_latent_tp_matches_one_rank(SequenceParallel::On);
}

// A sequence-parallel model generates through the same group without sequence parallelism; its
// cached logits match its own (sequence-parallel) training forward and the one-rank model's.
TEST(Generator, SequenceParallelMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (tp = 2), have " << world_size();
  Model whole(MPI_COMM_SELF, DType::F64);
  Model split(MPI_COMM_WORLD, DType::F64, SequenceParallel::On);
  Generator one(*whole.model), two(*split.model);
  const int64_t V = whole.cfg.vocab_size;
  const std::vector<int32_t> tokens = text_tokens(10, static_cast<int>(V));
  double worst = 0, worst_full = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<double> a = one.step(tokens[t]), b = two.step(tokens[t]);
    worst = std::max(worst, max_relative(b.data(), a.data(), V));
    if (t % 2 == 1) {  // the training forward splits the prefix over the two ranks
      const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + t + 1);
      const std::vector<double> full = two.full_logits(prefix);
      worst_full = std::max(worst_full, max_relative(b.data(), full.data() + t * V, V));
    }
  }
  EXPECT_LT(worst, 1e-12);
  EXPECT_LT(worst_full, 1e-12);
  const SamplingOptions opt{0.8, 10, 7};
  EXPECT_EQ(one.generate({1, 2, 3}, 30, opt), two.generate({1, 2, 3}, 30, opt));
}

// 20 tokens (past seq_len = 16: the window slides on both) step by step, then sampling.
void expect_pipeline_generates_as_one_rank(Generator& one, Generator& two, int vocab) {
  EXPECT_LT(worst_step_difference(one, two, text_tokens(20, vocab)), 1e-12);
  const SamplingOptions opt{0.8, 10, 7};
  EXPECT_EQ(one.generate({1, 2, 3}, 30, opt), two.generate({1, 2, 3}, 30, opt));
}

TEST(Generator, PipelineMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (pp = 2), have " << world_size();
  Model whole(MPI_COMM_SELF, DType::F64);
  Model stage(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 2);
  MpiCommunicator pipeline(MPI_COMM_WORLD, "pp");
  Generator one(*whole.model), two(*stage.model, &pipeline);
  expect_pipeline_generates_as_one_rank(one, two, static_cast<int>(whole.cfg.vocab_size));
}

// The V placement of zb-v: chunks 0 1 2 3 on stages 0 1 1 0, so stage 1 hands chunk 1's output
// to chunk 2 itself and stage 0 holds both the embedding and the head.
TEST(Generator, VPlacedPipelineMatchesOneRank) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks (pp = 2), have " << world_size();
  Model whole(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 1, 4);
  Model stage(MPI_COMM_SELF, DType::F64, SequenceParallel::Off, 2, 4, Model::Placement::V);
  MpiCommunicator pipeline(MPI_COMM_WORLD, "pp");
  Generator one(*whole.model), two(*stage.model, &pipeline, {0, 1, 1, 0});
  expect_pipeline_generates_as_one_rank(one, two, static_cast<int>(whole.cfg.vocab_size));
}

}  // namespace
}  // namespace meshtrain
