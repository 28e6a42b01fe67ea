#!/usr/bin/env bash
# One call on the GPU machine: build, run the whole test suite (GPU tests included), then the
# benchmarks beside their PyTorch references. Logs go to $OUT (or ./gpu-out); a table prints last.
# Usage: tools/gpu_check.sh [tests|bench|all]   (needs ../shared/bench copied to .bench/)
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-all}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
if ! cmake --build build-gpu -j "$(nproc)" > "$OUT/build.log" 2>&1; then grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; fi
echo "build ok"
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ctest --test-dir build-gpu -j 8 --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1
  grep -E "tests passed|tests failed" "$OUT/ctest.log"
  grep -E "\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Exception" "$OUT/ctest.log" | head -40
fi
if [ "$WHAT" = sanitize ] || [ "$WHAT" = all ]; then
  # memcheck and racecheck on small attention cases (the fused kernels use shared memory heavily).
  F='Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T1*:Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T129*'
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/test_cuda --gtest_filter="$F" > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -cE '^\[       OK' "$OUT/sanitizer_$tool.log") tests OK; $(grep -m1 -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log"))"
  done
fi
if [ "$WHAT" = attn ] || [ "$WHAT" = all ]; then
  # Registers, shared memory and spills of the attention kernels.
  for f in kernels/cuda/flash_attention/*.cu; do
    nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas -v -I. -c "$f" -o /dev/null 2>&1 \
      | grep -E "Compiling entry|registers|spill" ; done > "$OUT/ptxas.txt"
  build-gpu/tilegrad bench attention --steps 20 2>&1 | tee "$OUT/bench_attention.log" | grep -v "^{"
  if [ -f .bench/torch_attention.py ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 .bench/torch_attention.py > "$OUT/torch_attention.log" 2>&1
    grep "^|" "$OUT/torch_attention.log"
  fi
fi
if [ "$WHAT" = profile ]; then
  # Where a training step's GPU time goes, kernel by kernel (needs nsys on the machine).
  if command -v nsys > /dev/null; then
    nsys profile -o "$OUT/train" --force-overwrite true build-gpu/tilegrad bench train configs/gpt2-124m.yaml \
      --set run.device=cuda --steps 3 --warmup 2 > "$OUT/nsys_run.log" 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/train.nsys-rep" > "$OUT/kernels.csv" 2>&1
    rm -f "$OUT/train.nsys-rep" "$OUT"/*.sqlite
    head -40 "$OUT/kernels.csv" | cut -c1-220
  else
    echo "nsys is not installed on this machine"
  fi
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  for B in 16 32; do
    build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set train.batch_size=$B run.device=cuda 2>&1 | tee -a "$OUT/bench_train.log"
  done
  # The materialised attention as the baseline of the fused kernel.
  build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set train.batch_size=16 run.device=cuda model.attention=naive 2>&1 \
    | grep '^{' | tee -a "$OUT/bench_train.log"
  if [ -f .bench/torch_gpt.py ]; then
    PYTHONUNBUFFERED=1 timeout 400 python3 .bench/torch_gpt.py throughput 2>&1 | grep "{" | tee "$OUT/torch_gpt.log"
  fi
fi
