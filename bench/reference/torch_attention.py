"""PyTorch's scaled_dot_product_attention backends on this GPU: forward and backward TFLOP/s in bf16.

The reference `tilegrad bench attention --protocol reference` is compared against (ratio in the
same call on the same GPU): FlashAttention-2 ("flash"), cuDNN, memory-efficient and math backends at
head dims 64 and 128 (hidden 2048, so 32 or 16 heads), T = 1k … 32k with B·T = 16384 tokens, causal
and not. FLOPs follow the FlashAttention papers: forward 4·B·H·T²·d (halved when causal), backward
2.5 × forward. Timing: CUDA events, the median of 20 forward calls after 5 untimed ones, and the
median of 10 forward + backward calls after 3 untimed ones; backward = (forward + backward) − forward.

    PYTHONUNBUFFERED=1 python3 bench/reference/torch_attention.py    # about two minutes on an H200

Prints one JSON line per (head dim, T, causal, backend), then a Markdown table.
"""
import json
import sys


def median_ms(fn, iters, warm):
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure(q, k, v, do, causal, backend):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def forward_backward():
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)

        fwd = median_ms(forward, 20, 5)
        fwd_bwd = median_ms(forward_backward, 10, 3)
    return fwd, fwd_bwd


def main():
    if len(sys.argv) > 1:
        print(__doc__)
        return
    import torch
    from torch.nn.attention import SDPBackend
    torch.backends.cuda.matmul.allow_tf32 = True
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    rows = []
    for d in (64, 128):
        H = 2048 // d
        for T in (1024, 2048, 4096, 8192, 16384, 32768):
            B = max(1, 16384 // T)
            for causal in (False, True):
                q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                do = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
                flops = 4 * B * H * T * T * d / (2 if causal else 1)
                for name, backend in backends.items():
                    if name == "math" and T > 8192:  # the T×T scores no longer fit
                        continue
                    row = dict(d=d, T=T, B=B, H=H, causal=causal, backend=name)
                    try:
                        fwd, fwd_bwd = measure(q, k, v, do, causal, backend)
                        bwd = fwd_bwd - fwd
                        row.update(fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9,
                                   bwd_tflops=2.5 * flops / bwd / 1e9 if bwd > 0 else None,
                                   fwdbwd_tflops=3.5 * flops / fwd_bwd / 1e9)
                    except Exception as e:  # a backend that does not support the shape
                        row.update(error=str(e)[:100])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()
    print("\n| d | T | causal | backend | fwd TF/s | bwd TF/s | fwd+bwd TF/s |\n|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print(f"| {r['d']} | {r['T']} | {r['causal']} | {r['backend']} | {r['fwd_tflops']:.0f} | "
                  f"{r['bwd_tflops'] or 0:.0f} | {r['fwdbwd_tflops']:.0f} |")


if __name__ == "__main__":
    main()
