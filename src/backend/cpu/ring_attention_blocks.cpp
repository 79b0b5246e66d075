// CpuBackend: the ring-attention block operations of backend.h (context parallelism) — one
// block of queries against one block of keys, merged into a running (out, lse) by log-sum-exp,
// and its backward from the final out and lse (FlashAttention-2, arXiv 2307.08691, alg. 1-2):
//
//   S = scale Q K^T (masked j > i when causal, and keys before the row's document start under
//   document masking),  m = rowmax S,  P = exp(S - m),  l = rowsum P
//   O_blk = P V / l,  lse_blk = m + log l;  merged: lse = logaddexp(lse, lse_blk),
//   out = out exp(lse_old - lse) + O_blk exp(lse_blk - lse)     scale = dims.softmax_scale()
//
//   P = exp(S - lse_final),  D_i = <dO_i, O_i> (over the head's HV columns),  dP = dO V^T,
//   dS = P * (dP - D),  dV += P^T dO,  dQ += scale dS K,  dK += scale dS^T Q         (+=)
//
// Query head h reads key/value head h / (NH / KVH) (grouped-query attention; KVH == NH is
// multi-head). Forward runs one (batch, query head) pair per OpenMP task, backward one (batch,
// key/value head) group, its query heads in order adding into the group's dK and dV (its columns
// are its own: no races, and sums in a fixed order), in row tiles of kTile queries so that
// scratch is kTile x keys per thread, never rows x keys x B x NH. Products
// are single-threaded OpenBLAS calls (blas.h) in Acc<A>: bf16 tiles are widened to fp32 scratch
// first, and bf16 results round once per block. Also the fast copy_columns (a row loop).

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas.h"
#include "cpu_checks.h"
#include "element.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"
#include "vector_math.h"

namespace meshtrain {

namespace cpu {
namespace {

constexpr int64_t kTile = 64;  // query rows per product: scratch stays a few tiles per thread

// The sizes of one call (query/key heads of HS, value heads of HV; C = NH * HV the width of
// out, W = NH HS + KVH HS + KVH HV of a qkv row, KC = KVH * HS of K and VC = KVH * HV of V in a
// kv row; Tq and Tk rows per sequence of qkv and kv) and its block.
struct BlockGeometry {
  int64_t B, NH, KVH, HS, HV, C, W, KC, VC, Tq, Tk;
  double scale;
  Backend::AttentionBlock block;
  const int32_t* starts;  // document masking: (B * Tq) document starts; null without
  int64_t tile() const { return std::min(kTile, block.rows); }
  int64_t group() const { return NH / KVH; }
  int64_t kv_width() const { return KC + VC; }
};

// The keys [first, end) of the block that its row i (0-based) of sequence b sees: end is i + 1
// when causal, every key otherwise; first is 0, or under document masking the block's key row
// of the row's document start (clamped to [0, end]: first == end when the document starts
// after the block's last key, and the row sees none of them).
struct KeyRange {
  int64_t first, end;
  bool empty() const { return first >= end; }
};
inline KeyRange visible(const BlockGeometry& g, int64_t b, int64_t i) {
  const int64_t end = g.block.causal ? i + 1 : g.block.keys;
  if (g.starts == nullptr) return {0, end};
  const int64_t start = g.starts[b * g.Tq + g.block.q_begin + i] - g.block.key_position;
  return {std::clamp<int64_t>(start, 0, end), end};
}

// A (rows, cols) tile of a strided A matrix as Acc<A>: the matrix itself when A computes as it
// stores (fp32, fp64), else widened into `scratch` (bf16).
template <class A> struct TileView {
  const Acc<A>* p;
  int64_t ld;
};
template <class A>
TileView<A> load(const A* src, int64_t ld, int64_t rows, int64_t cols, Acc<A>* scratch) {
  if constexpr (std::is_same_v<A, Acc<A>>) {
    return {src, ld};
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) scratch[r * cols + c] = widen(src[r * ld + c]);
    return {scratch, cols};
  }
}

// Key/value head g's keys (keys, HS) and values (keys, HV) of the block in sequence b (widened
// into wk and wv for bf16).
template <class A> struct KeysValues {
  TileView<A> K, V;
};
template <class A>
KeysValues<A> load_keys_values(const A* kv, const BlockGeometry& g, int64_t b, int64_t kv_head,
                               Acc<A>* wk, Acc<A>* wv) {
  const A* row = kv + (b * g.Tk + g.block.k_begin) * g.kv_width();
  return {load(row + kv_head * g.HS, g.kv_width(), g.block.keys, g.HS, wk),
          load(row + g.KC + kv_head * g.HV, g.kv_width(), g.block.keys, g.HV, wv)};
}

// Elements of Acc<A> per thread: forward S (tile x keys) and O (tile x HV); backward P and dS
// (tile x keys), dQ (tile x HS), dK (keys x HS) and dV (keys x HV), D (tile); bf16 adds the
// widened Q (tile x HS), dO (tile x HV), K (keys x HS) and V (keys x HV).
template <class A> int64_t forward_scratch(const BlockGeometry& g) {
  const int64_t t = g.tile(), k = g.block.keys;
  const int64_t wide = std::is_same_v<A, bf16> ? t * g.HS + k * (g.HS + g.HV) : 0;
  return t * k + t * g.HV + wide;
}
template <class A> int64_t backward_scratch(const BlockGeometry& g) {
  const int64_t t = g.tile(), k = g.block.keys;
  const int64_t wide = std::is_same_v<A, bf16> ? t * (g.HS + g.HV) + k * (g.HS + g.HV) : 0;
  return 2 * t * k + t * g.HS + k * (g.HS + g.HV) + t + wide;
}

template <class A>
void block_forward(A* out, Acc<A>* lse, const A* qkv, const A* kv, const BlockGeometry& g,
                   Acc<A>* scratch, int team) {
  using E = Acc<A>;
  constexpr bool widened = !std::is_same_v<A, E>;
  const auto& blk = g.block;
  const int64_t C = g.C, HS = g.HS, HV = g.HV, keys = blk.keys, tile = g.tile();
  const E scale = static_cast<E>(g.scale);
  const int64_t per_thread = forward_scratch<A>(g);
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (int64_t bh = 0; bh < g.B * g.NH; ++bh) {
    const int64_t b = bh / g.NH, h = bh % g.NH;
    E* S = scratch + omp_get_thread_num() * per_thread;  // (tile, keys)
    E* O = S + tile * keys;                                // (tile, HV)
    E* wq = widened ? O + tile * HV : nullptr;             // bf16 only: Q tile, K, V
    E* wk = widened ? wq + tile * HS : nullptr;
    E* wv = widened ? wk + keys * HS : nullptr;
    const A* q = qkv + (b * g.Tq + blk.q_begin) * g.W + h * HS;
    const auto [K, V] = load_keys_values(kv, g, b, h / g.group(), wk, wv);
    A* o = out + (b * g.Tq + blk.q_begin) * C + h * HV;
    E* l = lse + bh * g.Tq + blk.q_begin;

    for (int64_t r0 = 0; r0 < blk.rows; r0 += tile) {
      const int64_t rt = std::min(tile, blk.rows - r0);
      const int64_t ku = blk.causal ? r0 + rt : keys;  // keys any row of the tile sees
      const TileView<A> Q = load(q + r0 * g.W, g.W, rt, HS, wq);
      gemm(CblasNoTrans, CblasTrans, rt, ku, HS, scale, Q.p, Q.ld, K.p, K.ld, E(0), S, keys);
      E lse_blk[kTile];
      for (int64_t t = 0; t < rt; ++t) {
        E* s = S + t * keys;
        const KeyRange r = visible(g, b, r0 + t);
        if (r.empty()) {  // nothing of its document here: the merge below leaves the row alone
          std::memset(s, 0, static_cast<size_t>(ku) * sizeof(E));
          lse_blk[t] = -std::numeric_limits<E>::infinity();
          continue;
        }
        const int64_t lo = r.first, n = r.end;
        E m = s[lo];
#pragma omp simd reduction(max : m)
        for (int64_t j = lo + 1; j < n; ++j) m = vmax(m, s[j]);
        E sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = lo; j < n; ++j) {
          s[j] = vexp<E>(s[j] - m);
          sum += s[j];
        }
        if (lo > 0) std::memset(s, 0, static_cast<size_t>(lo) * sizeof(E));
        if (ku > n) std::memset(s + n, 0, static_cast<size_t>(ku - n) * sizeof(E));
        lse_blk[t] = m + std::log(sum);
        const E inv = E(1) / sum;
        for (int64_t j = lo; j < n; ++j) s[j] *= inv;  // P / l: O comes out normalised
      }
      gemm(CblasNoTrans, CblasNoTrans, rt, HV, ku, E(1), S, keys, V.p, V.ld, E(0), O, HV);
      for (int64_t t = 0; t < rt; ++t) {  // merge (out, lse) with (O, lse_blk)
        A* orow = o + (r0 + t) * C;
        const E* brow = O + t * HV;
        const E old = l[r0 + t];
        if (lse_blk[t] == -std::numeric_limits<E>::infinity()) continue;  // saw no key here
        if (old == -std::numeric_limits<E>::infinity()) {
          for (int64_t c = 0; c < HV; ++c) orow[c] = narrow<A>(brow[c]);
          l[r0 + t] = lse_blk[t];
          continue;
        }
        const E mx = std::max(old, lse_blk[t]);
        const E merged = mx + std::log(std::exp(old - mx) + std::exp(lse_blk[t] - mx));
        const E a = std::exp(old - merged), w = std::exp(lse_blk[t] - merged);
        for (int64_t c = 0; c < HV; ++c) orow[c] = narrow<A>(widen(orow[c]) * a + brow[c] * w);
        l[r0 + t] = merged;
      }
    }
  }
}

// dst (rows, D) of A, strided ld, += src (rows, D) of Acc<A>, dense.
template <class A> void add_into(A* dst, int64_t ld, const Acc<A>* src, int64_t rows, int64_t D) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < D; ++c)
      dst[r * ld + c] = narrow<A>(widen(dst[r * ld + c]) + src[r * D + c]);
}

template <class A>
void block_backward(A* dqkv, A* dkv, const A* dout, const A* out, const Acc<A>* lse,
                    const A* qkv, const A* kv, const BlockGeometry& g, Acc<A>* scratch, int team) {
  using E = Acc<A>;
  constexpr bool widened = !std::is_same_v<A, E>;
  const auto& blk = g.block;
  const int64_t C = g.C, HS = g.HS, HV = g.HV, keys = blk.keys, tile = g.tile();
  const E scale = static_cast<E>(g.scale);
  const int64_t per_thread = backward_scratch<A>(g);
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
  for (int64_t bg = 0; bg < g.B * g.KVH; ++bg) {
    const int64_t b = bg / g.KVH, kv_head = bg % g.KVH;
    E* P = scratch + omp_get_thread_num() * per_thread;  // (tile, keys)
    E* dS = P + tile * keys;                               // (tile, keys)
    E* dQ = dS + tile * keys;                              // (tile, HS)
    E* dK = dQ + tile * HS;                                // (keys, HS)
    E* dV = dK + keys * HS;                                // (keys, HV)
    E* D = dV + keys * HV;                                 // (tile)
    E* wq = widened ? D + tile : nullptr;                  // bf16 only: Q, dO tiles, K, V
    E* wdo = widened ? wq + tile * HS : nullptr;
    E* wk = widened ? wdo + tile * HV : nullptr;
    E* wv = widened ? wk + keys * HS : nullptr;
    const int64_t qrow = b * g.Tq + blk.q_begin, krow = b * g.Tk + blk.k_begin;
    const auto [K, V] = load_keys_values(kv, g, b, kv_head, wk, wv);
    std::fill(dK, dK + keys * (HS + HV), E(0));  // dK, dV: summed over the group's query heads

    for (int64_t h = kv_head * g.group(); h < (kv_head + 1) * g.group(); ++h) {
      const A* q = qkv + qrow * g.W + h * HS;
      const A* o = out + qrow * C + h * HV;
      const A* dO_ = dout + qrow * C + h * HV;
      const E* l = lse + (b * g.NH + h) * g.Tq + blk.q_begin;
      for (int64_t r0 = 0; r0 < blk.rows; r0 += tile) {
        const int64_t rt = std::min(tile, blk.rows - r0);
        const int64_t ku = blk.causal ? r0 + rt : keys;
        const TileView<A> Q = load(q + r0 * g.W, g.W, rt, HS, wq);
        const TileView<A> dO = load(dO_ + r0 * C, C, rt, HV, wdo);
        for (int64_t t = 0; t < rt; ++t) {
          E dot = 0;
          for (int64_t c = 0; c < HV; ++c)
            dot += widen(dO_[(r0 + t) * C + c]) * widen(o[(r0 + t) * C + c]);
          D[t] = dot;
        }
        gemm(CblasNoTrans, CblasTrans, rt, ku, HS, scale, Q.p, Q.ld, K.p, K.ld, E(0), P, keys);
        gemm(CblasNoTrans, CblasTrans, rt, ku, HV, E(1), dO.p, dO.ld, V.p, V.ld, E(0), dS, keys);
        for (int64_t t = 0; t < rt; ++t) {
          E* p = P + t * keys;
          E* ds = dS + t * keys;
          const KeyRange r = visible(g, b, r0 + t);
          const int64_t lo = r.first, n = r.end;
          const E li = l[r0 + t], Dt = D[t];
#pragma omp simd
          for (int64_t j = lo; j < n; ++j) {
            p[j] = vexp<E>(p[j] - li);
            ds[j] = p[j] * (ds[j] - Dt);
          }
          if (lo > 0) {  // the products below read the masked entries
            std::memset(p, 0, static_cast<size_t>(lo) * sizeof(E));
            std::memset(ds, 0, static_cast<size_t>(lo) * sizeof(E));
          }
          if (ku > n) {
            std::memset(p + n, 0, static_cast<size_t>(ku - n) * sizeof(E));
            std::memset(ds + n, 0, static_cast<size_t>(ku - n) * sizeof(E));
          }
        }
        gemm(CblasTrans, CblasNoTrans, ku, HV, rt, E(1), P, keys, dO.p, dO.ld, E(1), dV, HV);
        gemm(CblasTrans, CblasNoTrans, ku, HS, rt, scale, dS, keys, Q.p, Q.ld, E(1), dK, HS);
        gemm(CblasNoTrans, CblasNoTrans, rt, HS, ku, scale, dS, keys, K.p, K.ld, E(0), dQ, HS);
        add_into<A>(dqkv + (qrow + r0) * g.W + h * HS, g.W, dQ, rt, HS);
      }
    }
    A* dkv_rows = dkv + krow * g.kv_width();
    add_into<A>(dkv_rows + kv_head * HS, g.kv_width(), dK, keys, HS);
    add_into<A>(dkv_rows + g.KC + kv_head * HV, g.kv_width(), dV, keys, HV);
  }
}

// The geometry of a block the Backend front has checked (attention_blocks.cpp).
// Document starts are positions in the sequence: a negative one is refused by name. (A start
// after its row cannot be told here, where the rows' true positions are unknown.)
BlockGeometry block_geometry(const char* op, const Tensor& qkv, const Tensor& kv, int64_t B,
                             const AttentionDims& d, const Backend::AttentionBlock& blk,
                             const Tensor* document_starts) {
  const int64_t Tq = qkv.dim(0) / B, Tk = kv.dim(0) / B;
  const int32_t* starts =
      document_starts ? static_cast<const int32_t*>(document_starts->raw()) : nullptr;
  if (starts)
    for (int64_t r = 0; r < B * Tq; ++r)
      if (starts[r] < 0)
        throw std::invalid_argument(std::string("backend 'cpu': ") + op + ": document_starts[" +
                                    std::to_string(r) + "] = " + std::to_string(starts[r]) +
                                    " is negative (a position in the sequence)");
  const int64_t NH = d.NH, KVH = d.KVH, HS = d.HS, HV = d.value_size();
  return {B,  NH, KVH, HS, HV, NH * HV, (NH + KVH) * HS + KVH * HV, KVH * HS, KVH * HV,
          Tq, Tk, d.softmax_scale(), blk, starts};
}

}  // namespace
}  // namespace cpu

using cpu::Acc;
using cpu::dispatch;
using cpu::ptr;

// Scratch (Workspace, counted by the planner): per thread, a tile of scores and its partners
// (cpu::forward_scratch / backward_scratch).
void CpuBackend::do_attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                                            const Tensor& kv, int64_t B, const AttentionDims& dims,
                                            const AttentionBlock& block,
                                            const Tensor* document_starts) {
  const char* op = "attention_block_forward";
  const cpu::BlockGeometry g =
      cpu::block_geometry(op, qkv, kv, B, dims, block, planning_ ? nullptr : document_starts);
  const int64_t NH = g.NH;
  KernelProfile::Scope timed(profile_, op,
                             (block.causal ? 1.0 : 2.0) * B * NH * block.rows * block.keys *
                                 (g.HS + g.HV));
  const DType a = qkv.dtype();
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    if (block.rows == 0) return;
    const int team = static_cast<int>(std::min<int64_t>(threads(), B * NH));
    Tensor scratch = empty({team * cpu::forward_scratch<E>(g)}, cpu::wide(a),
                           MemoryCategory::Workspace);
    if (planning_) return;
    cpu::block_forward<E>(ptr<E>(out), ptr<Acc<E>>(lse), ptr<E>(qkv), ptr<E>(kv), g,
                          ptr<Acc<E>>(scratch), team);
  });
}

void CpuBackend::do_attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout,
                                             const Tensor& out, const Tensor& lse,
                                             const Tensor& qkv, const Tensor& kv, int64_t B,
                                             const AttentionDims& dims,
                                             const AttentionBlock& block,
                                             const Tensor* document_starts) {
  const char* op = "attention_block_backward";
  const cpu::BlockGeometry g =
      cpu::block_geometry(op, qkv, kv, B, dims, block, planning_ ? nullptr : document_starts);
  const int64_t NH = g.NH, KVH = g.KVH;
  // Five products: three on HS columns (S, dK, dQ), two on HV (dP, dV).
  KernelProfile::Scope timed(profile_, op,
                             (block.causal ? 1.0 : 2.0) * B * NH * block.rows * block.keys *
                                 (3 * g.HS + 2 * g.HV));
  const DType a = qkv.dtype();
  dispatch(false, op, a, [&](auto tag) {
    using E = decltype(tag);
    if (block.rows == 0) return;
    const int team = static_cast<int>(std::min<int64_t>(threads(), B * KVH));
    Tensor scratch = empty({team * cpu::backward_scratch<E>(g)}, cpu::wide(a),
                           MemoryCategory::Workspace);
    if (planning_) return;
    cpu::block_backward<E>(ptr<E>(dqkv), ptr<E>(dkv), ptr<E>(dout), ptr<E>(out),
                           ptr<Acc<E>>(lse), ptr<E>(qkv), ptr<E>(kv), g, ptr<Acc<E>>(scratch),
                           team);
  });
}

void CpuBackend::do_copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                                 int64_t cols) {
  const char* op = "copy_columns";
  KernelProfile::Scope timed(profile_, op);
  const int64_t rows = dst.dim(0), dst_ld = dst.dim(1), src_ld = src.dim(1);
  if (planning_ || cols == 0) return;
  const size_t size = dtype_size(dst.dtype()), bytes = static_cast<size_t>(cols) * size;
  char* d = static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_col) * size;
  const char* s = static_cast<const char*>(src.raw()) + static_cast<size_t>(src_col) * size;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(d + static_cast<size_t>(r * dst_ld) * size,
                s + static_cast<size_t>(r * src_ld) * size, bytes);
}

}  // namespace meshtrain
