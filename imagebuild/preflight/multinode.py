"""Rules for tensor parallelism and cells that span several nodes (docs/multi-node.md).

- tp-divides-heads: vLLM 0.23 splits attention heads, KV heads (or replicates them when TP
  exceeds them), MoE experts and Gated DeltaNet heads across the TP ranks; a TP they do not
  allow fails at model construction, minutes into a boot (config/model.py
  verify_with_parallel_config, QKV layers, qwen3_next.py, mamba/gdn).
- tp-memory-per-node: on unified memory every node holds its ranks' share of the weights,
  the KV cache of one request at max-model-len and the activations of one batch within
  `--gpu-memory-utilization` of the machine; vLLM refuses a KV cache smaller than one
  full-length request at start.
- multinode-interconnect: NCCL and Gloo need the link's interface on every node, and NCCL
  the ConnectX RoCE devices (NCCL_IB_HCA), or they pick the wrong NIC (or TCP).
- multinode-allreduce: CUDA-IPC all-reduces (vLLM's custom one, FlashInfer's fused
  all-reduce + RMSNorm pass) cannot reach another machine; vllm-project/recipes#414 and
  NVIDIA's DGX Spark playbooks turn them off.
- multinode-node-flags: the per-node compose files in the rendered folder (what the
  launcher starts, possibly edited by hand) must agree: spec/nodecmd.node_differences.
"""

from __future__ import annotations

import json
from pathlib import Path

from imagebuild.preflight.checkpoint import Checkpoint, parse_len
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView, as_float, as_int
from imagebuild.preflight.kvcache import KVPrediction
from imagebuild.serving.nodefiles import find_node_files, read_node_file
from imagebuild.spec.nodecmd import multi_node, node_commands, node_differences
from imagebuild.spec.values import memory_bytes

CUDA = ("cuda",)
UNIFIED = ("cuda", "unified-memory")
# vLLM serve options and environment variables the rules read; whether the cell's version
# has them, and their defaults, come from its recorded facts (serve_args, envs)
CUSTOM_ALL_REDUCE_OFF = "disable-custom-all-reduce"
COMPILATION_CONFIG = "compilation-config"
OPTIMIZATION_LEVEL = "optimization-level"
FUSE_ALLREDUCE = "fuse_allreduce_rms"  # pass_config: FlashInfer all-reduce fusion
FLASHINFER_ALLREDUCE_ENV = "VLLM_ALLREDUCE_USE_FLASHINFER"
IB_HCA, IB_DISABLE = "NCCL_IB_HCA", "NCCL_IB_DISABLE"
# Activations of one batch per rank: a rough upper bound (not measured), from the
# residual stream and its temporaries (ACT_COPIES copies of max-num-batched-tokens x
# hidden_size in the model dtype), the logits of max-num-seqs sequences in float32, and
# a fixed reserve for the CUDA context, NCCL buffers and CUDA graphs.
ACT_COPIES = 16
RESERVE_BYTES = 2 << 30
DTYPE_BYTES = 2

RULES = (
    Rule("tp-divides-heads", "error",
         "vLLM splits attention heads, KV heads, experts and linear-attention (GDN) heads "
         "across tensor-parallel ranks; a size they do not allow fails at model "
         "construction, minutes into a boot",
         "choose a tensor_parallel_size that divides the attention heads (and the KV "
         "heads, or is a multiple of them)", facts=("serve_args",)),
    Rule("tp-memory-per-node", "error",
         "on unified memory each node holds its share of the weights plus the KV cache of "
         "one full-length request and a batch's activations within --gpu-memory-utilization "
         "of the machine; vLLM refuses to start otherwise",
         "spread the model over more nodes, or lower max-model-len", hardware=UNIFIED,
         facts=("serve_args", "kv")),
    Rule("multinode-interconnect", "error",
         "NCCL and Gloo must be told the link's interface on every node, and NCCL the "
         "ConnectX RoCE devices, or they choose another NIC (or fall back to TCP)",
         "add the target's interconnect: interfaces (NCCL/Gloo socket NIC) and env "
         "NCCL_IB_HCA (the RoCE devices, `ibdev2netdev`)"),
    Rule("multinode-allreduce", "error",
         "vLLM's custom all-reduce and FlashInfer's fused all-reduce use CUDA IPC, which "
         "cannot reach another machine (vllm-project/recipes#414, NVIDIA's DGX Spark "
         "playbooks turn both off)",
         "add disable-custom-all-reduce: true and compilation-config: {pass_config: "
         "{fuse_allreduce_rms: false}} to the profile's args", hardware=CUDA,
         facts=("serve_args", "envs")),
    Rule("multinode-node-flags", "error",
         "every node must run the head's serve flags (but its own node-rank) and the same "
         "interconnect settings, or ranks disagree on the model and hang or fail at boot",
         "render the per-node files again (`python build.py render`) instead of editing "
         "them; change the profile or the target's interconnect in matrix.yaml"),
)
BY_ID = {r.id: r for r in RULES}


def _tp(v: CellView) -> int:
    return as_int(v.flag("tensor-parallel-size")) or 1


def _where_parallel(v: CellView) -> str:
    c = v.cell
    path = (("profiles", c.profile_name, "parallel") if c.profile.parallel is not None
            else ("profiles", c.profile_name, "args", "tensor-parallel-size"))
    return v.lm.located.where(path)


def _experts(text: dict) -> int | None:
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if isinstance(text.get(key), int):
            return int(text[key])
    return None


def head_problems(text: dict, tp: int) -> list[str]:
    """What a TP of `tp` breaks in a model's text config, as vLLM 0.23 checks it."""
    out = []
    heads = text.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        out.append(f"{heads} attention heads are not divisible by {tp}")
    kv = text.get("num_key_value_heads")
    if isinstance(kv, int) and kv > 0:
        if kv >= tp and kv % tp:
            out.append(f"{kv} KV heads are not divisible by {tp}")
        if kv < tp and tp % kv:
            out.append(f"{tp} is not a multiple of the {kv} KV heads (they are replicated "
                       "when TP exceeds them)")
    experts = _experts(text)
    if experts is not None and tp > experts:
        out.append(f"TP {tp} exceeds the {experts} experts")
    for key, what in (("linear_num_key_heads", "linear-attention key heads"),
                      ("linear_num_value_heads", "linear-attention value heads")):
        n = text.get(key)
        if isinstance(n, int) and n % tp:
            out.append(f"{n} {what} ({key}) are not divisible by {tp}")
    return out


def _divides(r: Rule, v: CellView, model: Checkpoint, drafter: Checkpoint | None
             ) -> list[Finding]:
    tp = _tp(v)
    if tp == 1 or model.config is None:
        return []
    out = []
    for cp in (model, drafter):
        if cp is None or cp.config is None:
            continue
        problems = head_problems(cp.text, tp)
        if problems:
            out.append(r.finding(v.label, f"tensor-parallel-size {tp} does not fit "
                                          f"{cp.label}: {'; '.join(problems)}",
                                 where=_where_parallel(v)))
    return out


def kv_bytes_per_request(p: KVPrediction, max_len: int, spec_tokens: int) -> int:
    """Cache bytes one request at max_len holds on one rank: attention pages for its
    tokens (a sliding window's at most), recurrent-state pages for 1 + k steps."""
    final = {f.name: f for f in p.final_layers}
    total = 0
    for spec in p.layers:
        f = final.get(spec.name)
        block, page = (f.block_size, f.page_bytes) if f else (spec.block_size, spec.page_bytes)
        if spec.kind == "mamba":
            total += page * (1 + spec_tokens)
            continue
        tokens = min(max_len, spec.sliding_window) if spec.sliding_window else max_len
        total += -(-tokens // block) * page
    return total


def weight_bytes(model: Checkpoint) -> int | None:
    meta = (model.index or {}).get("metadata") or {}
    size = meta.get("total_size")
    return int(size) if isinstance(size, int | float) and size > 0 else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _memory(r: Rule, v: CellView, model: Checkpoint, p: KVPrediction | None
            ) -> list[Finding]:
    par = v.cell.profile.parallel
    weights = weight_bytes(model)
    if par is None or weights is None:
        return []
    tp, per_node = par.tensor_parallel_size, par.ranks_per_node
    text = model.text
    raw_util = v.flag("gpu-memory-utilization")
    default = v.default("gpu-memory-utilization")
    util = as_float(raw_util) or (default if isinstance(default, int | float) else None)
    if util is None:
        return []  # no recorded default for this version: vllmfacts.py says so
    budget = util * memory_bytes(v.cell.target.memory_limit)
    max_len = parse_len(str(v.flag("max-model-len") or "")) or int(
        text.get("max_position_embeddings") or 0)
    spec_tokens = int(v.spec.get("num_speculative_tokens") or 0) if v.method != "none" else 0
    kv = kv_bytes_per_request(p, max_len, spec_tokens) if p is not None and p.ok else 0
    batched = as_int(v.flag("max-num-batched-tokens")) or 8192
    seqs = as_int(v.flag("max-num-seqs")) or 256
    act = (batched * int(text.get("hidden_size") or 0) * DTYPE_BYTES * ACT_COPIES
           + seqs * int(text.get("vocab_size") or 0) * 4 // tp + RESERVE_BYTES)
    need = per_node * (weights / tp + kv + act)
    shown = (f"per node {_gib(need)} = {per_node} rank(s) x (weights {_gib(weights)}/{tp} "
             f"+ KV of one {max_len}-token request {_gib(kv)} + activations ~{_gib(act)}); "
             f"budget {util} x {v.cell.target.memory_limit} = {_gib(budget)}")
    if need <= budget:
        return [r.finding(v.label, f"fits: {shown}", fix="", severity="info")]
    return [r.finding(v.label, f"does not fit: {shown}", where=_where_parallel(v))]


def _interconnect(r: Rule, v: CellView) -> list[Finding]:
    if multi_node(v.cell) is None:
        return []
    target = v.cell.target
    where = v.lm.located.where(("targets", v.cell.target_name))
    ic = target.interconnect
    if ic is None:
        return [r.finding(v.label, f"the cell spans {multi_node(v.cell).nodes} nodes "  # type: ignore[union-attr]
                                   f"but target {v.cell.target_name} has no interconnect",
                          where=where)]
    out = []
    where = v.lm.located.where(("targets", v.cell.target_name, "interconnect"))
    if not ic.interfaces:
        out.append(r.finding(v.label, "interconnect.interfaces is empty: NCCL_SOCKET_IFNAME "
                                      "and GLOO_SOCKET_IFNAME would be guessed per node",
                             fix="list the link's network interface, e.g. interfaces: "
                                 "[enp1s0f1np1]", where=where))
    ib_off = ic.env.get(IB_DISABLE, "0").strip() == "1"
    if target.gpu and not ib_off and not ic.env.get(IB_HCA):
        out.append(r.finding(v.label, f"interconnect.env has no {IB_HCA}: NCCL picks RoCE "
                                      "devices itself, possibly not the ConnectX port the "
                                      "cable is in", fix=f"add {IB_HCA}: the port's RoCE "
                             "devices as `ibdev2netdev` lists them, e.g. "
                             "rocep1s0f1,roceP2p1s0f1 (or NCCL_IB_DISABLE: \"1\" for TCP)",
                             where=where))
    return out


def fused_allreduce_off(v: CellView) -> bool:
    """FlashInfer's all-reduce fusion is off: -O0/-O1, or pass_config says so."""
    level = v.flag(OPTIMIZATION_LEVEL)
    if isinstance(level, str) and level.strip() in ("0", "1"):
        return True
    raw = v.flag(COMPILATION_CONFIG)
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else {}
    except json.JSONDecodeError:
        return False
    passes = cfg.get("pass_config") if isinstance(cfg, dict) else None
    return isinstance(passes, dict) and passes.get(FUSE_ALLREDUCE) is False


def env_default(v: CellView, name: str) -> tuple[bool, object, str]:
    """(the version knows the variable, its default, where envs.py defines it)."""
    envs = (v.facts.envs or {}).get("variables", {}) if v.facts is not None else {}
    entry = envs.get(name)
    if entry is None:
        return False, None, ""
    return True, entry.get("default"), entry.get("source", "vllm/envs.py")


def _on(value: object) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "none", "no", "off")


def _allreduce(r: Rule, v: CellView) -> list[Finding]:
    if multi_node(v.cell) is None:
        return []
    out = []
    options = (v.cli or {}).get("options") or {}
    said = v.facts.said if v.facts is not None else f"vLLM {v.version}"
    if CUSTOM_ALL_REDUCE_OFF not in options and options:
        out.append(r.finding(v.label, f"vLLM {v.version} has no --{CUSTOM_ALL_REDUCE_OFF} "
                                      f"({said}): the custom all-reduce cannot be turned off "
                                      "the way this rule knows", severity="warning",
                             fix="check how this vLLM version disables its custom all-reduce",
                             where=v.where(CUSTOM_ALL_REDUCE_OFF)))
    elif v.flag(CUSTOM_ALL_REDUCE_OFF) is not True or v.flag(f"no-{CUSTOM_ALL_REDUCE_OFF}"):
        out.append(r.finding(v.label, "custom all-reduce is on across nodes",
                             fix=f"add {CUSTOM_ALL_REDUCE_OFF}: true to the profile's args",
                             where=v.where(CUSTOM_ALL_REDUCE_OFF)))
    if not fused_allreduce_off(v):
        out.append(r.finding(v.label, "FlashInfer's all-reduce fusion is on (vLLM enables "
                                      f"pass_config.{FUSE_ALLREDUCE} for TP > 1 on CUDA)",
                             fix="add compilation-config: {pass_config: {fuse_allreduce_rms: "
                                 "false}} to the profile's args",
                             where=v.where(COMPILATION_CONFIG)))
    known, default, source = env_default(v, FLASHINFER_ALLREDUCE_ENV)
    raw = v.env.get(FLASHINFER_ALLREDUCE_ENV)
    if raw is not None and _on(raw):
        out.append(r.finding(v.label, f"{FLASHINFER_ALLREDUCE_ENV}={raw} turns FlashInfer's "
                                      "all-reduce on", fix=f"set {FLASHINFER_ALLREDUCE_ENV}: \"0\"",
                             where=v.where(env=FLASHINFER_ALLREDUCE_ENV)))
    elif raw is None and known and _on(default):
        out.append(r.finding(v.label, f"{FLASHINFER_ALLREDUCE_ENV} is unset and defaults to "
                                      f"{default} on vLLM {v.version} ({source}, {said}): "
                                      "FlashInfer's all-reduce is on",
                             fix=f"set env {FLASHINFER_ALLREDUCE_ENV}: \"0\" in the profile",
                             where=v.where(env=FLASHINFER_ALLREDUCE_ENV)))
    return out


def node_flag_findings(r: Rule, v: CellView, rendered: Path) -> list[Finding]:
    """The per-node files of the cell in `rendered` (as the launcher reads them), else the
    commands render would write."""
    if multi_node(v.cell) is None:
        return []
    c = v.cell
    folder = rendered / c.target_name / c.engine_name
    files = find_node_files(folder, c.image) if folder.is_dir() else []
    nodes = tuple(read_node_file(p) for p in files) or node_commands(c)
    where = str(folder / f"{c.image}.*.compose.yaml") if files else None
    return [r.finding(v.label, problem, where=where) for problem in node_differences(nodes)]


def unsplittable(findings: list[Finding]) -> list[Finding]:
    """The findings that say the model cannot be split at this TP at all."""
    return [f for f in findings if f.rule == "tp-divides-heads"]


def check_cell(v: CellView, model: Checkpoint, drafter: Checkpoint | None,
               kv: KVPrediction | None) -> list[Finding]:
    out: list[Finding] = []
    if v.applies(BY_ID["tp-divides-heads"]):
        out += _divides(BY_ID["tp-divides-heads"], v, model, drafter)
    if v.applies(BY_ID["tp-memory-per-node"]):
        out += _memory(BY_ID["tp-memory-per-node"], v, model, kv)
    if v.applies(BY_ID["multinode-interconnect"]):
        out += _interconnect(BY_ID["multinode-interconnect"], v)
    if v.applies(BY_ID["multinode-allreduce"]):
        out += _allreduce(BY_ID["multinode-allreduce"], v)
    out += node_flag_findings(BY_ID["multinode-node-flags"], v, v.lm.root / "rendered")
    return out
