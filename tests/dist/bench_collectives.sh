#!/usr/bin/env bash
# `tilegrad bench allreduce` under mpirun with 3 ranks on the CPU (MPI): each collective checks
# its own result before timing (a wrong sum or gather fails the command), and rank 0 prints one
# JSON line per size with the world size, the backend and a positive bus bandwidth. Exits 77
# (ctest's skip) with the reason where mpirun cannot start a job.
# Usage: tests/dist/bench_collectives.sh TILEGRAD
set -uo pipefail
tilegrad=$1
here=$(dirname "$0")
for collective in all_reduce reduce_scatter all_gather; do
  out=$("$here/mpirun_test.sh" 3 "$tilegrad" bench allreduce --device cpu --mib 0.5,3 --steps 3 --warmup 1 \
        --collective "$collective" 2>&1)
  rc=$?
  [ $rc -eq 77 ] && { echo "$out"; exit 77; }
  [ $rc -eq 0 ] || { echo "FAIL: $collective exited $rc"; echo "$out"; exit 1; }
  lines=$(echo "$out" | grep -c "\"collective\":\"$collective\",\"backend\":\"mpi\",\"world_size\":3")
  [ "$lines" -eq 2 ] || { echo "FAIL: $collective: want 2 JSON lines from rank 0, got $lines"; echo "$out"; exit 1; }
  if echo "$out" | grep '"bench":"collective"' | grep -q '"busbw_gbs":0.00'; then
    echo "FAIL: $collective: a bus bandwidth of 0"; echo "$out"; exit 1
  fi
  echo "ok: $collective"
done
# Bad input: a clear error, not a hang.
if out=$("$tilegrad" bench allreduce --mib 0 2>&1); then echo "FAIL: --mib 0 accepted"; exit 1; fi
echo "$out" | grep -q "takes sizes in MiB" || { echo "FAIL: --mib 0: $out"; exit 1; }
if out=$("$tilegrad" bench allreduce --collective broadcast 2>&1); then echo "FAIL: --collective broadcast accepted"; exit 1; fi
echo "$out" | grep -q "is unknown" || { echo "FAIL: --collective broadcast: $out"; exit 1; }
echo "ok: bad input"
