#pragma once
// Every file meshtrain reads comes from someone else (a deck, a token shard, a tokenizer, a
// checkpoint, config.json, model.safetensors, a text to prepare, a machine profile), and any of
// them may be a FIFO, a device or a directory: open(2) of a FIFO with no writer blocks forever
// (and a rank blocked in it ignores SIGTERM), a character device reads without end. So a reader
// checks the type before it opens, and where it opens the file itself it opens without blocking
// and checks the open descriptor (no window between the check and the open).
//
// A path that does not exist (or cannot be stat'ed) passes the check: the reader's own open then
// fails with the message it words for a missing file.

#include <string>

namespace meshtrain {

// "" when `path` is a regular file or cannot be stat'ed, else the message
// "<path>: is a FIFO, not <what> (expected <expected>)" ("a directory", "a character device",
// "a block device", "a socket"). `what`: "an input deck"; `expected`: "a TOML file".
std::string non_regular_file_problem(const std::string& path, const std::string& what,
                                     const std::string& expected);

// Throws DataError with non_regular_file_problem()'s message when there is one.
void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& expected);

// open(2) for reading that cannot block on a FIFO (O_NONBLOCK, cleared again once the open
// descriptor is known to be a regular file), close-on-exec. Returns the descriptor (the caller
// closes it), or -1 with errno set when open(2) fails; throws DataError when the path is not a
// regular file.
int open_regular_file(const std::string& path, const std::string& what,
                      const std::string& expected);

}  // namespace meshtrain
