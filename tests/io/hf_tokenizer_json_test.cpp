// tokenizer.json fields, each applied as Hugging Face's tokenizers library applies it or refused
// by name (io/hf_tokenizer_json.cpp): normalizers, ByteLevel's add_prefix_space, added tokens
// found in text, and the refusals of dropout, post-processors that add tokens, malformed added
// tokens, ids that would take gigabytes, and fields of the wrong type. The expectations are
// worked out by hand on tests/support/tiny_gpt2.h's vocabulary (the merges make "hello" 259).

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/gpt2_bpe_tokenizer.h"
#include "meshtrain/io/prepare.h"
#include "meshtrain/io/token_shard.h"
#include "meshtrain/io/tokenizer.h"
#include "support/temp_dir.h"
#include "support/tiny_gpt2.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;
using meshtrain::testing::TempDir;
using meshtrain::testing::tiny_gpt2_files;

constexpr uint32_t kHello = 259;

// The tiny vocabulary as a tokenizer.json (what save() writes: no normalizer, ByteLevel).
json tiny_json() {
  TempDir dir;
  make_gpt2_bpe_tokenizer(tiny_gpt2_files(), "tiny")->save(dir.file("t.json"));
  return json::parse(std::ifstream(dir.file("t.json")));
}

struct Opened {
  std::unique_ptr<Tokenizer> tok;
  std::string error;  // the DataError's message, when it was refused
};

Opened open_json(const json& j, const std::string& name = "tokenizer.json") {
  TempDir dir;
  std::ofstream(dir.file(name)) << j.dump();
  try {
    return {open_tokenizer(dir.file(name)), ""};
  } catch (const DataError& e) {
    const std::string what = e.what();
    const size_t at = what.find(name + ": ");  // from the file's name on: the path is a temp dir
    return {nullptr, at == std::string::npos ? what : what.substr(at)};
  }
}

std::string refusal(const json& j) {
  Opened o = open_json(j);
  return o.tok ? "(opened)" : o.error;
}

#define EXPECT_REFUSED(j, text) EXPECT_NE(refusal(j).find(text), std::string::npos) << refusal(j)

std::vector<uint32_t> encode(const json& j, const std::string& text) {
  Opened o = open_json(j);
  if (!o.tok) ADD_FAILURE() << o.error;
  return o.tok ? o.tok->encode(text) : std::vector<uint32_t>{};
}

std::vector<uint32_t> bytes(const std::string& text) {
  std::vector<uint32_t> ids;
  for (const unsigned char b : text) ids.push_back(b);  // the tiny vocabulary's byte ids
  return ids;
}

TEST(HfTokenizerJson, QwensNfcComposesBeforeTheBpe) {
  json j = tiny_json();
  j["normalizer"] = {{"type", "NFC"}};
  // "e" + U+0301 composes to "é" (U+00E9: bytes C3 A9), as HF's NFC does.
  EXPECT_EQ(encode(j, "caf" "e\xCC\x81"), bytes("caf\xC3\xA9"));
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(encode(j, "\xEF\xBD\x88\xEF\xBD\x85llo"), std::vector<uint32_t>{kHello});  // fullwidth "he"
  j["normalizer"] = {{"type", "NFD"}};
  EXPECT_EQ(encode(j, "\xC3\xA9"), bytes("e\xCC\x81"));
}

TEST(HfTokenizerJson, SequenceOfLowercaseReplaceStripPrepend) {
  json j = tiny_json();
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Strip", "strip_left": true, "strip_right": true},
      {"type": "Lowercase"},
      {"type": "Replace", "pattern": {"String": "J"}, "content": "h"},
      {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "o"},
      {"type": "Prepend", "prepend": "x"}]})");
  // "\u3000 JELL42 \n" -> "JELL42" -> "jell42" -> (no 'J' left) -> "jello" -> "xjello": the
  // merges make "ll" (257) alone.
  EXPECT_EQ(encode(j, "\xE3\x80\x80 JELL42 \n"), (std::vector<uint32_t>{'x', 'j', 'e', 257, 'o'}));
  j["normalizer"]["normalizers"][2] = json::parse(R"({"type": "Replace", "pattern": {"String": "j"}, "content": "h"})");
  EXPECT_EQ(encode(j, "JELL42"), (std::vector<uint32_t>{'x', kHello}));  // "xhello"
  // Prepend leaves empty text empty; Strip makes whitespace empty.
  EXPECT_EQ(encode(j, "  "), std::vector<uint32_t>{});
}

// HF runs regexes with Oniguruma (Ruby syntax), where $ and ^ match at every line's end and start;
// what the two dialects read differently is refused.
TEST(HfTokenizerJson, RegexesMeanWhatTheyMeanToOniguruma) {
  json j = tiny_json();
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"Regex": "x$"}, "content": "!"})");
  EXPECT_EQ(encode(j, "ax\nbx"), bytes("a!\nb!"));
  j["normalizer"]["pattern"]["Regex"] = "\\h+";
  EXPECT_REFUSED(j, "holds \\h at offset 0 (a hex digit to Oniguruma, horizontal space to PCRE2)");
  j["normalizer"]["pattern"]["Regex"] = "(?m:a.b)";
  EXPECT_REFUSED(j, "holds the inline option (?m at offset 0");
}

TEST(HfTokenizerJson, NormalizersMeshtrainDoesNotApplyAreRefusedByName) {
  json j = tiny_json();
  j["normalizer"] = json::parse(R"({"type": "BertNormalizer", "clean_text": true, "lowercase": true})");
  EXPECT_REFUSED(j, "tokenizer.json: normalizer.type = \"BertNormalizer\" is a normalizer meshtrain "
                    "does not apply; meshtrain applies the normalizers NFC, NFD, NFKC, NFKD");
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Precompiled", "precompiled_charsmap": "AAAA"}]})");
  EXPECT_REFUSED(j, "normalizer.normalizers[1].type = \"Precompiled\" is a normalizer");
  j["normalizer"] = json::parse(R"({"type": "Strip", "strip_left": "yes", "strip_right": true})");
  EXPECT_REFUSED(j, "normalizer.strip_left = \"yes\" is not true or false");
  j["normalizer"] = json::parse(R"({"type": "Lowercase", "turkish": true})");
  EXPECT_REFUSED(j, "normalizer.turkish = true is not a field meshtrain applies");
  j["normalizer"] = json::parse(R"({"type": "Replace", "pattern": {"Regex": "x*"}, "content": "y"})");
  EXPECT_REFUSED(j, "normalizer.pattern = {\"Regex\": \"x*\"} matches empty text");
}

TEST(HfTokenizerJson, ByteLevelPrefixSpaceIsApplied) {
  json j = tiny_json();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  // " hello": the space is a pre-token's start (GPT-2's regex " ?\p{L}+"), and no merge joins
  // " h": a space token, then hello.
  EXPECT_EQ(encode(j, "hello"), (std::vector<uint32_t>{' ', kHello}));
  EXPECT_EQ(encode(j, " hello"), (std::vector<uint32_t>{' ', kHello}));
  j["pre_tokenizer"]["add_prefix_space"] = "no";
  EXPECT_REFUSED(j, "pre_tokenizer.add_prefix_space = \"no\" is not true or false");
}

// Qwen 3's <think>: an added token that is not special is found in text, as HF finds it; a
// special one never is (meshtrain encodes as HF with split_special_tokens).
TEST(HfTokenizerJson, AddedTokensThatAreNotSpecialAreFoundInText) {
  json j = tiny_json();
  j["added_tokens"] = json::parse(R"([
      {"id": 266, "content": "<think>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false},
      {"id": 267, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 268, "content": "ab", "single_word": true, "lstrip": true, "rstrip": true, "normalized": false, "special": false}])");
  EXPECT_EQ(encode(j, "hello<think>hello"), (std::vector<uint32_t>{kHello, 266, kHello}));
  EXPECT_EQ(encode(j, "<s>"), bytes("<s>"));
  // single_word: not inside "cab"; lstrip and rstrip take the spaces around it.
  EXPECT_EQ(encode(j, "cab"), bytes("cab"));
  EXPECT_EQ(encode(j, "hello  ab  hello"), (std::vector<uint32_t>{kHello, 268, kHello}));
  // A word character is the regex \w's, as HF tests it: a combining accent is one ("e" U+0301
  // "ab"), '!' is not.
  EXPECT_EQ(encode(j, "e\xCC\x81" "ab"), bytes("e\xCC\x81" "ab"));
  EXPECT_EQ(encode(j, "!ab"), (std::vector<uint32_t>{'!', 268}));
  // normalized: found after the normalizer, so "AB" lowercased is the token.
  j["added_tokens"][2]["normalized"] = true;
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_EQ(encode(j, "x AB"), (std::vector<uint32_t>{'x', 268}));
}

// An added token as HF saves one (every flag present), special.
json added(json id, const std::string& content) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

TEST(HfTokenizerJson, MalformedAddedTokensAreRefused) {
  const auto with = [](std::vector<json> tokens) {
    json k = tiny_json();
    k["added_tokens"] = tokens;
    return k;
  };
  EXPECT_REFUSED(with({added(1099511627776u, "<a>")}),
                 "added_tokens[0].id = 1099511627776 is out of range");
  EXPECT_REFUSED(with({added(-1, "<a>")}), "added_tokens[0].id = -1 is out of range");
  EXPECT_REFUSED(with({added(300, "<a>"), added(300, "<b>")}),
                 "added token \"<b>\" (id 300) takes the id of \"<a>\"");
  EXPECT_REFUSED(with({added(300, "<a>"), added(301, "<a>")}),
                 "added token \"<a>\" (id 301): another added token has the same content (id 300)");
  json no_content = added(300, "<a>");
  no_content.erase("content");
  EXPECT_REFUSED(with({no_content}), "added_tokens[0].content is missing");
  json yes = added(300, "<a>");
  yes["special"] = "yes";
  EXPECT_REFUSED(with({yes}), "added_tokens[0].special = \"yes\" is not true or false");
  json no_flag = added(300, "<a>");
  no_flag.erase("single_word");
  no_flag["special"] = false;
  EXPECT_REFUSED(with({no_flag}), "added_tokens[0].single_word is missing; expected true or false");
  // What meshtrain's save() wrote before (id, content, special): still read.
  EXPECT_EQ(refusal(with({{{"id", 300}, {"content", "<a>"}, {"special", true}}})), "(opened)");
  EXPECT_REFUSED(with({added(300, "hello")}), "added token \"hello\" (id 300) is vocabulary token 259");
  // The end-of-text token, once an added token, still ends documents.
  EXPECT_EQ(open_json(with({added(265, "<|endoftext|>")})).tok->end_of_text(),
            std::optional<uint32_t>(265));
}

// 5 kB of JSON with one id of 200,000,000 took 32 s and 6.3 GB; an id in [2^31, 2^32) ended in
// std::bad_alloc. Ids are bounded by the number of tokens before anything is allocated.
TEST(HfTokenizerJson, HugeIdsAreRefusedBeforeAllocating) {
  for (const uint64_t id : {uint64_t{200000000}, uint64_t{2147483653}, uint64_t{4294967294}}) {
    json j = tiny_json();
    j["model"]["vocab"]["hello"] = id;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_REFUSED(j, "token \"hello\" has id " + std::to_string(id) +
                          ", expected an id below 532 (twice the 266 tokens");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    json a = tiny_json();
    a["added_tokens"] = {added(id, "<a>")};
    EXPECT_REFUSED(a, "added token \"<a>\" has id " + std::to_string(id) + ", expected an id below 534");
  }
  json j = tiny_json();
  j["model"]["vocab"]["hello"] = 4294967296;
  EXPECT_REFUSED(j, "model.vocab token \"hello\" has id 4294967296, expected an integer from 0 below 2^32 - 1");
  j["model"]["vocab"]["hello"] = 0;
  EXPECT_REFUSED(j, "tokens \"");  // two tokens, one id
}

TEST(HfTokenizerJson, ModelFieldsAreAppliedOrRefused) {
  json j = tiny_json();
  j["model"]["ignore_merges"] = "yes";
  EXPECT_REFUSED(j, "tokenizer.json: model.ignore_merges = \"yes\" is not true or false");
  j = tiny_json();
  j["model"]["dropout"] = 0.1;
  EXPECT_REFUSED(j, "model.dropout = 0.1 is BPE dropout, which meshtrain does not apply");
  j["model"]["dropout"] = 0.0;
  EXPECT_EQ(refusal(j), "(opened)");
  j["model"]["dropout"] = nullptr;
  j["model"]["unk_token"] = nullptr;
  j["model"]["fuse_unk"] = false;
  j["model"]["byte_fallback"] = false;
  j["model"]["continuing_subword_prefix"] = "";
  EXPECT_EQ(refusal(j), "(opened)");
  j["model"]["continuing_subword_prefix"] = "##";
  EXPECT_REFUSED(j, "model.continuing_subword_prefix = \"##\" is not applied");
  j = tiny_json();
  j["model"]["end_of_word_suffix"] = "</w>";
  EXPECT_REFUSED(j, "model.end_of_word_suffix = \"</w>\" is not applied");
  j = tiny_json();
  j["model"]["fuse_unk"] = 1;
  EXPECT_REFUSED(j, "model.fuse_unk = 1 is not true or false");
  j = tiny_json();
  j["model"]["cache_capacity"] = 10;
  EXPECT_REFUSED(j, "model.cache_capacity = 10 is not a field meshtrain applies");
}

TEST(HfTokenizerJson, PostProcessorsThatAddTokensAreRefused) {
  json j = tiny_json();
  j["post_processor"] = json::parse(R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                                        "trim_offsets": true, "add_prefix_space": true})");
  EXPECT_REFUSED(j, "post_processor.type = \"RobertaProcessing\" is a post-processor meshtrain does not apply");
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [{"type": "BertProcessing"}]})");
  EXPECT_REFUSED(j, "post_processor.processors[0].type = \"BertProcessing\"");
  j["post_processor"] = json::parse(R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})");
  EXPECT_EQ(refusal(j), "(opened)");
}

TEST(HfTokenizerJson, OtherTopLevelFieldsAreAppliedOrRefused) {
  json j = tiny_json();
  j["truncation"] = json::parse(R"({"direction": "Right", "max_length": 512, "strategy": "LongestFirst", "stride": 0})");
  EXPECT_REFUSED(j, "truncation = {\"direction\": \"Right\"");
  EXPECT_REFUSED(j, "is not applied: meshtrain keeps every token of a text; expected null");
  j = tiny_json();
  j["padding"] = json::parse(R"({"strategy": "BatchLongest", "pad_id": 0})");
  EXPECT_REFUSED(j, "padding = ");
  j = tiny_json();
  j["decoder"] = json::parse(R"({"type": "WordPiece", "prefix": "##"})");
  EXPECT_REFUSED(j, "decoder = {\"prefix\": \"##\", \"type\": \"WordPiece\"} is not applied");
  j.erase("decoder");
  EXPECT_REFUSED(j, "decoder is missing or null: HF would decode to the byte-level pieces");
  j["decoder"] = {{"type", "ByteLevel"}};  // what meshtrain's save() wrote before: still read
  EXPECT_EQ(refusal(j), "(opened)");
  j = tiny_json();
  j["pre_tokenizer"].erase("trim_offsets");
  EXPECT_REFUSED(j, "pre_tokenizer.trim_offsets is missing; expected true or false");
  j = tiny_json();
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  EXPECT_REFUSED(j, "the pre-tokenizer is {\"type\": \"Whitespace\"}, not ByteLevel");
  j = tiny_json();
  j["extra"] = 1;
  EXPECT_REFUSED(j, "tokenizer.json: extra = 1 is not a field meshtrain applies");
  j = tiny_json();
  j["version"] = 1;
  EXPECT_REFUSED(j, "version = 1 is not a string");
}

// JSON nested a million deep neither overflows the stack (parsing, freeing, the message) nor
// passes: it is a field of the wrong kind like any other.
TEST(HfTokenizerJson, DeepNestingIsAnError) {
  json j = tiny_json();
  j.erase("decoder");
  std::string plain = j.dump();
  plain.insert(plain.size() - 1, ", \"decoder\": " + std::string(1000000, '[') + std::string(1000000, ']'));
  TempDir dir;
  std::ofstream(dir.file("deep.json")) << plain;
  try {
    open_tokenizer(dir.file("deep.json"));
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("decoder is [[[[...]]]], expected a JSON object"), std::string::npos)
        << e.what();
  }
}

// A JSON file over 1 GiB is refused before it is parsed (a sparse file: no disk is used).
TEST(HfTokenizerJson, HugeFilesAreRefusedBeforeParsing) {
  TempDir dir;
  std::ofstream(dir.file("big.json")) << "{\"model\": {";
  std::filesystem::resize_file(dir.file("big.json"), (uint64_t{1} << 30) + 1);
  try {
    open_tokenizer(dir.file("big.json"));
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: is 1073741825 bytes; expected a tokenizer.json "
                                         "or vocab.json of at most 1 GiB"),
              std::string::npos) << e.what();
  }
}

// A tokenizer that looks at a text's ends cannot take a text file in pieces: prepare refuses it
// and takes JSON Lines, whose documents it encodes whole.
TEST(HfTokenizerJson, PrepareTakesWholeTextTokenizersOnlyAsDocuments) {
  json j = tiny_json();
  j["normalizer"] = {{"type", "Prepend"}, {"prepend", "x"}};
  const Opened o = open_json(j);
  ASSERT_TRUE(o.tok) << o.error;
  EXPECT_FALSE(o.tok->encodes_pieces_alike());
  TempDir dir;
  std::ofstream(dir.file("a.txt")) << "hello hello\n";
  try {
    prepare_text_files({dir.file("a.txt")}, dir.file("out"), *o.tok, PrepareOptions{});
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("a.txt: is a text file, which prepare tokenizes in pieces"),
              std::string::npos) << e.what();
  }
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_TRUE(open_json(j).tok->encodes_pieces_alike());
  // GPT-NeoX's added runs of spaces cannot span a cut; a token of a space and a letter can.
  json spaces = added(266, "    ");
  spaces["special"] = false;
  j["added_tokens"] = {spaces};
  EXPECT_TRUE(open_json(j).tok->encodes_pieces_alike());
  j["added_tokens"][0]["content"] = "a b";
  EXPECT_FALSE(open_json(j).tok->encodes_pieces_alike());
  j["added_tokens"][0]["content"] = "<think>";
  j["added_tokens"][0]["rstrip"] = true;
  EXPECT_FALSE(open_json(j).tok->encodes_pieces_alike());
}

// Llama 3's post-processor puts <|begin_of_text|> before every text HF encodes: prepare puts it
// before every document (each JSON Lines document; a text file's training and validation parts),
// as the end-of-text token after each.
TEST(HfTokenizerJson, PrepareBeginsEveryDocumentWithTheTemplatesToken) {
  json j = tiny_json();
  j["added_tokens"] = {added(266, "<|begin_of_text|>")};
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [266], "tokens": ["<|begin_of_text|>"]}}})");
  const Opened o = open_json(j);
  ASSERT_TRUE(o.tok) << o.error;
  TempDir dir;
  std::ofstream(dir.file("d.jsonl")) << "{\"text\": \"hello\"}\n{\"text\": \"\"}\n{\"text\": \"hello!\"}\n";
  std::ofstream(dir.file("t.txt")) << "hello";
  PrepareOptions opt;
  opt.val_fraction = 0;
  opt.end_of_text = 265;
  const auto tokens = [](const std::string& path) {
    const TokenShard s = TokenShard::open(path);
    std::vector<uint32_t> t;
    for (int64_t i = 0; i < s.size(); ++i) t.push_back(s.token(i));
    return t;
  };
  const PrepareResult docs = prepare_text_files({dir.file("d.jsonl")}, dir.file("d"), *o.tok, opt);
  EXPECT_EQ(tokens(docs.train_path), (std::vector<uint32_t>{266, kHello, 265, 266, kHello, '!', 265}));
  const PrepareResult text = prepare_text_files({dir.file("t.txt")}, dir.file("t"), *o.tok, opt);
  EXPECT_EQ(tokens(text.train_path), (std::vector<uint32_t>{266, kHello, 265}));
}

}  // namespace
}  // namespace meshtrain
