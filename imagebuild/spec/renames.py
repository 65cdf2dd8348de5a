"""Fields the schema renamed or removed, so an older matrix is answered with the
replacement instead of a bare "Extra inputs are not permitted". validate() (config.py)
consults the table for an unknown key; `build.py migrate` (spec/migrate.py) applies the
rewrites that need no judgement; the reference page lists it.

Policy: a change that makes a matrix the previous schema accepted invalid bumps
`schema:` (config.SCHEMA_VERSION) and adds its rows here with the version it ended in.
The `gpu` -> `accelerator` rename predates the policy and happened within schema 1.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Rename:
    path: tuple[str, ...]  # the old key's path; "*" matches any name (fnmatch)
    new: str  # the replacement key in the same mapping
    hint: str  # what to write instead, in words
    values: dict[Any, Any] = field(default_factory=dict)  # old value -> new value
    schema: int = 1  # the last schema version that knew the old key (or 1: within it)

    @property
    def shown(self) -> str:
        return ".".join("NAME" if p == "*" else p for p in self.path)

    def matches(self, loc: tuple[Any, ...]) -> bool:
        return len(loc) == len(self.path) and all(
            fnmatch.fnmatchcase(str(part), pat) for part, pat in zip(loc, self.path,
                                                                      strict=True))


RENAMES: tuple[Rename, ...] = (
    Rename(("targets", "*", "gpu"), "accelerator",
           "renamed to `accelerator`: `gpu: true` is `accelerator: cuda` (with "
           "`compute_capability`, e.g. \"12.1\"), `gpu: false` is `accelerator: cpu`",
           values={True: "cuda", False: "cpu"}),
)


def renamed(loc: tuple[Any, ...]) -> Rename | None:
    return next((r for r in RENAMES if r.matches(loc)), None)
