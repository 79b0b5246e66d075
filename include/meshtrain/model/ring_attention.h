#pragma once
// Context parallelism: cp ranks split every sequence and hold their part of it through the
// whole model, attention included. The sequence of T tokens is cut into 2 cp chunks of
// L = T / (2 cp); rank r holds chunks r and 2 cp - 1 - r, one from each end, so that under the
// causal mask every rank has the same attention work (an early chunk sees few keys, a late one
// many).
//
// Ring attention: a rank's queries need every earlier key, which the other ranks hold. The
// keys and values travel around the cp group, one rank's block per step, sent on while the
// block just received is attended to; each (query chunk, key chunk) pair is one block of
// Backend::attention_block_forward, merged exactly by log-sum-exp. Per step a rank computes two
// full L x L blocks (or, on its own block, two causal ones and one full one). MPI moves a large
// message only inside MPI calls (without asynchronous progress), so the ring tests its
// transfers between blocks: one test after the peer's message has arrived copies it. Backward sends
// the blocks around again, each with the gradient of its keys and values, which every rank
// adds to and which ends back at the block's owner after cp steps.

#include <cstdint>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/communicator.h"

namespace meshtrain {

struct ContextParallel {
  Communicator* comm = nullptr;  // the cp group; null: off

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool on() const { return size() > 1; }
  // The global chunk index of local chunk c (0 or 1) of rank `r`.
  int chunk_of(int r, int c) const { return c == 0 ? r : 2 * size() - 1 - r; }
  // The global position of local row t of a sequence this rank holds T_local = 2 L tokens of.
  int64_t position(int64_t t, int64_t T_local) const {
    if (!on()) return t;
    const int64_t L = T_local / 2;
    return chunk_of(rank(), t < L ? 0 : 1) * L + t % L;
  }
};

// The blocks of this rank's queries against the keys and values of rank `source`, for
// sequences of T local tokens: a key chunk before the query chunk is a full block, the same
// chunk a causal one, a later one nothing.
std::vector<Backend::AttentionBlock> ring_attention_blocks(const ContextParallel& cp, int source,
                                                           int64_t T);

// Attention of this rank's queries over the whole sequence. qkv (B * T, NH HS + KVH HS + KVH HV)
// of this rank's T = 2 L tokens per sequence (this tensor rank's heads: NH query, KVH key and
// value; backend.h, AttentionDims); out (B * T, NH HV) assigned; lse (B, NH, T) in stats_dtype
// assigned, kept for backward. What travels is each token's keys and values, KVH (HS + HV)
// columns. `waited`, when given, gains the seconds spent waiting for the ring's transfers
// (what compute did not hide). document_starts (document masking, B * T int32 at the rows'
// true positions) go with every block: a key chunk of another rank is masked by document too.
void ring_attention_forward(Backend& be, const ContextParallel& cp, Tensor& out, Tensor& lse,
                            const Tensor& qkv, int64_t B, int64_t T, const AttentionDims& dims,
                            double* waited = nullptr, const Tensor* document_starts = nullptr);
// dqkv (B * T, NH HS + KVH HS + KVH HV) assigned from dout and forward's qkv, out and lse.
void ring_attention_backward(Backend& be, const ContextParallel& cp, Tensor& dqkv,
                             const Tensor& dout, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, int64_t B, int64_t T, const AttentionDims& dims,
                             double* waited = nullptr, const Tensor* document_starts = nullptr);
// The same with HV = HS and the default scale.
inline void ring_attention_forward(Backend& be, const ContextParallel& cp, Tensor& out,
                                   Tensor& lse, const Tensor& qkv, int64_t B, int64_t T,
                                   int64_t NH, int64_t KVH, int64_t HS, double* waited = nullptr,
                                   const Tensor* document_starts = nullptr) {
  ring_attention_forward(be, cp, out, lse, qkv, B, T, AttentionDims{NH, KVH, HS}, waited,
                         document_starts);
}
inline void ring_attention_backward(Backend& be, const ContextParallel& cp, Tensor& dqkv,
                                    const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int64_t B, int64_t T, int64_t NH,
                                    int64_t KVH, int64_t HS, double* waited = nullptr,
                                    const Tensor* document_starts = nullptr) {
  ring_attention_backward(be, cp, dqkv, dout, qkv, out, lse, B, T, AttentionDims{NH, KVH, HS},
                          waited, document_starts);
}

}  // namespace meshtrain
