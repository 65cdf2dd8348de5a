"""The bench history and the per-release plot gain the drafter's acceptance: a third panel
and markdown columns when a release has acceptance figures, none for a plain cell; a
level whose counters went backwards (a restarted server) has no point, not a wrong one."""

from __future__ import annotations

import math

from imagebuild.bench import history
from imagebuild.bench.plot import plot

TAGS = ["2026-06-04-v0.23.0-one", "2026-06-11-v0.23.0-two", "2026-06-18-v0.23.0-three"]


def _spec(accepted: float, drafted: float = 293.0) -> dict[str, float]:
    return {"drafts": 105.0, "draft_tokens": drafted, "accepted_tokens": accepted}


def _doc(tag: str, accepted: list[float | None]) -> dict:
    return {"image": {"tag": tag}, "hardware": {"model": "cpu"}, "levels": [
        {"concurrency": c, "output_tok_s": 100.0 * c, "ttft_ms": {"median": 20.0},
         "flags": [], "spec_decode": None if a is None else _spec(a)}
        for c, a in zip((1, 4), accepted, strict=True)]}


def _history(docs: list[dict]) -> history.History:
    return history.History("vllm-spark/cpu-tiny-ngram", [
        history.Point(tag, i == 1, False, True, history.figures(doc))
        for i, (tag, doc) in enumerate(zip(TAGS, docs, strict=True))])


def test_acceptance_per_release_is_a_third_panel_and_columns():
    h = _history([_doc(TAGS[0], [183.0, 183.0]), _doc(TAGS[1], [183.0, 120.0]),
                  _doc(TAGS[2], [183.0, -5.0])])  # the third restarted mid-level at c=4
    assert h.speculative
    c4 = h.series(4, "acceptance")
    assert c4[:2] == [183 / 293, 120 / 293] and math.isnan(c4[2])
    fig = history.figure(h)
    assert len(fig.axes) == 3 and "acceptance" in fig.axes[2].get_ylabel()
    lines = {ln.get_gid(): ln for ln in fig.axes[2].get_lines() if ln.get_gid()}
    assert [round(y, 3) for y in lines["c=1"].get_ydata()] == [0.625] * 3
    md = history.markdown(h)
    assert "| c=1 acceptance | c=4 acceptance |" in md
    assert f"| **{TAGS[1]}** (latest) | passed | 100.0 | 400.0 | 20.0 | 20.0 | 0.62 (2.74) | " \
           "0.41 (2.14) |" in md
    assert md.splitlines()[4].endswith("| 0.62 (2.74) | - |")  # newest first: the third


def test_a_plain_cell_keeps_two_panels_and_no_acceptance_columns(tmp_path):
    h = _history([_doc(t, [None, None]) for t in TAGS])
    assert not h.speculative
    assert len(history.figure(h).axes) == 2
    assert "acceptance" not in history.markdown(h)
    # the per-release plot too: two panels without acceptance, three with
    import matplotlib.image

    plain = plot([_doc(TAGS[0], [None, None])], tmp_path / "plain.png")
    spec = plot([_doc(TAGS[0], [183.0, 183.0])], tmp_path / "spec.png")
    assert matplotlib.image.imread(spec).shape[1] > matplotlib.image.imread(plain).shape[1]
