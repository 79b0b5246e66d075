"""A run's lineage is carried across resumes, a checkpoint records the effective
configuration, and a resume at the end trains nothing. (What is refused — a fresh run into another run's directory, a resume into
another lineage's directory, a model that differs from the checkpoint's — is in the catalogue
of bad input, tests/cli/bad_input_catalogue.py, which also checks that nothing was lost.)

Lineage: run A writes step 2 and step 4; resume = "auto" continues A, and the lineage (inspect
prints it) of step 6 is A's.

Effective configuration: a run trained with --set model.layers=2 is inspected as 2 layers, with
its --set overrides and the effective configuration shown; an eval with the deck alone (4
layers) is refused naming model.layers and both values, not a dataset shape.

Resuming a checkpoint at train.steps says so and exits 0, with nothing trained or written.

Context extension (issue 55): a Llama run resumed at another seq_len with YaRN continues its
lineage, prints and records (metrics.jsonl) the checkpoint's settings and the new ones, and its
next checkpoint records the new ones. (Its numbers: tests/train/context_extension_test.cpp.)
"""

import json
import os
import re

import harness


def lineage(out):
    m = re.search(r"^lineage (\S+)", out, re.M)
    return m.group(1) if m else None


class Lineage(harness.Case):
    def test_resume_continues_the_lineage(self):
        self.train(2)  # run A: step 2 and step 4
        _, out, _ = self.inspect(self.ckpt(4))
        a = lineage(out)
        self.assertRegex(a or "", r"^[0-9a-f]{32}$", out)
        _, out, _ = self.train(2, ["train.steps=6"])
        self.assertIn("resumed from %s at step 4" % self.ckpt(4), out)
        _, out, _ = self.inspect(self.ckpt(6))
        self.assertEqual(lineage(out), a)
        # A fresh run elsewhere starts a lineage of its own.
        _, out, _ = self.train(2, ["train.steps=2", "checkpoint.dir=\"%s/other\"" % self.dir])
        _, out, _ = self.inspect("%s/other/step_00000002.h5" % self.dir)
        self.assertNotEqual(lineage(out), a)


class EffectiveConfiguration(harness.Case):
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


class ResumeAtTheEnd(harness.Case):
    def test_resume_at_train_steps_trains_nothing(self):
        self.train(2)  # steps 2 and 4 of train.steps = 4
        before = sorted(os.listdir(self.ckpt_dir))
        _, out, _ = self.train(2)
        self.assertIn("resumed from %s at step 4" % self.ckpt(4), out)
        self.assertIn("nothing to train", out)
        self.assertIn("train.steps = 4", out)
        self.assertNotIn("step     5/", out)
        self.assertEqual(sorted(os.listdir(self.ckpt_dir)), before)


class ContextExtension(harness.Case):
    def test_a_rotary_resume_at_another_length_is_recorded(self):
        self.train(2, ["model.family=\"llama\""])  # seq_len 16: steps 2 and 4
        _, out, _ = self.inspect(self.ckpt(4))
        a = lineage(out)
        extended = ["model.family=\"llama\"", "model.seq_len=32", "model.rope_scaling=\"yarn\"",
                    "model.rope_factor=2.0", "model.rope_original_max_positions=16", "train.steps=6"]
        _, out, _ = self.train(2, extended)
        change = ("model.seq_len 16 -> 32, model.rope_scaling \"none\" -> \"yarn\", model.rope_factor 8.0 -> "
                  "2.0, model.rope_original_max_positions 8192 -> 16")
        self.assertIn("resumed from %s at step 4\ncontext extension: %s" % (self.ckpt(4), change), out)
        self.assertIn("step     6/6", out)
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if "context_extension" in line]
        self.assertEqual(records, [{"step": 4, "resumed_from": self.ckpt(4), "context_extension": change}])
        _, out, _ = self.inspect(self.ckpt(6))
        self.assertEqual(lineage(out), a)
        self.assertIn("seq_len 32", out)


if __name__ == "__main__":
    harness.main()
