"""`meshtrain inspect` and `meshtrain eval` on checkpoints, as a user runs them.

inspect: exit 0 and "checksum OK" for every dataset of a good checkpoint; exit 1 with
"MISMATCH" on the damaged dataset of a copy with a flipped byte; exit 1 for a missing file;
exit 1 for a copy whose every checksum holds but whose parameters are not the recorded model's
(one renamed, with its moments: missing under its name, unknown under the other).
eval: on a layout other than the writer's (and on one rank) prints "val_loss <value>" equal to
the validation loss the training run printed after its last step; refuses the damaged copy,
naming the file and the dataset.
"""

import re
import shutil

import harness

try:
    import h5py
except ImportError:
    h5py = None


def val_loss(stdout):
    m = re.search(r"^val_loss (\S+)$", stdout, re.M)
    return float(m.group(1)) if m else None


class InspectAndEval(harness.Case):
    def test_inspect_and_eval(self):
        _, out, _ = self.train(2, ["train.steps=3", "checkpoint.every=3"])  # dp 2
        trained = float(re.search(r"step +3/3 \| val_loss (\S+)", out).group(1))
        good = self.ckpt(3)

        _, out, _ = self.inspect(good)
        self.assertIn("step 3 (optimizer steps 3)", out)
        self.assertIn("layout dp=2 tp=1 pp=1 zero=0", out)
        self.assertIn("model 4 layers, d_model 32", out)
        self.assertEqual(out.count("checksum OK"), 3 * (2 + 2 + 12 * 4))
        self.assertNotIn("MISMATCH", out)
        self.assertIn("all checksums OK", out)

        for ranks, sets in ((2, ["parallel.tp=2"]), (2, ["parallel.pp=2", "parallel.zero=0"]),
                            (1, [])):
            args = ["eval", self.deck, "--checkpoint", good]
            for s in sets:
                args += ["--set", s]
            _, out, _ = self.meshtrain(args, ranks=ranks)
            value = val_loss(out)
            self.assertIsNotNone(value, out)
            self.assertAlmostEqual(value, trained, delta=1e-4, msg="%d ranks %s" % (ranks, sets))

        if h5py is None:
            self.skipTest("h5py is not installed (Debian: python3-h5py)")
        bad = self.dir + "/damaged.h5"
        shutil.copy(good, bad)
        with h5py.File(bad, "r") as f:
            offset = f["model/h.2.attn.qkv.weight"].id.get_offset()
        with open(bad, "r+b") as f:
            f.seek(offset + 64)
            b = f.read(1)
            f.seek(offset + 64)
            f.write(bytes([b[0] ^ 0x01]))
        _, out, _ = self.inspect(bad, expect=1)
        self.assertRegex(out, r"/model/h\.2\.attn\.qkv\.weight .* MISMATCH")
        self.assertEqual(out.count("MISMATCH"), 1)
        _, _, err = self.meshtrain(["eval", self.deck, "--checkpoint", bad], ranks=2, expect=1)
        self.assertIn(bad, err)
        self.assertIn("dataset /model/h.2.attn.qkv.weight: checksum MISMATCH", err)

        renamed = self.dir + "/renamed.h5"
        shutil.copy(good, renamed)
        with h5py.File(renamed, "r+") as f:
            f.move("model/h.1.ln_2.bias", "model/h.1.ln_3.bias")
            f.move("optim/h.1.ln_2.bias", "optim/h.1.ln_3.bias")
        _, out, _ = self.inspect(renamed, expect=1)
        self.assertNotIn("MISMATCH", out)
        self.assertIn("problem: /model/h.1.ln_2.bias is missing, but the recorded model has the "
                      "parameter h.1.ln_2.bias (32)", out)
        self.assertIn("problem: /model/h.1.ln_3.bias is not a parameter of the recorded model", out)
        self.assertIn("2 problem(s)", out)

        _, _, err = self.inspect(self.dir + "/nowhere.h5", expect=1)
        self.assertIn("nowhere.h5: cannot open", err)
        self.meshtrain(["eval", self.deck], expect=2)  # --checkpoint is required


if __name__ == "__main__":
    harness.main()
