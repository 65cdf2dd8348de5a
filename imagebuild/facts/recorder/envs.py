"""The environment variables vLLM knows (vllm/envs.py `environment_variables`) and what
each reads as when unset: its default, evaluated by vLLM's own getter with the variable
removed from the environment. A variable vLLM does not list is one it only warns about
(`Unknown vLLM environment variable detected`) and otherwise ignores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from common import Context, header, site_path, vllm_root

SOURCE = "vllm/envs.py environment_variables, each getter called with its variable unset"


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, bool | int | float | str)
                                               for v in value):
        return list(value)
    return {"repr": repr(value)}


def _choices(getter: Any) -> list[str] | None:
    """The choices of an env_with_choices getter, through the closures that wrap it."""
    seen, done = [getter], set()
    while seen:
        fn = seen.pop()
        if id(fn) in done or not hasattr(fn, "__code__"):
            continue
        done.add(id(fn))
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
        if "choices" in cells:
            found = cells["choices"].cell_contents
            try:
                return [str(c) for c in (found() if callable(found) else found)]
            except Exception:  # noqa: BLE001 - choices computed from the platform
                return None
        seen += [c.cell_contents for c in cells.values() if callable(c.cell_contents)]
    return None


def record(ctx: Context) -> dict[str, Any]:
    import vllm.envs as envs

    out: dict[str, Any] = {}
    for name, getter in sorted(envs.environment_variables.items()):
        saved = os.environ.pop(name, None)
        try:
            entry: dict[str, Any] = {"default": _plain(getter())}
            os.environ.pop(name, None)  # get_env_or_set_default sets what it generated
            if entry["default"] != _plain(getter()):
                # a fresh random name per call (a uuid in a buffer or socket name): the
                # default is no fact, only that it varies
                entry = {"default_varies": True}
        except Exception as exc:  # noqa: BLE001 - a getter that refuses "unset" is a fact
            entry = {"default_raises": f"{type(exc).__name__}: {exc}"}
        finally:
            os.environ.pop(name, None)
            if saved is not None:
                os.environ[name] = saved
        code = getattr(getter, "__code__", None)
        if code is not None:
            entry["source"] = f"{_source(code.co_filename)}:{code.co_firstlineno}"
        choices = _choices(getter)
        if choices is not None:
            entry["choices"] = choices
        out[name] = entry
    return {**header("envs", SOURCE), "variables": out}


def _source(filename: str) -> str:
    """site_path, also when the venv is reached through a symlink (a worktree's .venv-vllm):
    code objects carry the resolved path, vllm_root() the path as found."""
    root = vllm_root().parent.resolve()
    try:
        return str(Path(filename).resolve().relative_to(root))
    except ValueError:
        return site_path(filename)
