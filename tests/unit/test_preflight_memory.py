"""Memory admission (preflight/memory.py): every cell's predicted peak is printed, and a cell
that cannot fit its target is refused with the numbers, the matrix.yaml line and the flag
to change. On the repository's matrix locked from the recorded Hub answers (the gb10
models' real file sizes and configs), edited the way a person would."""

from __future__ import annotations

from pathlib import Path

from imagebuild.lock.lockfile import Lock
from imagebuild.preflight import memory
from tests.support.matrices import check, edit, of

GIB = 2**30


def line_of(root: Path, text: str) -> str:
    """matrix.yaml:<line> of the first line holding `text` (what `where` must point at)."""
    lines = (root / "matrix.yaml").read_text().splitlines()
    return f"matrix.yaml:{next(i for i, ln in enumerate(lines, 1) if text in ln)}:"


def admission(findings: list) -> list:
    return [f for f in of(findings, "memory-admission") if f.severity == "error"]


OVERRIDE = "      num-gpu-blocks-override: 16\n"


def kv_space_alone(root: Path) -> None:
    """The cpu profile without its block override: the pool is VLLM_CPU_KVCACHE_SPACE."""
    edit(root, OVERRIDE, "")


def test_every_repository_cell_fits_and_prints_its_breakdown(locked: Path) -> None:
    findings = check(locked)
    assert not of(findings, "memory-admission")
    shown = {f.cell: f.message for f in of(findings, "memory-prediction")}
    cells = {f.cell for f in findings if f.cell != "matrix"}
    assert set(shown) == cells
    cpu = shown["cpu/cpu-tiny-ngram@dflashfix"]
    # the profile's 16 blocks of 128 tokens x 2 layers x 32 KiB pages, not the 1 GiB space
    assert cpu.startswith("fits, 6.67 GiB spare: predicted peak 1.33 GiB"), cpu
    assert "KV (--num-gpu-blocks-override 16) 1.0 MiB" in cpu and "budget memory_limit 8g" in cpu
    # gb10: the locked safetensors sizes, the drafter's own files, the pool vLLM keeps
    zlab = shown["gb10/spark-heretic-zlab@dflashfix"]
    assert "weights 20.49 GiB + drafter 0.80 GiB" in zlab, zlab
    assert "budget gpu-memory-utilization 0.85 x 128g = 108.80 GiB" in zlab
    assert "8 max-model-len requests at once against max-num-seqs 64" in zlab
    assert "host reserve 5.00 GiB = 123.30 GiB of 128.00 GiB" in zlab


def test_a_cpu_kv_space_beyond_the_container_limit_is_refused(locked: Path) -> None:
    # measured: KV 7 GiB in the 8g container is OOM-killed at boot (docs/memory.md)
    kv_space_alone(locked)
    edit(locked, 'VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "7"')
    found = admission(check(locked, target="cpu"))
    assert len(found) == 3, found  # every cpu engine's cell (two on 0.23, one on 0.32)
    f = found[0]
    assert "does not fit: predicted peak 8.33 GiB" in f.message, f.message
    assert "budget memory_limit 8g = 8.00 GiB" in f.message
    assert f.fix == "lower VLLM_CPU_KVCACHE_SPACE to 6 or raise the target's memory_limit"
    assert line_of(locked, 'VLLM_CPU_KVCACHE_SPACE: "7"') in (f.where or ""), f.where


def test_the_largest_kv_space_that_fits_passes(locked: Path) -> None:
    kv_space_alone(locked)
    edit(locked, 'VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "6"')
    findings = check(locked, target="cpu")
    assert not admission(findings)
    assert all(f.message.startswith("fits, 0.67 GiB spare")
               for f in of(findings, "memory-prediction"))


def test_a_cpu_kv_space_that_cannot_hold_one_request_is_refused(locked: Path) -> None:
    kv_space_alone(locked)
    edit(locked, 'VLLM_CPU_KVCACHE_SPACE: "1"', 'VLLM_CPU_KVCACHE_SPACE: "0"')
    found = admission(check(locked, target="cpu"))
    assert len(found) == 3, found
    assert "VLLM_CPU_KVCACHE_SPACE 0.0 MiB cannot hold one max-model-len request (0.2 MiB)" \
        in found[0].message, found[0].message
    assert found[0].fix == "raise VLLM_CPU_KVCACHE_SPACE or lower --max-model-len"


def test_a_block_override_makes_the_pool_and_is_refused_below_one_request(
        locked: Path) -> None:
    # vLLM 0.23.0 replaces the available memory with N blocks before its admission check
    edit(locked, OVERRIDE, "      num-gpu-blocks-override: 3\n")
    found = admission(check(locked, target="cpu"))
    assert len(found) == 3, found
    # 3 blocks: 192 KiB; one 512-token request: 4 blocks, 256 KiB (both shown in MiB)
    assert ("--num-gpu-blocks-override 3 0.2 MiB cannot hold one max-model-len request "
            "(0.2 MiB)") in found[0].message, found[0].message
    assert found[0].fix == "raise --num-gpu-blocks-override or lower --max-model-len"
    assert line_of(locked, "num-gpu-blocks-override: 3") in (found[0].where or "")


def test_a_cpu_cell_without_a_kv_space_is_warned(locked: Path) -> None:
    edit(locked, '    env:\n      VLLM_CPU_KVCACHE_SPACE: "1"\n', "")
    found = of(check(locked, target="cpu"), "memory-admission")
    assert found and all(f.severity == "warning" for f in found)
    assert "the host's memory, not the container's memory_limit 8g" in found[0].message


def test_a_pool_smaller_than_one_max_model_len_request_is_refused(locked: Path) -> None:
    # 0.25 x 128g leaves 4-6 GiB of KV pool beside ~26 GiB of weights and runtime: one
    # 262144-token request of a DFlash cell (k=11) needs 9.8 GiB, of an MTP cell 5.7 GiB
    # (more than the 5.1 GiB the larger nvfp4 checkpoint leaves): vLLM refuses at start
    edit(locked, "gpu-memory-utilization: 0.85", "gpu-memory-utilization: 0.25")
    findings = check(locked, target="gb10", engine="dflashfix")
    refused = {f.cell for f in admission(findings)}
    assert refused == {"gb10/spark-heretic-zlab", "gb10/spark-nvfp4-zlab",
                       "gb10/spark-ornith-zlab", "gb10/spark-heretic-aeon",
                       "gb10/spark-nvfp4-mtp"}, refused
    f = next(f for f in admission(findings) if f.cell == "gb10/spark-heretic-zlab")
    assert "refuses to start" in f.message and "KV pool 5.65 GiB" in f.message
    assert "one max-model-len request needs 9.79 GiB" in f.message, f.message
    assert f.fix == "lower --max-model-len or raise --gpu-memory-utilization"
    assert line_of(locked, "max-model-len: 262144") in (f.where or ""), f.where
    fits = of(findings, "memory-prediction")
    assert {f.cell for f in fits} == {"gb10/spark-heretic-mtp", "gb10/spark-ornith-mtp"}
    assert "1 max-model-len requests at once against max-num-seqs 64" in fits[0].message


def test_unified_memory_left_short_of_the_host_reserve_is_refused(locked: Path) -> None:
    # a Spark that also runs a desktop: 16g for the OS leaves no room for 0.85
    edit(locked, "    host_reserve: 5g\n", "    host_reserve: 16g\n")
    found = admission(check(locked, target="gb10", engine="dflashfix"))
    assert len(found) == 7, found
    assert "unified memory overcommitted" in found[0].message
    assert ("108.80 GiB + API server and engine core 9.50 GiB (with 2 x 4 GiB multimodal "
            "processor cache) + host reserve 16.00 GiB = 134.30 GiB > 128.00 GiB"
            in found[0].message), found[0].message
    assert found[0].fix == "lower --gpu-memory-utilization to 0.80 or below"
    assert line_of(locked, "gpu-memory-utilization: 0.85") in (found[0].where or "")


def test_weights_are_the_locked_safetensors_sizes() -> None:
    lock = Lock(data={"models": {"m": {"files": [
        {"path": "config.json", "size": 700},
        {"path": "model-00001-of-00002.safetensors", "size": 3 * GIB},
        {"path": "model-00002-of-00002.safetensors", "size": GIB},
        {"path": "model.safetensors.index.json", "size": 9000}]}}}, path=Path("x"))
    assert memory.locked_weight_bytes(lock, "models", "m", None) == 4 * GIB
    assert memory.locked_weight_bytes(lock, "models", "other", None) is None


def test_activations_are_batched_tokens_and_logits() -> None:
    text = {"hidden_size": 2048, "vocab_size": 248320}
    assert memory.activation_bytes(text, 16384, 64) == (
        16384 * 2048 * 2 * 16 + 64 * 248320 * 4)


def test_an_unset_utilization_is_the_cells_vllm_default_as_recorded(locked: Path,
                                                                     monkeypatch) -> None:
    # the recorded serve parser's default (facts/recorded/<version>/serve_args.json),
    # not the module's fallback for a version without facts
    monkeypatch.setattr(memory, "VLLM_DEFAULT_UTIL", 0.5)
    edit(locked, "      gpu-memory-utilization: 0.85\n", "")
    shown = {f.cell: f.message for f in of(check(locked, target="gb10", engine="dflashfix"),
                                           "memory-prediction")}
    assert shown and all("budget gpu-memory-utilization 0.92 x 128g" in m
                         for m in shown.values()), shown
