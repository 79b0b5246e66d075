#!/usr/bin/env python3
"""`meshtrain diagnose` names the rank that stalled or died, in dp, tp and pp groups.

Each case trains the tiny deck on 2 ranks laid out along one axis, with rank 1 stalled or killed
at step 2 by fault injection (MESHTRAIN_FAULT); the job ends (timeout abort, or mpiexec's kill),
then `meshtrain diagnose RUNDIR` reads the ranks' flight records. It must name rank 1 and its
node as the likely cause and the group where the ranks parted.

usage: diagnose_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import socket
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
ENV = dict(os.environ)  # CTest sets the MPI launch environment

DECK = """
# precision-independent: which rank stalled, not what it computed
[run]
name = "diagnose"
dir = "{dir}"
device = "cpu"
comm_timeout = 4.0
[model]
layers = 2
d_model = 32
heads = 2
seq_len = 16
[data]
synthetic_bytes = 65536
val = "none"
[train]
steps = 6
global_batch = 8
micro_batch = 2
"""


def main():
    node = socket.gethostname()
    failures = passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for group in ("dp", "tp", "pp"):
            for fault in ("stall", "exit"):
                run_dir = os.path.join(tmp, group + "_" + fault)
                deck = os.path.join(tmp, "deck_%s_%s.toml" % (group, fault))
                with open(deck, "w") as f:
                    f.write(DECK.format(dir=run_dir))
                env = dict(ENV, MESHTRAIN_FAULT="%s:rank=1:step=2" % fault)
                train = subprocess.run([MPIEXEC, "-n", "2", BIN, "train", deck, "--set",
                                        "parallel.%s=2" % group], env=env, capture_output=True,
                                       text=True, timeout=120)
                diag = subprocess.run([BIN, "diagnose", run_dir], capture_output=True, text=True,
                                      timeout=60)
                out = diag.stdout + diag.stderr
                problems = []
                if train.returncode == 0:
                    problems.append("the training job succeeded despite the fault")
                if diag.returncode != 0:
                    problems.append("diagnose exited %d" % diag.returncode)
                if "likely cause: rank 1 (node %s) stopped communicating" % node not in out:
                    problems.append("rank 1 is not named as the likely cause")
                if "group '%s'" % group not in out:
                    problems.append("group '%s' is not named" % group)
                print("%-4s %-6s %s" % (group, fault, "ok" if not problems else "FAILED"))
                if problems:
                    failures += 1
                    print("    " + "\n    ".join(problems))
                    print("    diagnose output:\n      " + out.replace("\n", "\n      "))
                    print("    training output (tail):\n      " +
                          "\n      ".join((train.stdout + train.stderr).splitlines()[-15:]))
                else:
                    passed += 1
        # A directory without records is refused clearly.
        diag = subprocess.run([BIN, "diagnose", tmp], capture_output=True, text=True, timeout=60)
        if diag.returncode != 1 or "holds no readable flight records" not in diag.stderr:
            failures += 1
            print("empty directory: FAILED (exit %d)\n    %s" % (diag.returncode, diag.stderr))
        else:
            passed += 1
            print("empty directory: ok")
    print("%d passed, %d failed" % (passed, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
