// CpuBackend: multi-head latent attention's packed row (backend.h, mla_pack / mla_unpack) in
// one pass over the rows, each row's pieces copied while they are in cache (the default's
// copy_columns calls walk every row once per head and piece). The rope key's gradient sums the
// heads in head order in Acc<A>, rounded once: the default's bits.

#include <algorithm>

#include "cpu_checks.h"
#include "element.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {
namespace cpu {
namespace {

// Column offsets of a packed row: queries [0, H Dq), key h at key(h), value h at value(h).
struct MlaRow {
  int64_t H, nope, rope, value;
  int64_t Dq() const { return nope + rope; }
  int64_t Dkv() const { return nope + value; }
  int64_t width() const { return 2 * H * Dq() + H * value; }
  int64_t key(int64_t h) const { return H * Dq() + h * Dq(); }
  int64_t val(int64_t h) const { return 2 * H * Dq() + h * value; }
};

template <class A>
void mla_pack(A* qkv, const A* q, const A* kv, const A* k_rope, int64_t N, const MlaRow& m) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    A* out = qkv + n * m.width();
    const A* qr = q + n * m.H * m.Dq();
    const A* kvr = kv + n * m.H * m.Dkv();
    const A* pe = k_rope + n * m.rope;
    std::copy(qr, qr + m.H * m.Dq(), out);
    for (int64_t h = 0; h < m.H; ++h) {
      const A* src = kvr + h * m.Dkv();
      std::copy(src, src + m.nope, out + m.key(h));
      std::copy(pe, pe + m.rope, out + m.key(h) + m.nope);
      std::copy(src + m.nope, src + m.Dkv(), out + m.val(h));
    }
  }
}

template <class A>
void mla_unpack(A* dq, A* dkv, A* dk_rope, const A* dqkv, int64_t N, const MlaRow& m) {
  using E = Acc<A>;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const A* in = dqkv + n * m.width();
    A* dkvr = dkv + n * m.H * m.Dkv();
    std::copy(in, in + m.H * m.Dq(), dq + n * m.H * m.Dq());
    for (int64_t h = 0; h < m.H; ++h) {
      std::copy(in + m.key(h), in + m.key(h) + m.nope, dkvr + h * m.Dkv());
      std::copy(in + m.val(h), in + m.val(h) + m.value, dkvr + h * m.Dkv() + m.nope);
    }
    A* pe = dk_rope + n * m.rope;
    for (int64_t c = 0; c < m.rope; ++c) {
      E sum = widen(in[m.key(0) + m.nope + c]);
      for (int64_t h = 1; h < m.H; ++h) sum += widen(in[m.key(h) + m.nope + c]);
      pe[c] = narrow<A>(sum);
    }
  }
}

// Times `op` and runs f(A{}) for the activation dtype (cpu_checks.h's dispatch).
template <class F>
void timed_dispatch(KernelProfile* profile, bool planning, const char* op, DType dt, F&& f) {
  KernelProfile::Scope timed(profile, op);
  dispatch(planning, op, dt, f);
}

}  // namespace
}  // namespace cpu

void CpuBackend::do_mla_pack(Tensor& qkv, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                             const MlaHeads& m) {
  const cpu::MlaRow row{m.heads, m.nope, m.rope, m.value};
  cpu::timed_dispatch(profile_, planning_, "mla_pack", qkv.dtype(), [&](auto tag) {
    using E = decltype(tag);
    cpu::mla_pack<E>(cpu::ptr<E>(qkv), cpu::ptr<E>(q), cpu::ptr<E>(kv), cpu::ptr<E>(k_rope),
                     q.dim(0), row);
  });
}

void CpuBackend::do_mla_unpack(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& dqkv,
                               const MlaHeads& m) {
  const cpu::MlaRow row{m.heads, m.nope, m.rope, m.value};
  cpu::timed_dispatch(profile_, planning_, "mla_unpack", dqkv.dtype(), [&](auto tag) {
    using E = decltype(tag);
    cpu::mla_unpack<E>(cpu::ptr<E>(dq), cpu::ptr<E>(dkv), cpu::ptr<E>(dk_rope),
                       cpu::ptr<E>(dqkv), dq.dim(0), row);
  });
}

}  // namespace meshtrain
