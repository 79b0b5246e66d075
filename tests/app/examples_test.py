#!/usr/bin/env python3
"""Every command example of the README, of docs/*.md and of jobs/ runs, so that none can rot.

The examples are found, not listed: every line of the ```sh blocks of README.md and of each
docs/*.md page (continuations joined, comments dropped; the README first, then the pages in name
order, each page top to bottom, so that an example may use what one before it on its page
wrote), their ```python blocks, and every "#   sbatch ..." usage line at the top of the jobs/
scripts. Each must match a rule below, or the test fails naming it: a new example needs a rule
here, which says how it is run.

Most rules run the command as written, in a scratch directory that holds the repository's input/,
jobs/, scripts/ and bench/ and the binary under test as build/meshtrain, with:
  - small overrides appended where the command trains (`--set train.steps=2` and, for the GPT-2
    decks, a 2-layer d_model 64 model of the same vocabulary and layout), so that a run of the
    124M deck takes seconds;
  - the examples' stand-in paths replaced: runs/gpt/checkpoints/step_00001000.h5 by the
    checkpoint the gpt.toml example here wrote, a checkpoint of a run this test shortened by that
    run's newest, /scratch/me by a scratch directory; corpus/*.txt is the README, the docs and
    the sources;
    Llama-3.2-1B, a downloaded Hugging Face Llama, is a tiny one of random weights
    (tests/support/tiny_hf_llama.py).
The command must exit 0 (or, for the bad-layout example, print the message the docs quote).
Every deck shipped in input/ must also plan on the smallest world its layout takes.
Commands that cannot run here are checked as far as they can be, and the rule names where the
rest is tested: sbatch examples (no GPU cluster) are checked with `meshtrain plan` on the job's
world size with the same deck and overrides (the scripts themselves run under Slurm in
slurm_jobs_test and slurm_multi_node_test); `make test` and the MPICH build are what CI runs
(.ci/run); the benchmarks of GPT-2 124M run in `make bench`, their rows on a tiny model in
bench_step_test.

usage: examples_test.py --meshtrain BIN --mpiexec MPIEXEC --repo REPO
"""
import argparse
import glob
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib

ap = argparse.ArgumentParser()
ap.add_argument("--meshtrain", required=True)
ap.add_argument("--mpiexec", required=True)
ap.add_argument("--repo", required=True)
args = ap.parse_args()
REPO = os.path.abspath(args.repo)

# Two steps of a model small enough for seconds on 2 cores, keeping each deck's layout. Evaluation
# and checkpoints only where the example needs them.
SHORT = ["--set", "train.steps=2", "--set", "train.eval_every=0", "--set", "train.eval_batches=1",
         "--set", "data.synthetic_bytes=200000"]
GPT_SMALL = ["--set", "model.layers=2", "--set", "model.d_model=64", "--set", "model.heads=4",
             "--set", "model.seq_len=32", "--set", "train.global_batch=8",
             "--set", "train.micro_batch=1", "--set", "train.warmup_steps=1"]
STAND_IN_CHECKPOINT = "runs/gpt/checkpoints/step_00001000.h5"


def documented_pages():
    """README.md, then docs/*.md in name order, as paths relative to the repository."""
    return ["README.md"] + sorted(os.path.relpath(p, REPO)
                                  for p in glob.glob(os.path.join(REPO, "docs", "*.md")))


def page_examples(page):
    """(where, command) for each command line of a page's sh and python blocks."""
    out, block, lang, start = [], None, None, 0
    lines = open(os.path.join(REPO, page), encoding="utf-8").read().splitlines()
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and block is None:
            block, lang, start = [], fence.group(1), number
            continue
        if fence and block is not None:
            if lang == "python":
                out.append((f"{page}:{start}", "python3 - <<'PY'\n" + "\n".join(block) + "\nPY"))
            elif lang == "sh":
                joined = []
                for text in block:
                    if joined and joined[-1].endswith("\\"):
                        joined[-1] = joined[-1][:-1] + " " + text.strip()
                    else:
                        joined.append(text)
                for text in joined:
                    # Comments: a '#' starting the line or following whitespace.
                    command = re.sub(r"(^|\s)#.*$", "", text).strip()
                    if command:
                        out.append((f"{page}:{start}", command))
            block = None
            continue
        if block is not None:
            block.append(line)
    return out


def jobs_examples():
    out = []
    jobs = os.path.join(REPO, "jobs")
    for name in sorted(os.listdir(jobs)):
        for number, line in enumerate(open(os.path.join(jobs, name), encoding="utf-8"), 1):
            m = re.match(r"^#\s+(sbatch .*)$", line.rstrip())
            if m and "[" not in m.group(1):  # "[DECK] [--set ...]" is the usage, not an example
                out.append((f"jobs/{name}:{number}", re.sub(r"\s#.*$", "", m.group(1)).strip()))
    return out


def sbatch_world(words):
    """Ranks of an sbatch example: --nodes (default: the script's) x the script's tasks per node."""
    script = next(w for w in words if w.startswith("jobs/"))
    text = open(os.path.join(REPO, script), encoding="utf-8").read()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1)) if "--nodes=" in text else 1
    per_node = int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", text).group(1))
    for w in words:
        if w.startswith("--nodes="):
            nodes = int(w.split("=", 1)[1])
        if w.startswith("--ntasks-per-node="):
            per_node = int(w.split("=", 1)[1])
    return nodes * per_node, script, words[words.index(script) + 1:]


class Runner:
    def __init__(self, scratch):
        self.scratch = scratch
        self.problems = []
        self.timings = []  # (seconds, where, command)
        self.checkpoint = None
        for d in ("input", "jobs", "scripts", "bench", "src", "docs", "README.md"):
            os.symlink(os.path.join(REPO, d), os.path.join(scratch, d))
        os.makedirs(os.path.join(scratch, "build"))
        os.symlink(os.path.abspath(args.meshtrain), os.path.join(scratch, "build", "meshtrain"))
        # `mpiexec` in an example is the launcher of the MPI the binary was built with.
        shims = os.path.join(scratch, ".shims")
        os.makedirs(shims)
        os.symlink(args.mpiexec, os.path.join(shims, "mpiexec"))
        # `python3` is the Python this test runs under (CTest's: Debian's, which has h5py).
        os.symlink(sys.executable, os.path.join(shims, "python3"))
        self.env = dict(os.environ, PATH=shims + ":" + os.environ["PATH"], OMP_NUM_THREADS="1",
                        MESHTRAIN_BENCH_OUT=scratch + "/bench-out",
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
        # corpus/*.txt: varied text enough for the examples' tokenizer of 1000 pieces.
        corpus = os.path.join(scratch, "corpus")
        os.makedirs(corpus)
        with open(os.path.join(corpus, "readme.txt"), "w", encoding="utf-8") as f:
            for page in documented_pages():
                f.write(open(os.path.join(REPO, page), encoding="utf-8").read())
        with open(os.path.join(corpus, "sources.txt"), "w", encoding="utf-8") as f:
            for path in sorted(glob.glob(os.path.join(REPO, "src", "*", "*.cpp"))):
                f.write(open(path, encoding="utf-8").read())
        # Llama-3.2-1B: the examples' downloaded Hugging Face Llama, as a tiny one of random weights
        # in the same layout (config.json, model.safetensors, tokenizer.json).
        subprocess.run([sys.executable, os.path.join(REPO, "tests", "support", "tiny_hf_llama.py"),
                        os.path.join(scratch, "Llama-3.2-1B")], check=True)

    def shell(self, where, command, expect_ok=True, timeout=600):
        start = time.monotonic()
        # One thread per rank where a command may launch ranks (8 on 2 cores); one meshtrain
        # process alone (plan, inspect, a one-rank run) uses the machine's cores as a user's would.
        env = self.env
        if command.startswith("build/meshtrain ") and not re.search(r"[;&|`$]", command):
            env = {k: v for k, v in self.env.items() if k != "OMP_NUM_THREADS"}
        p = subprocess.run(["bash", "-c", command], cwd=self.scratch, env=env,
                           capture_output=True, text=True, errors="replace", timeout=timeout)
        # (Text as the terminal would show it: a model of random weights samples any bytes.)
        tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
        seconds = time.monotonic() - start
        self.timings.append((seconds, where, command))
        self.note(f"{where}: exit {p.returncode} in {seconds:.1f} s: {command}\n    " + "\n    ".join(tail))
        if expect_ok and p.returncode != 0:
            self.problems.append(f"{where}: `{command}` exited {p.returncode}:\n{p.stdout}{p.stderr}")
        return p

    def gpt_checkpoint(self):
        """The stand-in for runs/gpt/checkpoints/step_00001000.h5: the small gpt.toml, 2 steps."""
        if self.checkpoint is None:
            self.shell("stand-in checkpoint", " ".join(["build/meshtrain train input/gpt.toml"] +
                       SHORT + GPT_SMALL + ["--set", "checkpoint.every=2"]))
            self.checkpoint = "runs/gpt/checkpoints/step_00000002.h5"
        return self.checkpoint

    def substitute(self, command):
        if STAND_IN_CHECKPOINT in command:
            command = command.replace(STAND_IN_CHECKPOINT, self.gpt_checkpoint())

        # A run this test shortened wrote its checkpoints at step 2, not at the step the example
        # names: the example's checkpoint stands for that run's newest.
        def newest(m):
            if os.path.exists(os.path.join(self.scratch, m.group(0))):
                return m.group(0)
            found = sorted(glob.glob(os.path.join(self.scratch, m.group(1), "step_*.h5")))
            return os.path.relpath(found[-1], self.scratch) if found else m.group(0)
        command = re.sub(r"(runs/[\w.-]+/checkpoints)/step_\d+\.h5", newest, command)
        return command.replace("/scratch/me", self.scratch + "/scratch-me")

    def train_overrides(self, command):
        extra = list(SHORT)
        if re.search(r"input/(gpt|gpt2-[^ ]+|multi-node)\.toml", command):
            extra += GPT_SMALL
        return command + " " + " ".join(shlex.quote(w) for w in extra)

    # ---- the rules' actions ----
    def run_as_written(self, where, command):
        self.shell(where, self.substitute(command))

    def run_short(self, where, command):
        self.shell(where, self.train_overrides(self.substitute(command)))

    def run_bench_short(self, where, command):
        # Before a trailing comment: `... bench --suite async   # 4 workers, ...`.
        code, hash_, comment = command.partition("#")
        short = " --steps 1"
        # The suites that take a tiny model (bench_gpt2) run it: their full sizes are minutes
        # on 2 cores, and `make bench` runs them.
        if re.search(r"--suite (comm|pipeline|zero|checkpoint|hetero|async)\b", code):
            short += " --model tiny"
        self.shell(where, code.rstrip() + short + (" " + hash_ + comment if hash_ else ""))

    def run_eval(self, where, command):
        # The checkpoint it reads was written with the overrides train_overrides gives its deck
        # (the GPT-2 decks' small model): eval needs the same ones.
        extra = ["--set", "train.eval_batches=1"]
        if re.search(r"input/(gpt|gpt2-[^ ]+|multi-node)\.toml", command):
            extra = GPT_SMALL + extra
        self.shell(where, self.substitute(command) + " " + " ".join(shlex.quote(w) for w in extra))

    def expect_layout_refusal(self, where, command):
        text = "".join(open(os.path.join(REPO, page), encoding="utf-8").read()
                       for page in documented_pages())
        quoted = re.search(r"`(input/gpt\.toml: parallel\.tp = (\d+) [^`]*)`", text)
        if not quoted:
            self.problems.append(f"{where}: neither the README nor docs/ quotes a layout refusal")
            return
        p = self.shell(where, f"build/meshtrain plan input/gpt.toml --world {quoted.group(2)} "
                       f"--set parallel.tp={quoted.group(2)}", expect_ok=False)
        if p.returncode == 0 or quoted.group(1) not in p.stderr:
            self.problems.append(f"{where}: the quoted refusal `{quoted.group(1)}` is not what "
                                 f"meshtrain says:\n{p.stderr}")

    def check_sbatch(self, where, command):
        world, script, rest = sbatch_world(shlex.split(command))
        deck = rest[0] if rest else "input/default.toml"
        overrides = " ".join(shlex.quote(w) for w in rest[1:])
        self.shell(where, f"build/meshtrain plan {deck} --world {world} --device cuda {overrides}")

    def covered(self, where, command):
        self.note(f"{where}: covered elsewhere: {command}")

    def note(self, text):
        # As it happens: a run cut off by CTest's timeout still shows how far it got.
        print(text, flush=True)


# (pattern, action, why). The first match decides; order matters.
RULES = [
    (r"^make (run|test|bench)?\s*MPI=mpich|^make MPI=mpich", "covered",
     "the MPICH build and its tests: .ci/run runs `make test MPI=mpich`"),
    (r"^make test$", "covered", ".ci/run runs it; this test is one of its tests"),
    (r"^make run$", "run_make_run", "its recipe, scripts/run-local.sh 8 input/default.toml, short"),
    (r"^MESHTRAIN_BIN=build-mpich/", "run_mpich", "when build-mpich/ exists (make MPI=mpich)"),
    (r"^cd build && ctest", "covered", "the test suite itself (make test)"),
    (r"^python3 scripts/judges\.py ensure", "covered",
     "make test makes the judges' environment (deps-test) and the judge tests run in it"),
    (r"^scripts/slurm-local\.sh|^export SLURM_CONF|^sbatch --wait", "covered",
     "the emulated cluster transcript: slurm_multi_node_test runs this sequence"),
    (r"^sbatch ", "check_sbatch", "deck and overrides planned on the job's world size"),
    (r"^bench/cpu/run\.sh|bench --suite step( --model (gpt2|llama) --threads \d --steps \d)?$"
     r"|^scripts/run-local-bench\.sh", "covered",
     "GPT-2 124M benchmarks: `make bench`; their rows on a tiny model: bench_step_test; "
     "compare_pytorch.py on the tiny models: judge_compare_pytorch_test"),
    (r"^\$\(python3 scripts/judges\.py path\)/bin/python bench/cpu/profile_pytorch\.py ", "covered",
     "PyTorch's profile at 124M (minutes): judge_compare_pytorch_test runs it on the tiny models"),
    (r"bench --suite context", "covered",
     "ring attention at T 4096-8192 (minutes on 2 cores): bench_context_test runs its rows small"),
    (r"bench --suite attention", "covered",
     "attention at T 1024-2048 (minutes on 2 cores): bench_attention_test runs its rows small"),
    (r"bench --suite calibrate", "run_as_written", "the suite, short as it is"),
    (r"bench --suite (comm|pipeline|zero|checkpoint|hetero|async|moe)", "run_bench_short",
     "every row of the suite, one timed step each (--steps 1; all but moe on a tiny model, "
     "--model tiny)"),
    (r"^build/meshtrain plan ", "run_as_written", "planning needs no data"),
    (r"^scripts/advisor-accuracy\.py", "covered", "advisor_test runs it (--quick, 2 ranks)"),
    (r"train .*--set run\.name=(hf-demo|sample-demo) ", "run_as_written",
     "in full: the example after it reads its final checkpoint"),
    (r"^printf .* > \S+\.jsonl$", "run_as_written", "writes the example's small task file"),
    (r"^tensorboard --logdir ", "covered",
     "TensorBoard's server (the judges' tensorboard package): judge_tensorboard_test loads a run's "
     "event files with its own reader"),
    (r"^mkdir -p corpus ", "run_as_written", "the examples' own corpus (README.md, src/io/*.cpp)"),
    (r"^build/meshtrain sample ", "run_as_written", "on the checkpoint the example before wrote"),
    (r"^build/meshtrain (export|import) ", "run_as_written", "on the checkpoints written above"),
    (r" eval ", "run_eval", "against the stand-in checkpoint"),
    (r"^build/meshtrain inspect ", "run_as_written", "the stand-in checkpoint"),
    (r"^build/meshtrain prepare ", "run_as_written", "on the test's corpus/*.txt"),
    (r"^scripts/plot-run\.py ", "run_as_written", "on the run the examples above wrote"),
    (r"^python3 - <<'PY'", "run_as_written", "the stand-in checkpoint"),
    (r"(^scripts/run-local\.sh |^mpiexec .* train |^build/meshtrain train )", "run_short",
     "two steps, small model for the GPT-2 decks"),
]


def main():
    examples = [e for page in documented_pages() for e in page_examples(page)] + jobs_examples()
    with tempfile.TemporaryDirectory(prefix="meshtrain-examples-") as scratch:
        r = Runner(scratch)

        def run_make_run(where, command):
            makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
            ranks = re.search(r"^RANKS\s*\?=\s*(\d+)", makefile, re.M).group(1)
            deck = re.search(r"^DECK\s*\?=\s*(\S+)", makefile, re.M).group(1)
            r.run_short(where, f"scripts/run-local.sh {ranks} {deck}")

        def run_mpich(where, command):
            if not os.path.exists(os.path.join(REPO, "build-mpich", "meshtrain")):
                r.note(f"{where}: SKIPPED here (no build-mpich/; CI builds it): {command}")
                return
            os.makedirs(os.path.join(scratch, "build-mpich"), exist_ok=True)
            link = os.path.join(scratch, "build-mpich", "meshtrain")
            if not os.path.exists(link):
                os.symlink(os.path.join(REPO, "build-mpich", "meshtrain"), link)
            r.run_short(where, command)

        actions = dict(run_make_run=run_make_run, run_mpich=run_mpich)
        # Every shipped deck plans on the smallest world its layout takes: dp 1, or as few data
        # ranks as its expert parallelism (folded over dp x cp) needs.
        for deck in sorted(glob.glob(os.path.join(REPO, "input", "*.toml"))):
            with open(deck, "rb") as f:
                parallel = tomllib.load(f).get("parallel", {})
            size = {axis: parallel.get(axis, 1) for axis in ("tp", "pp", "cp", "ep")}
            size = {axis: v if isinstance(v, int) else 1 for axis, v in size.items()}
            world = size["tp"] * size["pp"] * math.lcm(size["cp"], size["ep"])
            # "auto" choices are planned as train would take them: on a machine profile.
            auto = any(v == "auto" for k, v in parallel.items() if k != "dp")
            r.shell(f"input/{os.path.basename(deck)}", f"build/meshtrain plan "
                    f"input/{os.path.basename(deck)} --world {world} --device cuda" +
                    (" --time --profile input/machines/dgx-h100.toml" if auto else ""))
        # The docs quote one refusal in prose, not in a block: check it too.
        r.expect_layout_refusal("docs (layout refusal)", "")
        for where, command in examples:
            matches = [rule for rule in RULES if re.search(rule[0], command)]
            if not matches:
                r.problems.append(f"{where}: no rule says how to run `{command}`: add one to "
                                  f"tests/app/examples_test.py")
                continue
            action = matches[0][1]
            (actions.get(action) or getattr(r, action))(where, command)
        print("\nslowest:\n" + "\n".join(f"  {s:6.1f} s  {w}: {c}" for s, w, c in
                                          sorted(r.timings, reverse=True)[:10]))
        print(f"{len(examples)} examples")
        if r.problems:
            print("\nFAILED:\n" + "\n\n".join(r.problems))
            return 1
        return 0


sys.exit(main())
