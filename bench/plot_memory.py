#!/usr/bin/env python3
"""memory.png from `tilegrad bench memory --out DIR`'s memory.csv with matplotlib, for a machine
without gnuplot (tilegrad draws the same picture with gnuplot where it is installed).

  python3 bench/plot_memory.py DIR [--torch-csv FILE] [--capacity-gib G] [--out FILE]

Left: peak memory against T on log-log axes, a line per series (measured points, predicted
dashes), PyTorch's series from bench/reference/torch_gpt.py memory (its --csv file or its JSON
lines), the device capacity across. Right: the breakdown by category at each series' largest
measured T (its largest predicted one where nothing was measured).
"""
import argparse
import csv
import json
import os

GIB = 2**30
CATEGORIES = ("params", "grads", "optimizer", "activations", "workspace")


def read_torch(path):
    points = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("oom") or "peak_gib" not in r:
                    continue
                series, T, peak = r["series"], int(r["T"]), float(r["peak_gib"])
            else:
                cells = line.split(",")
                if cells[0] == "series":
                    continue
                series, T, peak = cells[0], int(cells[1]), float(cells[2])
            points.setdefault(series, []).append((T, peak))
    return points


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="the folder with memory.csv")
    p.add_argument("--torch-csv", help="PyTorch's series (torch_gpt.py memory --csv file or JSON lines)")
    p.add_argument("--capacity-gib", type=float, help="draw the device capacity across, e.g. 139.8 for an H200")
    p.add_argument("--out", help="output image (default DIR/memory.png)")
    args = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(args.dir, "memory.csv")) as f:
        rows = list(csv.DictReader(f))
    series = list(dict.fromkeys(r["series"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    for i, s in enumerate(series):
        mine = [r for r in rows if r["series"] == s]
        color = f"C{i}"
        measured = [(int(r["T"]), int(r["measured_peak_bytes"]) / GIB) for r in mine if r["status"] == "measured"]
        if measured:
            left.plot(*zip(*measured), "o-", color=color, lw=2, label=f"{s} (measured)")
        left.plot([int(r["T"]) for r in mine], [int(r["predicted_peak_bytes"]) / GIB for r in mine], "--", color=color,
                  label=f"{s} (predicted)")
    if args.torch_csv:
        for j, (s, pts) in enumerate(read_torch(args.torch_csv).items()):
            left.plot(*zip(*sorted(pts)), "s-", color=f"C{len(series) + j}", label=f"PyTorch {s}")
    if args.capacity_gib:
        left.axhline(args.capacity_gib, color="black", lw=2, label="device capacity")
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    from matplotlib.ticker import FuncFormatter
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v):,}"))
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    left.set_xlabel("sequence length T (tokens)")
    left.set_ylabel("peak memory (GiB)")
    left.set_title("Peak memory of one training step")
    left.grid(True, which="both", alpha=0.3)
    left.legend(loc="upper left", fontsize=8)

    labels, stacks = [], []
    for s in series:
        # The largest measured T, or the largest predicted one where nothing was measured.
        done = [r for r in rows if r["series"] == s and r["status"] == "measured"] or \
               [r for r in rows if r["series"] == s and r["status"] == "predicted"]
        if not done:
            continue
        last = done[-1]
        run = last["status"] == "measured"
        labels.append(f"{s}\nT {last['T']}" + ("" if run else " (predicted)"))
        stacks.append([int(last[(c if run else "predicted_" + c) + "_bytes"] or 0) / GIB for c in CATEGORIES])
    bottom = [0.0] * len(stacks)
    for k, c in enumerate(CATEGORIES):
        values = [st[k] for st in stacks]
        right.bar(labels, values, bottom=bottom, label=c, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_ylabel("GiB")
    right.set_title("Peak by category at the largest measured T")
    right.legend(loc="upper left")
    out = args.out or os.path.join(args.dir, "memory.png")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
