"""Which kernels vLLM chose at boot, read from its own log lines and /metrics, and how they
compare with what the profile expects (`expect_backends:` in matrix.yaml).

A release can pass every request-level check and still run the slow or wrong kernel (the
FlashInfer NVFP4 GEMM and fused MoE vLLM 0.23.0 picks on sm_121 by itself, the latter
sm_120 code and wrong on 12.1a, flashinfer#3294; preflight/kernels.py predicts them): the
kernel choice is only visible in the boot log. Patterns are vLLM 0.23's own messages:
- attention: platforms/cuda.py "Using X attention backend out of potential backends" (auto)
  or "Using AttentionBackendEnum.X backend." (named); v1/attention/selector.py "Using HND
  KV cache layout for X backend." (every platform whose backend needs a layout: CPU_ATTN);
- NVFP4 GEMM: model_executor/kernels/linear "Using <Kernel>NvFp4LinearKernel for NVFP4 GEMM";
- MoE: fused_moe/oracle "Using 'X' NvFp4 MoE backend out of potential backends" (quoted
  for NvFp4/Mxfp4/MxFp8/WNA16), bare for Fp8/Int8/W4A8/"W4A8 Int8", and the Unquantized
  oracle's labels (unquantized.py 32-41: "FlashInfer CUTLASS", "FlashInfer TRTLLM", "ROCm
  AITER", TRITON...), named here as its enum does (FLASHINFER_CUTLASS...). `moe` is the
  target's quantized experts' backend; its Unquantized line counts only for a model with no
  quantized MoE;
- the drafter: gpu_model_runner.py load_model logs "Loading drafter model..." between the
  target's model and the drafter's; a process's MoE and attention lines after it are the
  drafter's (`drafter_moe`, `drafter_attention`). vLLM logs each choice once per process
  (logger.info_once), so a drafter choice identical to the target's prints nothing: then
  the target's line stands for it;
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

KINDS = ("attention", "nvfp4_gemm", "moe", "sampler", "speculative", "drafter_moe",
         "drafter_attention")

_ATTENTION = (
    re.compile(r"Using (\w+) attention backend out of potential backends"),
    re.compile(r"Using AttentionBackendEnum\.(\w+) backend\."),
    re.compile(r"Using \w+ KV cache layout for (\w+) backend\."),
)
_GEMM = re.compile(r"Using (\w+?)NvFp4LinearKernel for NVFP4 GEMM")
# "Using 'VLLM_CUTLASS' NvFp4 MoE backend", "Using FlashInfer CUTLASS Unquantized MoE
# backend", "Using CUTLASS W4A8 Int8 MoE backend"
_MOE = re.compile(r"Using (?:'(?P<quoted>[^']+)' (?P<qkind>[\w ]+?)|(?P<bare>.+?) "
                  r"(?P<kind>Unquantized|Fp8|Int8|W4A8 Int8|W4A8|WNA16)) MoE backend")
# the Unquantized oracle's labels that are not its enum names (unquantized.py 32-41)
UNQUANTIZED_LABELS = {"FlashInfer TRTLLM": "FLASHINFER_TRTLLM",
                      "FlashInfer CUTLASS": "FLASHINFER_CUTLASS", "ROCm AITER": "AITER"}
UNQUANTIZED_MOE = "moe_unquantized"  # not a KIND: what `moe` falls back to
DRAFTER_STARTS = "Loading drafter model..."
# vLLM's process prefix: "(Worker_TP0 pid=123) INFO ..." (none in a single process)
_PROCESS = re.compile(r"^\((?P<proc>[^)]*pid=\d+)\)")
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


def _moe(m: re.Match[str]) -> tuple[str, bool]:
    """(backend name, unquantized?) of a MoE oracle's line."""
    if m.group("quoted"):
        return normal(m.group("quoted")), False
    label, kind = m.group("bare").strip(), m.group("kind")
    return normal(UNQUANTIZED_LABELS.get(label, label).replace(" ", "_")), kind == "Unquantized"


def read_log(lines: Iterable[str]) -> Chosen:
    out = Chosen()
    drafting: set[str] = set()  # processes past their "Loading drafter model..."
    for line in lines:
        pm = _PROCESS.match(line)
        proc = pm.group("proc") if pm else ""
        if DRAFTER_STARTS in line:
            drafting.add(proc)
            continue
        drafter = proc in drafting
        for pattern in _ATTENTION:
            if m := pattern.search(line):
                out.add("drafter_attention" if drafter else "attention", normal(m.group(1)),
                        line, m)
        if m := _GEMM.search(line):
            out.add("nvfp4_gemm", _gemm_name(m.group(1)), line, m)
        elif "MoE backend" in line and (m := _MOE.search(line)):
            name, unquantized = _moe(m)
            kind = "drafter_moe" if drafter else (UNQUANTIZED_MOE if unquantized else "moe")
            out.add(kind, name, line, m)
        for pattern, sname in _SAMPLER:
            if sm := pattern.search(line):
                out.add("sampler", sname, line, sm)
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
        if kind.startswith("drafter_") and not got:
            # logged once per process: a drafter choice equal to the target's prints nothing
            base = kind.removeprefix("drafter_")
            got = chosen.seen.get(base, []) or (chosen.seen.get(UNQUANTIZED_MOE, [])
                                               if base == "moe" else [])
            evidence = chosen.evidence.get(base, "") or chosen.evidence.get(UNQUANTIZED_MOE, "")
            if got:
                evidence = f"no line of the drafter's own; the target's: {evidence}"
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
