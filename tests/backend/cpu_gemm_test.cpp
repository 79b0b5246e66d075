// The CPU backend's GEMM (backend/cpu/gemm.h) against the fp64 reference GEMM
// (tests/support/reference_kernels.h): every transpose combination, bias or none, assign or
// accumulate, with or without the GELU epilogue, through oneDNN (fp32 and bf16 inputs) and
// OpenBLAS (fp32 and fp64), on row strides wider than the rows. bf16 inputs are rounded to bf16
// before the reference sees them, so every dtype is held to its accumulation error alone; the
// tolerances (relative to the reference's largest magnitude) live in one table.

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/reference_kernels.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using cpu::Accumulate;
using cpu::Epilogue;
using cpu::Gemm;
using cpu::GemmLibrary;
using cpu::GemmOptions;
using cpu::GemmShape;
using cpu::Trans;
using testing::max_relative_error;
using testing::random_normal;
using testing::representable;
using Vec = std::vector<double>;

double tolerance(DType in) {
  switch (in) {
    case DType::F64: return 1e-12;
    case DType::BF16: return 2e-5;  // inputs exact in bf16, products and sums in fp32
    default: return 2e-5;
  }
}

// A dense (rows, cols) matrix stored with row stride ld = cols + pad; padding holds `fill`.
template <class S> std::vector<S> strided(const Vec& dense, int64_t rows, int64_t cols, int64_t ld, S fill) {
  std::vector<S> out(static_cast<size_t>(rows * ld), fill);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double x = dense[static_cast<size_t>(i * cols + j)];
      if constexpr (std::is_same_v<S, uint16_t>) out[static_cast<size_t>(i * ld + j)] = float_to_bf16_bits(static_cast<float>(x));
      else out[static_cast<size_t>(i * ld + j)] = static_cast<S>(x);
    }
  return out;
}

struct Case {
  GemmLibrary library;
  DType in;
  Trans ta, tb;
  bool bias;
  Accumulate accumulate;
  Epilogue epilogue;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string n = c.library == GemmLibrary::OneDnn ? "oneDNN" : "OpenBLAS";
  n += std::string("_") + std::string(dtype_name(c.in)) + "_" + (c.ta == Trans::Yes ? "T" : "N") +
       (c.tb == Trans::Yes ? "T" : "N");
  if (c.bias) n += "_bias";
  if (c.accumulate == Accumulate::Add) n += "_add";
  if (c.epilogue == Epilogue::GeluTanh) n += "_gelu";
  return n;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  const std::pair<GemmLibrary, DType> kinds[] = {{GemmLibrary::OneDnn, DType::F32},
                                                  {GemmLibrary::OneDnn, DType::BF16},
                                                  {GemmLibrary::OpenBlas, DType::F32},
                                                  {GemmLibrary::OpenBlas, DType::F64}};
  for (auto [library, in] : kinds)
    for (Trans ta : {Trans::No, Trans::Yes})
      for (Trans tb : {Trans::No, Trans::Yes})
        for (bool bias : {false, true})
          for (Accumulate a : {Accumulate::Assign, Accumulate::Add})
            for (Epilogue e : {Epilogue::None, Epilogue::GeluTanh})
              out.push_back({library, in, ta, tb, bias, a, e});
  return out;
}

class GemmVariants : public ::testing::TestWithParam<Case> {};

// Runs one case on M x N x K with every row stride `pad` wider than its row; checks the result
// against the reference and that the padding of C is untouched. Out = uint16_t: a bf16 C. With
// `addend`, a further (M, N) matrix of C's type and strides is added (GemmOptions::addend).
template <class In, class Out>
void run_case(const Case& c, int64_t M, int64_t N, int64_t K, int64_t pad, double tol = 0,
              bool addend = false) {
  // The test's other cases still run; it is reported skipped.
  if (c.in == DType::BF16 && !cpu_runs_bf16()) GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (AVX2)";
  const bool ta = c.ta == Trans::Yes, tb = c.tb == Trans::Yes;
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const DType out_dtype = c.in == DType::F64              ? DType::F64
                          : std::is_same_v<Out, uint16_t> ? DType::BF16
                                                          : DType::F32;
  using Bias = std::conditional_t<std::is_same_v<In, double>, double, float>;
  const Vec A = representable(random_normal(static_cast<size_t>(M * K), 21), c.in);
  const Vec B = representable(random_normal(static_cast<size_t>(K * N), 22), c.in);
  const Vec bias = representable(random_normal(static_cast<size_t>(N), 23),
                                 out_dtype == DType::F64 ? DType::F64 : DType::F32);
  const Vec C0 = representable(random_normal(static_cast<size_t>(M * N), 24), out_dtype);
  const Vec X = representable(random_normal(static_cast<size_t>(M * N), 25), out_dtype);
  // The addend is the reference's accumulator (alone, or added to C's).
  Vec expect = C0;
  if (addend)
    for (size_t i = 0; i < expect.size(); ++i) expect[i] = (c.accumulate == Accumulate::Add ? C0[i] : 0.0) + X[i];
  reference::gemm(expect, A, B, c.bias ? &bias : nullptr, ta, tb, M, N, K,
                  addend || c.accumulate == Accumulate::Add, c.epilogue == Epilogue::GeluTanh);

  const GemmShape s{c.ta, c.tb, M, N, K, a_cols + pad, b_cols + pad, N + pad};
  const std::vector<In> a = strided<In>(A, a_rows, a_cols, s.lda, In(0));
  const std::vector<In> b = strided<In>(B, b_rows, b_cols, s.ldb, In(0));
  const std::vector<Bias> vbias(bias.begin(), bias.end());
  const Out sentinel = Out(12345);
  std::vector<Out> C = strided<Out>(C0, M, N, s.ldc, sentinel);
  const std::vector<Out> x = strided<Out>(X, M, N, s.ldc, sentinel);

  Gemm gemm;
  gemm.set_library(c.library);
  const GemmOptions o{c.accumulate, c.epilogue, addend ? x.data() : nullptr};
  if constexpr (std::is_same_v<In, uint16_t>)
    gemm.run_bf16(s, a.data(), b.data(), c.bias ? vbias.data() : nullptr, C.data(), o);
  else
    gemm.run(s, a.data(), b.data(), c.bias ? vbias.data() : nullptr, C.data(), o);

  Vec got(static_cast<size_t>(M * N));
  int64_t padding_changed = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      const Out v = C[static_cast<size_t>(i * s.ldc + j)];
      if constexpr (std::is_same_v<Out, uint16_t>) got[static_cast<size_t>(i * N + j)] = bf16_bits_to_float(v);
      else got[static_cast<size_t>(i * N + j)] = v;
    }
    for (int64_t j = N; j < s.ldc; ++j) padding_changed += C[static_cast<size_t>(i * s.ldc + j)] != sentinel;
  }
  EXPECT_LT(max_relative_error(got, expect), tol > 0 ? tol : tolerance(c.in)) << s.to_string();
  EXPECT_EQ(padding_changed, 0) << "the GEMM wrote outside C's rows";
}

TEST_P(GemmVariants, MatchesReference) {
  const Case& c = GetParam();
  // Odd sizes (no multiple of a vector width); strides 3 elements wider than the rows.
  switch (c.in) {
    case DType::F32: return run_case<float, float>(c, 37, 53, 70, 3);
    case DType::F64: return run_case<double, double>(c, 37, 53, 70, 3);
    case DType::BF16: return run_case<uint16_t, float>(c, 37, 53, 70, 3);
    default: FAIL() << "no case for " << dtype_name(c.in);
  }
}

INSTANTIATE_TEST_SUITE_P(Gemm, GemmVariants, ::testing::ValuesIn(all_cases()), case_name);

TEST(Gemm, LargerProductsThroughOneDnn) {
  // Sizes where oneDNN's blocking has full and partial blocks in every dimension.
  const Case c{GemmLibrary::OneDnn, DType::F32, Trans::No, Trans::Yes, true, Accumulate::Add, Epilogue::None};
  run_case<float, float>(c, 300, 257, 190, 0);
  const Case t{GemmLibrary::OneDnn, DType::BF16, Trans::Yes, Trans::No, false, Accumulate::Add, Epilogue::None};
  run_case<uint16_t, float>(t, 190, 300, 257, 0);
}

// fp32 with a plain B at least 3072 wide: B is copied with padded rows so that oneDNN takes its
// packing GEMM rather than brgemm, which runs such widths at half speed (gemm.cpp). The result
// is the same product; the kernel is named by oneDNN.
TEST(Gemm, WidePlainFp32BGoesToThePackingGemm) {
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Accumulate a : {Accumulate::Assign, Accumulate::Add}) {
      const Case c{GemmLibrary::OneDnn, DType::F32, ta, Trans::No, true, a, Epilogue::None};
      run_case<float, float>(c, 9, 3077, 11, 0);
    }
  // K cut into chunks: each chunk's rows of B copied in turn.
  const Case k{GemmLibrary::OneDnn, DType::F32, Trans::No, Trans::No, true, Accumulate::Add, Epilogue::None};
  run_case<float, float>(k, 1, 3072, 17000, 0, 1e-4);

  Gemm gemm;
  gemm.set_library(GemmLibrary::OneDnn);
  std::vector<float> a(8 * 8, 1.0f), b(8 * 3072, 0.5f), c(8 * 3072);
  gemm.run(GemmShape::dense(Trans::No, Trans::No, 8, 3072, 8), a.data(), b.data(), nullptr, c.data());
  EXPECT_EQ(gemm.last_onednn_implementation().rfind("brg", 0), std::string::npos)
      << gemm.last_onednn_implementation();
  EXPECT_EQ(c[8 * 3072 - 1], 4.0f);
  // Narrower, or transposed (brgemm copies a transposed B itself): as given.
  gemm.run(GemmShape::dense(Trans::No, Trans::No, 8, 2048, 8), a.data(), b.data(), nullptr, c.data());
  const std::string narrow = gemm.last_onednn_implementation();
  gemm.run(GemmShape::dense(Trans::No, Trans::Yes, 8, 3072, 8), a.data(), b.data(), nullptr, c.data());
  EXPECT_EQ(gemm.last_onednn_implementation(), narrow);
}

// The addend (a residual connection): after bias and accumulator, before the epilogue, in
// every library and dtype; in oneDNN a binary post-op. bf16 outputs round the whole sum once.
TEST(Gemm, AddendJoinsTheSumBeforeTheEpilogue) {
  for (auto [library, in] : {std::pair{GemmLibrary::OneDnn, DType::F32}, {GemmLibrary::OneDnn, DType::BF16},
                             {GemmLibrary::OpenBlas, DType::F32}, {GemmLibrary::OpenBlas, DType::F64}})
    for (Accumulate a : {Accumulate::Assign, Accumulate::Add})
      for (Epilogue e : {Epilogue::None, Epilogue::GeluTanh}) {
        const Case c{library, in, Trans::No, Trans::Yes, true, a, e};
        SCOPED_TRACE(std::string(gemm_library_name(library)) + " " + std::string(dtype_name(in)));
        if (in == DType::F64) run_case<double, double>(c, 37, 53, 70, 3, 0, true);
        else if (in == DType::BF16) run_case<uint16_t, float>(c, 37, 53, 70, 3, 0, true);
        else run_case<float, float>(c, 37, 53, 70, 3, 0, true);
      }
  for (Epilogue e : {Epilogue::None, Epilogue::GeluTanh}) {
    const Case b{GemmLibrary::Auto, DType::BF16, Trans::No, Trans::Yes, true, Accumulate::Assign, e};
    run_case<uint16_t, uint16_t>(b, 37, 53, 70, 3, 4e-3, true);
  }
  // Long reductions: in the first chunk (fp32 C), or at the one rounding (bf16 C); row blocks.
  const Case k{GemmLibrary::OneDnn, DType::F32, Trans::No, Trans::No, true, Accumulate::Assign, Epilogue::None};
  run_case<float, float>(k, 5, 7, 40000, 1, 1e-4, true);
  const Case kb{GemmLibrary::Auto, DType::BF16, Trans::No, Trans::No, true, Accumulate::Assign, Epilogue::None};
  run_case<uint16_t, uint16_t>(kb, 5, 7, 40000, 1, 4e-3, true);
  run_case<uint16_t, uint16_t>(kb, 20000, 7, 9, 1, 4e-3, true);
  const Case r{GemmLibrary::OneDnn, DType::F32, Trans::Yes, Trans::No, true, Accumulate::Add, Epilogue::None};
  run_case<float, float>(r, 20000, 7, 9, 1, 0, true);
  // K = 0: bias plus addend.
  const Case z{GemmLibrary::OneDnn, DType::F32, Trans::No, Trans::No, true, Accumulate::Assign, Epilogue::None};
  run_case<float, float>(z, 3, 4, 0, 1, 0, true);
}

TEST(Gemm, LongReductionsAreCutIntoChunksAndSummed) {
  // K above the chunk length (16384): 3 chunks, bias in the first only, the rest accumulate.
  // fp32 sums of 40000 terms: a looser bound than the table's.
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Trans tb : {Trans::No, Trans::Yes}) {
      const Case c{GemmLibrary::OneDnn, DType::F32, ta, tb, true, Accumulate::Assign, Epilogue::None};
      run_case<float, float>(c, 5, 7, 40000, 1, 1e-4);
      const Case a{GemmLibrary::OneDnn, DType::BF16, ta, tb, true, Accumulate::Add, Epilogue::None};
      run_case<uint16_t, float>(a, 5, 7, 40000, 1, 1e-4);
    }
  // With an epilogue the reduction stays whole (GELU of the full sum).
  const Case g{GemmLibrary::OneDnn, DType::F32, Trans::No, Trans::Yes, true, Accumulate::Add, Epilogue::GeluTanh};
  run_case<float, float>(g, 5, 7, 40000, 1, 1e-4);
}

TEST(Gemm, ManyRowsAreCutIntoBlocks) {
  // M above the row block (16384): 2 blocks, each with the caller's bias, accumulate and epilogue.
  for (Trans ta : {Trans::No, Trans::Yes}) {
    const Case f{GemmLibrary::OneDnn, DType::F32, ta, Trans::Yes, true, Accumulate::Add, Epilogue::GeluTanh};
    run_case<float, float>(f, 20000, 7, 9, 1);
    const Case b{GemmLibrary::OneDnn, DType::BF16, ta, Trans::No, true, Accumulate::Add, Epilogue::None};
    run_case<uint16_t, float>(b, 20000, 7, 9, 1);
    const Case o{GemmLibrary::OneDnn, DType::BF16, ta, Trans::No, true, Accumulate::Assign, Epilogue::None};
    run_case<uint16_t, uint16_t>(o, 20000, 7, 9, 1, 4e-3);
  }
}

// bf16 outputs (activations of bf16 mixed precision): the fp32 result, bias and GELU included,
// rounded once: half a bf16 ulp, at most 2^-8 = 3.9e-3 of the value (8 significant bits), bounds
// the error. Long reductions sum their chunks in fp32 before the one rounding.
TEST(Gemm, Bf16OutputsAreTheFp32ResultRoundedOnce) {
  constexpr double kRounded = 4e-3;
  for (Trans ta : {Trans::No, Trans::Yes})
    for (Trans tb : {Trans::No, Trans::Yes})
      for (Epilogue e : {Epilogue::None, Epilogue::GeluTanh}) {
        const Case c{GemmLibrary::Auto, DType::BF16, ta, tb, true, Accumulate::Assign, e};
        run_case<uint16_t, uint16_t>(c, 37, 53, 70, 3, kRounded);
      }
  const Case l{GemmLibrary::Auto, DType::BF16, Trans::No, Trans::No, true, Accumulate::Assign,
               Epilogue::None};
  run_case<uint16_t, uint16_t>(l, 5, 7, 40000, 1, kRounded);
  Gemm gemm;  // a bf16 accumulator would round at every addition
  std::vector<uint16_t> h(4, 0);
  EXPECT_THROW(gemm.run_bf16(GemmShape::dense(Trans::No, Trans::No, 2, 2, 2), h.data(), h.data(),
                             nullptr, h.data(), {Accumulate::Add, Epilogue::None}),
               std::invalid_argument);
}

// Batched bf16 products (attention's) against the reference, batch by batch: fp32 outputs with
// fp32 accuracy, bf16 outputs rounded once; alpha scales the product.
TEST(Gemm, BatchedBf16AgainstReference) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (AVX2)";
  const int64_t b0 = 2, b1 = 3, M = 17, N = 19, K = 23;
  const Vec A = representable(random_normal(static_cast<size_t>(b0 * b1 * M * K), 41), DType::BF16);
  const Vec B = representable(random_normal(static_cast<size_t>(b0 * b1 * K * N), 42), DType::BF16);
  std::vector<uint16_t> a(A.size()), b(B.size());
  for (size_t i = 0; i < A.size(); ++i) a[i] = float_to_bf16_bits(static_cast<float>(A[i]));
  for (size_t i = 0; i < B.size(); ++i) b[i] = float_to_bf16_bits(static_cast<float>(B[i]));
  // B stored transposed, (N, K) per batch: a swap of its strides.
  std::vector<uint16_t> bt(b.size());
  for (int64_t p = 0; p < b0 * b1; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) bt[p * K * N + n * K + k] = b[p * K * N + k * N + n];
  cpu::BatchedGemmShape s{b0, b1, M, N, K, {b1 * M * K, M * K, K, 1}, {b1 * K * N, K * N, 1, K},
                          {b1 * M * N, M * N, N, 1}, 0.5f};
  std::vector<float> c32(static_cast<size_t>(b0 * b1 * M * N));
  std::vector<uint16_t> c16(c32.size());
  Gemm gemm;
  gemm.run_batched_bf16(s, a.data(), bt.data(), c32.data());
  gemm.run_batched_bf16(s, a.data(), bt.data(), c16.data());
  Vec expect, got32, got16;
  for (int64_t p = 0; p < b0 * b1; ++p) {
    const Vec Ap(A.begin() + p * M * K, A.begin() + (p + 1) * M * K);
    const Vec Bp(B.begin() + p * K * N, B.begin() + (p + 1) * K * N);
    Vec Cp;
    reference::gemm(Cp, Ap, Bp, nullptr, false, false, M, N, K, false, false);
    for (double v : Cp) expect.push_back(0.5 * v);
  }
  for (size_t i = 0; i < c32.size(); ++i) {
    got32.push_back(c32[i]);
    got16.push_back(bf16_bits_to_float(c16[i]));
  }
  EXPECT_LT(max_relative_error(got32, expect), tolerance(DType::BF16));
  EXPECT_LT(max_relative_error(got16, expect), 4e-3);
}

TEST(Gemm, AutoRuleUsesOneDnnExceptForTinyProducts) {
  Gemm gemm;
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::No, Trans::Yes, 16, 32, 32)), GemmLibrary::OpenBlas);
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::No, Trans::Yes, 64, 128, 32)), GemmLibrary::OpenBlas);
  // GPT-2 124M at T 256, micro-batch 4: every GEMM of a block and of the head.
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::No, Trans::Yes, 1024, 2304, 768)), GemmLibrary::OneDnn);
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::Yes, Trans::No, 768, 768, 1024)), GemmLibrary::OneDnn);
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::No, Trans::No, 1024, 768, 50257)), GemmLibrary::OneDnn);
  gemm.set_library(GemmLibrary::OpenBlas);
  EXPECT_EQ(gemm.choose(GemmShape::dense(Trans::No, Trans::Yes, 1024, 2304, 768)), GemmLibrary::OpenBlas);
}

TEST(Gemm, PrimitivesAreCachedPerShapeAndPostOps) {
  Gemm gemm;
  gemm.set_library(GemmLibrary::OneDnn);
  const GemmShape s = GemmShape::dense(Trans::No, Trans::Yes, 8, 16, 4);
  std::vector<float> a(8 * 4, 1.0f), b(16 * 4, 0.5f), c(8 * 16), c2(8 * 16), bias(16, 1.0f);
  gemm.run(s, a.data(), b.data(), nullptr, c.data());
  gemm.run(s, a.data(), b.data(), nullptr, c2.data());  // other buffers, same primitive
  EXPECT_EQ(gemm.cached_primitives(), 1u);
  EXPECT_EQ(c2[0], 2.0f);
  gemm.run(s, a.data(), b.data(), bias.data(), c.data());
  gemm.run(s, a.data(), b.data(), nullptr, c.data(), {Accumulate::Add, Epilogue::None});
  gemm.run(GemmShape::dense(Trans::No, Trans::No, 8, 16, 4), a.data(), b.data(), nullptr, c.data());
  EXPECT_EQ(gemm.cached_primitives(), 4u);
  EXPECT_EQ(c[0], 2.0f);
}

// Products that one primitive runs on many threads at once (the attention tasks): each thread's
// result is its own, bit for bit what it gives alone. The shape is one whose blocked kernel
// packs B in a scratchpad; with oneDNN's own scratchpad, shared by all, threads read each
// other's B.
TEST(Gemm, TaskProductsRunningAtOnceEachGetTheirOwnResult) {
  constexpr int kThreads = 4, kRepeats = 100;
  constexpr int64_t M = 64, N = 512, K = 64;
  const GemmShape s = GemmShape::dense(Trans::No, Trans::Yes, M, N, K);
  for (const bool bf16 : {false, true}) {
    if (bf16 && !cpu_runs_bf16()) continue;
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Gemm gemm;
    std::vector<std::vector<float>> a(kThreads), b(kThreads), alone(kThreads);
    std::vector<std::vector<uint16_t>> a16(kThreads), b16(kThreads);
    const auto product = [&](int t, float* c) {
      if (bf16)
        gemm.run_in_task_bf16(s, a16[t].data(), b16[t].data(), c, 0.125f, Accumulate::Assign);
      else
        gemm.run_in_task(s, a[t].data(), b[t].data(), c, 0.125f, Accumulate::Assign);
    };
    const int outer = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int t = 0; t < kThreads; ++t) {
      for (const double x : representable(random_normal(M * K, 10u + t), DType::BF16))
        a[t].push_back(static_cast<float>(x));
      for (const double x : representable(random_normal(N * K, 20u + t), DType::BF16))
        b[t].push_back(static_cast<float>(x));
      for (const float x : a[t]) a16[t].push_back(float_to_bf16_bits(x));
      for (const float x : b[t]) b16[t].push_back(float_to_bf16_bits(x));
      alone[t].resize(M * N);
      product(t, alone[t].data());
    }
    omp_set_num_threads(outer);
    std::vector<int64_t> wrong(kThreads, 0);
#pragma omp parallel num_threads(kThreads)
    {
      omp_set_num_threads(1);
      const int t = omp_get_thread_num();
      std::vector<float> c(M * N);
      for (int r = 0; r < kRepeats; ++r) {
        product(t, c.data());
        for (int64_t i = 0; i < M * N; ++i) wrong[t] += c[i] != alone[t][i];
      }
    }
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
  }
}

TEST(Gemm, EmptyProductLeavesBiasOrAccumulator) {
  Gemm gemm;
  gemm.set_library(GemmLibrary::OneDnn);
  const GemmShape s = GemmShape::dense(Trans::No, Trans::No, 2, 3, 0);
  std::vector<float> c(6, 5.0f), bias{1, 2, 3};
  gemm.run(s, nullptr, nullptr, bias.data(), c.data(), {Accumulate::Add, Epilogue::None});
  EXPECT_EQ(c, (std::vector<float>{6, 7, 8, 6, 7, 8}));
  gemm.run(s, nullptr, nullptr, nullptr, c.data());
  EXPECT_EQ(c, std::vector<float>(6, 0.0f));
}

TEST(Gemm, RefusesWhatALibraryCannotDo) {
  Gemm gemm;
  const GemmShape s = GemmShape::dense(Trans::No, Trans::No, 2, 2, 2);
  std::vector<double> d(4, 1.0);
  std::vector<uint16_t> h(4, 0);
  std::vector<float> f(4, 0.0f);
  gemm.set_library(GemmLibrary::OneDnn);
  try {
    gemm.run(s, d.data(), d.data(), nullptr, d.data());
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("oneDNN has no fp64 matmul (GEMM NN 2x2x2)"), std::string::npos) << e.what();
  }
  gemm.set_library(GemmLibrary::OpenBlas);
  EXPECT_THROW(gemm.run_bf16(s, h.data(), h.data(), nullptr, f.data()), std::invalid_argument);
  gemm.set_library(GemmLibrary::Auto);
  const GemmShape bad{Trans::No, Trans::No, 2, 2, 2, 1, 2, 2};  // lda shorter than a row
  EXPECT_THROW(gemm.run(bad, f.data(), f.data(), nullptr, f.data()), std::invalid_argument);
}

// The Backend's matmul through each library, on a shape where Auto picks oneDNN: forward with
// fused bias, backward assigning dinp and accumulating dweight and dbias.
class BackendMatmul : public ::testing::TestWithParam<GemmLibrary> {};

TEST_P(BackendMatmul, ForwardBackwardAccumulates) {
  CpuBackend be(2);
  be.gemm().set_library(GetParam());
  const int64_t N = 96, C = 80, OC = 112;
  ASSERT_EQ(be.gemm().choose(GemmShape::dense(Trans::No, Trans::Yes, N, OC, C)),
            GetParam() == GemmLibrary::OpenBlas ? GemmLibrary::OpenBlas : GemmLibrary::OneDnn);
  const Vec x = random_normal(N * C, 5), w = random_normal(OC * C, 6), b = random_normal(OC, 7);
  const Vec dy = random_normal(N * OC, 8);
  Vec out, dx, dw(OC * C, 0.0), db(OC, 0.0);
  reference::matmul_forward(out, x, w, &b, N, C, OC);
  reference::matmul_backward(dx, dw, db, dy, x, w, N, C, OC);
  const DType dt = DType::F32;
  Tensor tx = testing::make_tensor(be, x, {N, C}, dt), tw = testing::make_tensor(be, w, {OC, C}, dt);
  Tensor tb = testing::make_tensor(be, b, {OC}, dt);
  Tensor tout = be.empty({N, OC}, dt, MemoryCategory::Workspace);
  be.matmul_forward(tout, tx, tw, &tb);
  EXPECT_LT(max_relative_error(testing::to_host(be, tout), out), tolerance(dt));

  Tensor tdx = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor tdw = testing::make_tensor(be, Vec(OC * C, 1.0), {OC, C}, dt);
  Tensor tdb = testing::make_tensor(be, Vec(OC, 1.0), {OC}, dt);
  be.matmul_backward(&tdx, &tdw, &tdb, testing::make_tensor(be, dy, {N, OC}, dt), tx, tw);
  for (double& v : dw) v += 1.0;
  for (double& v : db) v += 1.0;
  EXPECT_LT(max_relative_error(testing::to_host(be, tdx), dx), tolerance(dt));
  EXPECT_LT(max_relative_error(testing::to_host(be, tdw), dw), tolerance(dt));
  EXPECT_LT(max_relative_error(testing::to_host(be, tdb), db), tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Library, BackendMatmul,
                         ::testing::Values(GemmLibrary::Auto, GemmLibrary::OpenBlas, GemmLibrary::OneDnn),
                         [](const ::testing::TestParamInfo<GemmLibrary>& i) {
                           return std::string(i.param == GemmLibrary::Auto       ? "Auto"
                                              : i.param == GemmLibrary::OneDnn ? "OneDnn"
                                                                               : "OpenBlas");
                         });

TEST(CpuBackend, DescribeNamesOneDnnAndItsInstructionSet) {
  CpuBackend be(1);
  const std::string d = be.describe();
  EXPECT_NE(d.find("oneDNN "), std::string::npos) << d;
  EXPECT_NE(d.find("OpenBLAS"), std::string::npos) << d;
}

}  // namespace
}  // namespace meshtrain
