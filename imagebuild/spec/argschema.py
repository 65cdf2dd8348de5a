"""A profile's `args` as JSON Schema, from the `vllm serve` options every vLLM version the
package ships facts of has (facts/recorded/<version>/serve_args.json, recorded from that
version's own argument parser): an editor completes the flags, shows which versions take
each and what, and underlines a flag no version has or a value every version refuses.

`check` decides per cell, with the cell's own version (preflight/serve_args.py, which
shares the rules below); a profile is not tied to one version, so the schema takes a
flag or value when any shipped version does. What JSON Schema cannot say of args (two
spellings of one option, a YAML plain scalar read as a number where text is meant) stays
`check`'s alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

from imagebuild.facts.store import SHIPPED
from imagebuild.spec.schemahint import anycase

# Flags imagebuild writes itself where a profile's copy would be wrong: --model would
# replace the /model path the image serves, and a profile's --speculative-config is
# silently overridden by the drafter's, written after it. (Served names, quantization
# and multimodal limits in a profile do apply, and their own rules read them.)
OWNED = {
    "model": "the image serves /model (the cell's model); remove it",
    "speculative-config": "set the drafter's method, num_speculative_tokens and options",
}
# Sanity ranges vLLM does not check in its parser, by dest (every spelling of the option):
# (lowest, highest, lowest allowed itself)
RANGES: dict[str, tuple[float, float | None, bool]] = {
    "port": (1, 65535, True),
    "gpu_memory_utilization": (0, 1, False),
    "max_num_seqs": (1, None, True),
    "max_num_batched_tokens": (1, None, True),
    "max_model_len": (1, None, True),  # or -1 / auto, handled by the kind
    "block_size": (1, None, True),
    "tensor_parallel_size": (1, None, True),
    "pipeline_parallel_size": (1, None, True),
    "data_parallel_size": (1, None, True),
}
# vLLM checks these names only when the plugin flag adds none of its own
PLUGIN_FLAG = {"tool-call-parser": "tool-parser-plugin",
               "reasoning-parser": "reasoning-parser-plugin"}
# what the health check and every client connect to: a DNS name (or an IP address)
HOST_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
HOST_LABELS = HOST_NAME.pattern.split(")", 1)[1]  # without its length look-ahead (maxLength)
JSON_KINDS = ("json", "json_or_str", "config")

# text Python's int(), float() and vLLM's human_readable_int read
INT_TEXT = r"^\s*[+-]?[0-9]+(_[0-9]+)*\s*$"
FLOAT_TEXT = (r"^\s*[+-]?(([0-9]+(_[0-9]+)*)?\.?[0-9]*(_[0-9]+)*([eE][+-]?[0-9]+)?|"
              r"[iI][nN][fF]([iI][nN][iI][tT][yY])?|[nN][aA][nN])\s*$")
HUMAN_TEXT = r"^\s*([0-9]+(\.[0-9]+)?[kmgtKMGT]|[+-]?[0-9]+)\s*$"
AUTO_TEXT = r"^\s*(-1|auto|AUTO|Auto|[0-9]+(\.[0-9]+)?[kmgtKMGT]|[+-]?[0-9]+)\s*$"


def recorded() -> dict[str, dict[str, Any]]:
    """{version: its recorded serve options} of every version the package ships."""
    out = {}
    for path in sorted(SHIPPED.glob("*/serve_args.json")):
        doc = json.loads(path.read_text())
        out[doc["vllm_version"]] = doc
    return out


def _number(kind: str, dest: str) -> dict[str, Any]:
    """The YAML number a numeric option takes, within the range the preflight keeps."""
    out: dict[str, Any] = {"type": "integer" if "int" in kind else "number"}
    low, high, low_ok = RANGES.get(dest, (None, None, True))
    if low is not None:
        out["minimum" if low_ok else "exclusiveMinimum"] = low
    if high is not None:
        out["maximum"] = high
    if kind == "human_int_or_auto":
        return {"anyOf": [out, {"const": -1}]}
    return out


def _single(flag: str, spec: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    """One value of the option, as value_problem in preflight/serve_args.py reads it."""
    kind = spec["kind"]
    if kind in ("flag", "bool"):
        return {"type": "boolean"}
    if kind == "opaque":
        return {}
    out = _text(flag, spec, names)
    if kind in JSON_KINDS:
        mapping: dict[str, Any] = {"type": "object"}
        if spec.get("fields"):
            mapping["propertyNames"] = {"enum": spec["fields"]}
        out = {"anyOf": [mapping, {"type": "string"}]}
    elif kind in ("int", "float", "human_int", "human_int_or_auto"):
        text = {"int": INT_TEXT, "float": FLOAT_TEXT, "human_int_or_auto": AUTO_TEXT}.get(
            kind, HUMAN_TEXT)
        out = {"anyOf": [_number(kind, spec.get("dest", "")),
                         {"type": "string", "pattern": text}]}
    elif kind == "list":
        out = {"type": ["string", "integer"]}
    if spec.get("none_ok"):  # vLLM's optional values: empty or None means unset
        out = {"anyOf": [out, {"enum": ["", "None"]}]}
    return out


def _text(flag: str, spec: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    """A text option's value; a plain YAML integer passes as its digits (check refuses
    other plain scalars YAML reads as non-text: a float's or a boolean's text changes)."""
    if names is not None:
        alternatives = "|".join(re.escape(n) for n in names)
        pattern = f"^({alternatives})$"
        return {"type": "string",
                "pattern": anycase(pattern) if flag == "attention-backend" else pattern}
    if spec.get("choices") is not None and not spec.get("normalize"):
        return {"enum": list(spec["choices"])}
    if flag == "host":
        return {"anyOf": [{"type": "integer", "minimum": 0}, {  # a name, or IPv6
            "type": "string", "maxLength": 253,
            "pattern": f"^({HOST_LABELS}|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)$"}]}
    return {"type": ["string", "integer"]}


def _value(flag: str, spec: dict[str, Any], cli: dict[str, Any], *,
           names_checked: bool = True) -> dict[str, Any]:
    names = cli.get("startup_names", {}).get(flag) if names_checked else None
    one = _single(flag, spec, names)
    if spec.get("bare_ok"):
        one = {"anyOf": [one, {"const": True}]}
    if spec.get("nargs") in ("+", "*"):
        item = _single(flag, {k: v for k, v in spec.items() if k != "nargs"}, names)
        listed: dict[str, Any] = {"type": "array", "items": item}
        if spec["nargs"] == "+":
            listed["minItems"] = 1
        return {"anyOf": [one, listed]}
    return one


def _merge(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    distinct = [json.loads(s) for s in dict.fromkeys(json.dumps(x, sort_keys=True)
                                                      for x in schemas)]
    return distinct[0] if len(distinct) == 1 else {"anyOf": distinct}


def args_schema(versions: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The schema of a profile's `args` for these recorded versions (default: shipped)."""
    versions = recorded() if versions is None else versions
    per_flag: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {}
    for version, cli in versions.items():
        for flag, spec in cli["options"].items():
            per_flag.setdefault(flag, []).append((version, spec, cli))
    props: dict[str, Any] = {}
    dotted: dict[str, Any] = {}
    plugins: list[dict[str, Any]] = []
    for flag in sorted(per_flag):
        seen = per_flag[flag]
        said = ", ".join(v for v, _, _ in seen)
        if flag in OWNED:
            props[flag] = {"description": f"vLLM {said}: --{flag}, written by imagebuild: "
                                          f"{OWNED[flag]}", "not": {}}
            continue
        kinds = sorted({s["kind"] for _, s, _ in seen})
        # a plugin may register names of its own: they are checked without one (below)
        plugin = PLUGIN_FLAG.get(flag) in per_flag
        props[flag] = {"description": f"vLLM {said}: --{flag} ({', '.join(kinds)})",
                       **_merge([_value(flag, s, c, names_checked=not plugin)
                                 for _, s, c in seen])}
        if plugin:
            plugins.append({"if": {"not": {"required": [PLUGIN_FLAG[flag]]}},
                            "then": {"properties": {flag: _merge([_value(flag, s, c)
                                                                  for _, s, c in seen])}}})
        if any(s["kind"] in JSON_KINDS for _, s, _ in seen):  # `flag.key: value`
            fields = sorted({f for _, s, _ in seen for f in s.get("fields") or []})
            key = "|".join(re.escape(f) for f in fields) if fields else "[^.]+"
            dotted[f"^{re.escape(flag)}\\.({key})\\+?$"] = {
                "description": f"one key of --{flag}'s JSON (vLLM {said})"}
    return {"type": "object",
            "description": "vllm serve flags without the leading --, e.g. max-model-len: "
                           "4096; a flag taking several values as a list, e.g. "
                           "cudagraph-capture-sizes: [1, 2, 4]; one key of a JSON flag as "
                           "flag.key (the flags of vLLM " + ", ".join(versions) + ")",
            "properties": props, "patternProperties": dotted,
            "additionalProperties": False, **({"allOf": plugins} if plugins else {})}
