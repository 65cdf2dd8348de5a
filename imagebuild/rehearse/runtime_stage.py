"""What the rendered engine Dockerfile's `runtime` stage sets and runs for its self-check:
its ENV and each `runtime-selfcheck.py` invocation, so the rehearsal runs the recipe's
own command lines rather than a copy of them."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = "runtime-selfcheck.py"


@dataclass
class RuntimeStage:
    env: dict[str, str] = field(default_factory=dict)
    selfchecks: list[list[str]] = field(default_factory=list)  # arguments after the script


def logical_lines(text: str) -> list[str]:
    """Instructions with continuations joined, comment lines dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(" ".join(cur.split()))
        cur = ""
    if cur.strip():
        out.append(" ".join(cur.split()))
    return out


def read_runtime_stage(text: str, stage: str = "runtime") -> RuntimeStage:
    found, inside = RuntimeStage(), False
    for line in logical_lines(text):
        head = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if head:
            inside = (head.group(1) or "").lower() == stage
            continue
        if not inside:
            continue
        if line.upper().startswith("ENV "):
            for token in shlex.split(line[4:]):
                key, sep, value = token.partition("=")
                if sep:
                    found.env[key] = value
        elif line.upper().startswith("RUN ") and SCRIPT in line:
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                at = [i for i, w in enumerate(words) if w.endswith("/" + SCRIPT)]
                if at:
                    found.selfchecks.append(words[at[0] + 1:])
    return found


def localize(env: dict[str, str], cuda_home: str, venv: str) -> dict[str, str]:
    """The stage's ENV on this machine: /usr/local/cuda is this toolkit, /opt/vllm the
    torch Python's environment, $VAR and ${VAR} this process's values."""
    base = dict(os.environ)
    out = {}
    for key, value in env.items():
        value = re.sub(r"/usr/local/cuda(?=/|$|:)", cuda_home, value)
        value = re.sub(r"/opt/vllm(?=/|$|:)", venv, value)
        value = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                       lambda m: base.get(m.group(1) or m.group(2), ""), value)
        out[key] = value
    return out


def engine_dockerfile(root: Path, target: str, engine: str) -> Path:
    return root / "rendered" / target / engine / "engine.Dockerfile"
