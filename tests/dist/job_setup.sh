# Sourced by the job checks in tests/dist: the launcher, a work directory and a tiny corpus.
#   pick_launcher: from LAUNCHER (mpirun, the default, or srun) sets `launcher`, `launch` (the
#     command that starts two ranks: mpirun unbound, or srun --mpi=pmix with --kill-on-bad-exit=1
#     under the job name $jobname), `launch_one` (the same for one rank) and `rank1_env` (the
#     variable that marks rank 1's process);
#     exits 77, ctest's skip, with the reason when that launcher cannot start a job here.
#   make_work_and_corpus TILEGRAD: `work`, a temporary directory removed at exit (KEEP=1 keeps
#     it) with the processes started from it, and $work/data/{train,val}_*.bin.
#   fail MESSAGE: prints it and counts it in `failures`.
pick_launcher() {
  launcher=${LAUNCHER:-mpirun}
  local probe
  case $launcher in
    mpirun)
      if ! command -v mpirun >/dev/null; then echo "SKIP: mpirun is not installed (openmpi-bin)"; exit 77; fi
      launch=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
      launch_one=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1)
      rank1_env=OMPI_COMM_WORLD_RANK=1
      probe=(mpirun --allow-run-as-root -np 1 true) ;;
    srun)
      if ! command -v srun >/dev/null; then echo "SKIP: srun is not installed (Slurm)"; exit 77; fi
      jobname=tilegrad-check-$$
      launch=(srun --mpi=pmix --kill-on-bad-exit=1 --cpu-bind=none --overcommit -n 2 -J "$jobname")
      launch_one=(srun --mpi=pmix --kill-on-bad-exit=1 --cpu-bind=none -n 1 -J "$jobname")
      rank1_env=SLURM_PROCID=1
      probe=(srun -n 1 true) ;;
    *) echo "LAUNCHER must be mpirun or srun, not '$launcher'"; exit 2 ;;
  esac
  local out
  if ! out=$(timeout 20 "${probe[@]}" 2>&1); then echo "SKIP: $launcher cannot start a job here: $out"; exit 77; fi
}

make_work_and_corpus() {
  work=$(mktemp -d)
  trap 'pkill -KILL -f "$work" 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
  for i in $(seq 400); do echo "In the beginning $((i % 7)) the word was $((i * 13 % 11))."; done >"$work/text.txt"
  "$1" prepare --text "$work/text.txt" --out "$work/data" --val-fraction 0.1 >/dev/null || exit 1
}

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
