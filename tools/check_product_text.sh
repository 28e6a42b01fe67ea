#!/usr/bin/env bash
# The repository describes the software, not how it was made, and is self-contained: fails when a
# tracked file mentions a path outside the repository or words about how the work was organised.
# Git history is where the making of the software is recorded.
# Usage: tools/check_product_text.sh   (from anywhere inside the repository)
set -uo pipefail
cd "$(dirname "$0")/.."
# pattern | why it does not belong in the product
checks=(
  '\.\./shared|[.]bench/|\bANCHORS\.md|\bDESIGN\.md|paths and documents outside the repository: a clone lacks them'
  '\bsess(ion|ions)\b|work periods: a document says what is true now'
  '\bcalls? [0-9]+\b|numbered calls to a machine: say what was run, with its command'
  '\b[Ii]ssue #?[0-9]+\b|issue numbers belong to the tracker'
)
status=0
for check in "${checks[@]}"; do
  pattern=${check%|*}
  why=${check##*|}
  hits=$(git ls-files -z -- . ':!tools/check_product_text.sh' ':!*.diff' | xargs -0 grep -nIiE "$pattern" -- 2>/dev/null | head -10)
  if [ -n "$hits" ]; then
    echo "$why:"
    echo "$hits" | cut -c1-160
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "product text: clean"
exit "$status"
