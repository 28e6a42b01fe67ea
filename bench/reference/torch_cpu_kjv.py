"""The CPU reference for tilegrad's default run: nanoGPT's CPU model (4 layers, 4 heads, d 128,
T 64, batch 12, byte vocabulary, learned positions, tanh GELU, LM head tied to the embedding) on
a text file, trained with PyTorch on the CPU: AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1),
100 warmup steps, cosine decay to a tenth; the last 1 % of the bytes is the validation split.

    /usr/bin/python3 bench/reference/torch_cpu_kjv.py TEXT [ITERS=2000] [THREADS=2]

Started by mpirun with several ranks it trains with DistributedDataParallel (gloo, buckets of
25 MiB, rank 0's address 127.0.0.1: one node), each rank on batches of its own, as
bench/cpu_data_parallel.sh runs it. (Debian's torchrun does not start under Python 3.11.)

Needs Debian's python3-torch and libopenblas-dev. Prints the loss and validation loss every 500
steps and, last, "params … iters … time …s tokens/s N" with N over all ranks
(bench/cpu_vs_torch.sh reads that line).
"""
import math
import os
import sys
import time


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    text = open(sys.argv[1], "rb").read()
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    torch.manual_seed(1337 + rank)  # each rank its own batches; DDP gives every rank rank 0's weights
    L, H, D, T, B, V = 4, 4, 128, 64, 12, 256
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(0.99 * len(data))
    train, val = data[:split], data[split:]

    def batch(d):
        starts = torch.randint(len(d) - T - 1, (B,))
        return torch.stack([d[i:i + T] for i in starts]), torch.stack([d[i + 1:i + T + 1] for i in starts])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // H)
            causal = torch.ones(t, t, dtype=torch.bool).triu(1)
            y = (scores.masked_fill(causal, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
            self.blocks = nn.Sequential(*[Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(D)

        def forward(self, x, y):
            h = self.ln_f(self.blocks(self.wte(x) + self.wpe(torch.arange(x.shape[1]))))
            return F.cross_entropy((h @ self.wte.weight.T).view(-1, V), y.view(-1))

    model = GPT()
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    net = model
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ.get('TORCH_PORT', '29511')}",
                                rank=rank, world_size=world)
        net = DistributedDataParallel(model, bucket_cap_mb=25)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))

    @torch.no_grad()
    def evaluate():
        model.eval()
        loss = sum(model(*batch(val)).item() for _ in range(50)) / 50
        model.train()
        return loss

    # The clock starts after the first steps (allocations, thread start-up), as build/cpu_train's
    # does after its warm-up, and stops while the validation loss is computed.
    start = min(10, iters)
    t0, eval_seconds = time.time(), 0.0
    for it in range(iters + 1):
        if it == start:
            t0 = time.time()
        lr = 1e-3 * min(1, (it + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(it, iters) / iters)))
        for group in opt.param_groups:
            group["lr"] = lr
        loss = net(*batch(train))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 500 == 0 and rank == 0:
            t_eval = time.time()
            val_loss = evaluate()
            if it >= start:
                eval_seconds += time.time() - t_eval
            print(f"iter {it} loss {loss.item():.3f} val {val_loss:.3f} {time.time() - t0:.1f}s", flush=True)
    seconds = time.time() - t0 - eval_seconds
    if rank == 0:
        timed = iters + 1 - start
        print(f"params {sum(p.numel() for p in model.parameters())} iters {iters} time {seconds:.1f}s "
              f"tokens/s {world * timed * B * T / seconds:.0f}")


if __name__ == "__main__":
    main()
