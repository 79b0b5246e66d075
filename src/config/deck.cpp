// Input deck parsing. The schema is the table in deck_schema.cpp: one entry per key, with its
// type, default, what it accepts, its meaning, and how it is stored into Config. Everything a
// user can get wrong in a deck is caught here or in layout_check.cpp, with a message naming the
// file and line, the key, the value and what would be accepted.

#include "meshtrain/config/deck.h"

#include "deck_schema.h"
#include "toml_value.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "meshtrain/backend/rotary_table.h"
#include "meshtrain/config/nearest_name.h"
#include "meshtrain/model/rotary_positions.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

namespace {

// Where each value came from: "--set <text>" for the sections and keys an override set (the
// last override of a key wins, as its value does), the deck file otherwise.
using OverrideOrigins = std::map<std::string, std::string>;  // "section" or "section.key" -> text

std::string location(const std::string& path, const toml::node& n, const OverrideOrigins& origins,
                     const std::string& name) {
  if (const auto it = origins.find(name); it != origins.end()) return "--set " + it->second;
  const auto line = n.source().begin.line;
  if (line == 0) return path;
  return path + ":" + std::to_string(line);
}

// Where the value named `name` ("section.key", "section.key[1]", "section.key.sub") came from:
// the override that set its key or its section, else the deck file's line.
std::string origin_of(const std::string& path, const toml::source_region& at,
                      const std::string& name, const OverrideOrigins& origins) {
  const size_t dot = name.find('.');
  const std::string section = name.substr(0, dot);
  const std::string key =
      dot == std::string::npos ? section : name.substr(0, name.find_first_of(".[", dot + 1));
  for (const std::string& origin : {key, section})
    if (const auto it = origins.find(origin); it != origins.end()) return "--set " + it->second;
  return at.begin.line ? path + ":" + std::to_string(at.begin.line) : path;
}

// Digits with an optional sign (and TOML's '_' separators, or a 0x, 0o, 0b prefix): what a
// user means as an integer.
bool looks_like_integer(const std::string& v) {
  return std::regex_match(
      v, std::regex("[+-]?([0-9][0-9_]*|0x[0-9A-Fa-f_]+|0o[0-7_]+|0b[01_]+)"));
}

// A decimal number with a fraction or an exponent: what a user means as a float.
bool looks_like_float(const std::string& v) {
  return std::regex_match(
      v, std::regex("[+-]?[0-9][0-9_]*(\\.[0-9_]+)?([eE][+-]?[0-9_]+)?"));
}

// Applies one `section.key=value` override to the parsed table, recording where it came from.
void apply_override(toml::table& root, const std::string& text, OverrideOrigins& origins) {
  // A line break would make the value several TOML lines: the keys after it were parsed and
  // dropped while the override was recorded (and stored in checkpoints) as applied.
  if (text.find_first_of("\n\r") != std::string::npos)
    throw DeckError("--set " + escape_control(text) +
                    ": holds a line break (expected one section.key=value on one line; repeat "
                    "--set for each key)");
  const size_t eq = text.find('=');
  const size_t dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw DeckError("--set " + text + ": expected section.key=value (e.g. --set model.layers=8)");
  const std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
  const std::string value = text.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("v = " + value), std::string_view("--set"));
  } catch (const toml::parse_error& e) {
    // Digits that are no TOML integer are one too large for 64 bits, and a float TOML cannot
    // read is beyond a double's range (1e400): numbers, not strings.
    const bool integer = looks_like_integer(value);
    if (integer || looks_like_float(value)) {
      const auto spec = std::find_if(schema().begin(), schema().end(), [&](const KeySpec& k) {
        return k.section == section && k.key == key;
      });
      throw DeckError("--set " + text + ": " + section + "." + key + " = " + value +
                      (integer ? " is outside the 64-bit integer range ("
                               : " is outside the range of a 64-bit float (") +
                      (spec == schema().end() ? std::string(e.description())
                                              : "expected " + spec->accepted) +
                      ")");
    }
    // Not a TOML value: take it as a bare string (--set data.train=data/x.bin).
    parsed.insert_or_assign("v", value);
  }
  if (parsed.size() != 1 || !parsed.contains("v"))
    throw DeckError("--set " + text + ": the value is more than one TOML value (expected "
                    "section.key=value; repeat --set for each key)");
  toml::table* sec = root[section].as_table();
  if (!sec) {
    if (!root.contains(section)) origins.emplace(section, text);
    root.insert_or_assign(section, toml::table{});
    sec = root[section].as_table();
  }
  sec->insert_or_assign(key, *parsed.get("v"));
  origins[section + "." + key] = text;
}

// Throws the deck's error, the deck's path first.
struct DeckFail {
  const std::string& path;
  [[noreturn]] void operator()(const std::string& msg) const { throw DeckError(path + ": " + msg); }
};

// Heads, key/value heads and rotary positions.
void check_attention_fields(const Config& c, const DeckFail& fail) {
  if (!c.model.latent_attention() && c.model.head_dim_set == 0 && c.model.d_model % c.model.heads != 0)
    fail("model.d_model = " + std::to_string(c.model.d_model) + " is not divisible by model.heads = " +
         std::to_string(c.model.heads) + " (d_model must be a multiple of heads, or set "
         "model.head_dim)");
  if (c.model.heads % c.model.kv_heads() != 0)
    fail("model.kv_heads = " + std::to_string(c.model.kv_heads()) + " does not divide model.heads = " +
         std::to_string(c.model.heads) + " (each key/value head serves heads / kv_heads query "
         "heads: kv_heads must divide heads)");
  if (c.model.positions == PositionKind::Rotary) {
    if (c.model.rotary_dim() % 2 != 0)
      fail(std::string("model.positions = \"rotary\" needs an even ") +
           (c.model.latent_attention() ? "qk_rope_head_dim" : "head_dim") + ", not " +
           std::to_string(c.model.rotary_dim()) + " (it rotates channel pairs i, i + dim / 2)");
    try {
      rope_inverse_frequencies(c.model.rotary_dim(), rope_frequencies(c.model.rope));
    } catch (const std::invalid_argument& e) {
      fail(std::string("model.rope_*: ") + e.what());
    }
  } else if (c.model.rope != RopeSpec{}) {
    fail("model.rope_* keys are given but model.positions is \"learned\", so they would be ignored "
         "(set model.positions = \"rotary\", or remove them)");
  }
}

// Group-limited routing (model.moe_groups, model.moe_top_groups): whole groups of at least two
// experts (a group's score sums its two best), enough eligible experts for top_k, and the
// sigmoid router's keys to rank groups by (DeepSeek-V3's; a softmax router has no such rule).
void check_expert_groups(const MoeSpec& moe, const DeckFail& fail) {
  const std::string groups = "model.moe_groups = " + std::to_string(moe.groups),
                    top_groups = "model.moe_top_groups = " + std::to_string(moe.top_groups);
  if (moe.top_groups > moe.groups)
    fail(top_groups + " exceeds " + groups + " (a token's experts come from top_groups of the "
         "groups: 1 to " + std::to_string(moe.groups) + ")");
  if (moe.groups == 1) return;
  if (moe.router != RouterKind::Sigmoid)
    fail(groups + " with model.moe_router = \"" + std::string(router_name(moe.router)) +
         "\": group-limited routing ranks groups by the sigmoid router's scores plus its expert "
         "bias (DeepSeek-V3's noaux_tc); set model.moe_router = \"sigmoid\", or moe_groups = 1");
  if (moe.experts % moe.groups != 0 || moe.experts / moe.groups < 2)
    fail(groups + " does not split model.moe_experts = " + std::to_string(moe.experts) +
         " into whole groups of two or more experts (a group's score is the sum of its two best; "
         "accepted: a divisor of moe_experts up to moe_experts / 2)");
  const int64_t eligible = moe.top_groups * (moe.experts / moe.groups);
  if (eligible < moe.top_k)
    fail(top_groups + " leaves " + std::to_string(eligible) + " experts to choose from, fewer than "
         "model.moe_top_k = " + std::to_string(moe.top_k) + " (need top_groups x moe_experts / "
         "moe_groups >= moe_top_k)");
}

// Latent attention's keys: only with model.attention = "latent", and what it is built without
// (a latent head's sizes are its own keys; its keys and values are per head already).
void check_latent_attention_fields(const Config& c, const DeckFail& fail) {
  const ModelSpec& m = c.model;
  if (!m.latent_attention()) {
    if (m.latent != LatentSpec{})
      fail("model.q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim or v_head_dim is "
           "given but model.attention is \"standard\", so they would be ignored (set "
           "model.attention = \"latent\", or remove them)");
    return;
  }
  const std::string why = "model.attention = \"latent\" ";
  if (m.positions != PositionKind::Rotary)
    fail(why + "needs model.positions = \"rotary\", not \"" + position_name(m.positions) +
         "\" (its decoupled rotary part qk_rope_head_dim carries the positions)");
  if (m.kv_heads() != m.heads)
    fail(why + "needs model.kv_heads = heads = " + std::to_string(m.heads) + ", not " +
         std::to_string(m.kv_heads()) + " (its keys and values are expanded per head from the "
         "latent: there are no shared key/value heads; remove model.kv_heads)");
  if (m.head_dim_set != 0 && m.head_dim_set != m.d_model / m.heads)
    fail(why + "ignores model.head_dim = " + std::to_string(m.head_dim_set) + " (a head is "
         "qk_nope_head_dim + qk_rope_head_dim wide for queries and keys, v_head_dim for values; "
         "remove model.head_dim)");
  if (m.linear_bias)
    fail(why + "needs model.bias = false (its projections are bias-free, as in DeepSeek-V2/V3; "
         "HF attention_bias = true is not supported)");
  if (m.qk_norm)
    fail(why + "needs model.qk_norm = false (its latents have their own RMSNorms; the heads "
         "are not normalised)");
}

// Sliding windows (model.attention_window): a pattern of at most one entry per block, on the
// standard attention core (latent attention's decode reads its own cache, which has no window).
void check_attention_window(const Config& c, const DeckFail& fail) {
  const ModelSpec& m = c.model;
  if (!m.windowed()) return;
  const std::string key = "model.attention_window = " + attention_window_text(m.attention_window);
  if (m.attention_window.size() > static_cast<size_t>(m.layers))
    fail(key + " has " + std::to_string(m.attention_window.size()) + " entries, more than "
         "model.layers = " + std::to_string(m.layers) + " (a pattern has one entry per block "
         "at most, repeated over the blocks)");
  if (m.latent_attention())
    fail(key + " does not combine with model.attention = \"latent\" yet (use "
         "attention = \"standard\", or attention_window = 0)");
}

// The mixture of experts' keys: only with model.feed_forward = "moe", and consistent.
void check_feed_forward_fields(const Config& c, const DeckFail& fail) {
  const MoeSpec& moe = c.model.moe;
  // Whether a moe_* key differs from its default (moe_ffn_hidden equal to ffn_hidden is the
  // default's value, as an effective configuration prints it).
  auto moe_keys_given = [&] {
    MoeSpec given = moe;
    if (given.ffn_hidden_set == c.model.ffn_hidden()) given.ffn_hidden_set = 0;
    return given != MoeSpec{};
  };
  if (c.model.feed_forward == FeedForwardKind::Moe) {
    if (moe.top_k > moe.experts)
      fail("model.moe_top_k = " + std::to_string(moe.top_k) + " exceeds model.moe_experts = " +
           std::to_string(moe.experts) + " (each token goes through top_k distinct experts: "
           "top_k must be 1 to " + std::to_string(moe.experts) + ")");
    check_expert_groups(moe, fail);
    if (moe.first_dense_layers >= c.model.layers)
      fail("model.moe_first_dense_layers = " + std::to_string(moe.first_dense_layers) +
           " leaves no mixture-of-experts layer among model.layers = " +
           std::to_string(c.model.layers) + " (it must be below layers; or set "
           "model.feed_forward = \"dense\")");
    if (c.model.activation != ActivationKind::SwiGlu)
      fail("model.feed_forward = \"moe\" needs model.activation = \"swiglu\" (the experts are "
           "SwiGLU, as in Mixtral, Qwen3-MoE and DeepSeek), not \"" +
           std::string(activation_name(c.model.activation)) + "\"");
    if (c.model.linear_bias)
      fail("model.feed_forward = \"moe\" needs model.bias = false (the router and the experts "
           "are bias-free, as in Mixtral, Qwen3-MoE and DeepSeek)");
    if (moe.capacity_factor != 0) {
      const double k = static_cast<double>(moe.top_k), E = static_cast<double>(moe.experts);
      std::ostringstream os;
      os << "model.moe_capacity_factor = " << moe.capacity_factor;
      if (moe.capacity_factor < 1.0 / k)
        fail(os.str() + " gives the experts together fewer slots than tokens (factor x top_k < 1), "
             "so that tokens lose every expert even when the routing is balanced (accepted: 0, "
             "dropless, or " + std::to_string(1.0 / k) + " to below " + std::to_string(E / k) + ")");
      if (moe.capacity_factor >= E / k)
        fail(os.str() + " lets each expert take every token (factor >= moe_experts / moe_top_k), "
             "so nothing is ever dropped (set 0 for dropless, or below " + std::to_string(E / k) + ")");
    }
    if (moe.router != RouterKind::Sigmoid && moe.bias_update_rate != MoeSpec{}.bias_update_rate)
      fail("model.moe_bias_update_rate is given but model.moe_router is \"" +
           std::string(router_name(moe.router)) + "\", which has no expert bias to update, so it "
           "would be ignored (set model.moe_router = \"sigmoid\", or remove it)");
  } else if (moe_keys_given()) {
    fail("model.moe_* keys are given but model.feed_forward is \"dense\", so they would be ignored "
         "(set model.feed_forward = \"moe\", or remove them)");
  }
}

// Multi-token prediction's keys (model/mtp_module.h).
void check_mtp_fields(const Config& c, const DeckFail& fail) {
  const ModelSpec& m = c.model;
  if (m.mtp_layers == 0) {
    if (m.mtp_loss_weight != ModelSpec{}.mtp_loss_weight)
      fail("model.mtp_loss_weight is given but model.mtp_layers = 0, so there is no multi-token "
           "loss to weigh and it would be ignored (set model.mtp_layers >= 1, or remove it)");
    return;
  }
  if (m.mtp_layers >= m.seq_len)
    fail("model.mtp_layers = " + std::to_string(m.mtp_layers) + " leaves depth " +
         std::to_string(m.mtp_layers) + " no position to predict from in a sequence of model.seq_len = " +
         std::to_string(m.seq_len) + " tokens (mtp_layers must be below seq_len)");
}

// The norm's eps, the learning rates, AdamW's betas and the batch.
void check_norm_and_optimizer_fields(const Config& c, const DeckFail& fail) {
  if (c.model.norm.kind == NormKind::Layer && c.model.norm.eps != 1e-5) {
    std::ostringstream os;
    os << "model.norm_eps = " << c.model.norm.eps << " with model.norm = \"layernorm\" (meshtrain's "
       << "LayerNorm kernels compute with eps 1e-5: set norm_eps = 1e-5, or norm = \"rmsnorm\")";
    fail(os.str());
  }
  if (c.train.min_lr > c.train.lr) {
    std::ostringstream os;
    os << "train.min_lr = " << c.train.min_lr << " exceeds train.lr = " << c.train.lr
       << " (min_lr must be <= lr)";
    fail(os.str());
  }
  if (c.train.beta1 >= 1.0 || c.train.beta2 >= 1.0)
    fail("train.beta1 and train.beta2 must be below 1");
  if (c.train.global_batch % c.train.micro_batch != 0)
    fail("train.global_batch = " + std::to_string(c.train.global_batch) +
         " is not a multiple of train.micro_batch = " + std::to_string(c.train.micro_batch));
}

// Muon's keys, and the layouts it does not run on yet: each of those moves the optimizer
// elsewhere (offload, parameter servers). Tensor parallelism and ZeRO's shards cut matrices into
// pieces, which the step gathers whole for Newton-Schulz (parallel/muon_matrices.h).
void check_muon_fields(const Config& c, const DeckFail& fail) {
  const ParallelOptions& par = c.parallel;
  if (c.train.optimizer != OptimizerKind::Muon) {
    MuonHyper given = c.train.muon;
    given.weight_decay = MuonHyper{}.weight_decay;
    if (given != MuonHyper{})
      fail("train.muon_* keys are given but train.optimizer is \"adamw\", so they would be "
           "ignored (set train.optimizer = \"muon\", or remove them)");
    return;
  }
  const std::string why = " with train.optimizer = \"muon\": ";
  if (par.offload != Offload::None)
    fail("parallel.offload = \"optimizer\"" + why + "the offloaded optimizer is AdamW's only "
         "(use parallel.offload = \"none\", or train.optimizer = \"adamw\")");
  if (par.async())
    fail("parallel.data_sync = \"async\"" + why + "the parameter servers step AdamW only "
         "(use parallel.data_sync = \"sync\", or train.optimizer = \"adamw\")");
}

// QK-clip (model/qk_clip.h) scales the query and key projections by the logits the attention
// kernel saw: refused where the logits are not the projections' own (q/k norms renormalise
// whatever the weights are; latent attention's shared rotary key) or where no kernel records them
// yet (ring attention). The CUDA backend is refused with the device (device_check.cpp).
void check_qk_clip_fields(const Config& c, const DeckFail& fail) {
  if (c.train.qk_clip_threshold <= 0) return;
  std::ostringstream tau;
  tau << "train.qk_clip_threshold = " << c.train.qk_clip_threshold;
  if (c.model.qk_norm)
    fail(tau.str() + " with model.qk_norm = true: the query and key norms undo any scaling of "
         "their projections, so clipping could not lower a logit (set qk_clip_threshold = 0)");
  if (c.model.latent_attention())
    fail(tau.str() + " with model.attention = \"latent\": QK-clip of latent attention's "
         "per-head parts is not implemented yet (set qk_clip_threshold = 0)");
  if (c.model.mtp_layers > 0)
    fail(tau.str() + " with model.mtp_layers = " + std::to_string(c.model.mtp_layers) + ": "
         "QK-clip of the multi-token depths' attention is not implemented yet (set "
         "qk_clip_threshold = 0, or mtp_layers = 0)");
  if (c.parallel.cp > 1)
    fail(tau.str() + " with parallel.cp = " + std::to_string(c.parallel.cp) + ": ring "
         "attention does not record the heads' largest logits yet (use cp = 1, or "
         "qk_clip_threshold = 0)");
  if (c.parallel.async())
    fail(tau.str() + " with parallel.data_sync = \"async\": the parameter servers hold the "
         "weights QK-clip would scale (use data_sync = \"sync\", or qk_clip_threshold = 0)");
}

// The pipeline schedule, its chunks and the partition of layers into them.
void check_schedule_fields(const Config& c, const DeckFail& fail) {
  if (c.parallel.virtual_stages > 1 && (c.parallel.schedule == ScheduleKind::OneFOneB ||
                                        c.parallel.schedule == ScheduleKind::ZeroBubbleH1))
    fail("parallel.virtual_stages = " + std::to_string(c.parallel.virtual_stages) +
         " needs parallel.schedule = \"interleaved\" or \"gpipe\" (" +
         std::string(schedule_name(c.parallel.schedule)) +
         " runs one chunk per rank; or set virtual_stages = 1)");
  if (c.parallel.schedule == ScheduleKind::ZeroBubbleV && c.parallel.virtual_stages != 2)
    fail("parallel.schedule = \"zb-v\" needs parallel.virtual_stages = 2, not " +
         std::to_string(c.parallel.virtual_stages) +
         " (zb-v runs exactly two chunks per rank, placed in a V; set virtual_stages = 2)");
  if (c.parallel.schedule == ScheduleKind::Interleaved && c.parallel.pp < 2)
    fail("parallel.schedule = \"interleaved\" needs parallel.pp >= 2 (with one stage use \"1f1b\")");
  if (!c.parallel.partition.empty()) {
    const int chunks = c.parallel.pp * c.parallel.virtual_stages;
    int sum = 0;
    for (int n : c.parallel.partition) sum += n;
    if (static_cast<int>(c.parallel.partition.size()) != chunks || sum != c.model.layers)
      fail("parallel.partition has " + std::to_string(c.parallel.partition.size()) +
           " entries summing to " + std::to_string(sum) + " (expected pp x virtual_stages = " +
           std::to_string(chunks) + " entries summing to model.layers = " +
           std::to_string(c.model.layers) + ")");
  }
}

// Uneven data-parallel shares: declared speeds, and the ZeRO stages that cannot take them.
void check_balance_fields(const Config& c, const DeckFail& fail) {
  const bool speeds = !c.parallel.rank_speeds.empty() || !c.parallel.node_speeds.empty();
  if (c.parallel.balance == Balance::Declared && !speeds)
    fail("parallel.balance = \"declared\" needs parallel.speeds (numbers, one per rank, or "
         "\"NODE-PATTERN=SPEED\" strings)");
  if (c.parallel.balance != Balance::Declared && speeds)
    fail("parallel.speeds is given but parallel.balance is not \"declared\", so the speeds would be "
         "ignored (set parallel.balance = \"declared\", or remove parallel.speeds)");
  if (c.parallel.uneven_shares() && c.parallel.zero >= 2 && !c.parallel.automatic.zero)
    fail("parallel.zero = " + std::to_string(c.parallel.zero) + " cannot take uneven data-parallel "
         "shares (parallel.balance = \"" +
         std::string(c.parallel.balance == Balance::Declared   ? "declared"
                     : c.parallel.balance == Balance::Measured ? "measured"
                                                               : "even") +
         "\"" + (c.parallel.rebalance ? ", rebalance = true" : "") +
         "): ZeRO 2 and 3 reduce gradients over the data-parallel group at every micro-batch, so "
         "every replica must run as many (use parallel.zero = 0 or 1, or parallel.balance = "
         "\"even\" with rebalance = false)");
}

// Asynchronous data parallelism (parameter servers) and the keys only it reads.
void check_data_sync_fields(const Config& c, const DeckFail& fail) {
  const ParallelOptions& par = c.parallel;
  if (par.async()) {
    const std::string why = " (parallel.data_sync = \"async\": ";
    if (par.servers < 1)
      fail("parallel.data_sync = \"async\" needs parallel.servers >= 1: the ranks that hold the "
           "parameters and optimizer state, launched beyond dp x tp x pp (e.g. servers = 1 and one "
           "more rank)");
    if (par.zero != 0 || par.automatic.zero)
      fail("parallel.zero = " + std::string(par.automatic.zero ? "\"auto\"" : std::to_string(par.zero)) +
           why + "the servers hold the optimizer state, sharded over them; set parallel.zero = 0)");
    if (par.uneven_shares())
      fail("parallel.balance / rebalance divide the batch by speed" + why +
           "replicas already take shares at their own pace; use parallel.balance = \"even\", "
           "rebalance = false)");
    if (par.offload != Offload::None)
      fail("parallel.offload = \"optimizer\"" + why +
           "the optimizer runs on the servers; use parallel.offload = \"none\")");
    if (c.model.feed_forward == FeedForwardKind::Moe && c.model.moe.router == RouterKind::Sigmoid)
      fail("model.moe_router = \"sigmoid\"" + why + "its expert bias moves after every step by the "
           "loads of the whole job's step, which replicas on their own pace do not share; use "
           "model.moe_router = \"softmax\", or parallel.data_sync = \"sync\")");
    if (par.automatic.any())
      fail("\"auto\" layout keys" + why +
           "the strategy advisor does not plan parameter servers; give parallel.tp, pp, "
           "schedule, recompute and train.micro_batch explicitly)");
  } else {
    if (par.servers > 0)
      fail("parallel.servers = " + std::to_string(par.servers) + " is given but parallel.data_sync "
           "is \"sync\", so the servers would be idle (set parallel.data_sync = \"async\", or "
           "servers = 0)");
    if (par.staleness > 0)
      fail("parallel.staleness = " + std::to_string(par.staleness) + " is given but "
           "parallel.data_sync is \"sync\", which is never stale (set parallel.data_sync = "
           "\"async\", or staleness = 0)");
  }
}

void check_cross_fields(const std::string& path, const Config& c) {
  const DeckFail fail{path};
  check_attention_fields(c, fail);
  check_latent_attention_fields(c, fail);
  check_attention_window(c, fail);
  check_feed_forward_fields(c, fail);
  check_mtp_fields(c, fail);
  check_norm_and_optimizer_fields(c, fail);
  check_muon_fields(c, fail);
  check_qk_clip_fields(c, fail);
  check_schedule_fields(c, fail);
  check_balance_fields(c, fail);
  check_data_sync_fields(c, fail);
  if (c.data.train.size() == 1 && c.data.train[0] == "none")
    fail("data.train = \"none\": training needs data (\"synthetic\" or token shards)");
}

}  // namespace

std::string read_deck_file(const std::string& path) {
  // A directory opens and reads as empty text on Linux, which would train the default model;
  // a FIFO's open would block every rank forever.
  const std::string not_regular =
      non_regular_file_problem(path, "an input deck", "a TOML file, e.g. input/default.toml");
  if (!not_regular.empty()) throw DeckError(not_regular);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DeckError(path + ": cannot read the input deck (does the file exist?)");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

Config parse_deck(const std::string& path, const std::string& text,
                  const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(text, path);
  OverrideOrigins origins;
  for (const std::string& o : overrides) apply_override(root, o, origins);
  // The file's strings were checked as it was read; an override's ("a\u0000b") are checked here.
  refuse_nul_characters(root, [&](const toml::source_region& at, const std::string& name) {
    return origin_of(path, at, name, origins);
  });

  const std::vector<std::string> sections = section_names();
  Config c;
  c.deck_path = path;
  c.deck_text = text;
  c.train.precision_auto = true;  // the deck's default; a train.precision key overrides it
  for (auto&& [sec_key, sec_node] : root) {
    const std::string sec(sec_key.str());
    if (std::find(sections.begin(), sections.end(), sec) == sections.end()) {
      const std::string hint = nearest_name(sec, sections);
      std::string all;
      for (const std::string& s : sections) all += (all.empty() ? "" : ", ") + s;
      throw DeckError(location(path, sec_node, origins, sec) + ": unknown section [" + sec + "]" +
                      (hint.empty() ? "" : " (did you mean [" + hint + "]?)") +
                      "; sections are " + all);
    }
    const toml::table* table = sec_node.as_table();
    if (!table)
      throw DeckError(location(path, sec_node, origins, sec) + ": " + sec + " must be a table ([" + sec + "])");
    std::vector<std::string> known;
    for (const KeySpec& k : schema())
      if (k.section == sec) known.push_back(k.key);
    // A key that sets its section's defaults (model.family) goes first, wherever it stands,
    // so that the keys beside it override the defaults and not the reverse.
    std::vector<std::pair<std::string, const toml::node*>> entries;
    for (auto&& [key_key, node] : *table) {
      const bool first = sec + "." + std::string(key_key.str()) == "model.family";
      entries.insert(first ? entries.begin() : entries.end(), {std::string(key_key.str()), &node});
    }
    for (const auto& entry : entries) {
      const std::string& key = entry.first;
      const toml::node& node = *entry.second;
      const auto spec = std::find_if(schema().begin(), schema().end(), [&](const KeySpec& k) {
        return k.section == sec && k.key == key;
      });
      if (spec == schema().end()) {
        const std::string hint = nearest_name(key, known);
        std::string all;
        for (const std::string& s : known) all += (all.empty() ? "" : ", ") + s;
        throw DeckError(location(path, node, origins, sec + "." + key) + ": unknown key " + sec + "." + key +
                        (hint.empty() ? "" : " (did you mean " + sec + "." + hint + "?)") +
                        "; keys of [" + sec + "] are " + all);
      }
      const std::string problem = spec->apply(node, c);
      if (!problem.empty())
        throw DeckError(location(path, node, origins, sec + "." + key) + ": " + sec + "." + key + " = " + repr(node) + " " +
                        problem + " (expected " + spec->accepted + ")");
    }
  }
  if (c.run.dir.empty()) c.run.dir = "runs/" + c.run.name;
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = c.run.dir + "/checkpoints";
  check_cross_fields(path, c);
  return c;
}

std::string deck_reference_markdown() {
  std::ostringstream os;
  for (const std::string& sec : section_names()) {
    os << "\n#### [" << sec << "]\n\n| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";
    for (const KeySpec& k : schema()) {
      if (k.section != sec) continue;
      os << "| `" << k.key << "` | " << k.type << " | `" << k.default_text << "` | " << k.accepted
         << " | " << k.doc << " |\n";
    }
  }
  return os.str();
}

GridShape Config::grid_shape() const {
  GridShape g;
  g.dp = parallel.dp;
  g.tp = parallel.tp;
  g.pp = parallel.pp;
  g.cp = parallel.cp;
  g.ep = parallel.ep;
  g.order = GridShape::parse_order(parallel.order);
  g.head_stage = parallel.schedule == ScheduleKind::ZeroBubbleV ? HeadStage::First : HeadStage::Last;
  return g;
}

}  // namespace meshtrain
