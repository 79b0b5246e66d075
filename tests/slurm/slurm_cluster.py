"""What the Slurm tests share: a local Slurm cluster (scripts/slurm-local.sh) started for a test and
stopped whatever happens, submitting the job scripts of jobs/, the self-requeueing chain, and
comparing checkpoints.

Needs root (the daemons) and the Debian packages slurm-wlm and munge; skip_reason() says why a
test cannot run (the test then exits 77, which CTest reports as skipped).
"""
import collections
import os
import re
import shutil
import subprocess
import time

SKIP = 77

Job = collections.namedtuple("Job", "id status log")


def skip_reason():
    if os.geteuid() != 0:
        return "the Slurm daemons need root"
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            return "%s not installed (Debian packages slurm-wlm, munge)" % tool
    return None


def sh(cmd, env, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


class Cluster:
    """`with Cluster(repo, directory, nodes, meshtrain) as c:` a cluster of `nodes` emulated nodes
    (one: this host) whose jobs run `meshtrain` (MESHTRAIN_BIN), stopped on leaving the block."""

    def __init__(self, repo, directory, nodes, meshtrain, extra_env=None):
        self.repo = repo
        self.jobs = os.path.join(repo, "jobs")
        self.harness = os.path.join(repo, "scripts", "slurm-local.sh")
        self.dir = directory
        self.nodes = nodes
        self.env = dict(os.environ, SLURM_CONF=os.path.join(directory, "slurm.conf"),
                        MESHTRAIN_BIN=os.path.abspath(meshtrain), OMP_NUM_THREADS="1",
                        **(extra_env or {}))

    def __enter__(self):
        start = time.time()
        up = sh([self.harness, "start", self.dir, "--nodes", str(self.nodes)], self.env, timeout=120)
        if up.returncode != 0:
            sh([self.harness, "stop", self.dir], self.env, timeout=60)
            raise RuntimeError("the cluster did not start:\n" + up.stdout + up.stderr)
        print("cluster of %d node(s) up in %.0f s" % (self.nodes, time.time() - start))
        return self

    def __exit__(self, *exc):
        sh([self.harness, "stop", self.dir], self.env, timeout=60)
        return False

    def sbatch(self, script, args, options, output, wait=True, env=None, timeout=600):
        """Submits jobs/<script> with sbatch `options` and the script's `args` (the job's output
        in `output`). Returns a Job: with `wait`, once the job has ended, its exit status and
        output; without, as soon as it is queued (status None). (Not sbatch --wait: it polls
        less and less often, up to 32 s apart, which makes a 5-second job take 42.)"""
        cmd = ["sbatch", "--parsable", "--output", output] + options
        run = sh(cmd + [os.path.join(self.jobs, script)] + args, env or self.env, timeout=60)
        job_id = run.stdout.strip().split(";")[0]
        if run.returncode != 0 or not job_id:
            raise RuntimeError("sbatch %s failed: %s%s" % (script, run.stdout, run.stderr))
        if not wait:
            return Job(job_id, None, "")
        if not self.wait_gone(job_id, timeout):
            sh(["scancel", job_id], self.env)
            return Job(job_id, -1, "job %s did not end within %d s" % (job_id, timeout))
        info = sh(["scontrol", "show", "job", "-o", job_id], self.env).stdout
        m = re.search(r"\bExitCode=(\d+):(\d+)", info)
        status = (int(m.group(1)) or (128 + int(m.group(2)) if int(m.group(2)) else 0)) if m else -1
        log = open(output).read() if os.path.exists(output) else ""
        return Job(job_id, status, log)

    def wait_gone(self, job, timeout):
        """Waits until Slurm no longer lists the job (finished, not requeued). Slurm holds a
        requeued job about two minutes (reason BeginTime) before it may start again; the test
        releases it after 3 s instead, to keep its run time down: released at once, the job is
        allocated within the second its nodes revoked the previous run's credential, and Slurm
        kills it ("Killing non-startable batch job: Job credential revoked")."""
        end = time.time() + timeout
        held_since = None
        while time.time() < end:
            run = sh(["squeue", "-h", "-j", job, "-o", "%T %r"], self.env)
            out = run.stdout.strip()
            if run.returncode == 0 and out == "" and not self.listed(job):
                return True
            if out == "PENDING BeginTime":
                held_since = held_since or time.time()
                if time.time() - held_since >= 3:
                    sh(["scontrol", "update", "JobId=" + job, "StartTime=now"], self.env)
            else:
                held_since = None
            time.sleep(0.5)
        return False

    def listed(self, job):
        """Whether scontrol still has the job in a state that is not final (squeue's answer
        alone can be empty while a requeued job changes state)."""
        run = sh(["scontrol", "show", "job", "-o", job], self.env)
        if run.returncode != 0:  # purged ("Invalid job id"), or a failed query: ask again then
            return "Invalid job id" not in run.stderr
        m = re.search(r"JobState=(\S+)", run.stdout)
        return bool(m) and m.group(1) in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING",
                                          "CONFIGURING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD")


def final_checkpoint(run_dir):
    ckpts = sorted(f for f in os.listdir(os.path.join(run_dir, "checkpoints")) if f.endswith(".h5"))
    return os.path.join(run_dir, "checkpoints", ckpts[-1])


def compare_checkpoints(a, b):
    import h5py
    import numpy as np
    problems = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        if fa.attrs["step"] != fb.attrs["step"]:
            problems.append("steps differ: %s vs %s" % (fa.attrs["step"], fb.attrs["step"]))
        names = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        if not names:
            problems.append("no datasets")
        for n in names:
            if n not in fb or not np.array_equal(fa[n][()], fb[n][()]):
                problems.append("dataset %s differs" % n)
    return problems


def chain(cluster, tmp, deck, steps, placement, uninterrupted="single-node.sbatch", tag=""):
    """jobs/chain.sbatch against an uninterrupted run (jobs/<uninterrupted>) of the same deck
    (`steps` steps, logged every 10 or more often) and placement (sbatch options: nodes, tasks).

    The chain runs under a 1-minute limit with a USR1 warning 45 s before it
    (--signal=B:USR1@45): each run is cut short by the warning, checkpoints, exits 75 and requeues
    itself, and the next run resumes, until training is complete. Its final checkpoint must equal
    the uninterrupted run's bitwise (every parameter and AdamW moment). Returns the failures.

    Slurm checks time limits every 30 s and may warn up to 60 s early, so a run gets the warning
    somewhere in its first 30 s; on a fast or idle host a short training can end before (300
    steps took 1.5 s here). So that the chain is always interrupted, the test sends the batch
    shell the same signal Slurm would (scancel --batch --signal=USR1) as soon as the first run
    has logged a step unwarned, and says so; the later runs get Slurm's own warning or finish."""
    failures = []
    common = ["--chdir", tmp] + placement
    start = time.time()
    a = cluster.sbatch(uninterrupted, [deck, "--set", 'run.dir="%sa"' % tag], ["--time=10"] + common,
                       os.path.join(tmp, tag + "a.out"))
    print("uninterrupted job: exit %d in %.0f s" % (a.status, time.time() - start))
    if a.status != 0:
        failures.append("the uninterrupted job failed:\n" + a.log[-2000:])

    start = time.time()
    out = os.path.join(tmp, tag + "b.out")
    job = cluster.sbatch("chain.sbatch", [deck, "--set", 'run.dir="%sb"' % tag],
                         ["--time=1", "--signal=B:USR1@45"] + common, out, wait=False).id

    # The first run trains a step in milliseconds: watch its log closely (not at wait_gone's
    # pace) and send the warning as soon as a run has logged a step, unless Slurm's came first.
    # Slurm's own warning may also land in a run's start-up, before its first step: that run
    # stops with nothing to save and is requeued, and the watch goes on with the next run.
    deadline = time.time() + 600
    while time.time() < deadline:
        log = open(out).read() if os.path.exists(out) else ""
        if "stopping at step" in log or "finished with status" in log:
            break
        this_run = log[log.rfind("meshtrain chain: job"):]
        done = re.findall(r"^step +(\d+)/", this_run, re.M)
        if done and "USR1 received" not in this_run:
            sh(["scancel", "--batch", "--signal=USR1", job], cluster.env)
            print("chain: no warning from Slurm by step %s of %d: the test sent it" % (done[-1], steps))
            break
        time.sleep(0.02)
    done = cluster.wait_gone(job, 900)
    log = open(out).read()
    stops, resumes = log.count("stopping at step"), log.count("resumed from")
    print("chain job %s: %d stop(s) at the warning, %d resume(s), %.0f s" %
          (job, stops, resumes, time.time() - start))
    if not done:
        failures.append("the chain did not finish in 900 s")
    if stops < 1 or resumes < 1 or "requeueing" not in log:
        failures.append("the chain was not interrupted and resumed:\n" + log[-3000:])
    if ("step %5d/%d" % (steps, steps)) not in log or "finished with status 0" not in log:
        failures.append("the chain did not train to the end:\n" + log[-3000:])
    if not failures:
        problems = compare_checkpoints(final_checkpoint(os.path.join(tmp, tag + "a")),
                                       final_checkpoint(os.path.join(tmp, tag + "b")))
        print("final checkpoints: %s" % ("bitwise identical" if not problems else "; ".join(problems[:5])))
        failures += problems
    return failures


def report(tmp, failures):
    """Prints the failures and returns the exit status; removes `tmp` only when all passed."""
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAILED: " + f)
    print("%d failure(s)%s" % (len(failures), "" if not failures else "; files kept in " + tmp))
    return 1 if failures else 0


def losses(run_dir):
    """{step: loss} from a run directory's metrics.jsonl (9 significant digits)."""
    import json
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record and record.get("loss") is not None:
                out[record["step"]] = record["loss"]
    return out


def layout_line(log):
    """The start-up line "meshtrain ... | N ranks on M node(s): dp .. x tp .. x pp .." or ""."""
    m = re.search(r"^meshtrain \S+ \| run .*$", log, re.M)
    return m.group(0) if m else ""
