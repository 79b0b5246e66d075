// Interleaved rotary rows (families/hf/hf_name_map.h, HfRopeRows): DeepSeek-V3's q_b_proj and
// kv_a_proj_with_mqa keep each rotary part as interleaved pairs (rope_interleave); import puts them
// in halves, export back. The permutation on whole heads and on one tail, its inverse, and the
// claim it rests on: meshtrain's rotate-half on the permuted rows is transformers'
// apply_rotary_pos_emb_interleave (modeling_deepseek_v3.py), value for value, in HF's output order.

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "meshtrain/families/hf/hf_name_map.h"

namespace meshtrain {
namespace {

// A tensor of `rows` rows of `cols`, as HF names and shapes it (Same: meshtrain's shape too).
HfTensor tensor(const std::string& hf, int64_t rows, int64_t cols) {
  HfTensor t;
  t.meshtrain = "m";
  t.hf = hf;
  t.meshtrain_shape = t.hf_shape = {rows, cols};
  return t;
}

// Row r of an (rows, cols) tensor holds r * 100 + column.
std::vector<float> numbered(int64_t rows, int64_t cols) {
  std::vector<float> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v.push_back(static_cast<float>(r * 100 + c));
  return v;
}

std::vector<int64_t> row_order(const std::vector<float>& v, int64_t cols) {
  std::vector<int64_t> rows;
  for (size_t k = 0; k < v.size(); k += static_cast<size_t>(cols)) rows.push_back(static_cast<int64_t>(v[k]) / 100);
  return rows;
}

TEST(HfRopeRows, QueryHeadsPermuteTheirRotaryRowsOnly) {
  // Two query heads of [nope 2 | rope 6] rows (q_b_proj (2 * 8, 3)).
  std::vector<HfTensor> ts = {tensor("model.layers.0.self_attn.q_b_proj.weight", 16, 3),
                              tensor("model.layers.0.self_attn.o_proj.weight", 16, 3)};
  set_hf_rope_rows(ts, "self_attn.q_b_proj.weight", {8, 2, 6});
  EXPECT_EQ(ts[1].rope_rows.width, 0);  // another suffix
  std::vector<float> m;
  from_hf_layout(ts[0], numbered(16, 3), m);
  // meshtrain row 2 + j = HF row 2 + 2j; row 2 + 3 + j = HF row 2 + 2j + 1.
  EXPECT_EQ(row_order(m, 3), (std::vector<int64_t>{0, 1, 2, 4, 6, 3, 5, 7, 8, 9, 10, 12, 14, 11, 13, 15}));
  EXPECT_EQ(m[3 * 3 + 2], 402.0f);  // whole rows move
  EXPECT_EQ(to_hf_layout(ts[0], m), numbered(16, 3));  // export is the inverse
  std::vector<float> same;
  from_hf_layout(ts[1], numbered(16, 3), same);
  EXPECT_EQ(same, numbered(16, 3));
}

TEST(HfRopeRows, KvTailPermutesTheLastRowsOfOneBlock) {
  // kv_a_proj_with_mqa: latent 3 rows, then the shared rotary key's 4.
  std::vector<HfTensor> ts = {tensor("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 7, 2)};
  set_hf_rope_rows(ts, "kv_a_proj_with_mqa.weight", {7, 3, 4});
  std::vector<float> m;
  from_hf_layout(ts[0], numbered(7, 2), m);
  EXPECT_EQ(row_order(m, 2), (std::vector<int64_t>{0, 1, 2, 3, 5, 4, 6}));
  EXPECT_EQ(to_hf_layout(ts[0], m), numbered(7, 2));
}

TEST(HfRopeRows, RotateHalfOnPermutedRowsIsHfsInterleavedRotary) {
  // One rotary head of d = 8 channels from 5 inputs: HF's q = W x, rotated as
  // apply_rotary_pos_emb_interleave does (pairs (q[2i], q[2i+1]) by angle p * f_i, written
  // [evens' results | odds' results]); meshtrain's q = W' x (W' = W's rows permuted), rotated by
  // rotate-half (channel i with i + d/2 by angle p * f_i).
  const int64_t d = 8, in = 5;
  std::vector<HfTensor> ts = {tensor("w", d, in)};
  set_hf_rope_rows(ts, "w", {d, 0, d});
  std::vector<float> w(d * in), x(in);
  for (size_t k = 0; k < w.size(); ++k) w[k] = std::sin(1.7f * static_cast<float>(k) + 0.3f);
  for (size_t k = 0; k < x.size(); ++k) x[k] = std::cos(0.9f * static_cast<float>(k));
  std::vector<float> w_m;
  from_hf_layout(ts[0], w, w_m);
  auto matvec = [&](const std::vector<float>& m) {
    std::vector<double> q(d, 0.0);
    for (int64_t r = 0; r < d; ++r)
      for (int64_t c = 0; c < in; ++c) q[r] += double(m[r * in + c]) * double(x[c]);
    return q;
  };
  const std::vector<double> q_hf = matvec(w), q_m = matvec(w_m);
  const double p = 3.0;
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = p * std::pow(10000.0, -2.0 * double(i) / double(d));
    const double c = std::cos(angle), s = std::sin(angle);
    const double hf_first = q_hf[2 * i] * c - q_hf[2 * i + 1] * s, hf_second = q_hf[2 * i + 1] * c + q_hf[2 * i] * s;
    const double m_first = q_m[i] * c - q_m[i + d / 2] * s, m_second = q_m[i + d / 2] * c + q_m[i] * s;
    EXPECT_EQ(m_first, hf_first) << i;
    EXPECT_EQ(m_second, hf_second) << i;
  }
}

TEST(HfRopeRows, RefusesAGeometryTheTensorCannotHave) {
  std::vector<HfTensor> ts = {tensor("a.weight", 10, 2)};
  EXPECT_THROW(set_hf_rope_rows(ts, "a.weight", {4, 0, 4}), std::logic_error);  // 10 rows are no whole blocks
  EXPECT_THROW(set_hf_rope_rows(ts, "a.weight", {5, 0, 3}), std::logic_error);  // odd width
  EXPECT_THROW(set_hf_rope_rows(ts, "a.weight", {5, 2, 4}), std::logic_error);  // beyond the block
  ts[0].transpose = true;
  EXPECT_THROW(set_hf_rope_rows(ts, "a.weight", {5, 1, 4}), std::logic_error);
}

}  // namespace
}  // namespace meshtrain
