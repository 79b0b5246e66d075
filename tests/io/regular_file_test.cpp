// Readers refuse a FIFO (named pipe) at once instead of blocking in open(2) until a writer comes
// (forever: a rank blocked there ignores SIGTERM). Every reader of a file someone else made is
// tried with a FIFO that has no writer, and must answer within seconds with a message naming the
// path and what it is; io/regular_file.h is the check they share.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <string>

#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/machine_profile.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/prepare.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/safetensors.h"
#include "meshtrain/io/sentencepiece_tokenizer.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class RegularFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshtrain_regular_file_XXXXXX";
    dir_ = ::mkdtemp(pattern);
    fifo_ = dir_ + "/rank_00000.rec";  // a name every reader would take
    ASSERT_EQ(::mkfifo(fifo_.c_str(), 0644), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The message `read` ends with, or "" when it returns. A reader still blocked after 10 s fails
  // the test; the FIFO's write end is then opened (and closed) until the reader returns: each
  // such open ends a blocked open(2) of the read end, and the read then sees end of file.
  std::string refusal_of(const std::function<void()>& read) {
    auto done = std::async(std::launch::async, [&]() -> std::string {
      try {
        read();
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    });
    if (done.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
      // A reader may open the FIFO again after its first open returns: release each open.
      while (done.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout) {
        const int writer = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK);
        if (writer >= 0) ::close(writer);
      }
      return "blocked for 10 s in the open of a FIFO";
    }
    return done.get();
  }

  void expect_refused(const std::string& reader, const std::function<void()>& read) {
    const std::string what = refusal_of(read);
    EXPECT_NE(what.find(fifo_ + ": is a FIFO"), std::string::npos)
        << reader << ": " << (what.empty() ? "read the FIFO without an error" : what);
  }

  std::string dir_, fifo_;
};

TEST_F(RegularFile, EveryReaderRefusesAFifoAtOnce) {
  expect_refused("require_regular_file",
                 [&] { require_regular_file(fifo_, "a test file", "a regular file"); });
  expect_refused("open_regular_file", [&] { open_regular_file(fifo_, "a test file", "a file"); });
  expect_refused("read_deck_file", [&] { read_deck_file(fifo_); });
  expect_refused("read_machine_profile", [&] { read_machine_profile(fifo_); });
  expect_refused("TokenShard::open", [&] { TokenShard::open(fifo_); });
  expect_refused("open_tokenizer", [&] { open_tokenizer(fifo_); });
  expect_refused("open_sentencepiece", [&] { open_sentencepiece(fifo_); });
  expect_refused("open_tokenizer (vocab.json,merges.txt)",
                 [&] { open_tokenizer(fifo_ + "," + fifo_); });
  expect_refused("SafetensorsFile::open", [&] { SafetensorsFile::open(fifo_); });
  expect_refused("check_text_file", [&] { check_text_file(fifo_); });
  // comm sits below io: the flight record reader has a check of its own.
  const std::string flight = refusal_of([&] { read_flight_record(fifo_); });
  EXPECT_NE(flight.find(fifo_ + ": is not a regular file"), std::string::npos) << flight;
}

TEST_F(RegularFile, NamesWhatThePathIs) {
  EXPECT_EQ(non_regular_file_problem(fifo_, "an input deck", "a TOML file"),
            fifo_ + ": is a FIFO (named pipe), not an input deck (expected a TOML file)");
  EXPECT_EQ(non_regular_file_problem(dir_, "an input deck", "a TOML file"),
            dir_ + ": is a directory, not an input deck (expected a TOML file)");
  EXPECT_EQ(non_regular_file_problem("/dev/null", "a token shard", "a shard"),
            "/dev/null: is a character device, not a token shard (expected a shard)");
  // Missing: the reader's own open words that.
  EXPECT_EQ(non_regular_file_problem(dir_ + "/missing", "a deck", "a file"), "");
  const std::string file = dir_ + "/file.txt";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("text\n", f);
  std::fclose(f);
  EXPECT_EQ(non_regular_file_problem(file, "a deck", "a file"), "");
  // Opened without blocking, then handed back in blocking mode.
  const int fd = open_regular_file(file, "a text file", "a file");
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  ::close(fd);
  EXPECT_EQ(open_regular_file(dir_ + "/missing", "a deck", "a file"), -1);
  // A symbolic link is judged by what it names.
  const std::string link = dir_ + "/link";
  fs::create_symlink(fifo_, link);
  EXPECT_NE(non_regular_file_problem(link, "a deck", "a file").find("is a FIFO"), std::string::npos);
}

}  // namespace
}  // namespace meshtrain
