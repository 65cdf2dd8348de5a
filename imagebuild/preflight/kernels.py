"""The kernels vLLM will pick at load, predicted for every CUDA cell before anything is built
(kernel_select/: vLLM's own selection facts, recorded per version), against the profile's
`expect_backends:` and the known kernel traps; with the switch that makes vLLM choose what
the profile expects.

Per cell: the GPU (compute capability) and what the engine image answers to vLLM's probes
(kernel_select/image.py: the arch list it compiles, FlashInfer installed), the checkpoint's
layers (its locked config.json / hf_quant_config.json; while not locked, every layout its
declared `quantization` can have, kernel_select/assumed.py), the serve flags and the
environment. One info line prints the prediction; errors:
- kernels-expected: vLLM would not choose what expect_backends names (smoke would fail at
  the first boot), with the switch that fixes it;
- kernels-boot-fails: a selecting function raises (the boot ends there), vLLM's message;
- flashinfer-moe-sm121: vLLM would run a FlashInfer fused MoE on sm_121: FlashInfer 0.6.12
  fused_moe/core.py 237-248 builds its module from the device's own capability ("121" ->
  gen_cutlass_fused_moe_sm120_module, flashinfer/jit/fused_moe.py 58-73, 764-766 and
  941-942), sm_120 code that gives garbage on sm_121a (flashinfer#3294).
For a checkpoint not locked yet, an expectation some layout would not meet, or a layout
whose boot would fail, is a warning naming the layout; an error when no layout meets it.

Also here, unchanged in what they refuse:
- nvfp4-gemm-asserted: an NVFP4 checkpoint whose GEMM vLLM selects (not pinned) on a
  native-FP4 GPU must state expect_backends.nvfp4_gemm, so smoke asserts the kernel: the
  choice follows the version's list (vLLM 0.23.0: FlashInferCutlassNvFp4LinearKernel first,
  kernels/linear/__init__.py 391-403; upstream vllm#53014, merged 2026-08-31 and in no
  release up to v0.28.1rc0, put a weight-only CuTe-DSL W4A16 kernel second, reported on
  GB10 as vllm#55397 and reordered by vllm#55170);
- triton-ptxas-sm121a: Triton's bundled ptxas rejects sm_121a (vllm#29469).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace

from imagebuild.errors import UserError
from imagebuild.facts import locked_dir, record_command
from imagebuild.lock.lockfile import read_lock
from imagebuild.preflight.checkpoint import Checkpoint
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView, flag_value
from imagebuild.preflight.kernel_select import assumed, image
from imagebuild.preflight.kernel_select.deploy import deployment
from imagebuild.preflight.kernel_select.facts import Facts, NotRecorded, VllmRaises
from imagebuild.preflight.kernel_select.facts import load as load_facts
from imagebuild.preflight.kernel_select.fixes import Switch, search
from imagebuild.preflight.kernel_select.predict import Decision, predict
from imagebuild.spec.servecmd import serve_command
from imagebuild.spec.values import in_range

SM121 = "sm_121"
# the vLLM versions whose selection procedure the predictor composes (predict.py, checked
# against vLLM's own selection functions by tests/e2e/test_kernel_select_vs_vllm.py)
COMPOSED_FROM = ">=0.23,<0.24"
FLASHINFER_MOE_ENV = ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_USE_FLASHINFER_MOE_FP16",
                      "VLLM_USE_FLASHINFER_MOE_FP8")
TRITON_ENV = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")
# expect_backends kinds and the decision each names
EXPECTED = {"nvfp4_gemm": "nvfp4_gemm", "moe": "moe", "attention": "attention",
            "sampler": "sampler", "drafter_moe": "drafter_moe",
            "drafter_attention": "drafter_attention"}
SHOWN = ("nvfp4_gemm", "fp8_gemm", "moe", "attention", "sampler", "drafter_moe",
         "drafter_attention")
# serve flags and speculative-config keys a kernel choice reads (deploy.ENGINE_FIELDS)
FLAGS = {"quantization": "quantization", "moe-backend": "moe_backend",
         "linear-backend": "linear_backend", "attention-backend": "attention_backend",
         "kv-cache-dtype": "kv_cache_dtype", "block-size": "block_size",
         "tensor-parallel-size": "tensor_parallel_size",
         "enable-expert-parallel": "enable_expert_parallel", "enable-lora": "enable_lora",
         "logprobs-mode": "logprobs_mode"}

RULES = (
    Rule("kernels-expected", "error",
         "vLLM picks its kernels in code the engine pins: an expectation its own choice on "
         "this GPU would not meet fails smoke at the first boot (or ships the kernel the "
         "profile was written to avoid)",
         "set the switch named here in the profile, or expect what vLLM picks",
         hardware=("cuda",), facts=("kernel_select",)),
    Rule("kernels-boot-fails", "error",
         "a kernel choice vLLM refuses raises while the model is built: the boot ends "
         "there, minutes in",
         "change the switch named here", hardware=("cuda",), waivable=False,
         facts=("kernel_select",)),
    Rule("kernels-unpredictable", "warning",
         "no recorded kernel-selection facts cover this cell, or the version selects its "
         "kernels in a way the predictor does not compose, so what vLLM will pick is not "
         "checked before a boot",
         f"record them: {record_command()}",
         hardware=("cuda",), facts=("kernel_select",)),
    Rule("kernels-predicted", "info", "the kernels vLLM will pick, printed for review", "",
         hardware=("cuda",), facts=("kernel_select",)),
    Rule("architecture-matches-checkpoint", "error",
         "a model's declared architecture is what its kernels were predicted for before the "
         "lock had its config.json; a different one means the prediction was for another "
         "model", "set `architecture` to the locked config.json's architectures[0]"),
    Rule("flashinfer-moe-sm121", "error",
         "FlashInfer's fused MoE builds its sm_120 module on sm_121 (0.6.12 fused_moe/"
         "core.py 237-248) and gives garbage on 12.1a (flashinfer#3294)",
         "keep FlashInfer's MoE off (env VLLM_USE_FLASHINFER_MOE_FP4: \"0\" and "
         "VLLM_USE_FLASHINFER_MOE_FP16: \"0\", or a --moe-backend that is not flashinfer_*) "
         "and expect a non-FlashInfer moe", hardware=(SM121,), facts=("kernel_select",)),
    Rule("nvfp4-gemm-asserted", "error",
         "the NVFP4 GEMM kernel vLLM selects follows its version's candidate list and the "
         "image (vLLM 0.23.0 on SM12x: FlashInferCutlassNvFp4LinearKernel first; "
         "vllm#53014, after 0.23.0, added a slower weight-only CuTe-DSL kernel, "
         "vllm#55397): a release can serve on another kernel than the one benchmarked",
         "state expect_backends: {nvfp4_gemm: ...} in the profile so smoke fails when the "
         "boot chooses another kernel", hardware=("native-fp4",), facts=("kernel_select",)),
    Rule("triton-ptxas-sm121a", "error",
         "Triton's bundled ptxas rejects sm_121a (vllm#29469): every Triton kernel fails "
         "at its first launch unless TRITON_PTXAS_PATH names the CUDA toolkit's ptxas",
         "keep TRITON_PTXAS_PATH and TRITON_PTXAS_BLACKWELL_PATH in the engine's runtime "
         "stage (checked by runtime-selfcheck.py triton-ptxas) and out of the profile's env",
         hardware=(SM121,), waivable=False),
)
BY_ID = {r.id: r for r in RULES}


def normal(name: str | None) -> str:
    return (name or "").strip().upper().replace("-", "_")


def is_flashinfer_moe(decision: Decision) -> bool:
    return decision.kind in ("moe", "drafter_moe") and normal(decision.name).startswith(
        "FLASHINFER")


# --- one cell's deployments ---------------------------------------------------------------

@dataclass
class Layout:
    label: str  # "locked" or the assumed layout's name
    config: dict
    files: dict
    drafter_config: dict | None


@dataclass
class Outcome:
    layout: Layout
    decisions: dict[str, Decision] | None = None
    refused: tuple[str, str] | None = None  # vLLM refuses the checkpoint itself
    unknown: str | None = None
    problems: list[str] = field(default_factory=list)  # unmet, raising, trapped

    @property
    def failed(self) -> int:
        return len(self.problems)


def _engine(argv: tuple[str, ...], spec: dict) -> dict:
    engine: dict = {}
    for flag, key in FLAGS.items():
        value = flag_value(argv, flag)
        if value is None:
            continue
        engine[key] = int(value) if key in ("block_size", "tensor_parallel_size") else value
    if spec:
        engine["speculative_config"] = dict(spec)
    return engine


def _assumed_drafter(facts: Facts, arch: str, method: str) -> tuple[dict | None, str]:
    """A drafter model not locked yet: the class vLLM built for the method on the recorded
    archetype (its recorded head size)."""
    darch = (facts["archetypes"].get(arch) or {}).get("drafters", {}).get(method)
    if darch is None:
        return None, ""
    head = ((facts["archetypes"].get(darch) or {}).get("attention") or {}).get("head_size")
    return {"architectures": [darch], "head_dim": head}, f", drafter assumed {darch}"


def layouts(facts: Facts, model: Checkpoint | None, drafter: Checkpoint | None,
            quantization: str | None, method: str, declared: str | None) -> list[Layout]:
    """The locked checkpoint, or while it is not locked every layout of its declared
    `quantization` on its declared `architecture` ([] without one: nothing to assume)."""
    dconf = drafter.config if drafter is not None else None
    model_drafter = method in ("dflash", "eagle", "eagle3")
    if model is not None and model.config is not None:
        files = {"hf_quant_config.json": model.hf_quant} if model.hf_quant else {}
        arch = (model.config.get("architectures") or [""])[0]
        label = "locked"
        if model_drafter and dconf is None:
            dconf, note = _assumed_drafter(facts, arch, method)
            label += note
        return [Layout(label, model.config, files, dconf)]
    entry = facts["archetypes"].get(declared or "")
    if declared is None or entry is None:
        return []
    head = (entry.get("attention") or {}).get("head_size")
    base = {"architectures": [declared], "text_config": {"head_dim": head}}
    dc, note = (dconf, "") if dconf is not None or not model_drafter else \
        _assumed_drafter(facts, declared, method)
    return [Layout(f"assumed {name}{note}", assumed.with_layout(base, layout), {}, dc)
            for name, layout in assumed.layouts(quantization).items()]


# how much each kind of problem weighs when switches are compared (fixes.search): a
# layout served wrong outweighs everything, a boot that fails outweighs wrong output,
# which outweighs an unmet expectation
WEIGHT = {"layout": 1000, "raises": 100, "refused": 100, "trap": 50, "weak": 50,
          "expected": 1}


def weak_gemm(d: Decision) -> bool:
    """A weight-only (W4A16) NVFP4 layer on a kernel that quantizes activations: vLLM
    forces Marlin for it only while --linear-backend is auto (kernels/linear/__init__.py
    891-895); compressed-tensors' W4A16 scheme registers no input scale for another kernel
    (schemes/compressed_tensors_w4a4_nvfp4.py 83-88), and ModelOpt's W4A16 method pins
    Marlin because the first W4A4 candidate "would silently try to quantize activations"
    (quantization/modelopt.py 1263-1269)."""
    return (d.kind.endswith("nvfp4_gemm") and d.scheme in ("w4a16", "w4a16_pinned")
            and d.kernel not in (None, "MarlinNvFp4LinearKernel"))


def _problems(v: CellView, decisions: dict[str, Decision], expect: dict[str, str]) -> list[str]:
    out = []
    for kind, wanted in expect.items():
        d = decisions[EXPECTED[kind]]
        if d.error or d.unknown:
            continue  # said below
        if normal(d.name) != normal(wanted):
            out.append(f"expected:{kind}:{wanted}:{d.name or 'nothing'}")
    for kind in SHOWN:
        d = decisions[kind]
        if d.error:
            out.append(f"raises:{kind}")
        if SM121 in v.hardware and is_flashinfer_moe(d):
            out.append(f"trap:{kind}")
        if weak_gemm(d):
            out.append(f"weak:{kind}")
    return out


class CellPrediction:
    """Every layout of one cell, predicted with the profile's switches and with others."""

    def __init__(self, v: CellView, facts: Facts, model: Checkpoint | None,
                 drafter: Checkpoint | None):
        self.v, self.facts = v, facts
        target = v.cell.target
        arch_list = target.build_args.get("TORCH_CUDA_ARCH_LIST", "")
        self.cc = str(target.compute_capability)
        self.probes = image.probes(self.cc, arch_list, image.cuda_of(target.base_image))
        eb = v.cell.profile.expect_backends
        self.expect = {k: str(val) for k, val in (eb.model_dump() if eb else {}).items()
                       if val is not None and k in EXPECTED}
        if v.method in ("none",):
            self.expect = {k: val for k, val in self.expect.items()
                           if not k.startswith("drafter_")}
        self.layouts = layouts(facts, model, drafter, v.cell.model.quantization, v.method,
                               v.cell.model.architecture)

    def run(self, switches: tuple[Switch, ...] = ()) -> list[Outcome]:
        env = dict(self.v.env)
        argv = list(self.v.cmd.argv)
        spec = copy.deepcopy(self.v.spec)
        for sw in switches:
            if sw.where == "env":
                if sw.value is None:
                    env.pop(sw.name, None)
                else:
                    env[sw.name] = sw.value
            elif sw.where == "arg":
                argv = _set_flag(argv, sw.name, sw.value)
            elif spec:
                if sw.value is None:
                    spec.pop(sw.name, None)
                else:
                    spec[sw.name] = sw.value
        engine = _engine(tuple(argv), spec)
        out = []
        for layout in self.layouts:
            o = Outcome(layout)
            try:
                dep = deployment(self.facts, cc=self.cc, probes=self.probes,
                                 config=layout.config, files=layout.files, engine=engine,
                                 env=env, drafter_config=layout.drafter_config)
            except VllmRaises as exc:
                o.refused = (exc.kind, exc.message)
                o.problems.append("refused")
            except NotRecorded as exc:
                o.unknown = str(exc)
            else:
                o.decisions = predict(self.facts, dep)
                o.problems = _problems(self.v, o.decisions, self.expect)
            out.append(o)
        return out

    def score(self, switches: tuple[Switch, ...]) -> int:
        """Layouts the cell does not serve right with these switches, then their problems
        by weight (WEIGHT)."""
        outcomes = [o for o in self.run(switches) if not o.unknown]
        return sum(WEIGHT["layout"] for o in outcomes if o.failed) + sum(
            WEIGHT.get(p.split(":")[0], WEIGHT["trap"]) for o in outcomes for p in o.problems)


def _set_flag(argv: list[str], name: str, value: str | None) -> list[str]:
    out, skip = [], False
    key = f"--{name}"
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == key:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and not nxt.startswith("--")
            continue
        if arg.startswith(key + "="):
            continue
        out.append(arg)
    if value is not None:
        out += [key, value]
    return out


# --- the findings ---------------------------------------------------------------------------

def _shown(d: Decision) -> str:
    if d.error:
        return f"raises {d.error[0]}"
    if d.unknown:
        return "?"
    if d.name and not d.log and d.kind.endswith("nvfp4_gemm"):
        return f"{d.name} (pinned, not logged)"
    return d.name or "-"


def summary(decisions: dict[str, Decision]) -> str:
    return ", ".join(f"{k} {_shown(decisions[k])}" for k in SHOWN
                     if decisions[k].name or decisions[k].error or decisions[k].unknown)


def _line(d: Decision) -> str:
    main = [line for line in d.log if line.startswith(("Using", "Selected"))]
    return f" (vLLM logs: \"{main[0]}\")" if main else ""


def _fix_text(found: list[list[Switch]]) -> str | None:
    if not found:
        return None
    parts = []
    for chosen, *alike in found:
        parts.append(chosen.text() + (f" (or {' / '.join(a.text() for a in alike)})"
                                      if alike else ""))
    return "in the profile: " + "; ".join(parts)


def cell_facts(v: CellView) -> Facts | None:
    """The kernel-selection facts of the cell's vLLM version (shipped or the matrix's)."""
    return load_facts(v.version, [locked_dir(v.lm.root)])


def unpredictable(version: str) -> str | None:
    """Why the predictor cannot compose `version`'s recorded facts, or None: the selection
    procedure it composes (candidate order, switches, gates) was read from vLLM
    COMPOSED_FROM's code and checked against its selection functions there; vLLM 0.32
    selects differently (no VLLM_NVFP4_GEMM_BACKEND table, a W4A16 path of its own, MoE
    oracles as classes), so its recorded facts are shown, not composed."""
    if in_range(version, COMPOSED_FROM):
        return None
    return (f"the kernel predictor composes the selection procedure of vLLM {COMPOSED_FROM} "
            f"(read from its code); vLLM {version} selects in other steps, so its recorded "
            "kernel-selection facts are not composed into a prediction")


def predicted(v: CellView, model: Checkpoint | None,
              drafter: Checkpoint | None) -> list[Finding]:
    version = v.cell.engine.vllm_version
    facts = cell_facts(v)
    if facts is None:
        if v.facts is None:
            return []  # no facts at all: vllm-facts-missing says so
        return [BY_ID["kernels-unpredictable"].finding(
            v.label, v.facts.missing("kernel_select"), fix=f"record them: "
            f"{record_command(version)}")]
    why = unpredictable(version)
    if why is not None:
        return [BY_ID["kernels-unpredictable"].finding(
            v.label, why, fix="check the kernels with a real boot (smoke's expect_backends)")]
    cell = CellPrediction(v, facts, model, drafter)
    where_eb = v.lm.located.where(("profiles", v.cell.profile_name))
    declared = v.cell.model.architecture
    if not cell.layouts:
        why = (f"its architecture {declared} has no recorded layers in vLLM {version}'s "
               "facts" if declared else "its checkpoint is not locked and the model declares "
               "no `architecture`")
        return [BY_ID["kernels-unpredictable"].finding(
            v.label, f"vLLM {version}'s kernel choices are not predicted: {why}",
            fix=("declare the model's `architecture` (config.json architectures[0]) or lock "
                 "its metadata" if not declared else BY_ID["kernels-unpredictable"].fix),
            where=v.lm.located.where(("models", v.cell.model_name)))]
    outcomes = cell.run()
    known = [o for o in outcomes if not o.unknown]
    if not known:
        reasons = sorted({o.unknown or "" for o in outcomes})
        return [BY_ID["kernels-unpredictable"].finding(
            v.label, f"vLLM {version}'s kernel choices cannot be predicted here: "
                     + "; ".join(reasons))]
    locked = all(o.layout.label.startswith("locked") for o in outcomes)
    gpu = f"sm_{cell.cc.replace('.', '')}"
    out: list[Finding] = []
    for o in known:
        label = f" [{o.layout.label}]" if not locked or "assumed" in o.layout.label else ""
        if o.refused is None:
            assert o.decisions is not None
            out.append(BY_ID["kernels-predicted"].finding(
                v.label, f"vLLM {version} on {gpu}{label}: {summary(o.decisions)}", fix=""))
    fix = _fix_text(search(facts, cell.score, drafter=v.method not in ("none", "ngram"),
                           present_env=list(v.env), present_args=list(v.cell.profile.args))
                    ) if any(o.failed for o in known) else None
    good = [o for o in known if not o.failed]
    # an unlocked checkpoint fails the cell only when no layout is served right; the
    # others are warnings naming the layout (the locked one decides); a trap is silent
    # garbage output, an error on any layout
    severity = "error" if locked or not good else "warning"
    grouped: dict[tuple[str, str], list[str]] = {}
    for o in known:
        where = o.layout.label.removeprefix("assumed ")
        if o.refused:
            grouped.setdefault(("kernels-boot-fails", f"vLLM {version} refuses the "
                                f"checkpoint: {o.refused[0]}: {o.refused[1]}"), []).append(where)
            continue
        assert o.decisions is not None
        for p in o.problems:
            what, kind = p.split(":")[:2]
            d = o.decisions[EXPECTED.get(kind, kind)]
            if what == "expected":
                msg = (f"expect_backends.{kind} is {p.split(':')[2]}, but vLLM {version} picks "
                       f"{d.name or 'no ' + kind + ' kernel'}{_line(d)}")
                grouped.setdefault(("kernels-expected", msg), []).append(where)
            elif what == "raises":
                assert d.error is not None
                msg = f"vLLM {version} raises while choosing {kind}: {d.error[0]}: {d.error[1]}"
                grouped.setdefault(("kernels-boot-fails", msg), []).append(where)
            elif what == "weak":
                msg = (f"vLLM {version} would run the weight-only NVFP4 layers on {d.kernel}, "
                       "a kernel that quantizes activations (vLLM forces Marlin for them only "
                       "while --linear-backend is auto)")
                grouped.setdefault(("kernels-boot-fails", msg), []).append(where)
            elif what == "trap":
                whose = "the drafter" if kind.startswith("drafter") else "the target"
                msg = (f"vLLM {version} would run FlashInfer's fused MoE ({d.name}) for {whose} "
                       f"on sm_121{_line(d)}")
                grouped.setdefault(("flashinfer-moe-sm121", msg), []).append(where)
    better = _better_profiles(v, facts, model, drafter, [o for o in known if o.failed])
    for (rule, msg), wheres in grouped.items():
        r = BY_ID[rule]
        elsewhere = sorted({p for w in wheres for p in better.get(w, [])})
        sev = "error" if rule == "flashinfer-moe-sm121" else severity
        scope = "" if locked and not any("assumed" in w for w in wheres) else (
            " (checkpoint not locked: " + "; ".join(wheres) + ")" if not locked
            else " (" + "; ".join(wheres) + ")")
        hint = fix or r.fix
        if elsewhere and rule == "kernels-expected":
            hint = (f"serve it with profile {' or '.join(elsewhere)} (what vLLM picks there "
                    "is what it expects)" + (f"; or {fix}" if fix else ""))
        out.append(r.finding(v.label, msg + scope, fix=hint, where=where_eb, severity=sev))
    unknown = [o for o in outcomes if o.unknown]
    if unknown:
        out.append(BY_ID["kernels-unpredictable"].finding(
            v.label, "; ".join(sorted({f"{o.layout.label}: {o.unknown}" for o in unknown}))))
    return out


def _better_profiles(v: CellView, facts: Facts, model: Checkpoint | None,
                     drafter: Checkpoint | None, failed: list[Outcome]) -> dict[str, list[str]]:
    """For each failing layout, the other profiles of the matrix (same target, serving the
    cell's method) under which vLLM's choices meet every expectation."""

    if not failed:
        return {}
    cell = v.cell
    out: dict[str, list[str]] = {}
    for name, prof in v.lm.matrix.profiles.items():
        if name == cell.profile_name or prof.target not in (None, cell.target_name):
            continue
        if prof.methods is not None and cell.method not in prof.methods:
            continue
        try:
            other = dc_replace(cell, profile=prof.on_engine(cell.engine_name,
                                                            cell.engine.vllm_version),
                               profile_name=name)
            ov = CellView(lm=v.lm, cell=other, cmd=serve_command(other), family=v.family,
                          label=v.label)
            trial = CellPrediction(ov, facts, model, drafter)
        except Exception:  # a profile this cell cannot take (its own checks say why)
            continue
        if not trial.expect:
            continue
        for o in trial.run():
            if not o.failed and not o.unknown and any(
                    f.layout.label == o.layout.label for f in failed):
                out.setdefault(o.layout.label.removeprefix("assumed "), []).append(name)
    return out


def _flag_for(kind: str) -> str | None:
    return {"moe": "moe-backend", "drafter_moe": "speculative-config",
            "attention": "attention-backend", "drafter_attention": "speculative-config",
            "nvfp4_gemm": "linear-backend"}.get(kind)


def _static(v: CellView, model: Checkpoint | None) -> list[Finding]:
    """The profile's own FlashInfer MoE choices on sm_121 (not a prediction: what it says)."""
    out: list[Finding] = []
    r = BY_ID["flashinfer-moe-sm121"]
    if not v.applies(r):
        return out
    eb = v.cell.profile.expect_backends
    where_eb = v.lm.located.where(("profiles", v.cell.profile_name))
    for kind in ("moe", "drafter_moe"):
        wanted = getattr(eb, kind, None) if eb else None
        if wanted and normal(wanted).startswith("FLASHINFER"):
            out.append(r.finding(v.label, f"the profile expects {kind} backend {wanted} on "
                                          "sm_121", where=where_eb))
    switched = [e for e in FLASHINFER_MOE_ENV if v.env.get(e, "0") not in ("0", "")]
    if switched:
        out.append(r.finding(v.label, f"the profile sets {', '.join(switched)}: FlashInfer "
                                      "fused MoE on sm_121", where=v.where(env=switched[0])))
    flag = v.flag("moe-backend")
    if isinstance(flag, str) and flag.lower().startswith("flashinfer"):
        out.append(r.finding(v.label, f"--moe-backend {flag} on sm_121",
                             where=v.where("moe-backend")))
    spec_backend = str(v.spec.get("moe_backend") or "")
    if spec_backend.lower().startswith("flashinfer"):
        out.append(r.finding(v.label, f"the drafter's moe_backend {spec_backend} on sm_121",
                             where=v.where("speculative-config")))
    if model is not None and model.config is not None and _nvfp4_moe(model) and not (
            eb and eb.moe):
        out.append(r.finding(v.label, "an NVFP4 MoE checkpoint on sm_121 without "
                                      "expect_backends.moe: smoke would not assert vLLM's "
                                      "choice", where=where_eb))
    return out


def _quant_text(cp: Checkpoint) -> str:
    q = (cp.config or {}).get("quantization_config") or {}
    return json.dumps([q, cp.hf_quant or {}]).lower()


def _nvfp4_moe(cp: Checkpoint) -> bool:
    cfg = cp.config or {}
    text_config = cfg.get("text_config")
    text: dict = text_config if isinstance(text_config, dict) else cfg
    moe = any(k in text for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    return moe and "nvfp4" in _quant_text(cp)


def _gemm_asserted(v: CellView, outcomes_of: Callable[[], list[Outcome]]) -> list[Finding]:
    r = BY_ID["nvfp4-gemm-asserted"]
    eb = v.cell.profile.expect_backends
    if not v.applies(r) or (eb and eb.nvfp4_gemm):
        return []
    decided = [o for o in outcomes_of() if o.decisions is not None]
    selecting = [o for o in decided if o.decisions and o.decisions["nvfp4_gemm"].log]
    if decided and len(selecting) == len(decided):
        return [r.finding(v.label, f"an NVFP4 checkpoint whose GEMM vLLM "
                                   f"{v.cell.engine.vllm_version} selects at load "
                                   "(it logs the choice) and no expect_backends.nvfp4_gemm",
                          where=v.lm.located.where(("profiles", v.cell.profile_name)))]
    return []


def _declared(v: CellView, model: Checkpoint | None) -> list[Finding]:
    """The declared architecture against the locked config.json's."""
    declared = v.cell.model.architecture
    if declared is None or model is None or model.config is None:
        return []
    real = (model.config.get("architectures") or [None])[0]
    if real == declared:
        return []
    return [BY_ID["architecture-matches-checkpoint"].finding(
        v.label, f"the model declares architecture {declared}, its locked config.json "
                 f"names {real}", where=v.lm.located.where(
                     ("models", v.cell.model_name, "architecture")))]


def check_cell(v: CellView, model: Checkpoint | None,
               drafter: Checkpoint | None = None) -> list[Finding]:
    out: list[Finding] = _declared(v, model)
    if "cuda" in v.hardware and v.cell.target.compute_capability:
        out += _static(v, model)
        out += predicted(v, model, drafter)
        facts = cell_facts(v)
        if facts is not None and unpredictable(v.version) is None:
            out += _gemm_asserted(v, lambda: CellPrediction(v, facts, model, drafter).run())
    r = BY_ID["triton-ptxas-sm121a"]
    if v.applies(r):
        out += _triton_ptxas(v, r)
    return _dedupe(out)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        key = (f.rule, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _triton_ptxas(v: CellView, r: Rule) -> list[Finding]:
    from imagebuild.rehearse.runtime_stage import (  # deferred: only this rule renders
        read_runtime_stage,
    )
    from imagebuild.render import (  # deferred: only this rule renders
        render_engine,
    )

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
