"""Turns bench/record.sh's JSON-line logs into docs/performance.md's tables.

    python3 bench/record_tables.py LOG_DIR MACHINE DATE COMMIT

Reads record_*.jsonl from LOG_DIR (lines that are not JSON are skipped) and prints Markdown:
GPT-2 small throughput beside torch.compile and eager, attention TFLOP/s ranges beside
PyTorch's FlashAttention-2 and cuDNN backends, peak memory against T beside SDPA flash (and the
long-context config's beside PyTorch's series up to T = 1M), the training loop and sampling, and
the structured masks beside FlexAttention with the 4k-window step at T = 1M, and data
parallelism on several GPUs beside PyTorch DDP with the collectives beside NCCL's own.
"""
import json
import os
import sys


def rows(log_dir, name):
    path = os.path.join(log_dir, name)
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def span(values, fmt="{:.2f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if abs(hi - lo) < 1e-9 else (fmt + "–" + fmt).format(lo, hi)


def times(ratios):
    return span(ratios) + "×" if ratios else "—"


def train_table(d):
    tg = [r for r in rows(d, "record_train.jsonl") if r.get("bench") == "train"]
    chunked = [r for r in rows(d, "record_train_chunked.jsonl") if r.get("bench") == "train"]
    chunked8192 = [r for r in rows(d, "record_train_chunked8192.jsonl") if r.get("bench") == "train"]
    launched = [r for r in rows(d, "record_train_launched.jsonl") if r.get("bench") == "train"]
    torch = {r.get("variant"): r for r in rows(d, "record_torch_train.jsonl") if r.get("bench") == "torch_train"}
    if not tg:
        return ""
    t = tg[0]
    lines = ["| run | tokens/s | peak memory | ratio |", "|---|---|---|---|",
             f"| tilegrad | {t['tokens_per_s']:,.0f} | {t['peak_gib']:.2f} GiB | |"]
    for variant, label in (("compile", "PyTorch, torch.compile"), ("eager", "PyTorch, eager")):
        if variant in torch:
            r = torch[variant]
            lines.append(f"| {label} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.2f} GiB | "
                         f"{t['tokens_per_s'] / r['tokens_per_s']:.3f}× |")
    compiled = torch.get("compile")
    for extra, label in ((chunked8192, "tilegrad, `train.lm_head_chunk=8192`"),
                         (chunked, "tilegrad, `train.lm_head_chunk=4096`"),
                         (launched, "tilegrad, kernels launched one by one (`train.cuda_graph=false`)")):
        if extra:
            c = extra[0]
            ratio = f"{c['tokens_per_s'] / compiled['tokens_per_s']:.3f}× compiled" if compiled else ""
            lines.append(f"| {label} | {c['tokens_per_s']:,.0f} | {c['peak_gib']:.2f} GiB | {ratio} |")
    return "\n".join(lines)


def attention_table(d):
    tg = [r for r in rows(d, "record_attention.jsonl") if r.get("bench") == "attention"]
    ref = {(r["d"], r["T"], r["causal"], r["backend"]): r
           for r in rows(d, "record_torch_attention.jsonl") if "backend" in r and "error" not in r}
    if not tg:
        return ""
    lines = ["| what | tilegrad TFLOP/s | vs FlashAttention-2 | vs cuDNN |", "|---|---|---|---|"]
    for causal in (False, True):
        for key, label in (("fwd_tflops", "forward"), ("bwd_tflops", "backward")):
            for hd in (64, 128):
                mine = [r for r in tg if r["d"] == hd and r["causal"] == causal]
                ratios = {}
                for backend in ("flash", "cudnn"):
                    ratios[backend] = [r[key] / ref[(hd, r["T"], causal, backend)][key] for r in mine
                                       if (hd, r["T"], causal, backend) in ref and ref[(hd, r["T"], causal, backend)].get(key)]
                lines.append(f"| {label}, d {hd}, {'causal' if causal else 'non-causal'}, T "
                             f"{min(r['T'] for r in mine)}–{max(r['T'] for r in mine)} | "
                             f"{span([r[key] for r in mine], '{:.0f}')} | {times(ratios['flash'])} | "
                             f"{times(ratios['cudnn'])} |")
    return "\n".join(lines)


def peak_cell(r, seconds=False):
    """A memory row's cell: its peak and step time (ms, or s with `seconds`), or out of memory."""
    if r is None:
        return ""
    if r.get("oom"):
        return "out of memory"
    step = f"{r['ms_per_step'] / 1e3:,.1f} s" if seconds else f"{r['ms_per_step']:,.0f} ms"
    return f"{r['peak_gib']:.2f} GiB, {step}"


def memory_table(d):
    tg = {r["T"]: r for r in rows(d, "record_memory.jsonl") if r.get("bench") == "memory"}
    torch = {}
    for r in rows(d, "record_torch_memory.jsonl"):
        if r.get("bench") == "torch_memory":
            torch[(r["series"], r["T"])] = r
    if not tg:
        return ""
    lines = ["| T | tilegrad (chunked head + recompute) | PyTorch SDPA flash | PyTorch SDPA flash + checkpointing |",
             "|---|---|---|---|"]

    for T in sorted(tg):
        lines.append(f"| {T:,} | {peak_cell(tg[T])} | {peak_cell(torch.get(('sdpa_flash', T)))} | "
                     f"{peak_cell(torch.get(('sdpa_flash_ckpt', T)))} |")
    return "\n".join(lines)


def long_table(d):
    """The long-context config (offloaded inputs) measured and predicted, beside PyTorch's three
    series from the same call (RECORD=long)."""
    tg = {r["T"]: r for r in rows(d, "record_long.jsonl") if r.get("bench") == "memory"}
    torch = {(r["series"], r["T"]): r for r in rows(d, "record_torch_long.jsonl") if r.get("bench") == "torch_memory"}
    if not tg:
        return ""
    lines = ["| T | tilegrad `gpt2-124m-long.yaml` + offload: measured | predicted | s/step | "
             "PyTorch SDPA flash | PyTorch SDPA flash + checkpointing | PyTorch materialised |",
             "|---|---|---|---|---|---|---|"]

    for T in sorted(set(tg) | {T for _, T in torch}):
        r = tg.get(T)
        measured = "" if r is None else "out of memory" if r.get("oom") else f"{r['peak_gib']:.3f} GiB"
        predicted = f"{r['predicted_peak_gib']:.3f} GiB" if r and "predicted_peak_gib" in r else ""
        step = f"{r['ms_per_step'] / 1e3:,.1f}" if r and "ms_per_step" in r else ""
        lines.append(f"| {T:,} | {measured} | {predicted} | {step} | {peak_cell(torch.get(('sdpa_flash', T)), True)} | "
                     f"{peak_cell(torch.get(('sdpa_flash_ckpt', T)), True)} | "
                     f"{peak_cell(torch.get(('materialised', T)), True)} |")
    return "\n".join(lines)


def masks_table(d):
    """Windowed and document-masked attention beside FlexAttention (RECORD=masks): times, the
    ratio flex / tilegrad (above 1: tilegrad faster), TF/s on the visible pairs against tilegrad's
    own full causal TF/s at the same shape, and the 4k-window GPT-2 small step at T = 1M."""
    tg = [r for r in rows(d, "record_masks.jsonl") if r.get("bench") == "attention" and "window" in r]
    flex = {(r["window"], r["docs"], r["d"], r["T"]): r for r in rows(d, "record_torch_masks.jsonl")
            if r.get("impl") == "flex" and "error" not in r}
    lines = []
    if tg:
        lines += ["| window | docs | d | T | tilegrad fwd / bwd ms | FlexAttention fwd / bwd ms | vs Flex fwd / bwd | "
                  "TF/s fwd / bwd (visible pairs) | of own causal TF/s fwd / bwd | time vs full causal fwd / bwd |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in tg:
            f = flex.get((r["window"], r["docs"], r["d"], r["T"]))
            vs = f"{f['fwd_ms'] / r['fwd_ms']:.2f}× / {f['bwd_ms'] / r['bwd_ms']:.2f}×" if f else "—"
            fl = f"{f['fwd_ms']:.3f} / {f['bwd_ms']:.3f}" if f else "—"
            lines.append(f"| {r['window'] or '—'} | {r['docs'] or '—'} | {r['d']} | {r['T']:,} | "
                         f"{r['fwd_ms']:.3f} / {r['bwd_ms']:.3f} | {fl} | {vs} | "
                         f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f} | "
                         f"{r['fwd_tflops'] / r['causal_fwd_tflops']:.2f} / {r['bwd_tflops'] / r['causal_bwd_tflops']:.2f} | "
                         f"{r['fwd_ms'] / r['causal_fwd_ms']:.3f} / {r['bwd_ms'] / r['causal_bwd_ms']:.3f} |")
    step = [r for r in rows(d, "record_window_1m.jsonl") if r.get("bench") == "memory" and "peak_gib" in r]
    if step:
        r = step[0]
        if lines:
            lines.append("")
        lines += ["| GPT-2 small, `gpt2-124m-long.yaml`, window 4096 | T | peak | predicted | s/step |", "|---|---|---|---|---|",
                  f"| one training step (offloaded inputs) | {r['T']:,} | {r['peak_gib']:.3f} GiB | "
                  f"{r.get('predicted_peak_gib', float('nan')):.3f} GiB | {r['ms_per_step'] / 1e3:,.1f} |"]
    return "\n".join(lines)


def scale_table(d):
    """RECORD=scale: tokens/s on W GPUs (ZeRO-0/1, grad_accum 1/4), the efficiency against one GPU
    of the same settings in the same call, beside PyTorch DDP; then the collectives' bus
    bandwidth beside NCCL's own through torch.distributed."""
    tg = [r for r in rows(d, "record_scale.jsonl") if r.get("bench") == "train_data_parallel"]
    ddp = {(r["world"], r["grad_accum"]): r for r in rows(d, "record_torch_ddp.jsonl") if r.get("bench") == "torch_ddp"}
    lines = []
    if tg:
        one = {(r["zero"], r["grad_accum"]): r["tokens_per_s_total"] for r in tg if r["world_size"] == 1}
        lines += ["| GPUs | ZeRO | grad_accum | tokens/s | speed-up (efficiency) | peak GiB per GPU | comm not hidden | "
                  "PyTorch DDP tokens/s | vs DDP |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(tg, key=lambda r: (r["grad_accum"], r["zero"], r["world_size"])):
            W, base = r["world_size"], one.get((r["zero"], r["grad_accum"]))
            up = f"{r['tokens_per_s_total'] / base:.2f}× ({r['tokens_per_s_total'] / base / W:.1%})" if base else "—"
            t = ddp.get((W, r["grad_accum"]))
            vs = (f"{t['tokens_per_s_total']:,.0f} | {r['tokens_per_s_total'] / t['tokens_per_s_total']:.3f}× |"
                  if t else "— | — |")
            lines.append(f"| {W} | {r['zero']} | {r['grad_accum']} | {r['tokens_per_s_total']:,.0f} | {up} | "
                         f"{r['peak_gib_per_rank']:.2f} | {r['comm_exposed_ms']:.2f} ms | {vs}")
    check = os.path.join(d, "record_scale_check.md")
    if os.path.exists(check):  # tools/scale_check.sh's table
        if lines:
            lines.append("")
        lines += [line.rstrip() for line in open(check) if line.startswith("|")]
    long_dp = [r for r in rows(d, "record_long_dp.jsonl") if r.get("type") == "train"]
    if long_dp:  # RECORD=scale_long: the last step (the first includes start-up work)
        r = long_dp[-1]
        if lines:
            lines.append("")
        lines += ["| long context, batch 1 per GPU | GPUs | T | s/step | tokens/s | peak per GPU (rank 0) | comm not hidden |",
                  "|---|---|---|---|---|---|---|",
                  f"| `gpt2-124m-long.yaml` + offload | {r['world_size']} | {r['T']:,} | {r['ms_per_step'] / 1e3:,.1f} | "
                  f"{r['tokens_per_s']:,.0f} | {r['peak_bytes'] / 2**30:.2f} GiB | {r.get('comm_exposed_ms', 0):.1f} ms |"]
    mine = [r for r in rows(d, "record_collectives.jsonl") if r.get("bench") == "collective"]
    ref = {(r["collective"], r["world_size"], r["bytes"]): r for r in rows(d, "record_torch_collectives.jsonl")
           if r.get("bench") == "collective"}
    if mine:
        if lines:
            lines.append("")
        lines += ["| collective | GPUs | MiB | tilegrad bus GB/s | NCCL (torch.distributed) bus GB/s | ratio |",
                  "|---|---|---|---|---|---|"]
        for r in mine:
            t = ref.get((r["collective"], r["world_size"], r["bytes"]))
            lines.append(f"| {r['collective']} | {r['world_size']} | {r['bytes'] / 2**20:,.1f} | {r['busbw_gbs']:.1f} | "
                         + (f"{t['busbw_gbs']:.1f} | {r['busbw_gbs'] / t['busbw_gbs']:.3f} |" if t else "— | — |"))
    return "\n".join(lines)


def loop_table(d):
    """tilegrad train's tokens/s on shard files (the log windows after the first) beside bench
    train's, and sampling's tokens/s with and without the key/value cache."""
    windows = [r for r in rows(d, "record_loop_metrics.jsonl") if r.get("type") == "train"][1:]
    bench = [r for r in rows(d, "record_loop_bench.jsonl") if r.get("bench") == "train"]
    lines = []
    if windows and bench:
        train = sum(r["tokens_per_s"] for r in windows) / len(windows)
        b = bench[0]["tokens_per_s"]
        lines += ["| run | tokens/s | ratio |", "|---|---|---|",
                  f"| `tilegrad bench train` (random tokens, no data loading) | {b:,.0f} | |",
                  f"| `tilegrad train` on shard files, steps 21–120 | {train:,.0f} | {train / b:.3f}× |"]
    sample = {}
    path = os.path.join(d, "record_sample.log")
    if os.path.exists(path):
        for line in open(path):
            words = line.split()
            if len(words) >= 8 and words[0] == "sampled":
                sample["cache" if "cache" in line else "none"] = (int(words[1]), float(words[4]), float(words[6][1:]))
    if "cache" in sample and "none" in sample:
        n, _, with_cache = sample["cache"]
        _, _, without = sample["none"]
        if lines:
            lines.append("")
        lines += ["| sampling, greedy, GPT-2 small (byte vocabulary) | tokens/s | ratio |", "|---|---|---|",
                  f"| {n} tokens, no cache (`--no-kv-cache`) | {without:,.1f} | |",
                  f"| {n} tokens, key/value cache | {with_cache:,.1f} | {with_cache / without:.2f}× |"]
    return "\n".join(lines)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    log_dir, machine, date, commit = sys.argv[1:]
    header = f"{machine}, {date}, commit {commit}."
    for title, table in (("GPT-2 small training", train_table(log_dir)), ("Attention", attention_table(log_dir)),
                         ("Peak memory against sequence length", memory_table(log_dir)),
                         ("Long context beside PyTorch", long_table(log_dir)),
                         ("Structured attention masks", masks_table(log_dir)),
                         ("Data parallelism on several GPUs", scale_table(log_dir)),
                         ("The training loop and sampling", loop_table(log_dir))):
        if table:
            print(f"## {title}\n\n{header}\n\n{table}\n")


if __name__ == "__main__":
    main()
