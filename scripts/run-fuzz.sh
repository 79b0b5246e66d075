#!/usr/bin/env bash
# Runs each libFuzzer harness of a MESHTRAIN_FUZZ build for a bounded time (`make fuzz`).
#
#   scripts/run-fuzz.sh BUILD_DIR SECONDS [HARNESS ...]   # default: every harness in fuzz/
#
# Each harness starts from a copy of its seed corpus fuzz/corpus/<name>/ (the seeds in the
# repository stay as they are; new inputs go to BUILD_DIR/fuzz-corpus/<name>/). A crash, leak,
# sanitizer report or timeout stops that harness, leaves the input as
# BUILD_DIR/fuzz-artifacts/<name>-crash-* (or -leak-, -timeout-, -oom-) and fails the run
# after every harness has had its turn. Reproduce with: BUILD_DIR/<name>_fuzz ARTIFACT
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: run-fuzz.sh BUILD_DIR SECONDS [HARNESS ...]}
seconds=${2:?usage: run-fuzz.sh BUILD_DIR SECONDS [HARNESS ...]}
shift 2
harnesses=("$@")
if [[ ${#harnesses[@]} -eq 0 ]]; then
  for f in fuzz/*_fuzz.cpp; do n=${f#fuzz/}; harnesses+=("${n%_fuzz.cpp}"); done
fi

mkdir -p "$build/fuzz-artifacts"
failed=()
for name in "${harnesses[@]}"; do
  bin="$build/${name}_fuzz"
  work="$build/fuzz-corpus/$name"
  mkdir -p "$work"
  cp -n fuzz/corpus/"$name"/* "$work"/ 2>/dev/null || true
  echo "== fuzz $name: ${seconds}s from $(ls "$work" | wc -l) inputs"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: libFuzzer's default, said aloud.
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/fuzz-artifacts/$name-" "$work" 2> "$build/fuzz-$name.log"; then
    failed+=("$name")
    tail -n 60 "$build/fuzz-$name.log"
  fi
  grep -E '^stat::number_of_executed_units|^Done' "$build/fuzz-$name.log" | tr '\n' ' '
  echo
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $build/fuzz-artifacts/; logs $build/fuzz-<name>.log)" >&2
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses ran ${seconds}s each without a finding"
