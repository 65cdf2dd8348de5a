"""Serve-flag rules: the measured GB10 traps of docs/domain.md ("do not undo"), one named rule
each, applied to a cell's resolved command line (servecmd.serve_command) and environment.

Rules read the argv the image will run, not matrix.yaml fields, so a trap is caught however
it got in (profile args, model fields, drafter options). The value vLLM uses is the last
occurrence of a flag (argparse), so that is the one checked.

Each rule is scoped to what it is about (findings.Rule): the hardware traits of the target
(spec/hardware.py; the traps were measured on a GB10: compute capability 12.1, unified
memory, native FP4), the speculative method, and the checkpoint's own traits
(preflight/families.py, from its locked config.json). A target's or model's name never
decides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from imagebuild.facts import VllmFacts, facts_for, locked_dir
from imagebuild.preflight.families import Family, modalities
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.smoke.probes import tool_probe
from imagebuild.spec.hardware import traits
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.spec.servecmd import ServeCommand

# Hardware the traps are about (spec/hardware.py traits). GB10 is compute capability 12.1
# with unified memory and native FP4.
UNIFIED = ("cuda", "unified-memory")  # the GPU's memory is the host's
MEASURED_ON_GB10 = ("cuda", "sm_121")  # measured there; other GPUs were not
NATIVE_FP4 = ("cuda", "native-fp4")  # CUTLASS FP4 kernels exist; Marlin is the fallback
CUDA = ("cuda",)
# limits suggested per modality when a vision model's are missing (docs/domain.md: 4 images,
# 2 videos for Qwen3.6)
SUGGESTED_LIMITS = {"image": 4, "video": 2, "audio": 1}
AEON_DRAFTER_PREFIX = "AEON-7/AEON-DFlash-"
MAX_BATCHED_TOKENS = 32768  # torch.compile range ceiling on GB10 (16384 is right)
MAX_GPU_MEM_UTIL = 0.88  # unified memory: 0.85 alone, 0.70 when shared
DFLASH_SPEC_TOKENS = 11  # ~11 measured best; 15 wastes draft compute
DFLASH_SPEC_TOKENS_SLACK = 1
AEON_MAX_NUM_SEQS = 16
# vLLM versions on which --mamba-block-size was seen to break Gated DeltaNet models
MAMBA_BLOCK_SIZE_OBSERVED = ">=0.23,<0.24"
PIP_INSTALL = re.compile(r"\b(?:pip3?|uv\s+pip|python3?\s+-m\s+pip)\s+install\b")


# --- reading a resolved command line -------------------------------------------------------

def flag_value(argv: tuple[str, ...], name: str) -> str | bool | None:
    """Value of the last `--name` (True for a bare flag), None when absent."""
    key, found = f"--{name}", None
    for i, arg in enumerate(argv):
        if arg == key:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            found = True if nxt is None or nxt.startswith("--") else nxt
        elif arg.startswith(key + "="):
            found = arg.split("=", 1)[1]
    return found


def flag_value_any(argv: tuple[str, ...], names: list[str] | tuple[str, ...]
                   ) -> tuple[str | None, str | bool | None]:
    """(the spelling, its value) of the last of several spellings of one option (argparse
    keeps the last value given for a dest, whichever spelling gave it)."""
    keys = {f"--{n}": n for n in names}
    found: tuple[str | None, str | bool | None] = (None, None)
    for i, arg in enumerate(argv):
        key = arg.split("=", 1)[0]
        if key not in keys:
            continue
        if "=" in arg:
            found = (keys[key], arg.split("=", 1)[1])
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            found = (keys[key], True if nxt is None or nxt.startswith("--") else nxt)
    return found


def spellings(cli: dict | None, name: str) -> list[str]:
    """Every option spelling of `name`'s dest in a version's recorded serve options, `name`
    first (0.32: gpu-memory-utilization and device-memory-utilization); negations of a
    boolean (`no-x`) are not spellings of `x`."""
    options = (cli or {}).get("options") or {}
    entry = options.get(name)
    if entry is None:
        return [name]
    same = [o for o, e in options.items() if e.get("dest") == entry.get("dest")
            and ("negates" in e) == ("negates" in entry) and o != name]
    return [name, *same]


def flag_values(argv: tuple[str, ...], name: str) -> list[str]:
    """All values after the last `--name` (nargs='+' flags such as --served-model-name)."""
    key = f"--{name}"
    starts = [i for i, a in enumerate(argv) if a == key]
    if not starts:
        return []
    out = []
    for arg in argv[starts[-1] + 1:]:
        if arg.startswith("--"):
            break
        out.append(arg)
    return out


def speculative(argv: tuple[str, ...]) -> dict:
    raw = flag_value(argv, "speculative-config")
    if not isinstance(raw, str):
        return {}
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return spec if isinstance(spec, dict) else {}


@dataclass(frozen=True)
class CellView:
    """What the rules read about one cell."""

    lm: LoadedMatrix
    cell: Cell
    cmd: ServeCommand
    family: Family | None = None  # what the model's checkpoint is (None: metadata unknown)
    label: str = ""  # how findings name the cell (cell.id, plus @engine when ambiguous)
    env: dict[str, str] = field(init=False)
    spec: dict = field(init=False)
    hardware: frozenset[str] = field(init=False)
    # the recorded facts of the cell's vLLM version (None: none recorded)
    facts: VllmFacts | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", dict(self.cmd.env))
        object.__setattr__(self, "spec", speculative(self.cmd.argv))
        object.__setattr__(self, "hardware", traits(self.cell.target))
        object.__setattr__(self, "facts", facts_for(self.cell.engine.vllm_version,
                                                    [locked_dir(self.lm.root)]))
        if not self.label:
            object.__setattr__(self, "label", self.cell.id)

    @property
    def version(self) -> str:
        return self.cell.engine.vllm_version

    @property
    def cli(self) -> dict | None:
        """The version's recorded `vllm serve` options (None: not recorded)."""
        return self.facts.serve_args if self.facts is not None else None

    def spelling(self, name: str) -> tuple[str, str | bool | None]:
        """(the spelling the command line uses, its value) for option `name`, whichever of
        the dest's spellings it was given as; (name, None) when absent."""
        used, value = flag_value_any(self.cmd.argv, spellings(self.cli, name))
        return used or name, value

    def default(self, name: str) -> object:
        """vLLM's default of option `name`, from the version's recorded parser."""
        entry = ((self.cli or {}).get("options") or {}).get(name) or {}
        return entry.get("default")

    @property
    def method(self) -> str:
        return str(self.spec.get("method") or "none")

    @property
    def model_traits(self) -> frozenset[str] | None:
        return None if self.family is None else self.family.traits

    def applies(self, rule: Rule) -> bool:
        return rule.applies(self.hardware, self.method, self.model_traits)

    def flag(self, name: str) -> str | bool | None:
        """The value vLLM reads for option `name`: the last of every spelling of its dest."""
        return self.spelling(name)[1]

    def where(self, flag: str | None = None, env: str | None = None) -> str:
        """matrix.yaml position of what produced a flag or env var (deepest known key)."""
        c = self.cell
        spelt = self.spelling(flag)[0] if flag is not None else None
        if env is not None:
            path: tuple = ("profiles", c.profile_name, "env", env)
        elif spelt in c.profile.args:
            path = ("profiles", c.profile_name, "args", spelt)
        elif flag == "quantization":
            path = ("models", c.model_name, "quantization")
        elif flag == "served-model-name":
            path = ("models", c.model_name, "served_names")
        elif flag == "limit-mm-per-prompt":
            path = ("models", c.model_name, "multimodal")
        elif flag == "speculative-config":
            # a plain cell has no drafter: what shapes its cache is the model
            path = ("drafters", c.drafter_name) if c.drafter else ("models", c.model_name)
        else:
            path = ("profiles", c.profile_name, "args")
        return self.lm.located.where(path)


def as_float(value: str | bool | None) -> float | None:
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def as_int(value: str | bool | None) -> int | None:
    try:
        return int(value) if isinstance(value, str) else None
    except ValueError:
        return None


def record_fix(version: str) -> str:
    from imagebuild.facts import record_command

    return f"record vLLM {version}'s facts: {record_command(version)}"


# --- the rules ------------------------------------------------------------------------------

RULES = (
    Rule("no-force-fp8-marlin", "error",
         "VLLM_TEST_FORCE_FP8_MARLIN forces the Marlin MoE path; CUTLASS NVFP4 MoE is faster "
         "for 256x8 experts on GB10",
         "remove VLLM_TEST_FORCE_FP8_MARLIN from the profile env", hardware=NATIVE_FP4),
    Rule("max-batched-tokens-ceiling", "error",
         f"--max-num-batched-tokens above {MAX_BATCHED_TOKENS} exceeds the compile-range "
         "ceiling measured on GB10 (compute capability 12.1)",
         "set max-num-batched-tokens: 16384", hardware=MEASURED_ON_GB10,
         facts=("serve_args",)),
    Rule("gpu-mem-util-unified", "error",
         f"on unified memory (GB10: 128 GB shared by CPU and GPU) --gpu-memory-utilization "
         f"above {MAX_GPU_MEM_UTIL} (vLLM's default, 0.92 in 0.23 and 0.32, is above it) "
         "starves the host",
         "set gpu-memory-utilization: 0.85 (0.70 when the machine is shared)",
         hardware=UNIFIED, facts=("serve_args",)),
    Rule("no-mamba-block-size", "error",
         "--mamba-block-size breaks hybrid Gated DeltaNet models (Qwen3-Next, Qwen3.5/3.6); "
         f"observed on vLLM {MAMBA_BLOCK_SIZE_OBSERVED}, not verified on other versions",
         "remove mamba-block-size from the profile args", model=("gdn",), facts=("serve_args",)),
    Rule("dflash-no-kv-cache-dtype", "error",
         "with DFlash, a --kv-cache-dtype other than auto collapses acceptance toward 0% "
         "(~6x slower)",
         "remove kv-cache-dtype from the profile args", methods=("dflash",),
         facts=("serve_args",)),
    Rule("dflash-no-attention-backend-in-spec-config", "error",
         "attention_backend inside --speculative-config collapses DFlash acceptance toward 0% "
         "(~6x slower)",
         "remove attention_backend from the drafter's options; set the profile's "
         "attention-backend instead", methods=("dflash",)),
    Rule("dflash-spec-tokens", "error",
         f"DFlash is measured best at ~{DFLASH_SPEC_TOKENS} speculative tokens; 15 wastes "
         "draft compute",
         f"set num_speculative_tokens: {DFLASH_SPEC_TOKENS}", methods=("dflash",)),
    Rule("keep-vision-on", "error",
         "a checkpoint with a vision tower (Qwen3.6: images and video) is served for its "
         "images: the model's `multimodal` limits state them (--limit-mm-per-prompt), and "
         "smoke sends an image; --language-model-only or an image limit of 0 turns the "
         "tower off",
         "set the model's multimodal limits for the modalities its architecture takes",
         model=("vision",), facts=("modalities", "serve_args")),
    Rule("multimodal-modalities", "error",
         "vLLM takes only the modalities an architecture's processor supports and ignores "
         "other keys of --limit-mm-per-prompt: a limit for one the model does not take "
         "promises input the server refuses (an image limit on a model without images "
         "fails smoke's image check)",
         "keep only the modalities the model's architecture takes",
         facts=("modalities", "serve_args")),
    Rule("attention-backend-flash-attn", "error",
         "DFlash KV sharing is only tested with the flash_attn backend (measured on GB10); "
         "flash_attn is a CUDA backend",
         "set attention-backend: flash_attn in the profile args", hardware=CUDA,
         methods=("dflash",), facts=("serve_args",)),
    Rule("aeon-max-num-seqs", "error",
         f"the AEON drafter on unified memory (the Spark) needs --max-num-seqs <= "
         f"{AEON_MAX_NUM_SEQS} (vLLM's default is larger: it picks one by device)",
         f"use a profile with max-num-seqs: {AEON_MAX_NUM_SEQS} for AEON drafter cells",
         hardware=UNIFIED, methods=("dflash",), facts=("serve_args",)),
    Rule("tool-call-probe", "warning",
         "smoke forces one tool call in the format of the profile's tool parser and checks "
         "vLLM parses it back; for a parser it has no text for, the image's tool calls go "
         "untested (smoke says so instead of failing)",
         "use a parser smoke covers, or add its text to imagebuild/smoke/probes.py "
         "TOOL_CALL_TEXT", facts=("serve_args",)),
    Rule("no-pip-install-in-image", "error",
         "a pip install into a built image changes what was tested and is lost on restart; "
         "rebuild instead",
         "remove the pip install; pin the package in the engine's requirements and rebuild"),
)
BY_ID = {r.id: r for r in RULES}


def _force_marlin(r: Rule, v: CellView) -> list[Finding]:
    key = "VLLM_TEST_FORCE_FP8_MARLIN"
    if key in v.env and v.env[key].strip().lower() not in ("", "0", "false", "no", "off"):
        return [r.finding(v.label, f"env {key}={v.env[key]} forces the Marlin MoE kernels",
                          where=v.where(env=key))]
    return []


def _batched_tokens(r: Rule, v: CellView) -> list[Finding]:
    raw = v.flag("max-num-batched-tokens")
    n = as_int(raw)
    if raw is not None and n is None:
        return [r.finding(v.label, f"--max-num-batched-tokens {raw!r} is not an integer",
                          where=v.where("max-num-batched-tokens"))]
    if n is not None and n > MAX_BATCHED_TOKENS:
        return [r.finding(v.label, f"--max-num-batched-tokens {n} > {MAX_BATCHED_TOKENS}",
                          where=v.where("max-num-batched-tokens"))]
    return []


def _gpu_mem(r: Rule, v: CellView) -> list[Finding]:
    spelt, raw = v.spelling("gpu-memory-utilization")
    where = v.where("gpu-memory-utilization")
    if raw is None:
        default = v.default("gpu-memory-utilization")
        if not isinstance(default, int | float):
            return []  # no recorded default: vllmfacts.py says the facts are missing
        if default > MAX_GPU_MEM_UTIL:
            return [r.finding(v.label, f"unset, so vLLM's default {default} (from "
                                         f"{v.facts.said if v.facts else ''}) > "
                                         f"{MAX_GPU_MEM_UTIL} on unified memory", where=where)]
        return []
    value = as_float(raw)
    if value is None:
        return [r.finding(v.label, f"--{spelt} {raw!r} is not a number", where=where)]
    if value > MAX_GPU_MEM_UTIL:
        return [r.finding(v.label, f"--{spelt} {value} > {MAX_GPU_MEM_UTIL} on unified memory",
                          where=where)]
    return []


def observed_on(versions: str, version: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(versions)
    except InvalidVersion:
        return False


def _mamba_block(r: Rule, v: CellView) -> list[Finding]:
    if v.flag("mamba-block-size") is None:
        return []
    if observed_on(MAMBA_BLOCK_SIZE_OBSERVED, v.version):
        return [r.finding(v.label, f"--mamba-block-size is set on vLLM {v.version}",
                          where=v.where("mamba-block-size"))]
    # never another version's answer: the trap may or may not be there
    return [r.finding(v.label, f"--mamba-block-size is set on vLLM {v.version}; it broke GDN "
                                 f"models on vLLM {MAMBA_BLOCK_SIZE_OBSERVED}, and whether it "
                                 f"still does on {v.version} is unknown (not observed)",
                      where=v.where("mamba-block-size"), severity="warning",
                      fix="verify with a smoke boot of this cell, or remove mamba-block-size")]


def _kv_dtype(r: Rule, v: CellView) -> list[Finding]:
    raw = v.flag("kv-cache-dtype")
    if raw is not None and str(raw).lower() != "auto":
        return [r.finding(v.label, f"--kv-cache-dtype {raw} with DFlash speculative decoding",
                          where=v.where("kv-cache-dtype"))]
    return []


def _spec_backend(r: Rule, v: CellView) -> list[Finding]:
    if "attention_backend" in v.spec:
        return [r.finding(v.label, f"--speculative-config sets attention_backend="
                                     f"{v.spec['attention_backend']}",
                          where=v.where("speculative-config"))]
    return []


def _spec_tokens(r: Rule, v: CellView) -> list[Finding]:
    n = v.spec.get("num_speculative_tokens")
    where = v.lm.located.where(("drafters", v.cell.drafter_name, "num_speculative_tokens"))
    if not isinstance(n, int):
        return [r.finding(v.label, "--speculative-config has no num_speculative_tokens",
                          where=where)]
    if n > DFLASH_SPEC_TOKENS + DFLASH_SPEC_TOKENS_SLACK:
        return [r.finding(v.label, f"num_speculative_tokens {n} wastes draft compute "
                                     f"(~{DFLASH_SPEC_TOKENS} is measured best)", where=where)]
    if n < DFLASH_SPEC_TOKENS - DFLASH_SPEC_TOKENS_SLACK:
        return [r.finding(v.label, f"num_speculative_tokens {n} is below the measured best "
                                     f"(~{DFLASH_SPEC_TOKENS}) for DFlash", where=where,
                          severity="warning")]
    return []


def suggested_limits(v: CellView) -> str:
    """The `multimodal:` to write for this checkpoint: the modalities vLLM takes for its
    architecture (image alone when that cannot be told)."""
    assert v.family is not None
    takes, _ = modalities(v.family, v.facts, v.version)
    shown = [m for m in SUGGESTED_LIMITS if m in (takes or ["image"])]
    return "{" + ", ".join(f"{m}: {SUGGESTED_LIMITS[m]}" for m in shown) + "}"


def _vision(r: Rule, v: CellView) -> list[Finding]:
    assert v.family is not None  # the rule needs the `vision` trait (Rule.model)
    fix = f"set the model's multimodal: {suggested_limits(v)} ({v.family.name})"
    if v.flag("language-model-only") is not None:
        return [r.finding(v.label, "--language-model-only turns the vision tower off",
                          where=v.where("language-model-only"), fix=fix)]
    raw = v.flag("limit-mm-per-prompt")
    if not isinstance(raw, str):
        return [r.finding(v.label, f"no --limit-mm-per-prompt, but the checkpoint "
                                     f"({v.family.name}) has a vision tower",
                          where=v.where("limit-mm-per-prompt"), fix=fix)]
    try:
        limits = json.loads(raw)
    except json.JSONDecodeError:
        limits = None
    if not isinstance(limits, dict):
        return [r.finding(v.label, f"--limit-mm-per-prompt {raw!r} is not a JSON object",
                          where=v.where("limit-mm-per-prompt"), fix=fix)]
    if not isinstance(limits.get("image"), int) or limits["image"] < 1:
        return [r.finding(v.label, f"--limit-mm-per-prompt {raw} allows no images",
                          where=v.where("limit-mm-per-prompt"), fix=fix)]
    return []


def _modalities(r: Rule, v: CellView) -> list[Finding]:
    raw = v.flag("limit-mm-per-prompt")
    if v.family is None or not isinstance(raw, str):
        return []  # metadata unknown (metadata-missing says so) or nothing promised
    try:
        limits = json.loads(raw)
    except json.JSONDecodeError:
        return []  # keep-vision-on / serve-args report the malformed value
    takes, how = modalities(v.family, v.facts, v.version)
    if not isinstance(limits, dict):
        return []
    if takes is None:
        if v.facts is not None and v.facts.modalities is None:  # facts, but not this part
            return [r.finding(v.label, f"cannot check the modalities of --limit-mm-per-prompt: "
                                         f"{how}", where=v.where("limit-mm-per-prompt"),
                              severity="warning", fix=record_fix(v.version))]
        return []  # the answer depends on the config, or no facts at all (vllmfacts.py)
    extra = [m for m in limits if m not in takes and limits[m]]
    if not extra:
        return []
    keep = {m: n for m, n in limits.items() if m in takes}
    fix = ("set the model's multimodal: {" + ", ".join(f"{m}: {n}" for m, n in keep.items())
           + "}" if keep else "remove the model's multimodal limits")
    return [r.finding(v.label, f"--limit-mm-per-prompt names {', '.join(extra)}, but {how}",
                      where=v.where("limit-mm-per-prompt"), fix=fix,
                      severity=None if "image" in extra else "warning")]


def _flash_attn(r: Rule, v: CellView) -> list[Finding]:
    # only the flag: VLLM_ATTENTION_BACKEND is no variable of vLLM 0.23 or 0.32 (their
    # recorded envs; vllmfacts.py reports a profile env var its version does not know)
    raw = v.flag("attention-backend")
    backend = raw if isinstance(raw, str) else None
    if backend is None:
        return [r.finding(v.label, "no --attention-backend: vLLM picks its own for DFlash",
                          where=v.where("attention-backend"))]
    if backend.lower() != "flash_attn":
        return [r.finding(v.label, f"attention backend {backend} with DFlash",
                          where=v.where("attention-backend"))]
    return []


def _aeon_seqs(r: Rule, v: CellView) -> list[Finding]:
    if not (v.cell.drafter_model or "").startswith(AEON_DRAFTER_PREFIX):
        return []
    raw = v.flag("max-num-seqs")
    default = v.default("max-num-seqs")
    n = (default if isinstance(default, int) else None) if raw is None else as_int(raw)
    if raw is None and n is None:
        return [r.finding(v.label, f"--max-num-seqs unset with the AEON drafter, and vLLM "
                                     f"{v.version}'s default is not recorded (vLLM picks one "
                                     f"by device)", where=v.where("max-num-seqs"))]
    if n is None or n > AEON_MAX_NUM_SEQS:
        said = f"unset (vLLM {v.version} default {n})" if raw is None else str(raw)
        return [r.finding(v.label, f"--max-num-seqs {said} with the AEON drafter "
                                     f"(> {AEON_MAX_NUM_SEQS})", where=v.where("max-num-seqs"))]
    return []


def _tool_probe(r: Rule, v: CellView) -> list[Finding]:
    parser = v.flag("tool-call-parser")
    if not (v.cell.profile.tools and v.flag("enable-auto-tool-choice") is True
            and isinstance(parser, str)):
        return []
    regex, why = tool_probe(parser, v.facts)
    return [] if regex is not None else [
        r.finding(v.label, f"--tool-call-parser {parser}: {why}",
                  where=v.where("tool-call-parser"))]


def _pip(r: Rule, v: CellView) -> list[Finding]:
    out = []
    for arg in v.cmd.argv:
        if PIP_INSTALL.search(arg):
            out.append(r.finding(v.label, f"the serve command runs {arg!r}", where=v.where()))
    for key, value in v.env.items():
        if PIP_INSTALL.search(value):
            out.append(r.finding(v.label, f"env {key} runs {value!r}", where=v.where(env=key)))
    return out


CHECKS: dict[str, Callable[[Rule, CellView], list[Finding]]] = {
    "no-force-fp8-marlin": _force_marlin,
    "max-batched-tokens-ceiling": _batched_tokens,
    "gpu-mem-util-unified": _gpu_mem,
    "no-mamba-block-size": _mamba_block,
    "dflash-no-kv-cache-dtype": _kv_dtype,
    "dflash-no-attention-backend-in-spec-config": _spec_backend,
    "dflash-spec-tokens": _spec_tokens,
    "keep-vision-on": _vision,
    "multimodal-modalities": _modalities,
    "attention-backend-flash-attn": _flash_attn,
    "aeon-max-num-seqs": _aeon_seqs,
    "tool-call-probe": _tool_probe,
    "no-pip-install-in-image": _pip,
}
assert set(CHECKS) == set(BY_ID)


def check_cell(v: CellView) -> list[Finding]:
    out: list[Finding] = []
    for rule in RULES:
        if v.applies(rule):
            out += CHECKS[rule.id](rule, v)
    return out
