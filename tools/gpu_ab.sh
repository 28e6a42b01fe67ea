#!/usr/bin/env bash
# A/B of kernel variants in one call on the GPU machine, the way the A/Bs in docs/kernels.md are
# run: a temporary environment switch in a launcher selects the variant (removed again before
# the commit that keeps one). For each value: the flash-attention GPU tests of the wgmma family
# (with a timeout: a broken mbarrier protocol hangs rather than fails), then ROUNDS runs of
# `tilegrad bench attention` per value, interleaved, and a table of the chosen TF/s column with
# the best of the rounds and its ratio to the first value.
#
# Usage: tools/gpu_ab.sh VAR "V0 V1 ..." [COLUMN] [ROUNDS] [-- extra bench attention arguments]
#   COLUMN: fwd_tflops, bwd_tflops (default) or bwd_atomic_tflops, or several, comma-separated
#   (a table each: e.g. bwd_tflops,fwd_tflops, the forward as the call's drift control)
#   e.g.   tools/gpu_ab.sh TG_FWD_SCHED "0 1 2 3" fwd_tflops 2 -- --backward 0
# Builds first (tools/gpu_check.sh none). Logs under $OUT (default gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
VAR="${1:?the environment variable that selects the variant}"
VALUES="${2:?the values to compare, first the baseline}"
COLUMN="${3:-bwd_tflops}"
ROUNDS="${4:-2}"
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
tools/gpu_check.sh none > "$OUT/ab_build.txt" 2>&1 || { tail -30 "$OUT/ab_build.txt"; exit 1; }
TESTS='Shapes/FlashAttentionTest.*wgmma:Packed/*wgmma:FlashAttention.*'
for v in $VALUES; do
  env "$VAR=$v" timeout 120 build-gpu/test_cuda --gtest_filter="$TESTS" > "$OUT/ab_tests_$v.log" 2>&1
  echo "$VAR=$v: tests exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/ab_tests_$v.log" | paste -sd' ')"
  grep -E '^\[  FAILED' "$OUT/ab_tests_$v.log" | head -5
done
for r in $(seq "$ROUNDS"); do
  for v in $VALUES; do
    env "$VAR=$v" timeout 120 build-gpu/tilegrad bench attention --steps 20 "$@" 2>&1 | grep '^{' > "$OUT/ab_bench_${v}_$r.log"
  done
done
python3 - "$OUT" "$COLUMN" "$ROUNDS" $VALUES <<'PY'
import json, sys
out, columns, rounds, values = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4:]
for column in columns:
    rows = {}
    for v in values:
        for r in range(1, rounds + 1):
            for line in open(f"{out}/ab_bench_{v}_{r}.log"):
                j = json.loads(line)
                rows.setdefault((j["d"], j["T"], j["causal"]), {}).setdefault(v, []).append(j[column])
    print(f"| d | T | causal | " + " | ".join(f"{v} ({column}, runs)" for v in values) +
          " | " + " | ".join(f"{v} / {values[0]}" for v in values[1:]) + " |")
    print("|---" * (3 + 2 * len(values) - 1) + "|")
    mean = {v: [] for v in values[1:]}
    for k in sorted(rows, key=lambda k: (k[0], not k[2], k[1])):
        r = rows[k]
        if any(v not in r for v in values):
            continue
        ratios = [max(r[v]) / max(r[values[0]]) for v in values[1:]]
        for v, x in zip(values[1:], ratios):
            mean[v].append(x)
        print(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | " +
              " | ".join("/".join(f"{x:.0f}" for x in r[v]) for v in values) +
              " | " + " | ".join(f"{x:.2f}" for x in ratios) + " |")
    # The arithmetic mean of the per-shape ratios of the best of the rounds.
    print(f"{column}: mean ratio to " + values[0] + " (best of the rounds): " +
          ", ".join(f"{v}: {sum(x) / len(x):.3f}" for v, x in mean.items() if x))
    print()
PY
