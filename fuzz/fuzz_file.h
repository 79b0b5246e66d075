#pragma once
// A scratch file for harnesses whose reader takes a path: the fuzz input is written to
// $TMPDIR (or /tmp)/meshtrain-fuzz-<pid>-<name> and removed when the harness exits. One file
// per process, rewritten for each input: libFuzzer runs inputs one after another.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace meshtrain::fuzz {

class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/meshtrain-fuzz-" +
            std::to_string(::getpid()) + "-" + name;
  }
  ~ScratchFile() { std::remove(path_.c_str()); }

  // Replaces the file's contents with data[0, size); aborts if it cannot (not the reader's bug).
  const std::string& write(const uint8_t* data, size_t size) {
    FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace meshtrain::fuzz
