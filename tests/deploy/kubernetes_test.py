#!/usr/bin/env python3
"""deploy/kubernetes: the MPIJob agrees with its deck, the checker refuses what would not run,
and the image recipe installs what the binary loads.

1. check_mpijob.py accepts deploy/kubernetes/mpijob.yaml, reading the deck with this build's
   meshtrain (workers x slots = mpirun -np = dp x tp x pp, one GPU a rank, checkpoints on the
   claim, resume "auto", /dev/shm in memory).
2. It refuses each of a set of mutated copies, one defect each, naming that defect: a checker
   that accepts everything fails here.
3. deploy/kubernetes/runtime-packages.sh maps every library of this build's meshtrain to a Debian
   package (the list the Dockerfile's runtime stage installs), and the Dockerfile builds a portable
   binary on Debian 12 and installs that list. No image is built here (that needs a container
   engine with a daemon).

usage: kubernetes_test.py --meshtrain BINARY --repo SOURCE_DIR   (exit 77: no PyYAML)
"""
import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIPPED: PyYAML is not installed (Debian: python3-yaml; scripts/ensure-deps.sh test)")
    sys.exit(77)


def job_of(docs):
    return next(d for d in docs if d["kind"] == "MPIJob")


def deck_of(docs):
    return next(d for d in docs if d["kind"] == "ConfigMap")["data"]


def worker(docs):
    return job_of(docs)["spec"]["mpiReplicaSpecs"]["Worker"]


def worker_container(docs):
    return worker(docs)["template"]["spec"]["containers"][0]


def launcher_args(docs):
    return job_of(docs)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]


def set_deck(docs, pattern, replacement):
    data = deck_of(docs)
    text, n = re.subn(pattern, replacement, data["deck.toml"], flags=re.M)
    assert n == 1, "mutation %r matched %d times" % (pattern, n)
    data["deck.toml"] = text


def set_np(docs, n):
    args = launcher_args(docs)
    args[args.index("-np") + 1] = str(n)


def drop_shm_medium(docs):
    for v in worker(docs)["template"]["spec"]["volumes"]:
        if v["name"] == "shm":
            v["emptyDir"] = {}


def stop_file_elsewhere(docs):
    args = launcher_args(docs)
    i = [n for n, a in enumerate(args) if a.startswith("MESHTRAIN_STOP_FILE=")][0]
    args[i] = "MESHTRAIN_STOP_FILE=/mnt/meshtrain/runs/other/STOP"


def claim_read_write_once(docs):
    next(d for d in docs if d["kind"] == "PersistentVolumeClaim")["spec"]["accessModes"] = ["ReadWriteOnce"]


# (name, mutation, words the refusal must contain)
MUTATIONS = [
    ("one worker more", lambda d: worker(d).update(replicas=3),
     "mpirun -np 16, but Worker replicas x slotsPerWorker = 3 x 8 = 24"),
    ("mpirun -np off by one", lambda d: set_np(d, 15), "mpirun -np 15, but Worker replicas"),
    ("fewer GPUs than slots",
     lambda d: worker_container(d)["resources"]["limits"].update({"nvidia.com/gpu": 4}),
     "nvidia.com/gpu limit is 4, but slotsPerWorker = 8"),
    ("no GPU limit", lambda d: worker_container(d)["resources"]["limits"].pop("nvidia.com/gpu"),
     "no nvidia.com/gpu limit"),
    ("layout does not fill the world", lambda d: set_deck(d, r"^dp = 2$", "dp = 4"),
     "does not match the 16 ranks"),
    ("checkpoints off the volume",
     lambda d: set_deck(d, r'^dir = "/mnt/meshtrain/runs/gpt2-k8s/checkpoints"$', 'dir = "/tmp/checkpoints"'),
     "'/tmp/checkpoints' is not on the persistent volume"),
    ("relative checkpoint directory",
     lambda d: set_deck(d, r'^dir = "/mnt/meshtrain/runs/gpt2-k8s/checkpoints"$', 'dir = "checkpoints"'),
     "is relative"),
    ("resume none", lambda d: set_deck(d, r'^resume = "auto"$', 'resume = "none"'),
     "checkpoint.resume = 'none'"),
    ("no periodic checkpoints", lambda d: set_deck(d, r"^every = 500$", "every = 0"),
     "checkpoint.every = 0"),
    ("/dev/shm on disk", drop_shm_medium, "/dev/shm in the worker is not an emptyDir with medium: Memory"),
    ("claim not shared", claim_read_write_once, "needs ReadWriteMany"),
    ("stop file the hook does not create", stop_file_elsewhere,
     "the preStop hook would create another file"),
    ("no preStop hook", lambda d: worker_container(d).pop("lifecycle"), "no preStop hook"),
    ("default grace period",
     lambda d: worker(d)["template"]["spec"].pop("terminationGracePeriodSeconds"),
     "terminationGracePeriodSeconds is 30"),
    ("launcher on another image",
     lambda d: job_of(d)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
     .update(image="registry.example.com/meshtrain:old"),
     "every rank must run the same build"),
]


def run_checker(checker, manifest, meshtrain):
    p = subprocess.run([sys.executable, checker, manifest, "--meshtrain", meshtrain],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshtrain", required=True)
    parser.add_argument("--repo", required=True)
    args = parser.parse_args()
    here = os.path.join(args.repo, "deploy", "kubernetes")
    checker, manifest = os.path.join(here, "check_mpijob.py"), os.path.join(here, "mpijob.yaml")
    problems = []

    rc, out = run_checker(checker, manifest, args.meshtrain)
    print("the manifest as committed (exit %d):\n  %s" % (rc, out.strip().replace("\n", "\n  ")))
    if rc != 0 or not out.rstrip().endswith(": ok"):
        problems.append("check_mpijob.py refuses deploy/kubernetes/mpijob.yaml (exit %d)" % rc)
    for needed in ("dp 2 tp 4 pp 2", "checkpoints in /mnt/meshtrain/runs/gpt2-k8s/checkpoints"):
        if needed not in out:
            problems.append("the accepted manifest's report lacks %r" % needed)

    with open(manifest) as f:
        original = [d for d in yaml.safe_load_all(f) if d]
    with tempfile.TemporaryDirectory() as tmp:
        for name, mutate, expected in MUTATIONS:
            docs = copy.deepcopy(original)
            mutate(docs)
            path = os.path.join(tmp, "mutated.yaml")
            with open(path, "w") as f:
                yaml.safe_dump_all(docs, f, sort_keys=False)
            rc, out = run_checker(checker, path, args.meshtrain)
            refused = rc == 1 and expected in out
            print("%-32s exit %d  %s" % (name, rc, "refused as expected" if refused else "NOT REFUSED"))
            if not refused:
                problems.append("%s: expected exit 1 and %r, got exit %d:\n%s" % (name, expected, rc, out))

    # The image recipe: runtime packages of this very binary, and the Dockerfile's use of them.
    script = os.path.join(here, "runtime-packages.sh")
    p = subprocess.run([script, args.meshtrain], capture_output=True, text=True, timeout=120)
    packages = p.stdout.split()
    if p.returncode != 0 and "no Debian package owns" in p.stderr and "/usr/local/" in p.stderr:
        print("SKIPPED: runtime packages: this build loads libraries installed outside Debian's "
              "packages (%s); the image builds against packaged ones" % p.stderr.strip())
    elif p.returncode != 0:
        problems.append("runtime-packages.sh %s failed: %s" % (args.meshtrain, p.stderr.strip()))
    else:
        print("runtime packages of %s: %s" % (args.meshtrain, " ".join(packages)))
        for prefix in ("libopenmpi", "libhdf5-openmpi", "libopenblas0", "libtomlplusplus", "libgomp1"):
            if not any(pkg.startswith(prefix) for pkg in packages):
                problems.append("runtime-packages.sh names no %s* package" % prefix)
        if any(pkg.endswith("-dev") for pkg in packages):
            problems.append("runtime-packages.sh names development packages: %s" % packages)
    with open(os.path.join(here, "Dockerfile")) as f:
        dockerfile = f.read()
    for needed, why in (("FROM debian:${DEBIAN} AS build", "a build stage on Debian"),
                        ("ARG DEBIAN=bookworm", "Debian 12"),
                        ("-DMESHTRAIN_NATIVE=OFF", "a portable binary (not the build host's -march)"),
                        ("runtime-packages.sh /build/meshtrain", "runtime packages from ldd"),
                        ("$(cat /tmp/deps/runtime-packages.txt)", "the runtime stage installs them"),
                        ("COPY --from=build /build/meshtrain", "the binary copied from the build stage")):
        if needed not in dockerfile:
            problems.append("Dockerfile lacks %r (%s)" % (needed, why))

    for p in problems:
        print("FAIL:", p)
    print("FAILED" if problems else "PASSED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
