#!/usr/bin/env bash
# One call on the GPU machine: build, run the whole test suite (GPU tests included), then the
# benchmarks beside their PyTorch references. Logs go to $OUT (or ./gpu-out); a table prints last.
# Usage: tools/gpu_check.sh [tests|sanitize|attn|profile|stalls|ramp|bench|memory|all]   (PyTorch references: bench/reference/)
#   stalls: STALLS_D=64|128, STALLS_T=T, STALLS_CAUSAL=0 for the non-causal shapes, STALLS_FWD=1 /
#   STALLS_DQ=1 to profile the forward / dQ kernel too
#   ramp: RAMP_D="128 64" (head dims), every kernel at non-causal T 1k-8k at base clocks beside cuDNN's
set -uo pipefail
cd "$(dirname "$0")/.."
WHAT="${1:-all}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
# Each kernel's time alone, at base clocks (the stalls and ramp modes), and ncu_times FILE...: the
# kernels such a run timed, in launch order, µs each.
NCU_TIME="ncu --clock-control base --cache-control none --metrics gpu__time_duration.sum --csv"
ncu_times() {
  python3 - "$@" <<'PY'
import csv, sys
for path in sys.argv[1:]:
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    if not rows:
        print(f"== {path}: no kernels profiled"); continue
    head, body = rows[0], rows[1:]
    name, val = head.index("Kernel Name"), head.index("Metric Value")
    print(f"== {path.split('/')[-1]} (launch order; µs at base clocks)")
    for r in body:
        print(f"{float(r[val].replace(',', '')) / 1e3:9.1f}  {r[name][:110]}")
PY
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
# What the mode runs: the whole test suite, the GPU test binary, or the tilegrad binary alone.
case "$WHAT" in
  tests|all) TARGETS=() ;;
  sanitize) TARGETS=(--target test_cuda) ;;
  *) TARGETS=(--target tilegrad) ;;
esac
if ! cmake --build build-gpu -j "$(nproc)" ${TARGETS[@]+"${TARGETS[@]}"} > "$OUT/build.log" 2>&1; then
  grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1
fi
echo "build ok"
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ctest --test-dir build-gpu -j 8 --output-on-failure --timeout 600 > "$OUT/ctest.log" 2>&1
  grep -E "tests passed|tests failed" "$OUT/ctest.log"
  grep -E "\(Failed\)|\(Timeout\)|\(SEGFAULT\)|Exception" "$OUT/ctest.log" | head -40
fi
if [ "$WHAT" = sanitize ] || [ "$WHAT" = all ]; then
  # memcheck, racecheck and synccheck on small attention cases, both kernel families and both dQ
  # modes (the fused kernels use shared memory heavily; the atomic wgmma one hands it to the bulk
  # copy engine), packed qkv included.
  F='Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T1_*:Shapes/FlashAttentionTest.MatchesDoubleReference/B2_T129_*:Packed/*'
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/test_cuda --gtest_filter="$F" > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -cE '^\[       OK' "$OUT/sanitizer_$tool.log") tests OK; $(grep -m1 -E 'ERROR SUMMARY' "$OUT/sanitizer_$tool.log"))"
  done
fi
if [ "$WHAT" = attn ] || [ "$WHAT" = all ]; then
  # Registers, shared memory and spills of the attention kernels.
  # (*_sm90a.cu use wgmma: they exist for sm_90a only.)
  for f in kernels/cuda/flash_attention/*.cu; do
    case "$f" in *_sm90a.cu) arch=90a ;; *) arch=90 ;; esac
    nvcc -std=c++17 -O3 -gencode=arch=compute_$arch,code=sm_$arch -Xptxas -v -I. -c "$f" -o /dev/null 2>&1 \
      | grep -E "Compiling entry|registers|spill" ; done > "$OUT/ptxas.txt"
  build-gpu/tilegrad bench attention --steps 20 --compare 1 2>&1 | tee "$OUT/bench_attention.log" | grep -v "^{"
  if [ -f bench/reference/torch_attention.py ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/reference/torch_attention.py > "$OUT/torch_attention.log" 2>&1
    grep "^|" "$OUT/torch_attention.log"
  fi
fi
if [ "$WHAT" = profile ] || [ "$WHAT" = all ]; then
  # Where a training step's GPU time goes, kernel by kernel: ncu times 2500 launches after the
  # first 2000 (past the warm-up steps), and the table sums by name the launches of one step:
  # those after one AdamW update up to the next. Caches and clocks as in a real run (ncu's
  # defaults flush the caches before each kernel and lock the clocks to base, which inflates
  # short and compute-bound kernels). The step's own time is bench train's, run first (as the
  # config runs it); ncu times the same kernels launched one by one (train.cuda_graph=false), so
  # that its launch counts are the kernels'.
  # The SM clock and the board's power while the step runs (nvidia-smi every 100 ms): a step of
  # GEMMs runs at the board's power limit, where the clock, not only the kernels, sets its time.
  nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit --format=csv,noheader,nounits -lms 100 > "$OUT/smi_train.csv" &
  smi=$!
  build-gpu/tilegrad bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 2>&1 | tail -3 | tee "$OUT/bench_train.txt"
  kill $smi
  python3 - "$OUT/smi_train.csv" <<'PY' | tee -a "$OUT/bench_train.txt"
import sys, statistics
rows = [[float(x) for x in l.split(",")] for l in open(sys.argv[1]) if l.count(",") == 2]
busy = [r for r in rows if r[1] > 0.5 * r[2]]  # the samples while the step runs (above half the limit)
if busy:
    clk, pw = [r[0] for r in busy], [r[1] for r in busy]
    print(f"while training ({len(busy)} samples): SM clock {min(clk):.0f}–{max(clk):.0f} MHz (median "
          f"{statistics.median(clk):.0f}), power median {statistics.median(pw):.0f} W, max {max(pw):.0f} W, "
          f"limit {busy[0][2]:.0f} W")
PY
  ncu --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second --csv --cache-control none --clock-control none \
    --launch-skip 2000 --launch-count 2500 \
    build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set run.device=cuda train.cuda_graph=false --steps 3 --warmup 4 \
    > "$OUT/ncu_train.csv" 2> "$OUT/ncu_train.err"
  python3 - "$OUT/ncu_train.csv" <<'PY' | tee "$OUT/kernel_profile.txt"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
ident, name, metric, val = (head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value"))
launches = collections.OrderedDict()  # launch ID → (kernel, {metric: value})
for r in body:
    launches.setdefault(r[ident], (r[name], {}))[1][r[metric]] = float(r[val].replace(",", ""))
body = list(launches.values())
updates = [i for i, (k, _) in enumerate(body) if "adamw" in k.lower()]
if len(updates) >= 2:
    body = body[updates[0] + 1:updates[1] + 1]
tot = collections.defaultdict(float); cyc = collections.defaultdict(float); cnt = collections.Counter()
for k, m in body:
    k = k.split("(")[0][:100]
    ns = m["gpu__time_duration.sum"]
    tot[k] += ns; cnt[k] += 1; cyc[k] += ns * m.get("sm__cycles_elapsed.avg.per_second", 0.0)
all_ns = sum(tot.values())
print(f"one step: {len(body)} launches, {all_ns/1e6:.2f} ms of kernel time (MHz: the SM clock, time-weighted)")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:40]:
    print(f"{100*v/all_ns:5.1f}%  {v/1e6:7.3f} ms  {cnt[k]:4d}x  {cyc[k]/v/1e6:5.0f} MHz  {k}")
PY
fi
if [ "$WHAT" = stalls ]; then
  # The attention kernels of one head dim (STALLS_D, 128 or 64; default 128) at one T (STALLS_T,
  # default 8192) under equal conditions for tilegrad's and PyTorch's: ncu times each kernel
  # alone with the clocks locked to base (a benchmark's long run is throttled by the power cap by
  # an amount that depends on what ran before). 1) Kernel times: tilegrad's forward and both
  # backwards, causal then not, beside PyTorch's cuDNN and FA2 kernels (tools/torch_sdpa_once.py).
  # 2) --set full of tilegrad's dK/dV kernels at the causal shape, or with STALLS_CAUSAL=0 the
  # non-causal one (1) times both) — d 128: the deterministic and the atomic one; d 64: the
  # deterministic one — with STALLS_FWD=1 the forward kernel first, and per instruction where
  # their warps wait, then per loop (tools/ncu_stalls.py: the item loop's own samples against
  # the tile loops').
  T="${STALLS_T:-8192}"
  D="${STALLS_D:-128}"
  CAUSAL="${STALLS_CAUSAL:-1}"  # 1: the causal shape's kernels are profiled, 0: the non-causal one's
  # tag:kernel (a regex on the mangled name, template flags included):launches to skip (--atomic 2:
  # the atomic kernel times the opt-in mode at every shape, where kAtomic alone may take the pair)
  case "$D" in
    128) PROFILED="dkdv_det:flash_bwd_dkdv_sm90a_ws.*Lb0ELb0ELb0E:1 dkdv_atomic:flash_bwd_dkdv_sm90a_ws.*Lb0ELb1ELb0E:0" ;;
    # (d 64: its deterministic dK/dV kernel in either shape, two consumers or — from T = 2048 — three)
    64) PROFILED="dkdv_det:flash_bwd_dkdv_sm90a_ws.*Li64ELi[23]ELi3ELb1ELb0E:1" ;;
    *) echo "STALLS_D=$D: give 64 or 128"; exit 1 ;;
  esac
  # The forward's timed launch (the first is the warm-up's).
  if [ "${STALLS_FWD:-0}" = 1 ]; then PROFILED="fwd:flash_fwd_sm90a_kernel.*FwdSm90aTraitsILi${D}E:1 $PROFILED"; fi
  # STALLS_DQ=1: the deterministic dQ kernel's timed launch too.
  if [ "${STALLS_DQ:-0}" = 1 ]; then PROFILED="$PROFILED dq:flash_bwd_dq_sm90a_kernel.*DqSm90aTraitsILi${D}E:1"; fi
  $NCU_TIME build-gpu/tilegrad bench attention --head-dim "$D" --min-t "$T" --max-t "$T" --warmup 1 --steps 1 --causal 2 --atomic 2 \
    > "$OUT/ncu_times_tilegrad.csv" 2> "$OUT/ncu_times_tilegrad.err"
  for causal in 1 0; do
    $NCU_TIME --profile-from-start off python3 tools/torch_sdpa_once.py --T "$T" --d "$D" --causal $causal \
      > "$OUT/ncu_times_torch_causal$causal.csv" 2> "$OUT/ncu_times_torch_causal$causal.err"
  done
  ncu_times "$OUT"/ncu_times_tilegrad.csv "$OUT"/ncu_times_torch_causal1.csv "$OUT"/ncu_times_torch_causal0.csv \
    | tee "$OUT/ncu_times.txt"
  NCU_FULL="ncu --set full --import-source no --clock-control base --cache-control none --kernel-name-base mangled -f"
  for kernel in $PROFILED; do
    IFS=: read -r tag regex skip <<< "$kernel"
    $NCU_FULL --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 \
      -o "$OUT/$tag" build-gpu/tilegrad bench attention --head-dim "$D" --min-t "$T" --max-t "$T" \
      --causal "$CAUSAL" --atomic 2 --warmup 1 --steps 1 > "$OUT/$tag.log" 2>&1
    ncu --import "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/${tag}_source.csv" 2>/dev/null
    ncu --import "$OUT/$tag.ncu-rep" --page details > "$OUT/${tag}_details.txt" 2>/dev/null
    grep -E "^    (Duration|SM Frequency)" "$OUT/${tag}_details.txt" \
      | sed 's/  */ /g' | paste -sd';' | sed "s/^/$tag, causal=$CAUSAL T $T:/" | tee "$OUT/${tag}_stalls.txt"
    ncu --import "$OUT/$tag.ncu-rep" --page raw --csv > "$OUT/${tag}_raw.csv" 2>/dev/null
    python3 tools/ncu_stalls.py "$OUT/${tag}_source.csv" --top 8 --item-loop 8 --raw "$OUT/${tag}_raw.csv" | tee -a "$OUT/${tag}_stalls.txt"
    rm -f "$OUT/$tag.ncu-rep"
  done
fi
if [ "$WHAT" = ramp ]; then
  # Every attention kernel timed alone by ncu at base clocks over non-causal T 1k-8k (RAMP_D: head
  # dims, default "128 64"), tilegrad's and cuDNN's (tools/torch_sdpa_once.py). Non-causal the work
  # items' count is the same at every T (B·T fixed) and an item's work grows with T, so a kernel's
  # time is about a + b·T: how b and a compare with cuDNN's says whether a gap is the tiles' cost
  # or what items cost beyond them (docs/kernels.md §8).
  for D in ${RAMP_D:-128 64}; do
    $NCU_TIME build-gpu/tilegrad bench attention --head-dim "$D" --min-t 1024 --max-t 8192 --warmup 1 --steps 1 --causal 0 \
      --atomic 0 > "$OUT/ramp_tilegrad_d$D.csv" 2> "$OUT/ramp_tilegrad_d$D.err"
    echo "== tilegrad d $D non-causal T 1k-8k (per T: warm-up forward + backward, timed forward, timed backward)"
    ncu_times "$OUT/ramp_tilegrad_d$D.csv"
    for T in 1024 2048 4096 8192; do
      $NCU_TIME --profile-from-start off python3 tools/torch_sdpa_once.py --T "$T" --d "$D" --causal 0 --backends cudnn \
        > "$OUT/ramp_cudnn_d${D}_$T.csv" 2>/dev/null
      ncu_times "$OUT/ramp_cudnn_d${D}_$T.csv"
    done
  done
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  for B in 16 32; do
    build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set train.batch_size=$B run.device=cuda 2>&1 | tee -a "$OUT/bench_train.log"
  done
  # The opt-in unordered dQ atomics of the attention backward.
  build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set train.batch_size=16 run.device=cuda train.deterministic=false \
    2>&1 | grep '^{' | tee -a "$OUT/bench_train.log"
  # The materialised attention as the baseline of the fused kernel.
  build-gpu/tilegrad bench train configs/gpt2-124m.yaml --set train.batch_size=16 run.device=cuda model.attention=naive 2>&1 \
    | grep '^{' | tee -a "$OUT/bench_train.log"
  if [ -f bench/reference/torch_gpt.py ]; then
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/reference/torch_gpt.py throughput 2>&1 | grep "{" | tee "$OUT/torch_gpt.log"
  fi
fi
if [ "$WHAT" = memory ]; then
  # Peak memory of one batch-1 step against T with the long-context keys (MEMORY_MAX_T, default
  # 131072), beside torch_gpt.py memory to 64k (about two minutes each).
  timeout 400 build-gpu/tilegrad bench memory configs/gpt2-124m.yaml --max-t "${MEMORY_MAX_T:-131072}" \
    --set train.batch_size=1 run.device=cuda train.lm_head_chunk=4096 train.recompute=true 2>&1 | tee "$OUT/bench_memory.log"
  if [ -f bench/reference/torch_gpt.py ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/reference/torch_gpt.py memory 65536 2>&1 | grep "{" | tee "$OUT/torch_memory.log"
  fi
fi
