"""PyTorch FlexAttention with the structured masks of `tilegrad bench attention --window W --docs N`.

The reference those masked shapes are compared against: torch.nn.attention.flex_attention
(compiled with torch.compile) with a causal sliding window of W keys and/or N equal documents per
row, its block mask from create_block_mask, beside SDPA's FlashAttention-2 backend on the same
shape's full causal attention. Shapes as torch_attention.py: head dims 64 and 128 (hidden 2048),
T = 1k … 32k with B·T = 16384 tokens. FLOPs as tilegrad counts them: 4·H·d per visible (query,
key) pair, counted exactly from lo(i) = max(doc_start(i), i − W + 1), backward 2.5 × forward (the
full causal row: 4·B·H·T²·d / 2). Timing: CUDA events, the median of 20 forward calls after 5
untimed ones and of 10 forward + backward calls after 3; backward = (forward + backward) − forward.

    python3 bench/reference/torch_flex_attention.py --window 1024 --docs 4 [--head-dim 64] [--max-t 32768]

Prints one JSON line per (head dim, T, implementation), then a Markdown table.
"""
import argparse
import json

from torch_attention import median_ms


def doc_len(T, docs):
    return -(-T // docs) if docs > 0 else 0  # ceil: N equal documents, the last one shorter


def visible_pairs(B, T, window, docs):
    """Σ over rows and queries of i − lo(i) + 1 (the same for every row)."""
    L = doc_len(T, docs)
    total = 0
    for i in range(T):
        lo = (i // L) * L if docs > 0 else 0
        if window > 0:
            lo = max(lo, i - window + 1)
        total += i - lo + 1
    return B * total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--docs", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=0, help="64 or 128; 0: both")
    ap.add_argument("--min-t", type=int, default=1024)
    ap.add_argument("--max-t", type=int, default=32768)
    args = ap.parse_args()
    if args.window <= 0 and args.docs <= 0:
        ap.error("give --window W and/or --docs N")
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import torch._dynamo
    # One compilation per (shape, mask): more than dynamo's default limit of 8, past which it would
    # fall back to the eager flex_attention (which materialises the scores) and time that instead.
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for d in (64, 128):
        if args.head_dim and d != args.head_dim:
            continue
        H = 2048 // d
        T = 1024
        while T <= args.max_t:
            if T < args.min_t:
                T *= 2
                continue
            B = max(1, 16384 // T)
            W, L = args.window, doc_len(T, args.docs)

            def mask_mod(b, h, q_idx, kv_idx):
                keep = kv_idx <= q_idx
                if W > 0:
                    keep = keep & (q_idx - kv_idx < W)
                if L > 0:
                    keep = keep & (q_idx // L == kv_idx // L)
                return keep

            # Compiled, so that the T×T mask is evaluated block by block rather than materialised.
            try:
                block_mask = create_block_mask(mask_mod, None, None, T, T, device="cuda", _compile=True)
            except TypeError:  # a release without the keyword
                block_mask = torch.compile(create_block_mask)(mask_mod, None, None, T, T, device="cuda")
            q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
            masked_flops = 4 * H * d * visible_pairs(B, T, W, args.docs)
            causal_flops = 4 * B * H * T * T * d / 2

            def run(impl):
                if impl == "flex":
                    return flex(q, k, v, block_mask=block_mask)
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            for impl, flops in (("sdpa_flash_causal", causal_flops), ("flex", masked_flops)):
                def forward_backward():
                    q.grad = k.grad = v.grad = None
                    run(impl).backward(do)

                row = dict(d=d, T=T, B=B, H=H, window=W, docs=args.docs, impl=impl)
                try:
                    fwd = median_ms(lambda: run(impl), 20, 5)
                    fwd_bwd = median_ms(forward_backward, 10, 3)
                    bwd = fwd_bwd - fwd
                    row.update(fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9,
                               bwd_tflops=2.5 * flops / bwd / 1e9 if bwd > 0 else None)
                except Exception as e:  # e.g. out of memory
                    row.update(error=str(e)[:100])
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v, do, block_mask
            torch.cuda.empty_cache()
            T *= 2
    print("\n| d | T | window | docs | impl | fwd ms | bwd ms | fwd TF/s | bwd TF/s |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" not in r:
            print(f"| {r['d']} | {r['T']} | {r['window']} | {r['docs']} | {r['impl']} | {r['fwd_ms']:.3f} | "
                  f"{r['bwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {r['bwd_tflops'] or 0:.0f} |")


if __name__ == "__main__":
    main()
