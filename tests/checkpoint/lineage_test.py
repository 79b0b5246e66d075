"""A run never overwrites or prunes checkpoints it did not write, and a checkpoint only loads
into the model that wrote it.

Lineage: run A writes step 2 and step 4. Run B, started afresh (checkpoint.resume = "none")
into the same checkpoint.dir, is refused before training with a message naming the directory,
A's files and what to do; A's files are untouched and resume = "auto" continues A, whose
lineage (inspect prints it) is carried across the resume. A run resumed from a path into a
directory of another lineage is refused the same way.

Model identity: a checkpoint written with model.heads = 4 (the shapes do not depend on heads)
is refused by eval and by a resuming train run with model.heads = 2, naming the key and both
values; so is model.tie_embeddings.

Effective configuration: a run trained with --set model.layers=2 is inspected as 2 layers, with
its --set overrides and the effective configuration shown; an eval with the deck alone (4
layers) is refused naming model.layers and both values.
"""

import hashlib
import os
import re

import harness


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def lineage(out):
    m = re.search(r"^lineage (\S+)", out, re.M)
    return m.group(1) if m else None


class Lineage(harness.Case):
    def test_fresh_run_refuses_a_directory_of_another_run(self):
        self.train(2)  # run A: step 2 and step 4
        before = {s: digest(self.ckpt(s)) for s in (2, 4)}

        # Run B: another seed, starting afresh into A's directory, keeping one checkpoint.
        status, out, err = self.train(2, ["checkpoint.resume=\"none\"", "run.seed=99",
                                          "train.steps=2", "checkpoint.keep=1"], expect=1)
        self.assertNotIn("step     1/", out, "the refused run trained")
        self.assertIn(self.ckpt_dir, err)
        self.assertIn("step_00000002.h5", err)
        self.assertIn("step_00000004.h5", err)
        self.assertIn("checkpoint.dir", err)
        self.assertIn("checkpoint.resume = \"auto\"", err)
        self.assertEqual(err.count("error:"), 1, err)  # agreed, printed once
        self.assertEqual({s: digest(self.ckpt(s)) for s in (2, 4)}, before)
        self.assertEqual(sorted(os.listdir(self.ckpt_dir)), ["step_00000002.h5", "step_00000004.h5"])

        # resume = "auto" continues A, and its lineage goes on.
        _, out, _ = self.inspect(self.ckpt(4))
        a = lineage(out)
        self.assertRegex(a or "", r"^[0-9a-f]{32}$", out)
        _, out, _ = self.train(2, ["train.steps=6"])
        self.assertIn("resumed from %s at step 4" % self.ckpt(4), out)
        _, out, _ = self.inspect(self.ckpt(6))
        self.assertEqual(lineage(out), a)

    def test_resume_from_a_path_into_another_runs_directory(self):
        self.train(2, ["train.steps=2"])  # run A in ckpt_dir
        other = os.path.join(self.dir, "other")
        self.train(2, ["train.steps=2", "run.seed=5", "checkpoint.dir=\"%s\"" % other])  # run B
        b_file = os.path.join(other, "step_00000002.h5")
        before = digest(b_file)
        # Continue A from its step 2, writing into B's directory: refused.
        _, out, err = self.train(2, ["checkpoint.resume=\"%s\"" % self.ckpt(2),
                                     "checkpoint.dir=\"%s\"" % other], expect=1)
        self.assertNotIn("step     3/", out)
        self.assertIn(other, err)
        self.assertIn("step_00000002.h5", err)
        self.assertEqual(digest(b_file), before)


class ModelIdentity(harness.Case):
    def test_heads_and_tied_embeddings_are_checked_on_load(self):
        self.train(2, ["train.steps=2"])
        good = self.ckpt(2)
        for key, deck_value, file_value in (("model.heads", "2", "4"),
                                            ("model.tie_embeddings", "false", "true")):
            _, _, err = self.meshtrain(["eval", self.deck, "--checkpoint", good,
                                        "--set", "%s=%s" % (key, deck_value)], ranks=2, expect=1)
            self.assertIn(good, err)
            self.assertIn("%s = %s" % (key, file_value), err)
            self.assertIn("%s = %s" % (key, deck_value), err)
        _, out, err = self.train(2, ["model.heads=2", "train.steps=4"], expect=1)
        self.assertIn("model.heads = 4", err)
        self.assertIn("model.heads = 2", err)
        self.assertNotIn("step     3/", out)

    def test_inspect_shows_the_effective_configuration(self):
        self.train(2, ["model.layers=2", "train.steps=2"])
        _, out, _ = self.inspect(self.ckpt(2))
        self.assertIn("model 2 layers", out)
        self.assertIn("--set model.layers=2", out)
        self.assertIn("--set train.steps=2", out)
        self.assertRegex(out, r"(?m)^ +layers = 2$")
        self.assertNotIn("model 4 layers", out)
        # The deck alone describes 4 layers: refused naming the key, not a dataset shape.
        _, _, err = self.meshtrain(["eval", self.deck, "--checkpoint", self.ckpt(2)], ranks=2, expect=1)
        self.assertIn("model.layers = 2", err)
        self.assertIn("model.layers = 4", err)


if __name__ == "__main__":
    harness.main()
