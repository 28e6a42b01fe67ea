#!/usr/bin/env bash
# A data-parallel job over two nodes, without a second machine: mpirun starts its daemons on
# "nodeA" and "nodeB" through a stand-in for ssh that runs them here in namespaces of their own,
# each with its host name, and nodeB with an empty private file system over the run directories,
# as a node without a shared file system has. The two nodes talk over TCP (Open MPI's tcp
# transport on the loopback interface); the ranks of one node over shared memory. Checks:
#   1. 4 ranks, 2 per node, against one process with grad_accum 4: every loss within 1e-5; each
#      node's ranks number their local ranks 0 and 1 and share that node's CPUs;
#   2. the job resumed from its checkpoint at half way on the two nodes (nodeB cannot see it;
#      rank 0 reads it and broadcasts): the losses after it bitwise equal the uninterrupted run's;
#   3. a rank on nodeB killed: the job ends, non-zero, within 25 s;
#   4. nodeB without the data shards: the job ends at once, its error naming the rank and host.
# Usage: tests/dist/two_nodes.sh path/to/tilegrad   (exit 77: skipped, with the reason)
set -uo pipefail
tilegrad=$(realpath "$1")
if ! command -v mpirun >/dev/null; then echo "SKIP: mpirun is not installed (openmpi-bin)"; exit 77; fi
if ! why=$(unshare --uts --mount true 2>&1); then
  echo "SKIP: cannot make a node's namespaces here (unshare --uts --mount needs root): $why"
  exit 77
fi
source "$(dirname "$0")/job_setup.sh"
unset OMP_NUM_THREADS  # the ranks share each node's CPUs out themselves (checked below)
make_work_and_corpus "$tilegrad"
mkdir -p "$work/runs"

# The stand-in for ssh: `node_shell [options] HOST COMMAND…` runs COMMAND in a new UTS and mount
# namespace whose host name is HOST; on nodeB an empty tmpfs hides the run directories.
cat >"$work/node_shell" <<SH
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1
shift
hide=""
[ "\$host" = nodeB ] && hide="mount -t tmpfs none $work/runs && "
[ "\$host" = nodeB ] && [ -n "\${HIDE_DATA:-}" ] && hide="\$hide mount -t tmpfs none $work/data && "
exec unshare --uts --mount --propagation private bash -c "hostname \$host && \$hide\$*"
SH
chmod +x "$work/node_shell"
printf 'nodeA slots=2\nnodeB slots=2\n' >"$work/hosts"
mpi=(mpirun --allow-run-as-root --hostfile "$work/hosts" --mca plm_rsh_agent "$work/node_shell"
     --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --bind-to none)
if ! why=$(timeout 60 "${mpi[@]}" -np 4 hostname 2>&1) || [ "$(echo "$why" | sort | tr "\n" " ")" != "nodeA nodeA nodeB nodeB " ]; then
  echo "SKIP: mpirun cannot start daemons through the stand-in for ssh here: $why"
  exit 77
fi

cat >"$work/config.yaml" <<YAML
model: {n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 16, dropout: 0.1}
data: {train: "$work/data/train_*.bin", val: "$work/data/val_*.bin"}
train: {batch_size: 2, seq_len: 16, max_steps: 20, warmup_steps: 2}
run: {device: cpu, log_every: 1, eval_every: 10, eval_steps: 2, sample_every: 0, ckpt_every: 10, comm_timeout_s: 60}
YAML
train() {  # train RUN_NAME [mpirun -np N | nothing] -- [train args…]
  local name=$1
  shift
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  timeout 300 "${launch[@]}" "$tilegrad" train "$work/config.yaml" "$@" >"$work/$name.out" 2>&1
}
losses() {  # the train losses of run directory $1 from step $2 on
  python3 -c 'import json,sys
print(" ".join(repr(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train" and r["step"] >= int(sys.argv[2])))' \
    "$work/runs/$1/metrics.jsonl" "$2"
}
largest_difference() {
  python3 -c 'import sys; a, b = (list(map(float, s.split())) for s in sys.argv[1:3]); print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) and a else "different lengths")' "$1" "$2"
}

train nodes "${mpi[@]}" -np 4 -- --set run.out_dir="$work/runs/nodes" || { fail "4 ranks on 2 nodes: exit $?"; tail -20 "$work/nodes.out"; }
train one -- --set run.out_dir="$work/runs/one" train.grad_accum=4 || fail "one process: exit $?"
diff=$(largest_difference "$(losses nodes 1)" "$(losses one 1)")
echo "4 ranks on 2 nodes against one process (grad_accum 4), 20 steps: largest loss difference $diff"
python3 -c "import sys; sys.exit(0 if '$diff' != 'different lengths' and float('$diff') <= 1e-5 else 1)" ||
  fail "4 ranks on 2 nodes: losses differ from one process's by $diff"
for r in 0 1 2 3; do
  node=$([ $r -lt 2 ] && echo nodeA || echo nodeB)
  grep -q "rank $r of 4 (local rank $((r % 2))) on host $node" "$work/nodes.out" "$work/runs/nodes/train.log" ||
    fail "rank $r is not local rank $((r % 2)) on $node"
done
seen=$("${mpi[@]}" -np 4 bash -c "echo \$(hostname) \$(ls $work/runs | wc -l)" 2>&1 | sort -u | tr '\n' ' ')
echo "run directories each node sees: $seen"
[[ $seen == "nodeA 2 nodeB 0 " ]] || fail "nodeB should see no run directory: $seen"
cpus=$(nproc)
want=$((cpus / 2 > 0 ? cpus / 2 : 1))
grep -q "cpu threads: $want" "$work/runs/nodes/train.log" || fail "2 ranks per node on $cpus CPUs should run $want threads each"

mkdir -p "$work/runs/resumed"
cp "$work/runs/nodes/ckpt-10.h5"* "$work/runs/resumed/" && echo ckpt-10.h5 >"$work/runs/resumed/latest"
train resumed "${mpi[@]}" -np 4 -- --resume latest --set run.out_dir="$work/runs/resumed" ||
  { fail "resume on 2 nodes: exit $?"; tail -20 "$work/resumed.out"; }
[ -n "$(losses resumed 11)" ] && [ "$(losses resumed 11)" = "$(losses nodes 11)" ] ||
  fail "resumed on 2 nodes: losses $(losses resumed 11), uninterrupted $(losses nodes 11)"
echo "resumed at step 10 on 2 nodes (nodeB without the run directory): steps 11-20 $( [ "$(losses resumed 11)" = "$(losses nodes 11)" ] && echo "bitwise equal" || echo differ)"

sed -i 's/max_steps: 20/max_steps: 1000000/' "$work/config.yaml"
train killed "${mpi[@]}" -np 4 -- --set run.out_dir="$work/runs/killed" run.comm_timeout_s=5 &
job=$!
for _ in $(seq 600); do grep -q "^step 5/" "$work/runs/killed/train.log" 2>/dev/null && break; sleep 0.1; done
victim=""
for p in $(pgrep -f "tilegrad train $work/config.yaml"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=3" && victim=$p
done
[ -n "$victim" ] || fail "rank 3 not found"
t0=$SECONDS
kill -KILL $victim
for _ in $(seq 400); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then fail "killed rank on nodeB: the job still runs after $((SECONDS - t0)) s"; kill -KILL $job
else
  wait $job
  status=$?
  echo "rank 3 (nodeB) killed: the job ended after $((SECONDS - t0)) s with status $status"
  [ $status -ne 0 ] || fail "killed rank: the job exited 0"
  [ $((SECONDS - t0)) -le 25 ] || fail "killed rank: took $((SECONDS - t0)) s"
fi

t0=$SECONDS
if HIDE_DATA=1 train nodata "${mpi[@]}" -np 4 -- --set run.out_dir="$work/runs/nodata"; then fail "nodeB without data: the job exited 0"; fi
echo "nodeB without the data shards: the job ended after $((SECONDS - t0)) s: $(grep -m1 '^error' "$work/nodata.out")"
grep -q "^error: rank [23] of 4 on host nodeB: .*data.train: no file matches" "$work/nodata.out" ||
  { fail "nodeB without data: no error naming the rank, host and data.train"; cat "$work/nodata.out"; }

[ "$failures" -eq 0 ] && echo "two nodes: all passed"
exit $((failures > 0))
