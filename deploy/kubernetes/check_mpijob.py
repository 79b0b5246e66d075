#!/usr/bin/env python3
"""Checks that a Kubeflow MPIJob (kubeflow.org/v2beta1) agrees with the meshtrain deck it runs,
before `kubectl apply`: a mismatch otherwise shows up only once the pods are scheduled, as a
refused layout, a rank without a GPU, or a restarted job that silently starts afresh.

The manifest holds the MPIJob and the ConfigMap with its deck (as deploy/kubernetes/mpijob.yaml
does). The deck is read by meshtrain itself (`meshtrain plan DECK --world N --config`), so its
defaults and validation are the binary's. Checked:

  - Worker replicas x slotsPerWorker = the launcher's `mpirun -np` = dp x tp x pp of the deck
    (the binary refuses a layout that does not fill the world);
  - nvidia.com/gpu of a worker = slotsPerWorker (one GPU per rank), one image for all pods;
  - the deck is a file of a ConfigMap mounted in the workers (rank 0, on a worker, reads it);
  - checkpoint.dir is an absolute path on a persistentVolumeClaim mounted in every worker (and a
    claim defined here is ReadWriteMany when there are several workers), checkpoint.every > 0
    and checkpoint.resume = "auto": a restarted launcher resumes where the job stopped;
  - /dev/shm in the workers is an emptyDir with medium Memory;
  - where mpirun passes the ranks a stop file (-x MESHTRAIN_STOP_FILE=PATH): PATH is absolute,
    on the workers' claim, and the workers' preStop hook creates that same file (their env names
    it) within a grace period of at least 60 s, so that a drained pod's ranks checkpoint first.

usage: check_mpijob.py MANIFEST [--meshtrain BINARY]
Exit status 0: every check passed; 1: refused, one line per problem; 2: the manifest or the
binary could not be read at all.
"""
import argparse
import os
import posixpath
import shlex
import subprocess
import sys
import tempfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None
try:
    import yaml
except ImportError:
    print("check_mpijob.py: needs PyYAML (Debian: apt-get install python3-yaml)", file=sys.stderr)
    sys.exit(2)

LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")


class Unreadable(Exception):
    pass


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    jobs = [d for d in docs if d.get("kind") == "MPIJob"]
    if len(jobs) != 1:
        raise Unreadable("%s: expected one MPIJob, found %d" % (path, len(jobs)))
    if jobs[0].get("apiVersion") != "kubeflow.org/v2beta1":
        raise Unreadable("%s: MPIJob apiVersion is %r, this checker knows kubeflow.org/v2beta1"
                         % (path, jobs[0].get("apiVersion")))
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), {})[d.get("metadata", {}).get("name")] = d
    return jobs[0], by_kind


def replica(job, role):
    spec = job.get("spec", {}).get("mpiReplicaSpecs", {}).get(role)
    if not spec:
        raise Unreadable("MPIJob has no mpiReplicaSpecs.%s" % role)
    pod = spec.get("template", {}).get("spec", {})
    containers = pod.get("containers") or []
    if not containers:
        raise Unreadable("mpiReplicaSpecs.%s has no container" % role)
    return spec, pod, containers[0]


def command_line(container):
    """The launcher container's command as one token list (a `sh -c` script is split too)."""
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    if len(words) >= 2 and posixpath.basename(words[0]) in ("sh", "bash") and "-c" in words:
        script = " ".join(words[words.index("-c") + 1:])
        words = shlex.split(script.replace("\\\n", " "))
    return words


def parse_mpirun(words):
    """(ranks, deck, overrides) from `mpirun -np N ... meshtrain train DECK [--set k=v ...]`."""
    starts = [i for i, w in enumerate(words) if posixpath.basename(w) in LAUNCHERS]
    if not starts:
        raise Unreadable("the launcher's command runs no mpirun: %s" % " ".join(words))
    words = words[starts[0]:]
    ranks = None
    for i, w in enumerate(words):
        if w in ("-np", "-n", "--np", "-c") and i + 1 < len(words):
            ranks = int(words[i + 1])
            break
        if w.startswith("--np=") or w.startswith("-np="):
            ranks = int(w.split("=", 1)[1])
            break
    binary = [i for i, w in enumerate(words) if posixpath.basename(w) == "meshtrain"]
    if not binary or binary[0] + 2 >= len(words) or words[binary[0] + 1] != "train":
        raise Unreadable("the launcher's mpirun runs no `meshtrain train DECK`: %s" % " ".join(words))
    rest = words[binary[0] + 2:]
    deck, overrides = rest[0], []
    for i, w in enumerate(rest):
        if w == "--set" and i + 1 < len(rest):
            overrides.append(rest[i + 1])
        elif w.startswith("--set="):
            overrides.append(w.split("=", 1)[1])
    return ranks, deck, overrides


def exported(words, name):
    """The value mpirun's `-x NAME=VALUE` gives the ranks, or None."""
    for i, w in enumerate(words[:-1]):
        if w == "-x" and words[i + 1].startswith(name + "="):
            return words[i + 1].split("=", 1)[1]
    return None


MIN_GRACE_SECONDS = 60


def check_stop_file(launcher, worker_pod, worker, claims):
    """Problems and notes of the stop-file wiring (README: Restarts resume)."""
    path = exported(command_line(launcher), "MESHTRAIN_STOP_FILE")
    if path is None:
        return [], ["note: mpirun passes no MESHTRAIN_STOP_FILE: a drained worker pod ends its "
                    "ranks without a checkpoint (up to checkpoint.every steps lost)"]
    problems = []
    if not posixpath.isabs(path) or not any(under(path, c) for c in claims):
        problems.append("MESHTRAIN_STOP_FILE = %r is not on the workers' persistent volume (%s): "
                        "rank 0 and every worker's preStop hook must see the same file"
                        % (path, ", ".join(sorted(claims)) or "none mounted"))
    env = {e.get("name"): e.get("value") for e in worker.get("env") or []}
    if env.get("MESHTRAIN_STOP_FILE") != path:
        problems.append("the worker's env MESHTRAIN_STOP_FILE is %r, but mpirun gives the ranks %r: "
                        "the preStop hook would create another file"
                        % (env.get("MESHTRAIN_STOP_FILE"), path))
    hook = ((worker.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
    if not hook or "MESHTRAIN_STOP_FILE" not in " ".join(str(w) for w in hook):
        problems.append("the worker has no preStop hook creating $MESHTRAIN_STOP_FILE: a drained pod "
                        "would end its ranks without a checkpoint")
    grace = worker_pod.get("terminationGracePeriodSeconds", 30)
    if grace < MIN_GRACE_SECONDS:
        problems.append("the worker's terminationGracePeriodSeconds is %d: too short for one step "
                        "and one checkpoint write before SIGTERM; give at least %d"
                        % (grace, MIN_GRACE_SECONDS))
    return problems, ([] if problems else ["stop file %s, grace period %d s" % (path, grace)])


def under(path, mount):
    path, mount = posixpath.normpath(path), posixpath.normpath(mount)
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def mounts(pod, container):
    """mountPath -> (volume, subPath) of the container, volumes by name from the pod."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    return {m["mountPath"]: (volumes.get(m.get("name"), {}), m.get("subPath"))
            for m in container.get("volumeMounts") or [] if "mountPath" in m}


def deck_text(deck, worker_mounts, configmaps):
    """The deck's text from the ConfigMap mounted where the deck path points."""
    for path, (volume, sub) in sorted(worker_mounts.items(), key=lambda kv: -len(kv[0])):
        cm = volume.get("configMap")
        if not cm or not under(deck, path):
            continue
        relative = posixpath.relpath(posixpath.normpath(deck), posixpath.normpath(path))
        if sub:
            relative = sub if relative == "." else None
        keys = {item["path"]: item["key"] for item in cm.get("items") or []}
        key = keys.get(relative, relative if not cm.get("items") else None)
        source = configmaps.get(cm.get("name"))
        if source is None:
            raise Unreadable("the deck %s is ConfigMap %r, which this manifest does not define: "
                             "put it here to check it" % (deck, cm.get("name")))
        if key not in (source.get("data") or {}):
            raise Unreadable("the deck %s: ConfigMap %r has no key %r" % (deck, cm.get("name"), key))
        return source["data"][key]
    raise Unreadable("the deck %s is on no ConfigMap mounted in the workers (rank 0 runs on a "
                     "worker and reads it there)" % deck)


def read_deck(meshtrain, text, ranks, overrides, gpus):
    """(layout line, effective configuration) as meshtrain reads the deck for `ranks` ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "deck.toml")
        with open(path, "w") as f:
            f.write(text)
        cmd = [meshtrain, "plan", path, "--world", str(ranks), "--config"]
        cmd += ["--device", "cuda" if gpus else "cpu"]
        for o in overrides:
            cmd += ["--set", o]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    if p.returncode != 0:
        message = (p.stderr.strip() or p.stdout.strip()).replace(path, "the deck")
        return None, None, message
    marker = "# effective configuration\n"
    if marker not in p.stdout:
        raise Unreadable("%s plan --config printed no effective configuration (an older build?)"
                         % meshtrain)
    plan = p.stdout.split(marker, 1)[0].splitlines()
    layout = plan[0].split(" ranks: ", 1)[-1]
    peak = next((line.lstrip("# ") for line in plan if line.startswith("# every rank")), "")
    if peak:
        layout += "; " + peak
    if tomllib is None:
        raise Unreadable("reading the effective configuration needs Python 3.11 (tomllib)")
    return layout, tomllib.loads(p.stdout.split(marker, 1)[1]), None


def check(manifest, meshtrain):
    problems, notes = [], []
    job, by_kind = load(manifest)
    spec = job.get("spec", {})
    slots = spec.get("slotsPerWorker")
    if not isinstance(slots, int) or slots < 1:
        problems.append("spec.slotsPerWorker must be set to the ranks per worker (got %r)" % slots)
        slots = 1
    launcher_spec, _, launcher = replica(job, "Launcher")
    worker_spec, worker_pod, worker = replica(job, "Worker")
    workers = worker_spec.get("replicas", 1)
    if launcher_spec.get("replicas", 1) != 1:
        problems.append("Launcher replicas = %r: one launcher runs mpirun" % launcher_spec.get("replicas"))
    if launcher.get("image") != worker.get("image"):
        problems.append("the launcher's image %r differs from the workers' %r: every rank must run "
                        "the same build" % (launcher.get("image"), worker.get("image")))

    ranks, deck, overrides = parse_mpirun(command_line(launcher))
    world = workers * slots
    if ranks is None:
        problems.append("mpirun has no -np: give it Worker replicas x slotsPerWorker = %d" % world)
        ranks = world
    elif ranks != world:
        problems.append("mpirun -np %d, but Worker replicas x slotsPerWorker = %d x %d = %d ranks"
                        % (ranks, workers, slots, world))

    limits = (worker.get("resources") or {}).get("limits") or {}
    gpus = limits.get("nvidia.com/gpu")
    if gpus is None:
        problems.append("the worker has no nvidia.com/gpu limit: set it to slotsPerWorker = %d "
                        "(one GPU per rank)" % slots)
    elif int(gpus) != slots:
        problems.append("the worker's nvidia.com/gpu limit is %s, but slotsPerWorker = %d: one GPU "
                        "per rank needs them equal" % (gpus, slots))

    worker_mounts = mounts(worker_pod, worker)
    shm = worker_mounts.get("/dev/shm")
    if shm is None:
        problems.append("the worker mounts nothing at /dev/shm: mount an emptyDir with medium "
                        "Memory there (the container default of 64 MiB starves NCCL and Open MPI)")
    elif (shm[0].get("emptyDir") or {}).get("medium") != "Memory":
        problems.append("/dev/shm in the worker is not an emptyDir with medium: Memory")

    text = deck_text(deck, worker_mounts, by_kind.get("ConfigMap", {}))
    layout, config, refusal = read_deck(meshtrain, text, ranks, overrides, gpus is not None)
    if refusal:
        problems.append("meshtrain refuses the deck on %d ranks: %s" % (ranks, refusal))
        return problems, notes
    p = config["parallel"]
    notes.append("%s on %d ranks: %s" % (deck, ranks, layout))
    if p["dp"] * p["tp"] * p["pp"] != ranks:
        problems.append("dp x tp x pp = %d x %d x %d differs from mpirun -np %d"
                        % (p["dp"], p["tp"], p["pp"], ranks))

    ckpt = config["checkpoint"]
    where = ckpt["dir"]
    claims = {path: volume["persistentVolumeClaim"].get("claimName")
              for path, (volume, _) in worker_mounts.items() if volume.get("persistentVolumeClaim")}
    if not posixpath.isabs(where):
        problems.append("checkpoint.dir = %r is relative (to each rank's working directory): make "
                        "it an absolute path on the persistent volume" % where)
    else:
        on = [path for path in claims if under(where, path)]
        if not on:
            problems.append("checkpoint.dir = %r is not on the persistent volume: the workers mount "
                            "claims at %s; a restarted pod would find no checkpoint"
                            % (where, ", ".join(sorted(claims)) or "no path"))
        else:
            claim = by_kind.get("PersistentVolumeClaim", {}).get(claims[on[0]])
            modes = (claim or {}).get("spec", {}).get("accessModes") or []
            if claim and workers > 1 and "ReadWriteMany" not in modes:
                problems.append("claim %r is %s: %d worker pods write each checkpoint together, "
                                "which needs ReadWriteMany" % (claims[on[0]], modes, workers))
            notes.append("checkpoints in %s on claim %r" % (where, claims[on[0]]))
    if ckpt["resume"] != "auto":
        problems.append("checkpoint.resume = %r: a restarted job would not resume; set \"auto\""
                        % ckpt["resume"])
    if ckpt["every"] <= 0:
        problems.append("checkpoint.every = %d: no checkpoint to resume from; set it > 0"
                        % ckpt["every"])
    stop_problems, stop_notes = check_stop_file(launcher, worker_pod, worker, claims)
    problems += stop_problems
    notes += stop_notes
    run_dir = config["run"]["dir"]
    if not any(under(run_dir, path) for path in claims):
        notes.append("note: run.dir = %r (metrics, flight records) is not on a persistent volume"
                     % run_dir)
    return problems, notes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("manifest")
    parser.add_argument("--meshtrain", default="build/meshtrain")
    args = parser.parse_args()
    try:
        problems, notes = check(args.manifest, args.meshtrain)
    except (Unreadable, OSError, ValueError, KeyError, yaml.YAMLError) as e:
        print("check_mpijob.py: %s" % e, file=sys.stderr)
        return 2
    for n in notes:
        print(n)
    for p in problems:
        print("refused: %s" % p)
    print("%s: %s" % (args.manifest, "%d problem(s)" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
