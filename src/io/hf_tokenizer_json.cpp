// Reading a Hugging Face tokenizer.json into a GPT-2 byte-level BPE (io/gpt2_bpe_tokenizer.h).
// Every field of the file is either applied as HF's tokenizers library applies it or refused,
// naming the file, the field's JSON path, its value and what is accepted: a field meshtrain
// passed over silently would make `prepare` write other tokens than the model was trained on.
// Fields that cannot change what encode() and decode() give (offsets, type ids, a pair
// template, the unknown token of a vocabulary that holds every byte) are checked for type only.

#include <nlohmann/json.hpp>

#include <limits>

#include "gpt2_bpe_reading.h"
#include "json_fields.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/gpt2_bpe_tokenizer.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/io/text_normalizer.h"

namespace meshtrain {

namespace {

using json = nlohmann::json;

const char* const kAccepted =
    " (meshtrain reads byte-level BPE tokenizer.json files: model.type \"BPE\" and a "
    "ByteLevel pre-tokenizer (GPT-2), or a Split by regex then ByteLevel (LLaMA 3, Qwen 2))";
constexpr uint64_t kIdLimit = std::numeric_limits<uint32_t>::max();
const char* const kIdWhy = "a 32-bit token id";

// A field whose only accepted values change nothing: `accepted(value)` says which.
template <class Accepted>
void require_neutral(JsonFields& f, const std::string& key, Accepted accepted,
                     const std::string& problem) {
  if (const json* v = f.optional(key); v != nullptr && !accepted(*v)) f.fail(key, *v, problem);
}

void read_model(const json& model, const std::string& path, Gpt2BpeFiles& f) {
  JsonFields m(model, path, "model");
  const json* type = m.optional("type");
  if (type == nullptr || *type != "BPE")
    throw DataError(path, "model.type = " + (type ? short_json(*type) : std::string("(none)")) +
                              " is not \"BPE\"" + kAccepted);
  require_neutral(m, "dropout", [](const json& v) { return v.is_number() && v.get<double>() == 0; },
                  "is BPE dropout, which meshtrain does not apply (it tokenizes deterministically, "
                  "as HF does without dropout); expected null or 0");
  // Every byte is a token (the tokenizer checks), so nothing is ever unknown: the unknown token,
  // fusing unknowns and byte fallback change nothing.
  m.string("unk_token");
  m.boolean("fuse_unk");
  m.boolean("byte_fallback");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const std::optional<std::string> a = m.string(affix); a && !a->empty())
      m.fail(affix, *a, "is not applied by meshtrain (a byte-level BPE has no word affixes); "
                        "expected null or \"\"");
  f.ignore_merges = m.boolean("ignore_merges").value_or(false);
  read_gpt2_vocab(m.required("vocab", "an object of token -> id"), path, "model.vocab", f);
  const json& merges = m.required("merges", "an array of merges");
  if (!merges.is_array()) m.fail("merges", merges, "is not an array" + std::string(kAccepted));
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& one = merges[i];
    if (one.is_string()) {
      add_gpt2_merge(one.get<std::string>(), path, i + 1, f);
    } else if (one.is_array() && one.size() == 2 && one[0].is_string() && one[1].is_string()) {
      f.merges.emplace_back(one[0].get<std::string>(), one[1].get<std::string>());  // newer form
    } else {
      throw DataError(path, "model.merges[" + std::to_string(i) + "] = " + short_json(one) +
                                " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  m.refuse_unknown("a BPE model has type, dropout, unk_token, continuing_subword_prefix, "
                   "end_of_word_suffix, fuse_unk, byte_fallback, ignore_merges, vocab, merges");
}

enum class Fields { AsHfWants, MayLack };

// A ByteLevel pre-tokenizer, post-processor or decoder: whether it adds a prefix space, whether
// it uses GPT-2's regex. trim_offsets changes offsets only. HF wants add_prefix_space and
// trim_offsets; a decoder may lack them (meshtrain's save() wrote {"type": "ByteLevel"} before
// it wrote them, and a decoder reads neither).
std::pair<bool, bool> read_byte_level(JsonFields& b, Fields fields = Fields::AsHfWants) {
  if (fields == Fields::AsHfWants) {
    b.required("add_prefix_space", "true or false");
    b.required("trim_offsets", "true or false");
  }
  const bool prefix = b.boolean("add_prefix_space").value_or(true);
  b.boolean("trim_offsets");
  const bool regex = b.boolean("use_regex").value_or(true);
  b.refuse_unknown("ByteLevel has add_prefix_space, trim_offsets, use_regex");
  return {prefix, regex};
}

void read_split(const json& split, const std::string& path, const std::string& at, Gpt2BpeFiles& f) {
  JsonFields s(split, path, at);
  if (s.string("type") != "Split")
    throw DataError(path, at + " is not a Split pre-tokenizer" + kAccepted);
  JsonFields pattern(s.required("pattern", "{\"Regex\": ...}"), path, at + ".pattern");
  const std::optional<std::string> regex = pattern.string("Regex");
  if (!regex)
    throw DataError(path, at + ".pattern has no \"Regex\" (a Split by a string is not applied)" +
                              std::string(kAccepted));
  pattern.refuse_unknown("a Split's pattern is {\"Regex\": ...}");
  if (const std::optional<std::string> behavior = s.string("behavior"); behavior != "Isolated")
    s.fail("behavior", behavior ? json(*behavior) : json(), "is not applied; expected \"Isolated\"");
  if (s.boolean("invert").value_or(false))
    s.fail("invert", true, "is not applied; expected false");
  s.refuse_unknown("a Split has type, pattern, behavior, invert");
  f.pattern = *regex;
}

void read_pre_tokenizer(const json& pre, const std::string& path, Gpt2BpeFiles& f) {
  JsonFields p(pre, path, "pre_tokenizer");
  const std::optional<std::string> type = p.string("type");
  if (type == "Sequence") {
    // LLaMA 3 / Qwen 2: Split by their own regex, then ByteLevel without GPT-2's.
    const json& list = p.required("pretokenizers", "an array of pre-tokenizers");
    if (!list.is_array() || list.size() != 2)
      throw DataError(path, "the pre-tokenizer Sequence is not [Split(Regex, Isolated), "
                            "ByteLevel(use_regex false)]" + std::string(kAccepted));
    read_split(list[0], path, "pre_tokenizer.pretokenizers[0]", f);
    JsonFields level(list[1], path, "pre_tokenizer.pretokenizers[1]");
    if (level.string("type") != "ByteLevel")
      throw DataError(path, "pre_tokenizer.pretokenizers[1] is not ByteLevel" + std::string(kAccepted));
    const auto [prefix, regex] = read_byte_level(level);
    if (regex || prefix)
      throw DataError(path, std::string("pre_tokenizer.pretokenizers[1].") +
                                (regex ? "use_regex" : "add_prefix_space") +
                                " is true: after a Split, meshtrain applies ByteLevel with "
                                "use_regex and add_prefix_space false" + kAccepted);
    p.refuse_unknown("a Sequence has type, pretokenizers");
    return;
  }
  if (type != "ByteLevel")
    throw DataError(path, "the pre-tokenizer is " + short_json(pre) + ", not ByteLevel with "
                          "GPT-2's regex" + std::string(kAccepted));
  const auto [prefix, regex] = read_byte_level(p);
  if (!regex)
    throw DataError(path, "pre_tokenizer.use_regex is false with no Split before it: the "
                          "pre-tokenizer is not ByteLevel with GPT-2's regex" + std::string(kAccepted));
  f.add_prefix_space = prefix;
}

void read_added_tokens(const json& list, const std::string& path, Gpt2BpeFiles& f) {
  if (!list.is_array())
    throw DataError(path, "added_tokens = " + short_json(list) + " is not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = "added_tokens[" + std::to_string(i) + "]";
    JsonFields a(list[i], path, at);
    AddedToken t;
    a.required("id", "an integer");
    t.id = static_cast<uint32_t>(*a.integer("id", kIdLimit, kIdWhy));
    a.required("content", "a string");
    t.content = *a.string("content");
    // HF wants every flag (it has no default for a missing one, and refuses the file). A special
    // token may lack the four that say how it is found in text, which meshtrain never does:
    // meshtrain's save() wrote only id, content and special before, and runs hold such files.
    a.required("special", "true or false");
    t.special = *a.boolean("special");
    const auto flag = [&](const char* key) {
      if (!t.special) a.required(key, "true or false");
      return a.boolean(key).value_or(false);
    };
    t.single_word = flag("single_word");
    t.lstrip = flag("lstrip");
    t.rstrip = flag("rstrip");
    t.normalized = flag("normalized");
    a.refuse_unknown("an added token has id, content, single_word, lstrip, rstrip, normalized, "
                     "special");
    f.added.push_back(std::move(t));
  }
}

// The token a TemplateProcessing puts first (Gpt2BpeFiles::begin_of_text), if any. A template
// that adds a token elsewhere is refused: prompts would be encoded unlike HF's.
std::optional<uint32_t> read_template(JsonFields& t, const std::string& path, const std::string& at) {
  const json& single = t.required("single", "a template");
  const auto refuse = [&](const std::string& why) {
    return DataError(path, at + ".single is " + short_json(single) + ": " + why +
                               " (meshtrain reads a template of [one special token, $A], as Llama "
                               "3's, or [$A])");
  };
  if (!single.is_array() || single.empty() || !single.back().is_object() ||
      !single.back().contains("Sequence") || !single.back()["Sequence"].is_object() ||
      single.back()["Sequence"].value("id", json()) != "A")
    throw refuse("the text is not its last piece");
  if (const json* pair = t.optional("pair"); pair && !pair->is_array())
    t.fail("pair", *pair, "is not an array");  // meshtrain never encodes pairs
  const json* specials = t.optional("special_tokens");
  if (specials && !specials->is_object())
    t.fail("special_tokens", *specials, "is not an object");
  t.refuse_unknown("a TemplateProcessing has type, single, pair, special_tokens");
  if (single.size() == 1) return std::nullopt;
  if (single.size() != 2 || !single[0].is_object() || !single[0].contains("SpecialToken") ||
      !single[0]["SpecialToken"].is_object() || !single[0]["SpecialToken"].contains("id") ||
      !single[0]["SpecialToken"]["id"].is_string())
    throw refuse("more than one token before the text");
  const std::string name = single[0]["SpecialToken"]["id"].get<std::string>();
  const json* entry = specials && specials->contains(name) ? &(*specials)[name] : nullptr;
  if (!entry || !entry->is_object() || !entry->contains("ids") || !(*entry)["ids"].is_array() ||
      (*entry)["ids"].size() != 1 || !(*entry)["ids"][0].is_number_unsigned() ||
      (*entry)["ids"][0].get<uint64_t>() >= kIdLimit)
    throw refuse("special_tokens[\"" + terminal_safe(name) + "\"] does not give it one id");
  return (*entry)["ids"][0].get<uint32_t>();
}

std::optional<uint32_t> read_post_processor(const json& pp, const std::string& path,
                                            const std::string& at, bool in_sequence) {
  JsonFields p(pp, path, at);
  const std::optional<std::string> type = p.string("type");
  if (type == "ByteLevel") {  // offsets only
    read_byte_level(p);
    return std::nullopt;
  }
  if (type == "TemplateProcessing") return read_template(p, path, at);
  if (type == "Sequence" && !in_sequence) {
    const json& list = p.required("processors", "an array of post-processors");
    if (!list.is_array()) p.fail("processors", list, "is not an array");
    p.refuse_unknown("a Sequence has type, processors");
    std::optional<uint32_t> bos;
    for (size_t i = 0; i < list.size(); ++i)
      if (auto b = read_post_processor(list[i], path, at + ".processors[" + std::to_string(i) + "]", true))
        bos = b;
    return bos;
  }
  throw DataError(path, at + ".type = " + short_json(type ? json(*type) : json()) +
                            " is a post-processor meshtrain does not apply (it would add tokens "
                            "meshtrain does not); accepted: ByteLevel, TemplateProcessing of [$A] "
                            "or [one special token, $A], a Sequence of them, or null");
}

// meshtrain decodes as HF's ByteLevel decoder does; without a decoder HF would give the
// byte-mapped pieces joined by spaces ("hello Ġ world"), which meshtrain does not.
void read_decoder(const json* decoder, const std::string& path) {
  const std::string expected = "; expected {\"type\": \"ByteLevel\"}, as GPT-2's, Llama 3's and "
                               "Qwen's tokenizer.json";
  if (decoder == nullptr)
    throw DataError(path, "decoder is missing or null: HF would decode to the byte-level pieces "
                          "joined by spaces, meshtrain decodes bytes" + expected);
  JsonFields d(*decoder, path, "decoder");
  if (d.string("type") != "ByteLevel")
    throw DataError(path, "decoder = " + short_json(*decoder) + " is not applied: meshtrain "
                          "decodes as the ByteLevel decoder does" + expected);
  read_byte_level(d, Fields::MayLack);
}

}  // namespace

std::unique_ptr<Tokenizer> open_gpt2_bpe_json(const std::string& path) {
  const json j = parse_json_file(path, "a Hugging Face tokenizer.json");
  JsonFields top(j, path, "");
  Gpt2BpeFiles f;
  top.string("version");
  read_model(top.required("model", "a BPE model" + std::string(kAccepted)), path, f);
  read_pre_tokenizer(top.required("pre_tokenizer", std::string("a pre-tokenizer") + kAccepted), path, f);
  if (const json* n = top.optional("normalizer"))
    f.normalizer = std::make_shared<TextNormalizer>(*n, path, "normalizer");
  if (const json* added = top.optional("added_tokens")) read_added_tokens(*added, path, f);
  if (const json* pp = top.optional("post_processor"))
    f.begin_of_text = read_post_processor(*pp, path, "post_processor", false);
  read_decoder(top.optional("decoder"), path);
  require_neutral(top, "truncation", [](const json&) { return false; },
                  "is not applied: meshtrain keeps every token of a text; expected null");
  require_neutral(top, "padding", [](const json&) { return false; },
                  "is not applied: meshtrain adds no padding tokens; expected null");
  top.refuse_unknown("a tokenizer.json has version, truncation, padding, added_tokens, "
                     "normalizer, pre_tokenizer, post_processor, decoder, model");
  return make_gpt2_bpe_tokenizer(f, path);
}

}  // namespace meshtrain
