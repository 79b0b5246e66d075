#!/usr/bin/env python3
"""meshtrain's Muon against the fp64 NumPy reference written from the papers (muon_reference.py),
step by step for 20 steps, on one rank in fp64: a tiny GPT-2 (fused (3, C, C) qkv, biases, tied
embeddings), a tiny Llama (separate q/k/v, SwiGLU, untied head) and a tiny mixture of experts
(expert tensors, routers).

The reference does not run the model (hf_decoder_reference.py is forward-only), so it is fed the
gradients meshtrain computed: the helper binary (tests/optim/muon_trajectory.cpp) writes every
parameter's value before each step, the gradient the step used and the step's learning rate. The
reference starts from meshtrain's initial values and steps its own copy with its own optimizer
state through the 20 gradients; after every step its values must equal meshtrain's to 1e-10
relative (per tensor, max norm). A wrong split of parameters, a missing Nesterov term, a
transposed iteration, another scale or decay shows at 1e-3 or worse.

Usage: muon_reference_test.py MUON_TRAJECTORY_BINARY. Exit 77 (skipped) without NumPy.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy as np
except ImportError as e:
    print(f"SKIPPED: {e.name} is not installed (Debian: python3-numpy)")
    sys.exit(77)
sys.path.insert(0, HERE)
import muon_reference as ref  # noqa: E402

TOLERANCE = 1e-10


def read(path, shape):
    return np.fromfile(path, dtype="<f8").reshape(shape)


def check_model(binary, model):
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, MESHTRAIN_MUON_TRAJECTORY=out, MESHTRAIN_MUON_MODEL=model)
        run = subprocess.run([binary], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            return [f"{model}: the trajectory binary failed ({run.returncode})"]
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        shapes = {p["name"]: tuple(p["shape"]) for p in manifest["params"]}
        muon = [n for n, s in shapes.items() if ref.takes_muon(n, s)]
        if not muon:
            return [f"{model}: no parameter takes Muon"]
        opt = ref.Optimizer(shapes, weight_decay=manifest["weight_decay"], beta1=manifest["beta1"],
                            beta2=manifest["beta2"], eps=manifest["eps"])
        values = {n: read(os.path.join(out, "0", n + ".value"), s) for n, s in shapes.items()}
        failures, worst = [], 0.0
        for step in range(manifest["steps"]):
            grads = {n: read(os.path.join(out, str(step), n + ".grad"), s) for n, s in shapes.items()}
            values = opt.step(values, grads, manifest["lr"][step])
            after = os.path.join(out, str(step + 1)) if step + 1 < manifest["steps"] else os.path.join(out, "final")
            for n, s in shapes.items():
                theirs = read(os.path.join(after, n + ".value"), s)
                error = np.max(np.abs(values[n] - theirs)) / max(np.max(np.abs(theirs)), 1e-300)
                worst = max(worst, error)
                if error > TOLERANCE:
                    failures.append(f"{model} step {step + 1}: {n} differs by {error:.2e} relative")
        print(f"{model}: {len(muon)} of {len(shapes)} tensors take Muon; {manifest['steps']} steps, "
              f"worst relative difference {worst:.2e}")
        return failures[:10]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    failures = []
    for model in ("gpt2", "llama", "moe"):
        failures += check_model(sys.argv[1], model)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
