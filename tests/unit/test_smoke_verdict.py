"""The smoke gate does not open by accident: a verdict passes only when the boot was
healthy, pytest exited 0 and every expected check ran without failing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild.smoke.checks import expected_checks
from imagebuild.smoke.runner import SUITE, _verdict

EXPECT = {"concurrency": [1, 8], "cell": "cpu/x", "engine": "e", "target": "cpu",
          "source": "cell"}
BOOT = {"kind": "ready", "message": "/health 200 after 5.0s", "phase": "ready",
        "seconds": 5.0, "excerpt": "", "attempts": [{"attempt": 1}]}


def _all_passed() -> list[dict]:
    return [{"name": n, "outcome": "passed", "seconds": 0.1, "message": ""}
            for n in expected_checks(EXPECT)]


def _judge(checks, code=0, boot=BOOT) -> dict:
    return _verdict("img:t", "sha256:" + "a" * 64, EXPECT, boot, checks, code, Path("/x"),
                    t0=0.0)


def test_everything_ran_and_passed():
    v = _judge(_all_passed())
    assert v["passed"] and v["outcome"] == "passed"


def test_a_not_applicable_check_still_counts_as_run():
    checks = _all_passed()
    checks[5] = {**checks[5], "outcome": "skipped", "message": "no tool parser"}
    v = _judge(checks)
    assert v["passed"] and checks[5]["name"] in v["not_applicable"]


@pytest.mark.parametrize("code", [1, 2, 3, 4, 5, -9])
def test_pytest_exiting_non_zero_fails_the_verdict(code):
    v = _judge(_all_passed(), code=code)
    assert not v["passed"] and f"pytest exited {code}" in v["message"]


def test_zero_collected_checks_fail():
    v = _judge([], code=5)
    assert not v["passed"] and v["outcome"] == "checks missing"


def test_a_missing_check_fails_even_when_pytest_is_happy():
    checks = [c for c in _all_passed() if c["name"] != "burst_has_no_errors[c8]"]
    v = _judge(checks)
    assert not v["passed"] and v["missing"] == ["burst_has_no_errors[c8]"]


@pytest.mark.parametrize("outcome", ["failed", "error"])
def test_a_failed_or_erroring_check_fails(outcome):
    checks = _all_passed()
    checks[0] = {**checks[0], "outcome": outcome, "message": "boom"}
    v = _judge(checks, code=1)
    assert not v["passed"] and v["outcome"] == "checks failed"


def test_no_boot_record_fails():
    v = _judge(_all_passed(), boot={})
    assert not v["passed"] and v["outcome"] == "suite failed"


def test_a_failed_boot_fails():
    v = _judge([], code=1, boot={**BOOT, "kind": "fatal", "message": "engine failed"})
    assert not v["passed"] and v["outcome"] == "boot fatal"


def test_the_expected_list_is_what_the_suite_collects(tmp_path):
    """checks.py names exactly the checks the suite has: adding a check to the suite
    without listing it (or dropping one) fails here, not silently in a verdict."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"expect": EXPECT}))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(SUITE), "--collect-only",
                           "-q", "-p", "no:cacheprovider", "-c", str(SUITE / "pytest.ini"),
                           "--rootdir", str(SUITE)], capture_output=True, text=True,
                          env={"IMAGEBUILD_SMOKE_CONFIG": str(cfg), "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(line.split("::")[-1].removeprefix("test_")
                   for line in proc.stdout.splitlines() if "::" in line)
    assert names == sorted(expected_checks(EXPECT))
