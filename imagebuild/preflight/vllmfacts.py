"""Rules about the recorded facts themselves: a cell whose vLLM version has none (every
rule that reads facts then cannot answer for it, and none answers from another version's),
a part that failed to record or was recorded by another recorder than this imagebuild's,
environment variables the version does not know, and what smoke would read in a log or
/metrics the version never prints (facts/signals.py).

The facts are imagebuild/facts (shipped) or `<matrix dir>/locked/vllm/<version>/`
(written by `build.py facts record`).
"""

from __future__ import annotations

import difflib
import re

from imagebuild.expectations import expected_backends
from imagebuild.facts import PARTS, record_command, stale_parts
from imagebuild.facts.signals import (
    SPECULATIVE_METRICS,
    kind_unreadable,
    missing_metrics,
    unreadable,
)
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView

# what goes unchecked per missing part, in words
NEEDED_BY = {
    "serve_args": "serve flags and their defaults",
    "modalities": "multimodal limits",
    "kv": "the KV-cache layout",
    "kernel_select": "kernel selection",
    "envs": "environment variables",
    "logs": "the boot-log lines smoke reads",
    "metrics": "the /metrics names smoke and bench read",
}
VLLM_ENV = re.compile(r"^VLLM_[A-Z0-9_]+$")

RULES = (
    Rule("vllm-facts-missing", "warning",
         "every rule about vLLM answers from the recorded facts of the cell's own vLLM "
         "version; without them those rules cannot check the cell, and none answers with "
         "another version's facts",
         f"record them: {record_command()}"),
    Rule("vllm-facts-stale", "warning",
         "facts say what the recorder of their day understood of that vLLM version; a part "
         "recorded by another recorder than this imagebuild's (meta.json's recorder_sha256) "
         "may miss what today's rules ask of it (e.g. 0.28's KV padding per attention "
         "backend, which older recorders did not probe)",
         f"record them again: {record_command()}"),
    # refused, not warned: vLLM 0.23.0's envs.py `validate_environ` only logs "Unknown vLLM
    # environment variable detected" (unless --fail-on-environ-validation), so a misspelt
    # switch (a kernel disabled, a cache size) silently does nothing on the machine
    Rule("vllm-env-unknown", "error",
         "vLLM reads only the environment variables its envs.py lists; any other VLLM_* "
         "variable is ignored (it only logs 'Unknown vLLM environment variable "
         "detected'), so a setting in the profile does nothing",
         "remove the variable, or use the serve flag or variable this vLLM version has",
         facts=("envs",)),
    Rule("smoke-signal-missing", "error",
         "smoke reads what vLLM chose (expect_backends) and whether speculation fires in "
         "the boot log and /metrics, in the words of the image's own vLLM version; a "
         "message or metric that version never prints would fail smoke on every image, "
         "or, for a check that reads an absence, could never fail",
         "expect only what the cell's vLLM version logs: the profile's by_vllm (or "
         "by_engine) says what differs on that version, or use a vLLM that logs it",
         facts=("logs", "metrics")),
)
BY_ID = {r.id: r for r in RULES}


def check_cell(v: CellView, *, building: bool = False) -> list[Finding]:
    where = v.lm.located.where(("engines", v.cell.engine_name, "vllm_version"))
    rule = BY_ID["vllm-facts-missing"]
    fix = f"record vLLM {v.version}'s facts: {record_command(v.version)}"
    # a release built on rules that could not run is refused; `check` only warns
    severity = "error" if building else None
    if v.facts is None:
        return [rule.finding(v.label, f"no recorded facts for vLLM {v.version}: "
                                      f"{', '.join(NEEDED_BY.values())} are unchecked",
                             fix=fix, where=where, severity=severity)]
    out = []
    missing = [p for p in PARTS if not v.facts.has(p)]
    if missing:
        what = ", ".join(NEEDED_BY[p] for p in missing)
        why = "; ".join(v.facts.missing(p) for p in missing)
        out.append(rule.finding(v.label, f"{what} unchecked: {why}", fix=fix, where=where,
                                severity=severity))
    stale = stale_parts(v.facts)
    if stale:
        out.append(BY_ID["vllm-facts-stale"].finding(
            v.label, f"vLLM {v.version}'s facts ({v.facts.where}): {', '.join(stale)} "
                     "recorded by another recorder than this imagebuild's; the rules reading "
                     "them may answer from what it did not record",
            fix=f"record vLLM {v.version}'s facts again with this imagebuild: "
                f"{record_command(v.version)}", where=where))
    return out + _unknown_env(BY_ID["vllm-env-unknown"], v) + _signals(v)


def _signals(v: CellView) -> list[Finding]:
    """What smoke will read for this cell that its vLLM version does not print."""
    if v.facts is None:
        return []
    r = BY_ID["smoke-signal-missing"]
    platform = "cuda" if v.cell.target.gpu else "cpu"
    unread = unreadable(v.facts, platform)
    out = []
    expected = expected_backends(v.cell)
    readable = {k: w for k, w in expected.items() if kind_unreadable(k, unread) is None}
    version = v.cell.engine.vllm_version
    fix = (f"say what vLLM {version} logs in profile {v.cell.profile_name}: by_vllm: "
           f"{{'>={version}': {{expect_backends: "
           f"{{{', '.join(f'{k}: {w}' for k, w in readable.items())}}}}}}} (or by_engine: "
           f"{{{v.cell.engine_name}: ...}}), or use a vLLM that logs it")
    for kind, want in expected.items():
        why = kind_unreadable(kind, unread)
        if why is not None:
            out.append(r.finding(v.label, f"expect_backends.{kind} ({want}) cannot be checked "
                                          f"by smoke: {why}", fix=fix,
                                 where=v.lm.located.where(("profiles", v.cell.profile_name,
                                                           "expect_backends", kind))))
    if "weights_skipped" in unread:
        out.append(r.finding(v.label, "smoke's no_weights_skipped_at_load cannot see a "
                                      f"skipped weight: {unread['weights_skipped']}; the "
                                      "check is skipped as not applicable",
                             severity="warning", fix="check the served model's answers "
                             "(images: smoke's image_request) before relying on this cell",
                             where=v.lm.located.where(("engines", v.cell.engine_name,
                                                       "vllm_version"))))
    missing = missing_metrics(v.facts, SPECULATIVE_METRICS) if v.method != "none" else {}
    if missing:
        out.append(r.finding(v.label, "speculative decoding cannot be seen firing: "
                                      f"{'; '.join(missing.values())} (smoke's "
                                      "speculative_decoding_fires and bench's acceptance "
                                      "read them)", where=v.where("speculative-config")))
    return out


def _unknown_env(r: Rule, v: CellView) -> list[Finding]:
    facts = v.facts
    known = (facts.envs or {}).get("variables") if facts is not None else None
    if facts is None or known is None:
        return []
    out = []
    for name in v.env:
        if VLLM_ENV.match(name) and name not in known:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.85)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            out.append(r.finding(v.label, f"env {name}: vLLM {v.version} does not know this "
                                          f"variable ({facts.said}: envs){hint}",
                                 where=v.where(env=name),
                                 fix=f"write {close[0]}" if close else None))
    return out
