"""The Prometheus metric families the installed vLLM can register (`vllm:*`), read from its
source: each string literal naming a metric, with the call that registers it (Counter,
Gauge, Histogram: prometheus_client appends `_total` to a counter's samples, `_bucket`,
`_sum` and `_count` to a histogram's), file and line. bench/ and smoke read these names
from /metrics; a name a version does not register cannot be read from it.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from common import Context, header, vllm_root

SOURCE = "every `vllm:` metric name literal in vLLM's source and the call registering it"
NAME = re.compile(r"vllm:[a-z0-9_]+")  # vllm:: (double colon) names custom ops, not metrics
KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "info": "info"}


def _kind(call: ast.Call | None) -> str | None:
    if call is None:
        return None
    func = call.func
    name = (func.attr if isinstance(func, ast.Attribute) else
            func.id if isinstance(func, ast.Name) else "").lower()
    for key, kind in KINDS.items():
        if key in name:
            return kind
    return None


def record(ctx: Context) -> dict[str, Any]:
    root = vllm_root()
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if "vllm:" not in text:
            continue
        tree = ast.parse(text)
        parents: dict[ast.AST, ast.Call] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for child in [*node.args, *(k.value for k in node.keywords)]:
                    parents[child] = node
        rel = str(path.relative_to(root.parent))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and NAME.fullmatch(node.value)):
                entry = found.setdefault(node.value, {"kind": None, "sources": []})
                entry["sources"].append(f"{rel}:{node.lineno}")
                entry["kind"] = entry["kind"] or _kind(parents.get(node))
    return {**header("metrics", SOURCE), "metrics": dict(sorted(found.items()))}
