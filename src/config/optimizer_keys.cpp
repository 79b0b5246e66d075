// The [train] keys that choose the optimizer and set Muon (optim/muon_hyper.h); AdamW's own keys
// (beta1, beta2, eps, weight_decay) are with the other [train] keys in deck_schema.cpp.

#include "deck_keys.h"
#include "meshtrain/config/config.h"

namespace meshtrain {

using namespace deck_keys;

namespace {

OptimizerKind optimizer_named(const std::string& name) {
  return name == "muon" ? OptimizerKind::Muon : OptimizerKind::AdamW;
}

}  // namespace

void add_optimizer_keys(std::vector<KeySpec>& k) {
  k.push_back(choice_key("train", "optimizer", "adamw", {"adamw", "muon"},
                         "\"adamw\": AdamW for every parameter. \"muon\": Muon (momentum "
                         "orthogonalised by Newton-Schulz) for the hidden weight matrices "
                         "(attention projections, feed-forward and each expert's matrices, each "
                         "matrix on its own), AdamW (train.beta1, beta2, eps) for the rest "
                         "(embeddings, output head, norms, biases, routers); both follow train.lr's "
                         "schedule and train.weight_decay. `meshtrain plan` prints the split. Runs "
                         "with data, tensor, context, expert and pipeline parallelism under ZeRO "
                         "0-3; offload and parameter servers are refused for now "
                         "(docs/parallelism-and-schedules.md).",
                         [](Config& c, const std::string& v) { c.train.optimizer = optimizer_named(v); }));
  k.push_back(bounded_float_key("train", "muon_momentum", "0.95", 0.0, 0.999,
                                "Muon's momentum coefficient (the published 0.95).",
                                [](Config& c, double v) { c.train.muon.momentum = v; }));
  k.push_back(bool_key("train", "muon_nesterov", true,
                       "Muon steps with Nesterov's look-ahead (gradient + momentum x buffer).",
                       [](Config& c, bool v) { c.train.muon.nesterov = v; }));
  k.push_back(int_key("train", "muon_ns_steps", 5, 1, 100,
                      "Newton-Schulz iterations per matrix and step.",
                      [](Config& c) -> auto& { return c.train.muon.ns_steps; }));
  // The quintic's coefficients, one key each.
  struct Coefficient {
    const char *key, *default_text, *doc;
    double MuonHyper::*field;
  };
  for (const Coefficient& q : {
           Coefficient{"muon_ns_a", "3.4445", "Newton-Schulz quintic's coefficient a (X <- aX + b(XX^T)X + c(XX^T)^2 X).", &MuonHyper::ns_a},
           Coefficient{"muon_ns_b", "-4.775", "Newton-Schulz quintic's coefficient b.", &MuonHyper::ns_b},
           Coefficient{"muon_ns_c", "2.0315", "Newton-Schulz quintic's coefficient c.", &MuonHyper::ns_c}})
    k.push_back(bounded_float_key("train", q.key, q.default_text, -100.0, 100.0, q.doc,
                                  [field = q.field](Config& c, double v) { c.train.muon.*field = v; }));
  k.push_back(bounded_float_key("train", "muon_rms_scale", "0.2", 0.0, 100.0,
                                "A Muon update of a rows x cols matrix is scaled by "
                                "muon_rms_scale x sqrt(max(rows, cols)) x train.lr: 0.2 matches "
                                "AdamW's update RMS (Moonlight), so both share train.lr.",
                                [](Config& c, double v) { c.train.muon.rms_scale = v; }));
  k.push_back(bounded_float_key(
      "train", "qk_clip_threshold", "0", 0.0, 1e9,
      "MuonClip's QK-clip (Kimi K2): 0 is off; tau > 0 (Kimi K2 used 100) records each "
      "attention head's largest pre-softmax logit over the step (every micro-batch, every rank "
      "holding the head) and, after the optimizer step, scales a head whose largest logit S "
      "exceeded tau back by gamma = tau / S: multi-head attention's query and key rows (and "
      "biases) by sqrt(gamma) each; under grouped-query attention the query rows by gamma and the "
      "shared key head not at all. With \"muon\" or \"adamw\" alike; the progress line and "
      "metrics.jsonl show the clipped heads and the largest logit. On the CPU backend, without "
      "parallel.cp, model.qk_norm, latent attention or multi-token depths "
      "(docs/parallelism-and-schedules.md).",
      [](Config& c, double v) { c.train.qk_clip_threshold = v; }));
}

}  // namespace meshtrain
