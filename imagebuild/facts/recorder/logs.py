"""Every message the installed vLLM can log at INFO or above, read from its source: each
`logger.<level>(...)` (and `*_once`) call whose message is a literal, an f-string or a
concatenation of them, or a call of a function of the same module that returns one (the
MoE oracles log `logger.info_once(_make_log_backend(backend))`: each template the helper
returns is recorded at the logger call's line), and the f-strings of `__str__`/`__repr__`
methods (vLLM logs its config through them: `speculative_config=SpeculativeConfig(
method=...)`), each with its file and line. DEBUG calls are left out: a server at vLLM's
default level never prints them. imagebuild/facts/signals.py finds the lines smoke reads
in this catalogue; a pattern no message of a version can produce is a check smoke cannot
make on that version.

Templates keep printf directives (`%s`) as written; an f-string's replacement fields are
written as the unit separator U+001F; web addresses in messages (vLLM points at issues and
package indexes) are written as <url>: no smoke pattern reads one, and the repository names
no package index.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from common import Context, header, vllm_root

SOURCE = "every logger call (INFO and above) and __str__/__repr__ f-string in vLLM's source"
LEVELS = ("info", "warning", "warn", "error", "critical", "exception", "fatal")
FIELD = "\x1f"
LOGGER_NAMES = ("logger", "log", "_logger", "LOGGER")
URL = re.compile(r"(?:[a-z][a-z0-9+.-]*\+)?[a-z][a-z0-9+.-]*://[^\s`'\")\]]+")


def template(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else FIELD for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        return None if left is None or right is None else left + right
    return None


def _logger_call(node: ast.Call) -> str | None:
    """The level of a `logger.info(...)`-like call, else None."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    level = func.attr.removesuffix("_once")
    owner = func.value
    name = owner.id if isinstance(owner, ast.Name) else (
        owner.attr if isinstance(owner, ast.Attribute) else "")
    if level in LEVELS and (name in LOGGER_NAMES or name.endswith("logger")):
        return level
    return None


def _helpers(tree: ast.AST) -> dict[str, list[str]]:
    """Functions of a module (at any depth) -> the message templates they return."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found = [t for inner in ast.walk(node) if isinstance(inner, ast.Return)
                     and inner.value is not None and (t := template(inner.value)) is not None]
            if found:
                out.setdefault(node.name, []).extend(found)
    return out


def _messages(arg: ast.AST, helpers: dict[str, list[str]]) -> list[str]:
    """The templates a logger call's message argument can be."""
    t = template(arg)
    if t is not None:
        return [t]
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):
        return helpers.get(arg.func.id, [])
    return []


def scan(text: str) -> list[tuple[int, str, str]]:
    out = []
    tree = ast.parse(text)
    helpers = _helpers(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            level = _logger_call(node)
            if level is not None:
                out += [(node.lineno, level, t) for t in _messages(node.args[0], helpers)]
        elif isinstance(node, ast.FunctionDef) and node.name in ("__str__", "__repr__"):
            for inner in ast.walk(node):
                if isinstance(inner, ast.JoinedStr):
                    t = template(inner)
                    if t and t.strip(FIELD + " ,"):
                        out.append((inner.lineno, "repr", t))
    return out


def record(ctx: Context) -> dict[str, Any]:
    root = vllm_root()
    messages: list[list[Any]] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if "logger" not in text and "__repr__" not in text and "__str__" not in text:
            continue
        try:
            found = scan(text)
        except SyntaxError as exc:
            ctx.finding(f"{path.relative_to(root.parent)} does not parse ({exc}); its "
                        "messages are not recorded")
            continue
        rel = str(path.relative_to(root.parent))
        messages += [[f"{rel}:{line}", level, URL.sub("<url>", t)]
                     for line, level, t in sorted(set(found))]
    return {**header("logs", SOURCE), "field": FIELD, "messages": messages}


def dumps(doc: dict[str, Any]) -> str:
    """One message per line, so a version's diff reads message by message."""
    import json

    head = {k: v for k, v in doc.items() if k != "messages"}
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in
                     head.items()]
    lines.append('  "messages": [')
    n = len(doc["messages"])
    lines += [f"    {json.dumps(m, ensure_ascii=False)}{',' if i < n - 1 else ''}"
              for i, m in enumerate(doc["messages"])]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
