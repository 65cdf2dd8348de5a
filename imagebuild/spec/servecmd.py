"""The resolved serve command and environment of a cell, as data.

The same argv is the image CMD, what preflight rules read, and what release notes print.
Paths inside the image: the model at /model, a drafter model at /drafter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from imagebuild.spec.matrix import Cell

MODEL_DIR = "/model"
DRAFTER_DIR = "/drafter"
# vLLM runtime caches; persisting /root/.cache/vllm cuts restarts (docs/domain.md)
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
HOST = "127.0.0.1"  # every server we start listens on loopback only (serving/runspec.py)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def speculative_config(cell: Cell) -> dict[str, Any] | None:
    """--speculative-config of the cell; None when it serves without speculation."""
    d = cell.drafter
    if d is None:
        return None
    spec: dict[str, Any] = {"method": d.method}
    if d.repository:
        spec["model"] = DRAFTER_DIR
    spec["num_speculative_tokens"] = d.num_speculative_tokens
    spec.update(d.options)
    return spec


@dataclass(frozen=True)
class ServeCommand:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    port: int
    host: str

    def flag(self, name: str) -> str | bool | None:
        """Value of `--name` (True for a bare flag), None when absent."""
        key = f"--{name}"
        for i, arg in enumerate(self.argv):
            if arg == key:
                nxt = self.argv[i + 1] if i + 1 < len(self.argv) else None
                return True if nxt is None or nxt.startswith("--") else nxt
            if arg.startswith(key + "="):
                return arg.split("=", 1)[1]
        return None


def args_argv(args: dict[str, Any]) -> list[str]:
    """A profile's args as `vllm serve` reads them: `true` the bare flag, `false` nothing,
    a mapping compact JSON, a list one argument per value (vLLM's nargs="+" options such
    as --cudagraph-capture-sizes, vllm/engine/arg_utils.py _compute_kwargs), else str()."""
    argv: list[str] = []
    for key, value in args.items():
        if value is False:
            continue
        argv.append(f"--{key}")
        if isinstance(value, list):
            argv += [str(v) for v in value]
        elif value is not True:
            argv.append(_compact(value) if isinstance(value, dict) else str(value))
    return argv


def serve_command(cell: Cell) -> ServeCommand:
    model, prof = cell.model, cell.profile
    argv: list[str] = ["vllm", "serve", MODEL_DIR, "--served-model-name", *model.served_names]
    if model.quantization:
        argv += ["--quantization", model.quantization]
    argv += args_argv(prof.args)
    par = prof.parallel
    if par is not None:  # the flags every node shares; spec/nodecmd.py adds each node's own
        argv += ["--tensor-parallel-size", str(par.tensor_parallel_size)]
        if par.multi_node or par.backend == "ray":
            argv += ["--distributed-executor-backend", par.backend]
    if model.multimodal:
        argv += ["--limit-mm-per-prompt", _compact(model.multimodal)]
    spec = speculative_config(cell)
    if spec is not None:
        argv += ["--speculative-config", _compact(spec)]
    env = {**BASE_ENV, **prof.env}
    host = str(prof.args.get("host", "127.0.0.1"))
    port = int(prof.args.get("port", prof.port))  # type: ignore[arg-type]
    return ServeCommand(argv=tuple(argv), env=tuple(sorted(env.items())), port=port, host=host)


def with_listen(argv: list[str], port: int | str) -> list[str]:
    """The serve argv with `--host 127.0.0.1 --port PORT`, whatever it said before."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True
            continue
        if arg.startswith(("--host=", "--port=")):
            continue
        out.append(arg)
    return out + ["--host", HOST, "--port", str(port)]
