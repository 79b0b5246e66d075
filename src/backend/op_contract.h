#pragma once
// The words of the Backend front's refusals (backend_front.cpp), one place for every device:
//   "backend 'cpu': matmul_forward: inp (8, 16) weight (32, 8) out (8, 32)"       (shapes)
//   "backend 'cuda' does not support scale_inplace for dtype fp64"              (dtype)
//   "backend 'cpu' does not support matmul_backward for dtype bf16: dweight is bf16, expected
//    fp32 (parameter gradients are fp32)"                                     (dtype rule)
// The dtype rules are backend.h's: an operation's activation dtype A decides it; parameter
// gradients and row statistics are wide(A), fp32 under bf16.

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "meshtrain/backend/backend.h"

namespace meshtrain::contract {

inline DType wide(DType act) { return act == DType::BF16 ? DType::F32 : act; }

inline int64_t rows_of(const Tensor& t) {
  return t.shape().rank() == 0 ? 0 : t.numel() / t.dim(t.shape().rank() - 1);
}
inline int64_t cols_of(const Tensor& t) { return t.dim(t.shape().rank() - 1); }

inline std::string str(int64_t v) { return std::to_string(v); }
// A double as the shortest text that reads back as the same value ("0.125", "nan").
inline std::string real(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

// "inp (8, 16) weight (32, 16)": the named tensors' shapes, the null ones left out.
inline std::string shapes(std::initializer_list<std::pair<const char*, const Tensor*>> named) {
  std::string s;
  for (auto [name, t] : named) {
    if (t == nullptr) continue;
    if (!s.empty()) s += " ";
    s += std::string(name) + " " + t->shape().to_string();
  }
  return s;
}

// One operation's checks against one backend. Each check costs a comparison when it passes:
// the message is only built on the way out.
class OpContract {
 public:
  OpContract(const Backend& backend, const char* op) : backend_(backend), op_(op) {}

  // "backend '<name>': <op>: <what>"
  [[noreturn]] void fail(const std::string& what) const;
  // "backend '<name>' does not support <op> for dtype <t>"
  [[noreturn]] void unsupported(DType t) const;

  // The activation dtype `act` is one the backend computes in.
  void computes_in(DType act) const {
    if (!backend_.computes_in(act)) unsupported(act);
  }
  // `t` (named `tensor`) of an operation on activations `act` must be `want`, by `rule`.
  void expect_dtype(DType act, const char* tensor, const Tensor& t, DType want,
                    const char* rule) const {
    if (t.dtype() != want) wrong_dtype(act, tensor, t, want, rule);
  }
  void same_dtype(DType act, const char* tensor, const Tensor& t) const {
    expect_dtype(act, tensor, t, act, "same as the activations");
  }
  void wide_grad(DType act, const char* tensor, const Tensor& t) const {
    if (t.dtype() != wide(act)) wrong_dtype(act, tensor, t, wide(act), "parameter gradients are");
  }
  void wide_stat(DType act, const char* tensor, const Tensor& t) const {
    if (t.dtype() != wide(act)) wrong_dtype(act, tensor, t, wide(act), "statistics are");
  }
  void token_ids(DType act, const char* tensor, const Tensor& t) const {
    expect_dtype(act, tensor, t, DType::I32, "token ids are int32");
  }
  // `t` lives where the backend computes (its device's memory).
  void on_device(const char* tensor, const Tensor& t) const {
    if (t.device() != backend_.device())
      wrong_device(tensor, t,
                   backend_.device() == Device::Cpu ? "bring it to the host with its device's "
                                                      "copy_to_host"
                                                    : "move it with copy_from_host");
  }
  // Each of `tensors` does; the refusal shows the stray one's shape.
  void on_device(std::initializer_list<const Tensor*> tensors) const {
    for (const Tensor* t : tensors) on_device("a tensor", *t);
  }

 private:
  // A rule ending in "are" is completed with the wanted dtype ("statistics are fp32").
  [[noreturn]] void wrong_dtype(DType act, const char* tensor, const Tensor& t, DType want,
                                const char* rule) const;
  [[noreturn]] void wrong_device(const char* tensor, const Tensor& t, const char* hint) const;

  const Backend& backend_;
  const char* op_;
};

// Document masking's per-row starts (backend.h, attention_forward): null, or int32 with one
// entry per query row (`rows`), on the device. Their values are not read here (that would wait
// on a device); the CPU kernels check each against its row.
inline void check_document_starts(const OpContract& c, const Tensor* starts, int64_t rows) {
  if (starts == nullptr) return;
  if (starts->numel() != rows)
    c.fail("document_starts " + starts->shape().to_string() + " must hold one entry per query "
           "row (" + str(rows) + ")");
  if (starts->dtype() != DType::I32)
    c.fail("document_starts is " + std::string(dtype_name(starts->dtype())) +
           ", expected int32 (positions in the sequence)");
  c.on_device("document_starts", *starts);
}

}  // namespace meshtrain::contract
