#!/usr/bin/env bash
# Correctness of data parallelism at W ranks, on real text, in one call (a machine with W GPUs, or
# W CPU ranks with DEVICE=cpu and a small CONFIG):
#   1. W ranks × batch B against one process with grad_accum W (the same global batch, the same
#      rows): the largest loss difference over the steps;
#   2. the W-rank run again with the same seed: the losses bitwise equal;
#   3. the W-rank run's checkpoint at half way resumed on W/2 ranks (grad_accum 2; W > 2) and on
#      one process (grad_accum W): the largest loss difference from the uninterrupted run after it.
# The text is this repository's README and docs (tilegrad prepare, bytes: vocabulary 257).
# Faults (a stopped, a killed, a signalled rank) are tests/dist/faults.sh's.
# Exits 1 when a rerun is not bitwise equal or a difference exceeds MAX_DIFF (when given), 77
# (ctest's skip) with the reason where mpirun cannot start a job.
# Usage: tools/scale_check.sh W   (env: CONFIG [configs/gpt2-124m.yaml], DEVICE [auto], STEPS [40],
#        MAX_DIFF [none], TILEGRAD [build-gpu/tilegrad, else build/tilegrad], OUT [gpu-out/scale_check])
set -uo pipefail
cd "$(dirname "$0")/.."
W=${1:?usage: tools/scale_check.sh W}
CONFIG=${CONFIG:-configs/gpt2-124m.yaml}
DEVICE=${DEVICE:-auto}
STEPS=${STEPS:-40}
TILEGRAD=${TILEGRAD:-$( [ -x build-gpu/tilegrad ] && echo build-gpu/tilegrad || echo build/tilegrad )}
OUT=${OUT:-gpu-out/scale_check}
[ "$W" -ge 2 ] && [ $((W % 2)) -eq 0 ] || { echo "W must be even and ≥ 2 (the resume runs on W/2 ranks)"; exit 2; }
[ $((STEPS % 2)) -eq 0 ] || { echo "STEPS must be even (the checkpoint is at STEPS/2)"; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS -x LD_LIBRARY_PATH)
half=$((STEPS / 2))
if ! command -v mpirun > /dev/null || ! why=$(timeout 60 "${mpi[@]}" -np 1 true 2>&1); then
  echo "SKIP: mpirun cannot start a job here: ${why:-not installed (openmpi-bin)}"
  exit 77
fi
"$TILEGRAD" prepare --text README.md docs/*.md --out "$OUT/text" > "$OUT/prepare.log" 2>&1 || { cat "$OUT/prepare.log"; exit 1; }
sets=("data.train=$OUT/text/train_*.bin" "data.val=$OUT/text/val_*.bin" model.vocab_size=257 run.device=$DEVICE
      train.max_steps=$STEPS train.warmup_steps=$((STEPS < 10 ? 1 : 5)) run.log_every=1 run.eval_every=0 run.sample_every=0
      run.ckpt_every=$half)
train() {  # train RANKS GRAD_ACCUM RUN_DIR [--resume latest]
  local np=$1 accum=$2 dir=$3
  shift 3
  local cmd=("$TILEGRAD" train "$CONFIG" "$@" --set "${sets[@]}" train.grad_accum="$accum" run.out_dir="$dir")
  if [ "$np" -gt 1 ]; then timeout 900 "${mpi[@]}" -np "$np" "${cmd[@]}"; else timeout 900 "${cmd[@]}"; fi \
    > "$dir.log" 2>&1 || { echo "FAILED: $np ranks, grad_accum $accum, $dir (log $dir.log):"; tail -20 "$dir.log"; exit 1; }
}
train "$W" 1 "$OUT/ranks"
train "$W" 1 "$OUT/ranks_again"
train 1 "$W" "$OUT/one"
resume_ranks=$( [ "$W" -gt 2 ] && echo "$((W / 2)) 1" || echo 1 )
for np in $resume_ranks; do
  d="$OUT/resumed_on_$np"
  mkdir -p "$d"
  cp "$OUT/ranks/ckpt-$half.h5"* "$d/"  # the checkpoint and its checksum
  echo "ckpt-$half.h5" > "$d/latest"
  train "$np" $((W / np)) "$d" --resume latest
done
python3 - "$OUT" "$W" "$half" "${MAX_DIFF:-}" <<'PY'
import json, sys
out, W, half = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
max_diff = float(sys.argv[4]) if sys.argv[4] else None
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{d}/metrics.jsonl")) if r.get("type") == "train"}
ranks, again, one = losses("ranks"), losses("ranks_again"), losses("one")
steps = sorted(ranks)
rows = [("W ranks against one process (grad_accum W), every step",
         max(abs(ranks[s] - one[s]) for s in steps), f"first {ranks[steps[0]]:.4f}, last {ranks[steps[-1]]:.4f}")]
bitwise = all(ranks[s] == again[s] for s in steps)
rows.append(("the W-rank run again, same seed", max(abs(ranks[s] - again[s]) for s in steps),
             "bitwise equal" if bitwise else "NOT bitwise equal"))
for np in sorted({W // 2, 1}, reverse=True):
    r = losses(f"resumed_on_{np}")
    after = [s for s in steps if s > half]
    rows.append((f"resumed at step {half} on {np} rank(s) (grad_accum {W // np}), steps after",
                 max(abs(ranks[s] - r[s]) for s in after), f"{len(after)} steps"))
print(f"| check ({W} ranks, {len(steps)} steps) | largest loss difference | note |\n|---|---|---|")
for name, diff, note in rows:
    print(f"| {name} | {diff:.3g} | {note} |")
over = [name for name, diff, _ in rows if max_diff is not None and diff > max_diff]
for name in over:
    print(f"FAILED: {name}: above MAX_DIFF {max_diff}")
sys.exit(0 if bitwise and not over else 1)
PY
