#!/usr/bin/env python3
"""A stalled rank ends the whole job within seconds of run.comm_timeout, not after more timeouts.

Runs tests/comm/stall_probe under mpiexec: the last rank stalls, every other rank holds several
pending receives from it and waits in an all-reduce it never joins. Checks the exit status (3, the
timeout status), the diagnosis (operation, group, rank and node), no std::terminate, and the time
from the first rank starting to wait to the job's end: at most the timeout plus a few seconds.
Before the armed abort each pending receive waited out another timeout while unwinding.

Usage: stall_abort_test.py PROBE MPIEXEC
"""
import re
import subprocess
import sys
import time

TIMEOUT = 3.0
PENDING = 4
SLACK = 4.0  # abort propagation on a loaded 2-core machine; one more timeout would exceed it


def main():
    probe, mpiexec = sys.argv[1], sys.argv[2]
    failures = 0
    for ranks in (2, 3):
        cmd = [mpiexec, "-n", str(ranks), probe, str(TIMEOUT), str(PENDING)]
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=120)
        except subprocess.TimeoutExpired:
            print("ranks %d: the job did not end within 120 s" % ranks)
            failures += 1
            continue
        ended = time.time()
        out = done.stdout
        since = [float(x) for x in re.findall(r"waiting since ([0-9.]+)", out)]
        problems = []
        if done.returncode != 3:
            problems.append("exit status %d, expected 3" % done.returncode)
        if len(since) != ranks - 1:
            problems.append("%d ranks reported waiting, expected %d" % (len(since), ranks - 1))
        elif ended - min(since) > TIMEOUT + SLACK:
            problems.append("ended %.1f s after the wait began (timeout %.0f s, bound %.0f s)"
                            % (ended - min(since), TIMEOUT, TIMEOUT + SLACK))
        if not re.search(r"meshtrain: rank \d+ \(node [^)]+\): error: all_reduce\(sum\) of 64 fp32 on "
                         r"group 'world' \(rank \d+ of %d\) did not complete within 3 s" % ranks, out):
            problems.append("no diagnosis naming the operation, group, rank and node")
        if "terminate called" in out:
            problems.append("std::terminate")
        status = "ok" if not problems else "FAILED"
        took = "%.1fs" % (ended - min(since)) if since else "?"
        print("ranks %d: %d pending receives, timeout %.0fs, ended %s after the wait began: %s"
              % (ranks, PENDING, TIMEOUT, took, status))
        if problems:
            failures += 1
            print("    " + "\n    ".join(problems) + "\n    output:\n      " + out.replace("\n", "\n      "))
    print("%d passed, %d failed" % (2 - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
