"""One forward and one backward of PyTorch's SDPA per backend, inside a profiler range.

For timing PyTorch's attention kernels with ncu under the same conditions as tilegrad's (the same
clocks, the same call): bench/reference/torch_attention.py times whole calls with CUDA events in a
long run, where the H200's power cap lowers the clocks by an amount that depends on what ran
before; ncu times each kernel alone. Each backend runs warm-up passes first, then one forward and
one backward between cudaProfilerStart and cudaProfilerStop, so that

    ncu --profile-from-start off --metrics gpu__time_duration.sum python3 tools/torch_sdpa_once.py

profiles exactly those kernels (the order printed on stdout says which backend's they are).
The shape convention is the FlashAttention papers' (the reference benchmark's): B·T =
16384, hidden 2048.

Usage (GPU machine): python3 tools/torch_sdpa_once.py [--T 8192] [--d 128] [--causal 1]
                     [--backends cudnn,flash]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)
    parser.add_argument("--backends", default="cudnn,flash")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    T, d, causal = args.T, args.d, bool(args.causal)
    B, H = max(1, 16384 // T), 2048 // d
    flops = 4 * B * H * T * T * d / (2 if causal else 1)
    cudart = torch.cuda.cudart()
    for name in args.backends.split(","):
        if name not in BACKENDS:
            raise SystemExit(f"unknown backend '{name}'; available: {', '.join(BACKENDS)}")
        q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
        with sdpa_kernel([BACKENDS[name]]):
            def step():
                q.grad = k.grad = v.grad = None
                F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
            for _ in range(args.warmup):
                step()
            torch.cuda.synchronize()
            cudart.cudaProfilerStart()
            step()
            torch.cuda.synchronize()
            cudart.cudaProfilerStop()
        print(f"profiled: backend {name}, B {B} T {T} H {H} d {d} causal {causal}, "
              f"forward {flops:.4e} FLOP, backward {2.5 * flops:.4e} FLOP", flush=True)


if __name__ == "__main__":
    main()
