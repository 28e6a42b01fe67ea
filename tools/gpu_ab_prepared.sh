#!/usr/bin/env bash
# Kernel-variant diffs prepared for measuring, measured in turn in one call on the GPU machine:
# each diff's header names its measuring command on a line "To measure (…): git apply DIFF &&
# tools/gpu_ab.sh VAR …" (a temporary environment switch in the patched tree selects the variant);
# for each DIFF this applies it, runs that gpu_ab.sh command (its tests, then the interleaved
# rounds and the table), and takes it out again (git apply -R), so the next diff applies to the
# same tree. A diff that does not apply, or whose header names no command, is reported and skipped.
#
# Usage: [DRY=1] tools/gpu_ab_prepared.sh DIFF [DIFF …]
#   DRY=1: print each diff's command, apply nothing (the header's parse, checked by ctest).
# Logs under $OUT/<diff name>/ (default gpu-out).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: tools/gpu_ab_prepared.sh DIFF [DIFF …]"; exit 2; }
diffs=()
for d in "$@"; do diffs+=("$(realpath "$d")"); done
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
status=0
for diff in "${diffs[@]}"; do
  name=$(basename "$diff" .diff)
  # The command after "git apply <this diff> && " on the header's "To measure" line.
  cmd=$(sed -n '/^diff --git/q; s/^To measure[^:]*: *git apply [^ ]* *&& *//p' "$diff" | head -1)
  if [ -z "$cmd" ] || [[ "$cmd" != tools/gpu_ab.sh* ]]; then
    echo "== $name: no 'To measure (…): git apply … && tools/gpu_ab.sh …' line in its header: skipped"
    status=1
    continue
  fi
  echo "== $name: $cmd"
  [ "${DRY:-0}" = 1 ] && continue
  if ! git apply "$diff"; then
    echo "== $name: does not apply to this tree: skipped"
    status=1
    continue
  fi
  mkdir -p "$OUT/$name"
  OUT="$OUT/$name" bash -c "$cmd"
  git apply -R "$diff" || { echo "== $name: could not be taken out again: stopping"; exit 1; }
done
exit $status
