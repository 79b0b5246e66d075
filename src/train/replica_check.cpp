#include "meshtrain/train/replica_check.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/train/hardware_fault.h"

namespace meshtrain {

namespace {

struct Member {
  int world_rank = 0;
  std::string node;
  uint64_t hash = 0;
};

std::string pack_member(uint64_t hash, int world_rank, const std::string& node) {
  std::string out(sizeof hash + sizeof world_rank, '\0');
  std::memcpy(out.data(), &hash, sizeof hash);
  std::memcpy(out.data() + sizeof hash, &world_rank, sizeof world_rank);
  return out + node;
}

Member unpack_member(const std::string& bytes) {
  Member m;
  std::memcpy(&m.hash, bytes.data(), sizeof m.hash);
  std::memcpy(&m.world_rank, bytes.data() + sizeof m.hash, sizeof m.world_rank);
  m.node = bytes.substr(sizeof m.hash + sizeof m.world_rank);
  return m;
}

std::string pack_records(const std::vector<ReplicaRecord>& records) {
  std::ostringstream os;
  for (const ReplicaRecord& r : records) os << r.what << '\t' << r.hash << '\n';
  return os.str();
}

std::map<std::string, uint64_t> unpack_records(const std::string& bytes) {
  std::map<std::string, uint64_t> out;
  std::istringstream is(bytes);
  std::string line;
  while (std::getline(is, line)) {
    const size_t tab = line.rfind('\t');
    out[line.substr(0, tab)] = std::stoull(line.substr(tab + 1));
  }
  return out;
}

uint64_t combined_hash(const std::vector<ReplicaRecord>& records) {
  return std::hash<std::string>{}(pack_records(records));
}

std::string rank_list(const std::vector<const Member*>& members, bool nodes) {
  std::string out;
  for (size_t i = 0; i < members.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == members.size() ? " and " : ", ") + std::to_string(members[i]->world_rank);
    if (nodes) out += " (node " + members[i]->node + ")";
  }
  return (members.size() == 1 ? "rank " : "ranks ") + out;
}

// What differs between a group's copies, named by parameter: up to three, then a count.
std::string differing_state(const std::vector<std::map<std::string, uint64_t>>& records) {
  std::set<std::string> keys;
  for (const auto& r : records)
    for (const auto& [what, hash] : r) keys.insert(what);
  std::vector<std::string> differ;
  for (const std::string& key : keys) {
    std::set<uint64_t> seen;
    for (const auto& r : records) {
      const auto it = r.find(key);
      seen.insert(it == r.end() ? 0 : it->second);
    }
    if (seen.size() > 1) differ.push_back(key);
  }
  std::string out;
  for (size_t i = 0; i < differ.size() && i < 3; ++i) out += (i ? ", " : "") + differ[i];
  if (differ.size() > 3) out += " and " + std::to_string(differ.size() - 3) + " more";
  return out;
}

// A group whose copies differ, described by its rank 0; the suspects' nodes go to `nodes`.
std::string describe_group(const std::vector<Member>& members, const std::string& group,
                           const std::string& what, std::set<std::string>& nodes) {
  std::map<uint64_t, std::vector<const Member*>> by_hash;
  for (const Member& m : members) by_hash[m.hash].push_back(&m);
  size_t largest = 0, holders = 0;
  for (const auto& [hash, list] : by_hash) {
    if (list.size() > largest) {
      largest = list.size();
      holders = 1;
    } else if (list.size() == largest) {
      ++holders;
    }
  }
  std::ostringstream os;
  if (holders == 1) {  // a majority: the others differ from it
    std::vector<const Member*> odd, rest;
    for (const auto& [hash, list] : by_hash)
      for (const Member* m : list) (list.size() == largest ? rest : odd).push_back(m);
    std::sort(odd.begin(), odd.end(), [](auto* a, auto* b) { return a->world_rank < b->world_rank; });
    std::sort(rest.begin(), rest.end(), [](auto* a, auto* b) { return a->world_rank < b->world_rank; });
    for (const Member* m : odd) nodes.insert(m->node);
    os << rank_list(odd, true) << " differ" << (odd.size() == 1 ? "s" : "") << " from the other "
       << rest.size() << " of " << (odd.size() == 1 ? "its " : "their ") << group << " ("
       << rank_list(rest, false) << ") in " << what;
  } else {  // no majority (two copies, or as many ways as copies): every copy is a suspect
    std::vector<const Member*> all;
    for (const Member& m : members) {
      all.push_back(&m);
      nodes.insert(m.node);
    }
    os << "the " << group << " " << rank_list(all, true) << (all.size() > 2 ? " all" : "") << " disagree in " << what
       << " (no majority tells which copy is corrupt)";
  }
  return os.str();
}

}  // namespace

void check_replicas(const Config& config, ProcessGrid& grid, ModelState& state, int step,
                    int agreed_step) {
  struct Group {
    ReplicaScope scope;
    Communicator* comm;
    const char* name;
  };
  // Without expert parallelism the experts are the data-parallel replicas' like any parameter.
  Communicator* experts = grid.expert() ? &grid.expert_data() : nullptr;
  const Group groups[] = {
      {ReplicaScope::Replicas, &grid.replicas(), "data-parallel replicas"},
      {ReplicaScope::Tensor, &grid.comm(Axis::Tensor), "tensor-parallel group"},
      {ReplicaScope::Embedding, &grid.embedding(), "tied-embedding copies (first and last stage)"},
      {ReplicaScope::Experts, experts, "expert-data replicas (the same experts)"}};
  std::string mine;  // this rank's findings: only a disagreeing group's rank 0 has any
  for (const Group& g : groups) {
    if (!g.comm || g.comm->size() < 2) continue;
    const std::vector<ReplicaRecord> records = state.replica_records(g.scope);
    std::vector<Member> members;
    for (const std::string& b :
         g.comm->all_gather_bytes(pack_member(combined_hash(records), grid.world_rank(), grid.node_name())))
      members.push_back(unpack_member(b));
    const bool agree = std::all_of(members.begin(), members.end(),
                                   [&](const Member& m) { return m.hash == members.front().hash; });
    if (agree) continue;
    // Every member knows the group disagrees: all gather the per-parameter hashes.
    std::vector<std::map<std::string, uint64_t>> all;
    for (const std::string& b : g.comm->all_gather_bytes(pack_records(records))) all.push_back(unpack_records(b));
    if (g.comm->rank() != 0) continue;
    std::set<std::string> nodes;
    const std::string finding = describe_group(members, g.name, differing_state(all), nodes);
    std::string node_list;
    for (const std::string& n : nodes) node_list += (node_list.empty() ? "" : ",") + n;
    mine += finding + '\t' + node_list + '\n';
  }
  // Every rank learns every finding, in rank order: the same verdict and message everywhere.
  std::vector<std::string> findings;
  std::set<std::string> suspects;
  for (const std::string& part : grid.world().all_gather_bytes(mine)) {
    std::istringstream is(part);
    std::string line;
    while (std::getline(is, line)) {
      const size_t tab = line.find('\t');
      findings.push_back(line.substr(0, tab));
      std::istringstream nodes(line.substr(tab + 1));
      std::string n;
      while (std::getline(nodes, n, ',')) suspects.insert(n);
    }
  }
  if (findings.empty()) return;
  std::string node_list;
  for (const std::string& n : suspects) node_list += (node_list.empty() ? "" : ",") + n;
  std::ostringstream msg;
  msg << config.deck_path << ": replica check at step " << step << " (run.replica_check_every = "
      << config.run.replica_check_every << "): copies of the same state differ, which healthy "
      << "hardware never causes: ";
  for (size_t i = 0; i < findings.size() && i < 4; ++i) msg << (i ? "; " : "") << findings[i];
  if (findings.size() > 4) msg << "; and " << findings.size() - 4 << " more group(s)";
  msg << ". Likely silent data corruption (a hardware fault) on node" << (suspects.size() > 1 ? "s " : " ")
      << node_list << "; ";
  if (agreed_step > 0)
    msg << "the copies agreed at step " << agreed_step << ": resume from a checkpoint of step " << agreed_step
        << " or earlier (checkpoint.resume = \"<path>\")";
  else
    msg << "the copies last agreed when the run started: train again from the start";
  msg << " away from " << (suspects.size() > 1 ? "those nodes" : "that node")
      << " (e.g. sbatch --exclude=" << node_list << ") and have " << (suspects.size() > 1 ? "them" : "it")
      << " tested";
  throw HardwareFault(msg.str());
}

}  // namespace meshtrain
