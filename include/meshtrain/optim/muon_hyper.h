#pragma once
// Which optimizer a run trains with, and Muon's settings (train.optimizer and train.muon_*):
// the choice alone, so that the deck (config/) and the training state (parallel/) share it
// without depending on each other's headers.
//
// Muon (Keller Jordan, "Muon: an optimizer for hidden layers", 2024; Liu et al., "Muon is
// scalable for LLM training", arXiv 2502.16982) steps each hidden weight matrix W (rows x cols)
// with its gradient G as
//   M <- momentum M + G                                  (M: one momentum matrix per W)
//   U <- G + momentum M  (nesterov)  or  M
//   O <- NewtonSchulz(U / ||U||_F)                        ns_steps quintic iterations
//   W <- (1 - lr weight_decay) W - lr rms_scale sqrt(max(rows, cols)) O
// The scale rms_scale sqrt(max(rows, cols)) gives the update the RMS of AdamW's (Moonlight's
// choice), so Muon's matrices share train.lr and its schedule with the AdamW parameters.

namespace meshtrain {

enum class OptimizerKind { AdamW, Muon };

inline const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::Muon ? "muon" : "adamw"; }

struct MuonHyper {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  // The quintic's coefficients: X <- a X + b (X X^T) X + c (X X^T)^2 X.
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  double rms_scale = 0.2;
  double weight_decay = 0.1;  // train.weight_decay, decoupled
  bool operator==(const MuonHyper&) const = default;
};

}  // namespace meshtrain
