#pragma once
// The settings that decide which function a checkpoint's tensors compute — the deck's [model]
// keys, shape-changing or not (model.heads changes no tensor's shape, yet a checkpoint loaded
// with other heads is another model; the family and its variants, model/model_spec.h), what this
// build fixes (LayerNorm eps) and the tokenizer (data.tokenizer) — as the checkpoint's @model attribute records them,
// and the check that a deck's model is the checkpoint's. Private to src/checkpoint.

#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"
#include "meshtrain/optim/muon_hyper.h"

namespace meshtrain {

struct ModelSetting {
  std::string key;    // under "model.": "heads"
  std::string value;  // as recorded: "4", "true", "1e-05", "\"learned\""
  bool deck_key;      // a [model] key of the deck, else fixed by this build
  // What a checkpoint that does not record the key computed (written before the key existed):
  // GPT-2's value, given the settings before it; empty: the key must be recorded.
  std::string before_recorded = {};
  // Recorded only when its value is not before_recorded: a setting added after checkpoints of
  // the models it does not change were written (the sigmoid router's), which keep their @model.
  bool recorded_when_changed = false;
  // Decides only how far rotary positions reach (model.seq_len, the model.rope_* keys): no
  // tensor's shape or meaning depends on it, so a rotary model's checkpoint resumes with another
  // value (context extension).
  bool rotary_reach = false;
};

// A setting a resume changed (context extension): its key under "model.", the checkpoint's
// value (escaped for the terminal: the file may come from anyone) and the deck's.
struct SettingChange {
  std::string key, from, to;
};

// What @model records as model.tokenizer for data.tokenizer = `spec`: "byte" for "bytes" (the
// value every checkpoint held before other tokenizers), else Tokenizer::signature(), the kind
// and vocabulary size ("gpt2-bpe:50257"), never the path: a moved tokenizer file must not stop
// a resume. Opens the file once per spec and process; DataError when it cannot be opened.
std::string tokenizer_signature(const std::string& spec);

// Every setting of `m`, deck keys first; `tokenizer` as tokenizer_signature() gives it.
std::vector<ModelSetting> model_settings(const ModelSpec& m, const std::string& tokenizer = "byte");

// The @model attribute: "key = value" lines, in model_settings() order.
std::string model_signature(const ModelSpec& m, const std::string& tokenizer = "byte");

// Throws CheckpointFileError unless `recorded` (a file's @model) holds exactly the settings of
// `m`: the first difference names the key, the checkpoint's value and the deck's (or this
// build's), with what to do. `file` and `deck` name the two sides; `writer` is the meshtrain
// version that wrote the file. Where both are rotary models, model.seq_len and the rotary
// scaling may differ (context extension): those differences are returned, in settings order.
// A learned position table bounds model.seq_len at the checkpoint's.
std::vector<SettingChange> check_model_signature(const std::string& file, const std::string& recorded, const ModelSpec& m,
                           const std::string& deck, const std::string& writer,
                           const std::string& tokenizer = "byte");

// The @optimizer attribute: "muon", or "" for AdamW (not written: every checkpoint before the
// choice is AdamW's).
std::string optimizer_signature(OptimizerKind optimizer);

// Throws CheckpointFileError when the file's optimizer state (`recorded`, its @optimizer) is
// another optimizer's than the deck's train.optimizer: AdamW's exp_avg / exp_avg_sq and Muon's
// momentum mean different things. A file whose optimizer never stepped (optimizer_steps 0: an
// import) holds no state and is accepted by either.
void check_optimizer_signature(const std::string& file, const std::string& recorded,
                               int64_t optimizer_steps, OptimizerKind optimizer,
                               const std::string& deck);

}  // namespace meshtrain
