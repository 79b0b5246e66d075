#pragma once
// DataError: what the data layer (io/) throws when a file or its contents are unusable: a
// missing or malformed token shard, a glob that matches nothing, a corpus too short for one
// training window. The message always starts with where the problem is (a path, a glob
// pattern, or the list of files) so that a user can find the file without a debugger.
// Programming errors (an index out of range, a bad argument from code) are not DataErrors;
// they throw the standard exceptions.

#include <stdexcept>
#include <string>

namespace meshtrain {

class DataError : public std::runtime_error {
 public:
  // Message "<where>: <what>", e.g. "data/train.bin: truncated token shard: ...".
  DataError(const std::string& where, const std::string& what)
      : std::runtime_error(where + ": " + what) {}
};

}  // namespace meshtrain
