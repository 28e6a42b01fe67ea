#!/usr/bin/env python3
"""PyTorch reference for tilegrad's GPT benchmarks: GPT-2 small trained the way a PyTorch user writes it.

The model is nanoGPT's GPT-2 small (12 layers, 12 heads, d 768, vocabulary 50257, learned
positions, pre-LN blocks, tanh GELU, biases, LM head tied to the token embedding, causal
F.scaled_dot_product_attention), trained on random tokens with bf16 autocast, fused AdamW
(lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the 2-D weights) and the gradient norm
clipped at 1.0. TF32 matmuls are on. Each subcommand prints one JSON line per measurement;
"tflops" counts nanoGPT's 6·N + 12·L·d·T FLOPs per token (N: parameters without the position table).

  python3 bench/reference/torch_gpt.py throughput [--batch 16] [--seq 1024] [--steps 20] [--warmup 5] [--compile both]
      training ms/step, tokens/s and peak memory (torch.cuda.max_memory_allocated), eager and torch.compile
  python3 bench/reference/torch_gpt.py memory MAX_T [--min-t 1024] [--csv FILE]
      peak memory and time of one batch-1 training step for T = min-t, 2·min-t, ... up to MAX_T, three
      series: materialised softmax(QK^T) attention, SDPA restricted to its flash backend, and flash
      with torch.utils.checkpoint per block; a series ends at its first out-of-memory
  NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node N bench/reference/torch_gpt.py ddp [--batch 16] [--seq 1024] \\
      [--grad-accum 1] [--compile 0] [--bucket-mb 25]
      DistributedDataParallel over NCCL on N GPUs: total and per-GPU tokens/s ("tflops" is per GPU)

This is the reference that `tilegrad bench train` and `tilegrad bench memory` are compared against:
run both in the same call on the same GPU and report tilegrad's figure as a ratio to this one's.
tilegrad's configs/gpt2-124m.yaml pads the vocabulary to 50304; `--vocab 50304` matches it.
Set PYTHONUNBUFFERED=1 to see each line as it is measured.
"""
import argparse
import contextlib
import csv
import gc
import json
import math
import os
import time

N_LAYER, N_HEAD, D_MODEL = 12, 12, 768


def gpt(vocab, seq, attention="sdpa", checkpoint=False):
    """GPT-2 small on the current CUDA device, positions for `seq` tokens. attention: "sdpa" (causal
    F.scaled_dot_product_attention) or "materialised" (softmax of the masked T×T scores, then @ V);
    checkpoint: recompute each block in the backward (torch.utils.checkpoint, non-reentrant)."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint as recompute

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.c_attn, self.attn_proj = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
            self.c_fc, self.mlp_proj = nn.Linear(D_MODEL, 4 * D_MODEL), nn.Linear(4 * D_MODEL, D_MODEL)

        def forward(self, x, future):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
            if future is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // N_HEAD)
                y = F.softmax(att.masked_fill(future, float("-inf")), dim=-1) @ v
            x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, D_MODEL), nn.Embedding(seq, D_MODEL)
            self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
            self.ln_f = nn.LayerNorm(D_MODEL)
            self.lm_head = nn.Linear(D_MODEL, vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            # True above the diagonal: the positions a token may not attend to.
            future = torch.ones(seq, seq, dtype=torch.bool).triu(1) if attention == "materialised" else None
            self.register_buffer("future", future, persistent=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
                if name.endswith("_proj.weight"):
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * N_LAYER))

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for block in self.h:
                x = recompute(block, x, self.future, use_reentrant=False) if checkpoint else block(x, self.future)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    with torch.device("cuda"):
        return GPT()


def setup():
    import torch
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    return torch


def adamw(model):
    import torch
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def flops_per_token(model, T):
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * N_LAYER * D_MODEL * T


def random_batches(n, B, T, vocab, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    tokens = lambda: torch.randint(0, vocab, (B, T), device="cuda", generator=g)
    return [(tokens(), tokens()) for _ in range(n)]


def train_step(model, opt, batches, no_sync=None):
    """One optimizer step over the micro-batches; no_sync (DDP's) skips the all-reduce of all but the last."""
    import torch
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1
        with contextlib.nullcontext() if no_sync is None or last else no_sync():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            (loss / len(batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def seconds_per_step(step, warmup, steps, sync):
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def peak_gib():
    import torch
    return torch.cuda.max_memory_allocated() / 2**30


def emit(**fields):
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in fields.items()}), flush=True)


def throughput(args):
    torch = setup()
    for compiled in {"0": [False], "1": [True], "both": [False, True]}[args.compile]:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = gpt(args.vocab, args.seq)
        opt = adamw(model)
        run = torch.compile(model) if compiled else model
        batches = random_batches(1, args.batch, args.seq, args.vocab, seed=0)
        dt = seconds_per_step(lambda: train_step(run, opt, batches), args.warmup, args.steps, torch.cuda.synchronize)
        tps = args.batch * args.seq / dt
        emit(bench="torch_train", variant="compile" if compiled else "eager", B=args.batch, T=args.seq,
             params=sum(p.numel() for p in model.parameters()), ms_per_step=dt * 1e3, tokens_per_s=tps,
             tflops=flops_per_token(model, args.seq) * tps / 1e12, peak_gib=peak_gib())
        del model, opt, run, batches


def memory_step(torch, T, vocab, attention, checkpoint):
    """Seconds and peak GiB of one batch-1 training step (after one untimed), and FLOPs per token."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    gc.collect()  # frees what a previous out-of-memory step left behind
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = gpt(vocab, T, "materialised" if attention == "materialised" else "sdpa", checkpoint)
    opt = adamw(model)
    batches = random_batches(1, 1, T, vocab, seed=0)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if attention == "flash" else contextlib.nullcontext():
        dt = seconds_per_step(lambda: train_step(model, opt, batches), 1, 1, torch.cuda.synchronize)
    return dt, peak_gib(), flops_per_token(model, T)


def memory(args):
    torch = setup()
    series = (("materialised", "materialised", False), ("sdpa_flash", "flash", False), ("sdpa_flash_ckpt", "flash", True))
    with open(args.csv, "w", newline="") if args.csv else contextlib.nullcontext() as f:
        table = csv.writer(f, lineterminator="\n") if f else None
        if table:
            table.writerow(["series", "T", "peak_gib", "ms"])
        for name, attention, checkpoint in series:
            T = args.min_t
            while T <= args.max_t:
                try:
                    dt, peak, flops = memory_step(torch, T, args.vocab, attention, checkpoint)
                except torch.cuda.OutOfMemoryError:
                    emit(bench="torch_memory", series=name, B=1, T=T, oom=True)
                    break
                emit(bench="torch_memory", series=name, B=1, T=T, ms_per_step=dt * 1e3, peak_gib=peak,
                     tflops=flops * T / dt / 1e12)
                if table:
                    table.writerow([name, T, f"{peak:.3f}", f"{dt * 1e3:.1f}"])
                    f.flush()
                T *= 2


def ddp(args):
    torch = setup()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = gpt(args.vocab, args.seq)  # same seed on every rank; DDP also broadcasts rank 0's weights
    ddp_model = DDP(model, device_ids=[local_rank], bucket_cap_mb=args.bucket_mb)
    run = torch.compile(ddp_model) if args.compile else ddp_model
    opt = adamw(model)
    batches = random_batches(args.grad_accum, args.batch, args.seq, args.vocab, seed=rank)

    def sync():
        torch.cuda.synchronize()
        dist.barrier()

    step = lambda: train_step(run, opt, batches, ddp_model.no_sync)
    dt = seconds_per_step(step, args.warmup, args.steps, sync)
    tokens = args.batch * args.seq * args.grad_accum
    if rank == 0:
        emit(bench="torch_ddp", world=world, B=args.batch, T=args.seq, grad_accum=args.grad_accum,
             compile=args.compile, ms_per_step=dt * 1e3, tokens_per_s_total=world * tokens / dt,
             tokens_per_s_per_gpu=tokens / dt, tflops=flops_per_token(model, args.seq) * tokens / dt / 1e12,
             peak_gib_rank0=peak_gib())
    dist.destroy_process_group()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throughput", help="training tokens/s and peak memory, eager and torch.compile")
    m = sub.add_parser("memory", help="peak memory and step time of one batch-1 step against T")
    d = sub.add_parser("ddp", help="DistributedDataParallel tokens/s (launch with torchrun)")
    for s in (t, d):
        s.add_argument("--batch", type=int, default=16, help="sequences per micro-batch (per GPU)")
        s.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
        s.add_argument("--steps", type=int, default=20, help="timed steps")
        s.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    t.add_argument("--compile", choices=["0", "1", "both"], default="both", help="eager (0), torch.compile (1) or both")
    m.add_argument("max_t", metavar="MAX_T", type=int, help="longest sequence length")
    m.add_argument("--min-t", type=int, default=1024, help="shortest sequence length (doubled up to MAX_T)")
    m.add_argument("--csv", metavar="FILE", help="also write series,T,peak_gib,ms rows here")
    d.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    d.add_argument("--compile", type=int, choices=[0, 1], default=0, help="torch.compile the DDP model")
    d.add_argument("--bucket-mb", type=int, default=25, help="DDP gradient bucket size, MiB")
    for s in (t, m, d):
        s.add_argument("--vocab", type=int, default=50304, help="vocabulary size (50304: tilegrad's gpt2-124m)")
    return p.parse_args()


if __name__ == "__main__":
    args = parse_args()
    {"throughput": throughput, "memory": memory, "ddp": ddp}[args.command](args)
