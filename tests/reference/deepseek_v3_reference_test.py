#!/usr/bin/env python3
"""The DeepSeek-V3 parts of the fp64 NumPy reference (deepseek_v3_reference.py) against facts that
need neither meshtrain nor transformers: the interleaved rotary layout as a permutation of the
rotate-half one, YaRN at DeepSeek-V3's published settings, and the noaux_tc router's group
limit, biased choice and unbiased gates. transformers itself judges the whole model in
tests/judges/deepseek_v3_reference_judge.py.

Exit status 77 (CTest: skipped) where NumPy is missing.
"""
import math
import os
import sys
import unittest

try:
    import numpy as np
except ImportError as e:  # a visible skip, not a pass
    print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3_reference as dsv3  # noqa: E402
import hf_decoder_reference as ref  # noqa: E402

# DeepSeek-V3's config.json rope_scaling, and the shapes the router reads.
DEEPSEEK_V3_YARN = {"model_type": "deepseek_v3", "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "max_position_embeddings": 163840,
                    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                     "mscale": 1.0, "mscale_all_dim": 1.0,
                                     "original_max_position_embeddings": 4096}}


class DeepseekV3ReferenceSelfChecks(unittest.TestCase):
    def test_interleaved_rotary_is_rotate_half_of_the_deinterleaved_channels(self):
        rng = np.random.default_rng(1)
        x, inv = rng.standard_normal((2, 3, 7, 8)), rng.uniform(0.01, 1.0, 4)
        positions = np.arange(7)
        deinterleaved = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        np.testing.assert_allclose(dsv3.rotate_pairs(x, positions, inv, 1.0, True),
                                   ref.rotate(deinterleaved, positions, inv), rtol=0, atol=1e-14)
        np.testing.assert_allclose(dsv3.rotate_pairs(x, positions, inv, 1.5, False),
                                   1.5 * ref.rotate(x, positions, inv), rtol=0, atol=1e-14)

    def test_yarn_at_deepseek_v3_settings(self):
        # Pairs below i = floor(64 ln(4096 / (2 pi 32)) / (2 ln 1e4)) = 10 keep theta^(-2i/64),
        # pairs from ceil(64 ln(4096 / (2 pi)) / (2 ln 1e4)) = 23 on are divided by 40.
        inv = dsv3.rotary_inverse_frequencies(DEEPSEEK_V3_YARN)
        kept = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)
        np.testing.assert_allclose(inv[:11], kept[:11], rtol=1e-15)
        np.testing.assert_allclose(inv[23:], kept[23:] / 40, rtol=1e-15)
        ramp = (np.arange(11, 23) - 10) / 13
        np.testing.assert_allclose(inv[11:23], kept[11:23] * (1 - ramp) + kept[11:23] / 40 * ramp, rtol=1e-15)
        self.assertEqual(dsv3.rotary_amplitude(DEEPSEEK_V3_YARN), 1.0)  # mscale / mscale_all_dim
        m = 0.1 * math.log(40) + 1
        self.assertAlmostEqual(m, 1.368888, places=6)
        self.assertAlmostEqual(dsv3.softmax_scale(DEEPSEEK_V3_YARN), 192 ** -0.5 * m * m, places=15)
        self.assertAlmostEqual(dsv3.softmax_scale(DEEPSEEK_V3_YARN), 0.135234, places=6)

    def test_router_group_limit_bias_and_gates(self):
        # Four groups of two experts; logits give sigmoid scores. Group 0 holds the single best
        # expert, group 1 two good ones: with one group eligible, group 1 wins on its top-two sum.
        config = {"n_group": 4, "topk_group": 1, "num_experts_per_tok": 2, "n_routed_experts": 8,
                  "norm_topk_prob": True, "routed_scaling_factor": 2.5}
        logits = np.array([[3.0, -3.0, 2.0, 2.0, 0.0, 0.0, -1.0, -1.0]])
        s = 1 / (1 + np.exp(-logits[0]))
        w = {"model.layers.0.mlp.gate.weight": np.eye(8),
             "model.layers.0.mlp.gate.e_score_correction_bias": np.zeros(8)}
        experts, gates = dsv3.route_noaux_tc(logits, w, config, 0)
        self.assertEqual(sorted(experts[0]), [2, 3])
        np.testing.assert_allclose(gates[0], 2.5 * s[[2, 3]] / s[[2, 3]].sum(), rtol=1e-15)
        # Two groups eligible, and a bias that lifts expert 4 above expert 0 for the choice only:
        # its gate is still its unbiased score, unnormalised here, scaled.
        w["model.layers.0.mlp.gate.e_score_correction_bias"] = np.array([0, 0, 0, 0, 2.0, 0, 0, 0])
        config.update(topk_group=2, norm_topk_prob=False)
        experts, gates = dsv3.route_noaux_tc(logits, w, config, 0)
        self.assertEqual(list(experts[0]), [4, 2])  # group 2 (keys 2.5 + 0.5) and group 1 (0.88 + 0.88)
        np.testing.assert_allclose(gates[0], 2.5 * s[[4, 2]], rtol=1e-15)


if __name__ == "__main__":
    unittest.main(verbosity=2)
