"""The PNG: output tok/s and TTFT p50 against concurrency, one line per release (and one
for its plain twin, the same image measured without speculation), and the drafter's
acceptance rate when a run has one; levels whose figures are flagged as untrusted are
drawn hollow (acceptance is the server's own count: timing flags aside)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from imagebuild.bench import acceptance, results


def plot(runs: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """One line per run and, dashed in its colour, one for its plain twin if it has one."""
    import matplotlib  # deferred: matplotlib, optional and slow

    matplotlib.use("Agg")  # no display; deterministic file output
    import matplotlib.pyplot as plt  # deferred: matplotlib, optional and slow

    speculative = any(acceptance.speculative(doc) for doc in runs)
    fig, axes = plt.subplots(1, 3 if speculative else 2, figsize=(16 if speculative else 11,
                                                                  4.2))
    ax_tps, ax_ttft = axes[0], axes[1]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lines = [(run, colors[i % len(colors)], style) for i, doc in enumerate(runs)
             for run, style in ((doc, "-"), (results.plain_run(doc), "--")) if run is not None]
    for doc, color, style in lines:
        levels = sorted(doc["levels"], key=lambda lv: lv["concurrency"])
        cs = [lv["concurrency"] for lv in levels]
        label = str(doc["image"].get("label") or doc["image"].get("tag")
                    or doc["image"].get("ref"))
        if speculative and acceptance.speculative(doc):
            rates = [acc.rate if (acc := acceptance.level_acceptance(lv)[0]) else None
                     for lv in levels]
            axes[2].plot(cs, [math.nan if r is None else r for r in rates], marker="o",
                         label=label, color=color)
        for ax, ys in ((ax_tps, [lv["output_tok_s"] for lv in levels]),
                       (ax_ttft, [(lv["ttft_ms"] or {}).get("median") for lv in levels])):
            ax.plot(cs, ys, marker="o", label=label, color=color, linestyle=style)
            bad = [(c, y) for c, y, lv in zip(cs, ys, levels, strict=True)
                   if lv.get("flags") and y is not None]
            if bad:  # untrusted figures (bench/trust.py): hollow, never read as equals
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker="o", markersize=11,
                        markerfacecolor="white", markeredgecolor=color,
                        label=f"{label}: untrusted")
    labels = ["output tok/s (aggregate)", "TTFT p50 (ms)"] + (
        ["drafter acceptance (accepted / drafted)"] if speculative else [])
    for ax, ylabel in zip(axes, labels, strict=True):
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
