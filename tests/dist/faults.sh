#!/usr/bin/env bash
# One rank of a two-rank `tilegrad train` job is stopped (a stuck rank), killed (a dead rank) or
# sent SIGTERM, and then the whole job is (SIGTERM to mpirun, which passes it on; `scancel
# --signal=TERM` under Slurm, as at a time limit: srun itself takes SIGTERM as "kill"). Stuck: the
# other rank gives up after run.comm_timeout_s with a message naming the collective and the step,
# and the job exits non-zero. Dead: the job exits non-zero within seconds. SIGTERM: every rank
# stops after the same step, one checkpoint is written and the job exits 0. In each case the
# latest checkpoint still loads.
# LAUNCHER=mpirun (the default) starts the ranks with Open MPI's mpirun; LAUNCHER=srun with
# Slurm's srun, which needs a Slurm cluster that answers (tests/dist/job_setup.sh).
# Usage: [LAUNCHER=srun] tests/dist/faults.sh path/to/tilegrad      (exit 77: skipped, with the reason)
set -uo pipefail
tilegrad=$(realpath "$1")
source "$(dirname "$0")/job_setup.sh"
pick_launcher
export OMP_NUM_THREADS=1  # both launchers pass the environment on to the ranks here
device=${TILEGRAD_TEST_DEVICE:-cpu}  # cuda: NCCL (two ranks on one GPU need NCCL_MULTI_RANK_GPU_ENABLE=1)

make_work_and_corpus "$tilegrad"
cat >"$work/config.yaml" <<YAML
model: {n_layer: 1, n_head: 2, d_model: 16, max_seq_len: 16}
data: {train: "$work/data/train_*.bin", val: "$work/data/val_*.bin"}
train: {batch_size: 2, seq_len: 16, max_steps: 1000000, warmup_steps: 2}
run: {device: $device, log_every: 1, eval_every: 0, ckpt_every: 50, keep_last: 2, comm_timeout_s: 5}
YAML

# Starts the job into run directory $1, waits for its first checkpoint; sets job (the launcher's
# pid) and pid (rank 1's).
start_job() {
  local dir=$1
  pid=""
  "${launch[@]}" "$tilegrad" train "$work/config.yaml" --set run.out_dir="$dir" >"$dir.out" 2>"$dir.err" &
  job=$!
  for _ in $(seq 600); do
    grep -q "^checkpoint " "$dir/train.log" 2>/dev/null && break
    sleep 0.1
  done
  for p in $(pgrep -f "tilegrad train $work/config.yaml"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$rank1_env"; then pid=$p; return; fi
  done
}
# Waits for the job to end (at most $1 s); sets status and seconds.
await_job() {
  local limit=$1 t0=$SECONDS
  for _ in $(seq $((limit * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then kill -KILL "$job"; status=hung; else wait "$job"; status=$?; fi
  seconds=$((SECONDS - t0))
}
latest_loads() { "$tilegrad" eval "$1" --steps 1 >/dev/null 2>&1 || fail "$2: the latest checkpoint in $1 does not load"; }

# A stuck rank: the other gives up after run.comm_timeout_s = 5 s.
start_job "$work/stuck"; [ -n "$pid" ] || fail "stuck: rank 1 not found"
kill -STOP "$pid"
await_job 40
echo "stuck rank: job ended after ${seconds} s with status $status"
[ "$status" != hung ] && [ "$status" -ne 0 ] || fail "stuck: status $status"
[ "$seconds" -le 25 ] || fail "stuck: took ${seconds} s"
grep -E "rank 0 of 2 .*did not finish within run.comm_timeout_s = 5 s" "$work/stuck.err" | grep -q "step [0-9]" ||
  { fail "stuck: no message naming the collective and step"; cat "$work/stuck.err"; }
grep -m1 "did not finish" "$work/stuck.err"
latest_loads "$work/stuck" stuck

# A dead rank.
start_job "$work/dead"; [ -n "$pid" ] || fail "dead: rank 1 not found"
kill -KILL "$pid"
await_job 40
echo "killed rank: job ended after ${seconds} s with status $status"
[ "$status" != hung ] && [ "$status" -ne 0 ] || fail "dead: status $status"
[ "$seconds" -le 25 ] || fail "dead: took ${seconds} s"
latest_loads "$work/dead" dead

# SIGTERM to rank 1 alone.
start_job "$work/term"; [ -n "$pid" ] || fail "term: rank 1 not found"
kill -TERM "$pid"
await_job 40
echo "SIGTERM to rank 1: job ended after ${seconds} s with status $status"
[ "$status" = 0 ] || { fail "term: status $status"; cat "$work/term.err"; }
grep -q "(stop requested by signal)" "$work/term/train.log" || fail "term: no checkpoint on the signal"
grep -q "stopped by signal after step" "$work/term/train.log" || fail "term: no stop line"
latest_loads "$work/term" term

# SIGTERM to every rank.
start_job "$work/term_all"; [ -n "$pid" ] || fail "term_all: rank 1 not found"
if [ "$launcher" = srun ]; then scancel --signal=TERM --name="$jobname"; else kill -TERM "$job"; fi
await_job 40
echo "SIGTERM to the whole job: ended after ${seconds} s with status $status"
# srun reports the ranks' status (0); mpirun exits 1 whenever it was signalled, whatever the ranks did.
if [ "$launcher" = srun ]; then expected=0; else expected=1; fi
[ "$status" = "$expected" ] || { fail "term_all: status $status"; cat "$work/term_all.err"; }
grep -q "(stop requested by signal)" "$work/term_all/train.log" || fail "term_all: no checkpoint on the signal"
grep -q "stopped by signal after step" "$work/term_all/train.log" || fail "term_all: no stop line"
latest_loads "$work/term_all" term_all

[ "$failures" -eq 0 ] && echo "faults ($launcher): all passed"
exit $((failures > 0))
