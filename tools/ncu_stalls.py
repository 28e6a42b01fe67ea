"""Where a warp-specialised kernel's warps wait, instruction by instruction, from ncu's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (a report taken with
`--set full`, whose warp-state sampling counts, per SASS instruction, the samples at which a warp
sat on it) and splits the kernel at its register hand-over: the code after
`USETMAXREG.TRY_ALLOC` (setmaxnreg.inc, sm90_ptx.cuh) up to `USETMAXREG.DEALLOC` is the consumer
warpgroups', the rest the producers'. Prints, per part, the instructions with the most samples,
as a share of the part's samples: a `WARPGROUP.DEPBAR` is a wait for the warpgroup's own
products (wgmma_wait), a branch after `SYNCS.PHASECHK.TRANS64.TRYWAIT` an mbarrier wait, an
`HGMMA` a product the tensor cores have not yet taken.

Then, per part, its samples by loop: each instruction counts towards the innermost loop of at least
--loop-span instructions that holds it (a backward branch to an earlier instruction; not the
out-of-line retry stubs after the last EXIT, whose jumps back into a wait would span half the
kernel). A warp-specialised kernel's consumers have their tile loop(s) inside the item loop: the
item loop's own samples are what an item costs beyond its tiles (its prologue, epilogue, and the
waits at its start), the kernel's own (outside every loop) its start and end.

With --item-loop N, then the N instructions with the most samples among the consumers' outermost
loop's own code (an item's start and end), each with its leading stall reasons where the page has
them (the stall_* columns of a --set full report).

With --raw RAW.csv (`ncu --import REPORT --page raw --csv`), first the kernel's warp-state samples
by stall reason (smsp__pcsamp_warps_issue_stalled_*): what the waits above are, e.g.
`no_instruction` (instruction fetch), `wait` (fixed-latency dependencies), `long_scoreboard`
(global or local memory), `barrier`, `math_pipe_throttle`, `selected` (issuing).

Usage: python3 tools/ncu_stalls.py SOURCE.csv[.gz] [--top 15] [--raw RAW.csv] [--loop-span 32] [--item-loop 10]
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


def opcode(sass):
    """The instruction without its predicate (e.g. "@!P0  ", "@UPT ")."""
    return sass.lstrip("@!UPT0123456789 ")


def branch_target(sass):
    """The address a BRA jumps to (None for other instructions and indirect branches)."""
    op = opcode(sass)
    if not op.startswith("BRA"):
        return None
    for token in op.split()[1:]:
        if token.startswith("0x"):
            return int(token.rstrip(";,"), 16)
    return None


def branch_index(addresses):
    """index(target): the instruction a branch target names, or None. The Address column may hold
    only an address's low hex digits: targets are compared in as many."""
    where = {a: i for i, a in enumerate(addresses)}
    digits = max((len(f"{a:x}") for a in addresses), default=1)
    mask = (1 << (4 * digits)) - 1
    return lambda target: None if target is None else where.get(target & mask)


def homes(sass, index_of):
    """home[i]: the instruction whose code instruction i runs for. The compiler moves the retry
    loops of mbarrier waits out of line, after the kernel's last EXIT: each such stub (from the
    instruction a body branch jumps to, to its unconditional BRA back) counts as the branch's."""
    home = list(range(len(sass)))
    last_exit = max((i for i, s in enumerate(sass) if opcode(s).startswith("EXIT")), default=None)
    if last_exit is None:
        return home, len(sass)
    entered_from = {}
    for i in range(last_exit):
        t = index_of(branch_target(sass[i]))
        if t is not None and t > last_exit:
            entered_from.setdefault(t, i)
    current = None
    for i in range(last_exit + 1, len(sass)):
        current = entered_from.get(i, current)
        if current is not None:
            home[i] = current
        if sass[i].startswith("BRA"):  # unconditional: the stub jumps back
            current = None
    return home, last_exit


def loops_of(sass, index_of, body_end, min_span):
    """(first, last) instruction indices of each loop: a backward branch in the body (before the
    out-of-line stubs) and its target, spanning at least min_span instructions."""
    loops = []
    for i in range(body_end):
        t = index_of(branch_target(sass[i]))
        if t is not None and t <= i and i - t + 1 >= min_span:
            loops.append((t, i))
    return sorted(set(loops))


def innermost(loops, i):
    """The innermost loop holding instruction index i, or None."""
    return min((l for l in loops if l[0] <= i <= l[1]), key=lambda l: l[1] - l[0], default=None)


def print_loops(name, index, counts, addresses, loops, home, min_share=1.0):
    """The part's samples by the innermost loop that holds each instruction (a stub's: its home's)."""
    own = {}
    for i in index:
        key = innermost(loops, home[i])
        own[key] = own.get(key, 0.0) + counts[i]
    part = sum(own.values())
    print(f"{name} by loop (an instruction counts towards the innermost loop holding it):")
    for key in sorted(own, key=lambda k: (k is not None, k or (0, 0))):
        share = 100 * own[key] / max(part, 1)
        if key is None:
            print(f"{share:5.1f} %  outside every loop")
        elif share >= min_share:
            first, last = key
            inner = sum(1 for l in loops if l != key and first <= l[0] and l[1] <= last)
            print(f"{share:5.1f} %  loop {addresses[first]:x}–{addresses[last]:x} ({last - first + 1} instructions"
                  f"{f', around {inner} loop(s)' if inner else ''})")


def print_item_loop(index, counts, addresses, sass, loops, home, reasons, top):
    """The top instructions of the outermost loop's own code (not in a loop nested in it)."""
    outer = max((l for l in loops if any(l[0] <= home[i] <= l[1] for i in index)), key=lambda l: l[1] - l[0], default=None)
    if outer is None:
        return
    own = [i for i in index if innermost(loops, home[i]) == outer]
    part = sum(counts[i] for i in index)
    print(f"the consumers' item loop {addresses[outer[0]]:x}–{addresses[outer[1]]:x}, its own code "
          f"({100 * sum(counts[i] for i in own) / max(part, 1):.1f} % of their samples):")
    for i in sorted(own, key=lambda i: -counts[i])[:top]:
        why = sorted(reasons[i].items(), key=lambda kv: -kv[1])[:2] if reasons else []
        why = "   " + ", ".join(f"{k} {100 * v / max(sum(reasons[i].values()), 1):.0f} %" for k, v in why if v > 0) if why else ""
        stub = f" (retry stub of {addresses[home[i]]:x})" if home[i] != i else ""
        print(f"{100 * counts[i] / max(part, 1):5.2f} %  {addresses[i]:x}  {sass[i][:60]}{stub}{why}")


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
    parser.add_argument("--item-loop", type=int, default=0,
                        help="the top instructions of the consumers' item loop's own code (default 0: none)")
    parser.add_argument("--loop-span", type=int, default=32,
                        help="the fewest instructions a loop spans to be reported on its own (default 32)")
    args = parser.parse_args()
    if args.raw:
        print_stall_reasons(args.raw, args.top)
    header, rows = read_rows(args.csv)
    src, samples = column(header, "Source"), column(header, "Warp Stall Sampling (All")
    addr = column(header, "Address")
    sass = [r[src].strip() for r in rows]
    addresses = [int(r[addr].strip(), 16) for r in rows]
    index_of = branch_index(addresses)
    home, body_end = homes(sass, index_of)
    loops = loops_of(sass, index_of, body_end, args.loop_span)
    counts = [number(r[samples]) for r in rows]
    stall_columns = [(i, name[len("stall_"):]) for i, name in enumerate(header)
                     if name.startswith("stall_") and "(Not" not in name]
    reasons = [{name: number(r[i]) for i, name in stall_columns} for r in rows] if stall_columns else None
    begin = next((i for i, s in enumerate(sass) if "USETMAXREG.TRY_ALLOC" in s), None)
    end = next((i for i, s in enumerate(sass) if "USETMAXREG.DEALLOC" in s), None)
    if begin is None or end is None:
        parts = {"kernel": range(len(rows))}
    else:  # by the home instruction: a stub goes with the wait that enters it
        consumer = (lambda h: begin <= h < end) if begin < end else (lambda h: h >= begin)  # else: producers first
        parts = {"consumers": [i for i in range(len(rows)) if consumer(home[i])],
                 "producers": [i for i in range(len(rows)) if not consumer(home[i])]}
    total = sum(counts)
    print(f"{len(rows)} instructions, {total:.0f} samples")
    for name, index in parts.items():
        part = sum(counts[i] for i in index)
        print(f"\n{name}: {part:.0f} samples ({100 * part / max(total, 1):.0f} %)")
        for i in sorted(index, key=lambda i: -counts[i])[:args.top]:
            # The instruction before a stalled branch says what the branch waits on.
            context = f"   after: {sass[i - 1][:60]}" if opcode(sass[i]).startswith("BRA") and i > 0 else ""
            print(f"{100 * counts[i] / max(part, 1):5.1f} %  {sass[i][:70]}{context}")
        if loops:
            print_loops(name, index, counts, addresses, loops, home)
            if args.item_loop and name == "consumers":
                print_item_loop(index, counts, addresses, sass, loops, home, reasons, args.item_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
