// Gemm: the library rule, the OpenBLAS path (bias pre-broadcast or added after, GELU in place)
// and the hand-off to oneDNN (onednn_matmul.cpp).
//
// The rule (GemmLibrary::Auto): oneDNN for fp32 and bf16, OpenBLAS for fp64 (oneDNN has no fp64
// matmul) and for products of fewer than kOneDnnMinProduct multiply-adds. Measured on the
// development machine (AMD Zen 5, 2 threads, oneDNN 2.6.3 brgemm avx512_core against OpenBLAS
// 0.3.21, every transpose combination of M in 16..1024, N and K in 32..512; bench --suite step
// repeats the comparison for GPT-2's shapes): oneDNN is 1.5-5x faster from 2^19 multiply-adds up
// (every GPT-2 124M GEMM: 1.05-3.9x), and loses only below, by 1-5 us a call (16x32x32 up to
// 256x32x32), where its fixed cost dominates. A rule rather than a timing taken at run time: which
// library computes a GEMM decides its last bits, and a restarted run must continue bit for bit.

#include "meshtrain/backend/cpu/gemm.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas.h"
#include "kernels.h"
#include "onednn_matmul.h"
#include "task_matmul.h"

namespace meshtrain::cpu {

namespace {

constexpr int64_t kOneDnnMinProduct = int64_t{1} << 19;
// oneDNN 2.6's fp32 matmul slows down on very long reductions: the language-model head's input
// gradient (1024 x 768 x 50257, K the vocabulary) ran at 60-70% of the speed of the same GEMM
// cut into 2-5 reductions of 10k-25k summed with the sum post-op (A/B-timed in one process, 2
// threads, loaded machine). So reductions longer than kMaxOneDnnK are cut into equal chunks.
constexpr int64_t kMaxOneDnnK = 16384;
// Likewise for very many rows: the LM head's weight gradient (M = vocabulary 50257, 768 x 1024
// per row block) ran faster in bf16 and fp32 cut into blocks of at most kMaxOneDnnM rows
// (docs/benchmarks.md, "CPU GEMM rules"); 2048 to 16384 rows did alike. Row blocks are
// independent GEMMs: each keeps the caller's accumulate, bias and epilogue.
constexpr int64_t kMaxOneDnnM = 16384;
// oneDNN 2.6 runs an fp32 matmul whose B is plain (not transposed, row stride = row length)
// through its brgemm kernel, which reads B in place, and that kernel falls to half the speed of
// oneDNN's packing GEMM (gemm:jit) once B's rows reach 3072 floats: GPT-2's MLP output
// projection's input gradient (1024x3072x768, dout @ W) and weight gradient (768x3072x1024) ran
// at 0.4-0.6 of gemm:jit's rate, while at 2048 floats and below brgemm was the faster (both
// A/B-timed in one process, alternating, 2 threads, AVX512 without AMX; on an AMX machine the
// same shape ran at 113 GFLOP/s against 230-280 for its neighbours). oneDNN offers no choice of
// kernel for a dense B, but takes gemm:jit for a B whose row stride exceeds its row length: so
// such a B is copied with its rows padded (one pass over K x N, a few percent of the product's
// time). bf16 brgemm keeps its speed at these widths and is left alone.
constexpr int64_t kPackedMinN = 3072;
constexpr int64_t kPaddedRow = 16;  // floats (one cache line) added to each row of the copy

bool pads_b(const GemmShape& s, MatmulType type) {
  return type == MatmulType::F32 && s.tb == Trans::No && s.N >= kPackedMinN && s.ldb == s.N;
}

// Calls f(block) for each block of at most kMaxOneDnnM rows of s, with A and C advanced to it.
template <class In, class Out, class F>
void for_row_blocks(const GemmShape& s, const In* A, Out* C, F&& f) {
  for (int64_t m0 = 0; m0 < s.M; m0 += kMaxOneDnnM) {
    GemmShape block = s;
    block.M = std::min(kMaxOneDnnM, s.M - m0);
    f(block, A + (s.ta == Trans::No ? m0 * s.lda : m0), C + m0 * s.ldc);
  }
}

CBLAS_TRANSPOSE blas(Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; }

template <class T> void gelu_rows(T* C, const GemmShape& s) {
  if (s.ldc == s.N) return gelu_forward<T>(C, C, s.M * s.N);
  for (int64_t i = 0; i < s.M; ++i) gelu_forward<T>(C + i * s.ldc, C + i * s.ldc, s.N);
}

// C += addend, row by row (the addend has C's row stride).
template <class T> void add_rows(T* C, const T* addend, const GemmShape& s) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j) C[i * s.ldc + j] += addend[i * s.ldc + j];
}

// K = 0: no product, C = epilogue(bias [+ C] [+ addend]). oneDNN refuses empty reductions.
template <class T> void empty_product(const GemmShape& s, const T* bias, T* C, GemmOptions o) {
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j) {
      T& c = C[i * s.ldc + j];
      c = (o.accumulate == Accumulate::Add ? c : T(0)) + (bias ? bias[j] : T(0));
    }
  if (o.addend) add_rows(C, static_cast<const T*>(o.addend), s);
  if (o.epilogue == Epilogue::GeluTanh) gelu_rows(C, s);
}

// OpenBLAS: C = epilogue(op(A) op(B) + bias [+ C] [+ addend]), the same order as oneDNN's
// post-ops.
template <class T>
void openblas_gemm(const GemmShape& s, const T* A, const T* B, const T* bias, T* C,
                   GemmOptions o) {
  T beta = o.accumulate == Accumulate::Add ? T(1) : T(0);
  const bool broadcast_bias = bias && o.accumulate == Accumulate::Assign;
  if (broadcast_bias) {  // C = bias on every row, then C += A B
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) C[i * s.ldc + j] = bias[j];
    beta = T(1);
  }
  gemm(blas(s.ta), blas(s.tb), s.M, s.N, s.K, T(1), A, s.lda, B, s.ldb, beta, C, s.ldc);
  if (bias && !broadcast_bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) C[i * s.ldc + j] += bias[j];
  }
  if (o.addend) add_rows(C, static_cast<const T*>(o.addend), s);
  if (o.epilogue == Epilogue::GeluTanh) gelu_rows(C, s);
}

void check(const GemmShape& s) {
  const int64_t a_cols = s.ta == Trans::No ? s.K : s.M, b_cols = s.tb == Trans::No ? s.N : s.K;
  if (s.M < 0 || s.N < 0 || s.K < 0 || s.lda < std::max<int64_t>(1, a_cols) ||
      s.ldb < std::max<int64_t>(1, b_cols) || s.ldc < std::max<int64_t>(1, s.N))
    throw std::invalid_argument("backend 'cpu': GEMM " + s.to_string() + " with lda " +
                                std::to_string(s.lda) + ", ldb " + std::to_string(s.ldb) +
                                ", ldc " + std::to_string(s.ldc) +
                                ": sizes must be >= 0 and each row stride at least its row");
}

}  // namespace

std::string_view gemm_library_name(GemmLibrary library) {
  switch (library) {
    case GemmLibrary::Auto: return "auto";
    case GemmLibrary::OpenBlas: return "OpenBLAS";
    case GemmLibrary::OneDnn: return "oneDNN";
  }
  return "?";
}

GemmShape GemmShape::dense(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K) {
  // BLAS's convention: a row stride is at least 1, also for empty rows.
  const auto ld = [](int64_t cols) { return std::max<int64_t>(1, cols); };
  return GemmShape{ta, tb, M, N, K, ld(ta == Trans::No ? K : M), ld(tb == Trans::No ? N : K), ld(N)};
}

std::string GemmShape::to_string() const {
  return std::string(ta == Trans::Yes ? "T" : "N") + (tb == Trans::Yes ? "T" : "N") + " " +
         std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}

Gemm::Gemm() : tasks_(std::make_unique<TaskMatmuls>()) {}
Gemm::~Gemm() = default;

GemmLibrary Gemm::choose(const GemmShape& s) const {
  if (library_ != GemmLibrary::Auto) return library_;
  return s.M * s.N * s.K < kOneDnnMinProduct ? GemmLibrary::OpenBlas : GemmLibrary::OneDnn;
}

void Gemm::run(const GemmShape& s, const float* A, const float* B, const float* bias, float* C,
               GemmOptions o) {
  check(s);
  if (s.M == 0 || s.N == 0) return;
  if (s.K == 0) return empty_product(s, bias, C, o);
  if (choose(s) == GemmLibrary::OpenBlas) return openblas_gemm(s, A, B, bias, C, o);
  run_onednn(s, MatmulType::F32, A, B, bias, C, o);
}

// Chunks of K: the first keeps the caller's accumulate, bias and addend, the rest add to C. Not
// with an epilogue, which must see the whole sum.
template <class In>
void Gemm::run_onednn(const GemmShape& s, MatmulType type, const In* A, const In* B,
                      const float* bias, float* C, GemmOptions o) {
  if (!onednn_) onednn_ = std::make_unique<OneDnnMatmul>();
  const int64_t chunks = o.epilogue == Epilogue::None ? (s.K + kMaxOneDnnK - 1) / kMaxOneDnnK : 1;
  const int64_t step = (s.K + chunks - 1) / chunks;
  for_row_blocks(s, A, C, [&](const GemmShape& rows, const In* A_rows, float* C_rows) {
    for (int64_t k0 = 0; k0 < s.K; k0 += step) {
      GemmShape part = rows;
      part.K = std::min(step, s.K - k0);
      const In* a = A_rows + (s.ta == Trans::No ? k0 : k0 * s.lda);  // columns of A, or rows of A^T
      const In* b = B + (s.tb == Trans::No ? k0 * s.ldb : k0);       // rows of B, or columns of B^T
      const bool first = k0 == 0;
      if (pads_b(part, type)) b = padded_rows(part, b);
      const void* addend = first && o.addend ? static_cast<const float*>(o.addend) + (C_rows - C) : nullptr;
      onednn_->run(MatmulGeometry::of(part), type, MatmulType::F32, a, b, first ? bias : nullptr,
                   C_rows, {first ? o.accumulate : Accumulate::Add, o.epilogue, addend});
    }
  });
}

// B's K rows of N elements copied with a row stride of N + kPaddedRow (the padding is never read);
// sets s.ldb to it.
template <class In> const In* Gemm::padded_rows(GemmShape& s, const In* B) {
  const int64_t ld = s.N + kPaddedRow;
  const size_t floats = (static_cast<size_t>(s.K * ld) * sizeof(In) + sizeof(float) - 1) / sizeof(float);
  if (padded_b_.size() < floats) padded_b_.resize(floats);
  In* out = reinterpret_cast<In*>(padded_b_.data());
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < s.K; ++k) std::copy_n(B + k * s.ldb, s.N, out + k * ld);
  s.ldb = ld;
  return out;
}

void Gemm::run_batched(const BatchedGemmShape& s, const float* A, const float* B, float* C,
                       Accumulate accumulate) {
  run_batched_onednn(s, MatmulType::F32, A, B, C, accumulate);
}

void Gemm::run_batched_bf16(const BatchedGemmShape& s, const uint16_t* A, const uint16_t* B,
                            float* C, Accumulate accumulate) {
  run_batched_onednn(s, MatmulType::BF16, A, B, C, accumulate);
}

void Gemm::run_batched_bf16(const BatchedGemmShape& s, const uint16_t* A, const uint16_t* B,
                            uint16_t* C) {
  run_batched_onednn(s, MatmulType::BF16, A, B, C, Accumulate::Assign);
}

template <class Out>
void Gemm::run_batched_onednn(const BatchedGemmShape& s, MatmulType in, const void* A,
                              const void* B, Out* C, Accumulate accumulate) {
  if (s.batch0 < 0 || s.batch1 < 0 || s.M < 0 || s.N < 0 || s.K < 0)
    throw std::invalid_argument("backend 'cpu': batched GEMM " + s.to_string() + ": sizes must be >= 0");
  if (s.batch0 == 0 || s.batch1 == 0 || s.M == 0 || s.N == 0) return;
  if (s.K == 0) {
    if (accumulate == Accumulate::Add) return;
    for (int64_t i = 0; i < s.batch0; ++i)
      for (int64_t j = 0; j < s.batch1; ++j)
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = 0; n < s.N; ++n) C[i * s.c.batch0 + j * s.c.batch1 + m * s.c.row + n * s.c.col] = 0;
    return;
  }
  if (!onednn_) onednn_ = std::make_unique<OneDnnMatmul>();
  const MatmulType out = std::is_same_v<Out, float> ? MatmulType::F32 : MatmulType::BF16;
  onednn_->run(MatmulGeometry::of(s), in, out, A, B, nullptr, C, {accumulate, Epilogue::None}, s.alpha);
}

std::string BatchedGemmShape::to_string() const {
  return std::to_string(batch0 * batch1) + " x " + std::to_string(M) + "x" + std::to_string(N) +
         "x" + std::to_string(K);
}

void Gemm::run(const GemmShape& s, const double* A, const double* B, const double* bias, double* C,
               GemmOptions o) {
  check(s);
  if (library_ == GemmLibrary::OneDnn)
    throw std::invalid_argument("backend 'cpu': oneDNN has no fp64 matmul (GEMM " + s.to_string() +
                                "); use GemmLibrary::Auto or OpenBlas for fp64");
  if (s.M == 0 || s.N == 0) return;
  if (s.K == 0) return empty_product(s, bias, C, o);
  openblas_gemm(s, A, B, bias, C, o);
}

void Gemm::run_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, const float* bias,
                    float* C, GemmOptions o) {
  check(s);
  if (library_ == GemmLibrary::OpenBlas)
    throw std::invalid_argument("backend 'cpu': this OpenBLAS has no bf16 GEMM (GEMM " +
                                s.to_string() + "); use GemmLibrary::Auto or OneDnn for bf16");
  if (s.M == 0 || s.N == 0) return;
  if (s.K == 0) return empty_product(s, bias, C, o);
  run_onednn(s, MatmulType::BF16, A, B, bias, C, o);
}

// One oneDNN call rounds its fp32 result to bf16 (to nearest even). A reduction cut into chunks
// of K sums the chunks in fp32 (wide_), then rounds once: rounding each partial sum to bf16
// would lose 8 bits per chunk.
void Gemm::run_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, const float* bias,
                    uint16_t* C, GemmOptions o) {
  check(s);
  if (library_ == GemmLibrary::OpenBlas)
    throw std::invalid_argument("backend 'cpu': this OpenBLAS has no bf16 GEMM (GEMM " +
                                s.to_string() + "); use GemmLibrary::Auto or OneDnn for bf16");
  if (o.accumulate == Accumulate::Add)
    throw std::invalid_argument("backend 'cpu': GEMM " + s.to_string() +
                                " accumulating into bf16: accumulate in an fp32 C instead");
  if (s.M == 0 || s.N == 0) return;
  if (s.K > 0 && (s.K <= kMaxOneDnnK || o.epilogue != Epilogue::None)) {
    if (!onednn_) onednn_ = std::make_unique<OneDnnMatmul>();
    for_row_blocks(s, A, C, [&](const GemmShape& rows, const uint16_t* A_rows, uint16_t* C_rows) {
      GemmOptions block = o;
      if (o.addend) block.addend = static_cast<const uint16_t*>(o.addend) + (C_rows - C);
      onednn_->run(MatmulGeometry::of(rows), MatmulType::BF16, MatmulType::BF16, A_rows, B, bias,
                   C_rows, block);
    });
    return;
  }
  // The addend joins the fp32 sum before its one rounding (an epilogue keeps K whole, so none
  // comes here).
  GemmShape wide = s;
  wide.ldc = s.N;
  wide_.resize(static_cast<size_t>(s.M * s.N));
  run_bf16(wide, A, B, bias, wide_.data(), {o.accumulate, o.epilogue, nullptr});
  if (const auto* addend = static_cast<const bf16*>(o.addend)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j)
        C[i * s.ldc + j] =
            narrow<bf16>(wide_[static_cast<size_t>(i * s.N + j)] + widen(addend[i * s.ldc + j])).bits;
    return;
  }
  if (s.ldc == s.N) return float_to_bf16(C, wide_.data(), s.M * s.N);
  for (int64_t i = 0; i < s.M; ++i) float_to_bf16(C + i * s.ldc, wide_.data() + i * s.N, s.N);
}

size_t Gemm::cached_primitives() const {
  return (onednn_ ? onednn_->cached() : 0) + tasks_->cached();
}

void Gemm::run_in_task(const GemmShape& s, const float* A, const float* B, float* C, float alpha,
                       Accumulate accumulate) {
  if (s.M == 0 || s.N == 0) return;
  if (library_ == GemmLibrary::OpenBlas || s.K == 0) {  // oneDNN refuses empty reductions
    gemm(blas(s.ta), blas(s.tb), s.M, s.N, s.K, alpha, A, s.lda, B, s.ldb,
         accumulate == Accumulate::Add ? 1.0f : 0.0f, C, s.ldc);
    return;
  }
  tasks_->run(MatmulGeometry::of(s), MatmulType::F32, A, B, C, alpha, accumulate);
}

void Gemm::run_in_task_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, float* C,
                            float alpha, Accumulate accumulate) {
  if (s.M == 0 || s.N == 0) return;
  if (library_ == GemmLibrary::OpenBlas)
    throw std::invalid_argument("backend 'cpu': this OpenBLAS has no bf16 GEMM (GEMM " +
                                s.to_string() + "); use GemmLibrary::Auto or OneDnn for bf16");
  if (s.K == 0) {
    if (accumulate == Accumulate::Assign)
      for (int64_t i = 0; i < s.M; ++i) std::fill(C + i * s.ldc, C + i * s.ldc + s.N, 0.0f);
    return;
  }
  tasks_->run(MatmulGeometry::of(s), MatmulType::BF16, A, B, C, alpha, accumulate);
}

std::string Gemm::last_onednn_implementation() const {
  return onednn_ ? onednn_->last_implementation() : std::string();
}

std::string Gemm::onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    default: isa = "below avx2";
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + isa + ")";
}

}  // namespace meshtrain::cpu

namespace meshtrain {

bool cpu_runs_bf16() {
  // Asked of oneDNN itself: whether it has a bf16 matmul under the ISA it dispatches to (it
  // emulates bf16 from AVX512_CORE up and has none below, e.g. on AVX2, whatever its version).
  static const bool runs = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using tag = dnnl::memory::format_tag;
      const dnnl::memory::desc a({16, 16}, dnnl::memory::data_type::bf16, tag::ab);
      const dnnl::memory::desc c({16, 16}, dnnl::memory::data_type::f32, tag::ab);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return runs;
}

std::string cpu_bf16_instructions() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: return "AMX";
    case dnnl::cpu_isa::avx512_core_bf16: return "AVX512-BF16";
    default: return "";
  }
}

}  // namespace meshtrain
