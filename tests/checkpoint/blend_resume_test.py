#!/usr/bin/env python3
"""Weighted blends (data.train as {path, weight} tables; io/blend_schedule.h) through checkpoints.

1. A blended run records each source's position (@data_blend): at step 2 the counts the
   blending rule gives (computed here independently: sample n from the source with the largest
   w_k (n + 1) - c_k, the first on a tie), and resuming its step-2 checkpoint on the same layout
   writes a step-4 checkpoint bitwise equal to the uninterrupted run's; on another layout (one
   rank) within fp32 round-off. The small source wraps inside the run. data.val as a blend
   evaluates.
2. A checkpoint without @data_blend (a run on one source, data.train as a path, as every
   checkpoint before blends) resumes with data.train as a blend of that one source and continues
   bit for bit; a fresh blend of one source trains bit for bit as the path does.

usage: blend_resume_test.py --meshtrain BIN --mpiexec MPIEXEC
"""

import os
import shutil

import numpy as np

import harness

WEIGHTS = [0.7, 0.3]


def blend_counts(weights, n):
    total = sum(weights)
    w = [x / total for x in weights]
    c = [0] * len(w)
    for i in range(n):
        deficits = [w[k] * (i + 1) - c[k] for k in range(len(w))]
        c[deficits.index(max(deficits))] += 1
    return c


class Blend(harness.Case):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(56)
        self.wide = os.path.join(self.dir, "wide.bin")
        self.narrow = os.path.join(self.dir, "narrow.bin")
        harness.write_token_shard(self.wide, rng.integers(0, 128, 3000), 256)
        harness.write_token_shard(self.narrow, rng.integers(128, 256, 120), 256)  # 7 samples
        self.blend = ('data.train=[{path = "%s", weight = 0.7, name = "wide"}, '
                      '{path = "%s", weight = 0.3, name = "narrow"}]' % (self.wide, self.narrow))

    def model(self, path):
        import h5py
        with h5py.File(path, "r") as f:
            return {name: f["model"][name][()] for name in f["model"]}, \
                   f.attrs.get("data_blend")

    def resume(self, ranks, step_path, into, sets):
        os.makedirs(into)
        shutil.copy(step_path, into)
        self.train(ranks, list(sets) + ['checkpoint.resume="%s"' % os.path.join(into, os.path.basename(step_path)),
                                        'checkpoint.dir="%s"' % into, "data.val=\"none\""])
        return os.path.join(into, "step_%08d.h5" % 4)

    def test_a_blend_resumes_from_its_recorded_positions(self):
        # Validation on a blend too (read in order in each source): evaluated after the last step.
        val_blend = self.blend.replace("data.train", "data.val")
        _, out, _ = self.train(2, [self.blend, val_blend])
        self.assertRegex(out, r"(?m)^step +4/4 \| val_loss \d+\.\d+$")
        self.assertIn("val 2 sources: wide weight 0.7", out)
        straight, recorded = self.model(self.ckpt(4))
        _, at2 = self.model(self.ckpt(2))
        if isinstance(at2, bytes):
            at2 = at2.decode()
        want = blend_counts(WEIGHTS, 2 * 8)
        self.assertEqual(at2, "blend_position 1\n%d %d\n" % tuple(want))
        self.assertGreater(blend_counts(WEIGHTS, 4 * 8)[1], 7)  # the narrow source wraps
        resumed, _ = self.model(self.resume(2, self.ckpt(2), os.path.join(self.dir, "same"), [self.blend]))
        for name in straight:
            self.assertTrue(np.array_equal(straight[name], resumed[name]), name)
        other, _ = self.model(self.resume(1, self.ckpt(2), os.path.join(self.dir, "one"), [self.blend]))
        for name in straight:
            np.testing.assert_allclose(other[name], straight[name], rtol=0, atol=2e-5, err_msg=name)

    def test_a_one_source_checkpoint_resumes_as_a_blend_of_it(self):
        path_form = 'data.train="%s"' % self.wide
        one_source = 'data.train=[{path = "%s"}]' % self.wide
        self.train(2, [path_form, "data.val=\"none\""])
        straight, recorded = self.model(self.ckpt(4))
        self.assertIsNone(recorded)
        resumed, _ = self.model(self.resume(2, self.ckpt(2), os.path.join(self.dir, "blend"), [one_source]))
        for name in straight:
            self.assertTrue(np.array_equal(straight[name], resumed[name]), name)
        fresh_dir = os.path.join(self.dir, "fresh")
        self.train(2, [one_source, "data.val=\"none\"", 'checkpoint.dir="%s"' % fresh_dir])
        fresh, _ = self.model(os.path.join(fresh_dir, "step_00000004.h5"))
        for name in straight:
            self.assertTrue(np.array_equal(straight[name], fresh[name]), name)


if __name__ == "__main__":
    harness.main()
