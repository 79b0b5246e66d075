#pragma once
// Layout-parity harness: runs a deck on one rank (the reference) and on the whole world with
// some layout, and compares the loss after every step and every parameter element after the
// last. Every rank runs the (small) reference itself on MPI_COMM_SELF, so each rank can check
// the parameter pieces it owns against the reference's global values without gathering.

#include <mpi.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {
class Backend;
class Trainer;
}  // namespace meshtrain

namespace meshtrain::testing {

// A model small enough to train a few steps in milliseconds, with dimensions divisible by every
// tp, pp x virtual_stages and micro-batch count the tests use.
Config tiny_config(const std::string& run_dir);
// `m` (tiny_config's model) with Llama's sub-layers: RMSNorm, SwiGLU of width 88 (gate and up
// split by columns), no biases, untied.
ModelSpec tiny_rms_swiglu(ModelSpec m);
// `m` (tiny_config's model) as a mixture of experts after one dense block (DeepSeek's
// first_k_dense_replace): Llama's sub-layers (RMSNorm, SwiGLU, no biases, untied), 4 SwiGLU
// experts of width 24, top 2, a shared expert, both balancing losses on. Whole on every tensor
// rank: tp without sp computes each token on every rank, with sp its own share, and the
// balancing sums cross the sequence-parallel and context ranks.
ModelSpec tiny_moe(ModelSpec m);

struct Reference {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;  // global values after the last step
};
// What a test changes in a trainer's initial parameters (the same change in the reference and
// the layout under test, e.g. a router skewed towards some experts); null: nothing.
using InitialChange = std::function<void(Trainer& trainer, Backend& backend)>;

// Single rank, one micro-batch, no ZeRO: the plainest execution of `config`'s training.
Reference run_reference(Config config, int steps, const InitialChange& change = nullptr);

struct ParityResult {
  std::vector<double> losses;
  double max_loss_error = 0;   // max over steps of |loss - reference| / |reference|
  // max over parameters of max|a - b| / max|b| (every copy in the grid, replicas included)
  double max_param_error = 0;
  std::string worst_param;
  // max over parameters of ||a - b||_2 / ||b||_2, each element counted once in the grid
  double max_param_l2_error = 0;
  std::string worst_l2_param;
  // ||a - b||_2 / ||b||_2 over all parameters as one vector
  double params_l2_error = 0;
  // Every owned parameter element after the last step, in owned-piece order (bitwise checks).
  std::vector<double> owned_values;
};
// Runs `config` on MPI_COMM_WORLD (its layout must fit the world size).
ParityResult run_parallel(Config config, int steps, const Reference& reference,
                          const InitialChange& change = nullptr);
// Multiplies rows [first_row, end) of every parameter named "*<suffix>" (global row index along
// dimension 0 of its global shape) by `factor`, wherever this rank holds them: in the layers'
// values, or in its ZeRO-3 shards. fp32 and fp64 parameters.
void scale_rows_from(Trainer& trainer, Backend& backend, const std::string& suffix, int64_t first_row,
                     double factor);
// Compares a trainer on `comm` (its grid's world) with the reference: `losses` are those of
// steps first_step, first_step + 1, ...; the parameters are compared with the reference's
// after its last step. Collective over `comm`.
ParityResult compare_with_reference(Trainer& trainer, Backend& backend, MPI_Comm comm,
                                    const std::vector<double>& losses, int first_step,
                                    const Reference& reference);

}  // namespace meshtrain::testing
