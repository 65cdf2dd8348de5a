"""The PNG: output tok/s and TTFT p50 against concurrency, one line per release; levels
whose figures are flagged as untrusted are drawn hollow."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(runs: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    import matplotlib  # imported here: only `bench` needs it

    matplotlib.use("Agg")  # no display; deterministic file output
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for doc in runs:
        levels = sorted(doc["levels"], key=lambda lv: lv["concurrency"])
        cs = [lv["concurrency"] for lv in levels]
        label = str(doc["image"].get("label") or doc["image"].get("tag")
                    or doc["image"].get("ref"))
        for ax, ys in ((ax_tps, [lv["output_tok_s"] for lv in levels]),
                       (ax_ttft, [(lv["ttft_ms"] or {}).get("median") for lv in levels])):
            (line,) = ax.plot(cs, ys, marker="o", label=label)
            bad = [(c, y) for c, y, lv in zip(cs, ys, levels, strict=True)
                   if lv.get("flags") and y is not None]
            if bad:  # untrusted figures (bench/trust.py): hollow, never read as equals
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker="o", markersize=11,
                        markerfacecolor="white", markeredgecolor=line.get_color(),
                        label=f"{label}: untrusted")
    for ax, ylabel in ((ax_tps, "output tok/s (aggregate)"), (ax_ttft, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if runs:
        hw = runs[0]["hardware"]["model"]
        fig.suptitle(title or f"imagebuild bench - {hw}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
