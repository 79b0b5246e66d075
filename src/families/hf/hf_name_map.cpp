#include "meshtrain/families/hf/hf_name_map.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "meshtrain/model/parameter_table.h"

namespace meshtrain {

namespace {

bool per_block(const HfNameRule& r) { return std::string(r.meshtrain).find("{}") != std::string::npos; }

// The HF tensor of `rule` for block `index` (and, for PerExpert, expert `expert`).
HfTensor apply(const HfNameRule& rule, const ParamEntry& e, const std::string& index, int64_t expert) {
  HfTensor t;
  t.meshtrain = e.name;
  for (int k = 0; k < e.shape.rank(); ++k) t.meshtrain_shape.push_back(e.shape[k]);
  t.hf = hf_fill_name(rule.hf, index);
  const int64_t n = e.numel(), last = t.meshtrain_shape.back();
  switch (rule.how) {
    case HfTransform::Same: t.hf_shape = t.meshtrain_shape; break;
    case HfTransform::TransposedLinear:
      t.hf_shape = {last, n / last};
      t.transpose = true;
      break;
    case HfTransform::Flattened: t.hf_shape = {n}; break;
    case HfTransform::ThirdQ:
    case HfTransform::ThirdK:
    case HfTransform::ThirdV:
      t.hf_shape.assign(t.meshtrain_shape.begin() + 1, t.meshtrain_shape.end());
      t.parts = 3;
      t.part = rule.how == HfTransform::ThirdQ ? 0 : rule.how == HfTransform::ThirdK ? 1 : 2;
      break;
    case HfTransform::PerExpert:
      t.hf = hf_fill_name(t.hf.c_str(), std::to_string(expert), "{e}");
      t.hf_shape.assign(t.meshtrain_shape.begin() + 1, t.meshtrain_shape.end());
      t.parts = t.meshtrain_shape[0];
      t.part = expert;
      break;
  }
  return t;
}

// `values` (HF's tensor `t`, hf_shape[0] rows) from HF's row order to meshtrain's (to_meshtrain)
// or back, in place (HfRopeRows).
void permute_rope_rows(const HfTensor& t, std::vector<float>& values, bool to_meshtrain) {
  const HfRopeRows& r = t.rope_rows;
  if (r.width == 0) return;
  const int64_t rows = t.hf_shape[0], row_size = static_cast<int64_t>(values.size()) / rows, half = r.width / 2;
  std::vector<float> moved(static_cast<size_t>(r.width * row_size));
  for (int64_t group = 0; group < rows; group += r.block) {
    float* rope = values.data() + (group + r.offset) * row_size;
    for (int64_t j = 0; j < r.width; ++j) {
      const int64_t hf_row = j < half ? 2 * j : 2 * (j - half) + 1;  // meshtrain row j's
      const int64_t from = to_meshtrain ? hf_row : j, to = to_meshtrain ? j : hf_row;
      std::copy(rope + from * row_size, rope + (from + 1) * row_size, moved.begin() + to * row_size);
    }
    std::copy(moved.begin(), moved.end(), rope);
  }
}

}  // namespace

std::string hf_fill_name(const char* pattern, const std::string& index, const char* placeholder) {
  std::string s = pattern;
  const size_t at = s.find(placeholder);
  if (at != std::string::npos) s.replace(at, std::string(placeholder).size(), index);
  return s;
}

void set_hf_rope_rows(std::vector<HfTensor>& tensors, const std::string& hf_suffix, HfRopeRows rows) {
  for (HfTensor& t : tensors) {
    if (t.hf.size() < hf_suffix.size() || t.hf.compare(t.hf.size() - hf_suffix.size(), hf_suffix.size(), hf_suffix))
      continue;
    if (rows.width < 2 || rows.width % 2 || rows.block < 1 || rows.offset < 0 || rows.offset + rows.width > rows.block ||
        t.transpose || t.hf_shape.empty() || t.hf_shape[0] % rows.block)
      throw std::logic_error("Hugging Face tensor " + t.hf + " cannot interleave rotary rows " +
                             std::to_string(rows.offset) + " + " + std::to_string(rows.width) + " of every " +
                             std::to_string(rows.block) + " (the family's rope rows do not fit its shape)");
    t.rope_rows = rows;
  }
}

std::vector<HfTensor> hf_tensors(const ModelSpec& m, const HfNameRule* rules, size_t count,
                                 const std::string& model_class) {
  std::map<std::string, ParamEntry> table;
  for (ParamEntry& e : parameter_table(m)) table.emplace(e.name, std::move(e));
  std::set<std::string> mapped;
  std::vector<HfTensor> out;
  // Adds the tensor of `rule` for block `index` if the model has that parameter.
  auto add = [&](const HfNameRule& rule, const std::string& index) {
    const auto it = table.find(hf_fill_name(rule.meshtrain, index));
    if (it == table.end()) return false;
    const int64_t experts = rule.how == HfTransform::PerExpert ? it->second.shape[0] : 1;
    for (int64_t e = 0; e < experts; ++e) out.push_back(apply(rule, it->second, index, e));
    mapped.insert(it->first);
    return true;
  };
  for (size_t i = 0; i < count;) {
    if (!per_block(rules[i])) {
      add(rules[i++], "");
      continue;
    }
    size_t end = i;
    while (end < count && per_block(rules[end])) ++end;
    for (int block = 0;; ++block) {
      bool any = false;
      for (size_t r = i; r < end; ++r) any = add(rules[r], std::to_string(block)) || any;
      if (!any) break;
    }
    i = end;
  }
  // A parameter the table has no rule for would silently be left out of every export.
  for (const auto& [name, entry] : table)
    if (!mapped.count(name))
      throw std::logic_error("Hugging Face " + model_class + " has no tensor for meshtrain's parameter " +
                             name + " (the name table in families/*/hf_*.cpp lacks a rule)");
  return out;
}

void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols) {
  // Blocked, so that neither side is walked with a stride of a whole row per element.
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(rows, r0 + kB); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kB); ++c) out[c * rows + r] = in[r * cols + c];
}

std::vector<float> to_hf_layout(const HfTensor& t, const std::vector<float>& values) {
  if (t.transpose) {
    const int64_t cols = t.meshtrain_shape.back(), rows = static_cast<int64_t>(values.size()) / cols;
    std::vector<float> out(values.size());
    transpose_2d(values.data(), out.data(), rows, cols);
    return out;
  }
  const size_t slice = values.size() / static_cast<size_t>(t.parts);
  std::vector<float> out(values.begin() + static_cast<std::ptrdiff_t>(slice * t.part),
                         values.begin() + static_cast<std::ptrdiff_t>(slice * (t.part + 1)));
  permute_rope_rows(t, out, false);
  return out;
}

void from_hf_layout(const HfTensor& t, const std::vector<float>& hf, std::vector<float>& values) {
  if (t.transpose) {  // HF (in, out) -> meshtrain (out, in)
    values.resize(hf.size());
    transpose_2d(hf.data(), values.data(), t.hf_shape[0], t.hf_shape[1]);
    return;
  }
  values.resize(hf.size() * static_cast<size_t>(t.parts));
  const auto at = values.begin() + static_cast<std::ptrdiff_t>(hf.size() * t.part);
  if (t.rope_rows.width == 0) {
    std::copy(hf.begin(), hf.end(), at);
    return;
  }
  std::vector<float> part(hf);
  permute_rope_rows(t, part, true);
  std::copy(part.begin(), part.end(), at);
}

}  // namespace meshtrain
