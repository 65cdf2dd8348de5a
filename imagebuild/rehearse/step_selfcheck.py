"""Step (d): placeholder until the recipe's runtime self-check is merged."""

from __future__ import annotations

from pathlib import Path

from .inputs import Inputs
from .steps import Step


def rehearse_selfcheck(inputs: Inputs, workdir: Path) -> Step:
    return Step("d", "runtime-stage self-check").skipped("not written yet")
