#!/usr/bin/env bash
# The repository describes the software, not how it was made, and is self-contained: fails when a
# tracked file mentions a path outside the repository or words about how the work was organised.
# Each pattern with its reason; git history is where the making of the software is recorded.
# Usage: tools/check_product_text.sh   (from anywhere inside the repository)
set -uo pipefail
cd "$(dirname "$0")/.."
patterns=(
  '\.\./shared|\.bench/'                               # paths outside the repository: a clone lacks them
  '\b(twenty|thirty)?-?(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth) session\b'
                                                       # numbered work periods
  '\b[Ss]ession [0-9]+|\bcalls? [0-9]+( and [0-9]+)?\b[^.]*\b(of|in) (the|this) session'
                                                       # numbered calls to a machine
  '\b[Ii]ssue #?[0-9]+\b'                              # issue numbers belong to the tracker
  '\bANCHORS\.md|\bDESIGN\.md'                         # documents outside the repository
)
status=0
for p in "${patterns[@]}"; do
  hits=$(git ls-files -z | grep -zv '^tools/check_product_text.sh$' | xargs -0 grep -nIE "$p" -- 2>/dev/null | head -20)
  if [ -n "$hits" ]; then
    echo "process words or outside paths (pattern: $p):"
    echo "$hits"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "product text: clean"
exit "$status"
