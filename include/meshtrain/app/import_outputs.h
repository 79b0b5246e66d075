#pragma once
// The files `meshtrain import` writes — the checkpoint OUT.h5 and the deck of --deck-out — and the
// directory lock it holds while writing them. Every output is checked before a tensor is read
// (app/import_command.cpp), so that a refused output costs nothing and a failure leaves no file:
//
// - an output is never a directory, never (without --force) an existing file, and with --force
//   only a regular file; its temporary (<path>.tmp) must not exist (someone else's);
// - no output is the same file as an input (config.json, the weights, any file of the Hugging Face
//   directory, the --deck) or as another output or its temporary — by identity (the directory's
//   real path and the name; device and inode for an existing file), not by spelling: `OUT.h5
//   --deck-out ./OUT.h5` would write the deck over the checkpoint;
// - OUT.h5's directory is locked as the trainer locks its checkpoint.dir (io/directory_lock.h):
//   a running job's checkpoint.dir is refused, naming the holder, since an import there starts
//   another lineage, and that job's requeue would then refuse to resume.
//
// The deck is written under <deck>.tmp before the checkpoint and renamed after it: a deck that
// cannot be written stops the import before the checkpoint is, and any failure removes both
// temporaries.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/app/commands.h"
#include "meshtrain/io/directory_lock.h"

namespace meshtrain {

class ImportOutputs {
 public:
  // Checks every output of `args` against the others and against `inputs` (files the import
  // reads, besides every file of args.dir), and locks OUT.h5's directory where it exists. Throws
  // std::runtime_error naming the output, what it collides with, and what to do.
  ImportOutputs(const ImportArgs& args, const std::vector<std::string>& inputs);
  // Removes a deck staged but not published.
  ~ImportOutputs();
  ImportOutputs(const ImportOutputs&) = delete;
  ImportOutputs& operator=(const ImportOutputs&) = delete;

  // Makes OUT.h5's directory (and locks it, if it was made now), stages the deck (`deck_text`,
  // when --deck-out is given), calls `write_checkpoint` and publishes the deck.
  void write(const std::string& deck_text, const std::function<void()>& write_checkpoint);

 private:
  void lock_directory(const std::string& dir);
  void stage_deck(const std::string& text);
  void publish_deck();

  ImportArgs args_;
  std::unique_ptr<DirectoryLock> lock_;
  std::string staged_;  // <deck>.tmp while it exists
};

}  // namespace meshtrain
