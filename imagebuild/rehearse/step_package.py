"""Step (c): placeholder until the recipe's build and version scripts are merged."""

from __future__ import annotations

from pathlib import Path

from .inputs import Inputs
from .steps import Step


def rehearse_package(inputs: Inputs, checkout: Path | None, workdir: Path) -> Step:
    return Step("c", "Python-only package + version").skipped("not written yet")
