#include "meshtrain/parallel/grid_shape.h"

#include <stdexcept>
#include <utility>

namespace meshtrain {

std::string_view axis_name(Axis a) {
  switch (a) {
    case Axis::Data: return "dp";
    case Axis::Tensor: return "tp";
    case Axis::Pipeline: return "pp";
    case Axis::Context: return "cp";
  }
  return "?";
}

int GridShape::size(Axis a) const {
  switch (a) {
    case Axis::Data: return dp;
    case Axis::Tensor: return tp;
    case Axis::Pipeline: return pp;
    case Axis::Context: return cp;
  }
  return 1;
}

GridCoords GridShape::coordinates(int world_rank) const {
  GridCoords c{};
  for (Axis a : order) {
    c[axis_index(a)] = world_rank % size(a);
    world_rank /= size(a);
  }
  return c;
}

int GridShape::world_rank(const GridCoords& coords) const {
  int r = 0;
  for (int i = kAxes - 1; i >= 0; --i) r = r * size(order[i]) + coords[axis_index(order[i])];
  return r;
}

std::array<Axis, kAxes> GridShape::parse_order(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dash = s.find('-', start);
    parts.push_back(s.substr(start, dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  std::vector<Axis> axes;
  bool seen[kAxes] = {false, false, false, false};
  bool valid = parts.size() == 3 || parts.size() == 4;
  for (size_t i = 0; valid && i < parts.size(); ++i) {
    Axis a;
    if (parts[i] == "dp") a = Axis::Data;
    else if (parts[i] == "tp") a = Axis::Tensor;
    else if (parts[i] == "pp") a = Axis::Pipeline;
    else if (parts[i] == "cp") a = Axis::Context;
    else { valid = false; break; }
    if (seen[axis_index(a)]) { valid = false; break; }
    seen[axis_index(a)] = true;
    axes.push_back(a);
  }
  if (valid && parts.size() == 3) {
    if (seen[axis_index(Axis::Context)]) valid = false;
    else {
      for (size_t i = 0; i < axes.size(); ++i)
        if (axes[i] == Axis::Tensor) {
          axes.insert(axes.begin() + static_cast<long>(i) + 1, Axis::Context);
          break;
        }
    }
  }
  if (!valid)
    throw std::invalid_argument("expected the axes tp, cp, dp, pp joined by '-', fastest first "
                                "(e.g. \"tp-cp-dp-pp\"; cp may be left out: it then follows tp)");
  std::array<Axis, kAxes> out{};
  for (int i = 0; i < kAxes; ++i) out[i] = axes[static_cast<size_t>(i)];
  return out;
}

std::string GridShape::order_string() const {
  std::string s;
  for (Axis a : order) {
    if (a == Axis::Context && cp == 1) continue;
    if (!s.empty()) s += "-";
    s += axis_name(a);
  }
  return s;
}

namespace {
// The groups that `members_of` (the world ranks of a rank's group, in group order, from its
// coordinates) cuts the world into, in order of their lowest world rank.
template <class Members>
std::vector<std::vector<int>> partition(const GridShape& g, Members members_of) {
  std::vector<std::vector<int>> out;
  std::vector<int> group_of(g.world_size(), -1);
  for (int r = 0; r < g.world_size(); ++r) {
    if (group_of[r] >= 0) continue;
    std::vector<int> members = members_of(g.coordinates(r));
    for (int m : members) group_of[m] = static_cast<int>(out.size());
    out.push_back(std::move(members));
  }
  return out;
}
}  // namespace

std::vector<std::vector<int>> GridShape::groups(Axis a) const {
  return partition(*this, [&](GridCoords c) {
    std::vector<int> members;
    for (int i = 0; i < size(a); ++i) {
      c[axis_index(a)] = i;
      members.push_back(world_rank(c));
    }
    return members;
  });
}

std::vector<std::vector<int>> GridShape::expert_groups() const {
  return partition(*this, [&](GridCoords c) {
    const int first = replica_rank(c) / ep * ep;
    std::vector<int> members;
    for (int i = 0; i < ep; ++i) members.push_back(world_rank(with_replica_rank(c, first + i)));
    return members;
  });
}

std::vector<std::vector<int>> GridShape::expert_data_groups() const {
  return partition(*this, [&](GridCoords c) {
    const int e = replica_rank(c) % ep;
    std::vector<int> members;
    for (int i = 0; i < dp * cp / ep; ++i) members.push_back(world_rank(with_replica_rank(c, e + i * ep)));
    return members;
  });
}

std::vector<std::vector<int>> GridShape::replica_groups() const {
  return partition(*this, [&](GridCoords c) {
    std::vector<int> members(static_cast<size_t>(dp * cp));
    for (int d = 0; d < dp; ++d)
      for (int k = 0; k < cp; ++k) {
        c[axis_index(Axis::Data)] = d;
        c[axis_index(Axis::Context)] = k;
        members[static_cast<size_t>(replica_rank(c))] = world_rank(c);
      }
    return members;
  });
}

}  // namespace meshtrain
