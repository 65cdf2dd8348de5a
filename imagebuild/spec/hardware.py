"""What a target is, as traits: the serve-flag rules, the CI runner, the disk estimate and
host detection read these, never a target's name (a GB10 target called `spark2` is still
a GB10).

Traits of a target:
- its accelerator: `cuda` or `cpu`
- its architecture: `arm64` or `amd64` (from `platform`)
- `unified-memory` when the GPU shares the host's memory (GB10)
- `sm_<major><minor>` from the compute capability, e.g. `sm_121` for GB10, `sm_120` for
  an RTX 5090
- `native-fp4` on GPUs with FP4 tensor cores (Blackwell: compute capability 10.x and
  12.x), where NVFP4 kernels run natively instead of through Marlin
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from imagebuild.errors import UserError
from imagebuild.spec.config import Target

NATIVE_FP4_MAJORS = (10, 12)  # Blackwell data-centre (10.x) and GB10/RTX 50 (12.x)
# GitHub-hosted runner labels for cpu targets, by architecture
HOSTED_RUNNERS = {"amd64": ["ubuntu-24.04"], "arm64": ["ubuntu-24.04-arm"]}
# self-hosted runners carry GitHub's default OS and architecture labels
RUNNER_ARCH = {"amd64": "X64", "arm64": "ARM64"}


def arch(target: Target) -> str:
    return target.platform.split("/", 1)[1]


def sm(capability: str) -> str:
    """'12.1' -> 'sm_121' (what nvcc and cuobjdump call it)."""
    major, minor = capability.split(".")
    return f"sm_{major}{minor}"


def traits(target: Target) -> frozenset[str]:
    out = {target.accelerator, arch(target)}
    if target.unified_memory:
        out.add("unified-memory")
    if target.compute_capability is not None:
        cc = str(target.compute_capability)
        out.add(sm(cc))
        if int(cc.split(".")[0]) in NATIVE_FP4_MAJORS:
            out.add("native-fp4")
    return frozenset(out)


def runner(target: Target) -> list[str]:
    """The runner labels its jobs go to: `runner:` when given, else from the properties
    (GitHub's hosted Ubuntu for cpu; a self-hosted runner labelled with its GPU's
    sm_XY for cuda)."""
    if target.runner:
        return list(target.runner)
    if target.accelerator == "cpu":
        return list(HOSTED_RUNNERS[arch(target)])
    assert target.compute_capability is not None  # config.py: required for cuda
    return ["self-hosted", "linux", RUNNER_ARCH[arch(target)],
            sm(str(target.compute_capability))]


def node_group_label(nodes: int) -> str:
    """The runner label of a machine that drives `nodes - 1` partners (Docker over SSH,
    docs/release-workflow.md): `pair` for two, `nodes-N` for more."""
    return "pair" if nodes == 2 else f"nodes-{nodes}"


def cell_runner(target: Target, nodes: int) -> list[str]:
    """A cell's runner labels: its target's, and for a cell over several self-hosted
    machines the label of a runner with that many partners. Hosted runners take no
    custom label: there every node runs on the one machine (the cpu target, loopback)."""
    labels = runner(target)
    if nodes > 1 and "self-hosted" in labels:
        labels.append(node_group_label(nodes))
    return labels


# ------------------------------------------------------------------ matching a host


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "12.1"


@dataclass(frozen=True)
class Host:
    """What a machine has, as far as choosing a target goes."""

    platform: str  # linux/amd64 | linux/arm64 | linux/<other machine>
    gpus: tuple[Gpu, ...] = ()

    def describe(self) -> str:
        if not self.gpus:
            return f"{self.platform} without an NVIDIA GPU"
        kinds = sorted({f"{g.name} ({sm(g.compute_capability)})" for g in self.gpus})
        return f"{self.platform} with {', '.join(kinds)}"


def match(targets: Mapping[str, Target], host: Host) -> tuple[str, str]:
    """(target, why): the one target of the matrix this host can build and serve.

    A host with a GPU takes the cuda target of its platform whose compute capability is
    its GPU's; otherwise (or when the matrix has none for that GPU) the cpu target of its
    platform. Several equally good targets, or none, are an error naming them."""
    same = {n: t for n, t in targets.items() if t.platform == host.platform}
    caps = {g.compute_capability for g in host.gpus}
    cuda = [n for n, t in same.items()
            if t.accelerator == "cuda" and str(t.compute_capability) in caps]
    cpu = [n for n, t in same.items() if t.accelerator == "cpu"]
    for found, what in ((cuda, "its GPU"), (cpu, "the CPU engine")):
        if len(found) == 1:
            extra = ("" if what == "its GPU" or not host.gpus
                     else "; no target of matrix.yaml is for its GPU")
            return found[0], f"this host is {host.describe()}: {what}{extra}"
        if len(found) > 1:
            raise UserError(f"several targets fit this host ({host.describe()}): "
                            f"{', '.join(found)}",
                            fix="choose one with --target (or IMAGEBUILD_TARGET)")
    listed = ", ".join(f"{n} ({t.platform}, {t.accelerator}"
                       + (f" {sm(str(t.compute_capability))})" if t.compute_capability
                          else ")") for n, t in targets.items())
    raise UserError(f"no target of matrix.yaml fits this host ({host.describe()}); the "
                    f"matrix has {listed}",
                    fix="pass --target NAME to plan for another machine, or add a target "
                        "for this one")
