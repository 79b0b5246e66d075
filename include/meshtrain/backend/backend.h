#pragma once
// The kernel interface every device implements (cpu/ now, cuda/ for GPUs). The layers above
// call only these operations, so a new device replaces kernels, never model or parallel logic.
//
// Conventions, as in llm.c:
//  - arguments are outputs first, then inputs; sizes come from the tensors' shapes;
//  - forward kernels assign their outputs;
//  - backward kernels ASSIGN activation gradients (d<input>) and ACCUMULATE (+=) parameter
//    gradients (d<weight>, d<bias>), so gradient accumulation over micro-batches is free;
//  - "N" is a number of tokens (rows), "C" channels, "OC" output channels, "V" a vocabulary
//    (or this rank's slice of it);
//  - every floating-point op accepts F32 and F64 (F64 is the verification path); devices with
//    low-precision support add BF16. In BF16 mixed precision (the CUDA backend) parameters and
//    activations are BF16 while parameter gradients, LayerNorm mean/rstd, cross-entropy row
//    statistics and losses, and the optimizer's master weights and moments stay F32; each op
//    below says which of its tensors may differ in dtype. Anything else is refused by name:
//    "backend 'cuda' does not support <op> for dtype <x>".

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/grad_write.h"
#include "meshtrain/tensor/allocator.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

enum class Reduction { Sum, SumSquares };
// Elements [offset, offset + count) of a flat tensor.
struct FlatPiece {
  int64_t offset = 0, count = 0;
};

// Sizes of one attention call. HV (value head size) may differ from HS (query/key head size):
// multi-head latent attention has HS = 192, HV = 128. scale 0: 1/sqrt(HS).
struct AttentionDims {
  int64_t NH = 0, KVH = 0, HS = 0, HV = 0;
  double scale = 0.0;
  // Sliding window (Mistral; model/model_spec.h: attention_window): query t sees keys s with
  // t - window < s <= t, its own key and the window - 1 before it; 0: every earlier key.
  int64_t window = 0;
  int64_t value_size() const { return HV ? HV : HS; }
  double softmax_scale() const;  // scale, or 1/sqrt(HS) when 0
};

// Multi-head latent attention's per-head widths (mla_pack): `heads` heads, each query and key
// nope + rope wide, each value `value` wide.
struct MlaHeads {
  int64_t heads = 0, nope = 0, rope = 0, value = 0;
};

// The public operations are a non-virtual front, the same for every device (as Communicator's):
// it checks each call's contract once (shapes that agree, tensors on this device, the dtype
// rules above, an activation dtype the device computes in, slots and pieces inside their
// tensors), and only then calls the device's protected do_* hook. A refusal names the backend,
// the operation and the shapes, and never reaches the hook, so a device's kernels carry no
// argument checks of their own, and every device refuses a bad call with the same words.
class Backend {
 public:
  using AttentionDims = meshtrain::AttentionDims;  // also spelt Backend::AttentionDims
  using MlaHeads = meshtrain::MlaHeads;
  explicit Backend(std::unique_ptr<Allocator> allocator) : allocator_(std::move(allocator)) {}
  virtual ~Backend();

  virtual std::string name() const = 0;
  // One line for logs: the device, its libraries and threads.
  virtual std::string describe() const { return name(); }
  // An allocator for host memory that this device copies to and from fastest (pinned memory
  // for GPUs), for state offloaded to the host.
  virtual std::unique_ptr<Allocator> make_host_allocator() const;
  // True for the planner's dry-run backends (allocations only, no arithmetic).
  virtual bool planning() const { return false; }
  // Whether this device computes in `activation` (the dtype that decides an operation's
  // kernel, see above): F32 and F64 by default; devices with low-precision kernels add BF16,
  // devices without double-precision kernels drop F64.
  virtual bool computes_in(DType activation) const;
  Device device() const { return allocator_->device(); }
  Allocator& allocator() { return *allocator_; }
  MemoryTracker& memory() { return allocator_->tracker(); }

  Tensor empty(Shape shape, DType dtype, MemoryCategory category);
  Tensor zeros(Shape shape, DType dtype, MemoryCategory category);
  // A host tensor (Device::Cpu) from memory this device copies from fastest (pinned for GPUs),
  // from an allocator the backend owns: the source of copy_from_host_async. Its bytes are
  // counted by that allocator, not by memory().
  Tensor empty_host(Shape shape, DType dtype, MemoryCategory category);

  // ---- data movement and elementwise ----------------------------------------------------
  void fill(Tensor& t, double value);
  void copy(Tensor& dst, const Tensor& src);  // same device, same dtype
  // dst = src converted elementwise to dst's dtype (equal element counts): F32 <-> BF16 (master
  // weights to compute weights and back), F32 <-> F64 (verification); narrowing rounds to
  // nearest, ties to even. Equal dtypes copy.
  void cast(Tensor& dst, const Tensor& src);
  // Host round trips: copy_from_host returns when `src` may be reused, copy_to_host when `dst`
  // holds the data, sum and sum_squares with the value; on a GPU each waits for all queued work
  // (drains the device). A step should make a fixed few of them, whatever the number of
  // micro-batches and parameters: batch with copy_from_host_async and reduce_into.
  void copy_from_host(Tensor& dst, const void* src);  // src holds dst.dtype()
  void copy_to_host(void* dst, const Tensor& src);
  // dst = the bytes of `src`, a host tensor of the same size from empty_host(), without waiting:
  // returns once the copy is queued. `src` is handed over: the backend keeps it alive until the
  // copy has completed, and the caller must not write it after the call (cudaMemcpyAsync
  // semantics). The default copies at once.
  void copy_from_host_async(Tensor& dst, Tensor src);
  // Snapshots for asynchronous checkpoints. snapshot_to_host copies `src` into `dst` (a host
  // tensor of its size from empty_host()) without holding up the work queued after it: on a GPU
  // the copy engine reads `src` while the next step computes. order_after_snapshot makes the
  // work queued from then on (the optimizer update, which writes `src`) wait for those copies on
  // the device, without the host waiting; wait_for_snapshot blocks the calling thread, whichever
  // it is, until they have landed in `dst`. The defaults copy at once and need no waiting.
  void snapshot_to_host(Tensor& dst, const Tensor& src);
  virtual void order_after_snapshot() {}
  virtual void wait_for_snapshot() {}
  void add_inplace(Tensor& dst, const Tensor& src);                      // dst += src
  void scale_inplace(Tensor& t, double factor);                          // t *= factor
  void residual_forward(Tensor& out, const Tensor& a, const Tensor& b);  // a + b
  // Sum of squares accumulated in double, deterministically (same inputs, same threads: same bits).
  double sum_squares(const Tensor& t);
  double sum(const Tensor& t);
  // out[slot] = sum (or sum of squares) of t, accumulated exactly as sum() and sum_squares() do
  // (same bits); out is F64 on this device. Queued like any kernel, no host round trip: reduce
  // many tensors into one buffer, then read it with a single copy_to_host.
  void reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what);
  // reduce_into for many pieces of one flat tensor: out[first_slot + k] = the reduction of
  // t[pieces[k]], each with reduce_into's bits. A device batches the pieces into a few launches
  // (a model's gradient norm is hundreds of pieces a step); the default reduces one by one.
  void reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                          const std::vector<FlatPiece>& pieces, Reduction what);
  // Waits for queued device work (no-op on the CPU).
  virtual void synchronize() {}

  // ---- embeddings ------------------------------------------------------------------------
  // out (N, C) = table[tokens - vocab_begin] for tokens in this slice of the vocabulary, else 0;
  // table (V, C) holds this rank's rows of the token embedding.
  void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                         int64_t vocab_begin);
  void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                          int64_t vocab_begin);
  // Learned absolute positions: out (N, C) += table[(token_begin + i) % T] with table (T, C):
  // row i of `out` is the token at flat index token_begin + i of the (B, T) micro-batch.
  void position_forward(Tensor& out, const Tensor& table, int64_t token_begin);
  void position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin);

  // ---- layers ----------------------------------------------------------------------------
  // out (N, C), mean (N), rstd (N) from inp (N, C), weight (C), bias (C); eps = 1e-5.
  void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                         const Tensor& weight, const Tensor& bias);
  void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd);
  // layernorm_backward, then dinp += residual (the gradient that reaches the LayerNorm's input
  // by the residual path), with the bits of the two calls; a device fuses them into one pass.
  void layernorm_backward_add(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                              const Tensor& inp, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& residual);

  // out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be null.
  void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias);
  // matmul_forward, then out += residual (N, OC): a residual connection. A device adds the
  // residual in the GEMM's epilogue where it can (one rounding, not two).
  void matmul_forward_add(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                          const Tensor& residual);
  // dweight (OC, C) += dout^T @ inp (= under GradWrite::Assign: the GEMM's beta 0),
  // dbias (OC) += column sums of dout, dinp (N, C) = dout @ weight. Each output may be null: not
  // wanted. Zero-bubble schedules ask for dinp alone, then later for dweight and dbias alone,
  // when `weight` may be released (ZeRO-3) and is not read.
  void matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight,
                       GradWrite dweight_write = GradWrite::Add);

  // out (N, C) += bias (C) on every row; dbias (C) += column sums of dout (N, C). For biases
  // applied after a tensor-parallel reduction, where the GEMM cannot add them.
  void bias_forward(Tensor& out, const Tensor& bias);
  void bias_backward(Tensor& dbias, const Tensor& dout);

  // GELU, tanh approximation.
  void gelu_forward(Tensor& out, const Tensor& inp);
  void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);

  // The MLP's linear layers with GELU between them, as one call each, so that a backend can
  // apply GELU in the matrix product's epilogue instead of a pass of its own over (N, OC):
  //   matmul_gelu_forward:   pre (N, OC) = inp @ weight^T + bias; out = gelu(pre)
  //   matmul_gelu_backward:  dpre (N, C) = (dout (N, OC) @ weight (OC, C)) * gelu'(pre (N, C))
  // The defaults are matmul_forward then gelu_forward, and matmul_backward's input gradient
  // then gelu_backward (with a workspace for the product).
  void matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight,
                           const Tensor& bias);
  void matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                            const Tensor& pre);

  // Causal self-attention with grouped-query heads (GQA; KVH == NH is multi-head attention).
  // The sizes are AttentionDims: NH query heads, KVH key/value heads, query/key heads of HS,
  // value heads of HV = dims.value_size() (HS unless given: multi-head latent attention has
  // HS 192, HV 128), softmax scale dims.softmax_scale() (1/sqrt(HS) unless given).
  // Each token's row of qkv holds NH query heads of HS, KVH key heads of HS, KVH value heads of
  // HV: queries [0, NH HS), keys [NH HS, (NH + KVH) HS), values after them (Megatron-Core's and
  // Hugging Face's order once the projections are concatenated; KVH == NH and HV == HS is the
  // (B, T, 3, NH, HS) layout of GPT-2). Query head h reads key/value head h / (NH / KVH);
  // repeated keys and values are never materialised. out (B, T, NH, HV). The front requires
  // KVH >= 1, NH % KVH == 0 and a scale >= 0 (0: the default). The forms taking (NH, KVH, HS)
  // are the dims {NH, KVH, HS}.
  // `stash` is backend-private: what backward needs besides out, of the shape and dtype
  // attention_stash says, which the caller allocates and keeps from forward to backward. The
  // CPU backend (a blocked flash-style kernel, no T x T matrix) keeps the row log-sum-exp
  // (B, NH, T) in stats_dtype; the default, which the CUDA backend keeps, is (B, NH, T, T) in
  // the activation dtype: its own kernels store the softmax there (zeros above the diagonal),
  // its fused cuDNN path only its statistics and a copy of out. Backward takes forward's out
  // (the attention rows' D = rowsum(dout * out)); it assigns every column of dqkv; a key/value
  // head's gradient sums its group's query heads in order (deterministic).
  // Document masking (data.document_mask): `document_starts`, when given, is int32 (B * T) on
  // the device, each token's document start: the position in its sequence of the first token of
  // the document it belongs to (<= its own). Query i then sees keys [document_starts[i], i]
  // (block-causal attention), not [0, i]. Null: causal.
  // A per-row start, not a (T, T) bias: it is all a block-causal mask needs, B * T integers.
  struct AttentionStash {
    Shape shape;
    DType dtype;
  };
  // The stash depends on the query heads only (not on HS, HV or the scale).
  virtual AttentionStash attention_stash(int64_t B, int64_t T, int64_t NH,
                                         DType activations) const;
  AttentionStash attention_stash(int64_t B, int64_t T, const AttentionDims& dims,
                                 DType activations) const {
    return attention_stash(B, T, dims.NH, activations);
  }
  void attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B, int64_t T,
                         const AttentionDims& dims, const Tensor* document_starts = nullptr);
  void attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B, int64_t T,
                         int64_t NH, int64_t KVH, int64_t HS,
                         const Tensor* document_starts = nullptr) {
    attention_forward(out, stash, qkv, B, T, AttentionDims{NH, KVH, HS}, document_starts);
  }
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& stash, int64_t B, int64_t T, const AttentionDims& dims,
                          const Tensor* document_starts = nullptr);
  void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& stash, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                          int64_t HS, const Tensor* document_starts = nullptr) {
    attention_backward(dqkv, dout, qkv, out, stash, B, T, AttentionDims{NH, KVH, HS},
                       document_starts);
  }
  // One query row against a key/value cache (text generation, model/generator.h): for each of
  // the NH query heads, with g = h / (NH / KVH) its key/value head,
  //   out[h] (HV) = softmax(scale q[h] . k_cache[g, :length]^T) v_cache[g, :length]
  // with q (NH, HS), k_cache (KVH, T_max, HS), v_cache (KVH, T_max, HV), out (NH, HV);
  // length <= T_max; KVH, HS and HV are read off the caches and KVH must divide NH. scale 0:
  // 1/sqrt(HS).
  // The default copies the `length` cached rows to the host and computes there in double (any
  // device, F32/F64/BF16); a device may override it with a kernel. Not on the training path.
  void attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        int64_t length, double scale = 0.0);

  // ---- RMSNorm, SwiGLU, rotary positions ------------------------------------------------
  // The semantics of Hugging Face's LlamaForCausalLM / Qwen3ForCausalLM, each computed in wide(A)
  // (fp32 under bf16, fp64 for F64) and rounded once on store.
  //
  // RMSNorm (Zhang & Sennrich, arXiv 1910.07467) over rows of any width C (the model's d_model,
  // or head_dim for Qwen 3's per-head q/k norm, the caller viewing (N * heads, head_dim)):
  //   rstd (N) = 1 / sqrt(sum_c inp_c^2 / C + eps),  out (N, C) = (inp * rstd) * weight (C).
  // rstd is a statistic: wide(A). eps comes from the model's configuration (Llama 3: 1e-5,
  // Qwen 3: 1e-6). Hugging Face rounds inp * rstd to the storage dtype before the weight: under
  // bf16 that is one rounding more than here; fp32 and fp64 agree.
  void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       double eps);
  // dinp assigned, dweight (C, wide(A)) accumulated.
  void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& rstd);
  // rmsnorm_backward, then dinp += residual, with the bits of the two calls (as
  // layernorm_backward_add); a device fuses them into one pass.
  void rmsnorm_backward_add(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight, const Tensor& rstd, const Tensor& residual);

  // SwiGLU (Shazeer, arXiv 2002.05202): out (N, F) = silu(gate) * up, silu(g) = g / (1 + e^-g).
  // gate and up are separate tensors of one shape (two column-parallel linears: tensor
  // parallelism splits each by columns, with no interleaving). Backward assigns
  //   dgate = dout * up * silu'(gate),  dup = dout * silu(gate).
  void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up);
  void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                       const Tensor& up);
  // The same on the rows of one product of gate and up side by side (model/stacked_columns.h):
  // gate_up (N, 2F) holds gate's F columns then up's in each row, and backward assigns
  // dgate_up (N, 2F) in that layout, so the input gradient is one product over both. The same
  // bits as the calls on the two halves; the default copies the halves out and back, a device
  // reads and writes them in place.
  void swiglu_forward_packed(Tensor& out, const Tensor& gate_up);
  void swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up);

  // Rotary position embedding (Su et al., arXiv 2104.09864) in the rotate-half layout of Hugging
  // Face's apply_rotary_pos_emb: in each head of D = head_dim channels, channel i < D/2 pairs
  // with i + D/2, and for the angle a_i(p) = p * inv_freq_i of token position p
  //   x'_i = x_i cos a - x_{i+D/2} sin a,   x'_{i+D/2} = x_{i+D/2} cos a + x_i sin a.
  // `x` holds N = positions.numel() rows of W = x.numel() / N elements each; the rotated heads
  // are `heads` heads of head_dim channels from column `column` of each row, so queries and keys
  // are rotated where they lie inside a packed qkv row, without a copy. positions (N, int32)
  // holds each row's true token position (context parallelism gives a rank two chunks that are
  // not contiguous); cos and sin (P, D/2), wide(A), are the table of rotary_table.h, and every
  // position must lie in [0, P): the CPU backend refuses one outside, the CUDA backend (which
  // cannot read positions without waiting) writes NaN into that row's heads, which the trainer's
  // divergence check then stops on. `stride` (0: head_dim) is the distance in columns between
  // the first channels of consecutive rotated heads: multi-head latent attention rotates the
  // rope-wide tail of each of its nope + rope query heads in place, {nope, heads, rope, nope +
  // rope}; the rotated heads must not overlap (stride >= head_dim).
  struct RotaryHeads {
    int64_t column = 0, heads = 0, head_dim = 0, stride = 0;
    int64_t head_stride() const { return stride ? stride : head_dim; }
  };
  // In place: x rotated by each row's angles.
  void rotary_forward(Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                      const RotaryHeads& where);
  // In place: dx rotated by minus the angles (the transpose of the forward rotation), turning the
  // gradient of the rotated heads into the gradient of the heads before rotation.
  void rotary_backward(Tensor& dx, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                       const RotaryHeads& where);

  // ---- ring attention blocks (context parallelism, model/ring_attention.h) ----------------
  // One block of a sequence's attention: the queries in rows [q_begin, q_begin + rows) of each
  // of the B sequences of qkv (B * Tq, NH HS + KVH HS + KVH HV, laid out as attention_forward's;
  // the Q part, columns [0, NH HS)), against the keys and values in rows [k_begin, k_begin +
  // keys) of each sequence of kv (B * Tk, KC + VC: K in columns [0, KC), V in [KC, KC + VC)),
  // KC = KVH * HS, VC = KVH * HV (ring attention passes kv_heads-sized blocks: the K and V
  // columns of qkv); out-like tensors are (B * Tq, C), C = NH * HV; query head h reads key/value
  // head h / (NH / KVH). causal: query row i of the block sees key rows 0..i of the block only
  // (rows == keys then), else every key of the block. With document masking the block's ops
  // take document_starts, int32 (B * Tq): each query row's document start as a position in the
  // whole sequence (attention_forward's, at the rows' true positions under context
  // parallelism); key_position is the position in the sequence of key row k_begin (a block's
  // keys are consecutive there), and a query row also skips the keys before its document start.
  // A row may then see no key of a block: the block leaves its out and lse as they were.
  struct AttentionBlock {
    int64_t q_begin = 0, rows = 0, k_begin = 0, keys = 0;
    bool causal = false;
    int64_t key_position = 0;  // read only with document_starts
  };
  // Merges the block into the running result of those query rows: out (B * Tq, C) holds each
  // row's attention over the keys merged so far, lse (B, NH, Tq) in stats_dtype the log of its
  // softmax denominator (scores scaled by dims.softmax_scale()), -inf before the first block;
  // merging is exact up to rounding, whatever the order of the blocks.
  // The default refuses by name: only backends with these kernels run context parallelism.
  void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                               int64_t B, const AttentionDims& dims, const AttentionBlock& block,
                               const Tensor* document_starts = nullptr);
  void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv,
                               int64_t B, int64_t NH, int64_t KVH, int64_t HS,
                               const AttentionBlock& block, const Tensor* document_starts = nullptr) {
    attention_block_forward(out, lse, qkv, kv, B, AttentionDims{NH, KVH, HS}, block,
                            document_starts);
  }
  // Adds the block's gradients, given the final out, lse and dout (B * Tq, C): dQ into the Q
  // columns of dqkv (qkv's shape), dK and dV into dkv (kv's shape), a key/value head's summed
  // over its group's query heads in order. Accumulates (+=): each query row and each key row
  // collects the gradients of every block it takes part in.
  void attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor& out,
                                const Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t B,
                                const AttentionDims& dims, const AttentionBlock& block,
                                const Tensor* document_starts = nullptr);
  void attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor& out,
                                const Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t B,
                                int64_t NH, int64_t KVH, int64_t HS, const AttentionBlock& block,
                                const Tensor* document_starts = nullptr) {
    attention_block_backward(dqkv, dkv, dout, out, lse, qkv, kv, B, AttentionDims{NH, KVH, HS},
                             block, document_starts);
  }
  // dst[:, dst_col + j] = src[:, src_col + j] for j < cols, both 2-D with the same rows and
  // dtype (packing K and V out of qkv, and their gradients back). The default copies row views.
  void copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols);

  // ---- multi-head latent attention's packed row (DeepSeek-V2/V3) -------------------------
  // With H = m.heads, Dq = m.nope + m.rope: from q (N, H Dq) (per head [nope | rope]), kv
  // (N, H (nope + value)) (per head [k_nope | v]) and the one rope key all heads share, k_rope
  // (N, rope), writes qkv (N, H Dq + H Dq + H value), attention_forward's row with NH = KVH = H,
  // HS = Dq, HV = value: Q copied, K_h = [kv_h[:nope] | k_rope], V_h = kv_h[nope:]. Every column
  // of qkv is assigned; all tensors of one dtype.
  void mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                const MlaHeads& m);
  // Its transpose: from dqkv assigns dq, dkv (each head's dK nope part and dV) and
  // dk_rope = the sum over heads of dK_h[nope:], added in head order (deterministic), in
  // wide(A) and rounded once. The default runs copy_columns and add_inplace on any device
  // (rounding after each head under bf16); the CPU's one-pass kernel sums in wide(A).
  void mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                  const MlaHeads& m);

  // ---- mixture of experts: token rows to their experts and back (model/moe_layer.h) -------
  // Weighted row gather: for each row r of out (R, C), with K = index.dim(1),
  //   out[r, :] = sum over j < K, in order of j, of weights[r, j] * src[index[r, j], :]
  // index (R, K) int32 on the device, each entry a row of src (M, C) or -1 (the term is
  // skipped: a token an expert dropped); weights (R, K) in wide(A) (fp32 under bf16, fp64 for
  // F64), null: every weight 1. Accumulated in wide(A) from the first kept term (so K = 1
  // without weights copies rows exactly, -0 included), rounded once on store; a row whose terms
  // are all skipped is +0. The terms are added in index order and each output row is computed
  // whole by one thread (no scatter, no atomics), so the sum has the same bits on every layout
  // and thread count. One op moves tokens both ways: dispatch (K = 1: expert-sorted rows from
  // tokens), combine (K = top-k: a token's expert outputs weighted by its gates) and the
  // gradients of both (dispatch's: K = top-k, no weights; combine's: K = 1, each row's gate).
  // R = 0 is a no-op; M = 0 needs every index -1. The CPU backend refuses an index outside
  // [-1, M), naming its row and value; the CUDA backend, which cannot read the index without
  // waiting, leaves such a term out.
  void gather_rows(Tensor& out, const Tensor& src, const Tensor& index, const Tensor* weights);
  // The gate gradient of the combine: out (R, K) in wide(A),
  //   out[r, j] = dot(a[r, :], b[index[r, j], :])  (0 where index[r, j] is -1)
  // with a (R, C) and b (M, C) of one dtype, accumulated in wide(A) over c in one fixed order
  // (a device's own: vector lanes on the CPU, a warp's tree on CUDA), the same bits whatever
  // the thread count. Index entries as gather_rows'.
  void gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& index);

  // The experts' linear layers, one call for all of a rank's experts (a grouped GEMM). inp (R, K)
  // holds G groups of consecutive rows, group g's rows[g] of them (counts on the host, where
  // routing is decided; they sum to R, and a group may have none); weights (G, N, K) holds one
  // (N, K) matrix per group, laid out as matmul_forward's weight:
  //   grouped_matmul_forward:  out[group g's rows] (rows[g], N) = inp[group g's rows] @ weights[g]^T
  //   grouped_matmul_backward: dinp[group g's rows] = dout[group g's rows] @ weights[g] (assigned)
  //                            dweights[g] += dout[group g's rows]^T @ inp[group g's rows]
  // Dtypes as matmul_forward's and matmul_backward's, dweights (G, N, K) in wide(A). dinp or
  // dweights may be null (not wanted); a dweights-only call does not read weights (released
  // under ZeRO-3 by then, as matmul_backward's). An empty group writes no rows and leaves its
  // dweights[g] as it was. The default runs matmul_forward's and matmul_backward's kernels on
  // each group's rows in turn, with their bits (the CPU backend's per-expert oneDNN GEMMs); a
  // device may run one grouped GEMM instead, rounding as its matmul does.
  void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                              const std::vector<int64_t>& rows);
  void grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                               const Tensor& inp, const Tensor& weights,
                               const std::vector<int64_t>& rows);

  // ---- vocabulary-parallel softmax cross-entropy -----------------------------------------
  // For logits (N, V) over this rank's vocabulary slice [vocab_begin, vocab_begin + V):
  // row_max (N) and row_sumexp (N) = sum_j exp(logit_j - row_max); both fp32/fp64 as logits.
  void crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits);
  // Re-bases local sums onto the global max: sumexp *= exp(local_max - global_max).
  void crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max, const Tensor& global_max);
  // target_logit (N) = logits[i, targets[i] - vocab_begin] if in this slice, else 0.
  void crossentropy_target_logit(Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                                 int64_t vocab_begin);
  // losses (N) = log(sumexp) + max - target_logit.
  void crossentropy_losses(Tensor& losses, const Tensor& row_max, const Tensor& row_sumexp,
                           const Tensor& target_logit);
  // dlogits (N, V) = (softmax - onehot(target)) * dloss; may alias logits (in place).
  void crossentropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& row_max,
                             const Tensor& row_sumexp, const Tensor& targets, int64_t vocab_begin,
                             double dloss);
  // All of it where this rank holds the whole vocabulary (no tensor parallelism): losses (N)
  // and dlogits with the bits of stats, target_logit, losses and backward (vocab_begin 0,
  // statistics in losses' dtype); dlogits may alias logits. The default makes those calls; a
  // device reads the logits once.
  void crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses, const Tensor& logits,
                                      const Tensor& targets, double dloss);

  // ---- optimizer -------------------------------------------------------------------------
  struct AdamWStep {
    double lr, beta1, beta2, eps, weight_decay;
    int64_t step;             // 1-based, for bias correction
    double grad_scale = 1.0;  // applied to grad first (gradient clipping)
  };
  // Decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101); all four tensors alike.
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                    const AdamWStep& s);
  // adamw_update on each piece of four flat tensors laid out alike, piece k with weight decay
  // decays[k] in place of s.weight_decay; elements outside every piece are left as they are.
  // Same bits as one adamw_update per piece; a device batches them. With `rounded` (a bf16
  // model's parameters, param its fp32 masters), the updated masters are also written there
  // rounded to bf16: the bits of cast(*rounded, param) after the update, which the CUDA backend
  // runs and the CPU does in the same pass. Elements outside every piece of `rounded` are left
  // as they are.
  void adamw_update_pieces(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                           const std::vector<FlatPiece>& pieces, const std::vector<double>& decays,
                           const AdamWStep& s, Tensor* rounded = nullptr);

 protected:
  // The operations themselves, called by the public front once it has checked the call's
  // contract (backend_front.cpp): a hook sees only tensors of agreeing shapes, on this device,
  // in dtypes related as the operation says, with an activation dtype this backend computes
  // in. It still refuses what only it cannot do (a cast between two dtypes it has no kernel
  // for, a misaligned view its library rejects). The hooks with a body are the defaults the
  // public operations describe.
  virtual void do_fill(Tensor& t, double value) = 0;
  virtual void do_copy(Tensor& dst, const Tensor& src) = 0;
  virtual void do_cast(Tensor& dst, const Tensor& src) = 0;
  virtual void do_copy_from_host(Tensor& dst, const void* src) = 0;
  virtual void do_copy_to_host(void* dst, const Tensor& src) = 0;
  virtual void do_copy_from_host_async(Tensor& dst, Tensor src);
  virtual void do_snapshot_to_host(Tensor& dst, const Tensor& src);
  virtual void do_add_inplace(Tensor& dst, const Tensor& src) = 0;
  virtual void do_scale_inplace(Tensor& t, double factor) = 0;
  virtual void do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual double do_sum_squares(const Tensor& t) = 0;
  virtual double do_sum(const Tensor& t) = 0;
  virtual void do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) = 0;
  virtual void do_reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                                     const std::vector<FlatPiece>& pieces, Reduction what);
  virtual void do_embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                                    int64_t vocab_begin) = 0;
  virtual void do_embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                                     int64_t vocab_begin) = 0;
  virtual void do_position_forward(Tensor& out, const Tensor& table, int64_t token_begin) = 0;
  virtual void do_position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin) = 0;
  virtual void do_layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                    const Tensor& weight, const Tensor& bias) = 0;
  // The norms' backward and its _add form: `residual` null, or added to each row of dinp as the
  // kernel writes it (one pass, the bits of the backward then add_inplace).
  virtual void do_layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor* residual) = 0;
  virtual void do_rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp,
                                  const Tensor& weight, double eps) = 0;
  virtual void do_rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                   const Tensor* residual) = 0;
  virtual void do_swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  virtual void do_swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout,
                                  const Tensor& gate, const Tensor& up) = 0;
  virtual void do_swiglu_forward_packed(Tensor& out, const Tensor& gate_up);
  virtual void do_swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout,
                                         const Tensor& gate_up);
  // rotary_forward and rotary_backward: one rotation, by the angle or by minus it.
  enum class Rotation { ByAngle, ByMinusAngle };
  virtual void do_rotary(Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                         const RotaryHeads& where, Rotation rotation) = 0;
  // matmul_forward and matmul_forward_add: `residual` null, or added to out (N, OC).
  virtual void do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor* bias, const Tensor* residual) = 0;
  virtual void do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight,
                                  GradWrite dweight_write) = 0;
  virtual void do_bias_forward(Tensor& out, const Tensor& bias) = 0;
  virtual void do_bias_backward(Tensor& dbias, const Tensor& dout) = 0;
  virtual void do_gelu_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) = 0;
  virtual void do_matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp,
                                      const Tensor& weight, const Tensor& bias);
  virtual void do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                       const Tensor& pre);
  virtual void do_attention_forward(Tensor& out, Tensor& stash, const Tensor& qkv, int64_t B,
                                    int64_t T, const AttentionDims& dims,
                                    const Tensor* document_starts) = 0;
  virtual void do_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& out, const Tensor& stash, int64_t B, int64_t T,
                                     const AttentionDims& dims,
                                     const Tensor* document_starts) = 0;
  // scale: the front passes the resolved softmax scale (never 0).
  virtual void do_attention_decode(Tensor& out, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, int64_t length, double scale);
  virtual void do_attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                                          const Tensor& kv, int64_t B, const AttentionDims& dims,
                                          const AttentionBlock& block,
                                          const Tensor* document_starts);
  virtual void do_attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout,
                                           const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                           const Tensor& kv, int64_t B, const AttentionDims& dims,
                                           const AttentionBlock& block,
                                           const Tensor* document_starts);
  virtual void do_copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                               int64_t cols);
  virtual void do_mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                           const MlaHeads& m);
  virtual void do_mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                             const MlaHeads& m);
  virtual void do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                              const Tensor* weights) = 0;
  virtual void do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                                    const Tensor& index) = 0;
  virtual void do_grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                         const std::vector<int64_t>& rows);
  virtual void do_grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                                          const Tensor& inp, const Tensor& weights,
                                          const std::vector<int64_t>& rows);
  virtual void do_crossentropy_stats(Tensor& row_max, Tensor& row_sumexp, const Tensor& logits) = 0;
  virtual void do_crossentropy_rebase(Tensor& row_sumexp, const Tensor& local_max,
                                      const Tensor& global_max) = 0;
  virtual void do_crossentropy_target_logit(Tensor& target_logit, const Tensor& logits,
                                            const Tensor& targets, int64_t vocab_begin) = 0;
  virtual void do_crossentropy_losses(Tensor& losses, const Tensor& row_max,
                                      const Tensor& row_sumexp, const Tensor& target_logit) = 0;
  virtual void do_crossentropy_backward(Tensor& dlogits, const Tensor& logits,
                                        const Tensor& row_max, const Tensor& row_sumexp,
                                        const Tensor& targets, int64_t vocab_begin,
                                        double dloss) = 0;
  virtual void do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses,
                                                 const Tensor& logits, const Tensor& targets,
                                                 double dloss);
  // adamw_update and adamw_update_pieces: adamw_update is the one piece of the whole tensor
  // with s.weight_decay; `rounded` null, or the bf16 copy to write.
  virtual void do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                               Tensor& exp_avg_sq, const std::vector<FlatPiece>& pieces,
                               const std::vector<double>& decays, const AdamWStep& s,
                               Tensor* rounded) = 0;

 private:
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Allocator> host_allocator_;  // empty_host(), created on first use
};

}  // namespace meshtrain
