// SentencePiece: a model trained here on generated text has the vocabulary asked for, round
// trips text, saves and reloads as the same model, and training refuses sizes and text it
// cannot use with a message naming the file.

#include "meshtrain/io/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>

#include "meshtrain/io/data_error.h"
#include "support/small_corpus.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::small_corpus;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_file;

TEST(SentencePiece, TrainsTheVocabularyAskedForAndRoundTrips) {
  TempDir dir;
  write_file(dir.file("a.txt"), small_corpus());
  for (SubwordModel m : {SubwordModel::Bpe, SubwordModel::Unigram}) {
    const auto tok = train_sentencepiece({dir.file("a.txt")}, m, 300, 2);
    EXPECT_EQ(tok->kind(), "sentencepiece");
    EXPECT_EQ(tok->vocab_size(), 300u);
    EXPECT_EQ(tok->signature(), "sentencepiece:300");
    const std::string text = "the quick brown fox jumps over the lazy café";
    const std::vector<uint32_t> ids = tok->encode(text);
    EXPECT_LT(ids.size(), text.size());  // pieces longer than a byte were learnt
    EXPECT_EQ(tok->decode(ids), text);
    // Byte fallback: characters never seen still encode and decode.
    EXPECT_EQ(tok->decode(tok->encode("Ωμέγα 😀")), "Ωμέγα 😀");

    tok->save(dir.file("m.model"));
    const auto back = open_tokenizer(dir.file("m.model"));
    EXPECT_EQ(back->kind(), "sentencepiece");
    EXPECT_EQ(back->encode(text), ids);
  }
}

TEST(SentencePiece, RefusesVocabulariesTheTextCannotFill) {
  TempDir dir;
  write_file(dir.file("a.txt"), small_corpus(200));
  try {
    train_sentencepiece({dir.file("a.txt")}, SubwordModel::Bpe, 100000, 2);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(dir.file("a.txt") + ": cannot train a bpe tokenizer of 100000 pieces", 0), 0u)
        << what;
    EXPECT_NE(what.find("Please set it to a value <="), std::string::npos) << what;
  }
}

TEST(SentencePiece, RefusesBinaryInputNamingTheOffset) {
  TempDir dir;
  const std::string junk("good line\nbad \0 line\n", 21);  // the NUL at offset 14
  write_file(dir.file("bin.txt"), junk + small_corpus(100));
  try {
    train_sentencepiece({dir.file("bin.txt")}, SubwordModel::Bpe, 300, 2);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(dir.file("bin.txt") + ": NUL byte at byte offset 14", 0), 0u)
        << e.what();
  }
}

TEST(SentencePiece, NotAModel) {
  TempDir dir;
  write_file(dir.file("x.model"), "not a model");
  EXPECT_THROW(open_sentencepiece(dir.file("x.model")), DataError);
  EXPECT_EQ(sentencepiece_from_bytes("\x0a\x03zzz"), nullptr);
}

}  // namespace
}  // namespace meshtrain
