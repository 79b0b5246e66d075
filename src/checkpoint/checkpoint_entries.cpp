#include "checkpoint_entries.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

namespace meshtrain {

namespace {
const char* const kKindNames[kKinds] = {"value", "exp_avg", "exp_avg_sq"};
}  // namespace

std::string dataset_name(const std::string& param, int kind) {
  return kind == 0 ? "/model/" + param : "/optim/" + param + "/" + kKindNames[kind];
}

const Tensor& piece_tensor(const OwnedPiece& p, int kind) {
  return kind == 0 ? p.value : kind == 1 ? p.exp_avg : p.exp_avg_sq;
}

std::vector<Box> Entry::boxes(bool primary_only) const {
  std::vector<Box> out;
  for (const Piece& p : pieces)
    if (p.owned.primary || !primary_only) out.insert(out.end(), p.boxes.begin(), p.boxes.end());
  return out;
}

int64_t Entry::count(bool primary_only) const {
  int64_t n = 0;
  for (const Piece& p : pieces)
    if (p.owned.primary || !primary_only) n += p.owned.count;
  return n;
}

std::vector<Entry> plan_entries(ModelState& state, Communicator& world) {
  std::map<std::string, Entry> mine;
  for (const OwnedPiece& p : state.owned_pieces()) {
    const Parameter& param = *p.param;
    Entry& e = mine[param.spec.name];
    if (!e.pieces.empty() && e.pieces.front().owned.param != p.param)
      throw std::logic_error("checkpoint: two copies of parameter " + param.spec.name +
                             " on one rank; a transfer selects one slice per dataset");
    e.name = param.spec.name;
    e.global = param.spec.global_shape;
    const SliceGeometry g{param.spec.global_shape, param.shape, param.split_dim(), param.split_begin};
    e.pieces.push_back({p, boxes_of_range(g, p.local_begin, p.count)});
  }
  std::ostringstream os;
  for (auto& [name, e] : mine) {
    std::sort(e.pieces.begin(), e.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.owned.local_begin < b.owned.local_begin; });
    os << name << ' ' << e.global.rank();
    for (int k = 0; k < e.global.rank(); ++k) os << ' ' << e.global[k];
    os << '\n';
  }
  for (const std::string& text : world.all_gather_bytes(os.str())) {
    std::istringstream in(text);
    std::string name;
    int rank = 0;
    while (in >> name >> rank) {
      int64_t d[Shape::kMaxRank] = {};
      for (int k = 0; k < rank; ++k) in >> d[k];
      const Shape s = rank == 1 ? Shape{d[0]} : rank == 2 ? Shape{d[0], d[1]}
                    : rank == 3 ? Shape{d[0], d[1], d[2]} : Shape{d[0], d[1], d[2], d[3]};
      Entry& e = mine[name];
      if (e.name.empty()) {
        e.name = name;
        e.global = s;
      } else if (e.global != s) {
        throw std::logic_error("checkpoint: ranks disagree on the shape of " + name + ": " +
                               e.global.to_string() + " and " + s.to_string());
      }
    }
  }
  std::vector<Entry> out;
  for (auto& [name, e] : mine) out.push_back(std::move(e));
  return out;
}

HostElements primary_on_host(const Entry& e, int kind, DType dt, bool always_copy) {
  HostElements h;
  std::vector<const Piece*> primary;
  for (const Piece& p : e.pieces)
    if (p.owned.primary) primary.push_back(&p);
  if (!always_copy && primary.size() == 1 && piece_tensor(primary[0]->owned, kind).device() == Device::Cpu) {
    h.data = static_cast<const char*>(piece_tensor(primary[0]->owned, kind).raw());
    return h;
  }
  copy_primary(e, kind, dt, h.copy);
  h.data = h.copy.data();
  return h;
}

void size_for_primary(const Entry& e, DType dt, std::vector<char>& into) {
  into.resize(static_cast<size_t>(e.count(true)) * dtype_size(dt));
}

void copy_primary(const Entry& e, int kind, DType dt, std::vector<char>& into, bool from_any_thread) {
  size_for_primary(e, dt, into);
  size_t off = 0;
  for (const Piece& p : e.pieces) {
    if (!p.owned.primary) continue;
    const Tensor& t = piece_tensor(p.owned, kind);
    if (from_any_thread) std::memcpy(into.data() + off, t.raw(), t.nbytes());
    else p.owned.backend->copy_to_host(into.data() + off, t);
    off += static_cast<size_t>(p.owned.count) * dtype_size(dt);
  }
}

bool primary_in_host_memory(const std::vector<Entry>& entries) {
  for (const Entry& e : entries)
    for (const Piece& p : e.pieces) {
      if (!p.owned.primary) continue;
      if (p.owned.backend->planning()) return false;
      for (int kind = 0; kind < kKinds; ++kind)
        if (piece_tensor(p.owned, kind).device() != Device::Cpu) return false;
    }
  return true;
}

size_t primary_state_bytes(ModelState& state) {
  size_t bytes = 0;
  for (const OwnedPiece& p : state.owned_pieces())
    if (p.primary) bytes += static_cast<size_t>(p.count) * kKinds * dtype_size(state.state_dtype());
  return bytes;
}

std::vector<uint64_t> sum_over(Communicator& world, const std::vector<uint64_t>& mine) {
  std::string bytes(mine.size() * sizeof(uint64_t), '\0');
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<uint64_t> total(mine.size(), 0);
  for (const std::string& part : world.all_gather_bytes(bytes)) {
    std::vector<uint64_t> v(mine.size());
    std::memcpy(v.data(), part.data(), std::min(part.size(), bytes.size()));
    for (size_t i = 0; i < v.size(); ++i) total[i] += v[i];
  }
  return total;
}

}  // namespace meshtrain
