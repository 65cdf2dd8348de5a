"""The PNG: output tok/s and TTFT p50 against concurrency, one line per release (and one
for its plain twin, the same image measured without speculation, in its run's colour,
dashed), and the drafter's acceptance rate when a run has one; levels whose figures are
flagged as untrusted are drawn hollow (acceptance is the server's own count: timing flags
aside).

Read at a glance: concurrency ticks are the levels measured, written as plain numbers
(spaced by powers of two, so c=1 and c=8 stay apart); every y-axis starts at zero, so a
2 % difference looks like one; each series has its own marker, line style and size, the
later ones drawn smaller on top, so two runs with equal figures both stay visible."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from imagebuild.bench import acceptance, results


def plot(runs: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    import matplotlib.pyplot as plt  # deferred: matplotlib, optional and slow

    fig = figure(runs, title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def figure(runs: list[dict[str, Any]], title: str = "") -> Any:
    """The matplotlib Figure of `runs` (this run first, then e.g. its baseline), each
    followed by its plain twin when it has one."""
    import matplotlib  # deferred: matplotlib, optional and slow

    matplotlib.use("Agg")  # no display; deterministic file output
    import matplotlib.pyplot as plt  # deferred: matplotlib, optional and slow

    speculative = any(acceptance.speculative(doc) for doc in runs)
    levels_seen: set[int] = set()
    fig, axes = plt.subplots(1, 3 if speculative else 2, figsize=(16 if speculative else 11,
                                                                  4.2))
    ax_tps, ax_ttft = axes[0], axes[1]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = [(run, colors[i % len(colors)], twin) for i, doc in enumerate(runs)
              for run, twin in ((doc, False), (results.plain_run(doc), True))
              if run is not None]
    for i, (doc, color, twin) in enumerate(series):
        levels = sorted(doc["levels"], key=lambda lv: lv["concurrency"])
        cs = [lv["concurrency"] for lv in levels]
        levels_seen.update(cs)
        style = {**series_style(i), "color": color, **({"linestyle": "--"} if twin else {})}
        label = str(doc["image"].get("label") or doc["image"].get("tag")
                    or doc["image"].get("ref"))
        if speculative and acceptance.speculative(doc):
            rates = [acc.rate if (acc := acceptance.level_acceptance(lv)[0]) else None
                     for lv in levels]
            axes[2].plot(cs, [math.nan if r is None else r for r in rates], label=label,
                         **style)
        for ax, ys in ((ax_tps, [lv["output_tok_s"] for lv in levels]),
                       (ax_ttft, [(lv["ttft_ms"] or {}).get("median") for lv in levels])):
            (line,) = ax.plot(cs, ys, label=label, **style)
            bad = [(c, y) for c, y, lv in zip(cs, ys, levels, strict=True)
                   if lv.get("flags") and y is not None]
            if bad:  # untrusted figures (bench/trust.py): hollow, never read as equals
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker="o", markersize=11,
                        markerfacecolor="white", markeredgecolor=line.get_color(),
                        label=f"{label}: untrusted")
    labels = ["output tok/s (aggregate)", "TTFT p50 (ms)"] + (
        ["drafter acceptance (accepted / drafted)"] if speculative else [])
    for ax, ylabel in zip(axes, labels, strict=True):
        concurrency_axis(ax, sorted(levels_seen))
        ax.set_ylabel(ylabel)
        from_zero(ax, top=1.0 if ylabel.startswith("drafter") else None)
        ax.legend(fontsize=8)
    if runs:
        hw = runs[0]["hardware"]["model"]
        fig.suptitle(title or f"imagebuild bench - {hw}", fontsize=10)
    fig.tight_layout()
    return fig


MARKERS = ("o", "s", "^", "D", "v", "P")
LINES = ("-", "--", "-.", ":")


def series_style(i: int) -> dict[str, Any]:
    """Series i's look: its own marker and line style, smaller and above the ones before,
    so equal figures of two series never hide one of them."""
    return {"marker": MARKERS[i % len(MARKERS)], "linestyle": LINES[i % len(LINES)],
            "markersize": max(9 - 2 * i, 4), "zorder": 3 + i}


def concurrency_axis(ax: Any, levels: list[int]) -> None:
    """Ticks at the measured levels, labelled 1, 8, 32 (never 2^0, 2^3, 2^5)."""
    from matplotlib import ticker  # deferred: matplotlib, optional and slow

    if levels and min(levels) > 0:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(levels))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("concurrency")


def from_zero(ax: Any, top: float | None = None) -> None:
    """The y-axis from zero (and to `top` when the quantity has one, e.g. a rate)."""
    _low, high = ax.get_ylim()
    ax.set_ylim(0, top if top is not None else max(high, 1e-9) * 1.05)
    ax.grid(True, alpha=0.3)
