"""plot_collectives.py: results/collectives.png from chapter 00's JSON lines (make collectives).

One panel per link (MPI's shared memory, the emulated link) and rank count: bus bandwidth against the
message size, one colour per algorithm, measured as points joined by a line and the alpha-beta model
(with the alpha, beta and gamma that run measured) dashed; the library's own all-reduce in grey. The
latency-bound algorithms (recursive doubling, the tree) lead on the left, the ring on the right: the
crossover is where the lines cross.
usage: plot_collectives.py --out PNG RUN.jsonl ..."""
import argparse
import os
import sys

# run_records.py, the reader of a run's records, lives with make compare's scripts in scripts/compare/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
from run_records import read_run  # noqa: E402

COLOURS = {"ring": "tab:blue", "halving-doubling": "tab:green", "recursive-doubling": "tab:orange",
           "binomial-tree": "tab:red"}


def human(size):
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return "%g %s" % (size, unit)
        size /= 1024.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for path in args.runs:
        rows = read_run(path, kinds=(), lists=("all_reduce",))["all_reduce"]
        if not rows:
            sys.exit("%s: no all_reduce records" % path)
        panels.append(rows)
    links = sorted({rows[0]["link"] for rows in panels}, key=lambda s: (s.startswith("an emulated"), s))
    counts = sorted({rows[0]["ranks"] for rows in panels})
    fig, axes = plt.subplots(len(links), len(counts), figsize=(4.6 * len(counts), 3.8 * len(links)),
                             squeeze=False, sharex=True)
    for rows in panels:
        ax = axes[links.index(rows[0]["link"])][counts.index(rows[0]["ranks"])]
        n = rows[0]["ranks"]
        for name in sorted({r["algorithm"] for r in rows}):
            mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["bytes"])
            sizes = [r["bytes"] for r in mine]
            colour = COLOURS.get(name, "grey")
            ax.plot(sizes, [r["busbw_gbs"] for r in mine], "o-", ms=3, color=colour, label=name + " measured")
            if "modelled_seconds" in mine[0]:
                modelled = [r["bytes"] / r["modelled_seconds"] / 1e9 * 2 * (n - 1) / n if r["modelled_seconds"] > 0
                            else float("nan") for r in mine]
                ax.plot(sizes, modelled, "--", color=colour, lw=1, label=name + " modelled")
        first = rows[0]
        ax.set_title("%d ranks, %s\nalpha %.1f us, beta %.2f GB/s (ping-pong)" %
                     (n, "shared memory" if first["link"].startswith("MPI") else first["link"][3:],
                      first["alpha_s"] * 1e6, 1e-9 / first["beta_s_per_byte"] if first["beta_s_per_byte"] else 0),
                     fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth GB/s")
        ticks = [s for s in sorted({r["bytes"] for r in rows}) if s in (4, 64, 1024, 16384, 262144, 4194304, 67108864)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(s) for s in ticks], fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("All-reduce built from send and receive: bus bandwidth = bytes / time x 2(N-1)/N "
                 "(points measured, dashed the alpha-beta model)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(args.out, dpi=110)
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
