#!/usr/bin/env bash
# A/B of attention kernel variants from one binary, in one call on the GPU machine. Each NAME is a
# variant of the wgmma kernels' development registry (kernels/cuda/flash_attention/sm90_shapes.h,
# docs/kernels.md §4.4), or `default` for the shapes the launchers' tables select; the first is
# the baseline. For each NAME: its flash tests (test_cuda, with a timeout: a broken mbarrier
# protocol hangs rather than fails — `default` the wgmma shape and packed tests, a variant its
# Variants/ cases) and, unless AB_SANITIZE=0, compute-sanitizer memcheck, racecheck and synccheck
# on small cases; then ROUNDS rounds of `tilegrad bench attention --variant NAME`, interleaved (the
# power cap makes back-to-back runs drift: docs/kernels.md §3), and per column of COLUMNS a table
# of the best of the rounds per shape, each NAME's ratio to the first, and the geometric mean of
# the ratios per head dim. A variant runs only where it applies (its kernel, head dim, mask and
# T); elsewhere its rows time the default shapes and their ratios are the call's drift.
#
# Usage: [ROUNDS=3] [COLUMNS=fwd_tflops,bwd_tflops] [AB_SANITIZE=0] [DRY=1] \
#          tools/attention_ab.sh NAME [NAME …] [-- bench attention arguments]
#   e.g.  tools/attention_ab.sh default fwd_d128_noncausal_128keys -- --head-dim 128 --causal 0
#   DRY=1: print each step's command and run nothing (ctest tools.attention_ab checks the plan).
# Builds first (tools/gpu_check.sh none). Logs under $OUT (default gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
NAMES=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do NAMES+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#NAMES[@]} -ge 1 ] || { echo "usage: tools/attention_ab.sh NAME [NAME …] [-- bench attention arguments]"; exit 2; }
ROUNDS="${ROUNDS:-3}"
COLUMNS="${COLUMNS:-fwd_tflops,bwd_tflops}"
OUT="${OUT:-gpu-out}"
SHAPES=kernels/cuda/flash_attention/sm90_shapes.h
for n in "${NAMES[@]}"; do
  if [ "$n" != default ] && ! grep -q "static constexpr const char\* name = \"$n\";" "$SHAPES"; then
    echo "$n: no shape of that name in $SHAPES (the registry's variants: tilegrad bench attention --variant ? lists them)"
    exit 2
  fi
done
# The test filter of a NAME, and its small cases for the sanitizers.
tests_of() {
  if [ "$1" = default ]; then echo 'Shapes/FlashAttentionTest.*wgmma:Packed/*wgmma'; else echo "Variants/*_wgmma_$1"; fi
}
small_of() {
  if [ "$1" = default ]; then
    echo 'Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T129_*wgmma:Packed/*wgmma:Shapes/FlashAttentionTest.MatchesDoubleReference/B8_T300*wgmma'
  else
    echo "Variants/*_wgmma_$1"
  fi
}
run() {  # a step: printed with DRY=1, else run
  if [ "${DRY:-0}" = 1 ]; then echo "$*"; else eval "$@"; fi
}

mkdir -p "$OUT"
START=$SECONDS
run "tools/gpu_check.sh none > '$OUT/ab_build.txt' 2>&1 || { tail -30 '$OUT/ab_build.txt'; exit 1; }"
for n in "${NAMES[@]}"; do
  run "timeout 600 build-gpu/test_cuda --gtest_filter='$(tests_of "$n")' > '$OUT/ab_tests_$n.log' 2>&1;" \
      "echo \"$n: tests exit \$? \$(grep -E '^\[  (PASSED|FAILED)' '$OUT/ab_tests_$n.log' | paste -sd' ')\";" \
      "grep -E '^\[  FAILED' '$OUT/ab_tests_$n.log' | head -5"
  if [ "${AB_SANITIZE:-1}" != 0 ]; then
    for tool in memcheck racecheck synccheck; do
      run "timeout 400 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/test_cuda" \
          "--gtest_filter='$(small_of "$n")' > '$OUT/ab_sanitizer_${n}_$tool.log' 2>&1;" \
          "echo \"$n $tool: exit \$? (\$(grep -m1 -E 'SUMMARY' '$OUT/ab_sanitizer_${n}_$tool.log'))\""
    done
  fi
done
for r in $(seq "$ROUNDS"); do
  for n in "${NAMES[@]}"; do
    variant=""
    [ "$n" != default ] && variant="--variant $n"
    run "timeout 300 build-gpu/tilegrad bench attention --steps 20 $variant $* 2>&1 | grep '^{' > '$OUT/ab_bench_${n}_$r.log'"
  done
  [ "${DRY:-0}" = 1 ] || echo "round $r at $((SECONDS - START)) s"
done
[ "${DRY:-0}" = 1 ] && exit 0
python3 - "$OUT" "$COLUMNS" "$ROUNDS" "${NAMES[@]}" <<'PY'
import json, math, sys
out, columns, rounds, names = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4:]
runs = {}
for n in names:
    for r in range(1, rounds + 1):
        try:
            lines = open(f"{out}/ab_bench_{n}_{r}.log").read().split("\n")
        except OSError:
            continue
        for line in filter(None, lines):
            j = json.loads(line)
            runs.setdefault((j["d"], j["T"], j["causal"]), {}).setdefault(n, []).append(j)
if not runs:
    sys.exit("no benchmark output (see the logs under " + out + ")")
for column in columns:
    print(f"| d | T | causal | " + " | ".join(f"{n} ({column}, runs)" for n in names) +
          "".join(f" | {n} / {names[0]}" for n in names[1:]) + " |")
    print("|---" * (3 + 2 * len(names) - 1) + "|")
    ratios = {}
    for k in sorted(runs, key=lambda k: (k[0], not k[2], k[1])):
        r = runs[k]
        if any(n not in r for n in names):
            continue
        best = {n: max(j[column] for j in r[n]) for n in names}
        row = [best[n] / best[names[0]] if best[names[0]] > 0 else float("nan") for n in names[1:]]
        for n, x in zip(names[1:], row):
            if x == x:
                ratios.setdefault((n, k[0]), []).append(x)
        print(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | " +
              " | ".join("/".join(f"{j[column]:.0f}" for j in r[n]) for n in names) +
              "".join(f" | {x:.3f}" for x in row) + " |")
    for (n, d), xs in sorted(ratios.items()):
        print(f"{column} d {d}: {n} / {names[0]}, geometric mean of the best of {rounds} rounds over "
              f"{len(xs)} shapes: {math.exp(sum(map(math.log, xs)) / len(xs)):.3f}")
PY
echo "done at $((SECONDS - START)) s"
