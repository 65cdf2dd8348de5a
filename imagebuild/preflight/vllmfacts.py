"""Rules about the recorded facts themselves: a cell whose vLLM version has none (every
rule that reads facts then cannot answer for it, and none answers from another version's),
a part that failed to record, and environment variables the version does not know.

The facts are imagebuild/facts (shipped) or `<matrix dir>/locked/vllm/<version>/`
(written by `build.py facts record` or `build.py lock --update ENGINE`).
"""

from __future__ import annotations

import difflib
import re

from imagebuild.facts import PARTS, record_command
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
    # refused, not warned: vLLM 0.23.0's envs.py `validate_environ` only logs "Unknown vLLM
    # environment variable detected" (unless --fail-on-environ-validation), so a misspelt
    # switch (a kernel disabled, a cache size) silently does nothing on the machine
    Rule("vllm-env-unknown", "error",
         "vLLM reads only the environment variables its envs.py lists; any other VLLM_* "
         "variable is ignored (it only logs 'Unknown vLLM environment variable "
         "detected'), so a setting in the profile does nothing",
         "remove the variable, or use the serve flag or variable this vLLM version has",
         facts=("envs",)),
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
    return out + _unknown_env(BY_ID["vllm-env-unknown"], v)


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
