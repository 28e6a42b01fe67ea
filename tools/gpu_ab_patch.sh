#!/usr/bin/env bash
# A/B of a kernel patch against the working tree, in one call on the GPU machine: the tree is
# copied to AB_DIR (default /tmp/tilegrad-ab) with PATCH applied (git apply), both are built in
# parallel, the patched build runs the flash-attention GPU tests (with a timeout: a broken mbarrier
# protocol hangs rather than fails; the error-vs-materialised and 200-step training tests among
# them, the worst error ratios printed) and compute-sanitizer memcheck, racecheck and synccheck on
# small wgmma cases, then `tilegrad bench attention --steps 20 [bench args]` of base and patched,
# interleaved ROUNDS times (the power cap makes back-to-back runs drift: docs/kernels.md §3), and
# a table of the best of the rounds per shape with the geometric mean of patched / base per
# column and head dim. Where tools/gpu_ab.sh compares variants behind a temporary environment
# switch, this compares a diff as it would land (the variants measured so and rejected: docs/kernels.md §9).
#
# Usage: [AB_SANITIZE=0] [AB_DIR=…] tools/gpu_ab_patch.sh PATCH [ROUNDS] [bench attention arguments]
#   e.g.  tools/gpu_ab_patch.sh variant.diff 3 --head-dim 128
# Logs under $OUT (default gpu-out): ab_base_R.log, ab_new_R.log (the benchmark's JSON lines).
set -uo pipefail
cd "$(dirname "$0")/.."
PATCH=$(realpath "${1:?a patch file (git diff output) to apply to a copy of this tree}")
ROUNDS="${2:-3}"
shift $(( $# < 2 ? $# : 2 ))
AB_DIR="${AB_DIR:-/tmp/tilegrad-ab}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
START=$SECONDS

rm -rf "$AB_DIR" && mkdir -p "$AB_DIR"
tar --exclude='./build*' --exclude=./.bench --exclude=./gpu-out -cf - . | tar -C "$AB_DIR" -xf -
(cd "$AB_DIR" && git apply "$PATCH") || { echo "$PATCH does not apply to this tree"; exit 1; }
(cd "$AB_DIR" && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/ab_cmake_new.log" 2>&1 &&
   nice cmake --build build-gpu -j "$(nproc)" --target tilegrad test_cuda > "$OUT/ab_build_new.log" 2>&1) &
NEW_BUILD=$!
tools/gpu_check.sh none > "$OUT/ab_build_base.txt" 2>&1 || { tail -30 "$OUT/ab_build_base.txt"; exit 1; }
wait $NEW_BUILD || { grep -E "error" -A3 "$OUT/ab_build_new.log" | head -40; echo "patched build failed"; exit 1; }
echo "both built at $((SECONDS - START)) s"

NEW="$AB_DIR/build-gpu"
timeout 300 "$NEW/test_cuda" --gtest_filter='Shapes/FlashAttentionTest.*:Packed/*:FlashAttention.*:Shapes/FlashVsMaterialised.*:FlashTraining.*' \
  > "$OUT/ab_tests_new.log" 2>&1
echo "patched flash tests: exit $? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/ab_tests_new.log" | paste -sd' ')"
grep -E '^\[  FAILED' "$OUT/ab_tests_new.log" | head
# The fused kernels' error against the materialised bf16 path's (the tests allow 2×): the largest
# ratio per output (cases whose materialised error is 0, e.g. T = 1, left out: the tests allow
# 1e-4 there), for patches that change the arithmetic.
awk '/ error: fused / && $6 + 0 > 1e-6 {r = $4 / $6; if (r > m[$1]) m[$1] = r}
     END{for (k in m) printf "patched fused / materialised error, worst: %s %.3f\n", k, m[k]}' "$OUT/ab_tests_new.log"
# AB_SANITIZE=0 skips the sanitizers (about a minute) for a first look at a variant's speed; a
# variant that is kept needs them.
SMALL='Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T129_*wgmma:Packed/*wgmma:Shapes/FlashAttentionTest.MatchesDoubleReference/B8_T300*wgmma'
if [ "${AB_SANITIZE:-1}" != 0 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$NEW/test_cuda" --gtest_filter="$SMALL" \
      > "$OUT/ab_sanitizer_$tool.log" 2>&1
    echo "patched $tool: exit $? ($(grep -m1 -E 'SUMMARY' "$OUT/ab_sanitizer_$tool.log"))"
  done
else
  echo "patched: sanitizers skipped (AB_SANITIZE=0)"
fi

for r in $(seq "$ROUNDS"); do
  timeout 150 build-gpu/tilegrad bench attention --steps 20 "$@" 2>&1 | grep '^{' > "$OUT/ab_base_$r.log"
  timeout 150 "$NEW/tilegrad" bench attention --steps 20 "$@" 2>&1 | grep '^{' > "$OUT/ab_new_$r.log"
  echo "round $r at $((SECONDS - START)) s"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, math, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for side in ("base", "new"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/ab_{side}_{r}.log"):
            j = json.loads(line)
            runs.setdefault(side, {}).setdefault((j["d"], j["T"], j["causal"]), []).append(j)
if set(runs) != {"base", "new"}:
    sys.exit("no benchmark output from one of the builds (see the logs under " + out + ")")
cols = ("fwd_tflops", "bwd_tflops", "bwd_atomic_tflops")
best = lambda side, k, c: max(j[c] for j in runs[side][k])
print("| d | T | causal | " + " | ".join(f"{c} base | new" for c in cols) + " |")
print("|---" * (3 + 2 * len(cols)) + "|")
for k in sorted(runs["base"]):
    print(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | " +
          " | ".join(f"{best('base', k, c):.0f} | {best('new', k, c):.0f}" for c in cols) + " |")
for c in cols:
    for d in sorted({k[0] for k in runs["base"]}):
        xs = [best("new", k, c) / best("base", k, c) for k in runs["base"]
              if k[0] == d and k in runs["new"] and best("base", k, c) > 0]
        if xs:
            print(f"{c} d {d}: geometric mean of patched / base, best of {rounds} rounds, "
                  f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f} over {len(xs)} shapes")
PY
echo "done at $((SECONDS - START)) s"
