#pragma once
// Test helper: a fresh directory under $TMPDIR (or /tmp), removed with everything in it when
// the object goes out of scope, so file tests never collide or leave litter.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace meshtrain::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/meshtrain_test_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << templ;
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace meshtrain::testing
