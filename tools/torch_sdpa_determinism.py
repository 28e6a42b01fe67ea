"""Is PyTorch's SDPA backward bitwise reproducible on this GPU, per backend?

tilegrad's default flash backward is deterministic (dQ formed by a separate pass); its opt-in
atomic mode is not. To compare like with like against bench/reference/torch_attention.py, this
runs each backend's backward N times on identical inputs (the benchmark's shape convention,
bf16) and reports, per gradient, how many runs differ bitwise from the first and by how much.

Usage (GPU machine): python3 tools/torch_sdpa_determinism.py [--runs 5]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def backward_grads(q, k, v, do, causal):
    q.grad = k.grad = v.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
    return [t.grad.clone() for t in (q, k, v)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for d, T, causal in ((128, 8192, True), (128, 4096, False), (64, 1024, True)):
        H, B = 2048 // d, max(1, 16384 // T)
        q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
        for name, backend in BACKENDS.items():
            try:
                with sdpa_kernel([backend]):
                    first = backward_grads(q, k, v, do, causal)
                    differing = [0, 0, 0]
                    max_diff = [0.0, 0.0, 0.0]
                    for _ in range(args.runs - 1):
                        again = backward_grads(q, k, v, do, causal)
                        for i, (a, b) in enumerate(zip(first, again)):
                            if not torch.equal(a, b):
                                differing[i] += 1
                                max_diff[i] = max(max_diff[i], (a.float() - b.float()).abs().max().item())
                row = dict(d=d, T=T, causal=causal, backend=name, runs=args.runs,
                           dq_runs_differing=differing[0], dk_runs_differing=differing[1],
                           dv_runs_differing=differing[2], dq_max_abs_diff=max_diff[0],
                           deterministic=sum(differing) == 0)
            except Exception as ex:  # a backend that does not take this shape
                row = dict(d=d, T=T, causal=causal, backend=name, error=str(ex)[:100])
            rows.append(row)
            print(json.dumps(row), flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()
    print("\n| d | T | causal | backend | runs differing from the first (dQ / dK / dV) | max abs dQ diff |")
    for r in rows:
        if "error" not in r:
            print(f"| {r['d']} | {r['T']} | {r['causal']} | {r['backend']} | {r['dq_runs_differing']} / "
                  f"{r['dk_runs_differing']} / {r['dv_runs_differing']} of {r['runs'] - 1} | {r['dq_max_abs_diff']:.3g} |")


if __name__ == "__main__":
    main()
