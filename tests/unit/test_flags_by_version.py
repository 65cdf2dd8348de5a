"""Flag rules speak for the cell's vLLM version: every spelling its recorded parser has for
an option is checked alike (0.32's --device-memory-utilization is --gpu-memory-utilization),
values are the version's (--kv-cache-dtype int4_per_token_head is 0.32's, not 0.23's), and
each finding of a rule that read a flag names the facts it read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from imagebuild.facts import SHIPPED
from imagebuild.preflight import flags
from imagebuild.preflight.flags import CellView
from imagebuild.preflight.run import RULES, run_checks
from imagebuild.spec import matrix as mx
from tests.support.matrices import add_engine_032, check, edit, of

CPU_ARGS = "      max-num-batched-tokens: 512\n"


def with_032(root: Path) -> Path:
    return add_engine_032(root, gb10=True)


def _facts_of(found: list) -> set[str]:
    return {f.facts for f in found}


def test_an_alias_is_checked_as_its_option(locked: Path):
    with_032(locked)
    edit(locked, CPU_ARGS, CPU_ARGS + "      device-memory-utilization: 5\n")
    (bad,) = of(check(locked, target="cpu", engine="v032"), "serve-flag-value")
    assert "device-memory-utilization 5 is outside (0, 1]" in bad.message
    assert _facts_of([bad]) == {"facts: vLLM 0.32.0 (imagebuild/facts/recorded/0.32.0)"}
    # the same key on 0.23 is no option at all, said with 0.23's facts
    (old,) = of(check(locked, target="cpu", engine="dflashfix"), "serve-flag-unknown")
    assert "0.23.0 has no option --device-memory-utilization" in old.message
    assert "did you mean gpu-memory-utilization" in old.message
    assert old.facts and "vLLM 0.23.0" in old.facts


def test_both_spellings_of_one_option_are_refused(locked: Path):
    with_032(locked)
    edit(locked, CPU_ARGS, CPU_ARGS + "      gpu-memory-utilization: 0.5\n"
                                      "      device-memory-utilization: 0.6\n")
    (twice,) = of(check(locked, target="cpu", engine="v032"), "serve-flag-twice")
    assert "--device-memory-utilization and --gpu-memory-utilization" in twice.message


def test_the_unified_memory_ceiling_reads_the_alias(locked: Path):
    with_032(locked)
    edit(locked, "      gpu-memory-utilization: 0.85\n", "      device-memory-utilization: 0.95\n")
    found = of(check(locked, target="gb10", engine="v032"), "gpu-mem-util-unified")
    assert found and all("--device-memory-utilization 0.95 > 0.88" in f.message for f in found)
    assert _facts_of(found) == {"facts: vLLM 0.32.0 (imagebuild/facts/recorded/0.32.0)"}


def test_kv_cache_dtypes_are_the_versions(locked: Path):
    with_032(locked)
    edit(locked, CPU_ARGS, CPU_ARGS + "      kv-cache-dtype: int4_per_token_head\n")
    new = check(locked, target="cpu", engine="v032")
    assert not of(new, "serve-flag-value"), of(new, "serve-flag-value")
    assert not [f for f in of(new, "kv-page-unify") if f.blocking]
    (old,) = of(check(locked, target="cpu", engine="dflashfix"), "serve-flag-value")
    assert "'int4_per_token_head' is not one of vLLM's choices" in old.message
    assert old.facts and "vLLM 0.23.0" in old.facts


def test_a_spelling_only_a_versions_parser_has_is_read_by_every_value_rule(locked: Path):
    """A version whose parser (recorded beside the matrix, as `facts record` writes it)
    spells --max-model-len --context-length as well: the checkpoint rule reads it there."""
    folder = locked / "locked" / "vllm" / "0.99.0"
    shutil.copytree(SHIPPED / "0.32.0", folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["vllm_version"] = "0.99.0"
    (folder / "meta.json").write_text(json.dumps(meta))
    cli = json.loads((folder / "serve_args.json").read_text())
    entry = cli["options"]["max-model-len"]
    entry.update(canonical="max-model-len", aliases=["context-length"])
    cli["options"]["context-length"] = {**entry, "aliases": ["max-model-len"]}
    (folder / "serve_args.json").write_text(json.dumps(cli))
    with_032(locked)
    edit(locked, "    vllm_version: 0.32.0\n", "    vllm_version: 0.99.0\n")
    edit(locked, "      max-model-len: 512\n", "      context-length: 99999999\n")
    found = of(check(locked, target="cpu", engine="v032"), "max-model-len-supported")
    assert found and "99999999" in found[0].message
    assert found[0].facts == f"facts: vLLM 0.99.0 ({folder})"


def test_every_flag_rule_that_reads_a_flag_names_the_facts_it_read(
        locked: Path, monkeypatch: pytest.MonkeyPatch):
    """Reading a flag goes through the version's parser (its spellings), so a rule doing it
    declares serve_args: its findings then name the version and folder of those facts."""
    running: list[str] = []
    read: set[str] = set()
    spelling = CellView.spelling

    def spy(self: CellView, name: str):  # noqa: ANN202 - the method's own result
        read.update(running[-1:])
        return spelling(self, name)

    monkeypatch.setattr(CellView, "spelling", spy)
    for rid, fn in list(flags.CHECKS.items()):
        def wrapped(rule, v, _fn=fn, _rid=rid):  # noqa: ANN001, ANN202
            running.append(_rid)
            try:
                return _fn(rule, v)
            finally:
                running.pop()
        monkeypatch.setitem(flags.CHECKS, rid, wrapped)
    lm = mx.load(locked / "matrix.yaml")
    from imagebuild.lock.lockfile import read_lock

    run_checks(lm, mx.expand(lm), read_lock(lm.root))
    assert read >= {"max-batched-tokens-ceiling", "gpu-mem-util-unified",
                    "attention-backend-flash-attn"}, read
    undeclared = sorted(r for r in read if "serve_args" not in RULES[r].facts)
    assert not undeclared, undeclared
