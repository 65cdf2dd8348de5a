"""`build.py history`: every release's stored bench results for an image, side by side.

The answer to "did it get faster or slower since the last image?" without digging out old
result files: releases oldest to newest on the x axis, one line per concurrency level,
output tok/s and TTFT p50 in two panels, and the drafter's acceptance rate in a third when
any release has one (a collapse shows there while tok/s at c=1 hides it), `latest` marked,
releases that were rolled back (the repository's rollbacks record) crossed out, flagged
(untrusted) figures drawn hollow. A markdown table holds the same numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.bench import acceptance, store, trust
from imagebuild.bench.plot import from_zero, series_style
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import list_releases


@dataclass(frozen=True)
class Figures:
    tok_s: float
    ttft_p50_ms: float | None
    flags: tuple[str, ...] = ()  # codes of the level's trust flags
    acceptance: float | None = None  # accepted / drafted tokens (None: none to trust)
    mean_length: float | None = None  # tokens per draft round


@dataclass
class Point:
    tag: str
    is_latest: bool
    rolled_back: bool  # on the repository's rollbacks record (release/rollbacks.py)
    passed: bool
    levels: dict[int, Figures] = field(default_factory=dict)  # empty: no stored results


@dataclass
class History:
    repo: str
    points: list[Point]  # oldest first

    def as_json(self) -> dict[str, Any]:
        """`history --format json`: each release, newest first (as `releases`), with its
        figures per concurrency level (the words of the table: smoke passed or not)."""
        return {"repository": self.repo, "releases": [
            {"tag": p.tag, "latest": p.is_latest, "rolled_back": p.rolled_back,
             "smoke": "passed" if p.passed else "not passed",
             "levels": {str(c): {"tok_s": f.tok_s, "ttft_p50_ms": f.ttft_p50_ms,
                                 "acceptance": f.acceptance, "mean_length": f.mean_length,
                                 "untrusted": list(f.flags)} for c, f in p.levels.items()}}
            for p in reversed(self.points)]}

    @property
    def speculative(self) -> bool:
        """Whether any release has acceptance figures (a plain cell's never do)."""
        return any(f.acceptance is not None for p in self.points for f in p.levels.values())

    @property
    def concurrency(self) -> list[int]:
        return sorted({c for p in self.points for c in p.levels})

    def series(self, c: int, what: str) -> list[float]:
        """One value per release for level c (NaN where it has none): a plotted line."""
        out = []
        for p in self.points:
            f = p.levels.get(c)
            v = None if f is None else getattr(f, what)
            out.append(math.nan if v is None else float(v))
        return out


def figures(doc: dict[str, Any]) -> dict[int, Figures]:
    flagged = trust.untrusted(doc)
    out = {}
    for lv in doc.get("levels", []):
        acc, _why = acceptance.level_acceptance(lv)  # a restarted server's: none
        out[int(lv["concurrency"])] = Figures(
            float(lv["output_tok_s"]), (lv.get("ttft_ms") or {}).get("median"),
            tuple(f["code"] for f in flagged.get(int(lv["concurrency"]), [])),
            acc.rate if acc else None, acc.mean_length if acc else None)
    return out


def gather(client: RegistryClient, repo: str, rolled_back: Collection[str] = ()) -> History:
    """Every release of repo, oldest first; `rolled_back`: the tags the repository's
    rollbacks record holds (release/rollbacks.py reads it: the caller passes it, so a
    release reads "rolled back" here exactly where `releases` and the notes say so)."""
    rels = sorted(list_releases(client, repo),
                  key=lambda r: r.release_tag.sort_key())  # type: ignore[union-attr]
    points = []
    for r in rels:
        found = store.stored(client, repo, r.tag)
        points.append(Point(r.tag, r.is_latest, r.tag in rolled_back, r.passed,
                            figures(found.doc) if found else {}))
    return History(repo, points)


def _label(p: Point) -> str:
    return p.tag + (" (latest)" if p.is_latest else "") + (" (rolled back)" if p.rolled_back
                                                           else "")


def figure(h: History) -> Any:
    """The matplotlib Figure: left tok/s, right TTFT p50, one line per level."""
    import matplotlib  # deferred: matplotlib, optional and slow

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib, optional and slow

    xs = list(range(len(h.points)))
    panels = [("tok_s", "output tok/s (aggregate)"), ("ttft_p50_ms", "TTFT p50 (ms)")]
    if h.speculative:
        panels.append(("acceptance", "drafter acceptance (accepted / drafted)"))
    fig, axes = plt.subplots(1, len(panels),
                             figsize=(max(4.5 * len(panels), 2.2 * len(xs) + 4), 4.6))
    for ax, (what, ylabel) in zip(axes, panels, strict=True):
        for i, c in enumerate(h.concurrency):
            ys = h.series(c, what)
            (line,) = ax.plot(xs, ys, label=f"c={c}", gid=f"c={c}", color=f"C{i}",
                              **series_style(i))
            bad = [(x, y) for x, y, p in zip(xs, ys, h.points, strict=True)
                   if p.levels.get(c) and p.levels[c].flags and what != "acceptance"]
            if bad:  # untrusted figures: hollow, so nobody reads them as equals
                ax.plot(*zip(*bad, strict=True), linestyle="none", marker="o", markersize=11,
                        markerfacecolor="white", markeredgecolor=line.get_color())
        for x, p in zip(xs, h.points, strict=True):
            if p.is_latest:
                ax.axvspan(x - 0.3, x + 0.3, color="gold", alpha=0.25)
            if p.rolled_back:
                ax.axvspan(x - 0.3, x + 0.3, color="tab:red", alpha=0.10, hatch="//")
        ax.set_xticks(xs, [_label(p) for p in h.points], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_xlim(-0.5, len(xs) - 0.5)
        from_zero(ax, top=1.0 if what == "acceptance" else None)
        ax.legend(fontsize=8, title="concurrency", title_fontsize=8)
    fig.suptitle(f"{h.repo}: every release (yellow: latest, red: rolled back from; "
                 "hollow: untrusted figures)", fontsize=10)
    fig.tight_layout()
    return fig


def plot(h: History, out: Path) -> Path:
    import matplotlib.pyplot as plt  # deferred: matplotlib, optional and slow

    fig = figure(h)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(h: History, png: str | None = None) -> str:
    cs = h.concurrency
    head = ["release", "smoke"] + [f"c={c} tok/s" for c in cs] + [f"c={c} TTFT p50 ms"
                                                                  for c in cs]
    if h.speculative:
        head += [f"c={c} acceptance" for c in cs]
    rows = [f"## Bench history of {h.repo}", ""]
    if png:
        rows += [f"![tok/s and TTFT per release]({png})", ""]
    rows += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def cell(p: Point, c: int, what: str) -> str:
        f = p.levels.get(c)
        v = None if f is None else getattr(f, what)
        if v is None:
            return "-"
        if what == "acceptance" and f is not None:  # server counters: timing flags aside
            return f"{v:.2f} ({f.mean_length:.2f})"
        return f"{v:,.1f}" + (" (untrusted)" if f and f.flags else "")

    for p in reversed(h.points):  # newest first, as `build.py releases`
        name = f"**{p.tag}** (latest)" if p.is_latest else p.tag
        if p.rolled_back:
            name += " (rolled back)"
        rows.append("| " + " | ".join(
            [name, "passed" if p.passed else "not passed"]
            + [cell(p, c, "tok_s") for c in cs] + [cell(p, c, "ttft_p50_ms") for c in cs]
            + ([cell(p, c, "acceptance") for c in cs] if h.speculative else [])) + " |")
    if not h.points:
        rows.append("_no releases_")
    return "\n".join(rows) + "\n"


def file_stem(repo: str) -> str:
    return "history-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", repo.rsplit("/", 1)[-1])


def write(h: History, out_dir: Path, url_base: str = "") -> dict[str, Path]:
    """history-<image>.png and .md (the markdown links the PNG at url_base + name)."""
    stem = file_stem(h.repo)
    png = plot(h, out_dir / f"{stem}.png")
    md = out_dir / f"{stem}.md"
    md.write_text(markdown(h, url_base + png.name))
    return {"png": png, "md": md}
