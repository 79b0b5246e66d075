// GPT-2 byte-level BPE on a vocabulary built here: merges by rank, the pre-tokenizer's
// splits, round trips, the files it saves, and its refusals. The published encoder itself is
// the reference in gpt2_bpe_reference_test.py.

#include "meshtrain/io/gpt2_bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/prepare.h"
#include "meshtrain/train/text_sample.h"
#include "support/temp_dir.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using meshtrain::testing::gpt2_mapped;
using meshtrain::testing::TempDir;
using meshtrain::testing::tiny_gpt2_files;

TEST(Gpt2Bpe, ByteMapIsGpt2s) {
  const std::vector<uint32_t> cp = gpt2_byte_to_codepoint();
  EXPECT_EQ(cp['A'], uint32_t{'A'});
  EXPECT_EQ(cp[' '], 0x120u);  // 'Ġ'
  EXPECT_EQ(cp['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(cp[0], 0x100u);
  EXPECT_EQ(cp[0xAD], 0x143u);  // the soft hyphen is not printable: the last one mapped
}

TEST(Gpt2Bpe, MergesByRankWithinPreTokens) {
  const auto tok = make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny");
  EXPECT_EQ(tok->kind(), "gpt2-bpe");
  EXPECT_EQ(tok->vocab_size(), 256u + 9 + 1);
  // "hello" -> hello (259), " world" -> " world" (264), "!" is a byte.
  EXPECT_EQ(tok->encode("hello world!"), (std::vector<uint32_t>{259, 264, '!'}));
  // "hellohello" is one pre-token: merges apply to both halves.
  EXPECT_EQ(tok->encode("hellohello"), (std::vector<uint32_t>{259, 259}));
  // The space before "hello" starts its pre-token (" hello"): no merge of " h".
  EXPECT_EQ(tok->encode(" hello"), (std::vector<uint32_t>{' ', 259}));
  // Digits and letters are separate pre-tokens: "he1" -> he, 1.
  EXPECT_EQ(tok->encode("he1"), (std::vector<uint32_t>{256, '1'}));
  // "<|endoftext|>" in text is ordinary text, not the special token.
  EXPECT_EQ(tok->encode("<|endoftext|>").size(), 2u + 9 + 2);  // "<|", "endoftext", "|>"
}

TEST(Gpt2Bpe, DecodeInvertsEncode) {
  const auto tok = make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny");
  for (const std::string text :
       {"hello world", "  spaces\t\ttabs\n\nnewlines  ", "Zürich 日本語 😀 ½ e\u0301", "x"}) {
    EXPECT_EQ(tok->decode(tok->encode(text)), text);
  }
  EXPECT_EQ(tok->decode({265}), "<|endoftext|>");
  EXPECT_THROW(tok->decode({266}), std::out_of_range);
  EXPECT_THROW(tok->encode("caf\xe9"), std::invalid_argument);  // Latin-1, not UTF-8
}

// Runs as long as a chunk (2 MiB) of one character class: the regex engine's backtracking
// ('\s+(?!\S)' gives back one space) must not run out of stack.
TEST(Gpt2Bpe, LongRunsEncode) {
  const auto tok = make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny");
  const std::string spaces(2 << 20, ' '), letters(2 << 20, 'a');
  const std::string text = "x" + spaces + "y" + letters + "\n" + spaces;
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST(Gpt2Bpe, ConcurrentEncodesAgree) {
  const auto tok = make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "hello world, hello again " + std::to_string(i) + "\n";
  const std::vector<uint32_t> want = tok->encode(text);
  std::vector<std::vector<uint32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = tok->encode(text); });
  for (std::thread& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST(Gpt2Bpe, SavedJsonOpensToTheSameTokenizer) {
  TempDir dir;
  const auto tok = make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny");
  tok->save(dir.file("t.json"));
  const auto back = open_tokenizer(dir.file("t.json"));
  EXPECT_EQ(back->kind(), "gpt2-bpe");
  EXPECT_EQ(back->vocab_size(), tok->vocab_size());
  const std::string text = "hello world, héllo wörld 123";
  EXPECT_EQ(back->encode(text), tok->encode(text));
}

// Llama 3's tokenizer.json: a post-processor (a Sequence of ByteLevel and a TemplateProcessing
// [<|begin_of_text|>, $A]) starts every prompt with the special token, as HF's tokenizer does;
// the saved file keeps it, and a template meshtrain would not follow is refused.
TEST(Gpt2Bpe, PostProcessorsBeginOfTextStartsPrompts) {
  TempDir dir;
  Gpt2BpeFiles files = tiny_gpt2_files();
  files.added.emplace_back("<|begin_of_text|>", 300);
  const auto plain = make_gpt2_bpe_tokenizer(files, "tiny");
  plain->save(dir.file("plain.json"));
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.file("plain.json")));
  EXPECT_FALSE(j.contains("post_processor"));
  j["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300], "tokens": ["<|begin_of_text|>"]}}}]})");
  std::ofstream(dir.file("llama.json")) << j.dump();
  const auto llama = open_tokenizer(dir.file("llama.json"));
  ASSERT_TRUE(llama->begin_of_text().has_value());
  EXPECT_EQ(*llama->begin_of_text(), 300u);
  ModelSpec m;
  m.vocab_size = 512;
  const std::vector<int32_t> prompt = encode_prompt(*llama, "hello", m, "--prompt", nullptr);
  ASSERT_GE(prompt.size(), 2u);
  EXPECT_EQ(prompt[0], 300);
  std::vector<uint32_t> rest(prompt.begin() + 1, prompt.end());
  EXPECT_EQ(rest, plain->encode("hello"));
  EXPECT_EQ(encode_prompt(*llama, "", m, "--prompt", nullptr), std::vector<int32_t>{300});
  EXPECT_FALSE(plain->begin_of_text().has_value());
  llama->save(dir.file("saved.json"));
  EXPECT_EQ(open_tokenizer(dir.file("saved.json"))->begin_of_text(), std::optional<uint32_t>(300));
  // A template that puts tokens after the text is not read as one that adds none.
  j["post_processor"]["processors"][1]["single"].push_back({{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}});
  std::ofstream(dir.file("suffix.json")) << j.dump();
  try {
    open_tokenizer(dir.file("suffix.json"));
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("suffix.json: post_processor.processors[1].single is"), std::string::npos) << e.what();
  }
}

TEST(Gpt2Bpe, RefusesIncompleteVocabularies) {
  Gpt2BpeFiles no_byte = tiny_gpt2_files();
  no_byte.vocab.erase(no_byte.vocab.begin() + 'q');
  try {
    make_gpt2_bpe_tokenizer(no_byte, "v.json");
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("v.json: the vocabulary lacks the token \"q\" for byte 113"),
              std::string::npos)
        << e.what();
  }
  Gpt2BpeFiles bad_merge = tiny_gpt2_files();
  bad_merge.merges.emplace_back("zz", "y");
  EXPECT_THROW(make_gpt2_bpe_tokenizer(bad_merge, "m.txt"), DataError);
  Gpt2BpeFiles huge_id = tiny_gpt2_files();
  huge_id.vocab.back().second = 0xFFFFFFFFu;
  EXPECT_THROW(make_gpt2_bpe_tokenizer(huge_id, "v.json"), DataError);
}

// A pre-tokenizer regex that backtracks without end (a nested quantifier on a text that almost
// matches) makes PCRE2 give up; the error names the tokenizer's file, and prepare adds the text
// it was tokenizing: a user can find the file, where this was "internal error ... match limit
// exceeded" from nowhere.
TEST(Gpt2Bpe, RegexThatGivesUpNamesTheTokenizer) {
  Gpt2BpeFiles files = tiny_gpt2_files();
  files.pattern = "(a+)+$";
  const auto tok = make_gpt2_bpe_tokenizer(files, "evil/tokenizer.json");
  const std::string text = std::string(40, 'a') + "!";
  try {
    tok->encode(text);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("evil/tokenizer.json: the pre-tokenizer regex failed at byte 0", 0), 0u) << what;
    EXPECT_NE(what.find("limit"), std::string::npos) << what;
    EXPECT_NE(what.find("backtracks"), std::string::npos) << what;
  }
  TempDir dir;
  const std::string input = dir.path() + "/text.txt";
  std::FILE* f = std::fopen(input.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  try {
    PrepareOptions whole;  // the text in one piece: no validation part cut off its end
    whole.val_fraction = 0;
    prepare_text_files({input}, dir.path() + "/out", *tok, whole);
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(input + ": tokenizing the text from byte offset 0: evil/tokenizer.json: ", 0), 0u)
        << what;
  }
}

}  // namespace
}  // namespace meshtrain
