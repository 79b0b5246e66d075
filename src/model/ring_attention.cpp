#include "meshtrain/model/ring_attention.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "meshtrain/model/layer.h"

namespace meshtrain {

namespace {

constexpr int kKeysTag = 71, kGradientTag = 72;

// Sends `mine` to the next rank of the ring and receives the previous rank's into `theirs`.
std::vector<Work> pass_on(Communicator& comm, const Tensor& mine, Tensor& theirs, int tag) {
  const int next = (comm.rank() + 1) % comm.size(), prev = (comm.rank() + comm.size() - 1) % comm.size();
  return comm.exchange({Transfer{Transfer::Kind::Send, mine, next, tag},
                        Transfer{Transfer::Kind::Recv, theirs, prev, tag}});
}

// Waits for `works`, adding the time to `waited` when given.
void wait_timed(std::vector<Work>& works, double* waited) {
  if (!waited) return wait_all(works);
  const auto t0 = std::chrono::steady_clock::now();
  wait_all(works);
  *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Lets MPI move the transfers in flight: between two blocks of compute, which would otherwise
// leave a large message standing until the wait.
void progress(std::vector<Work>& works) {
  for (Work& w : works) w.test();
}

}  // namespace

std::vector<Backend::AttentionBlock> ring_attention_blocks(const ContextParallel& cp, int source,
                                                           int64_t T) {
  const int64_t L = T / 2;
  std::vector<Backend::AttentionBlock> out;
  for (int qc = 0; qc < 2; ++qc)
    for (int kc = 0; kc < 2; ++kc) {
      const int q = cp.chunk_of(cp.rank(), qc), k = cp.chunk_of(source, kc);
      if (k > q) continue;
      out.push_back({qc * L, L, kc * L, L, k == q, k * L});
    }
  return out;
}

void ring_attention_forward(Backend& be, const ContextParallel& cp, Tensor& out, Tensor& lse,
                            const Tensor& qkv, int64_t B, int64_t T, const AttentionDims& dims,
                            double* waited, const Tensor* document_starts) {
  // Each token's row: NH query heads, then KVH key heads and KVH value heads (what travels:
  // one copy, the keys' and values' columns lying side by side).
  const int64_t C = dims.NH * dims.HS, KV = dims.KVH * (dims.HS + dims.value_size());
  const MemoryCategory ws = MemoryCategory::Workspace;
  Tensor held = be.empty({B * T, KV}, qkv.dtype(), ws);
  be.copy_columns(held, 0, qkv, C, KV);
  Tensor arriving = be.empty({B * T, KV}, qkv.dtype(), ws);
  be.fill(lse, -std::numeric_limits<double>::infinity());
  const int n = cp.size();
  for (int step = 0; step < n; ++step) {
    // The next block travels while this one is attended to.
    std::vector<Work> transfer;
    if (step + 1 < n) transfer = pass_on(*cp.comm, held, arriving, kKeysTag);
    const int source = (cp.rank() - step + n) % n;
    for (const Backend::AttentionBlock& b : ring_attention_blocks(cp, source, T)) {
      be.attention_block_forward(out, lse, qkv, held, B, dims, b, document_starts);
      progress(transfer);
    }
    wait_timed(transfer, waited);
    std::swap(held, arriving);
  }
}

void ring_attention_backward(Backend& be, const ContextParallel& cp, Tensor& dqkv,
                             const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, int64_t B, int64_t T, const AttentionDims& dims,
                             double* waited, const Tensor* document_starts) {
  const int64_t C = dims.NH * dims.HS, KV = dims.KVH * (dims.HS + dims.value_size());
  const MemoryCategory ws = MemoryCategory::Workspace;
  const DType dt = qkv.dtype();
  Tensor held = be.empty({B * T, KV}, dt, ws), arriving = be.empty({B * T, KV}, dt, ws);
  be.copy_columns(held, 0, qkv, C, KV);
  // The gradient of the keys and values held: this rank's part, then the sum so far of the
  // ranks the block visited before, which arrives while this rank computes its part.
  Tensor partial = be.empty({B * T, KV}, dt, ws);
  Tensor travelling = be.empty({B * T, KV}, dt, ws), sent = be.empty({B * T, KV}, dt, ws);
  be.fill(dqkv, 0.0);
  const int n = cp.size();
  std::vector<Work> gradient;  // the previous step's travelling sum, out and in
  for (int step = 0; step < n; ++step) {
    std::vector<Work> keys;
    if (step + 1 < n) keys = pass_on(*cp.comm, held, arriving, kKeysTag);
    const int source = (cp.rank() - step + n) % n;
    be.fill(partial, 0.0);
    for (const Backend::AttentionBlock& b : ring_attention_blocks(cp, source, T)) {
      be.attention_block_backward(dqkv, partial, dout, out, lse, qkv, held, B, dims, b,
                                  document_starts);
      progress(keys);
      progress(gradient);
    }
    wait_timed(gradient, waited);
    if (step > 0) be.add_inplace(partial, travelling);  // the block's sum from the ranks before
    // Pass the sum on to the rank that gets this block next; after the last step that is the
    // block's owner, and what arrives here is the sum for this rank's own block.
    std::swap(partial, sent);
    gradient = pass_on(*cp.comm, sent, travelling, kGradientTag);
    wait_timed(keys, waited);
    std::swap(held, arriving);
  }
  wait_timed(gradient, waited);
  be.copy_columns(dqkv, C, travelling, 0, KV);
}

}  // namespace meshtrain
