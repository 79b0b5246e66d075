#include "meshtrain/families/hf/hf_deck.h"

#include <cctype>
#include <filesystem>

#include "meshtrain/families/registry.h"

namespace meshtrain {

namespace {

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string hf_deck_text(const ModelSpec& m, const std::string& tokenizer, const std::string& source) {
  std::string name = std::filesystem::path(source).filename().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '-';
  std::string s =
      "# The Hugging Face model in " + source + ", as `meshtrain import --format hf --deck-out`\n"
      "# wrote it: [model] reproduces its config.json (the family's defaults are left out; see\n"
      "# `meshtrain keys`). It trains on the built-in corpus: for your own text, set data.train and\n"
      "# data.val to shards of `meshtrain prepare --tokenizer " + tokenizer + "`.\n"
      "# Fine-tune from the imported checkpoint: meshtrain train <this deck> --set "
      "checkpoint.resume='\"<OUT.h5>\"'\n\n"
      "[run]\nname = " + toml_string(name.empty() ? "hf" : name) + "\n\n"
      "[model]\n"
      "family = " + toml_string(m.family) + "\n"
      "layers = " + std::to_string(m.layers) + "\n"
      "d_model = " + std::to_string(m.d_model) + "\n"
      "heads = " + std::to_string(m.heads) + "\n"
      "seq_len = " + std::to_string(m.seq_len) + "\n"
      "vocab_size = " + std::to_string(m.vocab_size) + "\n"
      "tie_embeddings = " + (m.tie_embeddings ? "true" : "false") + "\n";
  // Against the family's defaults for the same kind of feed-forward. A dense model's deck names
  // no moe_* key (they mean nothing to it); a mixture's names them all, since moe_ffn_hidden's
  // default follows ffn_hidden, which the deck may set for the dense blocks alone.
  ModelSpec base = family_defaults(m.family, m);
  base.feed_forward = m.feed_forward;
  const std::vector<SpecField> mine = spec_fields(m), family = spec_fields(base);
  const bool moe = m.feed_forward == FeedForwardKind::Moe;
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& key = mine[i].key;
    const bool mixture_key = key == "feed_forward" || key.rfind("moe_", 0) == 0;
    if (key == "family" || (mixture_key && !moe)) continue;
    if (mine[i].value != family[i].value || mixture_key) s += key + " = " + mine[i].value + "\n";
  }
  s += "\n[data]\ntrain = \"synthetic\"\nval = \"synthetic\"\ntokenizer = " + toml_string(tokenizer) +
       "\n\n"
       "# A fine-tune's learning rates: the weights already know their language.\n"
       "[train]\nlr = 3e-5\nmin_lr = 3e-6\nwarmup_steps = 20\n";
  return s;
}

}  // namespace meshtrain
