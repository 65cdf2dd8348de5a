"""Which tool makes the cpu base's rootfs, and how it is called (builder/bootstrap.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.builder import bootstrap
from imagebuild.errors import OperationFailed

ROOT, MIRROR = Path("/tmp/rootfs-x"), "http://mirror.invalid/debian"


def _installed(monkeypatch, *tools: str, hook: bool = True) -> None:
    monkeypatch.setattr(bootstrap.shutil, "which",
                        lambda name: f"/usr/bin/{name}" if name in tools else None)
    monkeypatch.setattr(bootstrap, "MMDEBSTRAP_MERGED_USR",
                        Path("/") if hook else Path("/nonexistent-hook-dir"))


def test_mmdebstrap_is_preferred_with_its_merged_usr_hook(monkeypatch) -> None:
    _installed(monkeypatch, "mmdebstrap", "debootstrap")
    assert bootstrap.bootstrapper() == "mmdebstrap"
    argv = bootstrap.bootstrap_argv("mmdebstrap", ROOT, "bookworm", MIRROR)
    # the hook sets up merged /usr as debootstrap does; without it apt picks usrmerge,
    # which pulls perl into the base
    assert f"--hook-dir={bootstrap.MMDEBSTRAP_MERGED_USR}" in argv
    assert argv[-3:] == ["bookworm", str(ROOT), MIRROR]


def test_both_tools_get_the_same_package_set_keyring_and_variant() -> None:
    a = bootstrap.bootstrap_argv("mmdebstrap", ROOT, "bookworm", MIRROR)
    b = bootstrap.bootstrap_argv("debootstrap", ROOT, "bookworm", MIRROR)
    shared = {x for x in a if x.startswith(("--variant", "--include", "--keyring",
                                              "--components"))}
    assert shared == {x for x in b if x.startswith("--")}
    assert f"--include={','.join(bootstrap.PACKAGES)}" in shared
    assert b[0] == "debootstrap" and b[-3:] == a[-3:]


def test_debootstrap_where_mmdebstrap_or_its_hook_is_missing(monkeypatch) -> None:
    _installed(monkeypatch, "debootstrap")
    assert bootstrap.bootstrapper() == "debootstrap"
    _installed(monkeypatch, "mmdebstrap", "debootstrap", hook=False)
    assert bootstrap.bootstrapper() == "debootstrap"


def test_neither_tool_is_an_error_with_the_fix(monkeypatch) -> None:
    _installed(monkeypatch)
    with pytest.raises(OperationFailed, match="neither mmdebstrap nor debootstrap") as e:
        bootstrap.bootstrapper()
    assert "apt-get install mmdebstrap" in e.value.fix
