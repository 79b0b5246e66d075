#!/usr/bin/env python3
"""Threads per rank follow the launcher's CPU binding, and a binding that leaves cores idle is
named at start-up with the flag that fixes it (src/app/cpu_binding.cpp), through the real binary.

Open MPI's mpirun binds each rank to one core when it starts two ranks or fewer, so on an N-core
machine `mpirun -np 1` leaves N - 1 cores idle: the run must say so and name `--bind-to none`.
With `--bind-to none` the rank gets every core and no warning. With as many ranks as cores, each
bound to its own core, nothing is idle. Expectations come from this process's own CPU affinity
(CTest does not bind it).

usage: binding_test.py MESHTRAIN_BINARY MPIEXEC   (exit 77: cannot run here, with the reason)
"""
import os
import re
import subprocess
import sys
import tempfile

BIN, MPIEXEC = sys.argv[1], sys.argv[2]
SKIP = 77
DECK = """
# precision-independent: threads per rank, not numbers
[run]
name = "binding"
dir = "{dir}/run"
device = "cpu"
log_every = 1
[model]
layers = 1
d_model = 16
heads = 2
seq_len = 8
[data]
synthetic_bytes = 16384
[train]
steps = 1
global_batch = 4
micro_batch = 2
[checkpoint]
every = 0
"""


def environment(**extra):
    env = dict(os.environ)
    # CTest's MPI environment switches binding off and pins one thread: both are what this test
    # is about, so they go.
    for name in ("OMP_NUM_THREADS", "OMPI_MCA_hwloc_base_binding_policy"):
        env.pop(name, None)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    env.update(extra)
    return env


def run(deck, ranks, flags=(), **env):
    p = subprocess.run([MPIEXEC, "-n", str(ranks), *flags, BIN, "train", deck],
                       env=environment(**env), capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def device_line(stdout):
    m = re.search(r"^device: .*$", stdout, re.M)
    return m.group(0) if m else ""


def main():
    version = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:
        print("SKIPPED: %s is not Open MPI's (its default binding is what this test checks)" % MPIEXEC)
        return SKIP
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores)
    if n < 2:
        print("SKIPPED: this process may use %d core(s); an idle core needs 2" % n)
        return SKIP
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        deck = os.path.join(tmp, "deck.toml")
        with open(deck, "w") as f:
            f.write(DECK.format(dir=tmp))

        # mpirun -np 1: bound to one core, N - 1 idle.
        rc, out, err = run(deck, 1)
        line = device_line(out)
        want = "the CPU binding leaves %d of %d core(s) of this node idle" % (n - 1, n)
        print("np 1, default binding:\n  %s\n  %s" % (line, err.strip().replace("\n", "\n  ")))
        if rc != 0:
            problems.append("np 1: exit status %d" % rc)
        if want not in err:
            problems.append("np 1: no warning '%s'" % want)
        if "`mpirun --bind-to none`" not in err or "--map-by slot:PE=%d" % n not in err:
            problems.append("np 1: the warning does not name `mpirun --bind-to none` and "
                            "`--map-by slot:PE=%d`" % n)
        if "1 thread(s) per rank" not in line or "%d idle" % (n - 1) not in line:
            problems.append("np 1: device line '%s' does not say 1 thread and %d idle" % (line, n - 1))

        # --bind-to none: every core, no warning.
        rc, out, err = run(deck, 1, ["--bind-to", "none"])
        line = device_line(out)
        print("np 1, --bind-to none:\n  %s" % line)
        if rc != 0:
            problems.append("--bind-to none: exit status %d" % rc)
        if "binding leaves" in err or "idle" in line:
            problems.append("--bind-to none: warned about idle cores: %s" % err.strip())
        if "%d thread(s) per rank" % n not in line:
            problems.append("--bind-to none: device line '%s' does not say %d threads" % (line, n))

        # OMP_NUM_THREADS takes precedence over the cores, but the idle cores are still named.
        rc, out, err = run(deck, 1, OMP_NUM_THREADS="1")
        line = device_line(out)
        if "threads from OMP_NUM_THREADS" not in line or want not in err:
            problems.append("OMP_NUM_THREADS=1: expected 'threads from OMP_NUM_THREADS' and the "
                            "warning, got '%s' / '%s'" % (line, err.strip()))

        # One rank a core (mpirun binds each of two ranks to a core): nothing idle on 2 cores.
        if n == 2:
            rc, out, err = run(deck, 2)
            line = device_line(out)
            print("np 2, default binding:\n  %s" % line)
            if rc != 0 or "binding leaves" in err or "1 thread(s) per rank" not in line:
                problems.append("np 2: expected 1 thread a rank and no warning, got '%s' / '%s'"
                                % (line, err.strip()))
    for p in problems:
        print("FAIL:", p)
    print("FAILED" if problems else "PASSED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
