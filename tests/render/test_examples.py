"""Every matrix under examples/ plans, checks and renders like its golden files.

The examples are what other teams write (another GPU, another model family, plain
serving); nothing in imagebuild knows their names, and nothing here does either: each
`examples/*/matrix.yaml` is found, copied, locked against the recorded Hub answers
(tests/data/hub; the committed example locks leave Hub pins unresolved, as `lock`
does offline) and run through plan, check and render for every engine it defines.
UPDATE_GOLDEN=1 rewrites tests/data/golden-examples/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.cli import main
from imagebuild.lock.lockfile import read_lock
from imagebuild.render import render_all
from imagebuild.spec import matrix as mx
from tests.support.matrices import lock_matrix
from tests.support.paths import GOLDEN_EXAMPLES

EXAMPLES = sorted(p.parent for p in (REPO_ROOT / "examples").glob("*/matrix.yaml"))
GOLDEN = GOLDEN_EXAMPLES
DATE = "2026-07-01"
HADOLINT = shutil.which("hadolint") or str(Path(os.sys.executable).parent / "hadolint")


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("IMAGEBUILD_REGISTRY", "IMAGEBUILD_NAMESPACE", "IMAGEBUILD_TARGET"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module", params=EXAMPLES, ids=[p.name for p in EXAMPLES])
def example(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Path:
    """A copy of one example, locked from the recordings."""
    dst = tmp_path_factory.mktemp("example") / request.param.name
    shutil.copytree(request.param, dst)
    lock_matrix(dst)
    return dst


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _tags(root: Path) -> list[str]:
    return [f"{DATE}-{engine}" for engine in mx.load(root / "matrix.yaml").matrix.engines]


def test_there_are_at_least_three_examples() -> None:
    assert len(EXAMPLES) >= 3, EXAMPLES


def test_example_plans_and_checks_clean(example: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    matrix = str(example / "matrix.yaml")
    code, out, err = _run(capsys, "check", "--matrix", matrix, "--target", "all",
                          "--format", "json")  # the matrix reviewed: every rule passes
    doc = json.loads(out)
    assert code == 0 and doc["ok"], [f for f in doc["findings"]
                                      if f["severity"] == "error" and not f["waived"]]
    for tag in _tags(example):
        code, out, err = _run(capsys, "check", "--matrix", matrix, "--tag", tag,
                              "--target", "all", "--format", "json")
        doc = json.loads(out)
        # released, a base image this machine cannot pin by digest blocks its cells, and
        # nothing else does
        errors = [f for f in doc["findings"] if f["severity"] == "error" and not f["waived"]]
        assert all(f["rule"] == "pin-unresolved" and "lock --update" in f["fix"]
                   for f in errors), errors
        assert code == (2 if errors else 0) and doc["ok"] == (not errors)
        code, out, err = _run(capsys, "plan", "--matrix", matrix, "--tag", tag,
                              "--target", "all", "--format", "json")
        assert code == 0, err
        plan = json.loads(out)
        golden = GOLDEN / example.name / f"plan-{tag}.json"
        if os.environ.get("UPDATE_GOLDEN"):
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(json.dumps(plan, indent=2) + "\n")
        assert plan == json.loads(golden.read_text()), (
            f"{golden} differs (UPDATE_GOLDEN=1 to accept)")
        for cell in plan["cells"]:  # plain cells serve without speculation, the others with
            assert ("--speculative-config" in cell["serve"]) == (cell["method"] != "none")


def test_example_renders_like_its_golden_files(example: Path) -> None:
    lm = mx.load(example / "matrix.yaml")
    rendered, skipped = render_all(lm, mx.expand(lm), read_lock(lm.root))
    assert not skipped, [s.message for s in skipped]
    golden = GOLDEN / example.name / "rendered"
    if os.environ.get("UPDATE_GOLDEN"):
        shutil.rmtree(golden, ignore_errors=True)
        for r in rendered:
            (golden / r.path).parent.mkdir(parents=True, exist_ok=True)
            (golden / r.path).write_text(r.text)
    assert sorted(r.path for r in rendered) == sorted(
        str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file())
    for r in rendered:
        assert r.text == (golden / r.path).read_text(), (
            f"{r.path} of {example.name} differs from its golden file (UPDATE_GOLDEN=1)")
    proc = subprocess.run([HADOLINT, "--config", str(REPO_ROOT / ".hadolint.yaml"),
                           *map(str, golden.rglob("*.Dockerfile"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("folder", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_committed_example_lock_agrees_and_invents_nothing(
        folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "lock", "--check", "--matrix", str(folder / "matrix.yaml"))
    assert code == 0, err
    assert "fa6e" not in (folder / "matrix.lock.json").read_text()  # no recorded SHA
