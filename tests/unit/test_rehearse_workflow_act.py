"""The act rehearsal without act: its timeout holds even when act hangs with its output
open (the process group, act and what it started, is killed and the run says so), and a
plan with no cell for this host is bad input, not an IndexError. A stand-in command
replaces act (the real one runs in tests/e2e/test_act_*.py)."""

from __future__ import annotations

import time
from pathlib import Path

from tools.rehearse_release.act import Rehearsal


def test_a_hung_act_is_killed_with_its_group_at_the_timeout(monkeypatch, tmp_path: Path):
    pidfile = tmp_path / "child.pid"
    # prints, then hangs; a child it started holds stdout open too (as act's job shells do)
    hang = ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; echo started; sleep 300"]
    monkeypatch.setattr(Rehearsal, "command", lambda self, *a, **k: list(hang))
    reh = Rehearsal(tmp_path, registry="127.0.0.1:5000")
    reh.work.mkdir(parents=True)
    t0 = time.monotonic()
    run = reh.run("release.yml", "workflow_dispatch", "refs/heads/main", timeout=1)
    assert time.monotonic() - t0 < 30
    assert run.timed_out and run.returncode != 0
    assert "started" in run.log and "did not finish within 1 s" in run.log
    child = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung act's child {child} survived the timeout")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it is dead already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_finished_act_keeps_its_output_and_exit_code(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(Rehearsal, "command",
                        lambda self, *a, **k: ["sh", "-c", "echo one; echo two; exit 3"])
    reh = Rehearsal(tmp_path, registry="127.0.0.1:5000")
    reh.work.mkdir(parents=True)
    run = reh.run("release.yml", "workflow_dispatch", "refs/heads/main", timeout=30)
    assert (run.returncode, run.log, run.timed_out) == (3, "one\ntwo\n", False)


def test_the_rehearsal_without_a_cell_for_this_host_is_bad_input(monkeypatch, tmp_path, capsys):
    from tools.rehearse_release import __main__ as rehearse

    monkeypatch.setattr(rehearse, "plan", lambda tag, target: [])
    work = tmp_path / "act"
    assert rehearse.main(["--tag", "2026-06-18-x", "--workdir", str(work)]) == 2
    err = capsys.readouterr().err
    assert "no cell for this host" in err and "fix: pass --target" in err
    assert not work.exists()  # nothing written


def test_act_limits_are_said_in_words_and_nothing_else_is_excused():
    from tools.rehearse_release.__main__ import act_limits

    log = ('time="2026-12-03T06:26:42Z" level=error msg="Failed to parse \'max-parallel\' '
           'option: strconv.Atoi: parsing \\"${{ fromJSON(vars.IMAGEBUILD_MAX_PARALLEL) }}\\": '
           'invalid syntax"\n')
    notes = act_limits(log)
    assert len(notes) == 1 and "legs ran one at a time" in notes[0]
    assert act_limits("[release/cell] Job failed\nError: Job 'cell' failed\n") == []
