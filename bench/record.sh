#!/usr/bin/env bash
# Every GPU figure of docs/performance.md in one call on a GPU machine: builds tilegrad, runs each
# benchmark beside its PyTorch reference (bench/reference/), and prints the tables with the
# machine, date and commit (bench/record_tables.py). Logs (JSON lines) go to $OUT (or ./gpu-out).
# About 14 minutes on an H200; RECORD="train attention memory loop" picks a subset (the default);
# RECORD=long the memory picture beside PyTorch's up to T = 1M (about 10 minutes more), RECORD=masks
# the windowed and document-masked attention beside FlexAttention and a 4k-window step at T = 1M
# (about 8 minutes); RECORD=scale data parallelism on all the machine's GPUs beside PyTorch DDP,
# RECORD=scale_long the long-context config at T = 1M with batch 1 on every GPU.
# PACK=1 leaves two files in $OUT, the tables and the logs packed into record_logs.tar.gz (for a
# machine that hands back only a few files; `tar xzf` them into a folder and run
# bench/record_tables.py on it to print the tables again).
# Usage: bench/record.sh (COMMIT=HASH names the commit where the tree is not a git checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
RECORD="${RECORD:-train attention memory loop}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/cmake.log" 2>&1 ||
  { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target tilegrad > "$OUT/build.log" 2>&1 || { grep -A3 error "$OUT/build.log" | head -40; exit 1; }
tg=build-gpu/tilegrad
for what in $RECORD; do
  case "$what" in
    train)
      $tg bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 > "$OUT/record_train.jsonl" 2>&1
      $tg bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 --set train.lm_head_chunk=4096 \
        > "$OUT/record_train_chunked.jsonl" 2>&1
      $tg bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 --set train.lm_head_chunk=8192 \
        > "$OUT/record_train_chunked8192.jsonl" 2>&1
      $tg bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 --set train.cuda_graph=false \
        > "$OUT/record_train_launched.jsonl" 2>&1
      timeout 600 python3 bench/reference/torch_gpt.py throughput --vocab 50304 > "$OUT/record_torch_train.jsonl" 2>&1 ;;
    attention)
      $tg bench attention --steps 20 > "$OUT/record_attention.jsonl" 2>&1
      timeout 600 python3 bench/reference/torch_attention.py > "$OUT/record_torch_attention.jsonl" 2>&1 ;;
    loop)
      # tilegrad train on shard files against bench train's step, in one call; then sampling
      # with and without the key/value cache from a GPT-2-small-sized byte-level run.
      python3 bench/make_shards.py "$OUT/shards" --tokens 20000000 > /dev/null
      $tg train configs/gpt2-124m.yaml --set "data.train=$OUT/shards/train_*.bin" "data.val=$OUT/shards/val_*.bin" \
        train.max_steps=120 train.warmup_steps=10 run.log_every=20 run.eval_every=0 run.ckpt_every=0 \
        run.sample_every=0 run.out_dir="$OUT/loop_run" > "$OUT/record_loop_train.log" 2>&1
      grep '"type":"train"' "$OUT/loop_run/metrics.jsonl" > "$OUT/record_loop_metrics.jsonl"
      $tg bench train configs/gpt2-124m.yaml --steps 30 --warmup 5 > "$OUT/record_loop_bench.jsonl" 2>&1
      $tg prepare --text README.md docs/*.md --out "$OUT/bytes" > /dev/null
      $tg train configs/gpt2-124m.yaml --set "data.train=$OUT/bytes/train_*.bin" "data.val=$OUT/bytes/val_*.bin" \
        model.vocab_size=257 train.batch_size=4 train.max_steps=2 train.warmup_steps=1 run.eval_every=0 \
        run.out_dir="$OUT/sample_run" > /dev/null 2>&1
      for flag in "" --no-kv-cache; do
        $tg sample "$OUT/sample_run" --tokens 1000 --temperature 0 $flag 2>&1 >/dev/null | grep '^sampled' \
          >> "$OUT/record_sample.log"
      done
      rm -rf "$OUT/shards" "$OUT/loop_run" "$OUT/bytes" "$OUT/sample_run" ;;
    memory)
      $tg bench memory configs/gpt2-124m.yaml --set train.batch_size=1 train.lm_head_chunk=4096 \
        train.recompute=true --min-t 32768 --max-t 524288 --predict > "$OUT/record_memory.jsonl" 2>&1
      timeout 600 python3 bench/reference/torch_gpt.py memory 65536 --min-t 32768 > "$OUT/record_torch_memory.jsonl" 2>&1 ;;
    long)
      # The memory picture: PyTorch's series until it runs out of memory, then tilegrad's
      # long-context config with offloaded inputs from 32k to 1M (one step each, about 5 minutes)
      # and the plot with both, in one call.
      timeout 900 python3 bench/reference/torch_gpt.py memory 524288 --min-t 32768 --csv "$OUT/torch_memory.csv" \
        > "$OUT/record_torch_long.jsonl" 2>&1
      $tg bench memory configs/gpt2-124m-long.yaml --set train.offload_activations=true --min-t 32768 \
        --max-t 1048576 --warmup 0 --steps 1 --predict --out "$OUT/memory_long" --torch-csv "$OUT/torch_memory.csv" \
        > "$OUT/record_long.jsonl" 2>&1
      python3 bench/plot_memory.py "$OUT/memory_long" --torch-csv "$OUT/torch_memory.csv" --capacity-gib 140.4 ;;
    masks)
      # Structured attention masks beside FlexAttention (same shapes, same FLOP counting; each
      # FlexAttention shape compiles once, so the shapes are few), then a GPT-2 small step with a
      # 4k window at T = 1M (about 8 minutes in all).
      for m in "--window 1024 --min-t 8192 --max-t 32768" "--window 4096 --min-t 32768 --max-t 32768" \
               "--window 4096 --min-t 131072 --max-t 131072" "--docs 8 --min-t 8192 --max-t 32768" \
               "--window 2048 --docs 4 --min-t 32768 --max-t 32768"; do
        $tg bench attention --causal 1 $m --steps 20 >> "$OUT/record_masks.jsonl" 2>&1
        timeout 600 python3 bench/reference/torch_flex_attention.py $m >> "$OUT/record_torch_masks.jsonl" 2>&1
      done
      $tg bench memory configs/gpt2-124m-long.yaml --set model.attention_window=4096 train.offload_activations=true \
        --min-t 1048576 --max-t 1048576 --warmup 0 --steps 1 --predict > "$OUT/record_window_1m.jsonl" 2>&1 ;;
    scale)
      # Data parallelism on every GPU of the machine (1, 2, 4, 8 as there are): GPT-2 small at
      # 16 × 1024 per GPU, ZeRO-0 and ZeRO-1, grad_accum 1 and 4, under mpirun; PyTorch DDP under
      # torchrun with the same model and batch; the communicator's collectives beside NCCL's own
      # through torch.distributed, at a bucket's size and the whole gradient's. About 2 minutes per
      # world size. NCCL_NVLS_ENABLE=0: the machines' NVLink multicast is off. Every world size,
      # one included, launches its kernels one by one (train.cuda_graph=false: several ranks
      # cannot replay a recorded step), so the efficiency is that of the data parallelism alone.
      export NCCL_NVLS_ENABLE=0
      gpus=$(nvidia-smi -L | wc -l)
      mpi=(mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x PATH)
      for W in 1 2 4 8; do
        [ "$W" -le "$gpus" ] || continue
        for accum in 1 4; do
          for zero in 0 1; do
            timeout 300 "${mpi[@]}" -np "$W" $tg bench train configs/gpt2-124m.yaml --steps 20 --warmup 5 \
              --set train.zero=$zero train.grad_accum=$accum train.cuda_graph=false >> "$OUT/record_scale.jsonl" 2>&1
          done
          timeout 600 python3 -m torch.distributed.run --standalone --nproc_per_node "$W" bench/reference/torch_gpt.py ddp --grad-accum $accum \
            >> "$OUT/record_torch_ddp.jsonl" 2>&1
        done
        if [ "$W" -gt 1 ]; then
          for c in all_reduce reduce_scatter all_gather; do
            timeout 300 "${mpi[@]}" -np "$W" $tg bench allreduce --collective $c >> "$OUT/record_collectives.jsonl" 2>&1
            timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node "$W" bench/reference/torch_allreduce.py --collective $c \
              >> "$OUT/record_torch_collectives.jsonl" 2>&1
          done
        fi
      done
      # Correctness on all the GPUs: losses against one process, bitwise reruns, resumes on fewer.
      if [ "$gpus" -ge 2 ]; then
        g=$((gpus / 2 * 2))
        CONFIG=configs/gpt2-124m.yaml TILEGRAD=$tg OUT="$OUT/scale_check" tools/scale_check.sh "$g" \
          > "$OUT/record_scale_check.md" 2>&1
      fi ;;
    scale_long)
      # Long context with data parallelism: the long-context config at T = LONG_T (default
      # 1,048,576), batch 1 per GPU, on all the machine's GPUs: two steps of tilegrad train on shard
      # files; metrics.jsonl has each step's time and the peak per GPU (about 7 minutes at 1M).
      export NCCL_NVLS_ENABLE=0
      gpus=$(nvidia-smi -L | wc -l)
      T=${LONG_T:-1048576}
      python3 bench/make_shards.py "$OUT/long_shards" --tokens $(( (gpus * 2 + 2) * T )) > /dev/null
      timeout 1500 mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x PATH -np "$gpus" \
        $tg train configs/gpt2-124m-long.yaml --set "data.train=$OUT/long_shards/train_*.bin" \
        "data.val=$OUT/long_shards/train_*.bin" train.seq_len=$T train.offload_activations=true train.max_steps=2 \
        train.warmup_steps=1 run.log_every=1 run.eval_every=0 run.ckpt_every=0 run.sample_every=0 \
        run.out_dir="$OUT/long_dp" > "$OUT/record_long_dp.log" 2>&1
      grep '"type":"train"' "$OUT/long_dp/metrics.jsonl" | sed "s/^{/{\"T\":$T,/" > "$OUT/record_long_dp.jsonl"
      rm -rf "$OUT/long_shards" "$OUT/long_dp" ;;
  esac
done
python3 bench/record_tables.py "$OUT" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
  "$(date -u +%F)" "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" | tee "$OUT/performance_tables.md"
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && find . -type f ! -name performance_tables.md ! -name record_logs.tar.gz -print0 |
    tar czf record_logs.tar.gz --null -T - --remove-files && find . -mindepth 1 -type d -empty -delete)
fi
