#!/usr/bin/env python3
"""Each binary links exactly one MPI — the flavour it was configured for — and the parallel
HDF5 built on that MPI: never Open MPI's libmpi beside MPICH's libmpich, nor one MPI's HDF5 with
the other's library (they disagree on every handle, and crash or hang at run time).

usage: check_mpi_flavour.py FLAVOUR BINARY...   (FLAVOUR: openmpi or mpich)
"""
import re
import subprocess
import sys

# Shared libraries that belong to each flavour, as ldd names them.
OWN = {
    "openmpi": [r"libmpi\.so", r"libopen-pal\.so", r"libopen-rte\.so", r"libhdf5_openmpi\.so"],
    "mpich": [r"libmpich\.so", r"libhdf5_mpich\.so"],
}
REQUIRED = {"openmpi": [r"libmpi\.so", r"libhdf5_openmpi\.so"],
            "mpich": [r"libmpich\.so", r"libhdf5_mpich\.so"]}


def main():
    flavour, binaries = sys.argv[1], sys.argv[2:]
    if flavour not in OWN:
        print("unknown MPI flavour %r (expected openmpi or mpich)" % flavour)
        return 1
    other = [p for f, ps in OWN.items() if f != flavour for p in ps]
    failures = 0
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        libs = [line.split()[0] for line in out.splitlines() if line.strip()]
        problems = ["links %s, which belongs to another MPI" % lib
                    for lib in libs if any(re.match(p, lib) for p in other)]
        problems += ["does not link %s" % p.replace("\\", "")
                     for p in REQUIRED[flavour] if not any(re.match(p, lib) for lib in libs)]
        mine = sorted(lib for lib in libs if any(re.match(p, lib) for p in OWN[flavour]))
        print("%s: %s %s" % (binary, ", ".join(mine), "ok" if not problems else "FAILED"))
        for p in problems:
            print("    " + p)
        failures += bool(problems)
    print("%d passed, %d failed" % (len(binaries) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
