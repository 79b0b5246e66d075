#pragma once
// What a model family is: one registration record (torchtitan's ModelSpec, as a table rather
// than a class), filled in by the family's own folder (families/<name>/) and listed once in the
// registry (families/registry.h). The record says everything that differs between families
// above the layers: the family's name, its defaults over the [model] keys, the Hugging Face
// architectures it reads and writes and its Hugging Face format (tensor names and config.json,
// both ways). The layers themselves are shared components of model/ that the ModelSpec picks;
// nothing below this folder asks which family it builds.
//
// Layering: families/ sits between config/ (whose [model] keys read the registry) and model/
// (whose ModelSpec the records fill); the Hugging Face formats read io/'s checkpoint settings.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/families/hf/hf_config_reader.h"
#include "meshtrain/families/hf/hf_name_map.h"
#include "meshtrain/model/model_spec.h"

namespace meshtrain {

// One class of transformers a family reads and writes: config.json's `architectures` entry, its
// `model_type`, and the feed-forward it has (a mixture's class is the same family's, with the
// mixture of experts as its feed-forward: families/moe/).
struct HfArchitecture {
  const char* name;        // "LlamaForCausalLM"
  const char* model_type;  // "llama"
  FeedForwardKind feed_forward;
};

// What export reads of a checkpoint: its @model attribute as text and as (key, value) settings,
// and that text read as a deck's [model] (config/'s reader, above this layer, handed down).
struct RecordedModel {
  std::string path;  // the checkpoint, for messages
  std::string text;
  std::map<std::string, std::string> settings;
  std::function<ModelSpec()> read_as_deck;
};

// What export writes beside the weights into config.json.
struct HfExportOptions {
  std::string torch_dtype;  // "float32" or "bfloat16"
  std::string tokenizer;    // the checkpoint's recorded tokenizer (provenance)
  int64_t bos = -1, eos = -1;  // the exported tokenizer's ids; < 0: none
};

// A family's Hugging Face format: the hooks `meshtrain import` and `export` call, in their order.
struct HfFormat {
  // import: config.json as a spec (seq_len: what a deck built from it trains at) and the
  // positions the model was made for; refused by name where meshtrain computes something else.
  ModelSpec (*read_config)(const HfConfigReader& config, int64_t& max_positions);
  // import: refuses a deck model (`deck`, from `deck_path` and its --set overrides) that is not
  // the one config.json describes (`hf`, read_config's), naming config.json's key.
  void (*check_deck)(const HfConfigReader& config, const ModelSpec& hf, int64_t max_positions, const ModelSpec& deck,
                     const std::string& deck_path);
  // Every parameter of the model under the family's HF names, in save_pretrained's order.
  std::vector<HfTensor> (*tensors)(const ModelSpec& m);
  // import: HF's token embedding (messages about a tied head name it); a stored tensor's name as
  // tensors() names it (older savers' prefixes); a stored buffer that holds no parameter.
  const char* embedding;
  std::string (*stored_name)(const std::string& name);
  bool (*is_buffer)(const std::string& name);
  // export: the model a checkpoint records, refusing what the family's classes cannot express.
  ModelSpec (*recorded_model)(const RecordedModel& recorded);
  // export: the class `m` is, refusing (naming `where`) a setting none of the family's classes has.
  std::string (*architecture)(const ModelSpec& m, const std::string& where);
  std::string (*config_json)(const ModelSpec& m, const HfExportOptions& options);
  // export: the parameters it maps, for the message about one it does not.
  const char* exported_parameters;
  // import: the parameters as this config.json's files store them, where a config key changes
  // the storage and not the model (DeepSeek-V3's rope_interleave); null: tensors(m).
  std::vector<HfTensor> (*stored_tensors)(const HfConfigReader& config, const ModelSpec& m);
  // import and export: the model's state that HF stores beside the parameters (HfTensor::state:
  // DeepSeek-V3's e_score_correction_bias as meshtrain's expert bias); null: none. A model with
  // state the format does not carry imports it as a fresh run starts it (zeros).
  std::vector<HfTensor> (*state_tensors)(const ModelSpec& m);
};

struct ModelFamily {
  const char* name;     // model.family in a deck, "family" in a checkpoint's model
  const char* summary;  // what its defaults are, for the key's help ("\"gpt2\" (LayerNorm, ...)")
  // Its defaults over ModelSpec's own (which are GPT-2's) for every field but the sizes.
  void (*apply_defaults)(ModelSpec& spec);
  std::vector<HfArchitecture> hf_architectures;
  const HfFormat* hf;
};

}  // namespace meshtrain
