"""Which input modalities each multimodal architecture of vLLM takes.

For every architecture in vLLM's multimodal model registry it records the modalities its
processing info's `get_supported_mm_limits` names (image, video, audio, ...): vLLM takes
only those and ignores any other key of `--limit-mm-per-prompt`. The method is called
where it does not read the model's config; where the model module cannot be imported in
this (CPU) install, the method's `return {...}` is read from the source instead; where
the answer depends on the checkpoint's config, the architecture is listed as such. The
preflight (imagebuild/preflight/families.py) reads the result without importing vLLM.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

from common import Context, header

SOURCE = ("vLLM's multimodal model registry (get_supported_mm_limits of each "
          "architecture's processing info)")


class _NoConfig:
    """Stands in for the processing info's `self`: any attribute read means the answer
    depends on the model's config."""

    def __getattr__(self, name: str) -> Any:
        raise LookupError(name)


def _called(cls: type) -> list[str] | None:
    factory = getattr(cls, "_processor_factory", None)
    info = getattr(factory, "info", None)
    if not inspect.isclass(info):
        return None
    try:
        return sorted(info.get_supported_mm_limits(_NoConfig()))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - any failure means: not answerable without a config
        return None


class _Source:
    """get_supported_mm_limits read from the model modules' source (no import)."""

    def __init__(self, models_dir: Path) -> None:
        self.dir = models_dir
        self.classes: dict[str, ast.ClassDef] = {}
        for path in sorted(models_dir.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)

    def _info_name(self, cls_name: str) -> str | None:
        node = self.classes.get(cls_name)
        for deco in node.decorator_list if node else ():
            if isinstance(deco, ast.Call):
                for kw in deco.keywords:
                    if kw.arg == "info" and isinstance(kw.value, ast.Name):
                        return kw.value.id
        return None

    def _limits(self, cls_name: str, depth: int = 0) -> list[str] | None:
        node = self.classes.get(cls_name)
        if node is None or depth > 8:
            return None
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "get_supported_mm_limits":
                body = [s for s in item.body if not isinstance(s, ast.Expr)]  # docstrings
                if (len(body) == 1 and isinstance(body[0], ast.Return)
                        and isinstance(body[0].value, ast.Dict)
                        and all(isinstance(k, ast.Constant) for k in body[0].value.keys)):
                    return sorted(str(k.value) for k in body[0].value.keys  # type: ignore
                                  )
                return None  # computed: depends on the config
        for base in node.bases:
            if isinstance(base, ast.Name):
                found = self._limits(base.id, depth + 1)
                if found is not None:
                    return found
        return None

    def modalities(self, cls_name: str) -> list[str] | None:
        info = self._info_name(cls_name)
        return self._limits(info) if info else None


def record(ctx: Context) -> dict[str, Any]:
    import vllm
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS

    source = _Source(Path(vllm.__file__).parent / "model_executor" / "models")
    found: dict[str, list[str]] = {}
    depends: list[str] = []
    for arch, (module, cls_name) in sorted(_MULTIMODAL_MODELS.items()):
        try:
            cls = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"),
                          cls_name)
            got = _called(cls)
        except Exception:  # noqa: BLE001 - a module this CPU install cannot import
            got = None
        got = got if got is not None else source.modalities(cls_name)
        if got is None:
            depends.append(arch)
        else:
            found[arch] = got
    return {**header("modalities", SOURCE), "modalities": found, "depends_on_config": depends}
