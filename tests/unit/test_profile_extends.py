"""Shared settings: a profile `extends` another (args and env merged key by key, the
child's values win, everything else inherited), errors name file:line:col, and the real
matrix states each Spark serve flag once.

Before: the real matrix repeated the same twelve serve flags in three profiles; there was
no way to share settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from imagebuild import REPO_ROOT
from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import serve_command
from tests.support.matrices import edit

TAG = "2026-06-18-dflashfix"


def _line(root: Path, text: str, nth: int = 1) -> int:
    body = (root / "matrix.yaml").read_text()
    at = -1
    for _ in range(nth):
        at = body.index(text, at + 1)
    return body[:at].count("\n") + 1


def _argv(root: Path, image: str) -> list[str]:
    lm = mx.load(root / "matrix.yaml")
    return list(serve_command(next(c for c in mx.expand(lm) if c.image == image)).argv)


def test_a_child_inherits_and_overrides_in_the_parents_order(matrix_dir: Path) -> None:
    lm = mx.load(matrix_dir / "matrix.yaml")
    p = lm.matrix.profiles
    aeon, dflash, spark = p["spark-dflash-aeon"], p["spark-dflash"], p["spark"]
    assert aeon.args["max-num-seqs"] == 16 and dflash.args["max-num-seqs"] == 64
    assert list(aeon.args) == list(dflash.args) == [*spark.args, "attention-backend"]
    assert list(spark.args)[:2] == ["host", "port"]  # from `loopback`
    assert aeon.methods == ["dflash"] and aeon.acceptance_floor == 0.2  # inherited
    assert aeon.target == "gb10" and aeon.description.startswith("DFlash with the AEON")
    assert p["cpu-ngram"].env == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_env_is_merged_and_the_child_wins(matrix_dir: Path) -> None:
    edit(matrix_dir, "    extends: spark-dflash\n    args:\n      max-num-seqs: 16\n",
         "    extends: spark-dflash\n    args:\n      max-num-seqs: 16\n"
         "    env:\n      VLLM_LOGGING_LEVEL: DEBUG\n")
    edit(matrix_dir, "    args:\n      attention-backend: flash_attn\n",
         "    args:\n      attention-backend: flash_attn\n"
         "    env:\n      VLLM_LOGGING_LEVEL: INFO\n      OMP_NUM_THREADS: \"4\"\n")
    p = mx.load(matrix_dir / "matrix.yaml").matrix.profiles
    spark = p["spark"].env  # the kernel switches every Spark profile inherits
    assert spark and all(k.startswith("VLLM_") for k in spark)
    assert p["spark-dflash-aeon"].env == {**spark, "VLLM_LOGGING_LEVEL": "DEBUG",
                                          "OMP_NUM_THREADS": "4"}
    assert p["spark-dflash"].env == {**spark, "VLLM_LOGGING_LEVEL": "INFO",
                                     "OMP_NUM_THREADS": "4"}
    assert list(p["spark-dflash"].env)[:len(spark)] == list(spark)  # the parent's order


def test_an_unknown_parent_is_an_error_at_its_extends(matrix_dir: Path, capsys) -> None:
    edit(matrix_dir, "    extends: spark-dflash\n", "    extends: spark-dlfash\n")
    code = main(["plan", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", TAG,
                 "--target", "gb10"])
    err = capsys.readouterr().err
    line = _line(matrix_dir, "extends: spark-dlfash")
    assert code == 2 and f"matrix.yaml:{line}:5: profile 'spark-dflash-aeon' extends " \
                          "'spark-dlfash', which is not a profile" in err, err
    assert "fix: use one of:" in err and "spark-dflash" in err


def test_profiles_extending_each_other_in_a_circle_are_an_error(matrix_dir: Path) -> None:
    edit(matrix_dir, "  loopback:\n    description:", "  loopback:\n    extends: spark-mtp\n"
                     "    description:")
    with pytest.raises(UserError) as info:
        mx.load(matrix_dir / "matrix.yaml")
    err = info.value
    assert "in a circle" in err.message
    assert "spark -> loopback -> spark-mtp -> spark" in err.message or \
           "loopback -> spark-mtp -> spark -> loopback" in err.message, err.message
    assert err.where and err.where.rsplit(":", 2)[-2] in {
        str(_line(matrix_dir, "extends: spark-mtp")), str(_line(matrix_dir, "extends: spark\n")),
        str(_line(matrix_dir, "extends: loopback"))}


def test_an_error_in_an_inherited_value_names_where_it_is_written(matrix_dir: Path,
                                                                  capsys) -> None:
    edit(matrix_dir, "      max-num-seqs: 64\n", "      max-num-seqz: 64\n")
    code = main(["check", "--matrix", str(matrix_dir / "matrix.yaml"), "--tag", TAG,
                 "--target", "gb10", "--format", "json"])
    found = [f for f in json.loads(capsys.readouterr().out)["findings"]
             if f["rule"] == "serve-flag-unknown"]
    assert code == 2 and "did you mean max-num-seqs" in found[0]["message"]
    # every gb10 cell inherits the typo from `spark`: each finding points at that line
    line = _line(matrix_dir, "max-num-seqz: 64")
    assert len(found) == 7
    assert {f["where"].split("matrix.yaml:")[1] for f in found} == {f"{line}:7"}


def test_the_real_matrix_states_each_spark_serve_flag_once() -> None:
    raw = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())["profiles"]
    seen: dict[tuple[str, str], str] = {}
    for name, prof in raw.items():
        for flag, value in (prof.get("args") or {}).items():
            key = (flag, repr(value))
            target = prof.get("target")
            assert key not in seen or raw[seen[key]].get("target") != target, (
                f"{flag}: {value} is written in profiles {seen.get(key)} and {name}")
            seen[key] = name


def test_merge_keys_and_extends_together(matrix_dir: Path) -> None:
    edit(matrix_dir, "    args:\n      max-model-len: 512\n",
         "    args:\n      <<: {max-num-seqs: 2, max-model-len: 256}\n"
         "      max-model-len: 512\n")
    edit(matrix_dir, "      max-num-seqs: 8\n", "")
    argv = _argv(matrix_dir, "cpu-tiny-ngram")
    assert argv[argv.index("--max-model-len") + 1] == "512"  # written beside `<<`: wins
    assert argv[argv.index("--max-num-seqs") + 1] == "2"  # merged
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # extended
