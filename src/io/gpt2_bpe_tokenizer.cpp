#include "meshtrain/io/gpt2_bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <nlohmann/json.hpp>
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/io/text_normalizer.h"
#include "meshtrain/io/utf8_text.h"
#include "added_token_finder.h"
#include "hf_regex.h"
#include "gpt2_bpe_reading.h"
#include "json_fields.h"

namespace meshtrain {

namespace {

// GPT-2's pre-tokenizer, as published in encoder.py. In PCRE2's UCP mode \s is Unicode
// whitespace, \p{L} / \p{N} are the Unicode letter and number categories.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The compiled pre-tokenizer; each encode() call has its own match data (thread-safe).
struct Pattern {
  pcre2_code* code = nullptr;
  Pattern(const std::string& regex, const std::string& where)
      : code(compile_hf_regex(regex, where, "the pre-tokenizer regex")) {}
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

// The largest id of the vocabulary and the added tokens, after checking each against the bound
// (gpt2_bpe_tokenizer.h) before anything of that size is allocated: a few bytes of JSON that
// say "id": 4000000000 must not become gigabytes of table.
uint32_t check_ids(const Gpt2BpeFiles& files, const std::string& where) {
  const uint64_t tokens = files.vocab.size() + files.added.size();
  const uint64_t bound = std::min<uint64_t>(2 * tokens, std::numeric_limits<uint32_t>::max());
  uint32_t largest = 0;
  const auto check = [&](const std::string& what, uint64_t id) {
    if (id >= bound)
      throw DataError(where, what + " has id " + std::to_string(id) + ", expected an id below " +
                                 std::to_string(bound) + " (twice the " + std::to_string(tokens) +
                                 " tokens of the vocabulary and added tokens together)");
    largest = std::max(largest, static_cast<uint32_t>(id));
  };
  for (const auto& [token, id] : files.vocab) check("token \"" + terminal_safe(token) + "\"", id);
  for (const AddedToken& t : files.added) check("added token \"" + terminal_safe(t.content) + "\"", t.id);
  return largest;
}

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const Gpt2BpeFiles& files, const std::string& where)
      : files_(files), where_(where),
        pattern_(files.pattern.empty() ? kGpt2Pattern : files.pattern, where),
        raw_added_(files.added, false), normalized_added_(files.added, true) {
    const std::vector<uint32_t> cps = gpt2_byte_to_codepoint();
    const uint32_t largest = check_ids(files, where);
    pieces_.resize(size_t{largest} + 1);
    special_.resize(pieces_.size());
    std::unordered_map<std::string, uint32_t> ids;
    for (const auto& [token, id] : files.vocab) {
      if (!pieces_[id].empty())
        throw DataError(where, "tokens \"" + terminal_safe(pieces_[id]) + "\" and \"" +
                                   terminal_safe(token) + "\" both have id " + std::to_string(id) +
                                   " (expected one id per token)");
      pieces_[id] = token;
      ids.emplace(token, id);
    }
    if (files.ignore_merges) whole_ = ids;
    std::unordered_map<std::string, uint32_t> added_ids;
    for (const AddedToken& t : files.added) {
      const std::string name = "added token \"" + terminal_safe(t.content) + "\" (id " +
                               std::to_string(t.id) + ")";
      if (t.content.empty()) throw DataError(where, name + " is empty (expected some text)");
      if (!added_ids.emplace(t.content, t.id).second)
        throw DataError(where, name + ": another added token has the same content (id " +
                                   std::to_string(added_ids[t.content]) + ")");
      const auto in_vocab = ids.find(t.content);
      if (in_vocab != ids.end() && in_vocab->second != t.id)
        throw DataError(where, name + " is vocabulary token " + std::to_string(in_vocab->second) +
                                   " (expected the id the vocabulary gives it)");
      if (in_vocab != ids.end()) continue;  // decoded as the vocabulary's token
      if (!pieces_[t.id].empty())
        throw DataError(where, name + " takes the id of \"" + terminal_safe(pieces_[t.id]) +
                                   "\" (expected one token per id)");
      pieces_[t.id] = t.content;
      special_[t.id] = true;
    }
    vocab_size_ = largest + 1;
    if (files.begin_of_text && (*files.begin_of_text >= pieces_.size() || pieces_[*files.begin_of_text].empty()))
      throw DataError(where, "the post-processor's first token, id " +
                                 std::to_string(*files.begin_of_text) +
                                 ", is neither in the vocabulary nor an added token");
    // The pretraining end-of-document marker by its spelling (its id differs per vocabulary);
    // Llama 3's chat-turn token <|eot_id|> is not one.
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>"})
      for (uint32_t id = 0; id < pieces_.size() && !end_of_text_; ++id)
        if (pieces_[id] == name) end_of_text_ = id;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, cps[b]);
      const auto it = ids.find(s);
      if (it == ids.end())
        throw DataError(where, "the vocabulary lacks the token \"" + s + "\" for byte " +
                                   std::to_string(b) +
                                   " (a GPT-2 byte-level vocabulary holds all 256 bytes)");
      byte_id_[b] = it->second;
      byte_of_cp_[cps[b]] = static_cast<unsigned char>(b);
    }
    for (size_t r = 0; r < files.merges.size(); ++r) {
      const auto& [a, b] = files.merges[r];
      const auto ia = ids.find(a), ib = ids.find(b), iab = ids.find(a + b);
      if (ia == ids.end() || ib == ids.end() || iab == ids.end())
        throw DataError(where, "merge " + std::to_string(r + 1) + " \"" + a + " " + b +
                                   "\" joins pieces that are not all in the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second),
                      Merge{static_cast<uint32_t>(r), iab->second});
    }
  }

  std::string kind() const override { return "gpt2-bpe"; }
  uint32_t vocab_size() const override { return vocab_size_; }
  std::string file_suffix() const override { return ".json"; }
  bool takes_any_bytes() const override { return false; }
  std::optional<uint32_t> end_of_text() const override { return end_of_text_; }

  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> out;
    if (!files_.normalizer && !files_.add_prefix_space && !raw_added_.finds_any() &&
        !normalized_added_.finds_any()) {
      encode_words(text, out);  // GPT-2, Llama 3: the text as it is, without a copy
      return out;
    }
    // HF's order (AddedVocabulary::extract_and_normalize, then the pre-tokenizer on each piece):
    // added tokens in the text as given, the normalizer on each piece between them, added tokens
    // in the normalized pieces, and ByteLevel's prefix space on each piece left.
    if (const size_t bad = first_non_text_byte(text); bad < text.size())
      throw std::invalid_argument("gpt2-bpe: the text is not UTF-8 without NUL bytes (at byte " +
                                  std::to_string(bad) + ")");
    for (const AddedTokenFinder::Piece& piece : raw_added_.split(text)) {
      if (piece.id) {
        out.push_back(*piece.id);
        continue;
      }
      const std::string normalized =
          files_.normalizer ? files_.normalizer->apply(piece.text) : std::string(piece.text);
      for (const AddedTokenFinder::Piece& sub : normalized_added_.split(normalized)) {
        if (sub.id) out.push_back(*sub.id);
        else if (files_.add_prefix_space && sub.text[0] != ' ') encode_words(" " + std::string(sub.text), out);
        else encode_words(sub.text, out);
      }
    }
    return out;
  }

  // Whether `prepare` may cut a text file into pieces (io/text_cut.h) and encode them apart.
  bool encodes_pieces_alike() const override {
    if (files_.add_prefix_space || (files_.normalizer && files_.normalizer->needs_whole_text()))
      return false;
    // An added token found in text that takes whitespace after it, or that holds a place
    // prepare cuts at (a space or a line feed with printable ASCII on both sides), could span a
    // cut; one of whitespace alone (GPT-NeoX's runs of spaces) cannot.
    return std::none_of(files_.added.begin(), files_.added.end(), [](const AddedToken& t) {
      const bool mixed = t.content.find_first_of(" \n") != std::string::npos &&
                         t.content.find_first_not_of(" \t\n\r") != std::string::npos;
      return !t.special && (t.rstrip || mixed);
    });
  }

 private:
  // GPT-2's pre-tokenizer and BPE over `text` (one piece), appended to `out`.
  void encode_words(std::string_view text, std::vector<uint32_t>& out) const {
    const Pattern& pattern = pattern_;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(pattern.code, nullptr);
    // Words repeat: a cache per call (callers pass MiB-sized chunks) keeps encode() free of
    // shared mutable state, so workers may call it concurrently.
    std::unordered_map<std::string_view, std::vector<uint32_t>> cache;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;
    // The first match checks that the whole text is UTF-8 (PCRE2's matching is undefined on
    // anything else); the later ones need not check again.
    uint32_t check = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(pattern.code, subject, text.size(), at, check, md, nullptr);
      check = PCRE2_NO_UTF_CHECK;
      if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one piece
      if (rc < 0) {
        const size_t bad = pcre2_get_startchar(md);  // PCRE2 puts a UTF error's offset here
        pcre2_match_data_free(md);
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
          throw std::invalid_argument("gpt2-bpe: the text is not UTF-8 (at byte " +
                                      std::to_string(bad) + ")");
        // The pattern is the tokenizer file's: a match that gives up (PCRE2's match or depth
        // limit, on a regex that backtracks catastrophically on this text) is a fault of that
        // file, so the message names it.
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        const bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                           rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT;
        throw DataError(where_, "the pre-tokenizer regex failed at byte " + std::to_string(at) +
                                    " of the text being encoded: " +
                                    reinterpret_cast<const char*>(message) +
                                    (limit ? " (the regex backtracks without end on this text; "
                                             "expected a pre-tokenizer pattern that matches in "
                                             "linear time, such as GPT-2's)"
                                           : ""));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      // Text between matches is a piece of its own (Hugging Face's Split, "Isolated"); GPT-2's
      // regex leaves none. An empty match moves on by one character.
      const size_t end = ov[1] > ov[0] ? ov[1] : next_char(text, ov[0]);
      for (const std::string_view word : {text.substr(at, ov[0] - at), text.substr(ov[0], end - ov[0])}) {
        if (word.empty()) continue;
        auto it = cache.find(word);
        if (it == cache.end()) it = cache.emplace(word, bpe(word)).first;
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
      at = end;
    }
    if (at < text.size()) {
      const std::vector<uint32_t> tail = bpe(text.substr(at));
      out.insert(out.end(), tail.begin(), tail.end());
    }
    pcre2_match_data_free(md);
  }

 public:

  bool has_token(uint32_t id) const override { return id < vocab_size_ && !pieces_[id].empty(); }

  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint32_t id = ids[i];
      if (id >= vocab_size_ || pieces_[id].empty())
        throw std::out_of_range("gpt2-bpe: token " + std::to_string(id) + " at position " +
                                std::to_string(i) + " is not in the vocabulary (size " +
                                std::to_string(vocab_size_) + ")");
      const std::string& p = pieces_[id];
      if (special_[id]) {
        out += p;
        continue;
      }
      // Each character of a piece stands for one byte (bytes_to_unicode inverted).
      for (size_t k = 0; k < p.size();) {
        const auto c = static_cast<unsigned char>(p[k]);
        const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
        for (size_t j = 1; j < len && k + j < p.size(); ++j)
          cp = (cp << 6) | (static_cast<unsigned char>(p[k + j]) & 0x3F);
        const auto b = byte_of_cp_.find(cp);
        if (b != byte_of_cp_.end()) out += static_cast<char>(b->second);
        else out.append(p, k, len);
        k += len;
      }
    }
    return out;
  }

  std::optional<uint32_t> begin_of_text() const override { return files_.begin_of_text; }

  void save(const std::string& path) const override {
    nlohmann::ordered_json j;
    j["version"] = "1.0";
    nlohmann::ordered_json added = nlohmann::ordered_json::array();
    for (const AddedToken& t : files_.added)
      added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", t.single_word},
                       {"lstrip", t.lstrip}, {"rstrip", t.rstrip}, {"normalized", t.normalized},
                       {"special", t.special}});
    j["added_tokens"] = added;
    if (files_.normalizer)
      j["normalizer"] = nlohmann::ordered_json::parse(files_.normalizer->json_text());
    if (files_.pattern.empty()) {
      j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", files_.add_prefix_space},
                            {"trim_offsets", true}, {"use_regex", true}};
    } else {
      nlohmann::ordered_json split = {{"type", "Split"},
                                      {"pattern", {{"Regex", files_.pattern}}},
                                      {"behavior", "Isolated"},
                                      {"invert", false}};
      nlohmann::ordered_json level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                      {"trim_offsets", true}, {"use_regex", false}};
      j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, level}}};
    }
    if (files_.begin_of_text) {
      const std::string& bos = pieces_[*files_.begin_of_text];
      nlohmann::ordered_json token, text, entry, processor;
      token["SpecialToken"] = {{"id", bos}, {"type_id", 0}};
      text["Sequence"] = {{"id", "A"}, {"type_id", 0}};
      entry["id"] = bos;
      entry["ids"] = nlohmann::ordered_json::array({*files_.begin_of_text});
      entry["tokens"] = nlohmann::ordered_json::array({bos});
      processor["type"] = "TemplateProcessing";
      processor["single"] = nlohmann::ordered_json::array({token, text});
      processor["special_tokens"][bos] = entry;
      j["post_processor"] = processor;
    }
    // GPT-2's decoder, every field present: HF's tokenizers refuses a ByteLevel without them.
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                    {"use_regex", true}};
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    for (const auto& [token, id] : files_.vocab) vocab[token] = id;
    nlohmann::ordered_json merges = nlohmann::ordered_json::array();
    for (const auto& [a, b] : files_.merges) merges.push_back(a + " " + b);
    j["model"] = {{"type", "BPE"}, {"ignore_merges", files_.ignore_merges}, {"vocab", vocab},
                  {"merges", merges}};
    std::ofstream out(path, std::ios::binary);
    out << j.dump();
    if (!out.flush()) throw DataError(path, "cannot write the tokenizer file");
  }

 private:
  struct Merge {
    uint32_t rank, result;
  };

  // encoder.py's bpe(): merge the lowest-ranked adjacent pair, every occurrence left to right,
  // until no adjacent pair is a merge.
  static size_t next_char(std::string_view t, size_t i) {
    for (++i; i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80;) ++i;
    return i;
  }

  std::vector<uint32_t> bpe(std::string_view word) const {
    if (!whole_.empty()) {
      std::string mapped;
      for (unsigned char b : word) mapped += pieces_[byte_id_[b]];
      const auto it = whole_.find(mapped);
      if (it != whole_.end()) return {it->second};
    }
    std::vector<uint32_t> s(word.size());
    for (size_t i = 0; i < word.size(); ++i) s[i] = byte_id_[static_cast<unsigned char>(word[i])];
    while (s.size() > 1) {
      uint32_t best = std::numeric_limits<uint32_t>::max(), a = 0, b = 0, merged = 0;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const auto it = merges_.find(pair_key(s[i], s[i + 1]));
        if (it != merges_.end() && it->second.rank < best) {
          best = it->second.rank;
          a = s[i];
          b = s[i + 1];
          merged = it->second.result;
        }
      }
      if (best == std::numeric_limits<uint32_t>::max()) break;
      size_t w = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[w++] = merged;
          ++i;
        } else {
          s[w++] = s[i];
        }
      }
      s.resize(w);
    }
    return s;
  }

  Gpt2BpeFiles files_;  // kept for save()
  std::string where_;   // the tokenizer file, named by errors of encode()
  Pattern pattern_;
  AddedTokenFinder raw_added_, normalized_added_;  // HF's two passes (encode())
  std::unordered_map<std::string, uint32_t> whole_;  // token -> id, for ignore_merges
  std::vector<std::string> pieces_;  // id -> token as stored (byte-mapped)
  std::vector<bool> special_;        // id -> added token, decoded verbatim
  std::optional<uint32_t> end_of_text_;
  std::unordered_map<uint32_t, unsigned char> byte_of_cp_;
  uint32_t byte_id_[256] = {};
  std::unordered_map<uint64_t, Merge> merges_;
  uint32_t vocab_size_ = 0;
};

std::string read_all(const std::string& path, const std::string& what) {
  std::string text;
  if (const std::string problem = read_regular_file(path, text); !problem.empty())
    throw DataError(path, problem + "; expected " + what);
  return text;
}

}  // namespace

std::vector<uint32_t> gpt2_byte_to_codepoint() {
  std::vector<uint32_t> cp(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

void check_json_file_size(const std::string& path, const std::string& what) {
  constexpr uintmax_t kMaxBytes = uintmax_t{1} << 30;
  std::error_code ec;
  if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec && size > kMaxBytes)
    throw DataError(path, "is " + std::to_string(size) + " bytes; expected " + what +
                              " of at most 1 GiB");
}

nlohmann::json parse_json_file(const std::string& path, const std::string& what) {
  check_json_file_size(path, what);
  try {
    return nlohmann::json::parse(read_all(path, what));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path, "is not valid JSON (" + terminal_safe(e.what()) + "); expected " + what);
  }
}

void read_gpt2_vocab(const nlohmann::json& v, const std::string& where,
                     const std::string& json_path, Gpt2BpeFiles& f) {
  const std::string name = json_path.empty() ? "the vocabulary" : json_path;
  if (!v.is_object())
    throw DataError(where, name + " is " + short_json(v) + ", expected a JSON object of token -> id");
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= std::numeric_limits<uint32_t>::max())
      throw DataError(where, (json_path.empty() ? "token" : json_path + " token") + " \"" +
                                 terminal_safe(token) + "\" has id " + short_json(id) +
                                 ", expected an integer from 0 below 2^32 - 1");
    f.vocab.emplace_back(token, id.get<uint32_t>());
  }
}

void add_gpt2_merge(const std::string& line, const std::string& where, size_t n, Gpt2BpeFiles& f) {
  const size_t sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string::npos)
    throw DataError(where, "merge " + std::to_string(n) + " \"" + terminal_safe(line) +
                               "\" is not two tokens separated by one space");
  f.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
}

std::unique_ptr<Tokenizer> make_gpt2_bpe_tokenizer(const Gpt2BpeFiles& files,
                                                   const std::string& where) {
  return std::make_unique<Gpt2BpeTokenizer>(files, where);
}

std::unique_ptr<Tokenizer> open_gpt2_bpe_files(const std::string& vocab_json,
                                               const std::string& merges_txt) {
  Gpt2BpeFiles f;
  read_gpt2_vocab(parse_json_file(vocab_json, "a GPT-2 vocab.json (token -> id)"), vocab_json, "", f);
  std::istringstream lines(read_all(merges_txt, "a GPT-2 merges.txt"));
  size_t n = 0;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    add_gpt2_merge(line, merges_txt, ++n, f);
  }
  return make_gpt2_bpe_tokenizer(f, vocab_json + "," + merges_txt);
}

}  // namespace meshtrain
