"""`meshtrain sample` and train.sample_every through the real binary, as a user runs them.

A tiny model (2 layers, d 64, seq_len 64, bytes) overfits one repeated sentence in 150 steps;
then:
  - greedy from "the quick" reproduces the sentence, past seq_len (the window slides);
  - sampling (temperature 1, top-k 5, seed 3) gives the same text twice, on one rank, on tp = 2
    (heads split over two ranks), from a pp = 2 deck (sample loads it with pp = 1) and with
    tp = 2 on 3 ranks (tp = 1 then);
  - a prompt longer than seq_len is refused with exit 1; tp = 2 on 3 ranks runs tp = 1;
  - training printed a sample every train.sample_every steps, also on tp = 2 with sequence
    parallelism and on pp = 2 (the stages pass each token along); a ZeRO-3 run says it skips
    them and does not hang;
  - input/deepseek-v3-tiny.toml (latent attention, its cache the compressed latent and the
    rotary key) prints its samples while training, and `sample` writes the same greedy text
    (fp64, past seq_len) on one rank, on tp = 2 and from a pp = 2 deck.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "checkpoint"))
import harness  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SENTENCE = "the quick brown fox jumps over the lazy dog. "

DECK = """[run]
device = "cpu"
name = "overfit"
dir = "{run_dir}"
seed = 7
log_every = 50

[model]
layers = 2
d_model = 64
heads = 4
seq_len = 64
vocab_size = 256

[data]
train = "{data}_train.bin"
val = "{data}_val.bin"

[train]
precision = "fp32"
steps = 150
global_batch = 8
micro_batch = 4
lr = 3e-3
min_lr = 3e-4
warmup_steps = 10
eval_every = 0
eval_batches = 1
sample_every = 50

[checkpoint]
every = 150
"""


class Sample(harness.Case):
    def setUp(self):
        super().setUp()
        text = os.path.join(self.dir, "fox.txt")
        with open(text, "w") as f:
            f.write(SENTENCE * 400)
        data = os.path.join(self.dir, "fox")
        self.meshtrain(["prepare", "--out", data, text])
        with open(self.deck, "w") as f:
            f.write(DECK.format(run_dir=self.run_dir, data=data))

    def sample(self, extra, ranks=None, expect=0):
        return self.meshtrain(["sample", self.deck, "--checkpoint", self.ckpt(150)] + extra,
                              ranks=ranks, expect=expect)

    def test_overfit_sample_and_layouts(self):
        _, out, _ = self.train(1)
        samples = [line for line in out.splitlines() if "| sample: " in line]
        self.assertEqual(len(samples), 3, out)  # steps 50, 100, 150

        _, out, err = self.sample(["--prompt", "the quick", "--tokens", "120"])
        expected = (SENTENCE * 4)[:len("the quick") + 120]
        self.assertEqual(out.splitlines()[-1], expected, err)
        self.assertIn("tokens/s", err)

        sampled = ["--prompt", "the quick", "--tokens", "60", "--temperature", "1", "--top-k", "5",
                   "--seed", "3"]
        _, one, _ = self.sample(sampled)
        _, again, _ = self.sample(sampled)
        _, tp2, _ = self.sample(sampled + ["--set", "parallel.tp=2"], ranks=2)
        _, pp2, _ = self.sample(sampled + ["--set", "parallel.pp=2"], ranks=2)
        text = one.splitlines()[-1]
        self.assertTrue(text.startswith("the quick") and len(text) == 69, text)
        # tp = 2 does not divide 3 ranks: sample runs tp = 1, dp = 3.
        _, tp2_on3, err = self.sample(sampled + ["--set", "parallel.tp=2"], ranks=3)
        self.assertIn(", tp 1\n", err)
        for other in (again, tp2, pp2, tp2_on3):
            self.assertEqual(other.splitlines()[-1], text)

        _, _, err = self.sample(["--prompt", "x" * 65], expect=1)
        self.assertIn("longer than model.seq_len = 64", err)

    def test_train_sample_pipeline_and_zero3(self):
        _, out, _ = self.train(2, ["parallel.pp=2", "train.steps=4", "train.sample_every=2",
                                   "checkpoint.every=0"])
        self.assertEqual(out.count("| sample: "), 2, out)
        _, out, _ = self.train(2, ["parallel.zero=3", "train.steps=4", "train.sample_every=2",
                                   "checkpoint.every=0"])
        self.assertIn("train.sample_every = 2: no samples on this layout", out)
        self.assertNotIn("| sample: ", out)

    def test_train_sample_sequence_parallel(self):
        _, out, _ = self.train(2, ["parallel.tp=2", "parallel.sequence_parallel=true",
                                   "train.steps=4", "train.sample_every=2", "checkpoint.every=0"])
        self.assertEqual(out.count("| sample: "), 2, out)

    def run_bytes(self, args, ranks=None):
        """meshtrain's stdout as bytes: a barely trained model's text need not be UTF-8."""
        cmd = ([harness.MPIEXEC, "-n", str(ranks)] if ranks else []) + [harness.MESHTRAIN] + args
        p = subprocess.run(cmd, capture_output=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        return p.stdout

    def test_latent_attention_deck(self):
        with open(os.path.join(REPO, "input", "deepseek-v3-tiny.toml")) as f:
            deck = f.read()
        with open(self.deck, "w") as f:
            f.write(deck)
        sets = [f'run.dir="{self.run_dir}"', "parallel.ep=1", "train.steps=4", "train.sample_every=2",
                "checkpoint.every=4", 'train.precision="fp32"']
        out = self.run_bytes(["train", self.deck] + [a for s in sets for a in ("--set", s)])
        self.assertEqual(out.count(b"| sample: "), 2, out)
        greedy = ["--prompt", "the quick", "--tokens", "60", "--set", 'train.precision="fp64"',
                  "--set", "parallel.ep=1"]
        texts = []
        for extra, ranks in (([], None), (["--set", "parallel.tp=2"], 2), (["--set", "parallel.pp=2"], 2)):
            out = self.run_bytes(["sample", self.deck, "--checkpoint", self.ckpt(4)] + greedy + extra, ranks)
            # The prompt and 60 bytes (the byte tokenizer), then a line break.
            texts.append(out[out.index(b"\nthe quick") + 1:])
        self.assertEqual(len(texts[0]), len("the quick") + 60 + 1, texts[0])
        self.assertEqual(texts[1:], [texts[0]] * 2)

if __name__ == "__main__":
    harness.main()
