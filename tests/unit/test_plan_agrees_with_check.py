"""`plan --tag T` and `check --tag T` say the same of the same tag (issue 38 item 8): the
same findings and summary; plan still lists its jobs (the release workflow's plan job
reads them), says the errors fail the release, and stops only on what blocks without a
tag too."""

from __future__ import annotations

import re

from imagebuild.cli import main

TAG = "2026-06-18-dflashfix"  # gb10's pins are not resolved in the repository's lock


def _summary(text: str) -> str:
    found = re.findall(r"^(\d+ error\(s\), \d+ warning\(s\), \d+ waived).*-- check (\w+)$",
                       text, re.M)
    assert len(found) == 1, text[-2000:]
    return " ".join(found[0])


def test_plan_says_what_check_says_of_the_same_tag(capsys) -> None:
    assert main(["check", "--tag", TAG, "--target", "gb10"]) == 2
    check = _summary(capsys.readouterr().out)
    assert check.endswith("FAILED")
    assert main(["plan", "--tag", TAG, "--target", "gb10"]) == 0
    out, err = capsys.readouterr()
    assert _summary(err) == check
    n = check.split()[0]
    assert f"plan: {n} error(s) above fail release 2026-06-18-v0.23.0-dflashfix" in err
    assert "gb10/spark-heretic-zlab" in out  # the jobs are listed all the same


def test_plan_for_the_github_matrix_still_lists_every_target(capsys) -> None:
    assert main(["plan", "--tag", TAG, "--target", "all", "--format", "github"]) == 0
    out, err = capsys.readouterr()
    assert '"target":"gb10"' in out and '"target":"cpu"' in out, out[:500]
    assert "check FAILED" in err
