#include "meshtrain/config/fault_injection.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "meshtrain/config/deck_error.h"

namespace meshtrain {

namespace {

// "checkpoint_kill:<phase>[@<step>]"; `text` is the whole variable, for the message.
Fault parse_checkpoint_kill(const std::string& item, const std::string& text) {
  Fault f;
  f.kind = Fault::Kind::CheckpointKill;
  std::string phase = item.substr(item.find(':') + 1);
  if (const size_t at = phase.find('@'); at != std::string::npos) {
    f.step = std::atoll(phase.c_str() + at + 1);
    phase.resize(at);
  }
  if (phase == "data") f.phase = CheckpointPhase::Data;
  else if (phase == "rename") f.phase = CheckpointPhase::Rename;
  else if (phase == "prune") f.phase = CheckpointPhase::Prune;
  else throw DeckError("MESHTRAIN_FAULT=" + text + ": unknown phase '" + phase +
                       "' (expected checkpoint_kill:data, :rename or :prune, optionally @<step>)");
  return f;
}

// "checkpoint_stall:<phase>[@<step>]:rank=<r>"
Fault parse_checkpoint_stall(const std::string& item, const std::string& text) {
  const size_t rank_at = item.rfind(":rank=");
  if (rank_at == std::string::npos || rank_at <= std::string("checkpoint_stall").size())
    throw DeckError("MESHTRAIN_FAULT=" + text + ": cannot parse \"" + item +
                    "\" (expected checkpoint_stall:<phase>[@<step>]:rank=<r>)");
  Fault f = parse_checkpoint_kill(item.substr(0, rank_at), text);
  f.kind = Fault::Kind::CheckpointStall;
  f.rank = std::atoi(item.c_str() + rank_at + 6);
  if (f.rank < 0)
    throw DeckError("MESHTRAIN_FAULT=" + text + ": \"" + item + "\" names no rank (expected rank=<r> >= 0)");
  return f;
}

// "stall|exit:rank=<r>:step=<s>"
Fault parse_rank_fault(const std::string& item) {
  Fault f;
  std::stringstream parts(item);
  std::string kind, part;
  std::getline(parts, kind, ':');
  while (std::getline(parts, part, ':')) {
    if (part.rfind("rank=", 0) == 0) f.rank = std::atoi(part.c_str() + 5);
    else if (part.rfind("step=", 0) == 0) f.step = std::atoi(part.c_str() + 5);
  }
  if ((kind != "stall" && kind != "exit") || f.rank < 0 || f.step < 1)
    throw DeckError("MESHTRAIN_FAULT: cannot parse \"" + item +
                    "\" (expected stall|exit:rank=<r>:step=<s>, flip_param:rank=<r>:step=<s>[:...], "
                    "flip_grad:rank=<r>:step=<s>[:...], checkpoint_kill:<phase>[@<step>] or "
                    "checkpoint_stall:<phase>[@<step>]:rank=<r>)");
  f.kind = kind == "exit" ? Fault::Kind::Exit : Fault::Kind::Stall;
  return f;
}

// "flip_param|flip_grad:rank=<r>:step=<s>[:param=<name>][:index=<i>][:bit=<b>]"
Fault parse_flip(const std::string& item) {
  Fault f;
  std::stringstream parts(item);
  std::string kind, part;
  std::getline(parts, kind, ':');
  f.kind = kind == "flip_param" ? Fault::Kind::FlipParam : Fault::Kind::FlipGrad;
  f.bit = f.kind == Fault::Kind::FlipGrad ? 30 : 0;
  const std::string syntax = f.kind == Fault::Kind::FlipParam
                                 ? "flip_param:rank=<r>:step=<s>[:param=<name>][:index=<i>][:bit=<b>]"
                                 : "flip_grad:rank=<r>:step=<s>[:index=<i>][:bit=<b>]";
  bool bad = false;
  while (std::getline(parts, part, ':')) {
    if (part.rfind("rank=", 0) == 0) f.rank = std::atoi(part.c_str() + 5);
    else if (part.rfind("step=", 0) == 0) f.step = std::atoi(part.c_str() + 5);
    else if (part.rfind("index=", 0) == 0) f.index = std::atoll(part.c_str() + 6);
    else if (part.rfind("bit=", 0) == 0) f.bit = std::atoi(part.c_str() + 4);
    else if (part.rfind("param=", 0) == 0 && f.kind == Fault::Kind::FlipParam) f.param = part.substr(6);
    else bad = true;
  }
  // 63: the highest bit of the widest element (fp64).
  if (bad || f.rank < 0 || f.step < 1 || f.index < 0 || f.bit < 0 || f.bit > 63)
    throw DeckError("MESHTRAIN_FAULT: cannot parse \"" + item + "\" (expected " + syntax +
                    ", with bit from 0 to 63)");
  return f;
}

}  // namespace

std::string_view checkpoint_phase_name(CheckpointPhase phase) {
  switch (phase) {
    case CheckpointPhase::Data: return "data";
    case CheckpointPhase::Rename: return "rename";
    case CheckpointPhase::Prune: return "prune";
  }
  return "?";
}

std::vector<Fault> parse_faults(const std::string& text) {
  std::vector<Fault> out;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item.rfind("checkpoint_kill:", 0) == 0) out.push_back(parse_checkpoint_kill(item, text));
    else if (item.rfind("checkpoint_stall:", 0) == 0) out.push_back(parse_checkpoint_stall(item, text));
    else if (item.rfind("flip_param:", 0) == 0 || item.rfind("flip_grad:", 0) == 0)
      out.push_back(parse_flip(item));
    else out.push_back(parse_rank_fault(item));
  }
  return out;
}

const std::vector<Fault>& requested_faults() {
  // A parse error leaves the static unset, so every caller sees the error, not an empty list.
  static const std::vector<Fault> faults = [] {
    const char* env = std::getenv("MESHTRAIN_FAULT");
    return env ? parse_faults(env) : std::vector<Fault>{};
  }();
  return faults;
}

void inject_faults(int world_rank, int step) {
  for (const Fault& f : requested_faults()) {
    if ((f.kind != Fault::Kind::Stall && f.kind != Fault::Kind::Exit) || f.rank != world_rank ||
        f.step != step)
      continue;
    const bool exit = f.kind == Fault::Kind::Exit;
    std::fprintf(stderr, "meshtrain: rank %d: injected fault '%s' at step %d\n", world_rank,
                 exit ? "exit" : "stall", step);
    std::fflush(stderr);
    if (exit) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // see fault_injection.h
      std::_Exit(9);
    }
    for (;;) pause();  // stall: no progress, no communication, until killed
  }
}

std::vector<Fault> flips_at(Fault::Kind kind, int world_rank, int step) {
  std::vector<Fault> out;
  for (const Fault& f : requested_faults())
    if (f.kind == kind && f.rank == world_rank && f.step == step) out.push_back(f);
  return out;
}

}  // namespace meshtrain
