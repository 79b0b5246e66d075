#!/usr/bin/env python3
"""The judges' Python environment: outside libraries (transformers, tokenizers, tiktoken, PyTorch 2,
safetensors) that check meshtrain's claims in the tests labelled `judge`. Nothing meshtrain runs
needs it; `make test` makes it, and CTest runs each judge test through it.

  scripts/judges.py ensure            make the environment if it is missing (make test does this)
  scripts/judges.py path              print the environment's folder
  scripts/judges.py run SCRIPT ARGS   run SCRIPT with the environment's python (CTest does this)

The versions are pinned in one file, tests/judges/requirements.txt (every package, dependencies
included). The environment is a venv in a cache folder named after that file's hash,
$MESHTRAIN_JUDGES_CACHE (default: $XDG_CACHE_HOME/meshtrain, else ~/.cache/meshtrain), so that
every build folder, clone and CI run on a machine reuses it, and a change of a pin makes a new one.

Where the package index cannot be reached, `ensure` records why (beside the folder) and exits 0,
and `run` exits 77, which CTest reports as skipped, with the reason printed: a judge that did not
run is never a pass. With MESHTRAIN_REQUIRE_JUDGES=1 (.ci/run sets it) both fail instead.

PyTorch: the package index's Linux wheel is built for CUDA and pulls NVIDIA's libraries (about
3 GB installed); the CPU-only wheels live on PyTorch's own index, which these machines cannot
reach. The CUDA wheel runs on the CPU as well, so it is what is installed, once per machine.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = os.path.join(ROOT, "tests", "judges", "requirements.txt")
SKIP = 77  # CTest's SKIP_RETURN_CODE for the judge tests
# The interpreter the venv is made from: Debian's (python3-venv), not one a user's PATH may put
# first (pyenv and the like), so that every machine builds the same environment.
BASE_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def required():
    return os.environ.get("MESHTRAIN_REQUIRE_JUDGES", "") not in ("", "0")


def env_folder():
    with open(REQUIREMENTS, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    cache = os.environ.get("MESHTRAIN_JUDGES_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "meshtrain")
    return os.path.join(cache, "judges-" + digest)


def complete(folder):
    return os.path.exists(os.path.join(folder, ".complete"))


def ensure():
    folder = env_folder()
    if complete(folder):
        return 0
    unavailable = folder + ".unavailable"
    staging = "%s.tmp-%d" % (folder, os.getpid())
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    print("meshtrain: making the judges' Python environment (tests/judges/requirements.txt) in %s; "
          "the first time downloads about 3.5 GB (PyTorch with NVIDIA's libraries)" % folder, flush=True)
    start = time.monotonic()
    try:
        subprocess.run([BASE_PYTHON, "-m", "venv", staging], check=True)
        pip = [os.path.join(staging, "bin", "python"), "-m", "pip", "--disable-pip-version-check"]
        subprocess.run(pip + ["install", "--quiet", "--no-deps", "-r", REQUIREMENTS], check=True,
                       timeout=3600)
        # Every dependency is pinned in the file: check that nothing is missing or conflicting.
        subprocess.run(pip + ["check"], check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        reason = "the judges' environment could not be installed (%s): is the Python package " \
                 "index reachable, and python3-venv installed?" % e
        with open(unavailable, "w") as f:
            f.write(reason + "\n")
        print("meshtrain: " + reason, file=sys.stderr)
        return 1 if required() else 0
    open(os.path.join(staging, ".complete"), "w").close()
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(staging, folder)
    if os.path.exists(unavailable):
        os.remove(unavailable)
    print("meshtrain: judges' environment ready in %.0f s" % (time.monotonic() - start), flush=True)
    return 0


def run(script, args):
    folder = env_folder()
    if not complete(folder):
        why = "not made yet (make test makes it; or scripts/judges.py ensure)"
        if os.path.exists(folder + ".unavailable"):
            with open(folder + ".unavailable") as f:
                why = f.read().strip()
        if required():
            print("FAILED: the judge tests must run (MESHTRAIN_REQUIRE_JUDGES=1), but the judges' "
                  "Python environment %s is missing: %s" % (folder, why), flush=True)
            return 1
        print("SKIPPED: the judges' Python environment %s: %s" % (folder, why), flush=True)
        return SKIP
    python = os.path.join(folder, "bin", "python")
    env = dict(os.environ, MESHTRAIN_JUDGES=folder, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([python, script] + args, env=env).returncode


def main(argv):
    if len(argv) >= 1 and argv[0] == "ensure":
        return ensure()
    if len(argv) >= 1 and argv[0] == "path":
        print(env_folder())
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        return run(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
