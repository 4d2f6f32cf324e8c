"""Seed 000 from Python: fork() of a private anonymous mapping written in mTHP folios of each
size, per-PTE against batched (the `fork_pte_batch` tunable), with the fork call's own counters
(`Session.run(...)["counters"]`, the same as `Session.last_counters()`) and its time.

Prints one line per folio size; with matplotlib installed it also plots time and batches per
folio size (PNG, --out); without it, the table alone.

    python3 crates/python/examples/fork_sweep.py [--size 16M] [--reps 5] [--out fork_sweep.png]

Needs the `usermm` module: `pip install ./crates/python` (see the README).
"""

import argparse
import statistics
import time

import usermm

FOLIOS = ["4K", "16K", "32K", "64K", "128K", "256K", "512K", "1M", "2M"]
VARIANTS = ["per-pte", "batched"]


def fork_once(folio, size, batching):
    """(seconds, counters) of one fork of `size` bytes written in `folio` folios."""
    s = usermm.Session(tunables={"fork_pte_batch": batching}, validate=False)
    policy = "top=never" if folio == "4K" else "top=never %s=always" % folio
    s.run("set thp %s\np0 = spawn\n"
          "a = p0 mmap %s rw private anon fixed 0x40000000\n"
          "p0 write a %s pattern=0x5a" % (policy, size, size))
    if folio == "2M":
        # PTE-map the THPs (one subpage's protection changed per 2 MiB), as seed 000 does:
        # fork copies a PMD-mapped THP with one entry.
        n = int(size[:-1]) * (1024 if size.endswith("G") else 1) // 2
        s.run("\n".join("p0 mprotect a+%dM 4K r" % (2 * i) for i in range(n)))
    t = time.perf_counter()
    r = s.run("p1 = p0 fork")
    return time.perf_counter() - t, r["counters"]


def main():
    ap = argparse.ArgumentParser(description="fork() time and counters per folio size, per-PTE vs batched")
    ap.add_argument("--size", default="16M", help="the mapping (M or G), default 16M")
    ap.add_argument("--reps", type=int, default=5, help="forks per cell (the median is shown)")
    ap.add_argument("--out", default="fork_sweep.png", help="the plot, if matplotlib is installed")
    args = ap.parse_args()
    if not args.size.endswith(("M", "G")):
        ap.error("--size must end in M or G")

    rows = []
    for folio in FOLIOS:
        row = {"folio": folio}
        for v in VARIANTS:
            runs = [fork_once(folio, args.size, v) for _ in range(max(1, args.reps))]
            row[v + "_ms"] = statistics.median(t for t, _ in runs) * 1e3
            row[v] = runs[0][1]
        rows.append(row)

    print("%-6s %12s %12s %10s %18s %18s" % ("folio", "per-pte ms", "batched ms", "fork_ptes",
                                             "fork_batches/pte", "fork_batches/batch"))
    for r in rows:
        print("%-6s %12.3f %12.3f %10d %18d %18d" % (
            r["folio"], r["per-pte_ms"], r["batched_ms"], r["batched"].get("fork_ptes", 0),
            r["per-pte"].get("fork_batches", 0), r["batched"].get("fork_batches", 0)))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: table only")
        return
    x = range(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for v in VARIANTS:
        ax1.plot(x, [r[v + "_ms"] for r in rows], marker="o", label=v)
        ax2.plot(x, [r[v].get("fork_batches", 0) for r in rows], marker="o", label=v)
    for ax, title in ((ax1, "fork() time, ms (median)"), (ax2, "fork_batches (exact)")):
        ax.set_xticks(list(x))
        ax.set_xticklabels([r["folio"] for r in rows])
        ax.set_xlabel("folio size")
        ax.set_title(title)
        ax.legend()
    ax2.set_yscale("log")
    fig.suptitle("usermm: fork of %s, per-PTE vs batched (seed 000)" % args.size)
    fig.tight_layout()
    fig.savefig(args.out)
    print("plot:", args.out)


if __name__ == "__main__":
    main()
