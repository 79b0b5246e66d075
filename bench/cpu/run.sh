#!/usr/bin/env bash
# The CPU comparison: meshtrain's step suite (MODEL: GPT-2 124M, or Llama 3's block at its sizes;
# T 256, micro-batch 4, fp32 and bf16, at 1 and THREADS threads, each against this CPU's GEMM
# ceilings), then the same model trained by PyTorch (bench/cpu/compare_pytorch.py), eager and
# torch.compile, on the same thread counts and precisions, one after the other; prints both and,
# per (precision, threads), meshtrain's ratio to the faster PyTorch mode (tokens/s over
# PyTorch's), with both modes' tokens/s.
#   bench/cpu/run.sh [THREADS [STEPS [MODEL]]]    (defaults 2, 4, gpt2; MODEL: gpt2 or llama;
#                                                  tiny / tiny-llama run the tests' 2-layer models)
# PyTorch: $PYTHON if set; else the judges' environment's python (scripts/judges.py path: a
# current PyTorch 2, made by `make test` or `python3 scripts/judges.py ensure`) where it exists;
# else /usr/bin/python3 (Debian's python3-torch). Results in $MESHTRAIN_BENCH_OUT (default
# runs/bench-cpu): meshtrain-MODEL.json and pytorch-MODEL.json.
# Exit status: non-zero if meshtrain's suite fails; 77 if PyTorch is not installed (meshtrain's
# rows are printed all the same, no ratio is); else PyTorch's script's status.
set -euo pipefail
threads=${1:-2}
steps=${2:-4}
model=${3:-gpt2}
case $model in
  gpt2 | llama) pytorch_model=(--model "$model") ;;
  tiny) pytorch_model=(--model gpt2 --tiny) ;;
  tiny-llama) pytorch_model=(--model llama --tiny) ;;
  *) echo "bench/cpu/run.sh: MODEL '$model' is not one of gpt2, llama, tiny, tiny-llama" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${MESHTRAIN_BENCH_OUT:-$here/runs/bench-cpu}
# Debian's python3-torch is installed for /usr/bin/python3, not for a python3 earlier on PATH.
base=$( [[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3 )
judges=$("$base" "$here/scripts/judges.py" path 2>/dev/null || true)
if [[ -z ${PYTHON:-} && -n $judges && -e $judges/.complete && -x $judges/bin/python ]]; then
  PYTHON=$judges/bin/python
fi
python=${PYTHON:-$base}
mkdir -p "$out"
counts=1
[[ $threads -gt 1 ]] && counts="1,$threads"
"${MESHTRAIN_BIN:-$here/build/meshtrain}" bench --suite step --model "$model" --threads "$threads" \
  --steps "$steps" --json "$out/meshtrain-$model.json"
status=0
"$python" "$here/bench/cpu/compare_pytorch.py" "${pytorch_model[@]}" --threads "$counts" \
  --steps "$steps" --json "$out/pytorch-$model.json" || status=$?
if [[ $status -eq 77 ]]; then
  echo "# no comparison: PyTorch is not installed for $python (exit 77)" >&2
  exit 77
fi
"$python" - "$out/meshtrain-$model.json" "$out/pytorch-$model.json" <<'PY'
import json, re, sys
def key(r):
    return (re.search(r"\b(fp32|bf16)\b", r["name"]).group(1), int(r["threads"]))
ours = {key(r): r for r in json.load(open(sys.argv[1]))["rows"]
        if "tokens/s" in r and "ranks" not in r}
theirs = {}
for r in json.load(open(sys.argv[2]))["rows"]:
    theirs.setdefault(key(r), {})[r["mode"]] = r["tokens/s"]
def rate(modes, mode):
    return "%12.1f" % modes[mode] if mode in modes else "%12s" % "-"
print("# meshtrain against PyTorch on the same CPU, threads and precision (tokens/s; pytorch: the "
      "faster of eager and compile; ratio > 1: meshtrain faster; ceiling: meshtrain's ratio to "
      "its GEMM ceiling)")
print("# %-10s %8s %12s %12s %12s %8s %8s %10s" % ("precision", "threads", "meshtrain", "eager",
                                                  "compile", "pytorch", "ratio", "ceiling"))
for k in sorted(theirs):
    if k in ours:
        m, modes = ours[k], theirs[k]
        best = max(modes, key=modes.get)
        print("  %-10s %8d %12.1f %s %s %8s %8.2f %10.2f" % (k[0], k[1], m["tokens/s"],
              rate(modes, "eager"), rate(modes, "compile"), best, m["tokens/s"] / modes[best],
              m["ratio"]))
PY
exit "$status"
