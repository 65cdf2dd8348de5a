"""The options `vllm serve` accepts, read from the installed vLLM's own parser.

It builds the serve parser exactly as the `vllm` command does (FlexibleArgumentParser,
the serve subcommand, make_arg_parser) and records, for every long option, its dest (two
spellings of one option share it: rules key on dests), the other spellings of the same
argument (`aliases`), how argparse converts its value (`kind`, learnt from the converter
itself; one it cannot tell is recorded as `opaque` with a finding), nargs, choices and
default; for JSON options that feed one of vLLM's config classes, the keys that class
accepts (they forbid unknown keys); and the names vLLM checks only at start-up (tool and
reasoning parsers, attention backends, quantization methods). preflight/serve_args.py
reads the result without importing vLLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from common import Context, header

SOURCE = "vllm serve's argument parser (vllm.entrypoints.cli.serve)"
# what a converter is fed to learn what it does (its name says little: lambdas, closures)
PROBES = ("Ab-Cd", "2,3", "x", "1", "1.5")


def serve_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers)


def _closure(fn: Any, name: str) -> Any:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    return cells[name].cell_contents


def _fields(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)


def _probe(conv: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for text in PROBES:
        try:
            out[text] = conv(text)
        except Exception as exc:  # noqa: BLE001 - refusing a probe is behaviour too
            out[text] = {"raises": type(exc).__name__}
    return out


def _where(conv: Any) -> str:
    code = getattr(conv, "__code__", None)
    if code is None:
        return repr(conv)
    from common import site_path

    return f"{site_path(code.co_filename)}:{code.co_firstlineno}"


def by_behaviour(conv: Any, option: str, ctx: Context) -> dict[str, Any]:
    """A converter its name does not explain, classified by what it returns for PROBES."""
    got = _probe(conv)
    if got["Ab-Cd"] == "ab_cd":  # --moe-backend, --linear-backend: lower_underscore
        return {"kind": "str", "normalize": "lower_underscore"}
    if isinstance(got["2,3"], list) and isinstance(got["x"], list):  # --device-ids
        items = {type(v).__name__ for v in got["2,3"] + got["x"]}
        if got["2,3"] == [2, 3] and got["x"] == ["x"]:
            return {"kind": "list", "separator": ",", "item": "int_or_str"}
        if items == {"str"}:
            return {"kind": "list", "separator": ",", "item": "str"}
        if got["2,3"] == [2, 3] and isinstance(got["x"], dict):
            return {"kind": "list", "separator": ",", "item": "int"}
    if all(isinstance(got[t], str) for t in PROBES) and got["Ab-Cd"] == "Ab-Cd":
        return {"kind": "str"}
    ctx.finding(f"--{option.lstrip('-')}: converter {getattr(conv, '__qualname__', conv)!r} "
                f"({_where(conv)}) is not one the recorder knows; recorded as opaque (its "
                "values are not checked before a boot)")
    return {"kind": "opaque", "converter": _where(conv),
            "probes": {k: (v if isinstance(v, dict) else repr(v)) for k, v in got.items()}}


def classify(conv: Any, option: str, ctx: Context) -> dict[str, Any]:
    """How argparse turns the option's text into a value, as data."""
    if conv is None or conv is str:
        return {"kind": "str"}
    if conv is int:
        return {"kind": "int"}
    if conv is float:
        return {"kind": "float"}
    if conv is json.loads:
        return {"kind": "json"}
    name = getattr(conv, "__name__", "")
    if name == "_optional_type":  # vllm optional_type(): "" or "None" mean None
        return {**classify(_closure(conv, "return_type"), option, ctx), "none_ok": True}
    if name == "_parse_type":  # vllm parse_type(): same conversion, argparse-friendly error
        return classify(_closure(conv, "return_type"), option, ctx)
    if name == "human_readable_int":
        return {"kind": "human_int"}
    if name == "human_readable_int_or_auto":
        return {"kind": "human_int_or_auto"}
    if name == "union_dict_and_str":
        return {"kind": "json_or_str"}
    if name == "parse_dataclass":  # a config class validated from JSON, extra keys forbidden
        return {"kind": "config", "fields": _fields(conv.__defaults__[0])}
    return by_behaviour(conv, option, ctx)


def _default(value: Any) -> Any:
    """The option's default as JSON (None when it has none or it is not plain data)."""
    if value is None or value is argparse.SUPPRESS:
        return None
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str)
                                               for v in value):
        return list(value)
    return None


def describe(action: argparse.Action, option: str, ctx: Context) -> dict[str, Any]:
    entry: dict[str, Any] = {"dest": action.dest}
    longs = [o[2:] for o in action.option_strings if o.startswith("--")]
    if isinstance(action, argparse.BooleanOptionalAction):
        entry["kind"] = "bool"
        entry["default"] = action.default if isinstance(action.default, bool) else None
        if option.startswith("--no-"):
            entry["negates"] = option[len("--no-"):]
        return entry
    if len(longs) > 1:  # one argument, several spellings (0.32: --device-memory-utilization)
        entry["canonical"] = longs[0]
        entry["aliases"] = [o for o in longs if o != option[2:]]
    if isinstance(action, argparse._StoreConstAction | argparse._StoreTrueAction
                  | argparse._StoreFalseAction):
        return {**entry, "kind": "flag"}
    entry.update(classify(action.type, option, ctx))
    if action.nargs is not None:
        entry["nargs"] = action.nargs
    if action.nargs == "?" and action.const is True:
        entry["bare_ok"] = True  # `--hf-token` alone means True
    if isinstance(action, argparse._AppendAction):
        entry["repeatable"] = True
    if action.choices is not None:
        entry["choices"] = [str(c) for c in action.choices]
    default = _default(action.default)
    if default is not None:
        entry["default"] = default
    return entry


def startup_names() -> dict[str, list[str]]:
    """Values vLLM checks after parsing (at engine or API server start)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return {
        # api_server.validate_api_server_args (unless --tool-parser-plugin adds one)
        "tool-call-parser": sorted(ToolParserManager.list_registered()),
        # same place (unless --reasoning-parser-plugin adds one)
        "reasoning-parser": sorted(ReasoningParserManager.list_registered()),
        # AttentionConfig: AttentionBackendEnum[value.upper()]
        "attention-backend": sorted(m.lower() for m in AttentionBackendEnum.__members__),
        # ModelConfig: --quantization must be one of these
        "quantization": sorted(QUANTIZATION_METHODS),
    }


def record(ctx: Context) -> dict[str, Any]:
    from vllm.config import SpeculativeConfig

    parser = serve_parser()
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        # short options (-tp, -O) are not recorded: matrix.yaml's args keys take no dashes
        for option in action.option_strings:
            if option.startswith("--"):
                options[option[2:]] = describe(action, option, ctx)
    # EngineArgs hands --speculative-config's JSON to SpeculativeConfig(**it)
    options["speculative-config"]["fields"] = _fields(SpeculativeConfig)
    return {**header("serve_args", SOURCE), "startup_names": startup_names(),
            "options": dict(sorted(options.items()))}


def dumps(doc: dict[str, Any]) -> str:
    """JSON with one line per option, so an upgrade's diff reads option by option."""
    lines = ["{"]
    for key in [k for k in doc if k not in ("startup_names", "options")]:
        lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key], sort_keys=True)},")
    lines.append('  "startup_names": {')
    names = list(doc["startup_names"].items())
    for i, (flag, values) in enumerate(names):
        comma = "," if i < len(names) - 1 else ""
        lines.append(f"    {json.dumps(flag)}: {json.dumps(values)}{comma}")
    lines += ["  },", '  "options": {']
    items = list(doc["options"].items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines += ["  }", "}", ""]
    return "\n".join(lines)
