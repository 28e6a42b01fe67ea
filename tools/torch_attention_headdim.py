"""PyTorch's SDPA backends at a head dim bench/reference/torch_attention.py does not
cover (it runs 64 and 128), with that script's protocol: the FlashAttention shape convention (B·T = 16384,
hidden 2048, so 64 heads at d 32), T 1k–32k, causal and not; forward = median of 20 timed calls
after 5 warm-ups, backward = median of 10 forward+backward calls after 3 warm-ups minus the
forward; FLOPs 4·B·H·T²·d (halved when causal), backward 2.5× that. Prints one JSON line per
(shape, backend), as the reference does, for `tilegrad bench attention --head-dim D` beside it.

Usage (GPU machine): python3 tools/torch_attention_headdim.py [--d 32] [--max-t 32768]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, iters=20, warm=5):  # as the reference benchmark times
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--max-t", type=int, default=32768)
    args = ap.parse_args()
    d, H = args.d, 2048 // args.d
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    T = 1024
    while T <= args.max_t:
        B = max(1, 16384 // T)
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
            flops = 4 * B * H * T * T * d / (2 if causal else 1)
            for name, be in backends.items():
                try:
                    with sdpa_kernel([be]):
                        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        tf = bench(f)

                        def fb():
                            q.grad = k.grad = v.grad = None
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)

                        tfb = bench(fb, iters=10, warm=3)
                    tb = tfb - tf
                    r = dict(d=d, T=T, B=B, H=H, causal=causal, backend=name, fwd_ms=tf, bwd_ms=tb,
                             fwd_tflops=flops / tf / 1e9, bwd_tflops=2.5 * flops / tb / 1e9 if tb > 0 else None)
                except Exception as ex:  # a backend without a kernel for this shape
                    r = dict(d=d, T=T, B=B, H=H, causal=causal, backend=name, error=str(ex)[:80])
                print(json.dumps(r), flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
        T *= 2


if __name__ == "__main__":
    main()
