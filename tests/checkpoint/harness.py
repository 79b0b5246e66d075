"""Shared helpers of the checkpoint script tests: they drive the real `meshtrain` binary under
mpiexec, the way a user does, in a fresh temporary directory per test.

Each script is run by CTest as
    python3 <script> --meshtrain <path> --mpiexec <path> [-- unittest arguments]
and exits non-zero if any test fails.
"""

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

# A model that trains a step in milliseconds; every layout the tests use divides it. On the CPU
# in fp32 whatever the host ("auto" would pick a GPU, or bf16 on CPUs with bf16 instructions):
# the tests hold restarts to bitwise equality and layouts to fp32 tolerances.
DECK = """# checkpoint script tests: a tiny model on the built-in corpus
[run]
device = "cpu"
name = "ckpt"
dir = "{run_dir}"
seed = 11
log_every = 1

[model]
layers = 4
d_model = 32
heads = 4
seq_len = 16
vocab_size = 256

[data]
synthetic_bytes = 65536

[train]
precision = "fp32"
steps = 4
global_batch = 8
micro_batch = 2
warmup_steps = 1
eval_every = 0
eval_batches = 1

[checkpoint]
every = 2
keep = 3
"""

MESHTRAIN = None
MPIEXEC = None


# io/checkpoint_file.h's checksum, as an independent oracle for the tests that read or craft files.
K = np.uint64(0x9E3779B97F4A7C15)


def mix64(x):
    """splitmix64's finaliser, as tensor/philox.h defines mix64, on uint64 arrays."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def checksum(values):
    """sum over elements of mix64(global flat index * K + stored bits), mod 2^64, of a float32
    or float64 array, as an np.uint64 (h5py stores it as the file's uint64 attribute)."""
    flat = np.ascontiguousarray(values).ravel()
    bits = flat.view(np.uint32 if flat.dtype == np.float32 else np.uint64).astype(np.uint64)
    with np.errstate(over="ignore"):
        return np.uint64(mix64(np.arange(flat.size, dtype=np.uint64) * K + bits).sum(dtype=np.uint64))


def fnv1a64(data):
    """FNV-1a over bytes: a token shard's checksum (io/token_shard.h)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_token_shard(path, tokens, vocab):
    """A token shard of 2-byte ids (io/token_shard.h's layout: magic, version 1, bytes per token,
    count, vocabulary, header bytes 64, the tokens' FNV-1a, padding), as `meshtrain prepare`
    writes one."""
    body = np.asarray(tokens).astype("<u2").tobytes()
    header = (b"MTTOKENS" + struct.pack("<IIQII", 1, 2, len(tokens), vocab, 64) +
              struct.pack("<Q", fnv1a64(body)) + bytes(24))
    with open(path, "wb") as f:
        f.write(header + body)


def main():
    """Parses --meshtrain and --mpiexec, then runs the unittest cases of __main__."""
    global MESHTRAIN, MPIEXEC
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshtrain", required=True)
    parser.add_argument("--mpiexec", required=True)
    args, rest = parser.parse_known_args()
    MESHTRAIN, MPIEXEC = args.meshtrain, args.mpiexec
    unittest.main(module="__main__", argv=[sys.argv[0]] + [a for a in rest if a != "--"], verbosity=2)


class Case(unittest.TestCase):
    """A test with its own directory holding deck.toml; run/ is the run directory."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="meshtrain_ckpt_")
        self.run_dir = os.path.join(self.dir, "run")
        self.ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        self.deck = os.path.join(self.dir, "deck.toml")
        with open(self.deck, "w") as f:
            f.write(DECK.format(run_dir=self.run_dir))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def ckpt(self, step):
        return os.path.join(self.ckpt_dir, "step_%08d.h5" % step)

    def meshtrain(self, args, ranks=None, env=None, expect=0, timeout=180):
        """Runs meshtrain (under mpiexec -n ranks when given); checks the exit status unless
        expect is None; returns (status, stdout, stderr)."""
        cmd = ([MPIEXEC, "-n", str(ranks)] if ranks else []) + [MESHTRAIN] + args
        full_env = dict(os.environ)
        full_env.setdefault("OMP_NUM_THREADS", "1")
        full_env.update(env or {})
        p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
        if expect is not None and p.returncode != expect:
            self.fail("%s\nexited %d, expected %d\n--- stdout\n%s\n--- stderr\n%s" %
                      (" ".join(cmd), p.returncode, expect, p.stdout[-4000:], p.stderr[-4000:]))
        return p.returncode, p.stdout, p.stderr

    def train(self, ranks, sets=(), env=None, expect=0):
        args = ["train", self.deck]
        for s in sets:
            args += ["--set", s]
        return self.meshtrain(args, ranks=ranks, env=env, expect=expect)

    def inspect(self, path, expect=0):
        return self.meshtrain(["inspect", path], expect=expect)


def losses(stdout):
    """{step: loss text} from the progress lines of a training run."""
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r"^step +(\d+)/\d+ \| loss (\S+)", stdout, re.M)}
