// Multi-head latent attention's packed row (backend.h, mla_pack / mla_unpack): the front's
// checks and the default on any device, through copy_columns. Per token, with H heads,
// Dq = nope + rope:
//   qkv = [ q (H Dq) | K_0 .. K_{H-1} (Dq each) | V_0 .. V_{H-1} (value each) ]
//   K_h = [ kv_h[:nope] | k_rope ],  V_h = kv_h[nope:],  kv_h = kv[h (nope + value) ...]
// The rope key is shared by every head (DeepSeek-V2, arXiv 2405.04434, sec. 2.1.3), so its
// gradient is the sum of every head's: added in head order, in wide(A) (fp32 under bf16).

#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::OpContract;
using contract::str;

namespace {

// q (N, H Dq), kv (N, H (nope + value)), k_rope (N, rope), qkv (N, 2 H Dq + H value), one
// dtype, one device, rows alike.
void check_mla(const OpContract& c, const Tensor& qkv, const Tensor& q, const Tensor& kv,
               const Tensor& k_rope, const MlaHeads& m, const char* prefix) {
  if (m.heads < 1 || m.nope < 0 || m.rope < 1 || m.value < 1)
    c.fail("heads " + str(m.heads) + ", nope " + str(m.nope) + ", rope " + str(m.rope) +
           ", value " + str(m.value) + ": heads, rope and value must be positive, nope >= 0");
  const int64_t Dq = m.nope + m.rope;
  const auto is = [](const Tensor& t, int64_t cols) {
    return t.shape().rank() == 2 && t.dim(1) == cols;
  };
  const int64_t N = q.shape().rank() == 2 ? q.dim(0) : -1;
  const auto rows = [&](const Tensor& t) { return t.dim(0) == N; };
  const std::string p(prefix);
  if (!is(q, m.heads * Dq) || !is(kv, m.heads * (m.nope + m.value)) || !is(k_rope, m.rope) ||
      !is(qkv, 2 * m.heads * Dq + m.heads * m.value) || !rows(kv) || !rows(k_rope) || !rows(qkv))
    c.fail("shape mismatch: " +
           contract::shapes({{(p + "qkv").c_str(), &qkv}, {(p + "q").c_str(), &q},
                             {(p + "kv").c_str(), &kv}, {(p + "k_rope").c_str(), &k_rope}}) +
           " for heads " + str(m.heads) + ", nope " + str(m.nope) + ", rope " + str(m.rope) +
           ", value " + str(m.value) + " (expected (N, heads (nope + rope)), (N, heads (nope + "
           "value)), (N, rope) and qkv (N, 2 heads (nope + rope) + heads value))");
  const DType a = qkv.dtype();
  c.same_dtype(a, (p + "q").c_str(), q);
  c.same_dtype(a, (p + "kv").c_str(), kv);
  c.same_dtype(a, (p + "k_rope").c_str(), k_rope);
  c.on_device({&qkv, &q, &kv, &k_rope});
  c.computes_in(a);
}

}  // namespace

void Backend::mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                       const MlaHeads& m) {
  const OpContract c(*this, "mla_pack");
  check_mla(c, qkv, q, kv, k_rope, m, "");
  do_mla_pack(qkv, q, kv, k_rope, m);
}

void Backend::mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                         const MlaHeads& m) {
  const OpContract c(*this, "mla_unpack");
  check_mla(c, dqkv, dq, dkv, dk_rope, m, "d");
  do_mla_unpack(dq, dkv, dk_rope, dqkv, m);
}

void Backend::do_mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                          const MlaHeads& m) {
  const int64_t H = m.heads, Dq = m.nope + m.rope, Dkv = m.nope + m.value;
  copy_columns(qkv, 0, q, 0, H * Dq);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t k = H * Dq + h * Dq, v = 2 * H * Dq + h * m.value;
    copy_columns(qkv, k, kv, h * Dkv, m.nope);
    copy_columns(qkv, k + m.nope, k_rope, 0, m.rope);
    copy_columns(qkv, v, kv, h * Dkv + m.nope, m.value);
  }
}

void Backend::do_mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                            const MlaHeads& m) {
  const int64_t H = m.heads, Dq = m.nope + m.rope, Dkv = m.nope + m.value, N = dq.dim(0);
  copy_columns(dq, 0, dqkv, 0, H * Dq);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t k = H * Dq + h * Dq, v = 2 * H * Dq + h * m.value;
    copy_columns(dkv, h * Dkv, dqkv, k, m.nope);
    copy_columns(dkv, h * Dkv + m.nope, dqkv, v, m.value);
  }
  // The heads' rope-key gradients, summed in head order in wide(A), rounded once: straight into
  // dk_rope when A is wide, else into a wide copy cast back at the end.
  const DType a = dqkv.dtype(), wide = contract::wide(a);
  Tensor head = empty({N, m.rope}, a, MemoryCategory::Workspace);
  Tensor sum = a == wide ? dk_rope : empty({N, m.rope}, wide, MemoryCategory::Workspace);
  Tensor widened = a == wide ? head : empty({N, m.rope}, wide, MemoryCategory::Workspace);
  for (int64_t h = 0; h < H; ++h) {
    copy_columns(head, 0, dqkv, H * Dq + h * Dq + m.nope, m.rope);
    if (h == 0) {
      a == wide ? copy(sum, head) : cast(sum, head);
      continue;
    }
    if (a != wide) cast(widened, head);
    add_inplace(sum, widened);
  }
  if (a != wide) cast(dk_rope, sum);
}

}  // namespace meshtrain
