"""Release tags: `--tag DATE-NAME` -> release tag `DATE-v<vLLM version>-NAME`.

Release tags order by date, then vLLM version (packaging.version), then name.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from imagebuild.errors import UserError

SHORT = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<name>[a-z0-9][a-z0-9._-]*)\Z")
FULL = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-v(?P<version>\d[0-9A-Za-z._]*)"
                  r"-(?P<name>[a-z0-9][a-z0-9._-]*)\Z")


MAX_TAG = 128  # the OCI distribution tag limit


@dataclass(frozen=True, order=False)
class ReleaseTag:
    date: dt.date
    vllm_version: str
    name: str  # engine patch-set name

    @property
    def short(self) -> str:
        return f"{self.date.isoformat()}-{self.name}"

    def __str__(self) -> str:
        return f"{self.date.isoformat()}-v{self.vllm_version}-{self.name}"

    def sort_key(self) -> tuple[dt.date, Version, str]:
        return (self.date, Version(self.vllm_version), self.name)


def _date(text: str, tag: str, option: str = "--tag") -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise UserError(f"{option} {tag!r}: {text!r} is not a calendar date",
                        fix="use YYYY-MM-DD, e.g. 2026-06-18-dflashfix") from None


def parse_tag(tag: str, engines: dict[str, str]) -> ReleaseTag:
    """Parse a short (`DATE-NAME`) or full (`DATE-vX.Y.Z-NAME`) tag.

    `engines` maps patch-set name -> vLLM version (from matrix.yaml).
    """
    valid = ", ".join(sorted(engines)) or "(none)"
    full = FULL.match(tag)
    m = full or SHORT.match(tag)
    if not m:
        raise UserError(
            f"--tag {tag!r} is not DATE-NAME (lowercase letters, digits, '.', '_', '-')",
            fix=f"use e.g. 2026-06-18-{next(iter(sorted(engines)), 'NAME')}; names: {valid}")
    date = _date(m["date"], tag)
    name = m["name"]
    if name not in engines:
        raise UserError(f"--tag {tag!r}: no engine patch set named {name!r}",
                        fix=f"valid names: {valid}")
    version = engines[name]
    if full:
        try:
            Version(m["version"])
        except InvalidVersion:
            raise UserError(f"--tag {tag!r}: {m['version']!r} is not a version",
                            fix=f"use DATE-v{version}-{name} or DATE-{name}") from None
        if m["version"] != version:
            raise UserError(f"--tag {tag!r} names vLLM {m['version']} but engine {name} is "
                            f"{version}",
                            fix=f"use {m['date']}-v{version}-{name} or {m['date']}-{name}")
    rtag = ReleaseTag(date=date, vllm_version=version, name=name)
    if len(str(rtag)) > MAX_TAG:
        raise UserError(f"--tag: the release tag {str(rtag)[:40]}... is {len(str(rtag))} "
                        f"characters; registries take {MAX_TAG}",
                        fix="use a shorter engine patch-set name in matrix.yaml")
    return rtag


def check_tag_text(text: str, option: str) -> str:
    """A release tag a user typed (`DATE-NAME` or `DATE-vX.Y.Z-NAME`), checked without a
    matrix: its shape and date. UserError names the option."""
    m = FULL.match(text) or SHORT.match(text)
    if not m or len(text) > MAX_TAG:
        raise UserError(f"{option} {text[:60]!r} is neither DATE-NAME nor DATE-vX.Y.Z-NAME",
                        fix="e.g. 2026-06-11-pr41703 or 2026-06-11-v0.23.0-pr41703")
    _date(m["date"], text, option)
    if "version" in m.groupdict():
        try:
            Version(m["version"])
        except InvalidVersion:
            raise UserError(f"{option} {text!r}: {m['version']!r} is not a version",
                            fix="e.g. 2026-06-11-v0.23.0-pr41703") from None
    return text


def parse_release_tag(tag: str) -> ReleaseTag | None:
    """A registry tag that looks like a release tag, else None (e.g. `latest`)."""
    m = FULL.match(tag)
    if not m:
        return None
    try:
        Version(m["version"])
        return ReleaseTag(dt.date.fromisoformat(m["date"]), m["version"], m["name"])
    except (ValueError, InvalidVersion):
        return None


def newest_first(tags: list[ReleaseTag]) -> list[ReleaseTag]:
    return sorted(tags, key=ReleaseTag.sort_key, reverse=True)
