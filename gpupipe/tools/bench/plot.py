"""images/s against the worker count: one line per loader, one panel per transform set.

``plot(results, path)`` draws one or more result documents of ``gpupipe bench``
(the ``--json`` output); ``python -m gpupipe.tools.bench.plot a.json b.json -o out.png``
draws saved ones together. Bars span the min and max of the rounds; points are medians.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

__all__ = ["plot", "main"]

_STYLE = {"gpupipe": ("C0", "o"), "baseline": ("C1", "s"), "webdataset": ("C2", "^"), "dali": ("C3", "D")}


def _rows(docs: Iterable[dict]) -> list[dict]:
    return [row for doc in docs for row in doc["results"]]


def plot(docs: dict | list[dict], path: str, title: str | None = None) -> str:
    """Write the PNG (matplotlib, Agg) and return ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows([docs] if isinstance(docs, dict) else docs)
    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.4), squeeze=False, dpi=90)
    for ax, name in zip(axes[0], sets):
        mine = [r for r in rows if r["set"] == name]
        for loader in dict.fromkeys(r["loader"] for r in mine):
            pts = sorted((r["workers"], r["images_per_s"], r["images_per_s_min"], r["images_per_s_max"])
                         for r in mine if r["loader"] == loader)
            x, y, lo, hi = zip(*pts)
            colour, marker = _STYLE.get(loader, (None, "x"))
            ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo)], [c - a for a, c in zip(y, hi)]], label=loader,
                        color=colour, marker=marker, capsize=3, linewidth=1.5, markersize=5)
        ax.set_title(f"{name} set")
        ax.set_xlabel("num_workers")
        ax.set_xticks(sorted({r["workers"] for r in mine}))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("images/s")
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpupipe.tools.bench.plot", description=__doc__)
    ap.add_argument("json", nargs="+", help="result files written by gpupipe bench --json")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--title")
    args = ap.parse_args(argv)
    docs = []
    for p in args.json:
        with open(p) as f:
            docs.append(json.load(f))
    print(plot(docs, args.out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
