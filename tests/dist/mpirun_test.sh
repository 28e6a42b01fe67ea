#!/usr/bin/env bash
# Runs a test program as NP ranks under Open MPI's mpirun (as root too, more ranks than cores
# allowed, one OpenMP thread per rank). Exits 77 — ctest's skip — with the reason when mpirun is
# missing or cannot start a job on this machine.
# Usage: tests/dist/mpirun_test.sh NP PROGRAM [ARGS…]
set -uo pipefail
np=$1
shift
if ! command -v mpirun >/dev/null; then
  echo "SKIP: mpirun is not installed (Debian: openmpi-bin); the data-parallel tests need it"
  exit 77
fi
launch=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
if ! out=$(timeout 60 "${launch[@]}" -np 1 true 2>&1); then
  echo "SKIP: mpirun cannot start a job here: $out"
  exit 77
fi
exec timeout 900 "${launch[@]}" -np "$np" "$@"
