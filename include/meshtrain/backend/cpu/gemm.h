#pragma once
// The CPU backend's GEMM: one call, two libraries. oneDNN matmul primitives (cached per shape,
// bias and epilogue fused as post-ops) where they are faster, OpenBLAS where oneDNN has nothing
// (fp64) or loses (tiny products, where a call costs microseconds either way). Not a tensor API:
// row-major pointers and strides, as the CPU kernels use them; the Backend calls it.
//
//   C (M, N) = epilogue( op(A) (M, K) @ op(B) (K, N) + bias (N) [+ C] [+ addend (M, N)] )
//
// op(X) is X or X^T as stored: a row-major matrix with row stride ld. Accumulate::Add keeps C
// and adds to it (beta = 1: parameter gradients accumulate); an addend is another (M, N) matrix
// of C's type and row stride (a residual connection), read by oneDNN inside the product (a
// binary post-op) rather than by a pass of its own; the epilogue acts on the sum.
// Inputs are fp32, fp64 or bf16 (bf16 travels as its uint16_t bits); accumulation is fp32 for
// fp32 and bf16 inputs, fp64 for fp64. C is the accumulation type, or bf16 for bf16 inputs
// (rounded to nearest even once, from the fp32 sum: activations of bf16 mixed precision).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::cpu {

enum class Trans { No, Yes };
enum class Accumulate { Assign, Add };
enum class Epilogue { None, GeluTanh };  // GELU, tanh approximation (as gelu_forward)

// Which library runs a GEMM. Auto applies the rule in gemm.cpp (oneDNN unless the product is
// tiny or fp64); the others force one, for benchmarks and tests, and are refused where that
// library cannot run the GEMM (OpenBLAS: bf16; oneDNN: fp64).
enum class GemmLibrary { Auto, OpenBlas, OneDnn };
std::string_view gemm_library_name(GemmLibrary library);

struct GemmShape {
  Trans ta = Trans::No, tb = Trans::No;
  int64_t M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // row strides as stored (A is (K, M) when ta = Yes)

  // The dense case: leading dimensions from the shape.
  static GemmShape dense(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K);
  std::string to_string() const;  // "NT 1024x768x2304" (M x N x K)
};

// A batch of GEMMs over two batch dimensions, every operand addressed by element strides
// (batch0, batch1, row, column) — e.g. attention's per-(batch, head) products on strided views of
// qkv, transposes being swapped strides:
//   C[i][j] (M, N) = alpha * A[i][j] (M, K) @ B[i][j] (K, N) [+ C[i][j]]
struct BatchedGemmShape {
  struct Strides {
    int64_t batch0 = 0, batch1 = 0, row = 0, col = 0;
    auto operator<=>(const Strides&) const = default;
  };
  int64_t batch0 = 1, batch1 = 1, M = 0, N = 0, K = 0;
  Strides a, b, c;
  float alpha = 1.0f;
  std::string to_string() const;  // "48 x 64x128x64"
};

struct GemmOptions {
  Accumulate accumulate = Accumulate::Assign;
  Epilogue epilogue = Epilogue::None;
  // (M, N) with row stride ldc, of C's type (bf16 bits for a bf16 C); null: none. Must not
  // overlap C.
  const void* addend = nullptr;
};

class OneDnnMatmul;
class TaskMatmuls;
enum class MatmulType;

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // bias may be null. The threads are the caller's OpenMP team size (omp_get_max_threads).
  void run(const GemmShape& s, const float* A, const float* B, const float* bias, float* C,
           GemmOptions o = {});
  void run(const GemmShape& s, const double* A, const double* B, const double* bias, double* C,
           GemmOptions o = {});
  // bf16 inputs, fp32 accumulation, bias and output (oneDNN only).
  void run_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, const float* bias,
                float* C, GemmOptions o = {});
  // The same with a bf16 output: the fp32 result (bias, addend and epilogue included) rounded
  // once. Accumulate::Add is refused: a bf16 accumulator would round at every addition.
  void run_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, const float* bias,
                uint16_t* C, GemmOptions o = {});
  // A batch of fp32 GEMMs as one oneDNN primitive, threaded over the batch (whatever the
  // library setting: OpenBLAS has no strided batch; callers pick their own OpenBLAS loop).
  void run_batched(const BatchedGemmShape& s, const float* A, const float* B, float* C,
                   Accumulate accumulate = Accumulate::Assign);
  // bf16 batches: fp32 accumulation into an fp32 C, or rounded once into a bf16 C.
  void run_batched_bf16(const BatchedGemmShape& s, const uint16_t* A, const uint16_t* B, float* C,
                        Accumulate accumulate = Accumulate::Assign);
  void run_batched_bf16(const BatchedGemmShape& s, const uint16_t* A, const uint16_t* B,
                        uint16_t* C);

  // One GEMM by the calling thread alone, callable from every thread of an OpenMP team at once
  // (the flash-attention tasks): fp32 C = alpha op(A) op(B) [+ C], fp32 or bf16 inputs. The
  // caller sets its thread's OpenMP thread count to 1 inside the team (task_matmul.h says why).
  // fp32 runs on OpenBLAS when the library is forced to it, else on oneDNN; bf16 on oneDNN.
  void run_in_task(const GemmShape& s, const float* A, const float* B, float* C, float alpha,
                   Accumulate accumulate);
  void run_in_task_bf16(const GemmShape& s, const uint16_t* A, const uint16_t* B, float* C,
                        float alpha, Accumulate accumulate);

  void set_library(GemmLibrary library) { library_ = library; }
  GemmLibrary library() const { return library_; }
  // The library that runs an fp32 GEMM of this shape under the current setting.
  GemmLibrary choose(const GemmShape& s) const;
  // oneDNN's version and the instruction set it dispatches to, e.g. "oneDNN 2.6.3
  // (avx512_core_bf16)"; and how many primitives are cached.
  static std::string onednn_version();
  size_t cached_primitives() const;
  // oneDNN's name for the kernel of the last GEMM it ran ("" before any), for tests.
  std::string last_onednn_implementation() const;

 private:
  template <class In>
  void run_onednn(const GemmShape& s, MatmulType type, const In* A, const In* B,
                  const float* bias, float* C, GemmOptions o);
  template <class Out>
  void run_batched_onednn(const BatchedGemmShape& s, MatmulType in, const void* A, const void* B,
                          Out* C, Accumulate accumulate);

  template <class In> const In* padded_rows(GemmShape& s, const In* B);

  std::vector<float> wide_;  // fp32 sums of bf16-output GEMMs cut into chunks of K
  // B copied with padded rows, for oneDNN's packing GEMM (gemm.cpp); float storage is aligned
  // for every input type.
  std::vector<float> padded_b_;

  GemmLibrary library_ = GemmLibrary::Auto;
  std::unique_ptr<OneDnnMatmul> onednn_;
  std::unique_ptr<TaskMatmuls> tasks_;  // created with the Gemm: the tasks share it
};

}  // namespace meshtrain::cpu
