"""Serve flags checked against the real `vllm serve` CLI of the cell's vLLM version.

vLLM exits at start-up on an option its parser does not know, on a value its parser cannot
convert or that is not among the choices, and (a little later) on a tool or reasoning
parser, attention backend or quantization method it has not registered. On a GB10 that is
minutes into a boot; here it is a finding with the matrix.yaml position of the key.

The accepted options come from the `serve_args` part of the cell's vLLM version's recorded
facts (imagebuild/facts; recorder/serve_args.py reads vLLM's own argument parser). Rules
key on an option's dest, so every spelling of it (0.32: --gpu-memory-utilization and
--device-memory-utilization) is checked alike. Values are checked as servecmd passes
them: `str(value)` after the flag, compact JSON for a mapping, the bare flag for `true`,
nothing for `false`.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imagebuild.facts import facts_for, record_command
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView
from imagebuild.spec.argschema import HOST_NAME, OWNED, PLUGIN_FLAG, RANGES
from imagebuild.spec.servecmd import speculative_config
from imagebuild.spec.yamlpos import TAG, Scalar, explain, quote_fix, shorten

RULES = (
    Rule("serve-flag-unknown", "error",
         "vLLM's parser refuses an option it does not know and the server never starts; "
         "on GB10 that costs a boot",
         "correct the flag name in the profile's args (vllm serve --help=all lists them)",
         waivable=False, facts=("serve_args",)),
    Rule("serve-flag-value", "error",
         "a value vLLM refuses at start-up: not convertible to the option's type, not one "
         "of its choices, a name vLLM has not registered, or far out of range",
         "correct the value in the profile's args", waivable=False, facts=("serve_args",)),
    Rule("serve-flag-owned", "error",
         "imagebuild writes this flag from the cell's model or drafter; a profile's copy "
         "would replace the served model or be silently overridden",
         "remove it from the profile's args", waivable=False),
    Rule("serve-flag-false", "warning",
         "`flag: false` adds nothing to the command line, so vLLM's default applies, which "
         "for this flag is not off",
         "write `no-<flag>: true` to turn it off", facts=("serve_args",)),
    Rule("serve-flag-twice", "error",
         "two spellings of one vLLM option (one dest) in a profile: argparse keeps whichever "
         "comes last on the command line, and the rules could read the other",
         "keep one spelling (vLLM's first, as its --help lists it)", waivable=False,
         facts=("serve_args",)),
    Rule("serve-flags-unchecked", "warning",
         "no recorded `vllm serve` options for this vLLM version, so serve flags cannot be "
         "checked before a boot",
         f"record them: {record_command()}"),
)
BY_ID = {r.id: r for r in RULES}


def load_cli(vllm_version: str, extra_dirs: Iterable[Path] = ()) -> dict[str, Any] | None:
    """The recorded `vllm serve` options of a vLLM version (None: not recorded)."""
    found = facts_for(vllm_version, extra_dirs)
    return found.serve_args if found is not None else None


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _human_int(text: str) -> int:
    """vLLM's human_readable_int: 16384, 16k (x1000), 16K (x1024), 25.6k."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not m:
        return int(text)
    number, suffix = m.groups()
    if suffix in "kmgt":
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)  # no decimals with K/M/G/T


def _json(text: str, kind: str) -> Any:
    if kind == "config":  # vLLM expands bare 80m-style numbers in config JSON first
        parts = re.split(r'("(?:[^"\\]|\\.)*")', text)
        for i in range(0, len(parts), 2):
            parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b",
                              lambda m: str(_human_int(m.group())), parts[i])
        text = "".join(parts)
    return json.loads(text)


def _number(spec: dict[str, Any], text: str) -> float | None:
    """The option's value as a number (None for auto), or ValueError."""
    kind = spec["kind"]
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "human_int":
        return _human_int(text)
    if kind == "human_int_or_auto":
        return None if text.strip() in ("-1", "auto", "AUTO", "Auto") else _human_int(text)
    return None


def _host_ok(text: str) -> bool:
    """What the health check and every client connect to: an IP address or a DNS name."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOST_NAME.fullmatch(text))


def _argv_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)


def _list_problem(flag: str, spec: dict[str, Any], values: list[Any], cli: dict[str, Any],
                  args: dict[str, Any]) -> tuple[str, str] | None:
    """A list: one argument per value, which only an option of several values (vLLM's
    nargs "+" or "*", recorded in serve_args_<version>.json) takes; each value checked
    as the option's own."""
    nargs = spec.get("nargs")
    if nargs not in ("+", "*"):
        return (f"{flag} takes one value, not a list", f"write a single value: {flag}: "
                                                       f"{shorten(values[0]) if values else '...'}")
    if not values and nargs == "+":
        return f"{flag} takes one or more values; the list is empty", "list its values"
    single = {k: v for k, v in spec.items() if k != "nargs"}
    for v in values:
        if isinstance(v, (list, dict)):
            return (f"{flag} takes a list of plain values, not {shorten(v)}",
                    f"write {flag}: [1, 2, 4]")
        problem = value_problem(flag, single, v, cli, args)
        if problem is not None:
            return problem
    return None


def value_problem(flag: str, spec: dict[str, Any], value: Any, cli: dict[str, Any],
                  args: dict[str, Any]) -> tuple[str, str] | None:
    """(what is wrong, fix) with `--flag value` as the serve command passes it, or None."""
    kind = spec["kind"]
    if kind in ("flag", "bool"):
        if isinstance(value, bool):
            return None
        return (f"{flag} is an on/off flag, but the value is {shorten(value)}",
                f"write `{flag}: true` (or remove it)")
    if value is True and spec.get("bare_ok"):
        return None
    if isinstance(value, bool):
        said = "passes the bare flag" if value else "drops the flag"
        return (f"{flag} takes a {kind} value; `{str(value).lower()}` {said}",
                f"write the {kind} value, e.g. {flag}: <value>")
    if isinstance(value, list):
        return _list_problem(flag, spec, value, cli, args)
    if isinstance(value, dict) and kind not in ("json", "json_or_str", "config"):
        return (f"{flag} takes a {kind}, not a mapping", f"write a single {kind} value")
    text = _argv_text(value)
    if spec.get("none_ok") and text in ("", "None"):
        return None
    if kind == "opaque":  # a converter the recorder could not classify: vLLM decides
        return None
    if kind == "list":
        if spec.get("item") == "int":
            bad = [t for t in text.split(spec.get("separator", ",")) if not t.strip().isdigit()]
            if bad:
                return (f"{flag} takes a comma-separated list of integers, not "
                        f"{shorten(text)}", "write e.g. 0,1")
        return None
    if kind in ("json", "json_or_str", "config"):
        if kind == "json_or_str" and not re.match(r"(?s)^\s*{.*}\s*$", text):
            return None
        try:
            parsed = _json(text, kind)
        except (ValueError, RecursionError):
            return (f"{flag} takes JSON, and {shorten(text)} is not JSON",
                    "write it as a YAML mapping (it is passed as compact JSON)")
        fields = spec.get("fields")
        if fields is not None:
            if not isinstance(parsed, dict):
                return (f"{flag} takes a JSON object", "write it as a YAML mapping")
            unknown = [k for k in parsed if k not in fields]
            if unknown:
                return (f"{flag} has no key {unknown[0]!r}{_suggest(unknown[0], fields)}",
                        f"use keys of vLLM's {flag} ({', '.join(fields[:8])}, ...)")
        return None
    try:
        number = _number(spec, text)
    except ValueError:
        return (f"{flag} takes {'an integer' if 'int' in kind else 'a number'} "
                f"({kind.replace('_', ' ')}), not {shorten(text)}",
                ("write a YAML list of numbers, e.g. " + f"{flag}: [1, 2, 4]"
                 if spec.get("nargs") in ("+", "*") else
                 "write a plain number" + (" (vLLM also reads 16k or 16K)" if "human" in kind
                                           else "")))
    choices = spec.get("choices")
    if choices is not None:
        chosen = text.lower().replace("-", "_") if spec.get("normalize") else text
        if chosen not in choices:
            return (f"{flag} {shorten(text)} is not one of vLLM's choices"
                    f"{_suggest(chosen, choices)}", f"use one of: {', '.join(choices)}")
    names = cli.get("startup_names", {}).get(flag)
    if names is not None and PLUGIN_FLAG.get(flag) not in args:
        probe = text.lower() if flag == "attention-backend" else text
        if probe not in names:
            return (f"{flag} {shorten(text)} is not a name vLLM {cli['vllm_version']} has "
                    f"registered{_suggest(probe, names)}", f"use one of: {', '.join(names)}")
    if flag == "host" and not _host_ok(text):
        return (f"host {shorten(text)} is not an IP address or host name",
                "serve on loopback: host: 127.0.0.1 (containers share the host network)")
    dest = spec.get("dest", flag.replace("-", "_"))
    if dest in RANGES and number is not None:
        low, high, low_ok = RANGES[dest]
        if number < low or (number == low and not low_ok) or (high is not None
                                                                and number > high):
            span = f"{'[' if low_ok else '('}{low}, {high if high is not None else 'inf'}]"
            return (f"{flag} {text} is outside {span}", f"give {flag} a value in {span}")
    return None


def _yaml_problem(spec: dict[str, Any], key: str, value: Any, s: Scalar | None
                  ) -> tuple[str, str] | None:
    """A string option whose unquoted value YAML turned into something else, so the
    serve command would carry different text than the file shows."""
    if spec["kind"] not in ("str", "json_or_str") or s is None:
        return None
    if s.tag == TAG + "bool" and spec.get("bare_ok"):
        return None
    if s.tag in (TAG + "bool", TAG + "null") or _argv_text(value) != s.text:
        return f"{key} takes text, but {explain(s)}", quote_fix(s)
    return None


@dataclass(frozen=True)
class Problem:
    rule: str  # a rule id of RULES
    key: str  # the args key it concerns
    message: str
    fix: str | None = None  # None: the rule's own fix


def args_problems(args: dict[str, Any], cli: dict[str, Any],
                  surprise: Callable[[str], Scalar | None] = lambda key: None
                  ) -> list[Problem]:
    """Every problem of a profile's `args` for the vLLM described by `cli`. `surprise`
    gives the unquoted scalar YAML read as a non-string for a key, if any."""
    options: dict[str, dict[str, Any]] = cli["options"]
    out: list[Problem] = []
    by_dest: dict[str, str] = {}
    for key in args:
        entry = options.get(key.split(".", 1)[0])
        if entry is None or "negates" in entry:
            continue
        first = by_dest.setdefault(entry["dest"], key.split(".", 1)[0])
        if first != key.split(".", 1)[0]:
            out.append(Problem("serve-flag-twice", key,
                               f"--{key} and --{first} are one option of vLLM "
                               f"{cli['vllm_version']} (dest {entry['dest']})",
                               f"keep one of them, e.g. {entry.get('canonical', first)}"))
    for key, value in args.items():
        base = key.split(".", 1)[0]  # `compilation-config.mode: 3` sets one key of a JSON flag
        spec = options.get(base)
        if key.startswith("-"):
            out.append(Problem("serve-flag-unknown", key, f"args key {key!r} starts with '-'",
                               f"write it without dashes: {key.lstrip('-')}: ..."))
        elif "_" in base and base.replace("_", "-") in options:
            out.append(Problem(
                "serve-flag-unknown", key, f"--{key} is spelt with '_' (vLLM takes it, but "
                "the other preflight rules read vLLM's own spelling)",
                f"write {base.replace('_', '-')}"))
        elif spec is None:
            longer = [o for o in options if o.startswith(base)]
            if len(longer) == 1:  # argparse would take the unique prefix
                out.append(Problem(
                    "serve-flag-unknown", key, f"--{base} abbreviates --{longer[0]} (vLLM's "
                    "parser takes unique prefixes, but the preflight rules read full names "
                    "and a later vLLM option can make the prefix ambiguous)",
                    f"write {longer[0]}"))
            else:
                out.append(Problem("serve-flag-unknown", key,
                                   f"vllm serve {cli['vllm_version']} has no option --{base}"
                                   f"{_suggest(base, sorted(options))}"))
        elif base in OWNED:
            out.append(Problem("serve-flag-owned", key, f"--{base} is written by imagebuild",
                               OWNED[base]))
        elif "." in key:
            sub = key.split(".")[1].rstrip("+")
            if spec["kind"] not in ("json", "json_or_str", "config"):
                out.append(Problem("serve-flag-unknown", key,
                                   f"--{key}: only JSON options take dotted keys, and "
                                   f"--{base} is a {spec['kind']} option"))
            elif spec.get("fields") and sub not in spec["fields"]:
                out.append(Problem("serve-flag-value", key, f"--{base} has no key {sub!r}"
                                   f"{_suggest(sub, spec['fields'])}"))
        elif (value is False and spec["kind"] == "bool" and spec.get("default") is not False
              and "negates" not in spec):
            out.append(Problem("serve-flag-false", key, f"`{key}: false` leaves vLLM's "
                               "default (on, or decided by vLLM)",
                               f"write `no-{key}: true` to turn it off"))
        else:
            problem = (_yaml_problem(spec, key, value, surprise(key))
                       or value_problem(base, spec, value, cli, args))
            if problem:
                out.append(Problem("serve-flag-value", key, *problem))
    return out


def check_cell(v: CellView) -> list[Finding]:
    cli = v.cli
    where = v.lm.located.where
    if cli is None:
        if v.facts is None:
            return []  # no facts at all for the version: vllmfacts.py says so, once
        return [BY_ID["serve-flags-unchecked"].finding(
            v.label, v.facts.missing("serve_args"),
            fix=f"record them: {record_command(v.version)}",
            where=where(("engines", v.cell.engine_name, "vllm_version")))]
    args_at = ("profiles", v.cell.profile_name, "args")
    problems = args_problems(v.cell.profile.args, cli,
                             lambda key: v.lm.located.surprise(args_at + (key,)))
    out = [BY_ID[p.rule].finding(v.label, p.message, fix=p.fix, where=where(args_at + (p.key,)))
           for p in problems]
    return out + _model_and_drafter(v, cli)


def _model_and_drafter(v: CellView, cli: dict[str, Any]) -> list[Finding]:
    """The flags servecmd writes from the model and drafter, checked the same way."""
    out = []
    where = v.lm.located.where
    quant = v.cell.model.quantization
    methods = cli.get("startup_names", {}).get("quantization")
    if quant and methods is not None and quant not in methods:
        out.append(BY_ID["serve-flag-value"].finding(
            v.label, f"--quantization {quant} is not a method vLLM {cli['vllm_version']} "
                     f"knows{_suggest(quant, methods)}",
            fix=f"use one of: {', '.join(methods)}",
            where=where(("models", v.cell.model_name, "quantization"))))
    fields = cli["options"].get("speculative-config", {}).get("fields")
    if fields:
        for key in speculative_config(v.cell) or {}:
            if key not in fields:
                out.append(BY_ID["serve-flag-value"].finding(
                    v.label, f"--speculative-config has no key {key!r}{_suggest(key, fields)}",
                    fix="use keys of vLLM's SpeculativeConfig in the drafter's options",
                    where=where(("drafters", v.cell.drafter_name, "options", key))))
    return out
