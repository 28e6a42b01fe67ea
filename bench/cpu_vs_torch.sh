#!/usr/bin/env bash
# CPU training throughput of nanoGPT's CPU model (4 layers, 4 heads, d 128, T 64, batch 12,
# byte vocabulary), tilegrad against PyTorch, in one command with the same thread count.
# Usage: bench/cpu_vs_torch.sh [threads=2] [steps=300]
# Needs Debian's python3-torch and libopenblas-dev (without OpenBLAS, Debian's torch falls
# back to a reference BLAS about 20× slower); the PyTorch side is bench/reference/torch_cpu_kjv.py.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"
STEPS="${2:-300}"
TORCH_SCRIPT="${TORCH_SCRIPT:-bench/reference/torch_cpu_kjv.py}"
BUILD_DIR="${BUILD_DIR:-build}"
tools/install_deps.sh bible-kjv python3-torch
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target cpu_train > /dev/null
TEXT="${TMPDIR:-/tmp}/kjv.txt"
[ -s "$TEXT" ] || bible -f "gen1:1-rev22:21" > "$TEXT"

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "threads: $THREADS, steps: $STEPS"
tg_line=$(OMP_NUM_THREADS="$THREADS" "$BUILD_DIR/cpu_train" "$STEPS" 10 "$TEXT")
echo "$tg_line"
torch_out=$(OMP_NUM_THREADS="$THREADS" /usr/bin/python3 "$TORCH_SCRIPT" "$TEXT" "$STEPS" "$THREADS")
echo "$torch_out" | tail -1
tg=$(echo "$tg_line" | sed -E 's/.*tokens\/s ([0-9.]+).*/\1/')
pt=$(echo "$torch_out" | tail -1 | sed -E 's/.*tokens\/s ([0-9.]+).*/\1/')
python3 -c "print(f'tilegrad {float($tg):.0f} tokens/s, PyTorch {float($pt):.0f} tokens/s, ratio {float($tg)/float($pt):.2f}x')"
