#!/usr/bin/env python3
"""`meshtrain diagnose` names the rank that stalled or died, in dp, tp and pp groups.

Each case trains the tiny deck on 2 ranks laid out along one axis, with rank 1 stalled or killed
at step 2 by fault injection (MESHTRAIN_FAULT), or killed with SIGKILL from outside at some point
of a later step; the job ends (timeout abort, or mpiexec's kill), then `meshtrain diagnose RUNDIR`
reads the ranks' flight records. It must name rank 1 and its node as the likely cause (and the
group where the ranks parted; a rank killed from outside, as dead).

usage: diagnose_test.py MESHTRAIN_BINARY MPIEXEC
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

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


def rank_pid(launcher, rank):
    """The pid of the given world rank below the launcher, or None."""
    todo = [launcher]
    while todo:
        pid = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for c in children:
            try:
                with open("/proc/%d/environ" % c, "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            if os.path.realpath("/proc/%d/exe" % c) == os.path.realpath(BIN) and \
                    int(env.get(b"OMPI_COMM_WORLD_RANK", env.get(b"PMI_RANK", b"-1"))) == rank:
                return c
        todo += children
    return None


def hydra():
    """Whether MPIEXEC is MPICH's Hydra, which ends every other rank with SIGKILL once one dies
    (unless -disable-auto-cleanup): no survivor can note anything in its record."""
    out = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True)
    return "HYDRA" in out.stdout + out.stderr


def killed_rank_named(tmp, group, node, launcher_args=(), name="kill"):
    """Trains until a few steps are logged, kills rank 1 with SIGKILL, and returns the problems
    with what `meshtrain diagnose` says, and its output."""
    run_dir = os.path.join(tmp, group + "_" + name)
    deck = os.path.join(tmp, "deck_%s_%s.toml" % (group, name))
    with open(deck, "w") as f:
        f.write(DECK.format(dir=run_dir))
    launcher = subprocess.Popen([MPIEXEC] + list(launcher_args) + ["-n", "2", BIN, "train", deck, "--set", "parallel.%s=2" % group,
                                 "--set", "train.steps=1000000", "--set", "checkpoint.every=0"],
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and launcher.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3:
            break
        time.sleep(0.05)
    victim = rank_pid(launcher.pid, 1)
    if victim is None:
        launcher.kill()
        return ["rank 1's process not found (the job ended?):\n" + launcher.communicate()[0][-2000:]], ""
    os.kill(victim, signal.SIGKILL)
    try:
        launcher.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.communicate()
        return ["the job did not end within 60 s of the kill"], ""
    diag = subprocess.run([BIN, "diagnose", run_dir], capture_output=True, text=True, timeout=60)
    out = diag.stdout + diag.stderr
    return [], out


def dead_rank_problems(out, node):
    problems = []
    if "likely cause: rank 1 (node %s) stopped communicating" % node not in out:
        problems.append("rank 1 is not named as the likely cause")
    if "rank 1 (node %s) died at about" % node not in out:
        problems.append("rank 1 is not said to have died")
    if "rank 0 (node %s) died" % node in out:
        problems.append("rank 0, which the launcher ended, is said to have died")
    return problems


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
        # kill -9 of rank 1 from outside, at whatever point of a step it is: inside an operation
        # as often as not, where the others wait in the same one. The launcher ends the rest
        # within a second, so only the termination signal the survivors noted in their
        # records tells which rank died (before: "no divergence").
        # Hydra SIGKILLs the survivors at once: with -disable-auto-cleanup they outlive the dead
        # rank (and end on its error or run.comm_timeout), as under srun or Open MPI's mpiexec.
        cases = [(group, "kill", ["-disable-auto-cleanup"] if hydra() else []) for group in ("dp", "tp", "pp")]
        if hydra():
            cases.append(("dp", "killall", []))
        for group, name, launcher_args in cases:
            problems, out = killed_rank_named(tmp, group, node, launcher_args, name)
            if not problems and name == "kill":
                problems = dead_rank_problems(out, node)
                # Under Hydra the survivor may itself end without a trace (a signal MPICH's
                # transport takes when its peer's socket closes): then the records cannot tell,
                # and diagnose must say so rather than guess.
                if problems and launcher_args and "the whole job was ended at once with SIGKILL" in out \
                        and " died at about" not in out:
                    print("%-4s %-8s the survivor left no trace: diagnose says it cannot tell" % (group, name))
                    problems = []
            elif not problems:
                # Hydra SIGKILLs every rank once one dies. Which of two true answers diagnose can
                # give is a race: if the survivor's transport aborted (and the record noted it)
                # before the SIGKILL arrived, the records show rank 1 went first and diagnose must
                # name it; if not, they cannot tell, and diagnose must say so rather than guess,
                # with the pids the launcher names.
                if " died at about" in out:
                    problems = dead_rank_problems(out, node)
                    if not problems:
                        print("%-4s %-8s the survivor noted its abort first: rank 1 named" % (group, name))
                else:
                    for want in ("the whole job was ended at once with SIGKILL",
                                 "rank 1 (node %s) pid " % node, "-disable-auto-cleanup"):
                        if want not in out:
                            problems.append("diagnose does not say %r" % want)
            if problems and out:
                problems.append("diagnose output:\n      " + out.replace("\n", "\n      "))
            print("%-4s %-8s %s" % (group, name, "ok" if not problems else "FAILED"))
            if problems:
                failures += 1
                print("    " + "\n    ".join(problems))
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
