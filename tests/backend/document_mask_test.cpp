// Document masking (data.document_mask; backend.h attention_forward's document_starts) on the
// CPU backend, against a direct fp64 computation of block-causal grouped-query attention: query
// i of a sequence sees keys [start_i, i], start_i its document's first position. Every path:
// the training forward and backward (oneDNN batched and OpenBLAS per-head), and the
// ring-attention blocks as two context-parallel ranks run them (each holding chunks r and 3 - r
// of 4, at their true positions, so a key chunk of the other rank is masked by document too).
//
// The rows: documents of lengths 1, 3 and the rest (the end-of-text token closing the second
// document sits at the end of chunk 0, so the third starts at a chunk boundary, and its queries
// in chunks 2 and 3 reach back to keys in chunk 1), and 5, 2, 1 and the rest (a document that
// spans chunks 0 and 1, a one-token one). Tolerances are gqa_attention_test.cpp's.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/config/deck_error.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/tokenizer.h"
#include "meshtrain/train/data_feed.h"
#include "meshtrain/tensor/bf16.h"
#include "meshtrain/train/document_starts.h"
#include "support/random.h"
#include "support/temp_dir.h"
#include "support/tensors.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;
using Block = Backend::AttentionBlock;

constexpr int64_t B = 2, T = 16, NH = 4, KVH = 2, HS = 4, G = NH / KVH;
constexpr int64_t W = (NH + 2 * KVH) * HS, C = NH * HS, KC = KVH * HS, N = B * T;
constexpr int32_t kEnd = 999;  // the end-of-text token of these rows

// Tokens whose end-of-text tokens close documents of the given lengths, then the starts.
std::vector<int32_t> starts_of_rows() {
  std::vector<int32_t> tokens(N, 7), starts(N);
  const std::vector<std::vector<int>> lengths = {{1, 3}, {5, 2, 1}};
  for (int64_t b = 0; b < B; ++b) {
    int64_t at = 0;
    for (int len : lengths[b]) {
      at += len;
      tokens[b * T + at - 1] = kEnd;
    }
    document_starts(tokens.data() + b * T, T, kEnd, starts.data() + b * T);
  }
  return starts;
}

TEST(DocumentStarts, EndOfTextBelongsToTheDocumentItEnds) {
  const std::vector<int32_t> s = starts_of_rows();
  const std::vector<int32_t> row0(s.begin(), s.begin() + T), row1(s.begin() + T, s.end());
  EXPECT_EQ(row0, (std::vector<int32_t>{0, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(row1, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 7, 8, 8, 8, 8, 8, 8, 8, 8}));
}

// The boundary token comes from data.tokenizer: GPT-2's "<|endoftext|>" (in a small GPT-2
// vocabulary, its last id), none in the byte tokenizer, which is refused naming key and value.
TEST(DocumentEndToken, ComesFromTheTokenizerOrIsRefused) {
  testing::TempDir dir;
  const std::string json = dir.file("tokenizer.json");
  make_gpt2_bpe_tokenizer(testing::tiny_gpt2_files(), "tiny")->save(json);
  EXPECT_EQ(document_end_token("deck.toml", json), 265);
  EXPECT_FALSE(make_byte_tokenizer()->end_of_text().has_value());
  try {
    document_end_token("deck.toml", "bytes");
    FAIL() << "the byte tokenizer has no end-of-text token";
  } catch (const DeckError& e) {
    EXPECT_NE(std::string(e.what()).find("deck.toml: data.document_mask = true needs an "
                                         "end-of-text token"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("data.tokenizer = \"bytes\" (bytes) has none"),
              std::string::npos)
        << e.what();
  }
}

// The data feed builds each micro-batch's starts from data.tokenizer's end-of-text token, over
// the whole sequence: under context parallelism a rank's two chunks get the starts of their true
// positions (a document may begin in a chunk another rank holds).
std::vector<int32_t> ints(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  return v;
}

TEST(DocumentMaskFeed, StartsFollowTheWholeSequenceOnEveryContextRank) {
  testing::TempDir dir;
  const std::unique_ptr<Tokenizer> tok = make_gpt2_bpe_tokenizer(testing::tiny_gpt2_files(), "tiny");
  const uint32_t end = *tok->end_of_text();
  std::vector<uint32_t> tokens;
  for (int i = 0; tokens.size() < 600; ++i) {
    for (int k = 1; k < 1 + (i * 5) % 9; ++k) tokens.push_back(static_cast<uint32_t>(i + k) % 200);
    tokens.push_back(end);
  }
  write_token_shard(dir.file("docs.bin"), tokens, tok->vocab_size());
  tok->save(dir.file("tok.json"));
  Config c;
  c.run.device = DeviceChoice::Cpu;
  c.model.seq_len = 16;
  c.model.vocab_size = 272;
  c.data.train = {dir.file("docs.bin")};
  c.data.val = "none";
  c.data.tokenizer = dir.file("tok.json");
  c.data.document_mask = true;
  c.train.global_batch = c.train.micro_batch = 4;
  CpuBackend be(1);
  const std::vector<MicroBatchData> whole = DataFeed(c, be, 0, 1).train_batch(0);
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_TRUE(whole[0].shape.document_starts.defined());
  const std::vector<int32_t> t = ints(be, whole[0].tokens), s = ints(be, whole[0].shape.document_starts);
  int documents_entered = 0;  // starts past 0 (the mask does something)
  for (int64_t i = 0; i < 4 * 16; ++i) {
    const int64_t b = i / 16, p = i % 16;
    int64_t want = 0;
    for (int64_t q = 0; q < p; ++q)
      if (t[b * 16 + q] == static_cast<int32_t>(end)) want = q + 1;
    ASSERT_EQ(s[i], want) << "sequence " << b << " position " << p;
    documents_entered += want > 0;
  }
  EXPECT_GT(documents_entered, 16);
  c.parallel.cp = 2;
  for (int rank = 0; rank < 2; ++rank) {
    DataFeed feed(c, be, 0, 1);
    feed.set_context_rank(rank);
    const std::vector<MicroBatchData> part = feed.train_batch(0);
    const std::vector<int32_t> ps = ints(be, part[0].shape.document_starts);
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t local = 0; local < 8; ++local) {
        const int64_t chunk = local < 4 ? rank : 3 - rank;
        EXPECT_EQ(ps[b * 8 + local], s[b * 16 + chunk * 4 + local % 4]) << rank << " " << b << " " << local;
      }
  }
  c.data.document_mask = false;
  EXPECT_FALSE(DataFeed(c, be, 0, 1).train_batch(0)[0].shape.document_starts.defined());
}

double tolerance(DType t) {
  switch (t) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-5;
    default: return 1e-2;
  }
}

Vec in_bf16(Vec v) {
  for (double& x : v) x = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
  return v;
}

struct Result {
  Vec out, probs, dqkv, lse;  // lse (B, NH, T): what the CPU backend keeps for backward
};

// Block-causal attention written out in fp64, key/value head g = h / G read in place.
Result reference(const Vec& qkv, const Vec& dout, const std::vector<int32_t>& starts) {
  Result r{Vec(N * C, 0.0), Vec(B * NH * T * T, 0.0), Vec(N * W, 0.0), Vec(B * NH * T, 0.0)};
  const double scale = 1.0 / std::sqrt(double(HS));
  auto at = [&](int64_t b, int64_t t, int64_t head, int64_t d) { return (b * T + t) * W + head * HS + d; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t k = NH + h / G, v = NH + KVH + h / G;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t lo = starts[b * T + i];
        double* p = r.probs.data() + ((b * NH + h) * T + i) * T;
        double m = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = lo; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < HS; ++d) s += qkv[at(b, i, h, d)] * qkv[at(b, j, k, d)];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = lo; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = lo; j <= i; ++j) p[j] /= sum;
        r.lse[(b * NH + h) * T + i] = m + std::log(sum);
        const double* dO = dout.data() + (b * T + i) * C + h * HS;
        Vec dp(T, 0.0);
        double dot = 0;
        for (int64_t j = lo; j <= i; ++j) {
          for (int64_t d = 0; d < HS; ++d) {
            r.out[(b * T + i) * C + h * HS + d] += p[j] * qkv[at(b, j, v, d)];
            dp[j] += dO[d] * qkv[at(b, j, v, d)];
          }
          dot += p[j] * dp[j];
        }
        for (int64_t j = lo; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            r.dqkv[at(b, i, h, d)] += ds * qkv[at(b, j, k, d)];
            r.dqkv[at(b, j, k, d)] += ds * qkv[at(b, i, h, d)];
            r.dqkv[at(b, j, v, d)] += p[j] * dO[d];
          }
        }
      }
    }
  return r;
}

class DocumentMask : public ::testing::TestWithParam<DType> {};

TEST_P(DocumentMask, TrainingPathMatchesTheDirectComputation) {
  const DType dt = GetParam();
  Vec qkv = random_normal(N * W, 71), dout = random_normal(N * C, 72);
  if (dt == DType::BF16) qkv = in_bf16(qkv), dout = in_bf16(dout);
  const std::vector<int32_t> starts = starts_of_rows();
  const Result want = reference(qkv, dout, starts);
  CpuBackend be(2);
  const Tensor tstarts = testing::make_tokens(be, starts);
  std::vector<cpu::GemmLibrary> libraries{cpu::GemmLibrary::Auto};
  if (dt == DType::F32) libraries.push_back(cpu::GemmLibrary::OpenBlas);
  for (cpu::GemmLibrary library : libraries) {
    SCOPED_TRACE(std::string(cpu::gemm_library_name(library)));
    be.gemm().set_library(library);
    Tensor tqkv = make_tensor(be, qkv, {N, W}, dt);
    Tensor out = be.empty({N, C}, dt, MemoryCategory::Workspace);
    Tensor stash = testing::attention_stash(be, B, T, NH, dt);
    be.attention_forward(out, stash, tqkv, B, T, NH, KVH, HS, &tstarts);
    Tensor dqkv = be.empty({N, W}, dt, MemoryCategory::Workspace);
    be.attention_backward(dqkv, make_tensor(be, dout, {N, C}, dt), tqkv, out, stash, B, T, NH,
                          KVH, HS, &tstarts);
    EXPECT_LT(max_relative_error(to_host(be, out), want.out), tolerance(dt));
    // the stash is each row's log-sum-exp over the keys of its document alone
    EXPECT_LT(max_relative_error(to_host(be, stash), want.lse), tolerance(dt));
    EXPECT_LT(max_relative_error(to_host(be, dqkv), want.dqkv), tolerance(dt));
  }
}

// Two context-parallel ranks of chunks of L = 4: rank r holds chunks r and 3 - r (its local
// rows), attends to its own keys and the other rank's as the ring would, blocks in any order.
TEST_P(DocumentMask, RingBlocksOfTwoRanksMatchTheDirectComputation) {
  const DType dt = GetParam();
  const int64_t L = T / 4, Tl = 2 * L;
  Vec qkv = random_normal(N * W, 81), dout = random_normal(N * C, 82);
  if (dt == DType::BF16) qkv = in_bf16(qkv), dout = in_bf16(dout);
  const std::vector<int32_t> starts = starts_of_rows();
  const Result want = reference(qkv, dout, starts);
  auto chunk_of = [](int r, int c) { return c == 0 ? r : 3 - r; };
  auto true_row = [&](int r, int64_t b, int64_t t) { return b * T + chunk_of(r, int(t / L)) * L + t % L; };
  // Each rank's local rows of a (rows, width) tensor of the whole batch.
  auto local = [&](const Vec& whole, int64_t width, int r) {
    Vec v(B * Tl * width);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t)
        std::copy_n(whole.begin() + true_row(r, b, t) * width, width, v.begin() + (b * Tl + t) * width);
    return v;
  };
  CpuBackend be(2);
  const DType stats = dt == DType::BF16 ? DType::F32 : dt;
  Tensor qkv_of[2], kv_of[2], out_of[2], lse_of[2], starts_of[2], dout_of[2], dqkv_of[2], dkv_of[2];
  for (int r = 0; r < 2; ++r) {
    qkv_of[r] = make_tensor(be, local(qkv, W, r), {B * Tl, W}, dt);
    kv_of[r] = be.empty({B * Tl, 2 * KC}, dt, MemoryCategory::Workspace);
    be.copy_columns(kv_of[r], 0, qkv_of[r], C, 2 * KC);
    std::vector<int32_t> s(B * Tl);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) s[b * Tl + t] = starts[true_row(r, b, t)];
    starts_of[r] = testing::make_tokens(be, s);
    out_of[r] = be.zeros({B * Tl, C}, dt, MemoryCategory::Workspace);
    lse_of[r] = be.empty({B, NH, Tl}, stats, MemoryCategory::Workspace);
    be.fill(lse_of[r], -std::numeric_limits<double>::infinity());
    dout_of[r] = make_tensor(be, local(dout, C, r), {B * Tl, C}, dt);
    dqkv_of[r] = be.zeros({B * Tl, W}, dt, MemoryCategory::Workspace);
    dkv_of[r] = be.zeros({B * Tl, 2 * KC}, dt, MemoryCategory::Workspace);
  }
  struct Work {
    int rank, source;
    Block block;
  };
  std::vector<Work> work;
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 2; ++s)
      for (int qc = 0; qc < 2; ++qc)
        for (int kc = 0; kc < 2; ++kc) {
          const int q = chunk_of(r, qc), k = chunk_of(s, kc);
          if (k <= q) work.push_back({r, s, {qc * L, L, kc * L, L, k == q, k * L}});
        }
  std::mt19937 rng(9);
  std::shuffle(work.begin(), work.end(), rng);
  for (const Work& w : work)
    be.attention_block_forward(out_of[w.rank], lse_of[w.rank], qkv_of[w.rank], kv_of[w.source], B,
                               NH, KVH, HS, w.block, &starts_of[w.rank]);
  std::shuffle(work.begin(), work.end(), rng);
  for (const Work& w : work)
    be.attention_block_backward(dqkv_of[w.rank], dkv_of[w.source], dout_of[w.rank], out_of[w.rank],
                                lse_of[w.rank], qkv_of[w.rank], kv_of[w.source], B, NH, KVH, HS,
                                w.block, &starts_of[w.rank]);
  Vec out(N * C), dqkv(N * W);
  for (int r = 0; r < 2; ++r) {
    be.copy_columns(dqkv_of[r], C, dkv_of[r], 0, 2 * KC);
    const Vec o = to_host(be, out_of[r]), d = to_host(be, dqkv_of[r]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) {
        const int64_t row = true_row(r, b, t);
        std::copy_n(o.begin() + (b * Tl + t) * C, C, out.begin() + row * C);
        std::copy_n(d.begin() + (b * Tl + t) * W, W, dqkv.begin() + row * W);
      }
  }
  EXPECT_LT(max_relative_error(out, want.out), tolerance(dt));
  EXPECT_LT(max_relative_error(dqkv, want.dqkv), tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DocumentMask, ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// A start after its row would leave the row no key: refused by name, not computed.
TEST(DocumentMaskContract, RefusesAStartAfterItsRow) {
  CpuBackend be(1);
  std::vector<int32_t> starts = starts_of_rows();
  starts[T + 3] = 4;
  const Tensor tstarts = testing::make_tokens(be, starts);
  Tensor qkv = be.zeros({N, W}, DType::F64, MemoryCategory::Workspace);
  Tensor out = be.empty({N, C}, DType::F64, MemoryCategory::Workspace);
  Tensor stash = testing::attention_stash(be, B, T, NH, DType::F64);
  try {
    be.attention_forward(out, stash, qkv, B, T, NH, KVH, HS, &tstarts);
    FAIL() << "a start after its row was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("document_starts[19] = 4 lies outside [0, 3]"),
              std::string::npos)
        << e.what();
  }
  const Tensor short_starts = testing::make_tokens(be, std::vector<int32_t>(T, 0));
  EXPECT_THROW(be.attention_forward(out, stash, qkv, B, T, NH, KVH, HS, &short_starts),
               std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
