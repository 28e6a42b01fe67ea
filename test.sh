#!/usr/bin/env bash
# tilegrad's test command: installs what is missing, configures, builds and runs the whole
# suite with ctest. GPU tests skip with a stated reason where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")"
# gnuplot draws loss.png (tested); python3-h5py proves checkpoints open without tilegrad (tested);
# Open MPI starts and connects the ranks of the data-parallel tests; bible-kjv is the default run's
# text, on which the BPE tokenizer is checked against transformers'.
tools/install_deps.sh gnuplot-nox python3-h5py openmpi-bin libopenmpi-dev bible-kjv
# torch (Debian) and transformers (PyPI) in build/pyenv: the Hugging Face parity tests run the
# exported models and the tokenizer in transformers (they skip, saying why, without it).
tools/python_env.sh > /dev/null || echo "tilegrad: warning: no Python environment with transformers; the Hugging Face parity tests will skip" >&2
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
# Two OpenMP threads per test process keeps ctest's parallel runs from oversubscribing.
# Passive waiting: spinning OpenMP threads in one test process would starve the others.
OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
