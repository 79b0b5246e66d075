#pragma once
// Which node a rank runs on: the one definition of "node" every part of meshtrain uses (the
// process grid's node count and tensor-group placement, node-local ranks for threads and GPUs,
// the node printed in diagnoses and kept in flight records).
//
// A node is the ranks that share both a node *name* and memory:
//   - the name is SLURMD_NODENAME when Slurm started the rank (the name of the slurmd that
//     launched it), else the hostname. On a real cluster the two name the same machine. Where one
//     host runs several slurmd daemons (an emulated cluster, scripts/slurm-local.sh --nodes N),
//     only the Slurm name tells the emulated nodes apart: every rank has the same hostname and
//     shares memory with every other.
//   - shared memory (MPI_COMM_TYPE_SHARED) refines the name: ranks whose name is the same but
//     that cannot share memory (a SLURMD_NODENAME copied to other machines by a launcher that
//     forwards the environment, identical hostnames in containers) are on different nodes.
// So the split is never coarser than the truth on a real cluster, and follows the emulation on
// an emulated one.

#include <mpi.h>

#include <string>
#include <vector>

namespace meshtrain {

// This process's node name (SLURMD_NODENAME, else the hostname). Not collective, no MPI.
std::string node_name();

// Collective over `comm`: a communicator of the ranks of `comm` on this rank's node (see above),
// ranked in the order of `comm`. The caller frees it.
MPI_Comm split_by_node(MPI_Comm comm);

// This rank's node within `comm` (collective).
struct NodeMembership {
  std::string name;    // node_name()
  int local_rank = 0;  // index among the node's ranks, in the order of `comm`
  int local_size = 1;  // ranks of `comm` on the node
  int id = 0;          // rank in `comm` of the node's first rank: equal on a node, unique
  int count = 1;       // nodes `comm` spans
};
NodeMembership node_membership(MPI_Comm comm);

// Collective over `comm`: every rank's `mine`, indexed by rank (any lengths).
std::vector<std::string> all_gather_strings(MPI_Comm comm, const std::string& mine);

}  // namespace meshtrain
