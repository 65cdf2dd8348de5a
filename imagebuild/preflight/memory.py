"""Memory admission for every cell: its predicted peak on its target, before any boot.

A cell whose weights, KV cache, drafter, activations and runtime exceed what its target
gives it is found out late and badly: the cpu container is OOM-killed mid-boot with an
error naming no cause; a Spark (unified memory, no cgroup in the way) wedges or resets.

Facts from vLLM 0.23.0 (read in its Python, the versions' files named):
- cpu: `VLLM_CPU_KVCACHE_SPACE` (GiB) becomes `kv_cache_memory_bytes`
  (platforms/cpu.py check_and_update_config) and the worker allocates exactly that
  (v1/worker/cpu_worker.py determine_available_memory), skipping the utilization check
  (cpu_worker.py __init__); without it the pool is gpu-memory-utilization x the NUMA
  node's memory minus the worker's RSS: the host's memory, not the container's limit.
  The budget is the container's `memory_limit`. `--num-gpu-blocks-override N` makes the
  pool N blocks of every layer's page instead, checked like any pool against one
  max-model-len request (v1/core/kv_cache_utils.py get_kv_cache_configs: the override
  replaces the available memory before check_enough_kv_cache_memory).
- cuda: vLLM requests gpu-memory-utilization (default 0.92, config/cache.py) x the
  device's total memory (v1/worker/utils.py request_memory) and gives the KV pool what
  its profile leaves (gpu_worker.py determine_available_memory); it refuses to start when
  the pool cannot hold one max-model-len request (v1/core/kv_cache_utils.py
  check_enough_kv_cache_memory). On unified memory the request comes out of the host's
  RAM, beside the API server and engine-core processes, each holding its own copy of the
  multimodal processor cache (config/multimodal.py mm_processor_cache_gb, default 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.lock.lockfile import Lock
from imagebuild.preflight.checkpoint import Checkpoint, parse_len
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import MAX_GPU_MEM_UTIL, CellView, as_float, as_int
from imagebuild.preflight.kvcache import KVPrediction
from imagebuild.preflight.multinode import ACT_COPIES, DTYPE_BYTES, kv_bytes_per_request
from imagebuild.spec.values import memory_bytes

GIB = 2**30
VLLM_VERSION = "0.23.0"  # the version whose accounting is replayed here
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
BLOCKS_FLAG = "num-gpu-blocks-override"
# CacheConfig.gpu_memory_utilization of 0.23.0 (config/cache.py): used only when the cell's
# vLLM has no recorded serve parser (vllmfacts.py then says the facts are missing)
VLLM_DEFAULT_UTIL = 0.92
VLLM_DEFAULT_BATCHED = 8192  # the larger of vLLM's CUDA defaults: the safe side
VLLM_DEFAULT_SEQS = 256
MM_CACHE_GIB = 4.0  # config/multimodal.py mm_processor_cache_gb
# Everything of the cpu serve image that is not KV, weights or activations: the API
# server, engine core and worker processes, torch and vLLM, in the container's cgroup.
# Calibrated by benchmarks/memory_calibration.py on the cpu image (docs/memory.md): rss +
# shmem under the bench minus the KV pool: 1.29 GiB with the profile's 1 MiB pool, 1.32 GiB
# with a 1 GiB space (whose pages cost a little more than their size); the larger, rounded
# up to stay on the safe side.
CPU_RUNTIME_BYTES = int(1.33 * GIB)
CPU_ERROR = 0.03  # the stated error of the cpu prediction against the measured peak
# cuda: the CUDA context, cuBLAS/NCCL workspaces and CUDA graphs inside vLLM's request,
# and the API server + engine core outside it. Not measurable here: a Spark calibrates
# both (docs/memory.md "What only a Spark can calibrate").
CUDA_RUNTIME_BYTES = 4 * GIB
HOST_PROCESSES_BYTES = int(1.5 * GIB)

RULES = (
    Rule("memory-admission", "error",
         "a cell whose weights, KV cache, drafter, activations and runtime exceed its "
         "target's memory is OOM-killed mid-boot (cpu container) or wedges a unified-memory "
         "machine (DGX Spark) instead of failing cleanly",
         "lower --max-model-len, --max-num-seqs or --gpu-memory-utilization (cpu: "
         "VLLM_CPU_KVCACHE_SPACE), or raise the target's memory_limit",
         facts=("serve_args",)),
    Rule("memory-prediction", "info",
         "each cell's predicted peak memory and its breakdown, printed for review", "",
         facts=("serve_args",)),
)
BY_ID = {r.id: r for r in RULES}


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes of one cell's predicted peak (`need`) against its `budget`."""

    weights: int | None  # None: the model's files are not locked yet
    drafter: int
    kv: int | None  # the pool vLLM allocates (cpu: the KV space); None: unknown
    kv_one_request: int | None  # KV of one max-model-len request (cuda refusal check)
    activations: int
    runtime: int
    budget: int
    budget_text: str
    host_side: int = 0  # cuda/unified: processes outside vLLM's request
    mm_cache: int = 0  # of which the multimodal processor caches
    machine: int = 0  # cuda/unified: the machine's memory
    host_reserve: int = 0

    @property
    def need(self) -> int | None:
        """The predicted peak inside the budget; None while a term is unknown."""
        if self.weights is None or self.kv is None:
            return None
        return self.weights + self.drafter + self.kv + self.activations + self.runtime


def locked_weight_bytes(lock: Lock | None, kind: str, name: str | None,
                        cp: Checkpoint | None) -> int | None:
    """Bytes of a checkpoint's *.safetensors files as the lock records them (what vLLM
    reads), else the index's metadata.total_size; None when neither is known."""
    entry = lock.entry(kind, name) if lock is not None and name else None
    files = (entry or {}).get("files") or []
    sizes = [int(f["size"]) for f in files if isinstance(f, dict)
             and str(f.get("path", "")).endswith(".safetensors")
             and isinstance(f.get("size"), int)]
    if sizes:
        return sum(sizes)
    meta = ((cp.index if cp is not None else None) or {}).get("metadata") or {}
    size = meta.get("total_size")
    return int(size) if isinstance(size, int | float) and size > 0 else None


def activation_bytes(text: dict, batched: int, seqs: int) -> int:
    """One batch's activations: ACT_COPIES copies of max-num-batched-tokens x hidden in
    the model dtype, and the float32 logits of max-num-seqs sequences."""
    return (batched * int(text.get("hidden_size") or 0) * DTYPE_BYTES * ACT_COPIES
            + seqs * int(text.get("vocab_size") or 0) * 4)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB // 10 else f"{n / 2**20:.1f} MiB"


def predict(v: CellView, lock: Lock | None, model: Checkpoint, drafter: Checkpoint | None,
            kv: KVPrediction | None) -> MemoryPrediction:
    target = v.cell.target
    text = model.text if model.config is not None else {}
    weights = locked_weight_bytes(lock, "models", v.cell.model_name, model)
    drafter_w = (locked_weight_bytes(lock, "drafters", v.cell.drafter_name, drafter) or 0
                 if v.cell.drafter_model else 0)
    gpu = bool(target.gpu)
    batched = as_int(v.flag("max-num-batched-tokens")) or (
        VLLM_DEFAULT_BATCHED if gpu else 2048)
    seqs = as_int(v.flag("max-num-seqs")) or VLLM_DEFAULT_SEQS
    act = activation_bytes(text, batched, seqs)
    max_len = parse_len(str(v.flag("max-model-len") or "")) or int(
        text.get("max_position_embeddings") or 0)
    spec = int(v.spec.get("num_speculative_tokens") or 0) if v.method != "none" else 0
    one = kv_bytes_per_request(kv, max_len, spec) if kv is not None and kv.ok else None
    limit = memory_bytes(target.memory_limit)
    if not gpu:
        # present and not empty: an explicit size, 0 included (platforms/cpu.py)
        space = as_int(v.env.get(CPU_KV_ENV) or None)
        pool = None if space is None else space * GIB
        blocks = as_int(v.flag(BLOCKS_FLAG))
        if pool is not None and blocks is not None and kv is not None and kv.final_layers:
            pool = min(pool, blocks * sum(f.page_bytes for f in kv.final_layers))
        return MemoryPrediction(
            weights=weights, drafter=drafter_w, kv=pool,
            kv_one_request=one, activations=act, runtime=CPU_RUNTIME_BYTES, budget=limit,
            budget_text=f"memory_limit {target.memory_limit}")
    recorded = v.default("gpu-memory-utilization")  # the cell's vLLM's own default
    util = as_float(v.flag("gpu-memory-utilization")) or (
        float(recorded) if isinstance(recorded, int | float) else VLLM_DEFAULT_UTIL)
    # a discrete GPU's memory is no container setting: unknown unless the target says it
    size = target.memory or (target.memory_limit if target.unified_memory else None)
    if size is None:
        return MemoryPrediction(weights=weights, drafter=drafter_w, kv=None,
                                kv_one_request=one, activations=act,
                                runtime=CUDA_RUNTIME_BYTES, budget=0, budget_text="")
    machine = memory_bytes(size)
    requested = int(util * machine)
    tp = as_int(v.flag("tensor-parallel-size")) or 1
    if tp > 1 and weights is not None:  # one device holds its rank's share
        weights, drafter_w = weights // tp, drafter_w // tp
    fixed = (weights or 0) + drafter_w + act + CUDA_RUNTIME_BYTES
    pool = requested - fixed if weights is not None else None
    mm = (1 + 1) * MM_CACHE_GIB * GIB if model_multimodal(v) else 0  # API server + core
    reserve = memory_bytes(target.host_reserve) if target.host_reserve else 0
    return MemoryPrediction(
        weights=weights, drafter=drafter_w, kv=pool, kv_one_request=one, activations=act,
        runtime=CUDA_RUNTIME_BYTES, budget=requested,
        budget_text=f"gpu-memory-utilization {util} x {size}",
        host_side=HOST_PROCESSES_BYTES + int(mm), mm_cache=int(mm), machine=machine,
        host_reserve=reserve)


def model_multimodal(v: CellView) -> bool:
    return bool(v.cell.model.multimodal)


def _cpu(v: CellView, p: MemoryPrediction) -> list[Finding]:
    admit, info = BY_ID["memory-admission"], BY_ID["memory-prediction"]
    where = v.where(env=CPU_KV_ENV)
    if p.kv is None:
        return [admit.finding(
            v.label, f"{CPU_KV_ENV} is not set: vLLM {VLLM_VERSION}'s CPU worker then sizes "
                     "the KV cache from --gpu-memory-utilization x the host's memory, not "
                     f"the container's {p.budget_text}",
            fix=f"set {CPU_KV_ENV} (GiB) in the profile's env", where=where,
            severity="warning")]
    one = p.kv_one_request
    blocks = as_int(v.flag(BLOCKS_FLAG))
    kv_from = f"--{BLOCKS_FLAG} {blocks}" if blocks is not None else CPU_KV_ENV
    if one is not None and one > p.kv:
        # v1/core/kv_cache_utils.py check_enough_kv_cache_memory, after the model loaded
        return [admit.finding(
            v.label, f"vLLM {VLLM_VERSION} refuses to start: {kv_from} {_gib(p.kv)} "
                     f"cannot hold one max-model-len request ({_gib(one)})",
            fix=f"raise {kv_from.split()[0]} or lower --max-model-len",
            where=v.where(BLOCKS_FLAG) if blocks is not None else where)]
    if p.weights is None:
        return [info.finding(v.label, f"KV {_gib(p.kv)} + runtime {_gib(p.runtime)}; the "
                                      "model's weights are not locked yet", fix="")]
    need = p.need or 0
    shown = (f"predicted peak {_gib(need)} (+-{CPU_ERROR:.0%}) = weights {_gib(p.weights)}"
             f" + drafter {_gib(p.drafter)} + KV ({kv_from}) {_gib(p.kv)} + activations "
             f"{_gib(p.activations)} + runtime {_gib(p.runtime)}; budget {p.budget_text} = "
             f"{_gib(p.budget)}")
    if need <= p.budget:
        return [info.finding(v.label, f"fits, {_gib(p.budget - need)} spare: {shown}", fix="")]
    space = (p.budget - (need - p.kv)) // GIB
    fix = (f"lower {CPU_KV_ENV} to {space} or raise the target's memory_limit" if space >= 1
           else "raise the target's memory_limit")
    return [admit.finding(v.label, f"does not fit: {shown}", fix=fix, where=where)]


def _mm(p: MemoryPrediction) -> str:
    return f" (with 2 x {MM_CACHE_GIB:g} GiB multimodal processor cache)" if p.mm_cache else ""


def _cuda(v: CellView, p: MemoryPrediction) -> list[Finding]:
    admit, info = BY_ID["memory-admission"], BY_ID["memory-prediction"]
    if not p.budget:
        return [info.finding(v.label, "the GPU's memory is unknown, so memory is not "
                                      "predicted", fix="set the target's memory (e.g. 32g)")]
    out: list[Finding] = []
    # the machine: vLLM's request plus what runs beside it must leave the host its reserve
    host = p.budget + p.host_side + p.host_reserve
    # a utilization above docs/domain.md's ceiling is gpu-mem-util-unified's refusal
    over = p.budget > MAX_GPU_MEM_UTIL * p.machine + 1
    if v.cell.target.unified_memory and host > p.machine and not over:
        util = (p.machine - p.host_side - p.host_reserve) / p.machine
        out.append(admit.finding(
            v.label, f"unified memory overcommitted: {p.budget_text} = {_gib(p.budget)} + "
                     f"API server and engine core {_gib(p.host_side)}{_mm(p)} + host reserve "
                     f"{_gib(p.host_reserve)} = {_gib(host)} > {_gib(p.machine)}",
            fix=f"lower --gpu-memory-utilization to {int(util * 100) / 100:.2f} or below",
            where=v.where("gpu-memory-utilization")))
    machine = (f"; machine {_gib(p.budget)} + API server and engine core "
               f"{_gib(p.host_side)}{_mm(p)} + host reserve {_gib(p.host_reserve)} = {_gib(host)} "
               f"of {_gib(p.machine)}") if v.cell.target.unified_memory else ""
    if p.weights is None or p.kv is None:
        return out + [info.finding(
            v.label, f"budget {p.budget_text} = {_gib(p.budget)}; weights not locked yet, so "
                     f"the KV pool is not predicted{machine}", fix="")]
    fixed = p.weights + p.drafter + p.activations + p.runtime
    shown = (f"weights {_gib(p.weights)} + drafter {_gib(p.drafter)} + activations "
             f"{_gib(p.activations)} + runtime/graphs {_gib(p.runtime)} = {_gib(fixed)}; "
             f"budget {p.budget_text} = {_gib(p.budget)}, KV pool {_gib(max(p.kv, 0))}")
    one = p.kv_one_request
    if p.kv <= 0 or (one is not None and one > p.kv):
        need = f"; one max-model-len request needs {_gib(one)}" if one else ""
        return out + [admit.finding(
            v.label, f"vLLM {VLLM_VERSION} refuses to start: {shown}{need}",
            fix="lower --max-model-len or raise --gpu-memory-utilization",
            where=v.where("max-model-len"))]
    seqs = as_int(v.flag("max-num-seqs")) or VLLM_DEFAULT_SEQS
    full = f", {p.kv // one} max-model-len requests at once against max-num-seqs {seqs}" \
        if one else ""
    return out + [info.finding(v.label, f"fits: {shown}{full}{machine}", fix="")]


def check_cell(v: CellView, lock: Lock | None, model: Checkpoint, drafter: Checkpoint | None,
               kv: KVPrediction | None) -> list[Finding]:
    if v.cell.profile.parallel is not None:
        return []  # multinode.tp-memory-per-node splits the memory per node
    p = predict(v, lock, model, drafter, kv)
    return _cuda(v, p) if v.cell.target.gpu else _cpu(v, p)
