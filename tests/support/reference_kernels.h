#pragma once
// Naive double-precision reference implementations of the backend's kernels: written for
// obviousness (direct loops over the defining formulas), never for speed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace meshtrain::reference {

using Vec = std::vector<double>;

inline void layernorm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& x, const Vec& w,
                              const Vec& b, int64_t N, int64_t C) {
  out.assign(N * C, 0);
  mean.assign(N, 0);
  rstd.assign(N, 0);
  for (int64_t i = 0; i < N; ++i) {
    double m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    double v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = (x[i * C + c] - m) * r * w[c] + b[c];
    mean[i] = m;
    rstd[i] = r;
  }
}

inline void layernorm_backward(Vec& dx, Vec& dw, Vec& db, const Vec& dy, const Vec& x,
                               const Vec& w, int64_t N, int64_t C) {
  Vec out, mean, rstd, b(C, 0.0);
  layernorm_forward(out, mean, rstd, x, w, b, N, C);
  dx.assign(N * C, 0);
  for (int64_t i = 0; i < N; ++i) {
    // dx_c = sum_k dy_k w_k dn_k/dx_c with n_k = (x_k - m) r
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < C; ++k) {
        const double nk = (x[i * C + k] - mean[i]) * rstd[i];
        const double nc = (x[i * C + c] - mean[i]) * rstd[i];
        const double dn = rstd[i] * ((k == c ? 1.0 : 0.0) - 1.0 / C - nk * nc / C);
        acc += dy[i * C + k] * w[k] * dn;
      }
      dx[i * C + c] = acc;
      dw[c] += dy[i * C + c] * (x[i * C + c] - mean[i]) * rstd[i];
      db[c] += dy[i * C + c];
    }
  }
}

inline void matmul_forward(Vec& out, const Vec& x, const Vec& w, const Vec* b, int64_t N,
                           int64_t C, int64_t OC) {
  out.assign(N * OC, 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = b ? (*b)[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) acc += x[i * C + c] * w[o * C + c];
      out[i * OC + o] = acc;
    }
}

inline void matmul_backward(Vec& dx, Vec& dw, Vec& db, const Vec& dy, const Vec& x, const Vec& w,
                            int64_t N, int64_t C, int64_t OC) {
  dx.assign(N * C, 0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      const double g = dy[i * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        dx[i * C + c] += g * w[o * C + c];
        dw[o * C + c] += g * x[i * C + c];
      }
      db[o] += g;
    }
}

inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// C (M, N) = op(A) (M, K) @ op(B) (K, N) + bias (N) [+ C], then GELU if asked; A, B, C dense
// row-major as stored (A is (K, M) when a_transposed). bias may be null.
inline void gemm(Vec& C, const Vec& A, const Vec& B, const Vec* bias, bool a_transposed,
                 bool b_transposed, int64_t M, int64_t N, int64_t K, bool accumulate, bool gelu_after) {
  if (!accumulate) C.assign(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = (accumulate ? C[i * N + j] : 0.0) + (bias ? (*bias)[j] : 0.0);
      for (int64_t k = 0; k < K; ++k)
        acc += (a_transposed ? A[k * M + i] : A[i * K + k]) * (b_transposed ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = gelu_after ? gelu(acc) : acc;
    }
}

// qkv (B, T, 3, NH, HS) -> out (B, T, NH, HS), probs (B, NH, T, T)
inline void attention_forward(Vec& out, Vec& probs, const Vec& qkv, int64_t B, int64_t T,
                              int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  out.assign(B * T * C, 0);
  probs.assign(B * NH * T * T, 0);
  auto at = [&](int64_t b, int64_t t, int64_t k, int64_t h, int64_t d) {
    return qkv[((b * T + t) * 3 + k) * C + h * HS + d];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double m = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < HS; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          s[j] = dot / std::sqrt(static_cast<double>(HS));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - m) / z;
          probs[((b * NH + h) * T + i) * T + j] = p;
          for (int64_t d = 0; d < HS; ++d) out[(b * T + i) * C + h * HS + d] += p * at(b, j, 2, h, d);
        }
      }
}

inline void attention_backward(Vec& dqkv, const Vec& dout, const Vec& qkv, int64_t B, int64_t T,
                               int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  Vec out, probs;
  attention_forward(out, probs, qkv, B, T, NH, HS);
  dqkv.assign(qkv.size(), 0);
  auto idx = [&](int64_t b, int64_t t, int64_t k, int64_t h, int64_t d) {
    return ((b * T + t) * 3 + k) * C + h * HS + d;
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> dp(i + 1, 0.0);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < HS; ++d)
            dp[j] += dout[(b * T + i) * C + h * HS + d] * qkv[idx(b, j, 2, h, d)];
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += probs[((b * NH + h) * T + i) * T + j] * dp[j];
        for (int64_t j = 0; j <= i; ++j) {
          const double p = probs[((b * NH + h) * T + i) * T + j];
          const double ds = p * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < HS; ++d) {
            dqkv[idx(b, i, 0, h, d)] += ds * qkv[idx(b, j, 1, h, d)];
            dqkv[idx(b, j, 1, h, d)] += ds * qkv[idx(b, i, 0, h, d)];
            dqkv[idx(b, j, 2, h, d)] += p * dout[(b * T + i) * C + h * HS + d];
          }
        }
      }
}

// Full-vocabulary cross-entropy: losses (N) and dlogits (N, V) scaled by dloss.
inline void crossentropy(Vec& losses, Vec& dlogits, const Vec& logits,
                         const std::vector<int32_t>& targets, double dloss, int64_t N, int64_t V) {
  losses.assign(N, 0);
  dlogits.assign(N * V, 0);
  for (int64_t i = 0; i < N; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, logits[i * V + j]);
    double z = 0;
    for (int64_t j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - m);
    losses[i] = std::log(z) + m - logits[i * V + targets[i]];
    for (int64_t j = 0; j < V; ++j)
      dlogits[i * V + j] = (std::exp(logits[i * V + j] - m) / z - (j == targets[i] ? 1.0 : 0.0)) * dloss;
  }
}

}  // namespace meshtrain::reference
