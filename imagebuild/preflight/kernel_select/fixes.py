"""Which switch makes vLLM choose what a profile expects: every environment variable and
serve option the recorded facts know changes a choice, tried alone and in pairs on the
cell's deployments (one per checkpoint layout), kept when every expectation holds and no
decision raises or falls into a known trap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from imagebuild.preflight.kernel_select.facts import Facts


@dataclass(frozen=True)
class Switch:
    where: str  # "env" | "arg" | "spec"
    name: str
    value: str | None  # None: remove what the profile sets

    def text(self) -> str:
        if self.where == "env":
            return (f"env {self.name}: \"{self.value}\"" if self.value is not None
                    else f"no env {self.name}")
        if self.where == "arg":
            return f"args {self.name}: {self.value}" if self.value is not None \
                else f"no args {self.name}"
        return (f"speculative-config {self.name}: {self.value}" if self.value is not None
                else f"no {self.name} in the speculative config")


def candidates(facts: Facts, present_env: Iterable[str], present_args: Iterable[str],
               drafter: bool) -> list[Switch]:
    """The switches vLLM's own code reads while choosing (predict.py), with the values the
    facts record for them; removing one the profile sets counts as a switch too."""
    out = [Switch("env", "VLLM_USE_FLASHINFER_MOE_FP4", "0"),
           Switch("env", "VLLM_USE_FLASHINFER_MOE_FP16", "0"),
           Switch("env", "VLLM_USE_FLASHINFER_SAMPLER", "0")]
    out += [Switch("env", "VLLM_DISABLED_KERNELS", k)
            for k in facts["nvfp4_linear"]["candidates"]]
    out += [Switch("env", "VLLM_NVFP4_GEMM_BACKEND", k)
            for k in facts["nvfp4_linear"]["env_backends"]]
    backends = [b for b, m in facts["nvfp4_moe"]["moe_backends"].items()
                if not isinstance(m, dict)]
    backends += [b for b, m in facts["unquantized_moe"]["moe_backends"].items()
                 if not isinstance(m, dict) and b not in backends]
    out += [Switch("arg", "moe-backend", b) for b in backends]
    out += [Switch("arg", "linear-backend", b) for b in sorted(facts["linear_backends"])]
    attention = sorted(n.lower() for n, b in facts["attention"]["backends"].items()
                       if "import_error" not in b)
    out += [Switch("arg", "attention-backend", b) for b in attention]
    out += [Switch("arg", "kv-cache-dtype", "auto")]
    if drafter:
        out += [Switch("spec", "moe_backend", b) for b in backends]
        out += [Switch("spec", "attention_backend", b) for b in attention]
    out += [Switch("env", e, None) for e in present_env if e.startswith("VLLM_")]
    out += [Switch("arg", a, None) for a in present_args
            if a in ("moe-backend", "linear-backend", "attention-backend", "kv-cache-dtype")]
    return out


def search(facts: Facts, failing: Callable[[tuple[Switch, ...]], int],
           drafter: bool, present_env: Iterable[str], present_args: Iterable[str],
           most: int = 5) -> list[list[Switch]]:
    """The switches that bring `failing(switches)` (unmet expectations, errors and traps
    over the cell's layouts, layouts first) lowest: one at a time, each the one that helps
    most (the first in candidates() order on a tie), at most `most`; each entry lists the
    chosen switch first, then the ones that would do as well in its place. [] when none
    helps."""
    singles = candidates(facts, present_env, present_args, drafter)
    chosen: list[Switch] = []
    score = failing(())
    while score and len(chosen) < most:
        taken = {(s.where, s.name) for s in chosen}
        tried = [(failing((*chosen, s)), i, s) for i, s in enumerate(singles)
                 if (s.where, s.name) not in taken]
        best = min(tried, default=None, key=lambda t: (t[0], t[1]))
        if best is None or best[0] >= score:
            break
        score = best[0]
        chosen.append(best[2])
    out = []
    for i, s in enumerate(chosen):
        others = chosen[:i] + chosen[i + 1:]
        taken = {(o.where, o.name) for o in others}
        alike = [t for t in singles if t != s and (t.where, t.name) not in taken
                 and failing((*others, t)) == score]
        out.append([s, *alike[:2]])
    return out
