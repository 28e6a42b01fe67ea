"""Where a warp-specialised kernel's warps wait, instruction by instruction, from ncu's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (a report taken with
`--set full`, whose warp-state sampling counts, per SASS instruction, the samples at which a warp
sat on it) and splits the kernel at its register hand-over: the code after
`USETMAXREG.TRY_ALLOC` (setmaxnreg.inc, wgmma.cuh) up to `USETMAXREG.DEALLOC` is the consumer
warpgroups', the rest the producers'. Prints, per part, the instructions with the most samples,
as a share of the part's samples: a `WARPGROUP.DEPBAR` is a wait for the warpgroup's own
products (wgmma_wait), a branch after `SYNCS.PHASECHK.TRANS64.TRYWAIT` an mbarrier wait, an
`HGMMA` a product the tensor cores have not yet taken.

With --raw RAW.csv (`ncu --import REPORT --page raw --csv`), first the kernel's warp-state samples
by stall reason (smsp__pcsamp_warps_issue_stalled_*): what the waits above are, e.g.
`no_instruction` (instruction fetch), `wait` (fixed-latency dependencies), `long_scoreboard`
(global or local memory), `barrier`, `math_pipe_throttle`, `selected` (issuing).

Usage: python3 tools/ncu_stalls.py SOURCE.csv[.gz] [--top 15] [--raw RAW.csv]
"""
import argparse
import csv
import gzip
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # ncu prints a line naming the kernel before the table's header.
    for i, row in enumerate(rows):
        if any(cell.strip() == "Address" for cell in row):
            header = [cell.strip() for cell in row]
            return header, [r for r in rows[i + 1:] if len(r) == len(header)]
    raise SystemExit(f"{path}: no 'Address' column; expected `ncu --page source --csv --print-source sass` output")


def column(header, prefix):
    for i, name in enumerate(header):
        if name.startswith(prefix):
            return i
    raise SystemExit(f"no column starting with '{prefix}' (columns: {', '.join(header)}); "
                     "the report needs --set full (warp-state sampling)")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def print_stall_reasons(path, top):
    """The kernel's warp-state samples per stall reason, from ncu's raw page (one kernel)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    head = next((i for i, r in enumerate(rows) if any(c.startswith("smsp__pcsamp_warps_issue_stalled_") for c in r)), None)
    if head is None or head + 2 >= len(rows):
        print(f"{path}: no smsp__pcsamp_warps_issue_stalled_* metrics (a --set full report is needed)")
        return
    names, values = rows[head], rows[head + 2]  # the row after the names holds the units
    prefix = "smsp__pcsamp_warps_issue_stalled_"
    reasons = {n[len(prefix):]: number(v) for n, v in zip(names, values)
               if n.startswith(prefix) and not n.endswith("_not_issued")}
    total = sum(reasons.values())
    print(f"stall reasons, all warps ({total:.0f} samples):", ", ".join(
        f"{k} {100 * v / max(total, 1):.1f} %" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:top]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--raw", help="ncu --page raw --csv of the same report: the stall reasons first")
    args = parser.parse_args()
    if args.raw:
        print_stall_reasons(args.raw, args.top)
    header, rows = read_rows(args.csv)
    src, samples = column(header, "Source"), column(header, "Warp Stall Sampling (All")
    sass = [r[src].strip() for r in rows]
    counts = [number(r[samples]) for r in rows]
    begin = next((i for i, s in enumerate(sass) if "USETMAXREG.TRY_ALLOC" in s), None)
    end = next((i for i, s in enumerate(sass) if "USETMAXREG.DEALLOC" in s), None)
    if begin is None or end is None:
        parts = {"kernel": range(len(rows))}
    elif begin < end:
        parts = {"consumers": range(begin, end), "producers": [*range(begin), *range(end, len(rows))]}
    else:  # the producers' branch laid out first
        parts = {"consumers": [*range(begin, len(rows))], "producers": range(begin)}
    total = sum(counts)
    print(f"{len(rows)} instructions, {total:.0f} samples")
    for name, index in parts.items():
        part = sum(counts[i] for i in index)
        print(f"\n{name}: {part:.0f} samples ({100 * part / max(total, 1):.0f} %)")
        for i in sorted(index, key=lambda i: -counts[i])[:args.top]:
            # The instruction before a stalled branch says what the branch waits on.
            context = f"   after: {sass[i - 1][:60]}" if sass[i].lstrip("@!P0123456789 ").startswith("BRA") and i > 0 else ""
            print(f"{100 * counts[i] / max(part, 1):5.1f} %  {sass[i][:70]}{context}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
