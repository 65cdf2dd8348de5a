"""Kernel traps of GB10 (sm_121) that pass smoke silently, as rules with their references.

Each is a release that serves, answers and is wrong or slow; the anchors' trackers name them:
- flashinfer#3294: FlashInfer's fused-MoE library ships only sm_120 code and gives garbage
  on 12.1a. A profile that selects a FlashInfer MoE backend on sm_121 is refused; an NVFP4
  MoE checkpoint on sm_121 must state `expect_backends.moe`, so smoke asserts at boot that
  vLLM's automatic choice is not FlashInfer's.
- vllm#53014: vLLM up to v0.29 picks the slower weight-only NVFP4 GEMM on SM12x; an NVFP4
  checkpoint served there must state `expect_backends.nvfp4_gemm` (smoke asserts it).
- vllm#29469: Triton's bundled ptxas rejects sm_121a; the engine's runtime stage must point
  TRITON_PTXAS_PATH at the toolkit's ptxas and self-check it (runtime-selfcheck.py
  triton-ptxas), and a profile must not override it.
"""

from __future__ import annotations

import json

from packaging.version import Version

from imagebuild.preflight.checkpoint import Checkpoint
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView

SM121 = "sm_121"
WEIGHT_ONLY_UNTIL = Version("0.29.99")  # vllm#53014: every tag up to v0.29
FLASHINFER_MOE_ENV = ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP8")
TRITON_ENV = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")

RULES = (
    Rule("flashinfer-moe-sm121", "error",
         "FlashInfer's fused-MoE library ships only sm_120 code and gives garbage on 12.1a "
         "(flashinfer#3294); vLLM may pick it on its own for an NVFP4 MoE checkpoint",
         "select vLLM's CUTLASS MoE (expect_backends: {moe: VLLM_CUTLASS}, and no "
         "FlashInfer MoE switch in the profile) so smoke asserts it at boot",
         hardware=(SM121,)),
    Rule("nvfp4-gemm-asserted", "error",
         "vLLM up to v0.29 picks the slower weight-only NVFP4 GEMM kernel on SM12x "
         "(vllm#53014): the release serves, and is slow",
         "state expect_backends: {nvfp4_gemm: CUTLASS} in the profile so smoke fails when "
         "the boot chooses another kernel",
         hardware=("native-fp4",)),
    Rule("triton-ptxas-sm121a", "error",
         "Triton's bundled ptxas rejects sm_121a (vllm#29469): every Triton kernel fails "
         "at its first launch unless TRITON_PTXAS_PATH names the CUDA toolkit's ptxas",
         "keep TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH in the engine's runtime "
         "stage (checked by runtime-selfcheck.py triton-ptxas) and out of the profile's env",
         hardware=(SM121,), waivable=False),
)
BY_ID = {r.id: r for r in RULES}


def _quant_text(cp: Checkpoint | None) -> str | None:
    if cp is None or cp.config is None:
        return None
    q = cp.config.get("quantization_config") or {}
    return json.dumps([q, cp.hf_quant or {}]).lower()


def is_nvfp4(cp: Checkpoint | None) -> bool | None:
    """None: the checkpoint's metadata is not locked (the rule cannot be checked)."""
    text = _quant_text(cp)
    return None if text is None else "nvfp4" in text


def is_moe(cp: Checkpoint | None) -> bool:
    cfg: dict = (cp.config or {}) if cp else {}
    sub = cfg.get("text_config")
    text: dict = sub if isinstance(sub, dict) else cfg
    return any(k in text for k in ("num_experts", "n_routed_experts", "num_local_experts"))


def _expected(v: CellView, kind: str) -> str | None:
    eb = v.cell.profile.expect_backends
    return getattr(eb, kind) if eb else None


def check_cell(v: CellView, model: Checkpoint | None) -> list[Finding]:
    out: list[Finding] = []
    where_eb = v.lm.located.where(("profiles", v.cell.profile_name))
    nvfp4 = is_nvfp4(model)
    # flashinfer#3294
    r = BY_ID["flashinfer-moe-sm121"]
    if v.applies(r):
        moe = _expected(v, "moe")
        switched = [e for e in FLASHINFER_MOE_ENV if v.env.get(e, "0") not in ("0", "")]
        flag = v.flag("moe-backend")
        if moe and moe.upper().startswith("FLASHINFER"):
            out.append(r.finding(v.label, f"the profile expects MoE backend {moe} on sm_121",
                                 where=where_eb))
        elif switched:
            out.append(r.finding(v.label, f"the profile sets {', '.join(switched)}: FlashInfer "
                                          "fused MoE on sm_121", where=v.where(env=switched[0])))
        elif isinstance(flag, str) and flag.lower().startswith("flashinfer"):
            out.append(r.finding(v.label, f"--moe-backend {flag} on sm_121",
                                 where=v.where("moe-backend")))
        elif nvfp4 and is_moe(model) and not moe:
            out.append(r.finding(v.label, "an NVFP4 MoE checkpoint on sm_121 without "
                                          "expect_backends.moe: vLLM's automatic choice may "
                                          "be FlashInfer's sm_120-only fused MoE",
                                 where=where_eb))
    # vllm#53014
    r = BY_ID["nvfp4-gemm-asserted"]
    cc = str(v.cell.target.compute_capability or "")
    if (v.applies(r) and cc.startswith("12.") and nvfp4
            and Version(v.cell.engine.vllm_version) <= WEIGHT_ONLY_UNTIL
            and not _expected(v, "nvfp4_gemm")):
        out.append(r.finding(v.label, f"an NVFP4 checkpoint on sm_{cc.replace('.', '')} with "
                                      f"vLLM {v.cell.engine.vllm_version} and no "
                                      "expect_backends.nvfp4_gemm", where=where_eb))
    # vllm#29469
    r = BY_ID["triton-ptxas-sm121a"]
    if v.applies(r):
        out += _triton_ptxas(v, r)
    return out


def _triton_ptxas(v: CellView, r: Rule) -> list[Finding]:
    from imagebuild.errors import UserError
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.rehearse.runtime_stage import read_runtime_stage
    from imagebuild.render import render_engine

    overridden = [e for e in TRITON_ENV if e in v.env]
    if overridden:
        return [r.finding(v.label, f"the profile sets {', '.join(overridden)}, replacing the "
                                   "runtime stage's toolkit ptxas",
                          where=v.where(env=overridden[0]))]
    try:  # the engine Dockerfile this checkout renders, as `build` would
        text = render_engine(v.lm, v.cell.target_name, v.cell.engine_name,
                             read_lock(v.lm.root)).text
    except UserError as exc:
        return [r.finding(v.label, f"cannot check the engine's runtime stage: {exc.message}",
                          fix=exc.fix, severity="warning")]
    stage = read_runtime_stage(text)
    missing = [e for e in TRITON_ENV if not stage.env.get(e)]
    checked = any("triton-ptxas" in args or "installed" in args or "all" in args
                  for args in stage.selfchecks)
    if missing or not checked:
        what = (f"sets no {', '.join(missing)}" if missing
                else "never runs runtime-selfcheck.py's triton-ptxas check")
        return [r.finding(v.label, f"the engine's runtime stage ({v.cell.target_name}/"
                                   f"{v.cell.engine_name}) {what}")]
    return []

