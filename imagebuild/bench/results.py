"""Run results: summary figures per level, one JSON document per run, a markdown table."""

from __future__ import annotations

import platform
import statistics
from pathlib import Path
from typing import Any

from imagebuild.bench import trust
from imagebuild.bench.client import Level

SCHEMA = "imagebuild.bench/v1"


def stats(values: list[float], scale: float = 1.0) -> dict[str, float] | None:
    """min/median/p90/max/mean (p90 by linear interpolation, as numpy's default)."""
    if not values:
        return None
    v = sorted(x * scale for x in values)
    pos = 0.9 * (len(v) - 1)
    lo = int(pos)
    p90 = v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)
    return {"min": v[0], "median": statistics.median(v), "p90": p90, "max": v[-1],
            "mean": statistics.fmean(v)}


def summarize(level: Level) -> dict[str, Any]:
    ok = [r for r in level.results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    span = (max(r.end for r in ok) - min(r.start for r in ok)) if ok else 0.0
    wall = span or level.wall_s
    srv = level.server
    out: dict[str, Any] = {
        "concurrency": level.concurrency,
        "requests": len(level.results),
        "completed": len(ok),
        "errors": len(level.results) - len(ok),
        "error_samples": sorted({r.error for r in level.results if not r.ok})[:3],
        "duration_s": wall,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall if wall else 0.0,
        "request_rate": len(ok) / wall if wall else 0.0,
        "ttft_ms": stats([r.ttft_s for r in ok], 1000),
        "tpot_ms": stats([t for r in ok if (t := r.tpot_s) is not None], 1000),
        "itl_ms": stats([x for r in ok for x in r.itl_s], 1000),
        "e2e_ms": stats([r.e2e_s for r in ok], 1000),
        "output_tokens_per_request": stats([float(r.output_tokens) for r in ok]),
        "itl_collapsed_share": trust.collapsed_share([1000 * x for r in ok for x in r.itl_s]),
        # the client's own cost: CPU time this process spent per request
        "client_cpu_ms_per_request": 1000 * level.client_cpu_s / max(1, len(level.results)),
        "client": _client(level),
        "spec_decode": None,
        "server_ttft_mean_ms": None,
    }
    if srv is not None:
        out["server_ttft_mean_ms"] = (None if srv.server_ttft_mean_s is None
                                      else 1000 * srv.server_ttft_mean_s)
        if srv.draft_tokens:
            out["spec_decode"] = {"drafts": srv.drafts, "draft_tokens": srv.draft_tokens,
                                  "accepted_tokens": srv.accepted,
                                  "acceptance": srv.acceptance,
                                  "mean_accepted_length": srv.mean_accepted_length}
    out["flags"] = trust.flags(out)
    return out


def _client(level: Level) -> dict[str, float | None] | None:
    """How held back the load generator was (shares of the level's wall time)."""
    c, wall = level.client, level.wall_s
    if c is None or wall <= 0:
        return None
    return {"cpu_share": c.cpu_s / wall,
            "wait_share": None if c.wait_s is None else c.wait_s / wall,
            "loop_lag_p90_ms": c.lag_p90_ms()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def document(*, image: dict[str, Any], settings: dict[str, Any], levels: list[dict[str, Any]],
             started: str, hardware: str | None = None) -> dict[str, Any]:
    """One run: what was measured (image id, digest, tag, pins, target), where, how, results."""
    return {"schema": SCHEMA, "started": started, "image": image,
            "hardware": {"model": hardware or cpu_model(), "machine": platform.machine()},
            "settings": settings, "levels": levels}


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def plain_levels(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The plain twin's level summaries by concurrency (bench_image's `plain`: the same
    image measured without --speculative-config); {} when it was not measured."""
    return {int(lv["concurrency"]): lv for lv in (doc.get("plain") or {}).get("levels", [])}


def plain_run(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The plain twin as a run of its own (a line of the plot), None when not measured."""
    plain = doc.get("plain") or {}
    if not plain.get("levels"):
        return None
    img = doc["image"]
    name = img.get("label") or img.get("tag") or img.get("ref")
    return {**doc, "image": {**img, "label": f"{name} without speculation"},
            "started": plain.get("started"), "levels": plain["levels"], "plain": None}


def markdown(doc: dict[str, Any], deltas: dict[int, dict[str, float]] | None = None) -> str:
    """The table for release notes; with `deltas` a column of tok/s change vs a baseline,
    and with a plain twin a column of tok/s change against it and its own table."""
    img = doc["image"]
    head = (f"**{img.get('tag') or img.get('ref')}** on {doc['hardware']['model']} - "
            f"{doc['settings'].get('prompts')}, {doc['settings'].get('max_tokens')} output "
            f"tokens per request\n\n")
    plain = plain_levels(doc)
    out = head + _table(doc["levels"], deltas, plain)
    if plain:
        out += ("\nThe same image without `--speculative-config` (its plain twin), measured "
                "right after:\n\n" + _table(list(plain.values()), None, {}))
    why = trust.summary(doc) + "".join(
        f"\nplain c={c}: " + "; ".join(f["reason"] for f in lv["flags"])
        for c, lv in plain.items() if lv.get("flags"))
    tail = ("\n**Untrusted figures** (the gate will not compare them silently):\n\n"
            + "\n".join(f"- {line}" for line in why.strip().splitlines()) + "\n"
            ) if why else ""
    return out + tail


def _table(levels: list[dict[str, Any]], deltas: dict[int, dict[str, float]] | None,
           plain: dict[int, dict[str, Any]]) -> str:
    cols = ["c", "req", "err", "tok/s", "req/s", "TTFT p50 ms", "TTFT p90 ms",
            "TTFT mean ms (server's)", "TPOT p50 ms",
            "ITL p50 ms", "E2E p50 ms", "accept", "mean acc len", "client CPU ms/req",
            "figures"]
    if plain:
        cols.insert(4, "vs plain")
    if deltas is not None:
        cols.insert(4, "vs baseline")
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for lv in levels:
        sd = lv.get("spec_decode") or {}
        cells = [str(lv["concurrency"]), str(lv["requests"]), str(lv["errors"]),
                 _f(lv["output_tok_s"]), _f(lv["request_rate"], 2),
                 _f((lv["ttft_ms"] or {}).get("median")), _f((lv["ttft_ms"] or {}).get("p90")),
                 f"{_f((lv['ttft_ms'] or {}).get('mean'))} "
                 f"({_f(lv.get('server_ttft_mean_ms'))})",
                 _f((lv["tpot_ms"] or {}).get("median"), 2),
                 _f((lv["itl_ms"] or {}).get("median"), 2),
                 _f((lv["e2e_ms"] or {}).get("median")),
                 _f(sd.get("acceptance"), 2), _f(sd.get("mean_accepted_length"), 2),
                 _f(lv["client_cpu_ms_per_request"], 2),
                 ("**UNTRUSTED** (" + ", ".join(f["code"] for f in lv["flags"]) + ")"
                  if lv.get("flags") else "ok" if "flags" in lv else "not checked")]
        if plain:
            twin = plain.get(lv["concurrency"])
            cells.insert(4, "-" if not twin or not twin["output_tok_s"] else
                         f"{lv['output_tok_s'] / twin['output_tok_s'] - 1:+.1%}")
        if deltas is not None:
            dl = deltas.get(lv["concurrency"], {})
            d = dl.get("output_tok_s")
            cells.insert(4, ("-" if d is None else f"{d:+.1%}")
                         + (" (untrusted)" if dl.get("untrusted") else ""))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"
