#pragma once
// The files one `meshtrain prepare` writes (train and validation shards, the tokenizer): checked
// before anything is read or written, written under `<name>.tmp`, and published together (all or
// none), with SIGINT/SIGTERM removing the temporaries. This file is the outputs' life cycle, not
// their format (io/token_shard.h, io/tokenizer.h) nor what goes in them (io/prepare.h).

#include <csignal>
#include <string>
#include <vector>

namespace meshtrain {

// What an existing output is to `prepare`: refused (the default: shards are hours of work), or
// replaced (--force).
enum class ExistingOutputs { Refuse, Replace };

// Refuses, as a DataError naming the file, before anything is written:
//   - an output, or its .tmp, that is one of `read_files` (the inputs, the tokenizer's files),
//     by identity (device and inode, following links), whatever `existing` says: a prepare
//     would replace its own input (`prepare --out X X_train.bin`);
//   - an output that is a directory (or anything but a file or a link), whose rename would fail
//     at the end, after the other outputs were published;
//   - under ExistingOutputs::Refuse, an output or a .tmp that exists (the .tmp of an interrupted
//     prepare killed with SIGKILL: --force removes it).
// Under ExistingOutputs::Replace, removes an existing .tmp (the link itself, never what it
// names), so that writing it cannot follow a link planted there.
void check_prepare_outputs(const std::vector<std::string>& outputs,
                           const std::vector<std::string>& read_files, ExistingOutputs existing);

// SIGINT and SIGTERM held back in the calling thread while this lives (and in the threads it
// starts meanwhile, which inherit its signal mask): delivered when it ends.
class StopSignalsHeld {
 public:
  StopSignalsHeld();
  ~StopSignalsHeld();
  StopSignalsHeld(const StopSignalsHeld&) = delete;
  StopSignalsHeld& operator=(const StopSignalsHeld&) = delete;

 private:
  sigset_t before_;
};

// The temporaries of one prepare, removed if SIGINT or SIGTERM ends it: the handler removes them
// and ends the process by the same signal (a shell sees status 130 or 143). Signals are held
// back while publish() renames, so that a signal never leaves some outputs published and others
// not; other threads must block them (Workers in io/prepare.cpp do) so that they reach only the
// thread that holds them back. One at a time per process: a signal handler has only globals.
class PrepareOutputs {
 public:
  // outputs: the final names; each is written by its caller as `<name>.tmp`.
  explicit PrepareOutputs(std::vector<std::string> outputs);
  ~PrepareOutputs();  // restores the handlers it replaced
  PrepareOutputs(const PrepareOutputs&) = delete;
  PrepareOutputs& operator=(const PrepareOutputs&) = delete;

  // Renames every `<name>.tmp` to `<name>`, in order. If one rename fails, the outputs renamed
  // before it are removed with the remaining temporaries and a DataError names the failure: a
  // failed prepare leaves none of its outputs.
  void publish();

 private:
  std::vector<std::string> outputs_;
  struct sigaction int_before_ {}, term_before_ {};
};

}  // namespace meshtrain
