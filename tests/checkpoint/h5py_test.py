"""A checkpoint is an ordinary HDF5 file: h5py, without any meshtrain code, reads a checkpoint
that a 4-rank job with tp = 2 and pp = 2 wrote, and finds what io/checkpoint_file.h documents:
the root attributes (the run's lineage, its --set overrides, effective configuration and model
settings among them), every parameter and both AdamW moments at their global shapes, float32,
finite values, and per-dataset checksums that the documented formula reproduces. Its parameters
equal those of a single-rank run of the same deck within the fp32 layout-parity tolerance.
"""

import numpy as np

import harness

try:
    import h5py
except ImportError:  # the Debian package python3-h5py
    h5py = None





def expected_shapes(layers, C, T, V):
    shapes = {"wte": (V, C), "wpe": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(layers):
        p = "h.%d." % i
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.qkv.weight": (3, C, C), p + "attn.qkv.bias": (3, C),
            p + "attn.proj.weight": (C, C), p + "attn.proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.fc.weight": (4 * C, C), p + "mlp.fc.bias": (4 * C,),
            p + "mlp.proj.weight": (C, 4 * C), p + "mlp.proj.bias": (C,),
        })
    return shapes


class ReadWithH5py(harness.Case):
    def test_h5py_reads_a_tp2_pp2_checkpoint(self):
        if h5py is None:
            self.skipTest("h5py is not installed (Debian: python3-h5py)")
        self.train(4, ["parallel.tp=2", "parallel.pp=2", "train.steps=2"])
        single = self.run_dir + "_single"
        self.train(1, ["train.steps=2", "run.dir=" + single])

        with h5py.File(self.ckpt(2), "r") as f, \
                h5py.File(single + "/checkpoints/step_00000002.h5", "r") as g:
            a = f.attrs
            self.assertEqual(int(a["format_version"]), 2)
            self.assertEqual(int(a["step"]), 2)
            self.assertEqual(int(a["optimizer_steps"]), 2)
            self.assertEqual(int(a["seed"]), 11)
            self.assertEqual(int(a["world_size"]), 4)
            self.assertEqual(bytes(a["layout"]).decode(),
                             "dp=1 tp=2 pp=2 zero=0 schedule=1f1b virtual_stages=1 micro_batch=2")
            with open(self.deck) as d:
                self.assertEqual(bytes(a["deck"]).decode(), d.read())
            self.assertRegex(bytes(a["created"]).decode(), r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
            self.assertRegex(bytes(a["lineage"]).decode(), r"^[0-9a-f]{32}$")
            self.assertNotEqual(bytes(a["lineage"]).decode(), bytes(g.attrs["lineage"]).decode())
            self.assertEqual(bytes(a["overrides"]).decode(),
                             "parallel.tp=2\nparallel.pp=2\ntrain.steps=2\n")
            config = bytes(a["config"]).decode()
            self.assertIn("[model]\nfamily = \"gpt2\"\nlayers = 4\nd_model = 32\nheads = 4\n", config)
            self.assertIn("tp = 2\npp = 2\n", config)
            self.assertIn("steps = 2\n", config)
            model = bytes(a["model"]).decode()
            for line in ("heads = 4", "tie_embeddings = true", "layernorm_eps = 1e-05",
                         "positions = \"learned\"", "tokenizer = \"byte\""):
                self.assertIn(line + "\n", model)

            shapes = expected_shapes(layers=4, C=32, T=16, V=256)
            self.assertEqual(sorted(f["model"].keys()), sorted(shapes))
            self.assertEqual(sorted(f["optim"].keys()), sorted(shapes))
            diff2 = ref2 = 0.0
            for name, shape in shapes.items():
                for path in ("model/" + name, "optim/%s/exp_avg" % name, "optim/%s/exp_avg_sq" % name):
                    ds = f[path]
                    self.assertEqual(ds.shape, shape, path)
                    self.assertEqual(ds.dtype, np.float32, path)
                    values = ds[...]
                    self.assertTrue(np.all(np.isfinite(values)), path)
                    self.assertEqual(int(harness.checksum(values)), int(ds.attrs["checksum"]), path)
                self.assertTrue(np.all(f["optim/%s/exp_avg_sq" % name][...] >= 0), name)
                # Layout invariance through the file: tp 2 x pp 2 against one rank.
                mine, ref = f["model/" + name][...].astype(np.float64), g["model/" + name][...]
                diff2 += float(np.sum((mine - ref) ** 2))
                ref2 += float(np.sum(ref.astype(np.float64) ** 2))
            self.assertLess((diff2 / ref2) ** 0.5, 1e-5)


if __name__ == "__main__":
    harness.main()
