"""Which kernels vLLM chose at boot, read from its own log lines and /metrics, and how they
compare with what the profile expects (`expect_backends:` in matrix.yaml).

A release can pass every request-level check and still run the slow or wrong kernel (the
weight-only NVFP4 GEMM vLLM picks on SM12x up to v0.29, vllm#53014; FlashInfer's fused MoE,
sm_120 code only and wrong on 12.1a, flashinfer#3294): the kernel choice is only visible in
the boot log. Patterns are vLLM 0.23's own messages:
- attention: platforms/cuda.py "Using X attention backend out of potential backends" (auto)
  or "Using AttentionBackendEnum.X backend." (named); v1/attention/selector.py "Using HND
  KV cache layout for X backend." (every platform whose backend needs a layout: CPU_ATTN);
- NVFP4 GEMM: model_executor/kernels/linear "Using <Kernel>NvFp4LinearKernel for NVFP4 GEMM";
- MoE: fused_moe/oracle "Using 'X' NvFp4 MoE backend out of potential backends" (quoted
  for NvFp4/Mxfp4/MxFp8/WNA16, bare for Fp8/Int8/W4A8/"W4A8 Int8"/Unquantized). One line per
  quantization a model's MoE layers use: an NVFP4 checkpoint whose MTP layer is unquantized
  logs an Unquantized line beside the NvFp4 one, so `moe` is the quantized experts' backend
  and the Unquantized line counts only for a model with no quantized MoE;
- sampler: v1/sample/ops/topk_topp_sampler.py "Using FlashInfer for top-p & top-k sampling"
  or its "disabled"/"unavailable" lines (the PyTorch sampler: NATIVE); the CPU platform logs
  nothing here, so the sampler is not known there;
- speculative method: the engine's config line `speculative_config=SpeculativeConfig(
  method='X'` (or `speculative_config=None`), confirmed by /metrics' draft-token counter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from imagebuild.smoke.probes import SPEC_DRAFT, metric_sum

KINDS = ("attention", "nvfp4_gemm", "moe", "sampler", "speculative")

_ATTENTION = (
    re.compile(r"Using (\w+) attention backend out of potential backends"),
    re.compile(r"Using AttentionBackendEnum\.(\w+) backend\."),
    re.compile(r"Using \w+ KV cache layout for (\w+) backend\."),
)
_GEMM = re.compile(r"Using (\w+?)NvFp4LinearKernel for NVFP4 GEMM")
_MOE = re.compile(r"Using '?(\w+?)'? ((?:\w+ )*?)MoE backend")
UNQUANTIZED_MOE = "moe_unquantized"  # not a KIND: what `moe` falls back to
_SAMPLER = (
    (re.compile(r"Using FlashInfer for top-p & top-k sampling"), "FLASHINFER"),
    (re.compile(r"FlashInfer top-p/top-k sampling (?:disabled|unavailable)"), "NATIVE"),
)
_SPEC = re.compile(r"speculative_config=(?:SpeculativeConfig\(method='(\w+)'|(None))")


def normal(name: str) -> str:
    """Names compare case-insensitively, `-` and `_` alike (flash_attn == FLASH_ATTN)."""
    return name.strip().upper().replace("-", "_")


def _gemm_name(kernel: str) -> str:
    """'Cutlass' -> CUTLASS, 'FlashInferCutlass' -> FLASHINFER_CUTLASS (the kernel class
    name without NvFp4LinearKernel, as VLLM_NVFP4_GEMM_BACKEND spells them)."""
    rest = kernel.replace("FlashInfer", "FLASHINFER_", 1)
    return normal(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", rest)).replace("__", "_")


@dataclass
class Chosen:
    """Every backend name seen per kind, with the line that said so."""

    seen: dict[str, list[str]] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, name: str, line: str, m: re.Match[str] | None = None) -> None:
        names = self.seen.setdefault(kind, [])
        if name not in names:
            names.append(name)
            # the words around the match: vLLM's config line runs to thousands of characters
            start, end = (m.start(), m.end()) if m else (0, len(line))
            self.evidence.setdefault(kind, line[max(0, start - 60):end + 60].strip())

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.seen.items()}


def read_log(lines: Iterable[str]) -> Chosen:
    out = Chosen()
    for line in lines:
        for pattern in _ATTENTION:
            if m := pattern.search(line):
                out.add("attention", normal(m.group(1)), line, m)
        if m := _GEMM.search(line):
            out.add("nvfp4_gemm", _gemm_name(m.group(1)), line, m)
        elif "MoE backend" in line and (m := _MOE.search(line)):
            unquantized = m.group(2).strip().lower() == "unquantized"
            out.add(UNQUANTIZED_MOE if unquantized else "moe", normal(m.group(1)), line, m)
        for pattern, name in _SAMPLER:
            if sm := pattern.search(line):
                out.add("sampler", name, line, sm)
        if m := _SPEC.search(line):
            out.add("speculative", (m.group(1) or "none").lower(), line, m)
    return out


def mismatches(expected: Mapping[str, str | None], chosen: Chosen,
               metrics: str | None = None) -> list[str]:
    """One line per expected kind vLLM did not choose: the expected value, what it chose
    (or that its log never said), and the line it said it in."""
    bad = []
    for kind in KINDS:
        want = expected.get(kind)
        if want is None:
            continue
        got = chosen.seen.get(kind, [])
        evidence = chosen.evidence.get(kind, "")
        if kind == "moe" and not got:  # no quantized MoE layer: the unquantized experts'
            got = chosen.seen.get(UNQUANTIZED_MOE, [])
            evidence = chosen.evidence.get(UNQUANTIZED_MOE, "")
        if kind == "speculative":
            ok = [g.lower() for g in got] == [want.lower()]
            if (ok and want.lower() != "none" and metrics is not None
                    and metric_sum(metrics, SPEC_DRAFT) is None):
                bad.append(f"speculative: expected {want}, the log names it but /metrics has "
                           f"no {SPEC_DRAFT}")
                continue
        else:
            ok = [normal(g) for g in got] == [normal(want)]
        if ok:
            continue
        if not got:
            bad.append(f"{kind}: expected {want}, vLLM's log names no {kind} backend")
        else:
            bad.append(f"{kind}: expected {want}, vLLM chose {', '.join(got)} "
                       f"(log: {evidence})")
    return bad
