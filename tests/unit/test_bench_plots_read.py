"""Plots people read at a glance, files named after the image (issue 38, item 12): the
concurrency axis said 2^0, 2^3; y-axes zoomed into noise made 2 % look like 50 %; a
baseline with the same figures hid the run under it; each run's files were named by a
timestamp. Now: plain level ticks, y from zero, every series visible, bench-<image>.*."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

from imagebuild.bench import history  # noqa: E402
from imagebuild.bench.command import image_name, write_outputs  # noqa: E402
from imagebuild.bench.plot import figure  # noqa: E402


def _run(tag: str, tok_s: float) -> dict:
    return {"started": "2026-07-01T10-00-00Z", "hardware": {"model": "cpu"},
            "image": {"tag": tag, "cell": "cpu/cpu-tiny-ngram",
                      "ref": f"127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:{tag}"},
            "levels": [{"concurrency": c, "output_tok_s": tok_s * c + (c % 3),
                        "ttft_ms": {"median": 80.0 + c}, "flags": []} for c in (1, 8, 32, 64)]}


def test_the_bench_plot_reads_at_a_glance() -> None:
    fig = figure([_run("2026-07-01-v0.23.0-a", 40.0), _run("2026-06-18-v0.23.0-b", 40.0)])
    for ax in fig.axes:
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["1", "8", "32", "64"], labels  # never 2^0, 2^3
        assert ax.get_ylim()[0] == 0  # from zero, not zoomed into the noise
        lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("2026")]
        # two runs with equal figures: each its own marker, size and layer, both seen
        assert len({ln.get_marker() for ln in lines}) == 2
        assert len({ln.get_markersize() for ln in lines}) == 2
        top, below = sorted(lines, key=lambda ln: ln.get_zorder(), reverse=True)
        assert top.get_markersize() < below.get_markersize()


def test_the_history_plot_starts_at_zero() -> None:
    h = history.History("vllm-spark/cpu-tiny-ngram", [
        history.Point(t, i == 1, False, True, history.figures(_run(t, 40.0 + i)))
        for i, t in enumerate(["2026-06-18-v0.23.0-a", "2026-07-01-v0.23.0-b"])])
    for ax in history.figure(h).axes:
        assert ax.get_ylim()[0] == 0


def test_bench_files_are_named_after_the_image(tmp_path) -> None:
    doc = _run("2026-07-01-v0.23.0-a", 40.0)
    paths = write_outputs(doc, tmp_path, "# md\n")
    assert {p.name for p in paths.values()} == {"bench-cpu-tiny-ngram.json",
                                               "bench-cpu-tiny-ngram.md",
                                               "bench-cpu-tiny-ngram.png"}
    assert json.loads(paths["json"].read_text())["image"]["cell"] == "cpu/cpu-tiny-ngram"
    assert image_name({"ref": "127.0.0.1:5000/ns/other-image@sha256:" + "a" * 64}) == \
        "other-image"
    assert image_name({"ref": "http://127.0.0.1:8000"}) == "127.0.0.1:8000"
