#!/usr/bin/env bash
# CPU training throughput of nanoGPT's CPU model (4 layers, 4 heads, d 128, T 64, batch 12,
# byte vocabulary), tilegrad against PyTorch, in one command, on 1 thread, on THREADS threads,
# and as THREADS data-parallel ranks of one thread each:
#   - tilegrad: build/cpu_train (the model, AdamW and clipping, no trainer around them); the ranks
#     run `tilegrad bench train configs/kjv-tiny.yaml` under mpirun.
#   - PyTorch: bench/reference/torch_cpu_kjv.py, at its best: Debian's torch calls OpenBLAS, whose
#     own thread pool beside torch's OpenMP threads oversubscribes the cores (2 threads of each on
#     2 cores ran 2.6× slower than 1; docs/performance.md, "CPU"), so on THREADS threads it runs
#     both ways — torch's threads with OpenBLAS on one, and one torch thread with OpenBLAS on
#     THREADS — and the faster counts.
#     The ranks are DistributedDataParallel over gloo under mpirun.
# Both leave out their first 10 steps and any evaluation from the clock.
# Usage: bench/cpu_vs_torch.sh [threads=2] [steps=300]
# Needs Debian's python3-torch and libopenblas-dev (without OpenBLAS, Debian's torch falls back to
# a reference BLAS about 20× slower), and openmpi-bin for the ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"
STEPS="${2:-300}"
TORCH_SCRIPT="${TORCH_SCRIPT:-bench/reference/torch_cpu_kjv.py}"
BUILD_DIR="${BUILD_DIR:-build}"
tools/install_deps.sh bible-kjv python3-torch
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target cpu_train tilegrad > /dev/null
TEXT="${TMPDIR:-/tmp}/kjv.txt"
[ -s "$TEXT" ] || bible -f "gen1:1-rev22:21" > "$TEXT"
DATA="${TMPDIR:-/tmp}/kjv-shards"
[ -s "$DATA/train_000000.bin" ] || "$BUILD_DIR/tilegrad" prepare --text "$TEXT" --out "$DATA" > /dev/null

rate() { sed -nE 's/.*tokens\/s ([0-9.]+).*/\1/p; s/.*"tokens_per_s_total":([0-9.]+).*/\1/p' | tail -1; }
tilegrad_threads() { OMP_NUM_THREADS=$1 "$BUILD_DIR/cpu_train" "$STEPS" 10 "$TEXT" | rate; }
torch_threads() {  # torch threads, OpenBLAS threads
  OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$2 /usr/bin/python3 "$TORCH_SCRIPT" "$TEXT" "$STEPS" "$1" | rate
}
mpi=(mpirun --allow-run-as-root --bind-to core -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 -np "$THREADS")

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); steps: $STEPS"
echo "| run | tilegrad tokens/s | PyTorch tokens/s | tilegrad ÷ PyTorch |"
echo "|---|---|---|---|"
row() { python3 -c "import sys; t, p = float(sys.argv[2]), float(sys.argv[3]); print(f'| {sys.argv[1]} | {t:,.0f} | {p:,.0f} | {t / p:.2f}× |')" "$@"; }
row "1 thread" "$(tilegrad_threads 1)" "$(torch_threads 1 1)"
if [ "$THREADS" -gt 1 ]; then
  a=$(torch_threads "$THREADS" 1)
  b=$(torch_threads 1 "$THREADS")
  row "$THREADS threads (PyTorch: $a with its threads, $b with OpenBLAS's)" "$(tilegrad_threads "$THREADS")" \
    "$(python3 -c "print(max($a, $b))")"
  tg_ranks=$("${mpi[@]}" "$BUILD_DIR/tilegrad" bench train configs/kjv-tiny.yaml --steps "$STEPS" --warmup 10 \
    --set "data.train=$DATA/train_*.bin" "data.val=$DATA/val_*.bin" 2>/dev/null | rate)
  torch_ranks=$("${mpi[@]}" /usr/bin/python3 "$TORCH_SCRIPT" "$TEXT" "$STEPS" 1 | rate)
  row "$THREADS ranks × 1 thread (mpirun; PyTorch DistributedDataParallel, gloo)" "$tg_ranks" "$torch_ranks"
fi
