#!/usr/bin/env bash
# A/B of training-step variants: each VARIANT is NAME or NAME:SETTING[,SETTING…], a SETTING either
# an environment variable (NAME=VALUE, e.g. CUDA_DEVICE_MAX_CONNECTIONS=1), a config override
# (section.key=value, passed as --set, e.g. train.lm_head_chunk=4096) or bin=PATH, the tilegrad
# binary that variant runs (another commit's build: `git worktree add /tmp/old C` and build it
# there); a bare NAME runs $TILEGRAD with none; the first is the baseline. ROUNDS rounds of `tilegrad bench train CONFIG`, the
# variants interleaved in each (the GPU's power cap makes back-to-back runs drift: docs/kernels.md
# §3), then per variant the best tokens/s of the rounds, its ratio to the baseline's, the spread
# of its rounds and the peak memory. The JSON lines go to $OUT/step_ab.jsonl (OUT default gpu-out).
# Usage: [ROUNDS=3] [TILEGRAD=build-gpu/tilegrad] tools/step_ab.sh VARIANT [VARIANT …] -- CONFIG [bench train arguments]
#   e.g.  tools/step_ab.sh base chunk:train.lm_head_chunk=4096 -- configs/gpt2-124m.yaml --steps 30 --warmup 5
set -uo pipefail
cd "$(dirname "$0")/.."
VARIANTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VARIANTS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#VARIANTS[@]} -ge 1 ] && [ $# -ge 1 ] || {
  echo "usage: tools/step_ab.sh VARIANT [VARIANT …] -- CONFIG [bench train arguments]"; exit 2; }
ROUNDS="${ROUNDS:-3}"
TILEGRAD="${TILEGRAD:-$( [ -x build-gpu/tilegrad ] && echo build-gpu/tilegrad || echo build/tilegrad )}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
log="$OUT/step_ab.jsonl"
: > "$log"
for round in $(seq 1 "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    name=${v%%:*}
    settings=() env_list=() set_list=() bin="$TILEGRAD"
    [ "$v" != "$name" ] && IFS=',' read -r -a settings <<< "${v#*:}"
    for s in ${settings[@]+"${settings[@]}"}; do
      key=${s%%=*}
      if [ "$key" = bin ]; then bin=${s#bin=}
      elif [[ "$key" == *.* ]]; then set_list+=("$s"); else env_list+=("$s"); fi
    done
    [ -x "$bin" ] || { echo "step_ab: $name: no executable tilegrad at $bin"; exit 2; }
    args=("$@")
    [ ${#set_list[@]} -gt 0 ] && args+=(--set "${set_list[@]}")
    out=$(env ${env_list[@]+"${env_list[@]}"} "$bin" bench train "${args[@]}" 2>&1)
    line=$(echo "$out" | grep '^{"bench":"train"')
    [ -n "$line" ] || {
      echo "FAILED: $name (round $round): env ${env_list[*]:-} $bin bench train ${args[*]}"; echo "$out" | tail -5; exit 1; }
    echo "{\"variant\":\"$name\",\"round\":$round,${line#\{}" >> "$log"
  done
done
python3 - "$log" "${VARIANTS[0]%%:*}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = sys.argv[2]
names = list(dict.fromkeys(r["variant"] for r in rows))
best = {n: max(r["tokens_per_s"] for r in rows if r["variant"] == n) for n in names}
print("| variant | best tokens/s | vs " + base + " | rounds (tokens/s) | batch | peak GiB |\n|---|---|---|---|---|---|")
for n in names:
    mine = [r for r in rows if r["variant"] == n]
    print(f"| {n} | {best[n]:,.0f} | {best[n] / best[base]:.4f}× | "
          f"{min(r['tokens_per_s'] for r in mine):,.0f}–{max(r['tokens_per_s'] for r in mine):,.0f} | "
          f"{mine[0]['B']} × {mine[0]['T']} | {mine[0]['peak_gib']:.2f} |")
PY
