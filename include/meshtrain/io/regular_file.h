#pragma once
// Reading a file someone else made (an HF directory's config.json, model.safetensors and
// tokenizer files): the path must name a regular file. A directory reads as an error deep in
// the C++ library ("basic_filebuf::underflow error reading the file") that names no file, a
// FIFO blocks the reader forever, a device never ends.

#include <string>

namespace meshtrain {

// "" when `path` is a regular file (symbolic links followed), else what it is instead, for a
// message "<path>: <problem>; expected ...": "is a directory", "is a FIFO (named pipe), not a
// regular file", "cannot open: No such file or directory". Opens without blocking (a FIFO with
// no writer).
std::string regular_file_problem(const std::string& path);

// The whole content of the regular file `path` into `out`; "" on success, else the problem as
// regular_file_problem says it, or "cannot be read: <reason>".
std::string read_regular_file(const std::string& path, std::string& out);

}  // namespace meshtrain
