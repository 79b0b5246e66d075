"""SIGKILL while a checkpoint is written never costs the previous one (DESIGN invariant 3).

The checkpointer's test hook MESHTRAIN_FAULT=checkpoint_kill:<phase>@<step> makes rank 0 of a
2-rank job raise SIGKILL (mpiexec then ends the others) at one phase of writing step 4's
checkpoint, step 2's being complete:
  data    half the datasets written: step_4.h5.tmp is incomplete;
  rename  the .tmp closed and verified, not yet renamed;
  prune   (keep = 1) step 6 renamed, the first old checkpoint deleted, the next not yet.
Each time: the job fails, `meshtrain inspect` passes the newest complete checkpoint, and a
restart with resume = "auto" says "resumed from" that checkpoint, continues the loss curve of an
uninterrupted run exactly (same layout) and finishes with a complete checkpoint.

KillDuringBackgroundCheckpoint does the same with checkpoint.async = true and 6 steps, so that
step 4's checkpoint is written by the background thread while steps 5 and 6 train: the kill
strikes there, and what is left on disk is what a synchronous save leaves. It also shows that
a background save changes nothing: its losses are the foreground run's, and a checkpoint written
in the background continues the curve exactly.
"""

import os

import harness


class KillDuringCheckpoint(harness.Case):
    def kill_and_recover(self, phase, expect_tmp_ok):
        _, straight, _ = self.train(2, ["run.dir=" + self.run_dir + "_straight"])
        status, _, err = self.train(2, env={"MESHTRAIN_FAULT": "checkpoint_kill:%s@4" % phase},
                                    expect=None)
        self.assertNotEqual(status, 0, "the job survived the kill")
        self.assertIn("MESHTRAIN_FAULT: rank 0 kills itself in checkpoint phase '%s'" % phase, err)
        self.assertTrue(os.path.exists(self.ckpt(2)))
        self.assertFalse(os.path.exists(self.ckpt(4)))
        self.assertTrue(os.path.exists(self.ckpt(4) + ".tmp"))
        _, out, _ = self.inspect(self.ckpt(2))
        self.assertIn("step 2 (optimizer steps 2)", out)
        self.assertIn("all checksums OK", out)
        # The .tmp: incomplete after "data"; complete but not renamed after "rename".
        self.inspect(self.ckpt(4) + ".tmp", expect=0 if expect_tmp_ok else 1)

        _, out, _ = self.train(2)
        self.assertIn("resumed from %s at step 2" % self.ckpt(2), out)
        resumed = harness.losses(out)
        self.assertEqual(sorted(resumed), [3, 4])
        self.assertEqual({s: harness.losses(straight)[s] for s in (3, 4)}, resumed)
        self.assertTrue(os.path.exists(self.ckpt(4)))
        self.assertFalse(os.path.exists(self.ckpt(4) + ".tmp"))
        self.inspect(self.ckpt(4))

    def test_kill_while_writing_data(self):
        self.kill_and_recover("data", expect_tmp_ok=False)

    def test_kill_before_rename(self):
        self.kill_and_recover("rename", expect_tmp_ok=True)

    def test_kill_while_pruning(self):
        self.train(2, ["checkpoint.keep=5"])  # steps 2 and 4
        status, _, err = self.train(2, ["train.steps=6", "checkpoint.keep=1"],
                                    env={"MESHTRAIN_FAULT": "checkpoint_kill:prune@6"}, expect=None)
        self.assertNotEqual(status, 0, "the job survived the kill")
        self.assertIn("phase 'prune'", err)
        # Step 6 is complete; the oldest went first, so step 4 is still there.
        self.assertFalse(os.path.exists(self.ckpt(2)))
        self.assertTrue(os.path.exists(self.ckpt(4)))
        self.assertTrue(os.path.exists(self.ckpt(6)))
        self.inspect(self.ckpt(6))
        _, out, _ = self.train(2, ["train.steps=8", "checkpoint.keep=1"])
        self.assertIn("resumed from %s at step 6" % self.ckpt(6), out)
        self.assertEqual(sorted(os.listdir(self.ckpt_dir)), ["step_00000008.h5"])


class KillDuringBackgroundCheckpoint(harness.Case):
    ASYNC = ["checkpoint.async=true", "train.steps=6"]

    def kill_and_recover(self, phase, expect_tmp_ok):
        _, straight, _ = self.train(2, self.ASYNC + ["run.dir=" + self.run_dir + "_straight"])
        self.assertIn("writing in the background", straight)
        self.assertIn("step_00000004.h5 (", straight)  # reported when the background write ended
        status, out, err = self.train(2, self.ASYNC, env={"MESHTRAIN_FAULT": "checkpoint_kill:%s@4" % phase},
                                      expect=None)
        self.assertNotEqual(status, 0, "the job survived the kill")
        self.assertIn("MESHTRAIN_FAULT: rank 0 kills itself in checkpoint phase '%s' at step 4" % phase, err)
        self.assertIn("step_00000004.h5: snapshot of", out)
        self.assertTrue(os.path.exists(self.ckpt(2)))
        self.assertFalse(os.path.exists(self.ckpt(4)))
        self.assertFalse(os.path.exists(self.ckpt(6)))
        self.assertTrue(os.path.exists(self.ckpt(4) + ".tmp"))
        _, info, _ = self.inspect(self.ckpt(2))
        self.assertIn("all checksums OK", info)
        self.inspect(self.ckpt(4) + ".tmp", expect=0 if expect_tmp_ok else 1)

        _, out, _ = self.train(2, self.ASYNC)
        self.assertIn("resumed from %s at step 2" % self.ckpt(2), out)
        resumed = harness.losses(out)
        self.assertEqual(sorted(resumed), [3, 4, 5, 6])
        self.assertEqual({s: harness.losses(straight)[s] for s in (3, 4, 5, 6)}, resumed)
        for step in (4, 6):
            self.inspect(self.ckpt(step))
        self.assertFalse(os.path.exists(self.ckpt(4) + ".tmp"))

    def test_kill_while_writing_data_in_the_background(self):
        self.kill_and_recover("data", expect_tmp_ok=False)

    def test_kill_before_rename_in_the_background(self):
        self.kill_and_recover("rename", expect_tmp_ok=True)

    def test_background_save_changes_nothing(self):
        _, foreground, _ = self.train(2, ["train.steps=6", "run.dir=" + self.run_dir + "_foreground"])
        _, background, _ = self.train(2, self.ASYNC)
        self.assertEqual(harness.losses(foreground), harness.losses(background))
        self.assertEqual(sorted(harness.losses(background)), [1, 2, 3, 4, 5, 6])
        # The snapshot of step 4 was taken before step 5 changed the state: resuming it
        # continues the curve exactly.
        _, out, _ = self.train(2, self.ASYNC + ['checkpoint.resume="%s"' % self.ckpt(4)])
        self.assertIn("resumed from %s at step 4" % self.ckpt(4), out)
        self.assertEqual({s: harness.losses(background)[s] for s in (5, 6)}, harness.losses(out))


if __name__ == "__main__":
    harness.main()
