"""The recorded kernel-selection facts of one vLLM version (the `kernel_select` part of the
version's facts, imagebuild/facts: recorded by `build.py facts record` with
facts/recorder/kernel_select.py) and the lookups the predictor makes in them."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from imagebuild.facts import facts_for
from imagebuild.facts import versions as all_versions

GENERATE = "imagebuild/facts/recorder/kernel_select.py"


class NotRecorded(Exception):
    """The facts hold no answer for this input (a capability, switch spelling, layer shape
    or vLLM version the generator did not evaluate): the choice cannot be predicted."""


def load(vllm_version: str, extra_dirs: Iterable[Path] = ()) -> Facts | None:
    found = facts_for(vllm_version, extra_dirs)
    doc = found.kernel_select if found is not None else None
    if doc is None:
        return None
    held = _LOADED.get(id(doc))
    if held is None or held.doc is not doc:
        held = _LOADED[id(doc)] = Facts(doc)
    return held


_LOADED: dict[int, Facts] = {}  # one Facts per loaded document (its lookups are cached)


def versions(extra_dirs: Iterable[Path] = ()) -> list[str]:
    return sorted(v for v, folder in all_versions(extra_dirs).items()
                  if (folder / "kernel_select.json").is_file())


def _key(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


class Facts:
    def __init__(self, doc: dict[str, Any]):
        self.doc = doc
        self.version: str = doc["vllm_version"]

    def __getitem__(self, name: str) -> Any:
        return self.doc[name]

    # --- gates ------------------------------------------------------------------------
    def gate(self, gate: Mapping[str, Any], cc: str, probes: Mapping[str, bool],
             env: Mapping[str, str], **axes: Any) -> Any:
        """A recorded gate's answer: walk its decision tree with the capability, the probe
        answers, the raw environment values (normalised to the recorded domain by how vLLM
        parses each one) and the axis values."""
        node = gate["tree"]
        while "by" in node:
            name = node["by"]
            if name == "cc":
                value = cc
            elif name in axes:
                value = _key(axes[name])
            elif name.startswith("VLLM_"):
                value = self.env_domain(name, env.get(name))
            else:
                value = "1" if probes[name] else "0"
            if value not in node["values"]:
                raise NotRecorded(f"{name}={value!r} (recorded: {sorted(node['values'])})")
            node = node["values"][value]
        return node["is"]

    # --- switches ---------------------------------------------------------------------
    def parse_env(self, name: str, raw: str | None) -> Any:
        """What vLLM reads from the environment variable (envs.py), or raises what it
        raises: a recorded spelling; any value of a choice variable (the recorded invalid
        one's error, reworded); any value of a list variable, split as vLLM splits it."""
        entry = self.doc["switches"].get(name)
        if entry is None:
            raise NotRecorded(f"switch {name} is not recorded")
        table = entry["read"]
        sample = "" if raw is None else raw
        if sample not in table:
            if "choices" in entry:
                if sample in entry["choices"]:
                    return sample
                bad = table[entry["invalid"]]
                raise VllmRaises(bad["raises"], bad["message"].replace(
                    f"'{entry['invalid']}'", f"'{sample}'"))
            if "split" in entry:
                return sample.split(entry["split"])
            raise NotRecorded(f"{name}={raw!r}: vLLM's reading of this spelling is not "
                              f"recorded (recorded: {sorted(table)})")
        value = table[sample]
        if isinstance(value, dict):  # vLLM raises while reading it
            raise VllmRaises(value["raises"], value["message"])
        return ast.literal_eval(value)

    def env_domain(self, name: str, raw: str | None) -> str:
        """The recorded domain value ("", "0", "1") vLLM reads the same as `raw`."""
        if raw is None or raw == "":
            return ""
        if raw in ("0", "1"):
            return raw
        wanted = self.parse_env(name, raw)
        for candidate in ("0", "1"):
            try:
                if self.parse_env(name, candidate) == wanted:
                    return candidate
            except VllmRaises:
                continue
        raise NotRecorded(f"{name}={raw!r} reads as {wanted!r}, not recorded for gates")


class VllmRaises(Exception):
    """vLLM raises this at model load: the exception class name and its message."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message
