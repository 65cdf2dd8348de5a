"""Plain serving (no speculative decoding) end to end: schema, cells, serve command,
preflight, smoke expectations and the suite's speculative check, labels, plan output.

Before: a profile without speculative decoding could not be written (`methods` had to
name one, every cell needed a drafter) although it is the most common deployment."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from imagebuild import REPO_ROOT
from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.expectations import expectations_for
from imagebuild.plan import cell_pins, format_table, make_jobs
from imagebuild.release.notes import release_notes
from imagebuild.render import serve_labels
from imagebuild.smoke.checks import expected_checks
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import serve_command
from imagebuild.spec.tags import parse_tag
from tests.support.matrices import check, edit, of

TAG = "2026-06-18-dflashfix"
# a family of the real matrix's plain `spark` profile (and a plain one for the weight-only
# ModelOpt checkpoint): the drafter axis left out is [none]
PLAIN_FAMILY = """
  spark-plain:
    description: the Qwen3.6 checkpoints served plainly
    target: gb10
    name: "{family}-{model}"
    matrix:
      engine: [dflashfix]
      model: [heretic, nvfp4]
      profile: [spark, spark-w4a16]
      exclude:
        - {model: heretic, profile: spark-w4a16}
        - {model: nvfp4, profile: spark}
"""
W4A16_PLAIN = ("\n  cpu-ngram:\n", "\n  spark-w4a16:\n    description: plain, weight-only "
               "NVFP4\n    extends: spark\n    expect_backends: {moe: MARLIN}\n"
               "  cpu-ngram:\n")
CPU_PLAIN = ("      drafter: [ngram]\n      profile: [cpu-ngram]\n",
             "      drafter: [none, ngram]\n      profile: [cpu-plain, cpu-ngram]\n"
             "      exclude:\n        - {drafter: none, profile: cpu-ngram}\n"
             "        - {drafter: ngram, profile: cpu-plain}\n")
CPU_PLAIN_PROFILE = ("\nimages:\n", "\n  cpu-plain:\n    description: the tiny model served "
                     "plainly\n    extends: cpu-ngram\n    methods: [none]\n\nimages:\n")


def _plain(root: Path) -> None:
    path = root / "matrix.yaml"
    path.write_text(path.read_text() + PLAIN_FAMILY)
    edit(root, *W4A16_PLAIN)
    edit(root, *CPU_PLAIN)
    edit(root, *CPU_PLAIN_PROFILE)


def _suite(name: str) -> ModuleType:
    """A module of the smoke suite, imported as the suite's runner imports it."""
    path = REPO_ROOT / "imagebuild" / "smoke" / "suite" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"smoke_suite_{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plain_cells_expand_and_serve_without_speculative_config(matrix_dir: Path) -> None:
    _plain(matrix_dir)
    lm = mx.load(matrix_dir / "matrix.yaml")
    cells = {c.image: c for c in mx.expand(lm)}
    plain = cells["spark-plain-heretic"]
    assert plain.drafter is None and plain.drafter_name == "none" and plain.method == "none"
    argv = serve_command(plain).argv
    assert "--speculative-config" not in argv
    assert "--speculative-config" in serve_command(cells["spark-heretic-zlab"]).argv
    cpu = cells["cpu-tiny-none"]
    assert "--speculative-config" not in serve_command(cpu).argv
    # the plain child keeps every other flag of the profile it extends
    assert [a for a in serve_command(cells["cpu-tiny-ngram"]).argv
            if a != "--speculative-config" and not a.startswith("{")] == list(
        serve_command(cpu).argv)


def test_plain_cells_in_plan_labels_and_pins(matrix_dir: Path) -> None:
    _plain(matrix_dir)
    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = next(c for c in mx.expand(lm) if c.image == "cpu-tiny-none")
    (job,) = make_jobs(lm, [cell], parse_tag(TAG, lm.engines_versions()), None)
    assert job.as_json()["method"] == "none" and job.as_json()["drafter"] == "none"
    assert cell_pins(cell, lm, None)["drafter"] == {"method": "none"}
    assert "drafter  none (no speculative decoding)\n" in format_table((job,), "") + "\n"
    labels = dict(serve_labels(cell, lm, {"script": "x", "seed": 0}, None))
    assert labels["io.imagebuild.speculative.method"] == "none"
    notes = release_notes(lm, (job,), {})
    assert "drafter none (no speculative decoding)" in notes
    assert "--speculative-config" not in notes


def test_preflight_runs_no_drafter_rule_on_plain_cells(locked: Path) -> None:
    _plain(locked)
    findings = check(locked, target="gb10", engine="dflashfix")
    plain = [f for f in findings if f.cell.startswith("gb10/spark-plain-")]
    assert not [f for f in plain if f.blocking], plain
    drafter_rules = {"dflash-spec-tokens", "attention-backend-flash-attn", "aeon-max-num-seqs",
                     "dflash-target-layers", "drafter-fits-target"}
    assert not {f.rule for f in plain} & drafter_rules
    # the KV layout of the target alone is still predicted
    assert {f.cell for f in of(findings, "kv-layout")} >= {"gb10/spark-plain-heretic",
                                                          "gb10/spark-plain-nvfp4"}


def test_smoke_expects_no_speculation_but_still_lists_the_check(matrix_dir: Path) -> None:
    _plain(matrix_dir)
    lm = mx.load(matrix_dir / "matrix.yaml")
    cell = next(c for c in mx.expand(lm) if c.image == "cpu-tiny-none")
    expect = expectations_for(cell, None)
    assert expect["speculative_method"] is None
    assert "speculative_decoding_fires" in expected_checks(expect)
    json.dumps(expect)  # the suite gets it as JSON


def test_the_speculative_check_reports_not_applicable_with_the_reason() -> None:
    spec = _suite("test_speculative")
    with pytest.raises(pytest.skip.Exception) as info:
        spec.test_speculative_decoding_fires(api=None, chat=None,
                                             expect={"speculative_method": None},
                                             log=None, record_property=None)
    assert str(info.value).startswith("the cell serves without speculative decoding")


def test_none_is_reserved_for_plain_serving(matrix_dir: Path) -> None:
    edit(matrix_dir, "  ngram:\n    description: prompt-lookup",
         "  none:\n    description: x\n    method: ngram\n    num_speculative_tokens: 3\n"
         "    targets: [cpu]\n  ngram:\n    description: prompt-lookup")
    with pytest.raises(UserError, match="reserved drafter name") as info:
        mx.expand(mx.load(matrix_dir / "matrix.yaml"))
    text = (matrix_dir / "matrix.yaml").read_text()
    line = text[:text.index("  none:\n")].count("\n") + 1
    assert info.value.where and info.value.where.endswith(f"matrix.yaml:{line}:3")


def test_a_speculative_profile_without_acceptance_floor_is_refused(matrix_dir: Path,
                                                                   capsys) -> None:
    edit(matrix_dir, "    acceptance_floor: 0.15\n", "")
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", TAG,
                 "--target", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "serves ngram but has no acceptance_floor" in err and "fix:" in err
