"""Pure helpers the check suite (tests/smoke/) uses to talk to a vLLM server and judge it."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterable
from typing import Any

SPEC_DRAFT = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
# The exact text each tool-call parser reads as one call of TOOL with city=Paris. Forcing it
# with structured outputs tests the parser and the template, not the model (CPU_ENGINE.md).
TOOL_CALL_TEXT = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                    "</parameter>\n</function>\n</tool_call>"),
}


def metric_sum(text: str, name: str) -> float | None:
    """Sum of one counter over all its label sets; None when the server has no such metric."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    return total if seen else None


def tool_call_regex(parser: str) -> str:
    if parser not in TOOL_CALL_TEXT:
        raise KeyError(f"no forced tool-call text for parser {parser!r}; add one to "
                       "imagebuild/smoke/probes.py TOOL_CALL_TEXT")
    return re.escape(TOOL_CALL_TEXT[parser])


def message_text(message: dict[str, Any]) -> str:
    """The answer wherever the reasoning parser put it (vLLM names the field either way)."""
    parts = [message.get(k) or "" for k in ("content", "reasoning_content", "reasoning")]
    return "".join(p for p in parts if isinstance(p, str))


def sse_events(lines: Iterable[str]) -> list[str]:
    """The `data:` payloads of a server-sent-event stream, in order."""
    return [line[5:].strip() for line in lines if line.startswith("data:")]


def stream_text(events: list[str]) -> str:
    text = []
    for payload in events:
        if payload == "[DONE]":
            continue
        for choice in json.loads(payload).get("choices", []):
            text.append(message_text(choice.get("delta") or {}))
    return "".join(text)


def png(width: int = 32, height: int = 32, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A solid-colour PNG, written by hand so the suite needs no imaging library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


def degenerate(text: str) -> bool:
    """DOMAIN.md: a skip-loaded vision tower answers images with a run of `!`."""
    stripped = text.strip()
    return not stripped or set(stripped) <= {"!"}


LINE_CHARS = 400  # vLLM prints whole configs on one line; quote their start


def _numbered(i: int, line: str) -> str:
    return f"{i + 1}: {line[:LINE_CHARS]}" + (" [...]" if len(line) > LINE_CHARS else "")


def matching_lines(lines: list[str], pattern: str | re.Pattern[str], limit: int = 20
                   ) -> list[str]:
    rx = re.compile(pattern) if isinstance(pattern, str) else pattern
    return [_numbered(i, line) for i, line in enumerate(lines) if rx.search(line)][:limit]


PROBLEMS = re.compile(r"ERROR|Error|Exception|Traceback|WARNING|not found|failed", re.I)


def quote_log(lines: list[str], pattern: str | re.Pattern[str] | None = None, tail: int = 15
              ) -> str:
    """Log lines for a failure message: the matching ones (else the suspicious ones) plus
    the tail, numbered as in the saved container log."""
    picked = matching_lines(lines, pattern) if pattern is not None else []
    if not picked:
        picked = matching_lines(lines, PROBLEMS, limit=10)
    start = max(0, len(lines) - tail)
    end = [_numbered(i, line) for i, line in enumerate(lines[start:], start)]
    body = "\n".join(picked) if picked else "(none)"
    return (f"--- relevant container log lines ---\n{body}\n"
            f"--- last {len(end)} log lines ---\n" + "\n".join(end))
