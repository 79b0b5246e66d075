// DirectoryLock (io/directory_lock.h): a second holder is refused with the first's node and
// pid; the lock goes with its holder's process, however that ends; the lock file is never
// followed elsewhere.

#include "meshtrain/io/directory_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "meshtrain/comm/node.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

std::string take_error(const std::string& dir) {
  std::string warning;
  try {
    DirectoryLock::take(dir, "x.lock", "ctx: ", warning);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(DirectoryLock, ASecondHolderIsRefusedWithTheFirstsNodeAndPid) {
  TempDir dir;
  std::string warning;
  {
    const auto lock = DirectoryLock::take(dir.path(), "x.lock", "ctx: ", warning);
    EXPECT_EQ(warning, "");
    // Another open file description: refused even within this process (an OFD lock).
    const std::string error = take_error(dir.path());
    EXPECT_EQ(error.rfind("ctx: is in use by another run (" + dir.file("x.lock") + " is locked by node " +
                              node_name() + ", pid " + std::to_string(::getpid()) + ", since ",
                          0),
              0u)
        << error;
    EXPECT_TRUE(std::filesystem::exists(dir.file("x.lock")));
  }
  // Released, and its file removed with it.
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.lock")));
  EXPECT_EQ(take_error(dir.path()), "");
}

TEST(DirectoryLock, GoesWithItsHoldersProcessHoweverItEnds) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string warning;
    static auto lock = DirectoryLock::take(dir.path(), "x.lock", "", warning);
    (void)!::write(ready[1], "1", 1);
    for (;;) ::pause();  // until killed: no destructor runs
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string held = take_error(dir.path());
  EXPECT_NE(held.find("pid " + std::to_string(child) + ","), std::string::npos) << held;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // The stale file is still there, naming the dead holder; the lock is not.
  EXPECT_TRUE(std::filesystem::exists(dir.file("x.lock")));
  EXPECT_EQ(take_error(dir.path()), "");
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(DirectoryLock, NeverFollowsALinkAtTheLockFilesName) {
  TempDir dir;
  std::ofstream(dir.file("elsewhere")) << "keep me\n";
  std::filesystem::create_symlink(dir.file("elsewhere"), dir.file("x.lock"));
  const std::string error = take_error(dir.path());
  EXPECT_EQ(error.rfind("ctx: cannot create the lock file " + dir.file("x.lock") + ": ", 0), 0u) << error;
  std::ifstream in(dir.file("elsewhere"));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep me");
}

TEST(DirectoryLock, ADirectoryAtTheLockFilesNameIsNamed) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("x.lock"));
  const std::string error = take_error(dir.path());
  EXPECT_EQ(error.rfind("ctx: cannot create the lock file " + dir.file("x.lock") + ": Is a directory", 0), 0u)
      << error;
}

}  // namespace
}  // namespace meshtrain
