#!/usr/bin/env python3
"""Builds what a CTest selection runs, for `make test CTEST_ARGS=...`.

  scripts/build-for-tests.py BUILD_DIR JOBS [CTEST_ARGS...]

Without CTest arguments it builds everything (`make test`). With them it asks CTest which tests
they select (ctest --show-only=json-v1, the same arguments the run gets) and builds the
executables those tests' commands name (test binaries, meshtrain, stall_probe: every executable
target is listed with its path in BUILD_DIR/test_executables.txt, written by CMake), no others.
A subset of the suite (the sanitizer and MPICH passes of .ci/run) then does not compile and link
test binaries it never runs. Tests that name no executable (Python on the sources) need none.

A selection is taken again after each build, which regenerates the build system when a
CMakeLists.txt changed: a test added since the last build is built before CTest runs it.
"""
import json
import os
import re
import subprocess
import sys


def build(build_dir, jobs, targets):
    cmd = ["cmake", "--build", build_dir, "-j", jobs]
    if targets is not None:
        cmd += ["--target"] + sorted(targets)
    print(" ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        sys.exit(1)


def executables(build_dir):
    """{absolute path of the executable: its target name}, from the list CMake writes."""
    listing = os.path.join(build_dir, "test_executables.txt")
    if not os.path.exists(listing):
        sys.exit("meshtrain: %s is missing: configure the build directory with this source tree's "
                 "CMakeLists.txt (make configure)" % listing)
    out = {}
    with open(listing) as f:
        for line in f:
            if line.strip():
                target, path = line.rstrip("\n").split(" ", 1)
                out[os.path.realpath(path)] = target
    return out


def test_commands(build_dir):
    """{test name: the words of its command}, from the CTestTestfile.cmake files CMake writes.
    (ctest --show-only leaves out the command of a test whose executable is not built yet.)"""
    add_test = re.compile(r"^add_test\(\[(=*)\[(.*?)\]\1\] (.*)\)$")
    quoted = re.compile(r'"((?:[^"\\]|\\.)*)"')
    commands = {}
    for root, _, files in os.walk(build_dir):
        if "CTestTestfile.cmake" in files:
            with open(os.path.join(root, "CTestTestfile.cmake")) as f:
                for line in f:
                    m = add_test.match(line.strip())
                    if m:
                        commands[m.group(2)] = quoted.findall(m.group(3))
    return commands


def selected_targets(build_dir, ctest_args):
    """The executable targets the commands of the tests CTest selects with ctest_args name."""
    run = subprocess.run(["ctest", "--show-only=json-v1"] + ctest_args, cwd=build_dir,
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("meshtrain: ctest could not list the tests of %s with %s:\n%s%s" %
                 (build_dir, " ".join(ctest_args), run.stdout, run.stderr))
    by_path = executables(build_dir)
    commands = test_commands(build_dir)
    targets = set()
    for test in json.loads(run.stdout).get("tests", []):
        if test["name"] not in commands:
            sys.exit("meshtrain: no command for test %s in %s/**/CTestTestfile.cmake (has CMake "
                     "changed their format?); run `make test` without CTEST_ARGS to build all" %
                     (test["name"], build_dir))
        for word in commands[test["name"]]:
            target = by_path.get(os.path.realpath(word)) if os.path.isabs(word) else None
            if target:
                targets.add(target)
    return targets


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: build-for-tests.py BUILD_DIR JOBS [CTEST_ARGS...]")
    build_dir, jobs, ctest_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if not ctest_args:
        build(build_dir, jobs, None)
        return
    built = set()
    while True:
        wanted = selected_targets(build_dir, ctest_args) - built
        if not wanted:
            break
        build(build_dir, jobs, wanted)
        built |= wanted
    print("built for the selected tests: %s" % (" ".join(sorted(built)) or "nothing"), flush=True)


if __name__ == "__main__":
    main()
