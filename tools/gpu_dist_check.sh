#!/usr/bin/env bash
# Data parallelism on a GPU machine, in one call: builds tilegrad (and, when its source tarball is
# in .third_party/, NCCL 2.30, whose NCCL_MULTI_RANK_GPU_ENABLE lets two ranks share one GPU — for
# correctness only, never timing), then
#   1. the data-parallel tests on the GPU in one process, and under mpirun -np 1 (NCCL, world 1);
#   2. with NCCL 2.30: the same tests with two ranks on GPU 0, and tests/dist/faults.sh (a stuck,
#      a killed and a signalled rank) through NCCL;
#   3. `tilegrad bench train` of GPT-2 small (16 × 1024, bf16) without a launcher and under
#      mpirun -np 1: the communicator must cost nothing at world size 1.
# Logs go to $OUT (or ./gpu-out); each result prints as it comes (`result: …`), the table of them last.
# PACK=1 packs the logs into one file, $OUT/dist_logs.tar.gz (for a machine that hands back only
# a few files).
# Usage: tools/gpu_dist_check.sh [tests|dist|bench|all]   (dist: the tests without the GPU suite)
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-all}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=2 -x TILEGRAD_TEST_DEVICE
     -x LD_LIBRARY_PATH -x NCCL_MULTI_RANK_GPU_ENABLE -x NCCL_NVLS_ENABLE -x NCCL_DEBUG)
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=WARN GTEST_COLOR=no

nccl_tarball=$(ls .third_party/nccl-2.30*-src.tar.gz 2>/dev/null | head -1)
if [ -n "$nccl_tarball" ] && [ ! -f .nccl/build/lib/libnccl.so ]; then
  ( mkdir -p .nccl && tar xzf "$nccl_tarball" -C .nccl &&
    make -C .nccl -j8 src.build NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
      ONLY_FUNCS="AllReduce Sum f32 * *|AllReduce Sum f64 * *|AllReduce MinMax f32 * *|AllReduce MinMax f64 * *|AllReduce PreMulSum f32 * *|AllReduce PreMulSum f64 * *|ReduceScatter Sum f32 * *|ReduceScatter Sum f64 * *|AllGather * *|Broadcast * *|SendRecv" \
      > "$OUT/nccl_build.log" 2>&1 ) &
  nccl_job=$!
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
grep "tilegrad:" "$OUT/cmake.log"
targets="tilegrad test_dist"
[ "$WHAT" = tests ] || [ "$WHAT" = all ] && targets="$targets test_cuda"
if ! cmake --build build-gpu -j 12 --target $targets > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60
  exit 1
fi
stamp "tilegrad built"
rows=()
# A result row: kept for the table printed last, and printed at once, so that a call cut short
# by its time limit still shows every result it reached (the device returns at most 8 files).
row() {
  rows+=("$1")
  echo "result: $1"
}

if [ "$WHAT" = tests ] || [ "$WHAT" = dist ] || [ "$WHAT" = all ]; then
  TILEGRAD_TEST_DEVICE=cuda build-gpu/test_dist > "$OUT/dist_one_process.log" 2>&1
  row "dist tests, one process, GPU | exit $? | $(grep -E '\[  (PASSED|FAILED)' "$OUT/dist_one_process.log" | tr '\n' ' ')"
  TILEGRAD_TEST_DEVICE=cuda "${MPI[@]}" -np 1 build-gpu/test_dist > "$OUT/dist_nccl_np1.log" 2>&1
  row "dist tests, mpirun -np 1 (NCCL $(grep -m1 -oE 'NCCL version [0-9.]+' "$OUT/dist_nccl_np1.log" || echo system)) | exit $? | $(grep -E '\[  (PASSED|FAILED)' "$OUT/dist_nccl_np1.log" | tr '\n' ' ')"
  stamp "world-size-1 tests done"
  if [ "$WHAT" != dist ]; then  # the GPU suite (kernels, ops, training on the GPU) while NCCL builds
    build-gpu/test_cuda > "$OUT/test_cuda.log" 2>&1
    row "test_cuda (the GPU suite) | exit $? | $(grep -E '\[  (PASSED|FAILED)|tests? ran' "$OUT/test_cuda.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test_cuda.log" | sort -u | head -20
    stamp "GPU suite done"
  fi
  if [ -n "${nccl_job:-}" ]; then wait "$nccl_job"; fi
  if [ -f .nccl/build/lib/libnccl.so ]; then
    stamp "NCCL 2.30 built"
    (
      export LD_LIBRARY_PATH=$PWD/.nccl/build/lib:${LD_LIBRARY_PATH:-} NCCL_MULTI_RANK_GPU_ENABLE=1 TILEGRAD_TEST_DEVICE=cuda
      timeout 400 "${MPI[@]}" -np 2 build-gpu/test_dist > "$OUT/dist_nccl_np2.log" 2>&1
      echo "dist tests, 2 ranks on one GPU (NCCL 2.30) | exit $? | $(grep -E '\[  (PASSED|FAILED)' "$OUT/dist_nccl_np2.log" | sort | uniq -c | tr '\n' ' ')" > "$OUT/row_np2.txt"
      timeout 200 tests/dist/faults.sh build-gpu/tilegrad > "$OUT/dist_faults_gpu.log" 2>&1
      echo "faults.sh through NCCL, 2 ranks on one GPU | exit $? | $(grep -E 'job ended|passed' "$OUT/dist_faults_gpu.log" | tr '\n' ' ')" > "$OUT/row_faults.txt"
    )
    row "$(cat "$OUT/row_np2.txt")"
    row "$(cat "$OUT/row_faults.txt")"
    grep -E "Failure|FAILED|did not finish|error" "$OUT/dist_nccl_np2.log" | head -20
  else
    row "dist tests, 2 ranks on one GPU | not run: no NCCL 2.30 build ($(tail -3 "$OUT/nccl_build.log" 2>/dev/null | tr '\n' ' '))"
  fi
  stamp "two-rank tests done"
fi

if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  B="bench train configs/gpt2-124m.yaml --steps 30 --warmup 5"
  for f in ${BENCH_RUNS:-plain np1 plain2}; do  # plain2: the first run again, for the spread
    case $f in
      np1) "${MPI[@]}" -np 1 build-gpu/tilegrad $B > "$OUT/bench_train_$f.log" 2>&1 ;;
      *) build-gpu/tilegrad $B > "$OUT/bench_train_$f.log" 2>&1 ;;
    esac
  done
  for f in ${BENCH_RUNS:-plain np1 plain2}; do
    row "bench train GPT-2 small ($f) | $(grep -m1 -oE '"ms_per_step":[0-9.]+,"tokens_per_s":[0-9]+' "$OUT/bench_train_$f.log") $(grep -m1 -oE '"peak_gib":[0-9.]+' "$OUT/bench_train_$f.log") $(grep -m1 -oE '"comm_exposed_ms":[0-9.]+|"backend":"[a-z]+"' "$OUT/bench_train_$f.log" | tr '\n' ' ')"
  done
  stamp "benchmarks done"
fi

echo
echo "| what | result |"
echo "|---|---|"
for r in "${rows[@]}"; do echo "| $r |"; done
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && find . -type f ! -name dist_logs.tar.gz -print0 |
    tar czf dist_logs.tar.gz --null -T - --remove-files && find . -mindepth 1 -type d -empty -delete)
fi
