"""The Debian mirror comes from a setting or the host's apt sources, never a built-in host."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.builder.aptsources import apt_entries, debian_mirror
from imagebuild.errors import UserError


def _etc(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "etc" / "apt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_deb822_sources_name_the_mirror_of_the_suite(tmp_path):
    root = _etc(tmp_path, {"sources.list.d/debian.sources": (
        "Types: deb\n# a comment\nURIs: http://mirror.example.invalid/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"),
        "sources.list.d/other.sources.disabled": "Types: deb\nURIs: http://x\nSuites: bookworm\n"})
    assert debian_mirror("bookworm", root=root, env={}) == "http://mirror.example.invalid/debian"
    assert debian_mirror("bookworm-security", root=root, env={}).endswith("debian-security")


def test_one_line_lists_with_options(tmp_path):
    root = _etc(tmp_path, {"sources.list": (
        "# deb http://commented.invalid/debian bookworm main\n"
        "deb-src http://src.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://list.invalid/debian trixie main\n")})
    assert apt_entries(root) == [("http://list.invalid/debian", ["trixie"])]
    assert debian_mirror("trixie", root=root, env={}) == "http://list.invalid/debian"


def test_setting_and_environment_come_first(tmp_path):
    root = _etc(tmp_path, {"sources.list": "deb http://apt.invalid/debian bookworm main\n"})
    assert debian_mirror("bookworm", "http://set.invalid/d", root=root, env={}) == \
        "http://set.invalid/d"
    env = {"IMAGEBUILD_DEBIAN_MIRROR": "http://env.invalid/d"}
    assert debian_mirror("bookworm", root=root, env=env) == "http://env.invalid/d"


def test_no_source_for_the_suite_is_a_clear_error(tmp_path):
    root = _etc(tmp_path, {"sources.list": "deb http://apt.invalid/debian bookworm main\n"})
    with pytest.raises(UserError, match="no Debian mirror for suite 'trixie'") as err:
        debian_mirror("trixie", root=root, env={})
    assert "IMAGEBUILD_DEBIAN_MIRROR" in err.value.fix
