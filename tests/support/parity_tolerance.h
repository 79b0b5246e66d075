#pragma once
// How close a layout's training must stay to the single-rank reference (support/parity.h), from
// the arithmetic rather than from one machine's figures.
//
// First-order rounding analysis: a computed value is exact + sum_i delta_i c_i with |delta_i| <= u
// for each of its roundings (u the unit round-off: fp64 2^-53, fp32 2^-24, bf16 2^-8 for stored
// values; fp32 accumulates bf16 products). Let r be what the reference's own roundings do to a
// metric (the loss, the parameters as a whole, each tensor, each element): its distance from the
// same single-rank run in a precision at least 2^16 finer (fp32 for bf16, fp64 for fp32), whose
// own error is negligible beside it. r holds the deck's sizes (reduction lengths d_model, seq_len,
// tokens per batch; depth; steps) and the data's sensitivity to them (Adam normalises a gradient
// that nearly cancels into a full-size update, so element errors depend on the data), measured
// rather than guessed.
//
// A layout evaluates the same expressions with its sums in other orders: micro-batches and
// data-parallel ranks, tensor-parallel partial sums, and the GEMM library's blocking for other
// row counts, which depends on the instruction set (AMX tiles, AVX512-BF16 pairs, AVX2 or
// AVX512 in fp32 block differently). Each reordered sum has as many roundings, each as bounded,
// as the reference's: the layout is within r of exact too, so within 2r of the reference. Where
// it rounds a value k times and the reference once (bf16 under tensor parallelism: the partial
// sum, then the total, k = 2; under context parallelism each of a row's cp attention merges,
// k = cp) its error grows to k r: within (k + 1) r. r is one realisation of a sum of many
// independent roundings and another realisation differs from it by a factor of order one; the
// bound takes lambda = 2 for that. Each metric is itself a reduction computed in the precision
// (the loss a mean over the batch's n tokens, the norms sums), which rounds by up to sqrt(n) u_acc
// (probabilistic bound, Higham and Mary 2019; u_acc the accumulation's unit round-off) even
// where the reference's rounding happens to leave the metric unmoved:
//
//     tolerance = lambda (k + 1) max(r, sqrt(n) u_acc)
//
// fp64 has no finer precision to measure against: first order, its rounding does what fp32's
// does scaled by the ratio of unit round-offs, r64 = r32 2^-29.

#include "support/parity.h"

namespace meshtrain::testing {

struct Tolerances {
  double loss;          // per step, relative
  double params;        // all parameters as one vector, norm-wise relative
  double each_tensor;   // every parameter tensor, norm-wise relative
  double each_element;  // every element (every copy), relative to its tensor's largest value
};

// r: the metrics of `coarse` (the reference in the tested precision) against `fine` (the same
// single-rank run in a finer precision), each scaled by `scale` (1, or 2^-29 to carry fp32's
// r over to fp64).
Tolerances rounding_effect(const Reference& coarse, const Reference& fine, double scale = 1.0);

// The bound above for a layout that rounds each stored value `roundings` (k) times where the
// reference rounds once, accumulating with unit round-off `accumulation_roundoff`, on batches of
// `tokens` tokens.
Tolerances parity_tolerances(const Tolerances& rounding, int roundings, double accumulation_roundoff,
                             double tokens);

}  // namespace meshtrain::testing
