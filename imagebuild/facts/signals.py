"""What smoke and bench read in a vLLM server's log and /metrics, per vLLM version.

A signal is one thing smoke learns from vLLM's own output: which attention backend, NVFP4
GEMM or MoE kernel it chose, the sampler, the speculative method, that the drafter loads
next, that weights were skipped at load. vLLM words them per version (0.23.0 logs "Using
HND KV cache layout for CPU_ATTN backend." from v1/attention/selector.py; 0.32.0 logs
"Using LBHNC KV cache layout." from v1/attention/backends/utils.py, without the backend),
so each signal lists the messages that carry it as vLLM's logger calls write them (file
and template). `readers(facts, platform)` keeps those the version's recorded `logs` facts
hold, each turned into the regex of its printed line; a signal none of whose messages the
version has cannot be read there: `unreadable()` says why, preflight refuses an
expectation that needs it (rule smoke-signal-missing) and smoke says the check does not
apply, never a pass. The same goes for the /metrics families (METRICS) against the
version's `metrics` facts.

A printed line carries its file: vLLM's format is "[%(fileinfo)s:%(lineno)d] %(message)s"
(vllm/logger.py _FORMAT, 0.23.0 and 0.32.0; fileinfo is the file name, a shortened path at
DEBUG), so a message is matched only in lines of the file that logs it ("Using %s
backend." is platforms/cuda.py's attention choice, and a MoE oracle's line too).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

FIELD = "\x1f"  # how the recorder writes an f-string's replacement field (recorder/logs.py)
# printf directives as vLLM's logger calls write them (%s, %d, %.2f, %r) and f-string fields
PLACEHOLDER = re.compile(r"%[-#0 +]*(?:\d+)?(?:\.\d+)?[sdrfiguxXeE]|" + FIELD)
# a value as vLLM prints it: a name, maybe quoted, maybe an enum's member (the enum path
# dropped: AttentionBackendEnum.FLASH_ATTN is FLASH_ATTN)
VALUE = r"""['"]?(?:[A-Za-z_]\w*\.)*(?P<value>[\w-]+)['"]?"""
BARE = r"(?P<value>.+?)"  # an unquoted label of several words ("FlashInfer CUTLASS")
FILE_TAG = re.compile(r"\[(?:[^\]\s]*/)?(?P<file>[^\]\s/]+\.py):\d+\] ")


@dataclass(frozen=True)
class Form:
    """One vLLM message carrying a signal.

    `file` is the source file as facts name it (a glob: models/*.py); `template` the message
    as recorded (a fragment of it when `fragment`, for config reprs printed inside another
    line: then the line is searched anywhere, whatever file prints it); `value` the index of
    the placeholder holding the value, or None with `name` the value the line itself means;
    `before` literal text the printed line has right before the fragment (the field of an
    enclosing repr, itself required as `needs`); `platform` where vLLM logs it at all;
    `only` the narrower condition of the code path that logs it (said, never assumed)."""

    signal: str
    file: str
    template: str
    value: int | None = 0
    name: str | None = None
    platform: str | None = None
    only: str = ""
    fragment: bool = False
    before: str = ""
    needs: tuple[tuple[str, str], ...] = ()
    value_regex: str = VALUE


ORACLE = "vllm/model_executor/layers/fused_moe/oracle/"
SPEC_FIELD = "speculative_config=" + FIELD  # VllmConfig.__repr__ (config/vllm.py)
FORMS: tuple[Form, ...] = (
    # attention: platforms/cuda.py get_attn_backend_cls (auto: the priority list; named:
    # the selected enum), v1/attention/selector.py (0.23: every backend needing a layout,
    # CPU_ATTN), platforms/cpu.py (0.32: MLA models only, get_attn_backend_cls)
    Form("attention", "vllm/platforms/cuda.py",
         "Using %s attention backend out of potential backends: %s.", platform="cuda"),
    Form("attention", "vllm/platforms/cuda.py", "Using %s backend.", platform="cuda"),
    Form("attention", "vllm/v1/attention/selector.py",
         "Using %s KV cache layout for %s backend.", value=1),
    Form("attention", "vllm/platforms/cpu.py", "Using %s backend.", platform="cpu",
         only="models with multi-head latent attention (MLA)"),
    Form("nvfp4_gemm", "vllm/model_executor/kernels/linear/__init__.py",
         "Using %s for NVFP4 GEMM", platform="cuda"),
    # the MoE oracles' _make_log_backend (quoted for NvFp4/Mxfp4/MxFp8/WNA16, bare else)
    *(Form("moe", ORACLE + file, template,
           value_regex=VALUE if template.startswith("Using '") else BARE)
      for file, template in (
        ("nvfp4.py", f"Using '{FIELD}' NvFp4 MoE backend out of potential backends: {FIELD}."),
        ("fp8.py", f"Using {FIELD} Fp8 MoE backend out of potential backends: {FIELD}."),
        ("int8.py", f"Using {FIELD} Int8 MoE backend out of potential backends: {FIELD}."),
        ("w4a8_int8.py",
         f"Using {FIELD} W4A8 Int8 MoE backend out of potential backends: {FIELD}."),
        ("int_wna16.py", f"Using '{FIELD}' WNA16 MoE backend."),
        ("mxfp4.py", f"Using '{FIELD}' Mxfp4 MoE backend."),
        ("mxfp8.py", "Using '%s' MxFp8 MoE backend."),
        ("mxfp8.py", "Using '%s' MxFp8 MoE backend (user-requested)."),
        ("w4a8.py", "Using %s W4A8 MoE backend."))),
    # the unquantized oracle's labels ("FlashInfer CUTLASS", "TRITON", ...)
    Form("moe_unquantized", ORACLE + "unquantized.py",
         f"Using {FIELD} Unquantized MoE backend out of potential backends: {FIELD}.",
         value_regex=BARE),
    # v1/sample/ops/topk_topp_sampler.py; the CPU platform logs nothing here
    Form("sampler", "vllm/v1/sample/ops/topk_topp_sampler.py",
         "Using FlashInfer for top-p & top-k sampling.", value=None, name="FLASHINFER"),
    Form("sampler", "vllm/v1/sample/ops/topk_topp_sampler.py",
         "FlashInfer top-p/top-k sampling disabled via VLLM_USE_FLASHINFER_SAMPLER=0.",
         value=None, name="NATIVE"),
    Form("sampler", "vllm/v1/sample/ops/topk_topp_sampler.py",
         "FlashInfer top-p/top-k sampling unavailable: %s; falling back. Set "
         "VLLM_USE_FLASHINFER_SAMPLER=0 to silence.", value=None, name="NATIVE"),
    # the engine's config line (v1/engine/core.py "... with config: %s") prints VllmConfig's
    # repr, whose speculative_config field is SpeculativeConfig's repr or None
    Form("speculative", "vllm/config/speculative.py", "SpeculativeConfig(method=" + FIELD,
         fragment=True, before="speculative_config=",
         needs=(("vllm/config/vllm.py", SPEC_FIELD),)),
    Form("speculative", "vllm/config/vllm.py", SPEC_FIELD, fragment=True,
         value_regex=r"(?P<value>None)\b"),
    # gpu_model_runner.py / cpu_model_runner.py load_model: between target and drafter
    Form("drafter_starts", "vllm/v1/worker/gpu_model_runner.py", "Loading drafter model...",
         value=None, name="", platform="cuda"),
    Form("drafter_starts", "vllm/v1/worker/cpu_model_runner.py", "Loading drafter model...",
         value=None, name="", platform="cpu"),
    # a checkpoint tensor vLLM found no parameter for and did not load (docs/domain.md: the
    # nested visual.* prefix; 0.32's AutoWeightsLoader raises instead, a failed boot)
    Form("weights_skipped", "vllm/model_executor/models/*.py",
         f"Parameter {FIELD} not found in params_dict, skip loading", value=None, name=""),
    *(Form("weights_skipped", file, template, value=None, name="") for file, template in (
        ("vllm/model_executor/model_loader/weight_utils.py",
         "Found %s in the checkpoint (e.g. %s), but not found the expected name in the model "
         "(e.g. %s). %s is not loaded."),
        ("vllm/model_executor/*.py",
         "Found kv_scale in the checkpoint (e.g. %s), but not found the expected name in the "
         "model (e.g. %s). kv_scale is not loaded."))),
)
# what each signal is, in the words a finding uses
SAID = {
    "attention": "the attention backend vLLM chose",
    "nvfp4_gemm": "the NVFP4 GEMM kernel vLLM chose",
    "moe": "the MoE backend of quantized experts",
    "moe_unquantized": "the MoE backend of unquantized experts",
    "sampler": "the top-p/top-k sampler",
    "speculative": "the speculative method in the engine's config line",
    "drafter_starts": "where the drafter's load starts (its kernel lines follow)",
    "weights_skipped": "checkpoint weights skipped at load",
}
SIGNALS = tuple(SAID)

# /metrics families smoke and bench read: key -> (family, kind); a counter's samples end in
# _total, a histogram's in _sum/_count/_bucket (prometheus_client)
METRICS: dict[str, tuple[str, str]] = {
    "drafts": ("vllm:spec_decode_num_drafts", "counter"),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens", "counter"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "counter"),
    "ttft": ("vllm:time_to_first_token_seconds", "histogram"),
}
SPECULATIVE_METRICS = ("drafts", "draft_tokens", "accepted_tokens")


def sample(key: str, suffix: str = "") -> str:
    """The sample name /metrics prints for METRICS[key] (`_total` for a counter)."""
    family, kind = METRICS[key]
    return family + ("_total" if kind == "counter" and not suffix else suffix)


def message_regex(template: str, value: int | None, value_regex: str = VALUE) -> str:
    """The regex of a printed message: literal text escaped, the value placeholder a named
    group, every other placeholder any text."""
    parts = PLACEHOLDER.split(template)
    out = [re.escape(parts[0])]
    for i, literal in enumerate(parts[1:]):
        out.append(value_regex if i == value else ".*?")
        out.append(re.escape(literal))
    return "".join(out)


def _messages(facts: Any) -> list[tuple[str, str]]:
    """(source file, template) of every message the version's facts record."""
    logs = facts.logs if facts is not None else None
    return [(str(m[0]).rsplit(":", 1)[0], str(m[2])) for m in (logs or {}).get("messages", [])]


def _found(messages: list[tuple[str, str]], file: str, template: str, fragment: bool
           ) -> list[str]:
    """The files matching `file` that log `template` (contain it, for a fragment)."""
    return sorted({f for f, t in messages if fnmatch.fnmatchcase(f, file)
                   and (template in t if fragment else t == template)})


_READERS: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}


def readers(facts: Any, platform: str | None) -> list[dict[str, Any]]:
    """The forms of every signal the version's facts hold, for a server on `platform`
    ("cuda", "cpu"), as JSON-able readers (smoke gets them in its expectations)."""
    if facts is None:
        return []
    key = (facts.version, str(facts.root), platform)  # every cell of a plan asks again
    if key not in _READERS:
        _READERS[key] = _readers(facts, platform)
    return [dict(r) for r in _READERS[key]]


def _readers(facts: Any, platform: str | None) -> list[dict[str, Any]]:
    messages = _messages(facts)
    out = []
    for form in FORMS:
        if form.platform is not None and platform is not None and form.platform != platform:
            continue
        files = _found(messages, form.file, form.template, form.fragment)
        if not files or any(not _found(messages, f, t, True) for f, t in form.needs):
            continue
        out.append({
            "signal": form.signal,
            # a fragment of a repr is printed inside another line: no file tag to match
            "files": [] if form.fragment else sorted({f.rsplit("/", 1)[-1] for f in files}),
            "regex": re.escape(form.before) + message_regex(form.template, form.value,
                                                            form.value_regex),
            "name": form.name,
            "only": form.only,
            "source": f"{files[0]}: {form.template!r}",
        })
    return out


def unreadable(facts: Any, platform: str | None, read: list[dict[str, Any]] | None = None
               ) -> dict[str, str]:
    """signal -> why smoke cannot read it on this version and platform (no message of the
    version's facts carries it, or only on a narrower code path)."""
    if facts is None:
        return {s: "no recorded facts for this vLLM version" for s in SIGNALS}
    if facts.logs is None:
        return {s: facts.missing("logs") for s in SIGNALS}
    read = readers(facts, platform) if read is None else read
    out = {}
    for signal in SIGNALS:
        forms = [r for r in read if r["signal"] == signal]
        if any(not r["only"] for r in forms):
            continue
        where = f" on {platform}" if platform else ""
        if forms:
            out[signal] = (f"vLLM {facts.version} logs {SAID[signal]}{where} only for "
                           + "; ".join(f"{r['only']} ({r['source']})" for r in forms))
            continue
        known = sorted({repr(f.template) for f in FORMS if f.signal == signal
                        and (f.platform in (None, platform) or platform is None)})
        out[signal] = (f"no message of vLLM {facts.version}'s recorded logs says "
                       f"{SAID[signal]}{where} (looked for {', '.join(known)})")
    return out


def missing_metrics(facts: Any, keys: Iterable[str]) -> dict[str, str]:
    """metric key -> why the version's /metrics has no such family (its metrics facts)."""
    if facts is None:
        return {k: "no recorded facts for this vLLM version" for k in keys}
    recorded = (facts.metrics or {}).get("metrics")
    if recorded is None:
        return {k: facts.missing("metrics") for k in keys}
    return {k: f"vLLM {facts.version} registers no {METRICS[k][0]} (its recorded metrics)"
            for k in keys if METRICS[k][0] not in recorded}


# --- reading a log with a version's readers ------------------------------------------------

@dataclass(frozen=True)
class Compiled:
    signal: str
    files: frozenset[str]
    regex: re.Pattern[str]
    name: str | None


def compile_readers(read: Iterable[Mapping[str, Any]]) -> list[Compiled]:
    return [Compiled(r["signal"], frozenset(r["files"]), re.compile(r["regex"]), r["name"])
            for r in read]


@dataclass(frozen=True)
class Seen:
    """One signal in one line: its value and where in the line it was said."""

    signal: str
    value: str
    start: int
    end: int


def signals_in(line: str, compiled: list[Compiled]) -> Iterator[Seen]:
    """Each reader matching `line`: a file's message only in that file's lines (right
    after the file tag), a repr fragment anywhere; a line without vLLM's file tag (vLLM's
    logging configured off) is searched whole."""
    tag = FILE_TAG.search(line)
    at = tag.end() if tag else 0
    for c in compiled:
        if not c.files:
            m = c.regex.search(line)
        elif tag is not None and tag.group("file") not in c.files:
            continue
        else:
            m = c.regex.match(line, at) if tag else c.regex.search(line)
        if m is not None:
            value = c.name if c.name is not None else m.group("value")
            yield Seen(c.signal, value, m.start(), m.end())


# --- what an expectation needs ---------------------------------------------------------------

# expect_backends kind -> the signals any one of which reads it; a drafter's kind also
# needs the line where the drafter's load starts (its lines are told apart by it)
KIND_SIGNALS: dict[str, tuple[str, ...]] = {
    "attention": ("attention",), "nvfp4_gemm": ("nvfp4_gemm",),
    "moe": ("moe", "moe_unquantized"), "sampler": ("sampler",),
    "speculative": ("speculative",), "drafter_moe": ("moe", "moe_unquantized"),
    "drafter_attention": ("attention",),
}


def kind_unreadable(kind: str, unread: Mapping[str, str]) -> str | None:
    """Why an expect_backends kind cannot be read with these unreadable signals, or None."""
    signals = KIND_SIGNALS[kind]
    if all(s in unread for s in signals):
        return unread[signals[0]]
    if kind.startswith("drafter_") and "drafter_starts" in unread:
        return unread["drafter_starts"]
    return None
