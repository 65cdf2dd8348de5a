"""Which kernels vLLM chose at boot, read from its own log lines and /metrics, and how they
compare with what the profile expects (`expect_backends:` in matrix.yaml).

A release can pass every request-level check and still run the slow or wrong kernel (the
FlashInfer NVFP4 GEMM and fused MoE vLLM 0.23.0 picks on sm_121 by itself, the latter
sm_120 code and wrong on 12.1a, flashinfer#3294; preflight/kernels.py predicts them): the
kernel choice is only visible in the boot log. The lines are read with the readers of the
image's own vLLM version (facts/signals.py: each message as that version's recorded facts
word it, in the file that logs it); a kind no message of the version carries is
unreadable, and an expectation of it fails, never passes. What is read per kind:
- attention: the platform's choice (cuda.py, cpu.py) or the layout line naming it (0.23's
  selector.py); `moe` the target's quantized experts' oracle line, its Unquantized line
  counting only for a model with no quantized MoE (labels named as its enum does:
  FLASHINFER_CUTLASS...); `nvfp4_gemm` the kernel class (CUTLASS for
  CutlassNvFp4LinearKernel); the sampler (the CPU platform logs none: unknown there);
- the drafter: gpu_model_runner.py load_model logs "Loading drafter model..." between the
  target's model and the drafter's; a process's MoE and attention lines after it are the
  drafter's (`drafter_moe`, `drafter_attention`). vLLM logs each choice once per process
  (logger.info_once), so a drafter choice identical to the target's prints nothing: then
  the target's line stands for it;
- speculative method: the engine's config line `speculative_config=SpeculativeConfig(
  method='X'` (or `speculative_config=None`), confirmed by /metrics' draft-token counter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from imagebuild.facts.signals import compile_readers, kind_unreadable, signals_in
from imagebuild.smoke.probes import SPEC_DRAFT, metric_sum

KINDS = ("attention", "nvfp4_gemm", "moe", "sampler", "speculative", "drafter_moe",
         "drafter_attention")

# the Unquantized oracle's labels that are not its enum names (unquantized.py 32-41)
UNQUANTIZED_LABELS = {"FlashInfer TRTLLM": "FLASHINFER_TRTLLM",
                      "FlashInfer CUTLASS": "FLASHINFER_CUTLASS", "ROCm AITER": "AITER"}
UNQUANTIZED_MOE = "moe_unquantized"  # not a KIND: what `moe` falls back to
# vLLM's process prefix: "(Worker_TP0 pid=123) INFO ..." (none in a single process)
_PROCESS = re.compile(r"^\((?P<proc>[^)]*pid=\d+)\)")


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

    def add(self, kind: str, name: str, line: str, span: tuple[int, int] | None = None
            ) -> None:
        names = self.seen.setdefault(kind, [])
        if name not in names:
            names.append(name)
            # the words around the match: vLLM's config line runs to thousands of characters
            start, end = span or (0, len(line))
            self.evidence.setdefault(kind, line[max(0, start - 60):end + 60].strip())

    def as_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.seen.items()}


def _name(signal: str, value: str) -> str:
    """A signal's value as expect_backends names it."""
    if signal == "nvfp4_gemm":
        return _gemm_name(value.removesuffix("NvFp4LinearKernel"))
    if signal == "speculative":
        return value.lower()
    if signal in ("moe", UNQUANTIZED_MOE):
        label = value.strip()
        return normal(UNQUANTIZED_LABELS.get(label, label).replace(" ", "_"))
    return normal(value)


def read_log(lines: Iterable[str], readers: Iterable[Mapping[str, Any]]) -> Chosen:
    """What the log says vLLM chose, read with the image's vLLM version's `readers`
    (expectations' `log_readers`: facts/signals.py readers())."""
    compiled = compile_readers(readers)
    out = Chosen()
    drafting: set[str] = set()  # processes past their "Loading drafter model..."
    for line in lines:
        pm = _PROCESS.match(line)
        proc = pm.group("proc") if pm else ""
        seen = list(signals_in(line, compiled))
        if any(s.signal == "drafter_starts" for s in seen):
            drafting.add(proc)
            continue
        drafter = proc in drafting
        for s in seen:
            kind = s.signal
            if kind in ("attention", "moe", UNQUANTIZED_MOE) and drafter:
                kind = "drafter_attention" if kind == "attention" else "drafter_moe"
            if kind == "weights_skipped":
                continue  # test_serving.py's check reads those
            out.add(kind, _name(s.signal, s.value), line, (s.start, s.end))
    return out


def mismatches(expected: Mapping[str, str | None], chosen: Chosen,
               metrics: str | None = None, unreadable: Mapping[str, str] | None = None
               ) -> list[str]:
    """One line per expected kind vLLM did not choose: the expected value, what it chose
    (or that its log never said, or that no line of this vLLM version says it:
    `unreadable`, facts/signals.py), and the line it said it in."""
    bad = []
    for kind in KINDS:
        want = expected.get(kind)
        if want is None:
            continue
        why = kind_unreadable(kind, unreadable or {})
        if why is not None:
            bad.append(f"{kind}: expected {want}, but this vLLM's log cannot say it: {why}")
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
