"""`extends:` between profiles, resolved on the located data before the schema sees it.

A profile that says `extends: base` starts from everything `base` resolves to; its own
fields replace the parent's, except `args` and `env`, which are merged key by key (the
parent's keys first, in their order, with the child's values; then the child's new keys).
The serve command keeps that order, so a child states only what differs. An inherited
value keeps the file position where it is written, so an error in it names that line.
An unknown parent or profiles extending each other in a circle are errors at the
`extends:` that causes them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from imagebuild.errors import UserError
from imagebuild.spec.yamlpos import Located, Path_, shorten

SECTION = "profiles"
MERGED = ("args", "env")  # mappings merged key by key; every other field is replaced


def resolve_extends(located: Located) -> Located:
    profiles = located.data.get(SECTION) if isinstance(located.data, dict) else None
    if not isinstance(profiles, dict) or not any(
            isinstance(p, dict) and "extends" in p for p in profiles.values()):
        return located
    marks = dict(located.marks)
    scalars = dict(located.scalars)
    done: dict[str, Any] = {}

    def where(name: str) -> str:
        return located.where((SECTION, name, "extends"))

    def resolve(name: str, chain: tuple[str, ...]) -> Any:
        if name in done:
            return done[name]
        own = profiles[name]
        if not isinstance(own, dict) or "extends" not in own:
            done[name] = own
            return own
        parent = own["extends"]
        if not isinstance(parent, str) or not parent:
            raise UserError(f"profile {name!r}: extends names one profile, found "
                            f"{shorten(parent)}",
                            fix="write `extends: NAME` with the name of another profile",
                            where=where(name))
        if parent not in profiles:
            raise UserError(f"profile {name!r} extends {parent!r}, which is not a profile",
                            fix=f"use one of: {', '.join(p for p in profiles if p != name)}",
                            where=where(name))
        if parent in chain or parent == name:
            circle = " -> ".join((*chain, parent))
            raise UserError(f"profiles extend each other in a circle: {circle}",
                            fix="let one of them stand alone (remove its `extends`) and "
                                "put the shared settings there", where=where(name))
        base = resolve(parent, (*chain, parent))
        if not isinstance(base, dict):
            done[name] = own  # the schema reports the malformed parent
            return own
        merged = {k: v for k, v in base.items() if k != "extends"}
        inherited: list[Path_] = [(k,) for k in merged if k not in own]
        for key, value in own.items():
            if key in MERGED and isinstance(value, dict) and isinstance(merged.get(key), dict):
                inherited += [(key, k) for k in merged[key] if k not in value]
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        _copy_positions(marks, scalars, (SECTION, parent), (SECTION, name), inherited)
        done[name] = merged
        return merged

    data = dict(located.data)
    data[SECTION] = {name: resolve(name, (name,)) for name in profiles}
    return replace(located, data=data, marks=marks, scalars=scalars)


def _copy_positions(marks: dict, scalars: dict, src: Path_, dst: Path_,
                    inherited: list[Path_]) -> None:
    """Inherited values are reported where the parent writes them."""
    for table in (marks, scalars):
        for path in [p for p in table if p[:len(src)] == src]:
            rest = path[len(src):]
            if any(rest[:len(i)] == i for i in inherited):
                table[dst + rest] = table[path]
