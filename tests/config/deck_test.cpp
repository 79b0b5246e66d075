// parse_deck (config/deck.h) against values that used to pass: integers beyond the field that
// stores them (narrowed: train.steps = 2^32 + 1 trained one step), non-finite numbers (train.eps =
// inf trained without updates), strings holding a NUL (cut short by every C API), and --set
// values holding a line break (their later keys dropped while the override was recorded). Every
// key of the schema is tried, read from the deck reference, so a key added later is covered too.
// device-independent: only parses decks; nothing runs on a device.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/machine_profile.h"

namespace meshtrain {
namespace {

struct KeyRow {
  std::string section, key, type;
};

// Every key of the reference (deck_reference_markdown: one table per section).
std::vector<KeyRow> reference_keys() {
  std::vector<KeyRow> out;
  const std::regex section(R"(#### \[(\w+)\])"), row(R"(^\| `(\w+)` \| ([^|]+) \|)");
  std::istringstream lines(deck_reference_markdown());
  std::string current;
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, section)) current = m[1];
    else if (std::regex_search(line, m, row)) out.push_back({current, m[1], m[2]});
  }
  return out;
}

// The message parse_deck refuses with, or "" when it accepts.
std::string refusal(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_deck("deck.toml", text, overrides);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "";
}

// The value the effective configuration holds for section.key ("" when absent).
std::string dumped(const Config& c, const std::string& section, const std::string& key) {
  const std::string dump = dump_config(c);
  const size_t at = dump.find("[" + section + "]\n");
  if (at == std::string::npos) return "";
  const size_t end = dump.find("\n[", at + 1);
  const std::string table = dump.substr(at, end == std::string::npos ? std::string::npos : end - at);
  const size_t line = table.find("\n" + key + " = ");
  if (line == std::string::npos) return "";
  const size_t from = line + key.size() + 4;
  return table.substr(from, table.find('\n', from) - from);
}

TEST(Deck, IntegerKeysRefuseWhatTheirFieldCannotHold) {
  int tried = 0;
  for (const KeyRow& k : reference_keys()) {
    if (k.type != "integer" && k.type != "integer or \"auto\"") continue;
    ++tried;
    // 2^32 + 4 narrows to 4 in 32 bits (a valid value of most keys: nothing else refuses it);
    // INT64_MAX is the largest TOML integer.
    for (const std::string v : {"4294967300", "9223372036854775807"}) {
      const std::string set = k.section + "." + k.key + "=" + v;
      Config c;
      try {
        c = parse_deck("deck.toml", "", {set});
      } catch (const DeckError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(k.section + "." + k.key + " = " + v + " is out of range (expected"),
                  std::string::npos)
            << set << " is refused for another reason than its range: " << what;
        continue;
      }
      EXPECT_EQ(dumped(c, k.section, k.key), v) << set << " was accepted but not stored as given";
    }
  }
  EXPECT_GE(tried, 20);
}

TEST(Deck, IntegerRangesNameTheirTrueBound) {
  EXPECT_NE(refusal("", {"train.steps=4294967297"}).find(
                "train.steps = 4294967297 is out of range (expected integer from 1 to 2147483647)"),
            std::string::npos);
  EXPECT_NE(refusal("[checkpoint]\nkeep = 4294967296\n").find("deck.toml:2: checkpoint.keep"),
            std::string::npos);
  EXPECT_NE(refusal("", {"parallel.partition=[4294967300]"}).find("holds a count above 2147483647"),
            std::string::npos);
  // Too large for 64 bits, in any TOML integer notation: a number, not a string.
  for (const std::string v : {"99999999999999999999", "0xFFFFFFFFFFFFFFFFFF"})
    EXPECT_NE(refusal("", {"train.steps=" + v}).find("is outside the 64-bit integer range"),
              std::string::npos)
        << v;
}

TEST(Deck, FloatKeysRefuseNonFiniteNumbers) {
  int tried = 0;
  for (const KeyRow& k : reference_keys()) {
    if (k.type != "float") continue;
    ++tried;
    for (const std::string v : {"inf", "+inf", "-inf", "nan"}) {
      const std::string set = k.section + "." + k.key + "=" + v;
      const std::string what = refusal("", {set});
      EXPECT_NE(what.find(k.section + "." + k.key + " = " + v.substr(v[0] == '+') +
                          " is not a finite number (expected "),
                std::string::npos)
          << set << ": " << (what.empty() ? "accepted" : what);
      const std::string in_file = refusal("[" + k.section + "]\n" + k.key + " = " + v + "\n");
      EXPECT_NE(in_file.find("deck.toml:2: " + k.section + "." + k.key), std::string::npos)
          << in_file;
    }
  }
  EXPECT_GE(tried, 8);
  for (const std::string v : {"1e400", "-1e400", "1.5e999"}) {
    const std::string what = refusal("", {"train.lr=" + v});
    EXPECT_NE(what.find("train.lr = " + v + " is outside the range of a 64-bit float (expected "
                        "finite number > 0)"),
              std::string::npos)
        << what;
  }
  EXPECT_NE(refusal("", {"parallel.speeds=[1, inf]"}).find("not a finite number"), std::string::npos);
}

TEST(Deck, StringsWithANulCharacterAreRefused) {
  int tried = 0;
  for (const KeyRow& k : reference_keys()) {
    if (k.type.find("string") == std::string::npos) continue;
    ++tried;
    const std::string value = "\"a.bin\\u0000.evil\"";
    for (const std::string& what :
         {refusal("", {k.section + "." + k.key + "=" + value}),
          refusal("[" + k.section + "]\n" + k.key + " = " + value + "\n")}) {
      // The whole value shows, past the NUL: nothing cuts the message short.
      EXPECT_NE(what.find(k.section + "." + k.key + " = \"a.bin\\u0000.evil\" holds a NUL"),
                std::string::npos)
          << k.section << "." << k.key << ": " << (what.empty() ? "accepted" : what);
    }
  }
  EXPECT_GE(tried, 8);
  EXPECT_NE(refusal("[data]\ntrain = [\"x.bin\", \"a\\u0000b\"]\n").find("deck.toml:2: data.train[1]"),
            std::string::npos);
  EXPECT_NE(refusal("[run]\n\"na\\u0000me\" = \"x\"\n").find("the key \"run.na\\u0000me\" holds a NUL"),
            std::string::npos);
  EXPECT_NE(refusal("", {"data.train=[\"a\\u0000b\"]"}).find("--set data.train=[\"a\\u0000b\"]: "),
            std::string::npos);
  // Machine profiles are TOML read the same way.
  try {
    parse_machine_profile("m.toml", "[machine]\nname = \"a\\u0000b\"\n");
    ADD_FAILURE() << "a machine profile with a NUL in a string was read";
  } catch (const DeckError& e) {
    EXPECT_NE(std::string(e.what()).find("m.toml:2: machine.name = \"a\\u0000b\" holds a NUL"),
              std::string::npos)
        << e.what();
  }
}

TEST(Deck, OverridesWithALineBreakAreRefused) {
  for (const std::string set : {"train.steps=3\nrun.name=\"x\"", "train.steps=3\r\nmodel.layers=2",
                                "run.name=\"a\nb\"", "model.layers\n=2"}) {
    const std::string what = refusal("", {set});
    EXPECT_NE(what.find("holds a line break (expected one section.key=value on one line"),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "the message itself breaks: " << what;
  }
  // One value per --set, whatever TOML would make of the rest.
  EXPECT_EQ(parse_deck("deck.toml", "", {"train.steps=3 # a comment"}).train.steps, 3);
}

// model.family sets the defaults of the architecture's keys, and the keys beside it override
// them wherever they stand in the deck (the TOML table is read in key order, and "family" sorts
// after "activation" and "ffn_hidden").
TEST(Deck, ModelFamilyGoesFirstAndTheKeysBesideItOverrideIt) {
  const Config c = parse_deck("deck.toml",
                              "[model]\nffn_hidden = 96\nfamily = \"gpt2\"\nhead_dim = 8\n"
                              "d_model = 64\nheads = 4\n");
  EXPECT_EQ(c.model.family, "gpt2");
  EXPECT_EQ(c.model.ffn_hidden(), 96);
  EXPECT_EQ(c.model.head_dim(), 8);
  EXPECT_EQ(c.model.d_model, 64);
  // Derived when not given: GPT-2's 4 x d_model and d_model / heads.
  const Config d = parse_deck("deck.toml", "[model]\nd_model = 64\nheads = 4\n");
  EXPECT_EQ(d.model.ffn_hidden(), 256);
  EXPECT_EQ(d.model.head_dim(), 16);
  // Given as --set, the same.
  EXPECT_EQ(parse_deck("deck.toml", "", {"model.ffn_hidden=40", "model.family=gpt2"}).model.ffn_hidden(), 40);
  // The Llama and Qwen families: HF's LlamaConfig / Qwen3Config semantics, each key overridable.
  const Config llama = parse_deck("deck.toml", "[model]\nrope_theta = 1e4\nfamily = \"llama\"\n");
  EXPECT_EQ(llama.model.norm.kind, NormKind::Rms);
  EXPECT_EQ(llama.model.norm.eps, 1e-5);
  EXPECT_EQ(llama.model.positions, PositionKind::Rotary);
  EXPECT_EQ(llama.model.rope.theta, 1e4);
  EXPECT_EQ(llama.model.activation, ActivationKind::SwiGlu);
  EXPECT_FALSE(llama.model.linear_bias);
  EXPECT_FALSE(llama.model.tie_embeddings);
  EXPECT_FALSE(llama.model.qk_norm);
  const Config qwen = parse_deck("deck.toml", "[model]\nfamily = \"qwen3\"\ntie_embeddings = true\n");
  EXPECT_EQ(qwen.model.norm.eps, 1e-6);
  EXPECT_EQ(qwen.model.rope.theta, 1e6);
  EXPECT_TRUE(qwen.model.qk_norm);
  EXPECT_TRUE(qwen.model.tie_embeddings);
}

TEST(Deck, ModelSpecKeysRefuseWhatIsNotBuilt) {
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {"model.family=\"mistral\"", "model.family = \"mistral\" is not a known value (expected one of \"gpt2\", \"llama\", \"qwen3\", \"deepseek_v3\")"},
           {"model.qk_norm=\"yes\"", "model.qk_norm = \"yes\" is a string (expected true or false)"},
           {"model.norm=\"batchnorm\"", "model.norm = \"batchnorm\" is not a known value (expected one of \"layernorm\", \"rmsnorm\")"},
           {"model.activation=\"relu\"", "(expected one of \"gelu_tanh\", \"swiglu\")"},
           {"model.norm_eps=0", "model.norm_eps = 0 is out of range (expected finite number > 0)"},
           {"model.bias=1", "model.bias = 1 is an integer (expected true or false)"},
           {"model.positions=\"alibi\"", "(expected one of \"learned\", \"rotary\")"},
           {"model.rope_scaling=\"ntk\"", "(expected one of \"none\", \"llama3\", \"yarn\")"},
           {"model.rope_beta_slow=0", "model.rope_beta_slow = 0 is out of range (expected finite number > 0)"},
           {"model.rope_mscale=-1", "model.rope_mscale = -1 is out of range (expected finite number >= 0)"},
           {"model.moe_groups=0", "model.moe_groups = 0 is out of range (expected integer from 1 to 65536)"},
           {"model.feed_forward=\"mixture\"", "(expected one of \"dense\", \"moe\")"},
           {"model.moe_top_k=0", "model.moe_top_k = 0 is out of range"},
           {"model.moe_aux_loss=-0.5", "model.moe_aux_loss = -0.5 is out of range"},
           {"model.moe_router=\"tanh\"", "(expected one of \"softmax\", \"sigmoid\")"},
           {"model.moe_route_scale=0", "model.moe_route_scale = 0 is out of range (expected finite number > 0)"},
           {"model.moe_bias_update_rate=-0.001", "model.moe_bias_update_rate = -0.001 is out of range"},
           {"model.head_dim=0", "model.head_dim = 0 is out of range (expected integer from 1 to 65536)"},
           {"model.ffn_hidden=-4", "model.ffn_hidden = -4 is out of range"},
       }) {
    const std::string what = refusal("", {set});
    EXPECT_NE(what.find(want), std::string::npos) << set << ": " << what;
    EXPECT_NE(what.find("--set " + set), std::string::npos) << "the override is not named: " << what;
  }
  // A mixture of experts: top_k of the experts, a mixture layer left, SwiGLU experts without
  // biases, and no moe_* key on a dense model.
  const std::string moe = "[model]\nfamily = \"llama\"\nlayers = 2\nfeed_forward = \"moe\"\n";
  EXPECT_EQ(refusal(moe + "moe_experts = 4\nmoe_top_k = 4\nmoe_first_dense_layers = 1\n"), "");
  EXPECT_NE(refusal(moe + "moe_experts = 4\nmoe_top_k = 5\n").find("model.moe_top_k = 5 exceeds model.moe_experts = 4"),
            std::string::npos);
  EXPECT_NE(refusal(moe + "moe_first_dense_layers = 2\n").find("leaves no mixture-of-experts layer"),
            std::string::npos);
  EXPECT_NE(refusal(moe + "bias = true\n").find("needs model.bias = false"), std::string::npos);
  // The expert bias is the sigmoid router's: its step is refused with the softmax router, and
  // asynchronous replicas do not share the step's loads it moves by.
  EXPECT_EQ(refusal(moe + "moe_router = \"sigmoid\"\nmoe_route_scale = 2.5\nmoe_bias_update_rate = 0.0\n"), "");
  // A capacity: from a slot per token (1 / top_k) to below what lets nothing drop (E / top_k).
  EXPECT_EQ(refusal(moe + "moe_experts = 8\nmoe_capacity_factor = 1.25\n"), "");
  EXPECT_NE(refusal(moe + "moe_experts = 8\nmoe_capacity_factor = 0.25\n").find(
                "model.moe_capacity_factor = 0.25 gives the experts together fewer slots than tokens"),
            std::string::npos);
  EXPECT_NE(refusal(moe + "moe_experts = 8\nmoe_capacity_factor = 4.0\n").find(
                "model.moe_capacity_factor = 4 lets each expert take every token"),
            std::string::npos);
  EXPECT_NE(refusal(moe + "moe_capacity_factor = -1.0\n").find("model.moe_capacity_factor = -1.0 is out of range"),
            std::string::npos);
  // Group-limited routing: the sigmoid router's, whole groups of two or more, enough experts in
  // the top groups for top_k.
  const std::string grouped = moe + "moe_router = \"sigmoid\"\nmoe_experts = 8\n";
  EXPECT_EQ(refusal(grouped + "moe_groups = 4\nmoe_top_groups = 2\n"), "");
  for (const auto& [deck, words] : std::vector<std::pair<std::string, std::string>>{
           {moe + "moe_experts = 8\nmoe_groups = 4\nmoe_top_groups = 2\n",
            "model.moe_groups = 4 with model.moe_router = \"softmax\""},
           {grouped + "moe_groups = 3\n", "model.moe_groups = 3 does not split model.moe_experts = 8"},
           {grouped + "moe_groups = 8\n", "into whole groups of two or more experts"},
           {grouped + "moe_groups = 2\nmoe_top_groups = 3\n", "model.moe_top_groups = 3 exceeds model.moe_groups = 2"},
           {grouped + "moe_groups = 4\nmoe_top_k = 3\n",
            "model.moe_top_groups = 1 leaves 2 experts to choose from, fewer than model.moe_top_k = 3"},
           {"[model]\nmoe_groups = 2\n", "model.moe_* keys are given but model.feed_forward is \"dense\""},
       })
    EXPECT_NE(refusal(deck).find(words), std::string::npos) << deck << ": " << refusal(deck);
  EXPECT_EQ(refusal(moe + "moe_bias_update_rate = 0.001\n"), "") << "the default, as an effective configuration prints it";
  EXPECT_NE(refusal(moe + "moe_bias_update_rate = 0.0\n").find(
                "model.moe_bias_update_rate is given but model.moe_router is \"softmax\""),
            std::string::npos);
  EXPECT_NE(refusal(moe + "moe_router = \"sigmoid\"\n[parallel]\ndata_sync = \"async\"\nservers = 1\n")
                .find("model.moe_router = \"sigmoid\" (parallel.data_sync = \"async\""),
            std::string::npos);
  EXPECT_NE(refusal("[model]\nmoe_router = \"sigmoid\"\n").find("model.moe_* keys are given but model.feed_forward is \"dense\""),
            std::string::npos);
  EXPECT_NE(refusal("[model]\nmoe_experts = 4\n").find("model.moe_* keys are given but model.feed_forward is \"dense\""),
            std::string::npos);
  // kv_heads divides heads (tp against kv_heads: the catalogue and layout_parity).
  EXPECT_NE(refusal("[model]\nheads = 4\nkv_heads = 3\n").find("model.kv_heads = 3 does not divide model.heads = 4"),
            std::string::npos);
  EXPECT_EQ(refusal("[model]\nheads = 4\nkv_heads = 2\n"), "");
  // Rotary: an even head_dim, a valid scaling, and no rope_* keys without it.
  EXPECT_EQ(refusal("[model]\npositions = \"rotary\"\nrope_theta = 500000.0\nrope_scaling = \"llama3\"\n"), "");
  EXPECT_NE(refusal("[model]\nrope_theta = 500000.0\n").find("model.rope_* keys are given but model.positions is \"learned\""),
            std::string::npos);
  EXPECT_NE(refusal("[model]\npositions = \"rotary\"\nd_model = 60\nheads = 4\n").find("needs an even head_dim, not 15"),
            std::string::npos);
  EXPECT_NE(refusal("[model]\npositions = \"rotary\"\nrope_scaling = \"llama3\"\nrope_low_freq_factor = 4.0\nrope_high_freq_factor = 2.0\n").find("model.rope_*: "),
            std::string::npos);
  // LayerNorm's kernels take eps 1e-5 only; RMSNorm's any.
  EXPECT_NE(refusal("[model]\nnorm_eps = 1e-6\n").find("with model.norm = \"layernorm\" (meshtrain's "
                                                        "LayerNorm kernels compute with eps 1e-5"),
            std::string::npos);
  EXPECT_EQ(refusal("[model]\nnorm_eps = 1e-6\nnorm = \"rmsnorm\"\n"), "");
  // With head_dim given, d_model need not split over the heads (Qwen 3: head_dim 128 whatever
  // d_model / heads is); without it, it must.
  EXPECT_EQ(refusal("[model]\nd_model = 60\nheads = 8\nhead_dim = 16\n"), "");
  EXPECT_NE(refusal("[model]\nd_model = 60\nheads = 8\n").find("or set model.head_dim"),
            std::string::npos);
}

// The range import checks config.json's integers against (app/hf_directory.h): the schema's,
// capped by the field's type.
TEST(Deck, IntegerRangeOfAKeyIsTheSchemas) {
  const IntegerRange layers = deck_integer_range("model", "layers");
  EXPECT_EQ(layers.min, 1);
  EXPECT_EQ(layers.max, 100000);
  EXPECT_EQ(deck_integer_range("model", "vocab_size").min, 2);
  // train.steps is an int: its range stops at what the field holds, not at TOML's 64 bits.
  EXPECT_EQ(deck_integer_range("train", "steps").max, std::numeric_limits<int>::max());
  EXPECT_THROW(deck_integer_range("model", "family"), std::invalid_argument);
  EXPECT_THROW(deck_integer_range("model", "no_such_key"), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
