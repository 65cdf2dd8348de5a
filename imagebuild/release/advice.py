"""Which cell of an image family to deploy at each concurrency level, from the release's
stored bench results: a section of the compatibility table and of the release notes.

A family is the cells that serve one model on one target with one engine and differ in
drafter and profile (DFlash, MTP, ngram, plain serving). At each bench level the
candidates are each cell as it ships and each speculating cell's plain twin (the same
image benched right after without `--speculative-config`, bench/command.py
`bench_image`), or a plain cell of the family. The advice names the fastest candidate by
output tok/s, by how much it beats the runner-up, and the drafters' acceptance that
explains it: vLLM's own counters per level (acceptance rate: accepted / drafted tokens;
mean accepted length: tokens per verification step, bench/acceptance.py). It flags a
drafter that is slower than plain serving at every level compared (on the public GB10
figures DFlash beats MTP at c=1 only: a drafter can pay at one load and not another).

Figures that cannot be trusted (bench/trust.py flags, failed requests, results measured
with other settings or on other hardware than the family's first) are named and never
pick a winner or lose to one; a level with fewer than two trusted figures has no winner.
Pure: it reads the results documents it is given (release/compat.py gathers them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from imagebuild.bench import acceptance
from imagebuild.spec.config import NO_SPECULATION

PLAIN = "plain serving"


@dataclass(frozen=True)
class Member:
    """One cell of the release and the bench results stored with it (None: none)."""

    image: str
    target: str
    engine: str
    model: str
    method: str  # NO_SPECULATION for a plain cell
    doc: dict[str, Any] | None
    plain_baseline: bool = True  # its target benches plain twins (bench.plain_baseline)
    tie_margin: float = 0.0  # its target's bench.tie_margin: a closer win is a tie

    @property
    def family(self) -> tuple[str, str, str]:
        return (self.model, self.target, self.engine)

    @property
    def label(self) -> str:
        return f"`{self.image}` ({'plain' if self.method == NO_SPECULATION else self.method})"


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """What two runs must share for their tok/s to be compared: hardware and load."""
    s = doc.get("settings") or {}
    return {"hardware": (doc.get("hardware") or {}).get("model"),
            **{k: s.get(k) for k in ("prompts", "max_tokens", "requests", "duration_s")}}


def _distrust(lv: dict[str, Any]) -> str | None:
    """Why a level's tok/s cannot pick a winner, None when it can."""
    if lv.get("flags"):
        return "untrusted: " + ", ".join(str(f.get("code")) for f in lv["flags"])
    if lv.get("errors"):
        return f"{lv['errors']} of {lv.get('requests', '?')} requests failed"
    if not lv.get("output_tok_s"):
        return "no tokens measured"
    return None


def _candidate(member: Member, lv: dict[str, Any], *, plain: bool,
               mismatch: str | None) -> dict[str, Any]:
    spec = member.method != NO_SPECULATION and not plain
    acc, acc_why = acceptance.level_acceptance(lv) if spec else (None, None)
    return {"name": f"{member.image} without speculation" if plain else member.image,
            "image": member.image, "method": NO_SPECULATION if plain else member.method,
            "plain": plain or member.method == NO_SPECULATION, "twin": plain,
            "tok_s": float(lv.get("output_tok_s") or 0.0),
            "why_untrusted": mismatch or _distrust(lv),
            "acceptance": None if acc is None else {"rate": acc.rate,
                                                    "mean_length": acc.mean_length},
            "acceptance_why": acc_why}


def _show(c: dict[str, Any]) -> str:
    if c["twin"]:
        return f"{PLAIN} (`{c['image']}` without `--speculative-config`)"
    return f"`{c['name']}` ({'plain' if c['plain'] else c['method']})"


def _acc_text(c: dict[str, Any]) -> str:
    a = c["acceptance"]
    if a is None:
        return f"acceptance not measured ({c['acceptance_why']})"
    return (f"{a['rate']:.0%} of drafted tokens accepted, {a['mean_length']:.2f} tokens per "
            "step")


def _tradeoff(win: dict[str, float] | None, other: dict[str, float] | None) -> str:
    """Which of the two acceptance figures carried the level: the share of drafts the
    target accepted (drafts verified in vain cost compute, which a batch feels) or the
    tokens each verification step yields (what a lone request feels)."""
    if win is None or other is None:
        return ""
    rate = f"{win['rate']:.0%} vs {other['rate']:.0%} of drafted tokens accepted"
    length = f"{win['mean_length']:.2f} vs {other['mean_length']:.2f} tokens per step"
    if win["rate"] >= other["rate"] and win["mean_length"] >= other["mean_length"]:
        return f"it accepts more on both counts ({rate}, {length})"
    if win["rate"] >= other["rate"]:
        return (f"at this load fewer drafts verified in vain ({rate}) outweigh longer "
                f"accepted runs ({length})")
    if win["mean_length"] >= other["mean_length"]:
        return (f"at this load longer accepted runs ({length}) outweigh a lower acceptance "
                f"rate ({rate})")
    return f"it wins with less accepted on both counts ({rate}, {length}): cheaper drafts"


def _explain(win: dict[str, Any], other: dict[str, Any], tie: bool) -> str:
    """Why `win` beats `other`: the drafters' acceptance (vLLM's counters at this level)."""
    if not win["plain"] and not other["plain"]:
        return (_tradeoff(win["acceptance"], other["acceptance"])
                or f"{_show(win)}: {_acc_text(win)}; {_show(other)}: {_acc_text(other)}")
    if tie and not (win["plain"] and other["plain"]):
        spec = other if win["plain"] else win
        return (f"the {spec['method']} drafter of `{spec['image']}` makes no measurable "
                f"difference at this load: {_acc_text(spec)}")
    if not win["plain"]:
        return f"the {win['method']} drafter pays at this load: {_acc_text(win)}"
    if not other["plain"]:
        return (f"the {other['method']} drafter of `{other['image']}` does not pay at this "
                f"load: {_acc_text(other)}")
    return "both serve without speculation"


def _level(c: int, cands: list[dict[str, Any]], tie_margin: float) -> dict[str, Any]:
    trusted = sorted((x for x in cands if not x["why_untrusted"]), key=lambda x: -x["tok_s"])
    untrusted = [f"{_show(x)}: {x['why_untrusted']}" for x in cands if x["why_untrusted"]]
    out: dict[str, Any] = {"concurrency": c, "candidates": cands, "winner": None,
                           "runner_up": None, "margin": None, "margin_tok_s": None,
                           "tie": False, "untrusted": untrusted}
    if len(trusted) < 2:
        out["explanation"] = (f"no winner: {len(trusted)} trusted figure(s) of "
                              f"{len(cands)}" + (f" ({'; '.join(untrusted)})" if untrusted
                                                 else ""))
        return out
    win, second = trusted[0], trusted[1]
    out.update(winner=win["name"], runner_up=second["name"],
               margin=win["tok_s"] / second["tok_s"] - 1,
               margin_tok_s=win["tok_s"] - second["tok_s"])
    out["tie"] = out["margin"] < tie_margin
    text = (f"{_show(win)} wins by {out['margin']:.1%} (+{out['margin_tok_s']:,.1f} tok/s: "
            f"{win['tok_s']:,.1f} vs {second['tok_s']:,.1f}) over {_show(second)}; "
            + (f"a tie: under the target's tie margin of {tie_margin:.0%}, what back-to-back "
               "benches of one image differ by there; " if out["tie"] else "")
            + _explain(win, second, out["tie"]))
    higher = [x for x in cands if x["why_untrusted"] and x["tok_s"] > win["tok_s"]]
    if higher:
        text += "; " + "; ".join(f"{_show(x)} measured more ({x['tok_s']:,.1f} tok/s) but "
                                 f"its figures cannot be used ({x['why_untrusted']})"
                                 for x in higher)
    out["explanation"] = text
    return out


def _versus_plain(m: Member, levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell against plain serving per level: its own plain twin, else the family's
    fastest trusted plain cell."""
    deltas: dict[str, float] = {}
    uncompared: dict[str, str] = {}
    for lv in levels:
        mine = next((x for x in lv["candidates"] if x["name"] == m.image), None)
        twin = next((x for x in lv["candidates"] if x["image"] == m.image and x["twin"]),
                    None)
        plain = twin or max((x for x in lv["candidates"] if x["plain"] and not x["twin"]
                             and not x["why_untrusted"]),
                            key=lambda x: x["tok_s"], default=None)
        key = str(lv["concurrency"])
        if mine is None:
            continue
        if plain is None:
            uncompared[key] = "no plain serving measured"
        elif mine["why_untrusted"] or plain["why_untrusted"]:  # the level's line says why
            uncompared[key] = "untrusted figures"
        else:
            deltas[key] = mine["tok_s"] / plain["tok_s"] - 1
    return {"image": m.image, "method": m.method, "deltas": deltas, "uncompared": uncompared,
            "loses_everywhere": bool(deltas) and all(d < 0 for d in deltas.values())}


def _levels_text(d: dict[str, float]) -> str:
    return ", ".join(f"c={c} {v:+.1%}" for c, v in d.items())


def _flags(members: list[Member], versus: list[dict[str, Any]]) -> list[str]:
    out = [f"{m.label}: no bench results are stored with this release; not compared"
           for m in members if m.doc is None]
    by_image = {m.image: m for m in members}
    for v in versus:
        m = by_image[v["image"]]
        if v["loses_everywhere"]:
            out.append(f"**{m.label} is slower than plain serving at every level "
                       f"{'measured' if not v['uncompared'] else 'compared'}** "
                       f"({_levels_text(v['deltas'])}): its drafter costs more than it "
                       "saves here; serve the image without `--speculative-config`, or "
                       "drop the cell"
                       + (f" (not compared: {_levels_text_why(v['uncompared'])})"
                          if v["uncompared"] else ""))
        elif not v["deltas"]:
            why = ("its target's `bench.plain_baseline` is off" if not m.plain_baseline else
                   _levels_text_why(v["uncompared"]) or "no plain serving measured")
            out.append(f"{m.label}: not compared with plain serving ({why})")
    return out


def _levels_text_why(d: dict[str, str]) -> str:
    """`c=1, c=4 untrusted figures; c=8 no plain serving measured`: levels by reason."""
    by_why: dict[str, list[str]] = {}
    for c, why in d.items():
        by_why.setdefault(why, []).append(f"c={c}")
    return "; ".join(f"{', '.join(cs)} {why}" for why, cs in by_why.items())


def _standing(m: Member, levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a cell is fastest (by how much) and how far behind the fastest it is at every
    other level with a winner (its own figure trusted)."""
    wins: dict[str, dict[str, Any]] = {}
    behind: dict[str, dict[str, Any]] = {}
    for lv in levels:
        mine = next((x for x in lv["candidates"] if x["name"] == m.image), None)
        if lv["winner"] is None or mine is None or mine["why_untrusted"]:
            continue
        if lv["winner"] == m.image:
            wins[str(lv["concurrency"])] = {"margin": lv["margin"], "tie": lv["tie"]}
        else:
            win = next(x for x in lv["candidates"] if x["name"] == lv["winner"])
            behind[str(lv["concurrency"])] = {"delta": mine["tok_s"] / win["tok_s"] - 1,
                                              "winner": win["name"]}
    return {"image": m.image, "method": m.method, "wins": wins, "behind": behind}


def _family(members: list[Member]) -> dict[str, Any]:
    measured = [m for m in members if m.doc is not None]
    ref = _comparable(measured[0].doc or {}) if measured else {}
    by_level: dict[int, list[dict[str, Any]]] = {}
    for m in measured:
        doc = m.doc or {}
        other = _comparable(doc)
        mismatch = None if other == ref else (
            f"measured with other settings than `{measured[0].image}` ("
            + ", ".join(f"{k} {other[k]} vs {ref[k]}" for k in ref if other[k] != ref[k])
            + ")")
        for lv in doc.get("levels", []):
            by_level.setdefault(int(lv["concurrency"]), []).append(
                _candidate(m, lv, plain=False, mismatch=mismatch))
        if m.method != NO_SPECULATION:
            for lv in (doc.get("plain") or {}).get("levels", []):
                by_level.setdefault(int(lv["concurrency"]), []).append(
                    _candidate(m, lv, plain=True, mismatch=mismatch))
    tie = max(m.tie_margin for m in members)
    levels = [_level(c, cands, tie) for c, cands in sorted(by_level.items())]
    versus = [_versus_plain(m, levels) for m in measured if m.method != NO_SPECULATION]
    first = members[0]
    return {"family": f"{first.model} on {first.target}, engine {first.engine}",
            "model": first.model, "target": first.target, "engine": first.engine,
            "cells": [{"image": m.image, "method": m.method, "measured": m.doc is not None}
                      for m in members],
            "tie_margin": tie, "levels": levels, "versus_plain": versus,
            "flags": _flags(members, versus),
            "standing": [_standing(m, levels) for m in measured]}


def advise(members: Iterable[Member]) -> list[dict[str, Any]]:
    """One advice per family, in the order its first cell comes."""
    families: dict[tuple[str, str, str], list[Member]] = {}
    for m in members:
        families.setdefault(m.family, []).append(m)
    return [_family(ms) for ms in families.values()]


# ------------------------------------------------------------------ markdown


def _short(c: dict[str, Any], many: bool) -> str:
    """A candidate in a table cell: the image, or plain serving (of which image, when the
    family has several)."""
    if c["twin"]:
        return PLAIN + (f" (`{c['image']}`)" if many else "")
    return f"`{c['image']}`"


def _figure(c: dict[str, Any] | None, delta: float | None) -> str:
    if c is None:
        return "-"
    text = f"{c['tok_s']:,.1f}"
    if delta is not None:
        text += f" ({delta:+.1%} vs plain)"
    if c["acceptance"] is not None:
        text += f" · {c['acceptance']['rate']:.2f} / {c['acceptance']['mean_length']:.2f}"
    return text + (f" **{c['why_untrusted']}**" if c["why_untrusted"] else "")


def _by_name(lv: dict[str, Any], name: str) -> dict[str, Any]:
    return next(x for x in lv["candidates"] if x["name"] == name)


def _fastest(lv: dict[str, Any], many: bool) -> str:
    if lv["winner"] is None:
        return "_no winner_"
    return (f"**{_short(_by_name(lv, lv['winner']), many)}** by {lv['margin']:.1%} over "
            f"{_short(_by_name(lv, lv['runner_up']), many)}" + (" (a tie)" if lv["tie"] else ""))


def _deploy(levels: list[dict[str, Any]], many: bool) -> str:
    """`c=1: X; c=8, c=32: Y`: the winners, consecutive levels with one winner joined."""
    runs: list[tuple[list[int], str]] = []
    for lv in levels:
        win = ((_short(_by_name(lv, lv["winner"]), many) + (" (a tie)" if lv["tie"] else ""))
               if lv["winner"] else "no winner")
        if runs and runs[-1][1] == win:
            runs[-1][0].append(lv["concurrency"])
        else:
            runs.append(([lv["concurrency"]], win))
    return "; ".join(", ".join(f"c={c}" for c in cs) + f" {w}" for cs, w in runs)


def family_markdown(fam: dict[str, Any]) -> str:
    """One family: a row per level (each cell's figures, the best plain twin, the
    fastest), the deployment per level, why, and the flags."""
    cells = [c for c in fam["cells"] if c["measured"]]
    many = len(cells) > 1
    versus = {v["image"]: v["deltas"] for v in fam["versus_plain"]}
    twins = any(x["twin"] for lv in fam["levels"] for x in lv["candidates"])
    head = [f"`{c['image']}` ({'plain' if c['method'] == NO_SPECULATION else c['method']})"
            for c in cells] + ([PLAIN] if twins else []) + ["fastest"]
    out = [f"#### {fam['family']}", ""]
    if not any(len(lv["candidates"]) > 1 for lv in fam["levels"]):
        one = "one configuration measured" if fam["levels"] else "no bench results stored"
        return "\n".join(out + [f"_{one}: nothing to compare_", ""]
                         + [f"- {f}" for f in fam["flags"]]) + "\n"
    out += ["| c | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for lv in fam["levels"]:
        key = str(lv["concurrency"])
        row = [_figure(next((x for x in lv["candidates"] if x["name"] == c["image"]), None),
                       versus.get(c["image"], {}).get(key)) for c in cells]
        if twins:  # the fastest trusted twin (each cell's own is in its "vs plain")
            best = sorted((x for x in lv["candidates"] if x["twin"]),
                          key=lambda x: (bool(x["why_untrusted"]), -x["tok_s"]))
            row.append(_figure(best[0], None) + (f" (`{best[0]['image']}`)" if many else "")
                       if best else "-")
        out.append(f"| {key} | " + " | ".join(row + [_fastest(lv, many)]) + " |")
    out += ["", f"Deploy: {_deploy(fam['levels'], many)}.", ""]
    out += [f"- {_standing_text(st, fam['levels'], many)}" for st in fam["standing"]
            if st["wins"] or st["behind"]]
    out += [f"- c={lv['concurrency']}: {lv['explanation']}" for lv in fam["levels"]]
    out += [f"- {f}" for f in fam["flags"]]
    return "\n".join(out) + "\n"


def _standing_text(st: dict[str, Any], levels: list[dict[str, Any]], many: bool) -> str:
    """`X` (dflash): fastest at c=1 (by 8.5%); behind at c=8 (-7.0% vs `Y`), ..."""
    by_c = {str(lv["concurrency"]): lv for lv in levels}
    wins = ", ".join(f"c={c} (by {w['margin']:.1%}{', a tie' if w['tie'] else ''})"
                     for c, w in st["wins"].items())
    behind = ", ".join(
        f"c={c} ({b['delta']:+.1%} vs {_short(_by_name(by_c[c], b['winner']), many)})"
        for c, b in st["behind"].items())
    method = "plain" if st["method"] == NO_SPECULATION else st["method"]
    return (f"`{st['image']}` ({method}): "
            + (f"fastest at {wins}" if wins else "fastest at no level")
            + (f"; behind the fastest at {behind}" if behind else ""))


def markdown(advice: list[dict[str, Any]]) -> str:
    """The section the compatibility table and the notes show ('' without families)."""
    if not advice:
        return ""
    intro = ("Per image family (one model on one target and engine), the fastest "
             "configuration at each bench level by output tok/s, from the results stored "
             "with this release. A cell's column: tok/s, against its plain twin (the same "
             "image benched right after without `--speculative-config`), and its drafter's "
             "acceptance rate / mean accepted length (tokens per step) from vLLM's own "
             "counters. Untrusted figures are named and never pick a winner.")
    return ("### Which cell to deploy\n\n" + intro + "\n\n"
            + "\n".join(family_markdown(f) for f in advice))
