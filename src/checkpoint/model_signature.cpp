#include "model_signature.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>

#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/io/tokenizer.h"

namespace meshtrain {

namespace {

// What this build computes that no deck key selects. A build that changes one of these must
// change its value here: checkpoints of the old function are then refused, not silently loaded.
constexpr double kLayerNormEps = 1e-5;  // backend/cpu/layernorm.cpp, backend/cuda/layernorm.cu

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string quoted(const char* s) { return "\"" + std::string(s) + "\""; }


}  // namespace

std::string tokenizer_signature(const std::string& spec) {
  if (spec == "bytes") return "byte";
  // Every checkpoint writes it: open a (possibly 10 MB JSON) tokenizer once, not every time.
  static std::mutex m;
  static std::map<std::string, std::string> known;
  std::lock_guard<std::mutex> lock(m);
  auto it = known.find(spec);
  if (it == known.end()) it = known.emplace(spec, open_tokenizer(spec)->signature()).first;
  return it->second;
}

std::vector<ModelSetting> model_settings(const ModelSpec& m, const std::string& tokenizer) {
  std::vector<ModelSetting> out = {
      {"layers", std::to_string(m.layers), true},
      {"d_model", std::to_string(m.d_model), true},
      {"heads", std::to_string(m.heads), true},
      {"seq_len", std::to_string(m.seq_len), true},
      {"vocab_size", std::to_string(m.vocab_size), true},
      {"tie_embeddings", m.tie_embeddings ? "true" : "false", true},
      {"layernorm_eps", number(kLayerNormEps), false},
  };
  // The spec's other fields (model/model_spec.h), each read as GPT-2's value from a checkpoint
  // that predates it (a model of the same sizes: those were checked above). A dense model's
  // signature leaves out the mixture's fields, which it does not read: its checkpoints record
  // what they did before mixtures existed (feed_forward tells the two apart).
  // The router's kind, scale and capacity came after softmax mixtures' checkpoints, which
  // compute with "softmax", 1 and 0 (dropless) and keep recording none of them. The bias step is how training moves the bias,
  // not the function the tensors compute: DeepSeek-V3 set it to 0 late in training, so a resume
  // may change it.
  const bool moe = m.feed_forward == FeedForwardKind::Moe;
  for (const SpecField& f : spec_fields(m)) {
    // The multi-token losses' weight, likewise, is how training moves the weights (DeepSeek-V3
    // lowered it from 0.3 to 0.1 mid-run).
    if (f.key == "moe_bias_update_rate" || f.key == "mtp_loss_weight" ||
        (!moe && f.key.rfind("moe_", 0) == 0))
      continue;
    const bool later = f.key == "moe_router" || f.key == "moe_route_scale" || f.key == "moe_capacity_factor";
    out.push_back({f.key, f.value, true, f.gpt2_value, later});
    out.back().rotary_reach = f.key.rfind("rope_", 0) == 0;
  }
  out.push_back({"tokenizer", quoted(tokenizer.c_str()), false});
  for (ModelSetting& s : out) s.rotary_reach = s.rotary_reach || s.key == "seq_len";
  return out;
}

std::string model_signature(const ModelSpec& m, const std::string& tokenizer) {
  std::string out;
  for (const ModelSetting& s : model_settings(m, tokenizer))
    if (!s.recorded_when_changed || s.value != s.before_recorded) out += s.key + " = " + s.value + "\n";
  return out;
}

std::string optimizer_signature(OptimizerKind optimizer) {
  return optimizer == OptimizerKind::Muon ? optimizer_name(optimizer) : "";
}

void check_optimizer_signature(const std::string& file, const std::string& recorded,
                               int64_t optimizer_steps, OptimizerKind optimizer,
                               const std::string& deck) {
  if (!recorded.empty() && recorded != "muon")
    throw CheckpointFileError(file + ": attribute 'optimizer' = \"" + terminal_safe(recorded) +
                              "\" is not an optimizer this meshtrain " MESHTRAIN_VERSION
                              " knows (\"muon\", or no attribute for \"adamw\")");
  const std::string written = recorded.empty() ? "adamw" : recorded;
  const std::string wanted = optimizer_name(optimizer);
  if (written == wanted || optimizer_steps == 0) return;
  throw CheckpointFileError(
      file + ": its optimizer state is train.optimizer = \"" + written + "\"'s, but " + deck +
      " (with its --set overrides) has train.optimizer = \"" + wanted + "\": " +
      (written == "muon" ? "Muon's momentum is not AdamW's two moments"
                         : "AdamW's moments are not Muon's momentum") +
      " (set train.optimizer = \"" + written + "\" to resume it)");
}

namespace {

// What @model records for `key`, or GPT-2's value where the file predates the key; "" when
// neither (the caller refuses that).
std::string recorded_or_before(const std::map<std::string, std::string>& stored,
                               const std::vector<ModelSetting>& settings, const std::string& key) {
  auto it = stored.find(key);
  if (it != stored.end()) return it->second;
  for (const ModelSetting& s : settings)
    if (s.key == key) return s.before_recorded;
  return "";
}

// A learned position table (GPT-2's wpe) has model.seq_len rows: a deck's other length is
// another tensor shape, refused here with both numbers rather than as a dataset's shape.
[[noreturn]] void refuse_learned_length(const std::string& file, const std::string& recorded,
                                        const ModelSpec& m, const std::string& deck) {
  const std::string rows = terminal_safe(recorded), wanted = std::to_string(m.seq_len);
  int64_t table = 0;
  const auto [end, ec] = std::from_chars(recorded.data(), recorded.data() + recorded.size(), table);
  const bool longer = ec == std::errc() && end == recorded.data() + recorded.size() && m.seq_len > table;
  throw CheckpointFileError(
      file + ": model.seq_len = " + rows + " in the checkpoint, but " + deck +
      " (with its --set overrides) has model.seq_len = " + wanted + ": " +
      (longer ? "the checkpoint's learned position table (model.positions = \"learned\", wpe) has " +
                    rows + " rows, so its context cannot reach " + wanted + " tokens"
              : "a learned position table (model.positions = \"learned\", wpe) resumes only at its own "
                "length, " + rows) +
      " (set model.seq_len = " + rows + "; rotary models, model.positions = \"rotary\", resume at "
      "another length with another model.rope_scaling)");
}

}  // namespace

std::vector<SettingChange> check_model_signature(const std::string& file, const std::string& recorded,
                                                 const ModelSpec& m, const std::string& deck,
                                                 const std::string& writer, const std::string& tokenizer) {
  std::map<std::string, std::string> stored = recorded_model_settings(recorded);
  const std::vector<ModelSetting> settings = model_settings(m, tokenizer);
  // Context extension: only when the checkpoint's model and the deck's both turn rotary
  // positions (another positions setting is refused below, under its own key).
  const std::string rotary = quoted(position_name(PositionKind::Rotary));
  const bool both_rotary = m.positions == PositionKind::Rotary &&
                           recorded_or_before(stored, settings, "positions") == rotary;
  std::vector<SettingChange> changes;
  // What the file recorded is printed escaped: the file may come from anyone.
  const std::string safe_writer = terminal_safe(writer);
  for (const ModelSetting& s : settings) {
    auto it = stored.find(s.key);
    if (it == stored.end() && !s.before_recorded.empty())
      it = stored.emplace(s.key, s.before_recorded).first;
    if (it == stored.end())
      throw CheckpointFileError(file + ": the 'model' attribute does not record model." + s.key +
                                " (damaged, or not written by meshtrain)");
    const std::string value = terminal_safe(it->second);
    if (it->second != s.value) {
      if (s.rotary_reach && both_rotary) {
        changes.push_back({s.key, value, s.value});
        stored.erase(it);
        continue;
      }
      if (s.key == "seq_len" && m.positions == PositionKind::Learned &&
          recorded_or_before(stored, settings, "positions") == quoted(position_name(PositionKind::Learned)))
        refuse_learned_length(file, it->second, m, deck);
      if (s.key == "tokenizer")
        throw CheckpointFileError(
            file + ": model.tokenizer = " + value + " in the checkpoint, but " + deck +
            "'s data.tokenizer is " + s.value +
            ": the checkpoint's token ids mean other text (set data.tokenizer to the tokenizer "
            "it was trained with; `meshtrain inspect` shows its configuration)");
      if (s.deck_key)
        throw CheckpointFileError(
            file + ": model." + s.key + " = " + value + " in the checkpoint, but " + deck +
            " (with its --set overrides) has model." + s.key + " = " + s.value +
            ": the checkpoint holds another model (set model." + s.key + " = " + value +
            " to load it; `meshtrain inspect` shows the configuration that wrote it)");
      throw CheckpointFileError(
          file + ": model." + s.key + " = " + value + " in the checkpoint, but this meshtrain " +
          MESHTRAIN_VERSION " computes with model." + s.key + " = " + s.value +
          " (fixed in the build, not a deck key): the checkpoint holds another model (load it "
          "with the meshtrain that wrote it, " + safe_writer + ")");
    }
    stored.erase(it);
  }
  if (!stored.empty())
    throw CheckpointFileError(file + ": model." + terminal_safe(stored.begin()->first) + " = " +
                              terminal_safe(stored.begin()->second) +
                              " in the checkpoint is a model setting this meshtrain " MESHTRAIN_VERSION
                              " does not know: the checkpoint holds another model (load it with the "
                              "meshtrain that wrote it, " + safe_writer + ")");
  return changes;
}

}  // namespace meshtrain
