"""ci.yml under act (host mode, a network namespace holding only loopback): the `lint` job
runs for real (ruff, mypy, actionlint, zizmor on a fresh checkout of HEAD). The `unit` and
`e2e-cpu` jobs are planned (act's own planner lists them with their stages) but not run
here: e2e-cpu runs `make setup` and `make test`, i.e. this very suite (it would recurse),
and `unit` runs `make checks` and `make unit`, which this suite runs already."""

from __future__ import annotations

import subprocess

import pytest

from tools.rehearse_release.act import Rehearsal, act_binary

pytestmark = pytest.mark.slow


def test_ci_lint_job_runs_under_act_offline(tmp_path):
    reh = Rehearsal(tmp_path, registry="")
    reh.prepare()
    run = reh.run("ci.yml", "push", "refs/heads/main", run="ci", job="lint",
                  plan_runners=[], isolated=True, timeout=900)
    assert run.returncode == 0, run.log[-6000:]
    for step in ("Ruff", "Mypy", "Workflows (actionlint, zizmor)"):
        assert f"Success - Main {step} [" in run.log, step
    assert run.job_result("lint, types, workflows") == "succeeded"
    ci = str(reh.work / ".github/workflows/ci.yml")
    listed = subprocess.run([act_binary(), "--list", "-W", ci], cwd=reh.work,
                            capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in listed.splitlines()[1:] if line.strip()]
    stages = {row[1]: row[0] for row in rows}
    assert stages == {"lint": "0", "unit": "0", "e2e-cpu": "1"}
