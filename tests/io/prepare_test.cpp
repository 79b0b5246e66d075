// Preparation: text files and the synthetic corpus become valid train/val shards whose
// tokens are exactly the text, split at the documented place.

#include "meshtrain/io/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "meshtrain/io/byte_tokenizer.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/jsonl_documents.h"
#include "meshtrain/io/synthetic_corpus.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/gpt2_bpe_tokenizer.h"
#include "meshtrain/io/tokenizer.h"
#include "support/small_corpus.h"
#include "support/temp_dir.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

std::vector<uint32_t> all_tokens(const TokenShard& s) {
  std::vector<uint32_t> t;
  for (int64_t i = 0; i < s.size(); ++i) t.push_back(s.token(i));
  return t;
}

TEST(Prepare, SyntheticCorpusBecomesTwoValidShards) {
  TempDir dir;
  const size_t bytes = 100000;
  const PrepareResult r = prepare_synthetic(17, bytes, dir.file("synth/tiny"), 0.1);
  EXPECT_EQ(r.train_path, dir.file("synth/tiny_train.bin"));
  EXPECT_EQ(r.val_path, dir.file("synth/tiny_val.bin"));
  EXPECT_EQ(r.train_tokens + r.val_tokens, static_cast<int64_t>(bytes));
  EXPECT_EQ(r.val_tokens, 10000);

  const TokenShard train = TokenShard::open(r.train_path), val = TokenShard::open(r.val_path);
  EXPECT_EQ(train.size(), r.train_tokens);
  EXPECT_EQ(val.size(), r.val_tokens);
  EXPECT_EQ(train.vocab_size(), 256u);
  EXPECT_EQ(train.bytes_per_token(), 2u);
  EXPECT_TRUE(train.verify_checksum());
  EXPECT_TRUE(val.verify_checksum());
  // Train then val is the text itself.
  EXPECT_EQ(detokenize_bytes(all_tokens(train)) + detokenize_bytes(all_tokens(val)),
            synthetic_text(17, bytes));
}

TEST(Prepare, TextFilesEachGiveTheirTailToValidation) {
  TempDir dir;
  std::ofstream(dir.file("a.txt"), std::ios::binary) << "0123456789";
  std::ofstream(dir.file("b.txt"), std::ios::binary) << "abcdefghijklmnopqrst";
  const PrepareResult r =
      prepare_text_files({dir.file("a.txt"), dir.file("b.txt")}, dir.file("out"), 0.2);
  EXPECT_EQ(r.train_tokens, 8 + 16);
  EXPECT_EQ(r.val_tokens, 2 + 4);
  EXPECT_EQ(detokenize_bytes(all_tokens(TokenShard::open(r.train_path))),
            "01234567abcdefghijklmnop");
  EXPECT_EQ(detokenize_bytes(all_tokens(TokenShard::open(r.val_path))), "89qrst");
}

TEST(Prepare, ErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.txt"), empty = dir.file("empty.txt");
  std::ofstream(empty).close();
  for (const std::string& bad : {missing, empty}) {
    try {
      prepare_text_files({bad}, dir.file("out"), 0.1);
      FAIL() << "expected a DataError for " << bad;
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
    }
  }
}

TEST(Prepare, ValidationFractionMustLieInZeroToOne) {
  TempDir dir;
  for (double f : {1.0, -0.5, 1.5}) {
    EXPECT_THROW(prepare_synthetic(1, 1000, dir.file("s"), f), std::invalid_argument) << f;
  }
}

// 0 means "no validation shard": every token goes to training and no _val.bin is written.
TEST(Prepare, ZeroValidationFractionWritesNoValidationShard) {
  TempDir dir;
  const PrepareResult r = prepare_synthetic(1, 1000, dir.file("s"), 0.0);
  EXPECT_EQ(r.train_tokens, 1000);
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_EQ(r.val_path, "");
  EXPECT_EQ(TokenShard::open(dir.file("s_train.bin")).size(), 1000);
  EXPECT_FALSE(std::filesystem::exists(dir.file("s_val.bin")));
  std::ofstream(dir.file("a.txt"), std::ios::binary) << "0123456789";
  EXPECT_EQ(prepare_text_files({dir.file("a.txt")}, dir.file("t"), 0.0).train_tokens, 10);
  EXPECT_FALSE(std::filesystem::exists(dir.file("t_val.bin")));
}

TEST(Prepare, DirectoriesAreRefusedByName) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("texts"));
  try {
    prepare_text_files({dir.file("texts")}, dir.file("out"), 0.1);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir.file("texts") + ": is a directory, not a text file", 0), 0u)
        << e.what();
  }
  // --out is a prefix of file names: a directory would write "<dir>/_train.bin".
  EXPECT_THROW(prepare_synthetic(1, 1000, dir.file("texts"), 0.1), std::invalid_argument);
  EXPECT_THROW(prepare_synthetic(1, 1000, dir.file("new") + "/", 0.1), std::invalid_argument);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Small chunks on several threads: every chunk boundary is exercised and the tokens must still
// come out in file order, the same as one pass over the whole text.
TEST(Prepare, StreamingInSmallChunksMatchesTheWholeText) {
  TempDir dir;
  std::string text = meshtrain::testing::small_corpus(2000);
  text += "  trailing  spaces \n\n\nand newlines\n  x";
  meshtrain::testing::write_file(dir.file("a.txt"), text);
  const auto gpt2 = make_gpt2_bpe_tokenizer(meshtrain::testing::tiny_gpt2_files(), "tiny");
  const auto bytes = make_byte_tokenizer();
  for (const Tokenizer* tok : {bytes.get(), gpt2.get()}) {
    for (int threads : {1, 3}) {
      PrepareOptions opt;
      opt.val_fraction = 0.25;
      opt.threads = threads;
      opt.chunk_bytes = 997;
      opt.existing = ExistingOutputs::Replace;  // the same prefix every round
      const PrepareResult r = prepare_text_files({dir.file("a.txt")}, dir.file("o"), *tok, opt);
      std::vector<uint32_t> got = all_tokens(TokenShard::open(r.train_path));
      const std::vector<uint32_t> val = all_tokens(TokenShard::open(r.val_path));
      EXPECT_GT(val.size(), 0u);
      got.insert(got.end(), val.begin(), val.end());
      EXPECT_EQ(got, tok->encode(text)) << tok->kind() << " threads " << threads;
      EXPECT_EQ(TokenShard::open(r.train_path).vocab_size(), tok->vocab_size());
      if (tok == bytes.get()) {
        EXPECT_EQ(r.val_tokens, static_cast<int64_t>(std::llround(text.size() * 0.25)));
        EXPECT_EQ(r.tokenizer_path, "");
      } else {
        EXPECT_EQ(r.tokenizer_path, dir.file("o_tokenizer.json"));
        EXPECT_EQ(open_tokenizer(r.tokenizer_path)->encode(text), tok->encode(text));
      }
    }
  }
}

// Binary junk is refused by the subword tokenizers (UTF-8 without NUL is their rule) with the
// file and byte offset; nothing is left under a final name, and no .tmp either.
TEST(Prepare, SubwordTokenizersRefuseBinaryAndLeaveNoShard) {
  TempDir dir;
  const std::string good = meshtrain::testing::small_corpus(500);
  meshtrain::testing::write_file(dir.file("good.txt"), good);
  meshtrain::testing::write_file(dir.file("nul.txt"), good + std::string("ab\0cd", 5));
  meshtrain::testing::write_file(dir.file("latin1.txt"), good + "caf\xe9 au lait\n");
  std::filesystem::create_directory(dir.file("out"));
  const auto gpt2 = make_gpt2_bpe_tokenizer(meshtrain::testing::tiny_gpt2_files(), "tiny");
  PrepareOptions opt;
  opt.chunk_bytes = 4096;
  opt.threads = 2;
  for (const auto& [file, what] : {std::pair{std::string("nul.txt"), std::string("NUL byte")},
                                   std::pair{std::string("latin1.txt"),
                                             std::string("invalid UTF-8 byte 0xe9")}}) {
    const size_t offset = good.size() + (file == "nul.txt" ? 2 : 3);
    try {
      prepare_text_files({dir.file("good.txt"), dir.file(file)}, dir.file("out/x"), *gpt2, opt);
      FAIL() << "expected a DataError for " << file;
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(dir.file(file) + ": " + what + " at byte offset " +
                                                std::to_string(offset), 0), 0u)
          << e.what();
    }
    EXPECT_EQ(files_in(dir.file("out")), std::vector<std::string>{}) << file;
  }
  // The byte tokenizer takes the same bytes as they are.
  const PrepareResult r = prepare_text_files({dir.file("nul.txt")}, dir.file("out/b"), 0.1);
  EXPECT_EQ(r.train_tokens + r.val_tokens, static_cast<int64_t>(good.size() + 5));
}

TEST(Prepare, BadInputsAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  meshtrain::testing::write_file(dir.file("good.txt"), "some text\n");
  std::ofstream(dir.file("empty.txt")).close();
  std::filesystem::create_directory(dir.file("adir"));
  std::filesystem::create_directory(dir.file("out"));
  for (const std::string& bad : {dir.file("empty.txt"), dir.file("adir"), dir.file("missing")}) {
    try {
      prepare_text_files({dir.file("good.txt"), bad}, dir.file("out/x"), 0.1);
      FAIL() << "expected a DataError for " << bad;
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
    }
    EXPECT_EQ(files_in(dir.file("out")), std::vector<std::string>{}) << bad;
  }
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// 100000 threads aborted part-way (a std::thread the system refused, destroyed joinable) and
// left the shards' .tmp files: a count beyond kMaxThreads is refused before anything is written.
TEST(Prepare, RefusesThreadsBeyondTheCapBeforeWriting) {
  TempDir dir;
  const std::string text = dir.file("text.txt");
  std::ofstream(text) << "the quick brown fox jumps over the lazy dog. ";
  PrepareOptions opt;
  opt.threads = 100000;
  const auto bytes = make_byte_tokenizer();
  try {
    prepare_text_files({text}, dir.file("out/x"), *bytes, opt);
    ADD_FAILURE() << "100000 threads were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("100000 threads (expected from 1 to 1024)"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("out"))) << "prepare wrote before refusing";
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// JSON Lines in small chunks on several threads: each document is tokenized on its own, in
// order, whole documents on each side of the validation split, the end-of-text token after
// each; a text file's end-of-text token comes after its last chunk only, on both sides.
TEST(Prepare, JsonLinesDocumentsInSmallChunksEachEndWithTheEndOfTextToken) {
  TempDir dir;
  const auto gpt2 = make_gpt2_bpe_tokenizer(meshtrain::testing::tiny_gpt2_files(), "tiny");
  const std::optional<uint32_t> eot = gpt2->end_of_text();
  ASSERT_TRUE(eot.has_value());

  const std::string corpus = meshtrain::testing::small_corpus(600);
  std::vector<std::string> docs;
  std::string jsonl;
  for (size_t at = 0, i = 0; at < corpus.size(); ++i) {
    size_t n = 50 + (i * 37) % 400;  // then on to a whole UTF-8 character
    while (at + n < corpus.size() && (static_cast<unsigned char>(corpus[at + n]) & 0xC0) == 0x80) ++n;
    docs.push_back(corpus.substr(at, n));
    at += n;
    jsonl += nlohmann::json({{"id", i}, {"text", docs.back()}}).dump() + "\n";
  }
  meshtrain::testing::write_file(dir.file("c.jsonl"), jsonl);
  PrepareOptions opt;
  opt.val_fraction = 0.25;
  opt.threads = 3;
  opt.chunk_bytes = 997;
  opt.end_of_text = eot;
  const PrepareResult r = prepare_text_files({dir.file("c.jsonl")}, dir.file("j"), *gpt2, opt);
  // The validation documents: those whose lines start in the last quarter of the file.
  const size_t split = jsonl.size() - static_cast<size_t>(std::llround(jsonl.size() * 0.25));
  std::vector<uint32_t> want_train, want_val;
  for (size_t i = 0, at = 0; i < docs.size(); ++i) {
    std::vector<uint32_t>& want = at < split ? want_train : want_val;
    const std::vector<uint32_t> t = gpt2->encode(docs[i]);
    want.insert(want.end(), t.begin(), t.end());
    want.push_back(*eot);
    at = jsonl.find('\n', at) + 1;
  }
  EXPECT_FALSE(want_val.empty());
  EXPECT_EQ(all_tokens(TokenShard::open(r.train_path)), want_train);
  EXPECT_EQ(all_tokens(TokenShard::open(r.val_path)), want_val);

  meshtrain::testing::write_file(dir.file("c.txt"), corpus);
  const PrepareResult t = prepare_text_files({dir.file("c.txt")}, dir.file("t"), *gpt2, opt);
  for (const std::string& path : {t.train_path, t.val_path}) {
    const std::vector<uint32_t> got = all_tokens(TokenShard::open(path));
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got.back(), *eot) << path;
    EXPECT_EQ(std::count(got.begin(), got.end(), *eot), 1) << path;
  }
}

// A line longer than the bound is a bad line, read through without being held; the lines after
// it keep their numbers and offsets. A number no double holds is a bad line too (issue 50: it
// escaped as an internal error).
TEST(JsonlDocuments, LongLinesAndHugeNumbersAreBadLinesAndTheRestReadsOn) {
  TempDir dir;
  const std::string first = "{\"text\": \"one\"}\n";
  const std::string long_line = "{\"text\": \"" + std::string(5000, 'x') + "\"}\n";
  const std::string huge = "{\"text\": \"two\", \"n\": -1e400}\n";
  const std::string last = "{\"text\": \"three\"}";  // no newline
  meshtrain::testing::write_file(dir.file("c.jsonl"), first + long_line + huge + last);
  JsonlDocuments docs(dir.file("c.jsonl"), "text", true, 1000);
  JsonlLine l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Document);
  EXPECT_EQ(l.text, "one");
  l = docs.next();
  ASSERT_EQ(l.kind, JsonlLine::Kind::Bad);
  EXPECT_EQ(l.number, 2u);
  EXPECT_EQ(l.offset, first.size());
  EXPECT_EQ(l.bytes, long_line.size());
  EXPECT_NE(l.text.find("the line is 5012 bytes long, more than --max-line-bytes 1000 bytes"),
            std::string::npos) << l.text;
  l = docs.next();
  ASSERT_EQ(l.kind, JsonlLine::Kind::Bad);
  EXPECT_EQ(l.number, 3u);
  EXPECT_NE(l.text.find("a number beyond the range of a double: -1e400"), std::string::npos)
      << l.text;
  l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Document);
  EXPECT_EQ(l.text, "three");
  EXPECT_EQ(l.number, 4u);
  EXPECT_EQ(l.offset, first.size() + long_line.size() + huge.size());
  EXPECT_EQ(docs.next().kind, JsonlLine::Kind::End);

  // At the bound exactly: a document.
  JsonlDocuments exact(dir.file("c.jsonl"), "text", true, long_line.size() - 1);
  exact.next();
  EXPECT_EQ(exact.next().kind, JsonlLine::Kind::Document);
}

// An unterminated string is invalid JSON named with its first bytes only: nlohmann's message
// quotes the whole rest of the line (a 256 MiB line printed 256 MiB of error).
TEST(JsonlDocuments, InvalidJsonIsNamedWithoutTheWholeLine) {
  TempDir dir;
  meshtrain::testing::write_file(dir.file("c.jsonl"),
                                 "{\"text\": \"" + std::string(100000, 'a') + "\n");
  JsonlDocuments docs(dir.file("c.jsonl"), "text", true);
  const JsonlLine l = docs.next();
  ASSERT_EQ(l.kind, JsonlLine::Kind::Bad);
  EXPECT_EQ(l.text.rfind("invalid JSON at column ", 0), 0u) << l.text.substr(0, 300);
  EXPECT_NE(l.text.find("missing closing quote; last read: '\"aaaa"), std::string::npos)
      << l.text.substr(0, 300);
  EXPECT_NE(l.text.find("bytes more)"), std::string::npos) << l.text.substr(0, 300);
  EXPECT_LT(l.text.size(), 300u);
}

// The lookup without a DOM finds what the DOM did: the last of duplicate keys, a dotted path only
// through objects; keys named in a message are escaped for the terminal.
TEST(JsonlDocuments, DottedPathsAndDuplicateKeysAsTheDomFoundThem) {
  TempDir dir;
  meshtrain::testing::write_file(
      dir.file("c.jsonl"),
      "{\"meta\": {\"body\": \"first\"}, \"meta\": {\"x\": 1}}\n"
      "{\"meta\": {\"body\": 5}, \"meta\": {\"body\": \"second\"}}\n"
      "{\"meta\": [{\"body\": \"in an array\"}], \"a\\u001b[31m\": 2}\n"
      "{\"meta.body\": \"the whole name first\", \"meta\": {\"body\": \"not this\"}}\n");
  JsonlDocuments docs(dir.file("c.jsonl"), "meta.body", true);
  JsonlLine l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Bad);
  l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Document);
  EXPECT_EQ(l.text, "second");
  l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Bad);
  EXPECT_EQ(l.text, "no field \"meta.body\" (the object has \"a\\x1b[31m\", \"meta\"; --text-field "
                    "names the one holding the text)");
  l = docs.next();
  EXPECT_EQ(l.kind, JsonlLine::Kind::Document);
  EXPECT_EQ(l.text, "the whole name first");
}

// A file of blank lines is no corpus: refused naming it, nothing written (it made empty shards).
TEST(Prepare, JsonLinesOfBlankLinesAreRefused) {
  TempDir dir;
  meshtrain::testing::write_file(dir.file("blank.jsonl"), "\n \n\t\n");
  try {
    prepare_text_files({dir.file("blank.jsonl")}, dir.file("out/b"), 0.1);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("blank.jsonl") +
                                          ": holds no document: its 3 line(s) are all blank"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("out")));
}

}  // namespace
}  // namespace meshtrain
