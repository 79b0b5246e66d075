// Causal multi-head self-attention as a blocked, flash-style kernel (FlashAttention-2, arXiv
// 2307.08691, alg. 1-2), on qkv rows of (NH + 2 KVH) heads (query head h reads key/value head
// h / (NH / KVH)), with no T x T matrix: per block of kQueryBlock queries, their scores against
// chunks of at most kKeyChunk keys, up to the diagonal (chunks above it are never computed),
// from the block's first key on (a sliding window's or a document's: chunks before it are never
// computed either, so a window of W keys costs O(T W)):
//
//   S = scale Q K^T (masked j > i, j before the row's document start, and j <= i - W under a
//   window of W),  m = running rowmax,
//   P = exp(S - m),  l = running rowsum P,  O = sum P V rescaled by exp(m_old - m_new),
//   out = O / l,  lse = m + log l          scale = dims.softmax_scale() (1/sqrt(HS) by default)
//
//   backward from lse alone (no probabilities kept):  P = exp(S - lse),  D = rowsum(dO * out),
//   dP = dO V^T,  dS = scale P * (dP - D),  dV += P^T dO,  dK += dS^T Q,  dQ += dS K
//
// Tasks and determinism: forward runs one (batch, head, query block) per OpenMP task, backward
// one (batch, head), each task's GEMMs on its own thread alone (Gemm::run_in_task) in a fixed
// order, so the bits are the same at any thread count. A head's dK and dV sum its query blocks
// in order; under grouped-query heads the group's heads then sum in order (KvParts).
// Query/key heads are HS wide, value heads HV (multi-head latent attention: 192 and 128): the
// products that read V, dO or O (PV, dO V^T, P^T dO) run on HV columns, never padded to HS.
// Operands: every product reads dense (rows, HS or HV) copies of its heads (pack_rows), never the
// strided views of qkv: only on dense operands does oneDNN run its blocked kernels (brgemm, and
// AMX where present); on the views it falls back to a generic GEMM several times slower.
// The products are oneDNN matmuls (bf16 in, fp32 accumulate) on fp32 and bf16, OpenBLAS on fp64
// (and on fp32 when the library is forced to OpenBLAS); the softmax runs in Acc<A>, and bf16's
// P and dS are rounded once to bf16 as the operands of the products that follow.
// Why per-thread products rather than one matmul batched over every head: a batched product
// has to materialise every head's block of scores at once, and per block of queries it is as
// many forks of the thread team as there are key chunks (PyTorch's CPU flash attention and
// llm.c's CPU attention also give each thread whole rows of queries).

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas.h"
#include "element.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "vector_math.h"

namespace meshtrain::cpu {

namespace {

// Queries per task block: the diagonal block wastes about half of its kQueryBlock^2 products,
// so the smaller the block, the closer to the causal FLOPs; 64 rows still keep a GEMM's M
// large enough for oneDNN's kernels. Keys per chunk: bounds a task's scores to
// kQueryBlock x kKeyChunk whatever T (a chunk starts on a multiple of kQueryBlock, so the
// chunk shapes, and the primitives they need, are few).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyChunk = 512;

// The sizes and strides of one call.
struct Geometry {
  int64_t B, T, NH, KVH, HS, HV;
  double scale;
  int64_t window;         // 0: every earlier key (AttentionDims::window)
  const int32_t* starts;  // document starts (B * T), or null
  int64_t G() const { return NH / KVH; }
  int64_t W() const { return (NH + KVH) * HS + KVH * HV; }  // a qkv row
  int64_t C() const { return NH * HV; }                     // an out row
  int64_t value_column(int64_t kv) const { return (NH + KVH) * HS + kv * HV; }
  int64_t blocks() const { return (T + kQueryBlock - 1) / kQueryBlock; }
  // Row i of sequence b sees keys [first_key, i]: from its document's start, and within the
  // window where there is one.
  int64_t first_key(int64_t b, int64_t i) const {
    const int64_t document = starts ? starts[b * T + i] : 0;
    return window > 0 ? std::max(document, i - window + 1) : document;
  }
  // The first key chunk of a query block [q0, q0 + rows): its earliest first key, rounded down
  // to a block boundary. Chunks before it are never computed: under a window a block's keys
  // span at most window + kQueryBlock, so the cost is O(T window), not O(T^2).
  int64_t first_chunk(int64_t b, int64_t q0, int64_t rows) const {
    int64_t lo = q0;
    for (int64_t t = 0; t < rows; ++t) lo = std::min(lo, first_key(b, q0 + t));
    return lo / kQueryBlock * kQueryBlock;
  }
};

// One block product C (Acc<A>) = alpha op(A) op(B) [+ C] on the calling thread.
void product(Gemm& gemm, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
             const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
             Accumulate acc) {
  gemm.run_in_task({ta, tb, M, N, K, lda, ldb, ldc}, a, b, c, alpha, acc);
}
void product(Gemm& gemm, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
             const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float* c, int64_t ldc,
             Accumulate acc) {
  gemm.run_in_task_bf16({ta, tb, M, N, K, lda, ldb, ldc}, reinterpret_cast<const uint16_t*>(a),
                        reinterpret_cast<const uint16_t*>(b), c, alpha, acc);
}
void product(Gemm&, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha,
             const double* a, int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc,
             Accumulate acc) {
  const auto t = [](Trans x) { return x == Trans::Yes ? CblasTrans : CblasNoTrans; };
  gemm(t(ta), t(tb), M, N, K, alpha, a, lda, b, ldb, acc == Accumulate::Add ? 1.0 : 0.0, c, ldc);
}

// Runs body(task) for tasks [0, n) on `team` threads, dynamically scheduled, each thread's
// OpenMP thread count lowered to 1 for its GEMMs (task_matmul.h). The first exception thrown
// in a task is rethrown after the team ends (one cannot leave an OpenMP region).
template <class Body> void run_tasks(int team, int64_t n, Body body) {
  std::exception_ptr error;
#pragma omp parallel num_threads(team)
  {
    omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n; ++task) {
      try {
        body(task, omp_get_thread_num());
      } catch (...) {
#pragma omp critical(meshtrain_flash_attention_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

// Acc<A> elements that hold n elements of A (bf16 packs two to an fp32 element).
template <class A> constexpr int64_t as_acc(int64_t n) {
  return (n * int64_t{sizeof(A)} + int64_t{sizeof(Acc<A>)} - 1) / int64_t{sizeof(Acc<A>)};
}

// Acc<A> elements of a thread's forward scratch: S (and, in place, P unless rounded), O (HV
// wide), m, l, bf16's rounded P, and the dense copy of the block's queries (HS wide).
template <class A> int64_t forward_per_thread(int64_t HS, int64_t HV) {
  const int64_t rounded = std::is_same_v<A, bf16> ? as_acc<A>(kQueryBlock * kKeyChunk) : 0;
  return kQueryBlock * kKeyChunk + kQueryBlock * HV + 2 * kQueryBlock + rounded +
         as_acc<A>(kQueryBlock * HS);
}
// Forward: every key/value head's keys and values, dense (pack_keys_values), shared by the tasks.
template <class A>
int64_t packed_keys_values(int64_t B, int64_t T, int64_t KVH, int64_t HS, int64_t HV) {
  return as_acc<A>(B * KVH * T * (HS + HV));
}
// Backward: P, dS, dQ (block), D, dK and dV (the whole sequence of the head), bf16's rounded P
// and dS, and the dense copies of the block's queries and output gradient and of the head's
// keys and values.
template <class A> int64_t backward_per_thread(int64_t T, int64_t HS, int64_t HV) {
  const int64_t rounded = std::is_same_v<A, bf16> ? 2 * as_acc<A>(kQueryBlock * kKeyChunk) : 0;
  return 2 * kQueryBlock * kKeyChunk + kQueryBlock * HS + kQueryBlock + T * (HS + HV) +
         rounded + as_acc<A>(kQueryBlock * HS) + as_acc<A>(kQueryBlock * HV) +
         as_acc<A>(T * HS) + as_acc<A>(T * HV);
}
// Grouped-query heads: every head's dK and dV (B, NH, T, HS + HV) before the group sums them.
int64_t kv_parts(const Geometry& g) {
  return g.G() > 1 ? g.B * g.NH * g.T * (g.HS + g.HV) : 0;
}

// Copies `rows` rows of D elements at a row stride of ld into a dense (rows, D) block (see
// Operands above). Each copied element then takes part in a query block of multiply-adds or more.
template <class A> void pack_rows(A* dst, const A* src, int64_t rows, int64_t D, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::copy(src + r * ld, src + r * ld + D, dst + r * D);
}

// D[t] = rowsum(dO * out) of `rows` rows: each row summed in order over its HS columns, as a
// plain loop would, but kDotRows rows at a time, so that their sums are independent chains in
// flight rather than one chain of HS dependent additions per row (without FP reassociation the
// compiler cannot split a row's sum; this was the hottest line of bf16 attention backward).
template <class A>
void row_dots(Acc<A>* D, const A* dOut, const A* out, int64_t rows, int64_t HS, int64_t ld) {
  using E = Acc<A>;
  constexpr int64_t kDotRows = 8;
  int64_t t0 = 0;
  for (; t0 + kDotRows <= rows; t0 += kDotRows) {
    E dot[kDotRows] = {};
    for (int64_t c = 0; c < HS; ++c)
      for (int64_t k = 0; k < kDotRows; ++k)
        dot[k] += widen(dOut[(t0 + k) * HS + c]) * widen(out[(t0 + k) * ld + c]);
    for (int64_t k = 0; k < kDotRows; ++k) D[t0 + k] = dot[k];
  }
  for (int64_t t = t0; t < rows; ++t) {
    E dot = 0;
    for (int64_t c = 0; c < HS; ++c) dot += widen(dOut[t * HS + c]) * widen(out[t * ld + c]);
    D[t] = dot;
  }
}

// The keys and values of key/value head kv of sequence b as dense blocks, K (T, HS) then
// V (T, HV), at kv_packed + (b KVH + kv) T (HS + HV): each is copied once per call, where a
// query block's task would copy every key it sees again.
template <class A> void pack_keys_values(const Geometry& g, const A* qkv, A* kv_packed) {
  const int64_t W = g.W(), HS = g.HS, HV = g.HV;
#pragma omp parallel for schedule(static)
  for (int64_t part = 0; part < g.B * g.KVH * 2; ++part) {
    const int64_t b = part / (2 * g.KVH), kv = part / 2 % g.KVH, is_v = part % 2;
    A* dst = kv_packed + (b * g.KVH + kv) * g.T * (HS + HV) + is_v * g.T * HS;
    const A* row = qkv + b * g.T * W;
    if (is_v)
      pack_rows(dst, row + g.value_column(kv), g.T, HV, W);
    else
      pack_rows(dst, row + (g.NH + kv) * HS, g.T, HS, W);
  }
}

// One block of queries [q0, q0 + rows) of head h in sequence b: out and lse (and row_max,
// where given).
template <class A>
void forward_block(Gemm& gemm, const Geometry& g, A* out, Acc<A>* lse, const A* qkv,
                   const A* kv_packed, int64_t b, int64_t h, int64_t q0, int64_t rows,
                   Acc<A>* scratch, Acc<A>* row_max) {
  using E = Acc<A>;
  constexpr E kNone = -std::numeric_limits<E>::infinity();
  const int64_t HS = g.HS, HV = g.HV, W = g.W(), end = q0 + rows;
  const E scale = static_cast<E>(g.scale);
  E* S = scratch;                         // (rows, n) of a chunk of n keys
  E* O = S + kQueryBlock * kKeyChunk;     // (rows, HV)
  E* m = O + kQueryBlock * HV;            // running row max
  E* l = m + kQueryBlock;                 // running row sum
  E* after = l + kQueryBlock;
  A* P = nullptr;                         // P (rows, n): in place over S, or rounded
  if constexpr (std::is_same_v<A, E>) {
    P = S;
  } else {
    P = reinterpret_cast<A*>(after);
    after += as_acc<A>(kQueryBlock * kKeyChunk);
  }
  A* Q = reinterpret_cast<A*>(after);  // (rows, HS)
  const A* K = kv_packed + (b * g.KVH + h / g.G()) * g.T * (HS + HV);  // (T, HS)
  const A* V = K + g.T * HS;                                           // (T, HV)
  pack_rows(Q, qkv + (b * g.T + q0) * W + h * HS, rows, HS, W);
  std::fill(m, m + rows, kNone);
  std::fill(l, l + rows, E(0));

  const int64_t k_begin = g.first_chunk(b, q0, rows);
  for (int64_t k0 = k_begin; k0 < end; k0 += kKeyChunk) {
    const int64_t n = std::min(kKeyChunk, end - k0);
    product(gemm, Trans::No, Trans::Yes, rows, n, HS, scale, Q, HS, K + k0 * HS, HS, S, n,
            Accumulate::Assign);
    for (int64_t t = 0; t < rows; ++t) {
      E* s = S + t * n;
      A* p = P + t * n;
      const int64_t i = q0 + t;
      const int64_t a = std::max(g.first_key(b, i), k0) - k0, e = std::min(i + 1, k0 + n) - k0;
      if (a >= e) {  // none of its keys here: a zero row of P leaves its O as it was
        std::fill(p, p + n, narrow<A>(E(0)));
        continue;
      }
      E mx = s[a];
#pragma omp simd reduction(max : mx)
      for (int64_t j = a + 1; j < e; ++j) mx = vmax(mx, s[j]);
      const E m_new = std::max(m[t], mx);
      const E correction = m[t] == kNone ? E(0) : std::exp(m[t] - m_new);
      E sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = a; j < e; ++j) {
        const E x = vexp<E>(s[j] - m_new);
        sum += x;
        p[j] = narrow<A>(x);
      }
      std::fill(p, p + a, narrow<A>(E(0)));
      std::fill(p + e, p + n, narrow<A>(E(0)));
      l[t] = l[t] * correction + sum;
      if (k0 != k_begin)
        for (int64_t c = 0; c < HV; ++c) O[t * HV + c] *= correction;
      m[t] = m_new;
    }
    product(gemm, Trans::No, Trans::No, rows, HV, n, E(1), P, n, V + k0 * HV, HV, O, HV,
            k0 == k_begin ? Accumulate::Assign : Accumulate::Add);
  }
  for (int64_t t = 0; t < rows; ++t) {  // every row sees at least its own key: l > 0
    const E inv = E(1) / l[t];
    A* o = out + (b * g.T + q0 + t) * g.C() + h * HV;
    for (int64_t c = 0; c < HV; ++c) o[c] = narrow<A>(O[t * HV + c] * inv);
    lse[(b * g.NH + h) * g.T + q0 + t] = m[t] + std::log(l[t]);
    if (row_max) row_max[(b * g.NH + h) * g.T + q0 + t] = m[t];
  }
}

// Head h of sequence b, backward: dQ into dqkv, dK and dV into dqkv (or, under grouped-query
// heads, into the head's KvParts row).
template <class A>
void backward_head(Gemm& gemm, const Geometry& g, A* dqkv, const A* dout, const A* qkv,
                   const A* out, const Acc<A>* lse, int64_t b, int64_t h, Acc<A>* scratch,
                   Acc<A>* parts) {
  using E = Acc<A>;
  const int64_t HS = g.HS, HV = g.HV, W = g.W(), C = g.C(), T = g.T;
  const E scale = static_cast<E>(g.scale);
  E* P = scratch;                        // (rows, n) fp32 probabilities of a chunk of n keys
  E* dS = P + kQueryBlock * kKeyChunk;   // (rows, n): dP, then dS in place
  E* dQ = dS + kQueryBlock * kKeyChunk;  // (rows, HS)
  E* D = dQ + kQueryBlock * HS;          // (rows)
  E* dK = D + kQueryBlock;               // (T, HS)
  E* dV = dK + T * HS;                   // (T, HV)
  E* after = dV + T * HV;
  A* P_op = nullptr;                     // the operands of the products: P and dS, or rounded
  A* dS_op = nullptr;
  if constexpr (std::is_same_v<A, E>) {
    P_op = P;
    dS_op = dS;
  } else {
    P_op = reinterpret_cast<A*>(after);
    dS_op = P_op + kQueryBlock * kKeyChunk;
    after += 2 * as_acc<A>(kQueryBlock * kKeyChunk);
  }
  A* Q = reinterpret_cast<A*>(after);  // (rows, HS), and the block's dO, (rows, HV)
  after += as_acc<A>(kQueryBlock * HS);
  A* dOut = reinterpret_cast<A*>(after);
  after += as_acc<A>(kQueryBlock * HV);
  A* K = reinterpret_cast<A*>(after);  // (T, HS), then V (T, HV)
  A* V = reinterpret_cast<A*>(after + as_acc<A>(T * HS));
  const int64_t row0 = b * T;
  pack_rows(K, qkv + row0 * W + (g.NH + h / g.G()) * HS, T, HS, W);
  pack_rows(V, qkv + row0 * W + g.value_column(h / g.G()), T, HV, W);
  const E* lse_h = lse + (b * g.NH + h) * T;
  std::fill(dK, dK + T * (HS + HV), E(0));

  for (int64_t q0 = 0; q0 < T; q0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, T - q0), end = q0 + rows;
    const A* o = out + (row0 + q0) * C + h * HV;
    pack_rows(Q, qkv + (row0 + q0) * W + h * HS, rows, HS, W);
    pack_rows(dOut, dout + (row0 + q0) * C + h * HV, rows, HV, C);
    row_dots(D, dOut, o, rows, HV, C);
    const int64_t k_begin = g.first_chunk(b, q0, rows);
    for (int64_t k0 = k_begin; k0 < end; k0 += kKeyChunk) {
      const int64_t n = std::min(kKeyChunk, end - k0);
      product(gemm, Trans::No, Trans::Yes, rows, n, HS, scale, Q, HS, K + k0 * HS, HS, P, n,
              Accumulate::Assign);
      product(gemm, Trans::No, Trans::Yes, rows, n, HV, E(1), dOut, HV, V + k0 * HV, HV, dS, n,
              Accumulate::Assign);
      for (int64_t t = 0; t < rows; ++t) {
        E* p = P + t * n;
        E* ds = dS + t * n;
        A* p_op = P_op + t * n;
        A* ds_op = dS_op + t * n;
        const int64_t i = q0 + t;
        const int64_t a = std::max(g.first_key(b, i), k0) - k0, e = std::min(i + 1, k0 + n) - k0;
        if (a >= e) {  // none of its keys here: zero rows of P and dS add nothing below
          std::fill(p_op, p_op + n, narrow<A>(E(0)));
          std::fill(ds_op, ds_op + n, narrow<A>(E(0)));
          continue;
        }
        const E li = lse_h[i], Di = D[t];
#pragma omp simd
        for (int64_t j = a; j < e; ++j) {
          const E x = vexp<E>(p[j] - li);
          p_op[j] = narrow<A>(x);
          ds_op[j] = narrow<A>(x * (ds[j] - Di) * scale);
        }
        std::fill(p_op, p_op + a, narrow<A>(E(0)));  // masked: the products below read them
        std::fill(ds_op, ds_op + a, narrow<A>(E(0)));
        std::fill(p_op + e, p_op + n, narrow<A>(E(0)));
        std::fill(ds_op + e, ds_op + n, narrow<A>(E(0)));
      }
      product(gemm, Trans::Yes, Trans::No, n, HV, rows, E(1), P_op, n, dOut, HV, dV + k0 * HV,
              HV, Accumulate::Add);
      product(gemm, Trans::Yes, Trans::No, n, HS, rows, E(1), dS_op, n, Q, HS, dK + k0 * HS, HS,
              Accumulate::Add);
      product(gemm, Trans::No, Trans::No, rows, HS, n, E(1), dS_op, n, K + k0 * HS, HS, dQ, HS,
              k0 == k_begin ? Accumulate::Assign : Accumulate::Add);
    }
    A* dq = dqkv + (row0 + q0) * W + h * HS;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t c = 0; c < HS; ++c) dq[t * W + c] = narrow<A>(dQ[t * HS + c]);
  }
  if (g.G() == 1) {  // the head's own key/value head: straight into dqkv
    A* dk = dqkv + row0 * W + (g.NH + h) * HS;
    A* dv = dqkv + row0 * W + g.value_column(h);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < HS; ++c) dk[t * W + c] = narrow<A>(dK[t * HS + c]);
      for (int64_t c = 0; c < HV; ++c) dv[t * W + c] = narrow<A>(dV[t * HV + c]);
    }
  } else {
    E* part = parts + (b * g.NH + h) * T * (HS + HV);
    for (int64_t t = 0; t < T; ++t) {
      std::copy(dK + t * HS, dK + (t + 1) * HS, part + t * (HS + HV));
      std::copy(dV + t * HV, dV + (t + 1) * HV, part + t * (HS + HV) + HS);
    }
  }
}

// Grouped-query heads: dK and dV of key/value head kv = the sum of its group's heads' parts in
// head order, rounded once.
template <class A> void sum_groups(const Geometry& g, A* dqkv, const Acc<A>* parts) {
  using E = Acc<A>;
  const int64_t HS = g.HS, KV = g.HS + g.HV, W = g.W();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < g.B * g.T; ++row) {
    const int64_t b = row / g.T, t = row % g.T;
    for (int64_t kv = 0; kv < g.KVH; ++kv) {
      A* dk = dqkv + row * W + (g.NH + kv) * HS;
      A* dv = dqkv + row * W + g.value_column(kv);
      for (int64_t c = 0; c < KV; ++c) {
        E sum = 0;
        for (int64_t j = 0; j < g.G(); ++j)
          sum += parts[((b * g.NH + kv * g.G() + j) * g.T + t) * KV + c];
        (c < HS ? dk[c] : dv[c - HS]) = narrow<A>(sum);
      }
    }
  }
}

}  // namespace

void check_document_starts(const char* op, const int32_t* starts, int64_t B, int64_t T_) {
  if (starts == nullptr) return;
  for (int64_t r = 0; r < B * T_; ++r)
    if (starts[r] < 0 || starts[r] > r % T_)
      throw std::invalid_argument(
          std::string("backend 'cpu': ") + op + ": document_starts[" + std::to_string(r) +
          "] = " + std::to_string(starts[r]) + " lies outside [0, " + std::to_string(r % T_) +
          "] (a token's document starts at or before it)");
}

template <class A>
int64_t attention_forward_scratch(int64_t B, int64_t T_, const AttentionDims& dims, int threads) {
  const int64_t HS = dims.HS, HV = dims.value_size();
  return int64_t{threads} * forward_per_thread<A>(HS, HV) +
         packed_keys_values<A>(B, T_, dims.KVH, HS, HV);
}

namespace {
Geometry geometry(int64_t B, int64_t T_, const AttentionDims& d, const int32_t* starts) {
  return {B, T_, d.NH, d.KVH, d.HS, d.value_size(), d.softmax_scale(), d.window, starts};
}
}  // namespace

template <class A>
int64_t attention_backward_scratch(int64_t B, int64_t T_, const AttentionDims& dims,
                                   int threads) {
  return int64_t{threads} * backward_per_thread<A>(T_, dims.HS, dims.value_size()) +
         kv_parts(geometry(B, T_, dims, nullptr));
}

template <class A>
void attention_forward(Gemm& gemm, A* out, Acc<A>* lse, const A* qkv, int64_t B, int64_t T_,
                       const AttentionDims& dims, Acc<A>* scratch, const int32_t* starts,
                       int threads, Acc<A>* row_max) {
  const Geometry g = geometry(B, T_, dims, starts);
  const int64_t NH = g.NH, pairs = B * NH, blocks = g.blocks(),
                per_thread = forward_per_thread<A>(g.HS, g.HV);
  A* kv_packed = reinterpret_cast<A*>(scratch + int64_t{threads} * per_thread);
  pack_keys_values(g, qkv, kv_packed);
  // The blocks nearest the end of a sequence see the most keys: they go first.
  run_tasks(threads, pairs * blocks, [&](int64_t task, int thread) {
    const int64_t block = blocks - 1 - task / pairs, bh = task % pairs;
    const int64_t q0 = block * kQueryBlock;
    forward_block(gemm, g, out, lse, qkv, kv_packed, bh / NH, bh % NH, q0,
                  std::min(kQueryBlock, T_ - q0), scratch + thread * per_thread, row_max);
  });
}

template <class A>
void attention_backward(Gemm& gemm, A* dqkv, const A* dout, const A* qkv, const A* out,
                        const Acc<A>* lse, int64_t B, int64_t T_, const AttentionDims& dims,
                        Acc<A>* scratch, const int32_t* starts, int threads) {
  const Geometry g = geometry(B, T_, dims, starts);
  const int64_t NH = g.NH, per_thread = backward_per_thread<A>(T_, g.HS, g.HV);
  Acc<A>* parts = scratch + int64_t{threads} * per_thread;
  run_tasks(threads, B * NH, [&](int64_t bh, int thread) {
    backward_head(gemm, g, dqkv, dout, qkv, out, lse, bh / NH, bh % NH,
                  scratch + thread * per_thread, parts);
  });
  if (g.G() > 1) sum_groups(g, dqkv, parts);
}

#define INSTANTIATE(A)                                                                        \
  template int64_t attention_forward_scratch<A>(int64_t, int64_t, const AttentionDims&, int);  \
  template int64_t attention_backward_scratch<A>(int64_t, int64_t, const AttentionDims&, int); \
  template void attention_forward<A>(Gemm&, A*, Acc<A>*, const A*, int64_t, int64_t,           \
                                     const AttentionDims&, Acc<A>*, const int32_t*, int,       \
                                     Acc<A>*);                                                 \
  template void attention_backward<A>(Gemm&, A*, const A*, const A*, const A*,                \
                                      const Acc<A>*, int64_t, int64_t, const AttentionDims&,   \
                                      Acc<A>*, const int32_t*, int);
INSTANTIATE(float)
INSTANTIATE(double)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace meshtrain::cpu
