"""The hardware and extension probes of vLLM, patched so its own selection code runs on a
machine without the GPU: a CUDA platform of a chosen compute capability, and the answers
of the packages and compiled extensions a GPU image would have. Nothing else of vLLM is
changed: every choice is still made by vLLM's own functions.

Run with the Python of the vLLM it describes (stdlib and vllm only, no imagebuild); the
generator (generate.py beside this) and the test oracle (tests/support/vllm_oracle/
kernel_select.py) import it by path. `install()` must run before any vLLM module that
makes a kernel choice is imported: modules bind `current_platform` and some probe
functions at import time.

The probes (vLLM 0.23 names):
- capability: Platform.get_device_capability (platforms/interface.py; the CUDA platform
  class of platforms/cuda.py replaces the CPU one in place, so every `current_platform`
  reference sees it);
- flashinfer: vllm.utils.flashinfer.has_flashinfer and every has_flashinfer_* API probe
  (FlashInfer 0.6.12 with its full API, or not installed);
- cutlass_fp4 / cutlass_fp8 / cutlass_block_fp8 / cutlass_group_gemm: the compiled
  extension's answers (_custom_ops.cutlass_scaled_mm_supports_fp4 and kin, csrc/
  libtorch_stable/quantization/fp4/nvfp4_scaled_mm_entry.cu: true only for the SM families
  the build compiled);
- fa2 / fa3 / fa4: vllm_flash_attn's compiled FA2/FA3 modules and the FA4 (CuTe DSL)
  sources (vllm_flash_attn/flash_attn_interface.py FA*_AVAILABLE);
- fbgemm, deep_gemm, cutedsl: optional packages (utils/import_utils.py has_*).
"""

from __future__ import annotations

import functools
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PROBES = ("flashinfer", "cutlass_fp4", "cutlass_fp8", "cutlass_block_fp8",
          "cutlass_group_gemm", "fa2", "fa3", "fa4", "fbgemm", "deep_gemm", "cutedsl")

STATE: dict[str, Any] = {"cc": (12, 1), **{p: True for p in PROBES}}
READS: set[str] = set()  # probes (and "cc") read since the last reset_reads()
ENV_READS: set[str] = set()  # vLLM environment variables read since the last reset
_installed = False


# Packages a CUDA image installs (vLLM 0.23 requirements/cuda.txt) that vLLM's CUDA code
# paths import by name at module import time; stand-ins so those modules load here.
STANDIN_PACKAGES = ("humming", "flashinfer")


class _Placeholder:
    """Any name imported from a stand-in package: a class nothing here instantiates."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Placeholder,), {"__module__": self.__name__})


class _StandinFinder:
    """Meta-path finder: `import humming.x.y` gives stand-in modules."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        top = fullname.split(".")[0]
        if top not in STANDIN_PACKAGES or (top == "flashinfer" and not STATE["flashinfer"]):
            return None
        # The class is its own (static) loader: create_module/exec_module below.
        loader: Any = _StandinFinder
        return importlib.machinery.ModuleSpec(fullname, loader, is_package=True)

    @staticmethod
    def create_module(spec: Any) -> types.ModuleType:
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module: types.ModuleType) -> None:
        pass


def _probe(name: str):
    def answer(*_args: Any, **_kwargs: Any) -> bool:
        READS.add(name)
        return bool(STATE[name])
    answer.__name__ = f"probe_{name}"
    return answer


def install(cc: tuple[int, int] = (12, 1), **probes: bool) -> None:
    """Make vLLM see a CUDA GPU of capability `cc` with the given probe answers."""
    global _installed
    set_state(cc, **probes)
    if _installed:
        return
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    # no separate CUDA stream for shared experts (there is no CUDA here); a debug switch
    # no kernel choice reads
    os.environ.setdefault("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "1")
    import vllm  # noqa: F401
    from vllm.platforms import current_platform

    # the CPU build's own kernels (it picks _C_AVX512 or _C_AVX2 for this CPU); the CUDA
    # platform module imports the CUDA extension modules for their op registrations only
    current_platform.import_kernels()
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.meta_path.insert(0, _StandinFinder())
    import vllm.platforms.cuda as cuda
    from vllm.platforms.interface import DeviceCapability

    class ProbedCudaPlatform(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            READS.add("cc")
            major, minor = STATE["cc"]
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA probe"

        @classmethod
        def current_device(cls) -> Any:
            # layers built on the meta device: no CUDA context exists here
            import torch

            return torch.device("meta")

    current_platform.__class__ = ProbedCudaPlatform

    import vllm._custom_ops as ops
    ops.cutlass_scaled_mm_supports_fp4 = _probe("cutlass_fp4")
    ops.cutlass_scaled_mm_supports_fp8 = _probe("cutlass_fp8")
    ops.cutlass_scaled_mm_supports_block_fp8 = _probe("cutlass_block_fp8")
    ops.cutlass_group_gemm_supported = _probe("cutlass_group_gemm")
    import vllm.utils.flashinfer as fi
    for name in dir(fi):
        if name.startswith("has_flashinfer") and callable(getattr(fi, name)):
            setattr(fi, name, _probe("flashinfer"))
    import vllm.utils.import_utils as iu
    iu.has_fbgemm_gpu = _probe("fbgemm")
    iu.has_deep_gemm = _probe("deep_gemm")
    iu.has_cutedsl = _probe("cutedsl")
    import vllm.utils.deep_gemm as dg
    dg.has_deep_gemm = iu.has_deep_gemm
    # vllm_flash_attn imports its compiled FA2/FA3 modules at import time: stand-ins
    # let it load; which FA versions exist is then the probe (refresh() sets the flags)
    for version in (2, 3):
        name = f"vllm.vllm_flash_attn._vllm_fa{version}_C"
        sys.modules.setdefault(name, types.ModuleType(name))
    import vllm.vllm_flash_attn.flash_attn_interface as fa
    for version in (2, 3, 4):
        check = getattr(fa, f"_is_fa{version}_supported")

        def traced(check=check, version=version):
            READS.add(f"fa{version}")
            return check()
        setattr(fa, f"_is_fa{version}_supported", traced)
    import vllm.envs as envs

    original_getattr, original_is_set = envs.__getattr__, envs.is_set

    def traced_getattr(name: str) -> Any:
        ENV_READS.add(name)
        return original_getattr(name)

    def traced_is_set(name: str) -> bool:
        ENV_READS.add(name)
        return original_is_set(name)

    envs.__getattr__ = traced_getattr
    envs.is_set = traced_is_set
    _installed = True
    refresh()


def set_state(cc: tuple[int, int] | None = None, **probes: bool) -> None:
    unknown = set(probes) - set(PROBES)
    if unknown:
        raise KeyError(f"unknown probes {sorted(unknown)}; known: {PROBES}")
    if cc is not None:
        STATE["cc"] = tuple(cc)
    STATE.update(probes)
    if _installed:
        refresh()


def refresh() -> None:
    """Forget what vLLM cached from the previous probe answers: every functools cache of
    a loaded vLLM module (capability-keyed backend lists, has_* answers, the logger's
    once-only memory) and the two import-time CUTLASS flags, recomputed by vLLM's own
    functions."""
    for mod_name, mod in list(sys.modules.items()):
        if not (mod_name == "vllm" or mod_name.startswith("vllm.")) or mod is None:
            continue
        for value in list(vars(mod).values()):
            if (isinstance(value, functools._lru_cache_wrapper)
                    and getattr(value, "__module__", "") == mod_name):
                value.cache_clear()
    w8a8: Any = sys.modules.get("vllm.model_executor.layers.quantization.utils.w8a8_utils")
    if w8a8 is not None:
        # Module-level constants vLLM computed at import time from the old probes.
        block = w8a8.cutlass_block_fp8_supported()
        w8a8.CUTLASS_FP8_SUPPORTED = w8a8.cutlass_fp8_supported()
        w8a8.CUTLASS_BLOCK_FP8_SUPPORTED = block
        cutlass: Any = sys.modules.get("vllm.model_executor.kernels.linear.scaled_mm.cutlass")
        if cutlass is not None:
            cutlass.CUTLASS_BLOCK_FP8_SUPPORTED = block
    fa = sys.modules.get("vllm.vllm_flash_attn.flash_attn_interface")
    if fa is not None:
        for version in (2, 3, 4):
            setattr(fa, f"FA{version}_AVAILABLE", bool(STATE[f"fa{version}"]))
            setattr(fa, f"FA{version}_UNAVAILABLE_REASON",
                    None if STATE[f"fa{version}"] else f"FA{version} was not built")
    READS.clear()


# what the harness itself sets; environment() leaves them alone
HARNESS_ENV = ("VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL", "VLLM_DISABLE_SHARED_EXPERTS_STREAM")


def reset_reads() -> None:
    READS.clear()
    ENV_READS.clear()


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """vLLM reads its switches from os.environ at each access (envs.__getattr__)."""
    saved = {k: os.environ.get(k) for k in env}
    for key in [k for k in os.environ if k.startswith("VLLM_") and k not in env
                and k not in HARNESS_ENV]:
        saved.setdefault(key, os.environ.get(key))
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

