#include "meshtrain/comm/node.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <numeric>

namespace meshtrain {

std::string node_name() {
  if (const char* slurm = std::getenv("SLURMD_NODENAME"); slurm && *slurm) return slurm;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "?";
  return host;
}

std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size), 0);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm);
  std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), 0);
  std::string all(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]),
                                                         static_cast<size_t>(lengths[r])));
  return out;
}

MPI_Comm split_by_node(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const std::string name = node_name();
  // Names to colours without gathering every name on every rank: split by a hash of the name
  // first (FNV-1a), then by the exact name inside each hash group (a few nodes' ranks at most).
  uint32_t hash = 2166136261u;
  for (const unsigned char c : name) hash = (hash ^ c) * 16777619u;
  MPI_Comm same_hash, same_name, node;
  MPI_Comm_split(comm, static_cast<int>(hash & 0x7fffffffu), rank, &same_hash);
  const std::vector<std::string> names = all_gather_strings(same_hash, name);
  int first = 0;
  while (names[static_cast<size_t>(first)] != name) ++first;
  MPI_Comm_split(same_hash, first, rank, &same_name);
  MPI_Comm_free(&same_hash);
  MPI_Comm_split_type(same_name, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_free(&same_name);
  return node;
}

NodeMembership node_membership(MPI_Comm comm) {
  NodeMembership m;
  m.name = node_name();
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm node = split_by_node(comm);
  MPI_Comm_rank(node, &m.local_rank);
  MPI_Comm_size(node, &m.local_size);
  m.id = rank;
  MPI_Bcast(&m.id, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  const int leader = m.local_rank == 0 ? 1 : 0;
  MPI_Allreduce(&leader, &m.count, 1, MPI_INT, MPI_SUM, comm);
  return m;
}

}  // namespace meshtrain
