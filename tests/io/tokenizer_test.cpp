// open_tokenizer: each kind from its files, told apart by content, and clear refusals.

#include "meshtrain/io/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/io/data_error.h"
#include "support/temp_dir.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

// Writes vocab.json and merges.txt of the tiny vocabulary into `dir`.
void write_gpt2_files(const std::string& dir) {
  const Gpt2BpeFiles f = meshtrain::testing::tiny_gpt2_files();
  std::ofstream v(dir + "/vocab.json");
  v << "{";
  for (size_t i = 0; i < f.vocab.size(); ++i) {
    std::string escaped;
    for (char c : f.vocab[i].first) {
      if (c == '"' || c == '\\') escaped += '\\';
      escaped += c;
    }
    v << (i ? ", " : "") << "\"" << escaped << "\": " << f.vocab[i].second;
  }
  v << "}";
  std::ofstream m(dir + "/merges.txt");
  m << "#version: 0.2\n";
  for (const auto& [a, b] : f.merges) m << a << " " << b << "\n";
}

void expect_refused(const std::string& spec, const std::string& part) {
  try {
    open_tokenizer(spec);
    FAIL() << "expected a DataError for " << spec;
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(spec, 0), 0u) << what;
    EXPECT_NE(what.find(part), std::string::npos) << what;
  }
}

TEST(OpenTokenizer, Bytes) {
  const auto t = open_tokenizer("bytes");
  EXPECT_EQ(t->kind(), "bytes");
  EXPECT_EQ(t->vocab_size(), 256u);
  EXPECT_EQ(t->signature(), "byte");  // what checkpoints have always recorded
  EXPECT_TRUE(t->takes_any_bytes());
}

TEST(OpenTokenizer, Gpt2FromDirectoryPairAndVocabPath) {
  TempDir dir;
  write_gpt2_files(dir.path());
  for (const std::string& spec : {dir.path(), dir.file("vocab.json") + "," + dir.file("merges.txt"),
                                 dir.file("vocab.json")}) {
    const auto t = open_tokenizer(spec);
    EXPECT_EQ(t->kind(), "gpt2-bpe") << spec;
    EXPECT_EQ(t->signature(), "gpt2-bpe:266") << spec;
    EXPECT_EQ(t->encode("hello world"), (std::vector<uint32_t>{259, 264})) << spec;
  }
}

TEST(OpenTokenizer, RefusesWhatItCannotRead) {
  TempDir dir;
  expect_refused(dir.file("missing.model"), "no such file");
  std::ofstream(dir.file("junk.bin"), std::ios::binary) << std::string("\x01\x02junk\xff", 7);
  expect_refused(dir.file("junk.bin"), "expected \"bytes\", a SentencePiece model");
  std::ofstream(dir.file("empty.model")).close();
  expect_refused(dir.file("empty.model"), "is empty");
  std::filesystem::create_directory(dir.file("nothing"));
  expect_refused(dir.file("nothing"), "without vocab.json + merges.txt");
  std::filesystem::create_directory(dir.file("v"));
  std::ofstream(dir.file("v/vocab.json")) << "{\"a\": 0}";
  expect_refused(dir.file("v/vocab.json"), "no merges.txt");
  std::ofstream(dir.file("bad.json")) << "{\"model\": {\"type\": \"Unigram\"}}";
  expect_refused(dir.file("bad.json"), "model.type = \"Unigram\" is not \"BPE\"");
  std::ofstream(dir.file("broken.json")) << "{\"model\": ";
  expect_refused(dir.file("broken.json"), "is not valid JSON");
}

}  // namespace
}  // namespace meshtrain
