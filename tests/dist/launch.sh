#!/usr/bin/env bash
# How ranks start. Under LAUNCHER=mpirun (the default): two CPU ranks not bound to cores, started
# without OMP_NUM_THREADS, run max(1, CPUs / 2) OpenMP threads each and say so in the log; with
# OMP_NUM_THREADS=1 they keep it; rank 0's log names the ranks and where they run. One rank under
# the launcher logs that it was launched and trains as one process does. Under LAUNCHER=srun (a
# Slurm cluster that answers) the same with `srun --mpi=pmix`, and: one task without an MPI plugin
# trains as one process; two tasks without one stop at once with the error naming --mpi=pmix;
# mpirun inside an allocation (salloc) gives the same losses as srun.
# Usage: [LAUNCHER=srun] tests/dist/launch.sh path/to/tilegrad      (exit 77: skipped, with the reason)
set -uo pipefail
tilegrad=$(realpath "$1")
source "$(dirname "$0")/job_setup.sh"
pick_launcher
make_work_and_corpus "$tilegrad"
cat >"$work/config.yaml" <<YAML
model: {n_layer: 1, n_head: 2, d_model: 16, max_seq_len: 16}
data: {train: "$work/data/train_*.bin", val: "$work/data/val_*.bin"}
train: {batch_size: 2, seq_len: 16, max_steps: 6, warmup_steps: 2}
run: {device: cpu, log_every: 1, eval_every: 0, sample_every: 0, comm_timeout_s: 60}
YAML
train() {  # train RUN_NAME LAUNCH…: the job's output in $work/RUN_NAME.out
  local name=$1
  shift
  timeout 120 "$@" "$tilegrad" train "$work/config.yaml" --set run.out_dir="$work/$name" >"$work/$name.out" 2>&1
}
losses() { grep -o 'loss [0-9.]*' "$work/$1/train.log" | tr '\n' ' '; }

cpus=$(nproc)
want=$((cpus / 2 > 0 ? cpus / 2 : 1))
unset OMP_NUM_THREADS
train shared "${launch[@]}" || { fail "two ranks: exit $?"; cat "$work/shared.out"; }
line=$(grep -m1 'cpu threads' "$work/shared/train.log")
echo "two unbound ranks on $cpus CPUs: $line"
[[ $line == *"cpu threads: $want "* || ($want == "$cpus" && $line == *"cpu threads: $want") ]] ||
  fail "two unbound ranks on $cpus CPUs should run $want threads each"
OMP_NUM_THREADS=1 train chosen "${launch[@]}" || fail "OMP_NUM_THREADS=1: exit $?"
grep -q 'cpu threads: 1 (OMP_NUM_THREADS)' "$work/chosen/train.log" || fail "OMP_NUM_THREADS=1 not kept"
[ "$(losses shared)" = "$(losses chosen)" ] || fail "the threads changed the losses: $(losses shared) / $(losses chosen)"
grep -q "data parallel: 2 ranks over mpi .*rank 0 of 2 (local rank 0) on host" "$work/chosen/train.log" ||
  fail "the two-rank log does not name its ranks and placement"
# One rank under the launcher says in its log that the launcher was seen, and trains as one process.
OMP_NUM_THREADS=1 train one_rank "${launch_one[@]}" || { fail "one rank under $launcher: exit $?"; cat "$work/one_rank.out"; }
grep -q "launched by $launcher as one rank (communicator: .*rank 0 of 1 (local rank 0) on host" "$work/one_rank/train.log" ||
  fail "one rank under $launcher: no line naming the launcher: $(grep -m1 -i 'launched\|rank' "$work/one_rank/train.log")"
OMP_NUM_THREADS=1 train plain || fail "no launcher: exit $?"
! grep -q "launched by\|data parallel" "$work/plain/train.log" || fail "a process without a launcher logged a placement"
[ "$(losses one_rank)" = "$(losses plain)" ] || fail "one rank under $launcher: losses $(losses one_rank), one process's $(losses plain)"

if [ "$launcher" = srun ]; then
  export OMP_NUM_THREADS=1
  train one srun --mpi=none -n 1 || { fail "one srun task without PMIx: exit $?"; cat "$work/one.out"; }
  grep -q '^done: step 6' "$work/one.out" && ! grep -q 'data parallel' "$work/one/train.log" ||
    fail "one srun task without PMIx did not train as one process"
  t0=$SECONDS
  if train nopmix srun --mpi=none --overcommit -n 2; then fail "two srun tasks without PMIx started"; fi
  grep -q 'srun --mpi=pmix' "$work/nopmix.out" || { fail "no message naming --mpi=pmix"; cat "$work/nopmix.out"; }
  echo "two srun tasks without an MPI plugin: stopped after $((SECONDS - t0)) s: $(grep -m1 'error' "$work/nopmix.out")"
  train inside salloc --overcommit -n 2 mpirun --allow-run-as-root --bind-to none ||
    { fail "mpirun inside salloc: exit $?"; cat "$work/inside.out"; }
  [ "$(losses inside)" = "$(losses chosen)" ] || fail "mpirun inside salloc: losses $(losses inside), srun's $(losses chosen)"
fi
[ "$failures" -eq 0 ] && echo "launch ($launcher): all passed"
exit $((failures > 0))
