"""What a healthy container of an image must show, as plain JSON-able data.

The expectations come from the cell (matrix.yaml + lock) when it is known, else from the
image's own labels and CMD: `smoke IMAGE_REF` works on any image this project built.
plan.py gives every Job its cell's expectations (`Job.expect`); a stage with a Job reads
those, and only an image known by reference alone asks `expectations_from_labels`, with
the matrix in effect (--matrix, $IMAGEBUILD_MATRIX, ./matrix.yaml, the repository's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.facts import facts_for, locked_dir
from imagebuild.facts.signals import (
    SPECULATIVE_METRICS,
    missing_metrics,
    readers,
    unreadable,
)
from imagebuild.lock.lockfile import Lock, read_lock, served_files
from imagebuild.spec import matrix as mx
from imagebuild.spec.matrix import Cell
from imagebuild.spec.names import LABEL_NS
from imagebuild.spec.servecmd import DRAFTER_DIR, MODEL_DIR, ServeCommand, serve_command

SMALL_FILE = 50 * 2**20  # the weight_groups threshold: small files are hashed, shards sized
# Used when an image's cell is not in matrix.yaml: no floor is known, counters must still move.
DEFAULT_TARGET = {"gpu": False, "concurrency": [8], "boot_timeout_s": 600, "memory_limit": "8g"}


def _files(lock: Lock | None, kind: str, name: str, dest: str,
           exclude: list[str] | tuple[str, ...] = ()) -> dict[str, dict] | None:
    """path in the container -> expected size and, for small files, hash."""
    entry = lock.entry(kind, name) if lock else None
    if not entry or entry.get("files") is None:
        return None
    out: dict[str, dict] = {}
    for f in served_files(entry["files"], exclude):
        want: dict[str, Any] = {"size": f["size"]}
        if f["size"] < SMALL_FILE:
            if f.get("sha256"):
                want["sha256"] = f["sha256"]
            elif f.get("lfs_sha256"):
                want["sha256"] = f["lfs_sha256"]
            elif f.get("blob_id"):  # a plain git file on the Hub: its git blob id
                want["git_blob"] = f["blob_id"]
        out[f"{dest}/{f['path']}"] = want
    return out


def _from_command(cmd: ServeCommand) -> dict[str, Any]:
    """Everything the serve argv itself says about what the server offers."""
    spec = cmd.flag("speculative-config")
    mm = cmd.flag("limit-mm-per-prompt")
    names_at = cmd.argv.index("--served-model-name") if "--served-model-name" in cmd.argv else -1
    names = []
    for arg in cmd.argv[names_at + 1:] if names_at >= 0 else ():
        if arg.startswith("--"):
            break
        names.append(arg)
    tool_parser = cmd.flag("tool-call-parser")
    reasoning_parser = cmd.flag("reasoning-parser")
    return {
        "served_names": names,
        "tools": cmd.flag("enable-auto-tool-choice") is True and isinstance(tool_parser, str),
        "tool_parser": tool_parser if isinstance(tool_parser, str) else None,
        "reasoning": isinstance(reasoning_parser, str),
        "reasoning_parser": reasoning_parser if isinstance(reasoning_parser, str) else None,
        "speculative_method": json.loads(spec)["method"] if isinstance(spec, str) else None,
        "multimodal": json.loads(mm) if isinstance(mm, str) else None,
        "port": cmd.port,
        "host": cmd.host,
    }


def expected_backends(cell: Cell) -> dict[str, str]:
    """The profile's expect_backends; a cell without a drafter boots with no speculative
    method whatever a profile it extends expects (speculation is the cell's, not the
    profile's: a plain cell of a profile that extends a speculative one)."""
    prof = cell.profile
    want = ({k: v for k, v in prof.expect_backends.model_dump().items() if v is not None}
            if prof.expect_backends else {})
    if cell.drafter is None and "speculative" in want:
        want["speculative"] = "none"
    if cell.drafter is None:  # no drafter model: nothing of its to assert
        want = {k: v for k, v in want.items() if not k.startswith("drafter_")}
    return want


def signals(version: str | None, gpu: bool, root: Path | None) -> dict[str, Any]:
    """How smoke reads this vLLM version's log and /metrics (facts/signals.py): the
    readers of its messages on the platform, the signals none of them carries and why, and
    the speculative-decoding metrics it does not register. The facts are the version's
    (shipped, or recorded beside the matrix at `root`), never another version's."""
    facts = facts_for(version, [locked_dir(root)] if root else []) if version else None
    platform = "cuda" if gpu else "cpu"
    read = readers(facts, platform)
    return {"vllm_version": version, "log_readers": read,
            "log_unreadable": unreadable(facts, platform, read),
            "metrics_missing": missing_metrics(facts, SPECULATIVE_METRICS)}


def expectations_for(cell: Cell, lock: Lock | None, root: Path | None = None
                     ) -> dict[str, Any]:
    """The cell's promises: served names, parsers, speculation, limits, files to verify.
    `root`: the matrix's folder (its locked/vllm facts; default: beside the lock)."""
    cmd = serve_command(cell)
    exp = _from_command(cmd)
    prof, target = cell.profile, cell.target
    exp.update({
        "source": "cell",
        "cell": cell.id,
        "engine": cell.engine_name,
        "image": cell.image,
        "target": cell.target_name,
        "gpu": target.gpu,
        "served_names": list(cell.model.served_names),
        # a profile may switch a parser's check off even when the flag is present
        "reasoning": exp["reasoning"] and prof.reasoning,
        "tools": exp["tools"] and prof.tools,
        # None: the cell serves without speculative decoding (the check is not applicable)
        "speculative_method": cell.drafter.method if cell.drafter else None,
        "acceptance_floor": prof.acceptance_floor,
        # kernels the boot must choose (smoke/backends.py); {} asserts none, reports all
        "expect_backends": expected_backends(cell),
        "multimodal": cell.model.multimodal,
        "concurrency": list(target.smoke_concurrency),
        "boot_timeout_s": target.boot_timeout_s,
        "memory_limit": target.memory_limit,
        **signals(cell.engine.vllm_version, target.gpu,
                  root or (lock.path.parent if lock else None)),
    })
    model = _files(lock, "models", cell.model_name, MODEL_DIR, cell.model.exclude)
    drafter = (_files(lock, "drafters", cell.drafter_name, DRAFTER_DIR, cell.drafter.exclude)
               if cell.drafter and cell.drafter.repository else {})
    exp["files"] = None if model is None or drafter is None else {**model, **drafter}
    return exp


def expectations_from_labels(image_ref: str, info: dict[str, Any], *,
                             matrix: Path | None = None) -> dict[str, Any]:
    """Expectations for an image by reference (`info`: its inspect data): its cell (label
    io.imagebuild.cell) when the matrix in effect (`matrix`, else spec.matrix.matrix_path's
    default) still has it, else what its labels and CMD say."""
    labels = info.get("Config", {}).get("Labels") or {}
    cell_id = labels.get(f"{LABEL_NS}.cell")
    engine = labels.get(f"{LABEL_NS}.engine")
    if not cell_id:
        raise UserError(f"image {image_ref} has no {LABEL_NS}.cell label",
                        fix="smoke-test images built by `build.py build`")
    path: Path | None = None
    try:  # no matrix at all (an installed tool outside a project): the labels alone
        path = mx.matrix_path(matrix)
        lm = mx.load(path)
        cells = [c for c in mx.expand(lm) if c.id == cell_id and c.engine_name == engine]
    except UserError:
        cells = []
    if cells:
        exp = expectations_for(cells[0], read_lock(lm.root), lm.root)
    else:
        cmd = list(info.get("Config", {}).get("Cmd") or [])
        target_name = cell_id.split("/", 1)[0]
        exp = _from_command(argv_command(cmd))
        exp.update({"source": "labels", "cell": cell_id, "engine": engine,
                    "image": cell_id.split("/", 1)[-1], "target": target_name,
                    **{k: v for k, v in DEFAULT_TARGET.items()},
                    "gpu": needs_gpu(info), "acceptance_floor": 0.0, "files": None,
                    # the engine image's label, inherited by the serve image
                    **signals(labels.get(f"{LABEL_NS}.vllm.version"), needs_gpu(info),
                              path.parent if path else None)})
    # what the image itself claims; a disagreement with the cell is a finding in itself
    exp["labels"] = {
        "served_names": [n for n in labels.get(f"{LABEL_NS}.served-names", "").split(",") if n],
        "speculative_method": labels.get(f"{LABEL_NS}.speculative.method"),
    }
    return exp


def needs_gpu(info: dict[str, Any]) -> bool:
    """An image built on NVIDIA's CUDA images asks the container runtime for GPUs
    (NVIDIA_VISIBLE_DEVICES in its environment); the CPU images do not."""
    env = info.get("Config", {}).get("Env") or []
    return any(str(e).split("=", 1)[0] == "NVIDIA_VISIBLE_DEVICES" for e in env)


def argv_command(argv: list[str]) -> ServeCommand:
    """A serve command as an image's CMD holds it (its flags read by ServeCommand.flag)."""
    probe = ServeCommand(argv=tuple(argv), env=(), port=8000, host="127.0.0.1")
    port, host = probe.flag("port"), probe.flag("host")
    return ServeCommand(argv=tuple(argv), env=(),
                        port=int(port) if isinstance(port, str) else 8000,
                        host=host if isinstance(host, str) else "127.0.0.1")
