#!/usr/bin/env bash
# The whole test suite with the host code under AddressSanitizer and UndefinedBehaviorSanitizer:
# builds BUILD_DIR (default build-sanitize) without CUDA, with -DTILEGRAD_SANITIZE=ON and
# RelWithDebInfo (reports name source lines), and runs ctest there. A report — an out-of-bounds
# access, a use after free, a signed overflow, a misaligned or null-pointer access — ends the
# process it happens in, so the test fails and its output holds the report. The kernel emulator's
# tests run the attention kernels' CUDA source on the CPU, so their indexing is checked too. On
# 2 cores (`.ci/run` on a clean clone, 2026-12-05): the suite 17 minutes, most of it the kernel
# emulator's tests (label dev), and the build about 11. CI runs it after ./test.sh. Needs what
# ./test.sh installs.
# Usage: tools/sanitize_check.sh [ctest arguments, e.g. -R 'Fuzz|Checkpoint']
set -euo pipefail
cd "$(dirname "$0")/.."
B="${BUILD_DIR:-build-sanitize}"
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$B" -DTILEGRAD_CUDA=OFF -DTILEGRAD_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$B" -j "$JOBS"
# Leaks are not failures here: MPI, OpenMP and HDF5 keep allocations for the process's life. An
# allocation past ASan's limit returns null, as the out-of-memory tests expect of malloc.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# As ./test.sh runs the suite: two passive OpenMP threads per test process, OpenBLAS on one.
OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
  ctest --test-dir "$B" --output-on-failure -j "$JOBS" "$@"
