"""Write the options `vllm serve` accepts, read from the installed vLLM's own parser.

Run it with the Python of the vLLM it describes (stdlib and vllm only, no imagebuild):

    .venv-vllm/bin/python imagebuild/preflight/vllm_cli/generate.py [--out FILE]

It builds the serve parser exactly as the `vllm` command does (FlexibleArgumentParser,
the serve subcommand, make_arg_parser) and records, for every long option, its dest, how
argparse converts its value (`kind`), nargs and choices; for JSON options that feed one
of vLLM's config classes, the keys that class accepts (they forbid unknown keys); and the
names vLLM checks only at start-up (tool and reasoning parsers, attention backends,
quantization methods). The preflight rule in imagebuild/preflight/serve_args.py reads the
result, serve_args_<version>.json beside this file, without importing vLLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def serve_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import (  # deferred: vLLM (oracle venv)
        ServeSubcommand,
    )
    from vllm.utils.argparse_utils import (  # deferred: vLLM (oracle venv)
        FlexibleArgumentParser,
    )

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers)


def _closure(fn: Any, name: str) -> Any:
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    return cells[name].cell_contents


def _fields(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)


def classify(conv: Any, option: str) -> dict[str, Any]:
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
        return {**classify(_closure(conv, "return_type"), option), "none_ok": True}
    if name == "_parse_type":  # vllm parse_type(): same conversion, argparse-friendly error
        return classify(_closure(conv, "return_type"), option)
    if name == "human_readable_int":
        return {"kind": "human_int"}
    if name == "human_readable_int_or_auto":
        return {"kind": "human_int_or_auto"}
    if name == "union_dict_and_str":
        return {"kind": "json_or_str"}
    if name == "parse_dataclass":  # a config class validated from JSON, extra keys forbidden
        return {"kind": "config", "fields": _fields(conv.__defaults__[0])}
    if name == "<lambda>" and conv("Ab-Cd") == "ab_cd":  # --moe-backend, --linear-backend
        return {"kind": "str", "normalize": "lower_underscore"}
    raise SystemExit(f"generate.py: unknown conversion {conv!r} of {option}; teach classify()")


def describe(action: argparse.Action, option: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"dest": action.dest}
    if isinstance(action, argparse.BooleanOptionalAction):
        entry["kind"] = "bool"
        entry["default"] = action.default if isinstance(action.default, bool) else None
        if option.startswith("--no-"):
            entry["negates"] = option[len("--no-"):]
        return entry
    if isinstance(action, argparse._StoreConstAction | argparse._StoreTrueAction
                  | argparse._StoreFalseAction):
        return {**entry, "kind": "flag"}
    entry.update(classify(action.type, option))
    if action.nargs is not None:
        entry["nargs"] = action.nargs
    if action.nargs == "?" and action.const is True:
        entry["bare_ok"] = True  # `--hf-token` alone means True
    if isinstance(action, argparse._AppendAction):
        entry["repeatable"] = True
    if action.choices is not None:
        entry["choices"] = [str(c) for c in action.choices]
    return entry


def startup_names() -> dict[str, list[str]]:
    """Values vLLM checks after parsing (at engine or API server start)."""
    from vllm.model_executor.layers.quantization import (  # deferred: vLLM (oracle venv)
        QUANTIZATION_METHODS,
    )
    from vllm.reasoning import (  # deferred: vLLM (oracle venv)
        ReasoningParserManager,
    )
    from vllm.tool_parsers import (  # deferred: vLLM (oracle venv)
        ToolParserManager,
    )
    from vllm.v1.attention.backends.registry import (  # deferred: vLLM (oracle venv)
        AttentionBackendEnum,
    )

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


def generate() -> dict[str, Any]:
    import vllm  # deferred: vLLM (oracle venv)
    from vllm.config import (  # deferred: vLLM (oracle venv)
        SpeculativeConfig,
    )

    parser = serve_parser()
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                options[option[2:]] = describe(action, option)
    # EngineArgs hands --speculative-config's JSON to SpeculativeConfig(**it)
    options["speculative-config"]["fields"] = _fields(SpeculativeConfig)
    return {
        "vllm_version": vllm.__version__,
        "source": "vllm serve's argument parser (vllm.entrypoints.cli.serve), written by "
                  "imagebuild/preflight/vllm_cli/generate.py; do not edit by hand",
        "startup_names": startup_names(),
        "options": dict(sorted(options.items())),
    }


def dumps(doc: dict[str, Any]) -> str:
    """JSON with one line per option, so an upgrade's diff reads option by option."""
    lines = ["{"]
    for key in ("vllm_version", "source"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key])},")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="file to write (default: serve_args_<vllm version>.json beside this)")
    args = ap.parse_args(argv)
    doc = generate()
    out = args.out or HERE / f"serve_args_{doc['vllm_version']}.json"
    out.write_text(dumps(doc))
    print(f"wrote {out} ({len(doc['options'])} options)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
