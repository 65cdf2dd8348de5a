"""Progress lines: one per stage, cell and new wait; counters redraw on a terminal only,
and a log (GitHub Actions) gets no carriage returns and at most one line per heartbeat."""

from __future__ import annotations

import io
import re

import pytest

from imagebuild import progress


class Term(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(out: io.StringIO, clock: list[float], monkeypatch) -> None:
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress, "_T0", clock[0] - 62)
    with progress.stage("publish", "cpu/cpu-tiny-ngram", out=out):
        progress.wait("push", "0 of 6,495 MB")
        for mb in (100, 200, 300):  # within one heartbeat: a counter, not news
            clock[0] += 1
            progress.wait("push", f"{mb} of 6,495 MB")
        clock[0] += progress.HEARTBEAT_S
        progress.wait("push", "2,000 of 6,495 MB")
        progress.wait("verify", "config digest")
    progress.wait("push", "outside any stage: nothing")


def test_a_log_gets_plain_lines_throttled_by_the_heartbeat(monkeypatch) -> None:
    out, clock = io.StringIO(), [1000.0]
    _run(out, clock, monkeypatch)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = [re.fullmatch(r"\[progress +([\d:]+)\] (\S+) (\S+) +([\d.]+)s  (.*)", ln)
             for ln in text.splitlines()]
    assert all(lines), text
    assert [m[5] for m in lines] == [
        "started", "push: 0 of 6,495 MB", "push: 2,000 of 6,495 MB", "verify: config digest",
        "done in 18.0s"]
    assert {(m[2], m[3]) for m in lines} == {("publish", "cpu/cpu-tiny-ngram")}
    assert (lines[0][1], lines[2][1], lines[2][4]) == ("1:02", "1:20", "18.0")


def test_a_terminal_redraws_the_counter_in_place(monkeypatch) -> None:
    out, clock = Term(), [1000.0]
    _run(out, clock, monkeypatch)
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 4  # 100, 200, 300 and 2,000 MB redraw one line
    assert "push: 300 of 6,495 MB\n" not in text  # ... and a new wait starts a new line
    assert text.endswith("done in 18.0s\n")


def test_a_failing_stage_says_it_stopped() -> None:
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress.stage("bench", "c", out=out):
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1].endswith("stopped: KeyboardInterrupt")


def test_a_poll_reports_what_another_process_is_doing(tmp_path, monkeypatch) -> None:
    """The smoke suite runs in its own process: its container log gives the boot phase,
    its boot record the checks (stagewatch.SmokeWatch); the stage asks from a thread."""
    import time

    from imagebuild.stagewatch import SmokeWatch

    watch = SmokeWatch(tmp_path)
    assert watch.poll() == ("boot: starting the container", "")
    (tmp_path / "container.log").write_text("INFO Starting to load model /model\n")
    assert watch.poll() == ("boot: loading weights", "")
    (tmp_path / "boot.json").write_text("{}")
    assert watch.poll() == ("checks: the smoke suite runs against the server", "")

    monkeypatch.setattr(progress, "POLL_S", 0.01)
    answers = iter([("boot: loading weights", ""), ("checks: running", "")])
    out = io.StringIO()
    with progress.stage("smoke", "cpu/x", out=out, poll=lambda: next(answers, None)):
        deadline = time.monotonic() + 10
        while "checks: running" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    lines = [ln.split("  ")[-1] for ln in out.getvalue().splitlines()]
    assert lines == ["started", "boot: loading weights", "checks: running", lines[-1]]
    assert lines[-1].startswith("done in")


def test_a_result_printed_on_the_terminal_ends_the_counter_line(monkeypatch) -> None:
    """`bench c=1: 40 of 40 requestsc=1: 47.8 tok/s`: what the stage prints to stdout or
    stderr while a counter waits for its redraw starts on a line of its own."""
    term = Term()
    monkeypatch.setattr(progress.sys, "stdout", term)
    monkeypatch.setattr(progress.sys, "stderr", term)
    with progress.stage("bench", "cpu/cpu-tiny-ngram"):
        progress.wait("bench c=1", "1 of 40 requests")
        progress.wait("bench c=1", "40 of 40 requests")
        print("c=1: 47.8 tok/s, 0 errors")
        progress.wait("bench c=4", "1 of 40 requests")
        progress.wait("bench c=4", "2 of 40 requests")
        print("warning: slow", file=progress.sys.stderr)
    assert progress.sys.stdout is term and progress.sys.stderr is term  # put back
    lines = term.getvalue().split("\n")
    assert any(ln.endswith("40 of 40 requests") for ln in lines), lines
    assert "c=1: 47.8 tok/s, 0 errors" in lines and "warning: slow" in lines, lines
