#pragma once
// The architecture of a decoder-only transformer, as the model layer builds it: sizes, and which
// variant each sub-layer of a block is (docs/architecture.md, "Adding a model family"). A family
// ("gpt2") is a set of defaults for these fields (families/registry.h: family_defaults); every
// field is a deck key of [model]. The layers read it and nothing else: a new family is a record
// in families/ and, where it needs them, new sub-layer variants in model/. The struct's own
// defaults are GPT-2's.

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

enum class NormKind { Layer, Rms };
enum class PositionKind { Learned, Rotary };
enum class RopeScalingKind { None, Llama3, Yarn };
enum class ActivationKind { GeluTanh, SwiGlu };
enum class FeedForwardKind { Dense, Moe };
enum class RouterKind { Softmax, Sigmoid };
enum class AttentionKind { Standard, Latent };

struct NormSpec {
  NormKind kind = NormKind::Layer;
  double eps = 1e-5;
  auto operator<=>(const NormSpec&) const = default;
};

// Rotary positions (Su et al., arXiv 2104.09864) in HF's rotate-half layout: the base and Llama
// 3's or YaRN's frequency scaling (backend/rotary_table.h).
struct RopeSpec {
  double theta = 10000.0;
  RopeScalingKind scaling = RopeScalingKind::None;
  double factor = 8.0;                                  // "llama3" and "yarn"
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // "llama3" only
  int64_t original_max_positions = 8192;                 // "llama3" and "yarn"
  // "yarn" only (HF's rope_scaling keys of the same names; 0 stands for an absent key).
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // 0: derived from factor and the mscales
  bool truncate = true;
  auto operator<=>(const RopeSpec&) const = default;
};

// A mixture of experts in place of the dense feed-forward (feed_forward = Moe; model/moe_layer.h):
// each token goes through top_k of `experts` SwiGLU experts of width ffn_hidden, chosen by a
// softmax router (Mixtral, Qwen3-MoE) or by sigmoid scores plus a per-expert balancing bias
// (DeepSeek-V3; model/moe_routing.h, model/expert_bias.h), plus an optional shared expert every
// token passes (DeepSeek's, Qwen2-MoE's). The first first_dense_layers blocks keep the dense
// feed-forward (DeepSeek-V3's first_k_dense_replace).
struct MoeSpec {
  int64_t experts = 8;
  int64_t top_k = 2;
  int64_t ffn_hidden_set = 0;         // 0: the model's ffn_hidden
  int64_t shared_ffn_hidden = 0;      // width of the shared expert; 0: none
  bool normalize_top_k = true;        // gates renormalised over the chosen experts
  double aux_loss = 0.01;             // Switch load-balancing loss coefficient
  double z_loss = 0.0;                // router z-loss coefficient (ST-MoE)
  int first_dense_layers = 0;
  RouterKind router = RouterKind::Softmax;
  double route_scale = 1.0;           // the gates' factor (DeepSeek's routed_scaling_factor)
  // The sigmoid router's bias step gamma (DeepSeek-V3's 0.001, arXiv 2412.19437, section 4.2).
  // A softmax router has no bias: the deck refuses another value there.
  double bias_update_rate = 0.001;
  // Tokens an expert takes per micro-batch on a rank: ceil(factor x local tokens x top_k / E);
  // 0: dropless (model/moe_routing.h has the drop policy).
  double capacity_factor = 0;
  // Group-limited routing (DeepSeek-V3's noaux_tc, HF n_group / topk_group; sigmoid router
  // only): the experts in `groups` groups of consecutive indices, and a token chooses among the
  // experts of its `top_groups` best groups only (model/moe_routing.h). 1 / 1: every expert.
  int64_t groups = 1;
  int64_t top_groups = 1;
  auto operator<=>(const MoeSpec&) const = default;
};

// Multi-head latent attention (attention = Latent; DeepSeek-V2/V3, model/latent_attention.h):
// queries through a low-rank path (q_lora_rank; 0: straight from the block's input), keys and
// values expanded per head from one compressed latent of kv_lora_rank, plus a rotary part of
// qk_rope_dim channels whose key is one head shared by all. A query/key head is qk_nope_dim +
// qk_rope_dim wide, a value head v_head_dim. The defaults are DeepSeek-V3's (HF
// DeepseekV3Config), less its q_lora_rank.
struct LatentSpec {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_dim = 128;
  int64_t qk_rope_dim = 64;
  int64_t v_head_dim = 128;
  int64_t qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  auto operator<=>(const LatentSpec&) const = default;
};

struct ModelSpec {
  std::string family = "gpt2";
  int layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  // 0: derived (kv_heads = heads, head_dim = d_model / heads, ffn_hidden = 4 d_model): the
  // accessors below give the value the layers use.
  int64_t kv_heads_set = 0;
  int64_t head_dim_set = 0;
  int64_t ffn_hidden_set = 0;
  int64_t seq_len = 128;
  int64_t vocab_size = 256;
  NormSpec norm;
  PositionKind positions = PositionKind::Learned;
  RopeSpec rope;  // read with positions = Rotary
  ActivationKind activation = ActivationKind::GeluTanh;
  FeedForwardKind feed_forward = FeedForwardKind::Dense;
  bool linear_bias = true;     // every linear layer adds a bias
  // RMSNorm of each query and key head (weights of head_dim) before the rotation: Qwen 3.
  bool qk_norm = false;
  bool tie_embeddings = true;  // the LM head shares the token embedding
  MoeSpec moe;                 // read with feed_forward = Moe
  AttentionKind attention = AttentionKind::Standard;
  LatentSpec latent;           // read with attention = Latent
  // Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 section 2.2; model/mtp_module.h):
  // mtp_layers depths after the head, each predicting one token further, their losses added
  // with weight mtp_loss_weight / mtp_layers. 0: none.
  int mtp_layers = 0;
  double mtp_loss_weight = 0.3;
  // Sliding-window attention (Mistral: every layer; Gemma 3: local layers, every k-th global):
  // the keys a query sees, as a pattern over the blocks, block l's window attention_window[l %
  // size]. A window of W: query t sees keys t - W < s <= t (HF's sliding_window); 0: every
  // earlier key. Empty: full attention in every block. Kept canonical (deck.cpp): no single
  // pattern of equal entries, no all-zero pattern.
  std::vector<int64_t> attention_window;

  int64_t kv_heads() const { return kv_heads_set ? kv_heads_set : heads; }
  int64_t head_dim() const { return head_dim_set ? head_dim_set : d_model / heads; }
  int64_t ffn_hidden() const { return ffn_hidden_set ? ffn_hidden_set : 4 * d_model; }
  bool latent_attention() const { return attention == AttentionKind::Latent; }
  // The channels rotary positions turn in each query and key head: the whole head, or latent
  // attention's rotary part.
  int64_t rotary_dim() const { return latent_attention() ? latent.qk_rope_dim : head_dim(); }
  int64_t moe_ffn_hidden() const { return moe.ffn_hidden_set ? moe.ffn_hidden_set : ffn_hidden(); }
  // Whether block `layer` has a mixture of experts (else the dense feed-forward).
  bool moe_layer(int layer) const {
    return feed_forward == FeedForwardKind::Moe && layer >= moe.first_dense_layers;
  }
  // Block `layer`'s attention window (0: full attention); whether any block has one.
  int64_t window(int layer) const {
    return attention_window.empty() ? 0
                                    : attention_window[static_cast<size_t>(layer) % attention_window.size()];
  }
  bool windowed() const { return !attention_window.empty(); }
  // Parameters of the whole model (global, unsharded).
  int64_t parameter_count() const;
  // Those one token's forward reads: of a mixture's experts, top_k of each layer's (the
  // published "active parameters" of Mixtral and Qwen3-MoE); every parameter of a dense model.
  double active_parameter_count() const;
  // Training FLOPs per token, summed from the layers' cost sheets (model/model_costs.h): 6 x
  // (parameters that multiply) + attention, the PaLM convention (arXiv 2204.02311, appendix B).
  double flops_per_token() const;

  // Every field: what is computed once per architecture (parameter count, cost sheets) is
  // remembered under the whole spec.
  auto operator<=>(const ModelSpec&) const = default;
};

// The spec's fields beyond the sizes (layers, d_model, heads, seq_len, vocab_size,
// tie_embeddings), each as its [model] deck key, its value in TOML notation, and GPT-2's value
// for a model of the same sizes (what a checkpoint written before the field existed computed).
// The one list the effective configuration, the checkpoints' model signature and the Hugging
// Face GPT-2 export read: a new field is one line here and its deck key.
struct SpecField {
  std::string key, value, gpt2_value;
};
std::vector<SpecField> spec_fields(const ModelSpec& m);

// model.attention_window as the deck writes it: "0" (none), "4096" (every block) or
// "[1024, 1024, 0]" (a pattern over the blocks).
std::string attention_window_text(const std::vector<int64_t>& pattern);

// GPT-2 of the given sizes (benchmarks and tests name models this way).
ModelSpec gpt2_spec(int layers, int64_t d_model, int64_t heads, int64_t seq_len, int64_t vocab_size);

// The names deck keys and checkpoints use for the variants, and back (false: not a name).
const char* norm_name(NormKind k);
const char* position_name(PositionKind k);
const char* activation_name(ActivationKind k);
const char* feed_forward_name(FeedForwardKind k);
const char* router_name(RouterKind k);
const char* attention_name(AttentionKind k);
bool parse_attention(const std::string& s, AttentionKind& out);
bool parse_router(const std::string& s, RouterKind& out);
bool parse_norm(const std::string& s, NormKind& out);
bool parse_position(const std::string& s, PositionKind& out);
const char* rope_scaling_name(RopeScalingKind k);
bool parse_rope_scaling(const std::string& s, RopeScalingKind& out);
bool parse_activation(const std::string& s, ActivationKind& out);
bool parse_feed_forward(const std::string& s, FeedForwardKind& out);

}  // namespace meshtrain
