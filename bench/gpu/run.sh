#!/usr/bin/env bash
# The GPU benchmark: meshtrain and PyTorch train GPT-2 124M (T 1024, bf16) on the same GPU, one
# after the other, each at its largest micro-batch; prints both and meshtrain's ratio.
#   bench/gpu/run.sh [STEPS]
set -euo pipefail
steps=${1:-20}
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${MESHTRAIN_BENCH_OUT:-$here/runs/bench-gpu}
mkdir -p "$out"
"${MESHTRAIN_BIN:-$here/build/meshtrain}" bench --suite gpu --steps "$steps" --json "$out/meshtrain.json"
peak=$(python3 -c "import json,re; h=json.load(open('$out/meshtrain.json'))['header'][0]; print(re.search(r'([0-9.]+) TFLOP/s', h).group(1))")
python3 "$here/bench/gpu/compare_pytorch.py" --steps "$steps" --compile --peak-tflops "$peak" --json "$out/pytorch.json"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
m = next(r for r in json.load(open(d + "/meshtrain.json"))["rows"] if "tokens/s" in r)
p = json.load(open(d + "/pytorch.json"))
pt = p.get("tokens_per_s") or p["rows"][-1]["tokens/s"]
print("# meshtrain %.0f tok/s (MFU %.3f), PyTorch %.0f tok/s: ratio %.2f"
      % (m["tokens/s"], m["MFU"], pt, m["tokens/s"] / pt))
PY
