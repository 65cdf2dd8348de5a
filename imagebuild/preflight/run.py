"""`build.py check`: every preflight rule over the selected cells, as a list of findings.

Order of work per cell: its resolved serve command (servecmd), its model's and drafter's
locked metadata (checkpoint.MetadataStore), then the flag, checkpoint and KV-cache rules;
then the memory rule (preflight/memory.py); across cells: pins, the engines' patch series
(preflight/patchset.py), their requirement sets (reqset.py) and served-name
collisions; last, the families' waivers.
"""

from __future__ import annotations

from pathlib import Path

from imagebuild.errors import UserError
from imagebuild.lock.lockfile import Lock
from imagebuild.preflight import (
    caveats,
    checkpoint,
    flags,
    kernels,
    memory,
    multinode,
    patchset,
    pins,
    reqset,
    serve_args,
    vllmfacts,
)
from imagebuild.preflight.findings import (
    MATRIX,
    SEVERITY_ORDER,
    Finding,
    Rule,
    format_json,
    format_table,
    registry,
    waive,
)
from imagebuild.preflight.flags import CellView, as_int, flag_values
from imagebuild.preflight.kvcache import CannotPredict, KVFlags, KVModel, KVPrediction, predict
from imagebuild.spec.matrix import Cell, LoadedMatrix
from imagebuild.spec.servecmd import serve_command

KV_RULES = (
    Rule("kv-page-unify", "error",
         "vLLM keeps every layer's cache in pages of one size; a page its "
         "unify_kv_cache_spec_page_size cannot bring to the largest (0.23: a drafter page "
         "larger than a hybrid target's fixed recurrent-state page) fails at engine start, "
         "ten minutes into a boot (and the block-size checks around it fail as late)",
         "pin a drafter revision whose KV bytes per token do not exceed the target's and "
         "divide it, or use a vLLM (or patch set) whose unification pads the state page",
         facts=("kv",)),
    Rule("kv-page-padding", "warning",
         "vLLM's unification (0.32 stock, the dflashfix patch on 0.23) serves an oversized "
         "page by padding the smaller ones to it, which costs cache memory per request",
         "pin a drafter revision whose KV bytes per token do not exceed the target's",
         facts=("kv",)),
    Rule("kv-layout", "info", "the KV page layout vLLM will choose, printed for review", "",
    facts=("kv",)),
)
WAIVER_RULES = (
    Rule("waiver-invalid", "error",
         "a waiver must name an existing, waivable rule",
         "correct the rule id under the family's waivers (see `check --format json` rules)",
         waivable=False),
    Rule("waiver-unused", "warning",
         "a waiver that waives nothing would silently license the trap coming back",
         "remove the waiver", waivable=False),
)
RULES: dict[str, Rule] = registry(flags.RULES, checkpoint.RULES, pins.RULES, KV_RULES,
                                  WAIVER_RULES, serve_args.RULES, caveats.RULES, kernels.RULES,
                                  multinode.RULES, memory.RULES, vllmfacts.RULES,
                                  patchset.RULES, reqset.RULES)


def kv_flags(v: CellView) -> KVFlags:
    """The serve flags that shape the KV cache, read from the resolved command line."""
    argv = v.cmd.argv

    def text(name: str, default: str | None) -> str | None:
        value = v.flag(name)
        return value if isinstance(value, str) else default

    def switch(name: str) -> bool | None:
        """--name / --no-name; None when neither is given (vLLM decides)."""
        if v.flag(f"no-{name}") is not None:
            return False
        value = v.flag(name)
        if value is None:
            return None
        return value is True or str(value).lower() not in ("false", "0")

    method = None if v.method == "none" else v.method
    # the flag only: VLLM_ATTENTION_BACKEND is no variable of vLLM 0.23 or 0.32 (envs.py)
    backend = text("attention-backend", None)
    tp = as_int(v.flag("tensor-parallel-size")) or 1
    gpu = bool(v.cell.target.gpu)
    return KVFlags(
        vllm_version=v.version,
        tensor_parallel_size=tp,
        kv_cache_dtype=text("kv-cache-dtype", "auto") or "auto",
        mamba_cache_dtype=text("mamba-cache-dtype", "auto") or "auto",
        mamba_ssm_cache_dtype=text("mamba-ssm-cache-dtype", "auto") or "auto",
        block_size=as_int(v.flag("block-size")),
        num_speculative_tokens=int(v.spec.get("num_speculative_tokens") or 0) if method else 0,
        speculative_method=method,
        attention_backend=backend.lower() if backend else None,
        model_dtype=text("dtype", None),
        # CUDA platforms start attention blocks at 16 tokens, vLLM's CPU platform at 128
        platform="cuda" if gpu else "cpu",
        default_block_size=16 if gpu else 128,
        enable_prefix_caching=switch("enable-prefix-caching"),
        enable_chunked_prefill=switch("enable-chunked-prefill"),
        max_model_len=checkpoint.parse_len(text("max-model-len", "") or ""),
        max_num_batched_tokens=as_int(v.flag("max-num-batched-tokens")),
        # `vllm serve` defaults: 2048 per CPU rank; on CUDA 2048 or 8192 by GPU memory
        default_max_num_batched_tokens=None if gpu else 2048 * tp,
        mamba_block_size=as_int(v.flag("mamba-block-size")),
        mamba_cache_mode=text("mamba-cache-mode", "none") or "none",
        kv_cache_dtype_skip_layers=tuple(flag_values(argv, "kv-cache-dtype-skip-layers")),
        disable_hybrid_kv_cache_manager=bool(switch("disable-hybrid-kv-cache-manager")),
    )


def patch_files(v: CellView) -> list[Path]:
    return [v.lm.root / "patches" / name for name in v.cell.realization.patches]


def kv_model(v: CellView) -> KVModel:
    """The KV model of the cell's vLLM version with its engine's patches (CannotPredict:
    no facts, or patches changing unification whose behaviour was not recorded)."""
    return KVModel.of(v.facts, v.version, patch_files(v))


def kv_findings(v: CellView, model: checkpoint.Checkpoint,
                drafter: checkpoint.Checkpoint | None) -> list[Finding]:
    if model.config is None:
        return []
    needs_drafter = v.method in ("dflash", "eagle", "eagle3")
    if needs_drafter and (drafter is None or drafter.config is None):
        return []  # metadata-missing already says the KV layout cannot be checked
    if v.facts is None:
        return []  # vllm-facts-missing says the layout is unchecked, and why
    unify, padding, layout = (RULES[r] for r in ("kv-page-unify", "kv-page-padding",
                                                 "kv-layout"))
    try:
        p = predict(model.config, drafter.config if needs_drafter and drafter else None,
                    kv_flags(v), model=kv_model(v), hf_quant_config=model.hf_quant)
    except CannotPredict as exc:
        # never a pass: the layout is unknown, so say so and why
        return [unify.finding(v.label, f"cannot predict the KV layout: {exc.reason}",
                              fix="check the KV layout with a real boot (smoke) before "
                                  "relying on this cell", severity="warning")]
    except UserError as exc:
        unmodelled = "not modelled" in exc.message
        return [unify.finding(v.label, f"cannot predict the KV layout: {exc.message}",
                              fix=exc.fix, severity="warning" if unmodelled else None)]
    where = v.where("speculative-config")
    shape = (f"attention block size {p.attention_block_size}"
             + (f", {p.family} state page {p.mamba_page_bytes} B padded "
                f"{p.mamba_padding_pct:.2f}%" if p.hybrid else ""))
    said = f" ({p.unify_from}'s unification)"
    if not p.ok:
        return [unify.finding(v.label, f"vLLM {v.version} will fail at engine start with "
                                       f"{p.outcome}: {p.cause}{said}",
                              fix=p.fix or unify.fix, where=where)]
    if p.padded_by_unify and p.extra_bytes_per_request:
        mib = p.extra_bytes_per_request / 2**20
        return [padding.finding(v.label, f"{shape}; {p.cause}; {mib:.0f} MiB extra cache "
                                         "per request", fix=p.fix or padding.fix,
                                where=where)]
    return [layout.finding(v.label, f"{shape}; unify ok{said}", fix="")]


def kv_prediction(v: CellView, model: checkpoint.Checkpoint,
                  drafter: checkpoint.Checkpoint | None) -> KVPrediction | None:
    """The cell's KV layout for the memory rule; None when it cannot be predicted (the KV
    rules say why)."""
    needs_drafter = v.method in ("dflash", "eagle", "eagle3")
    if model.config is None or (needs_drafter and (drafter is None or drafter.config is None)):
        return None
    try:
        return predict(model.config, drafter.config if needs_drafter and drafter else None,
                       kv_flags(v), model=kv_model(v), hf_quant_config=model.hf_quant)
    except (CannotPredict, UserError):
        return None


def stamp_facts(findings: list[Finding], views: list[CellView]) -> list[Finding]:
    """Each finding of a rule that reads vLLM facts names the facts it read: the cell's
    version and where they were recorded (or that none were)."""
    from dataclasses import replace

    by_label = {v.label: v for v in views}
    out = []
    for f in findings:
        rule, v = RULES.get(f.rule), by_label.get(f.cell)
        if rule is not None and rule.facts and v is not None and f.facts is None:
            said = (f"facts: vLLM {v.facts.version} ({v.facts.where})" if v.facts is not None
                    else f"facts: none recorded for vLLM {v.version}")
            f = replace(f, facts=said)
        out.append(f)
    return out


def _waivers(lm: LoadedMatrix, cells: list[Cell], findings: list[Finding]
             ) -> tuple[dict[str, dict[str, str]], list[Finding]]:
    by_cell: dict[str, dict[str, str]] = {}
    problems: list[Finding] = []
    fired = {(f.cell, f.rule) for f in findings}
    labelled = list(zip(cells, cell_labels(cells), strict=True))
    for family in dict.fromkeys(c.family for c in cells):
        fam_cells = [label for c, label in labelled if c.family == family]
        waivers = next(c.waivers for c in cells if c.family == family)
        for i, w in enumerate(waivers):
            where = lm.located.where(("images", family, "waivers", i, "rule"))
            rule = RULES.get(w.rule)
            if rule is None or not rule.waivable or rule.severity == "info":
                why = "no such rule" if rule is None else "this rule cannot be waived"
                problems.append(RULES["waiver-invalid"].finding(
                    MATRIX, f"family {family} waives {w.rule!r}: {why}", where=where))
                continue
            for label in fam_cells:
                by_cell.setdefault(label, {})[w.rule] = w.reason
            if not any((label, w.rule) in fired for label in fam_cells):
                problems.append(RULES["waiver-unused"].finding(
                    MATRIX, f"family {family} waives {w.rule} but no checked cell of it "
                            "trips that rule", where=where))
    return by_cell, problems


def cell_labels(cells: list[Cell]) -> list[str]:
    """cell.id names a cell within one engine (one release tag); add @engine otherwise."""
    many = len({c.engine_name for c in cells}) > 1
    return [f"{c.id}@{c.engine_name}" if many else c.id for c in cells]


def run_checks(lm: LoadedMatrix, cells: list[Cell], lock: Lock | None, *,
               building: bool = False) -> list[Finding]:
    """Every finding for `cells`, errors first within each cell (waived ones marked).
    `building`: a release builds these cells (`check --tag`, `build`): unresolved pins
    are errors (preflight/pins.py)."""
    store = checkpoint.MetadataStore(lm.root, lock)
    labels = cell_labels(cells)
    findings: list[Finding] = pins.check(lm, cells, lock, labels, building=building)
    findings += caveats.check(lm, cells, labels)
    views = []
    for cell, label in zip(cells, labels, strict=True):
        model = store.get("models", cell.model_name, cell.model.repository)
        drafter = (store.get("drafters", cell.drafter_name, cell.drafter_model)
                   if cell.drafter_model else None)
        v = CellView(lm=lm, cell=cell, cmd=serve_command(cell),
                     family=checkpoint.model_family(model), label=label)
        views.append(v)
        findings += vllmfacts.check_cell(v, building=building)
        findings += flags.check_cell(v)
        refused = serve_args.check_cell(v)
        findings += refused + checkpoint.check_cell(v, model, drafter)
        findings += kernels.check_cell(v, model, drafter)
        # the KV layout of a command line vLLM would refuse anyway is not worth predicting
        # (it would only repeat the refusal with a vaguer fix)
        split = multinode.check_cell(v, model, drafter, kv_prediction(v, model, drafter)
                                     if cell.profile.parallel else None)
        # (nor the layout of heads the TP cannot split: the model would not even load)
        if not any(f.severity == "error" for f in refused + multinode.unsplittable(split)):
            findings += kv_findings(v, model, drafter)
            findings += memory.check_cell(v, lock, model, drafter,
                                          kv_prediction(v, model, drafter))
        findings += split
    findings += checkpoint.served_name_collisions(views)
    # a release about to be built fetches the pinned source its patches apply to, last and
    # only when nothing offline refused it already: bad input reaches no index
    waivers, problems = _waivers(lm, cells, findings)
    fetch = building and not any(f.blocking for f in waive(findings, waivers, RULES)
                                 + problems)
    findings += patchset.check(lm, cells, labels, fetch=fetch)
    findings += reqset.check(lm, cells, labels, fetch=fetch)
    findings = stamp_facts(findings, views)
    waivers, problems = _waivers(lm, cells, findings)
    findings = waive(findings, waivers, RULES) + problems
    order = {label: i for i, label in enumerate(labels)}
    return sorted(findings, key=lambda f: (order.get(f.cell, len(order)), f.waived is not None,
                                           SEVERITY_ORDER[f.severity], f.rule))


def render(findings: list[Finding], fmt: str = "table", meta: dict | None = None) -> str:
    """`check` output: "table" (one line per finding) or "json" (with the rules used)."""
    if fmt == "json":
        return format_json(findings, meta, RULES)
    return format_table(findings)
