"""Release notes: pull by tag and digest, hardened run, pins, smoke summary, rollback."""

from __future__ import annotations

from imagebuild import matrix as mx
from imagebuild.lockfile import read_lock
from imagebuild.notes import ImageFacts, previous_release, release_notes
from imagebuild.plan import plan_rows
from imagebuild.tags import parse_tag

DIGEST = "sha256:" + "ab" * 32
VERDICT = {"passed": True, "message": "all 9 checks passed",
           "checks": {"health": {"outcome": "passed", "measured": {}},
                      "spec_decode": {"outcome": "passed",
                                      "measured": {"acceptance": 0.81}}}}


def _release(matrix_dir, target: str):
    lm = mx.load(matrix_dir / "matrix.yaml")
    tag = parse_tag("2026-06-18-dflashfix", lm.engines_versions())
    cells = mx.select(mx.expand(lm), engine=tag.name, target=target)
    return str(tag), plan_rows(cells, lm, tag, read_lock(lm.root)), cells


def test_notes_per_image(matrix_dir):
    tag, rows, cells = _release(matrix_dir, "gb10")
    first = rows[0]
    facts = {first["cell"]: ImageFacts(DIGEST, "2026-06-11-v0.23.0-pr41703", VERDICT)}
    text = release_notes(tag, rows, cells, facts)
    repo = first["repository"]
    assert f"docker pull {repo}:2026-06-18-v0.23.0-dflashfix" in text
    assert f"docker pull {repo}@{DIGEST}" in text
    # hardened run of the tested digest: GB10 flags, read-only, no env/credentials
    block = text.split("Run it hardened")[1].split("```")[1]
    assert f"{repo}@{DIGEST}" in block and "--read-only" in block
    assert "--gpus all --ipc host" in block and "--cap-drop ALL" in block
    assert " -e " not in block and "--env" not in block and "TOKEN" not in block
    # pins: the full commits, never abbreviated
    zlab = next(r for r in rows if r["drafter"] == "zlab")
    assert f"`{zlab['pins']['drafter']['revision']}`" in text
    assert "0fc695fc6d1d82e9a5ac6835ac8e4e1c83703665" in text
    assert "**PASSED** · all 9 checks passed" in text and "acceptance 0.81" in text
    assert "python build.py rollback --to 2026-06-11-v0.23.0-pr41703" in text
    # a cell the registry has no digest for says so instead of inventing one
    other = rows[1]["image"]
    section = text.split(f"## {other}")[1].split("## ")[0]
    assert "not pushed" in section and "no smoke report" in section


def test_cpu_notes_use_shm_not_gpus(matrix_dir):
    tag, rows, cells = _release(matrix_dir, "cpu")
    text = release_notes(tag, rows, cells, {})
    assert "--shm-size" in text and "--gpus" not in text
    assert "nothing to roll back to" in text


def test_previous_release_is_the_newest_older_passing_one():
    tags = ["2026-06-11-v0.23.0-pr41703", "2026-05-01-v0.22.0-base",
            "2026-07-01-v0.23.0-later", "2026-06-18-v0.23.0-dflashfix"]
    assert previous_release(tags, "2026-06-18-v0.23.0-dflashfix") == \
        "2026-06-11-v0.23.0-pr41703"
    assert previous_release(tags[1:2], "2026-05-01-v0.22.0-base") is None
