"""Checkpoints and Hugging Face directories come from other people: every reader of them
(inspect, eval, sample, export, train's resume, import) refuses a file that points outside
itself, declares more than it holds, records an attribute out of its range or values no run
writes, and prints what the file says escaped; inspect reports every defect that train's resume
refuses (the expert bias of a mixture included). Each hostile file is crafted with h5py from a real
checkpoint, so that it passes every other check (its checksums match what a reader would read):
without the refusal it would load.
"""

import os
import shutil
import stat

import numpy as np

import harness

try:
    import h5py
except ImportError:  # the Debian package python3-h5py
    h5py = None

TARGET = "/model/h.0.ln_1.weight"
OUTSIDE = "outside.bin"  # the bytes a hostile file points at: another user's file, say




class UntrustedFiles(harness.Case):
    def setUp(self):
        super().setUp()
        if h5py is None:
            self.skipTest("h5py is not installed (Debian: python3-h5py)")
        self.train(1, ["train.steps=2"])
        self.good = self.ckpt(2)
        self.hostile_dir = os.path.join(self.dir, "hostile")
        os.makedirs(self.hostile_dir)
        with h5py.File(self.good, "r") as f:
            self.values = f[TARGET][...]
        # The outside file holds exactly the bytes of a float32 tensor of TARGET's shape.
        self.outside = os.path.join(self.dir, OUTSIDE)
        np.arange(self.values.size, dtype=np.float32).tofile(self.outside)

    def craft(self, name, edit):
        """A copy of the good checkpoint changed by edit(h5py.File); returns its path."""
        path = os.path.join(self.hostile_dir, name)
        shutil.copy(self.good, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path

    def replace_target(self, f, make, values=None):
        """Replaces TARGET by make(f, name) and gives it the checksum of `values`, by default of
        what it then reads."""
        del f[TARGET]
        make(f, TARGET)
        obj = f[TARGET]
        obj.attrs.create("checksum", harness.checksum(obj[...] if values is None else values), dtype=np.uint64)

    def refused_by_every_reader(self, path, needles, readers=("inspect", "resume")):
        """inspect, eval, sample, export and train's resume each exit 1 naming path and
        needles, print nothing of the outside file's bytes and write no export. Every reader
        opens a checkpoint through the one trust check (io/checkpoint_file_trust.cpp): each hostile
        kind is tried on inspect and on a 2-rank resume, and the first kind on every reader."""
        out = os.path.join(self.dir, "export_" + os.path.basename(path))
        runs = {
            "inspect": (["inspect", path], None),
            "eval": (["eval", self.deck, "--checkpoint", path], 2),
            "sample": (["sample", self.deck, "--checkpoint", path, "--prompt", "ab", "--tokens", "2"], None),
            "export": (["export", path, "--format", "hf", out], None),
            "resume": (["train", self.deck, "--set", 'checkpoint.resume="%s"' % path,
                        "--set", 'checkpoint.dir="%s"' % os.path.join(self.dir, "resumed")], 2),
        }
        for reader, (args, ranks) in runs.items():
            if readers != "all" and reader not in readers:
                continue
            with self.subTest(reader=reader, file=os.path.basename(path)):
                _, stdout, stderr = self.meshtrain(args, ranks=ranks, expect=1)
                for needle in [path] + needles:
                    self.assertIn(needle, stderr)
                self.assertNotIn("internal error", stderr)
                self.assertNotIn("checksum OK", stdout)
                self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))

    # --- item: a checkpoint can read any local file ------------------------------------------

    def test_external_storage_is_refused(self):
        nbytes = self.values.size * 4
        path = self.craft("external.h5", lambda f: self.replace_target(
            f, lambda g, n: g.create_dataset(n, shape=self.values.shape, dtype=np.float32,
                                             external=[(self.outside, 0, nbytes)])))
        self.refused_by_every_reader(path, ["dataset " + TARGET, "stores its data outside the file",
                                            "external storage '%s'" % self.outside], readers="all")

    def test_external_storage_by_relative_name_is_refused(self):
        # A relative name resolves against the reader's working directory (or an efile prefix).
        nbytes = self.values.size * 4
        path = self.craft("external_relative.h5", lambda f: self.replace_target(
            f, lambda g, n: g.create_dataset(n, shape=self.values.shape, dtype=np.float32,
                                             external=[(OUTSIDE, 0, nbytes)]),
            values=np.fromfile(self.outside, dtype=np.float32)))
        self.refused_by_every_reader(path, ["dataset " + TARGET, "outside the file"])

    def test_external_link_is_refused(self):
        other = os.path.join(self.dir, "other.h5")
        shutil.copy(self.good, other)

        def edit(f):
            del f[TARGET]
            f[TARGET] = h5py.ExternalLink(other, TARGET)
        path = self.craft("external_link.h5", edit)
        self.refused_by_every_reader(path, [TARGET, "is an external link", other])

    def test_external_link_to_a_group_is_refused(self):
        other = os.path.join(self.dir, "other.h5")
        shutil.copy(self.good, other)

        def edit(f):
            del f["/optim"]
            f["/optim"] = h5py.ExternalLink(other, "/optim")
        path = self.craft("external_group.h5", edit)
        self.refused_by_every_reader(path, ["/optim", "is an external link"])

    def test_soft_link_is_refused(self):
        def edit(f):
            del f[TARGET]
            f[TARGET] = h5py.SoftLink("/model/h.0.ln_1.bias")
        path = self.craft("soft_link.h5", edit)
        self.refused_by_every_reader(path, [TARGET, "is a soft link", "/model/h.0.ln_1.bias"])

    def test_virtual_dataset_is_refused(self):
        other = os.path.join(self.dir, "other.h5")
        shutil.copy(self.good, other)

        def make(g, n):
            layout = h5py.VirtualLayout(shape=self.values.shape, dtype=np.float32)
            layout[...] = h5py.VirtualSource(other, TARGET, shape=self.values.shape)
            g.create_virtual_dataset(n, layout)
        path = self.craft("virtual.h5", lambda f: self.replace_target(f, make))
        self.refused_by_every_reader(path, ["dataset " + TARGET, "is a virtual dataset", other])

    def test_filtered_dataset_is_refused(self):
        path = self.craft("gzip.h5", lambda f: self.replace_target(
            f, lambda g, n: g.create_dataset(n, data=self.values, compression="gzip")))
        self.refused_by_every_reader(path, ["dataset " + TARGET, "filter 'deflate'", "no compression"])

    # --- item: inspect allocates what a dataset declares ---------------------------------------

    def test_dataset_declaring_more_than_the_file_holds_is_refused(self):
        for name, shape in (("declares_1gib.h5", (1 << 28,)), ("declares_2e40.h5", (1 << 20, 1 << 20))):
            def edit(f, shape=shape):
                ds = f.create_dataset("/model/huge", shape=shape, dtype=np.float32)
                ds.attrs.create("checksum", np.uint64(0), dtype=np.uint64)
            path = self.craft(name, edit)
            # Refused before anything is allocated for it, naming the dataset (2^40 elements
            # used to end in a bare std::bad_alloc).
            _, _, stderr = self.meshtrain(["inspect", path], expect=1)
            for needle in [path, "dataset /model/huge", "declares %d bytes" % (4 * np.prod(shape)),
                           "stores 0"]:
                self.assertIn(needle, stderr)

    def test_chunked_dataset_is_read(self):
        # Chunked storage inside the file is accepted (HDF5 tools write it); the loader reads it.
        path = self.craft("chunked.h5", lambda f: self.replace_target(
            f, lambda g, n: g.create_dataset(n, data=self.values, chunks=(8,))))
        _, stdout, _ = self.inspect(path)
        self.assertIn("all checksums OK", stdout)
        self.meshtrain(["eval", self.deck, "--checkpoint", path], ranks=2)

    # --- item: untrusted strings reach the terminal ---------------------------------------------

    def test_inspect_escapes_what_the_file_says(self):
        evil = "\x1b]0;owned\x07\x1b[2J\x1b[1A\r\u202eok\x9b"

        def edit(f):
            f.attrs["layout"] = np.bytes_(evil.encode())
            f.attrs["created"] = np.bytes_(b"2025\xff\x1b[31m")
            f.attrs["config"] = np.bytes_(("[run]\nname = \"a\\u001b[2Jb\"\n# " + evil + "\n").encode())
            ds = f.create_dataset("/model/x\x1b[31mred", data=np.zeros(2, np.float32))
            ds.attrs.create("checksum", harness.checksum(np.zeros(2, np.float32)), dtype=np.uint64)
        path = self.craft("escapes.h5", edit)
        status, stdout, stderr = self.meshtrain(["inspect", path], expect=None)
        for text in (stdout, stderr):
            for control in ("\x1b", "\x07", "\r", "\x9b", "\u202e", "\xff"):
                self.assertNotIn(control, text)
        self.assertIn("\\x1b]0;owned\\x07", stdout)
        self.assertIn("\\u{202e}", stdout)
        self.assertIn("/model/x\\x1b[31mred", stdout)
        # A loader names the stray dataset escaped as well.
        _, _, stderr = self.meshtrain(["eval", self.deck, "--checkpoint", path], expect=1)
        self.assertNotIn("\x1b", stderr)
        self.assertIn("/model/x\\x1b[31mred", stderr)

    # --- item: attributes narrowed to int -----------------------------------------------------

    def test_attributes_out_of_range_are_refused(self):
        cases = [
            ("step", np.int64(2**32 + 2), "4294967298"),
            ("step", np.int64(2**62), str(2**62)),
            ("step", np.int64(2**31), str(2**31)),
            ("step", np.uint64(2**64 - 1), str(2**64 - 1)),
            ("step", np.int64(-1), "-1"),
            ("optimizer_steps", np.int64(-3), "-3"),
            ("optimizer_steps", np.uint64(2**63), str(2**63)),
            ("world_size", np.int64(2**32 + 1), str(2**32 + 1)),
            ("world_size", np.int32(0), "0"),
            ("format_version", np.int64(2**32 + 2), str(2**32 + 2)),
            ("seed", np.int64(-5), "-5"),
        ]
        for i, (key, value, shown) in enumerate(cases):
            def edit(f, key=key, value=value):
                del f.attrs[key]
                f.attrs.create(key, value, dtype=value.dtype)
            path = self.craft("attr_%d.h5" % i, edit)
            with self.subTest(key=key, value=shown):
                for args, ranks in ((["eval", self.deck, "--checkpoint", path], 2),
                                    (["inspect", path], None)):
                    _, _, stderr = self.meshtrain(args, ranks=ranks, expect=1)
                    self.assertIn("%s: attribute '%s' = %s is out of range (expected " % (path, key, shown),
                                  stderr)
                    self.assertNotIn("internal error", stderr)

    def test_lineage_that_is_not_one_is_refused(self):
        def edit(f):
            del f.attrs["lineage"]
            f.attrs["lineage"] = np.bytes_(b"../../x\x1b[2J")
        path = self.craft("lineage.h5", edit)
        _, _, stderr = self.meshtrain(["eval", self.deck, "--checkpoint", path], expect=1)
        self.assertIn("attribute 'lineage'", stderr)
        self.assertIn("32 hexadecimal digits", stderr)
        self.assertNotIn("\x1b", stderr)

    # --- item: NaN or negative AdamW moments --------------------------------------------------

    def test_inspect_reports_missing_attributes_as_resume_refuses_them(self):
        for key in ("model", "lineage"):
            path = self.craft("no_%s.h5" % key, lambda f, key=key: f.attrs.__delitem__(key))
            with self.subTest(attribute=key):
                _, _, stderr = self.meshtrain(
                    ["train", self.deck, "--set", 'checkpoint.resume="%s"' % path,
                     "--set", 'checkpoint.dir="%s"' % os.path.join(self.dir, "resumed_" + key)], ranks=1, expect=1)
                self.assertIn("has no attribute '%s'" % key, stderr)
                _, stdout, _ = self.inspect(path, expect=1)
                self.assertIn("problem: no attribute '%s' (not a complete meshtrain checkpoint)" % key, stdout)

    def test_values_no_run_writes_are_refused_on_load(self):
        cases = [("/optim/h.0.ln_1.weight/exp_avg_sq", -1.0, "finite and >= 0"),
                 ("/optim/h.0.ln_1.weight/exp_avg", np.nan, "first moment is finite"),
                 ("/optim/wte/exp_avg_sq", np.inf, "finite and >= 0"),
                 ("/model/ln_f.bias", np.nan, "a parameter is finite")]
        for i, (name, bad, rule) in enumerate(cases):
            def edit(f, name=name, bad=bad):
                v = f[name][...]
                v.ravel()[3] = bad
                f[name][...] = v
                f[name].attrs.modify("checksum", harness.checksum(v))
            path = self.craft("values_%d.h5" % i, edit)
            with self.subTest(dataset=name, value=bad):
                _, stdout, stderr = self.meshtrain(
                    ["train", self.deck, "--set", 'checkpoint.resume="%s"' % path,
                     "--set", 'checkpoint.dir="%s"' % os.path.join(self.dir, "resumed_%d" % i),
                     "--set", "train.steps=4"], ranks=2, expect=1)
                self.assertIn("%s: dataset %s holds" % (path, name), stderr)
                self.assertIn("at element 3", stderr)
                self.assertIn(rule, stderr)
                self.assertNotIn("lower train.lr", stderr)
                self.assertNotIn("step     3/", stdout)
                # inspect reports what the load refuses, naming the dataset and the element.
                _, stdout, _ = self.inspect(path, expect=1)
                self.assertIn("problem: %s holds %s at element 3" % (name, "%g" % bad), stdout)
                self.assertIn(rule, stdout)
                self.assertNotIn("all checksums OK", stdout)


MOE_SETS = ['model.family="llama"', 'model.feed_forward="moe"', "model.moe_experts=4", "model.moe_top_k=2",
            'model.moe_router="sigmoid"', "model.moe_bias_update_rate=0.01"]
BIAS = "/buffers/h.1.mlp.router.expert_bias"


class DamagedExpertBias(harness.Case):
    """The sigmoid router's expert bias (/buffers) damaged in each way train's resume refuses:
    inspect reports the same defect, naming the dataset, instead of "all checksums OK"."""

    def setUp(self):
        super().setUp()
        if h5py is None:
            self.skipTest("h5py is not installed (Debian: python3-h5py)")
        self.train(1, MOE_SETS + ["train.steps=2"])
        self.good = self.ckpt(2)
        with h5py.File(self.good, "r") as f:
            self.bias = f[BIAS][...]
        self.assertEqual(self.bias.dtype, np.float64)

    def craft(self, name, edit):
        path = os.path.join(self.dir, name)
        shutil.copy(self.good, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path

    def replace(self, values, name=BIAS):
        def edit(f):
            if name in f:
                del f[name]
            f.create_dataset(name, data=values)
            f[name].attrs.create("checksum", harness.checksum(values), dtype=np.uint64)
        return edit

    def test_inspect_reports_what_resume_refuses(self):
        nan = self.bias.copy()
        nan[1] = np.nan
        extra = "/buffers/h.7.mlp.router.expert_bias"
        cases = [
            ("missing.h5", lambda f: f.__delitem__(BIAS), BIAS + " is missing", BIAS + " is missing"),
            ("shape.h5", self.replace(np.zeros(5)), BIAS + " has shape (5)", BIAS + " has shape (5)"),
            ("dtype.h5", self.replace(self.bias.astype(np.float32)), BIAS + " is float32", BIAS),
            ("nan.h5", self.replace(nan), BIAS + " holds nan at element 1", BIAS + " holds nan at element 1"),
            ("extra.h5", self.replace(np.zeros(4), extra), extra + " is not part of the recorded model",
             extra + " is not part of the deck's model"),
            ("moment.h5", self.replace(np.zeros(4, dtype=np.float32), "/optim/wte/exp_avg_3"),
             "/optim/wte/exp_avg_3 is not part of the recorded model", "/optim/wte/exp_avg_3 is not part"),
        ]
        for name, edit, reported, refused in cases:
            path = self.craft(name, edit)
            with self.subTest(case=name):
                _, stdout, stderr = self.meshtrain(
                    ["train", self.deck, "--set", 'checkpoint.resume="%s"' % path,
                     "--set", 'checkpoint.dir="%s"' % os.path.join(self.dir, "resumed_" + name),
                     "--set", "train.steps=4"] + [a for s in MOE_SETS for a in ("--set", s)],
                    ranks=1, expect=1)
                self.assertIn(refused, stderr)
                self.assertNotIn("step     3/", stdout)
                _, stdout, _ = self.inspect(path, expect=1)
                self.assertIn("problem: " + reported, stdout)
                self.assertNotIn("all checksums OK", stdout)
        _, stdout, _ = self.inspect(self.good)
        self.assertIn("all checksums OK", stdout)


def read(path):
    with open(path, "rb") as f:
        return f.read()


class UntrustedHfDirectories(harness.Case):
    def setUp(self):
        super().setUp()
        self.train(1, ["train.steps=2"])
        self.hf = os.path.join(self.dir, "hf")
        self.meshtrain(["export", self.ckpt(2), "--format", "hf", self.hf])

    def import_(self, directory, out, expect, *extra):
        return self.meshtrain(["import", "--format", "hf", directory, "--deck", self.deck, out] + list(extra),
                              expect=expect, timeout=60)

    def test_import_never_writes_over_a_file_without_force(self):
        out = os.path.join(self.dir, "imported", "gpt2.h5")
        self.import_(self.hf, out, 0)
        before = read(out)
        _, _, stderr = self.import_(self.hf, out, 1)
        self.assertIn(out + ": already exists", stderr)
        self.assertIn("--force", stderr)
        self.assertEqual(read(out), before)
        self.import_(self.hf, out, 0, "--force")
        self.assertNotEqual(read(out), before)  # a new lineage, a new @created
        # Nor over the name it writes under first: someone's file (a run's checkpoint being
        # written, an interrupted import's).
        other = os.path.join(self.dir, "imported", "other.h5")
        with open(other + ".tmp", "w") as f:
            f.write("someone's")
        for force in ([], ["--force"]):
            _, _, stderr = self.import_(self.hf, other, 1, *force)
            self.assertIn(other + ".tmp: already exists", stderr)
            self.assertEqual(read(other + ".tmp"), b"someone's")
            self.assertFalse(os.path.exists(other))

    def test_import_never_writes_beside_another_runs_checkpoints(self):
        # Into the run's own checkpoint.dir: it would block that run's resume.
        for name in ("step_00000000.h5", "gpt2.h5"):
            for force in ([], ["--force"]):
                out = os.path.join(self.ckpt_dir, name)
                with self.subTest(out=name, force=force):
                    _, _, stderr = self.import_(self.hf, out, 1, *force)
                    self.assertIn(self.ckpt_dir + " holds checkpoints of another run", stderr)
                    self.assertIn("step_00000002.h5", stderr)
                    self.assertFalse(os.path.exists(out))
        # Over the run's own checkpoint, even with --force.
        before = read(self.ckpt(2))
        _, _, stderr = self.import_(self.hf, self.ckpt(2), 1, "--force")
        self.assertIn("holds checkpoints of another run", stderr)
        self.assertEqual(read(self.ckpt(2)), before)
        self.train(1, ["train.steps=4"])  # the run still resumes

    def test_hf_files_that_are_not_regular_files_are_named(self):
        for name in ("config.json", "model.safetensors"):
            for kind in ("directory", "fifo"):
                broken = os.path.join(self.dir, "broken_%s_%s" % (name, kind))
                shutil.copytree(self.hf, broken)
                os.remove(os.path.join(broken, name))
                if kind == "directory":
                    os.makedirs(os.path.join(broken, name))
                else:
                    os.mkfifo(os.path.join(broken, name))
                with self.subTest(file=name, kind=kind):
                    _, _, stderr = self.import_(broken, os.path.join(self.dir, "x_%s_%s.h5" % (name, kind)), 1)
                    self.assertIn(os.path.join(broken, name) + ": is a " +
                                  ("directory" if kind == "directory" else "FIFO"), stderr)
                    self.assertIn("expected a", stderr)
                    self.assertNotIn("basic_filebuf", stderr)

    def test_tokenizer_files_that_are_not_regular_files_are_named(self):
        tok = os.path.join(self.dir, "tok")
        os.makedirs(os.path.join(tok, "vocab.json"))
        with open(os.path.join(tok, "merges.txt"), "w") as f:
            f.write("#version: 0.2\n")
        spec = "%s,%s" % (os.path.join(tok, "vocab.json"), os.path.join(tok, "merges.txt"))
        _, _, stderr = self.meshtrain(["train", self.deck, "--set", 'data.tokenizer="%s"' % spec,
                                       "--set", "train.steps=1"], ranks=1, expect=None)
        self.assertIn(os.path.join(tok, "vocab.json") + ": is a directory", stderr)
        self.assertNotIn("basic_filebuf", stderr)


if __name__ == "__main__":
    harness.main()
