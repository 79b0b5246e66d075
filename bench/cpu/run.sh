#!/usr/bin/env bash
# The CPU comparison: meshtrain's step suite (GPT-2 124M, T 256, micro-batch 4, fp32 and bf16, at
# 1 and THREADS threads, each against this CPU's GEMM ceilings) and the same model trained by
# PyTorch (bench/cpu/compare_pytorch.py) on the same thread counts, one after the other; prints
# both and meshtrain's ratio per row (tokens/s over PyTorch's).
#   bench/cpu/run.sh [THREADS [STEPS]]        (defaults 2 and 4)
# Exit status: non-zero if meshtrain's suite fails; 77 if PyTorch is not installed (meshtrain's
# rows are printed all the same, no ratio is); else PyTorch's script's status.
set -euo pipefail
threads=${1:-2}
steps=${2:-4}
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${MESHTRAIN_BENCH_OUT:-$here/runs/bench-cpu}
# Debian's python3-torch is installed for /usr/bin/python3, not for a python3 earlier on PATH.
python=${PYTHON:-$( [[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3 )}
mkdir -p "$out"
counts=1
[[ $threads -gt 1 ]] && counts="1,$threads"
"${MESHTRAIN_BIN:-$here/build/meshtrain}" bench --suite step --threads "$threads" --steps "$steps" \
  --json "$out/meshtrain.json"
status=0
"$python" "$here/bench/cpu/compare_pytorch.py" --threads "$counts" --steps "$steps" \
  --json "$out/pytorch.json" || status=$?
if [[ $status -eq 77 ]]; then
  echo "# no comparison: PyTorch is not installed for $python (exit 77)" >&2
  exit 77
fi
"$python" - "$out" <<'PY'
import json, re, sys
d = sys.argv[1]
def key(name, threads):
    return (re.search(r"\b(fp32|bf16)\b", name).group(1), int(threads))
ours = {key(r["name"], r["threads"]): r for r in json.load(open(d + "/meshtrain.json"))["rows"]
        if "tokens/s" in r and "ranks" not in r}
theirs = {key(r["name"], r["threads"]): r for r in json.load(open(d + "/pytorch.json"))["rows"]}
print("# meshtrain against PyTorch on the same CPU and threads (tokens/s; ratio > 1: meshtrain faster)")
print("# %-16s %8s %12s %12s %8s %10s" % ("precision", "threads", "meshtrain", "pytorch", "ratio",
                                         "ceiling"))
for k in sorted(theirs):
    if k in ours:
        m, p = ours[k], theirs[k]
        print("  %-16s %8d %12.1f %12.1f %8.2f %10.2f" % (k[0], k[1], m["tokens/s"], p["tokens/s"],
              m["tokens/s"] / p["tokens/s"], m["ratio"]))
PY
exit "$status"
