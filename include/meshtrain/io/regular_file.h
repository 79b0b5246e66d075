#pragma once
// Every file meshtrain reads comes from someone else (a deck, a token shard, a tokenizer, a
// checkpoint, config.json, model.safetensors, a text to prepare, a machine profile), and any of
// them may be a FIFO, a device or a directory: open(2) of a FIFO with no writer blocks forever
// (and a rank blocked in it ignores SIGTERM), a character device reads without end, and a
// directory reads as an error deep in the C++ library ("basic_filebuf::underflow error reading
// the file") that names no file. So a reader checks the type before it opens, and where it opens
// the file itself it opens without blocking and checks the open descriptor (no window between the
// check and the open).

#include <filesystem>
#include <string>

namespace meshtrain {

// "" when `path` is a regular file or cannot be stat'ed, else the message
// "<path>: is a FIFO (named pipe), not <what> (expected <expected>)" ("a directory", "a character
// device", "a block device", "a socket"). `what`: "an input deck"; `expected`: "a TOML file".
// A path that does not exist passes: the reader's own open then words the missing file.
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

// What a file that is not a regular one is, as a message names it: "a directory", "a FIFO (named
// pipe)", "a character device", "a block device", "a socket"; "" for a regular file. For
// messages about a path meshtrain would write or remove (a stop file, a checkpoint's name).
std::string file_kind_name(const std::filesystem::file_status& status);

// For readers that word their own message ("<path>: <problem>; expected a JSON file"): "" when
// `path` opens as a regular file (symbolic links followed), else "cannot open: <reason>" ("No
// such file or directory"), "is a directory" or "is a FIFO (named pipe), not a regular file"
// (likewise a device or a socket). Opens without blocking, as open_regular_file does.
std::string regular_file_problem(const std::string& path);

// The whole content of the regular file `path` into `out`; "" on success, else the problem as
// regular_file_problem words it, or "cannot be read: <reason>".
std::string read_regular_file(const std::string& path, std::string& out);

// Renames `from` to `to` unless something exists at `to` (RENAME_NOREPLACE, or where the file
// system lacks it a hard link and the removal of `from`). 0, or the errno: EEXIST where `to`
// exists. For writers that never replace a file they did not check (import's outputs).
int rename_without_replacing(const std::string& from, const std::string& to);

}  // namespace meshtrain
