#include "meshtrain/parallel/grid_shape.h"

#include <stdexcept>

namespace meshtrain {

std::string_view axis_name(Axis a) {
  switch (a) {
    case Axis::Data: return "dp";
    case Axis::Tensor: return "tp";
    case Axis::Pipeline: return "pp";
  }
  return "?";
}

int GridShape::size(Axis a) const {
  switch (a) {
    case Axis::Data: return dp;
    case Axis::Tensor: return tp;
    case Axis::Pipeline: return pp;
  }
  return 1;
}

std::array<int, 3> GridShape::coordinates(int world_rank) const {
  std::array<int, 3> c{};
  for (Axis a : order) {
    c[axis_index(a)] = world_rank % size(a);
    world_rank /= size(a);
  }
  return c;
}

int GridShape::world_rank(const std::array<int, 3>& coords) const {
  int r = 0;
  for (int i = 2; i >= 0; --i) r = r * size(order[i]) + coords[axis_index(order[i])];
  return r;
}

std::array<Axis, 3> GridShape::parse_order(const std::string& s) {
  std::array<Axis, 3> out{};
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dash = s.find('-', start);
    parts.push_back(s.substr(start, dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  bool seen[3] = {false, false, false};
  if (parts.size() == 3) {
    for (int i = 0; i < 3; ++i) {
      Axis a;
      if (parts[i] == "dp") a = Axis::Data;
      else if (parts[i] == "tp") a = Axis::Tensor;
      else if (parts[i] == "pp") a = Axis::Pipeline;
      else break;
      if (seen[axis_index(a)]) break;
      seen[axis_index(a)] = true;
      out[i] = a;
    }
  }
  if (!(seen[0] && seen[1] && seen[2]))
    throw std::invalid_argument("expected the three axes dp, tp, pp joined by '-', fastest first "
                                "(e.g. \"tp-dp-pp\")");
  return out;
}

std::string GridShape::order_string() const {
  return std::string(axis_name(order[0])) + "-" + std::string(axis_name(order[1])) + "-" +
         std::string(axis_name(order[2]));
}

std::vector<std::vector<int>> GridShape::groups(Axis a) const {
  std::vector<std::vector<int>> out;
  std::vector<int> group_of(world_size(), -1);
  for (int r = 0; r < world_size(); ++r) {
    if (group_of[r] >= 0) continue;
    std::array<int, 3> c = coordinates(r);
    std::vector<int> members;
    for (int i = 0; i < size(a); ++i) {
      c[axis_index(a)] = i;
      members.push_back(world_rank(c));
    }
    for (int m : members) group_of[m] = static_cast<int>(out.size());
    out.push_back(members);
  }
  return out;
}

}  // namespace meshtrain
