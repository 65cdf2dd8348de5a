"""Checkpoint rules: what the locked metadata files (config.json, model.safetensors.index.json,
hf_quant_config.json, stored by `build.py lock` under locked/) say against the serve command.

Each check catches before boot what otherwise shows up minutes into a boot or only in the
answers (docs/domain.md "Checkpoint traps"). A pin the lock could not resolve has no metadata:
its checks are reported as skipped (a warning), never guessed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from imagebuild.lock.lockfile import LOCK_NAME, Lock
from imagebuild.preflight.families import Family, family
from imagebuild.preflight.findings import Finding, Rule
from imagebuild.preflight.flags import CellView, flag_values

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
HF_QUANT = "hf_quant_config.json"
# Quantization methods vLLM applies to an unquantized checkpoint at load time.
ONLINE_QUANT = {"fp8", "bitsandbytes", "experts-int8"}
# vLLM's derived max length reads the first of these it finds (config/model.py).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")
NESTED_VISION = "language_model.visual."  # vLLM loads the tower from model.visual.*

RULES = (
    Rule("quantization-matches-checkpoint", "error",
         "--quantization must name the checkpoint's format (compressed-tensors from "
         "llm-compressor vs modelopt, whose checkpoints carry hf_quant_config.json)",
         "set the model's quantization to the checkpoint's quant_method",
         facts=("serve_args",)),
    Rule("vision-weights-nested", "error",
         "vision tensors under model.language_model.visual.* are skip-loaded by vLLM 0.23 "
         "('Parameter visual.* not found in params_dict'): images answer '!!!!' (0.32's "
         "AutoWeightsLoader raises at load instead, models/utils.py _load_module)",
         "pin a revision whose weight_map keeps the vision tower under model.visual.*"),
    Rule("dflash-target-layers", "error",
         "a DFlash/EAGLE3 drafter reads hidden states of the target layers it lists; a layer "
         "the target does not have fails at load",
         "pin a drafter trained for this target (its target_layer_ids within the target's "
         "layers)", methods=("dflash", "eagle3")),
    Rule("max-model-len-supported", "error",
         "vLLM refuses a --max-model-len beyond the config's max_position_embeddings "
         "(times its rope scaling factor)",
         "lower max-model-len to what the config supports, or pin a checkpoint with rope "
         "scaling for longer contexts", facts=("serve_args",)),
    Rule("served-name-collision", "error",
         "cells of one target and engine are meant to run side by side; two models answering "
         "to one served name make clients reach the wrong model",
         "give each model its own served names (do not set served-model-name in a profile "
         "shared by several models)"),
    Rule("drafter-fits-target", "error",
         "a drafter shares the target's vocabulary and reads its hidden states: a different "
         "vocab_size or hidden_size cannot serve",
         "pin a drafter made for this target", methods=("dflash", "eagle", "eagle3")),
    Rule("metadata-missing", "warning",
         "checks that read a checkpoint's locked metadata cannot run without it",
         "run `python build.py lock --update NAME` where the Hub is reachable"),
    Rule("metadata-matches-lock", "error",
         "a stale or edited local copy of a checkpoint's files fails silently "
         "(docs/domain.md); locked/ must hold the bytes of the pinned revision",
         "re-run `python build.py lock --update NAME` and commit locked/", waivable=False),
)
BY_ID = {r.id: r for r in RULES}
# What cannot be checked without a model's / a drafter's metadata.
SKIPPED = {
    "models": ("quantization-matches-checkpoint", "vision-weights-nested",
               "max-model-len-supported", "kv-page-unify", "keep-vision-on",
               "multimodal-modalities", "no-mamba-block-size"),
    "drafters": ("dflash-target-layers", "drafter-fits-target", "kv-page-unify"),
}


@dataclass(frozen=True)
class Checkpoint:
    """A model's or drafter's locked metadata (None where absent or unknown)."""

    kind: str  # "models" | "drafters"
    name: str
    repository: str | None
    config: dict | None = None
    index: dict | None = None
    hf_quant: dict | None = None
    missing: str | None = None  # why the metadata is not available
    unresolved: bool = False  # the lock could not resolve the pin (pins.py reports it)
    corrupt: tuple[str, ...] = ()  # files whose bytes disagree with the lock
    nested_vision: tuple[str, ...] = ()  # weight_map keys of vision tensors in the wrong place

    @property
    def text(self) -> dict:
        cfg = self.config or {}
        sub = cfg.get("text_config")
        return sub if isinstance(sub, dict) else cfg

    @property
    def label(self) -> str:
        return f"{self.kind[:-1]} {self.name}" + (f" ({self.repository})" if self.repository
                                                  else "")


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class MetadataStore:
    """Loads each locked metadata file once per run (cells share models and drafters)."""

    def __init__(self, root: Path, lock: Lock | None):
        self.root, self.lock = root, lock
        self._json: dict[Path, Any] = {}
        self._cache: dict[tuple[str, str], Checkpoint] = {}

    def _read(self, path: Path) -> Any:
        if path not in self._json:
            self._json[path] = json.loads(path.read_bytes())
        return self._json[path]

    def get(self, kind: str, name: str, repository: str | None) -> Checkpoint:
        key = (kind, name)
        if key not in self._cache:
            self._cache[key] = self._load(kind, name, repository)
        return self._cache[key]

    def _load(self, kind: str, name: str, repository: str | None) -> Checkpoint:
        entry = self.lock.entry(kind, name) if self.lock else None
        base = Checkpoint(kind=kind, name=name, repository=repository)
        if entry is None:
            return _replace(base, missing=f"no entry in {LOCK_NAME}")
        if entry.get("status") != "resolved":
            # pins.py reports it once per pin, naming the checks this skips (SKIPPED)
            return _replace(base, missing=f"pin unresolved in {LOCK_NAME}", unresolved=True)
        if not entry.get("metadata"):
            return _replace(base, missing=f"{LOCK_NAME} stores no metadata files for it")
        by_name = {Path(p).name: self.root / p for p in entry["metadata"]}
        expected = {f["path"]: f for f in entry.get("files") or [] if isinstance(f, dict)}
        loaded: dict[str, Any] = {}
        corrupt = []
        for fname in (CONFIG, INDEX, HF_QUANT):
            path = by_name.get(fname)
            if path is None:
                continue
            if not path.is_file():
                return _replace(base, missing=f"{path.relative_to(self.root)} is listed in "
                                              f"{LOCK_NAME} but absent")
            want = expected.get(fname, {})
            if want and not _bytes_match(path.read_bytes(), want):
                corrupt.append(str(path.relative_to(self.root)))
            try:
                loaded[fname] = self._read(path)
            except (json.JSONDecodeError, UnicodeDecodeError):
                corrupt.append(str(path.relative_to(self.root)))
        if CONFIG not in loaded:
            return _replace(base, missing=f"the lock stores no {CONFIG}", corrupt=tuple(corrupt))
        weight_map = (loaded.get(INDEX) or {}).get("weight_map")
        nested = tuple(k for k in weight_map if k.startswith(NESTED_VISION)
                       or f".{NESTED_VISION}" in k) if isinstance(weight_map, dict) else ()
        return _replace(base, config=loaded[CONFIG], index=loaded.get(INDEX),
                        hf_quant=loaded.get(HF_QUANT), corrupt=tuple(corrupt),
                        nested_vision=nested)


def _bytes_match(data: bytes, want: dict) -> bool:
    if want.get("sha256"):  # generated-model entries
        return hashlib.sha256(data).hexdigest() == want["sha256"]
    if want.get("lfs_sha256"):
        return hashlib.sha256(data).hexdigest() == want["lfs_sha256"]
    if want.get("blob_id"):
        return _blob_id(data) == want["blob_id"]
    return True


def _replace(cp: Checkpoint, **kw: Any) -> Checkpoint:
    return replace(cp, **kw)


# --- facts read from metadata ---------------------------------------------------------------

def model_family(cp: Checkpoint) -> Family | None:
    """What the checkpoint is (architecture, traits); None without its config.json."""
    return None if cp.config is None else family(cp.config)


def quant_method(cp: Checkpoint) -> str | None:
    """The checkpoint's format: config.json quantization_config.quant_method, else a ModelOpt
    hf_quant_config.json."""
    for cfg in (cp.config or {}, cp.text):
        q = cfg.get("quantization_config")
        if isinstance(q, dict) and q.get("quant_method"):
            return str(q["quant_method"])
    producer = (cp.hf_quant or {}).get("producer") or {}
    if isinstance(producer, dict) and str(producer.get("name", "")).lower() == "modelopt":
        return "modelopt"
    return None


def _quant_family(name: str) -> str:
    n = name.lower().replace("_", "-")
    for prefix in ("modelopt", "gptq", "awq"):  # modelopt_fp4, gptq_marlin, awq_marlin ...
        if n.startswith(prefix):
            return prefix
    return n


def derived_max_len(text: dict) -> tuple[int | None, str]:
    """What vLLM derives as the longest supported context, and how."""
    found = [(k, text[k]) for k in MAX_LEN_KEYS if isinstance(text.get(k), int)]
    if not found:
        return None, "no max length in the config"
    key, length = min(found, key=lambda kv: kv[1])
    how = f"{key} {length}"
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict):
        rtype = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        if rtype not in ("su", "longrope", "llama3") and isinstance(factor, (int, float)):
            if rtype == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
                length = rope["original_max_position_embeddings"]
                how = f"original_max_position_embeddings {length}"
            length = int(length * factor)
            how += f" x {rtype} rope factor {factor}"
    return length, how


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")


def parse_len(raw: str) -> int | None:
    """--max-model-len as vLLM reads it: an integer, or 1k/1m (x1000) and 1K/1M (x1024)."""
    m = _SIZE.match(raw)
    if not m:
        return None
    unit = m.group(2)
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    return int(float(m.group(1)) * mult)


# --- per-cell checks ------------------------------------------------------------------------

def missing_metadata(v: CellView, cp: Checkpoint) -> list[Finding]:
    out = []
    if cp.missing and not cp.unresolved:
        r = BY_ID["metadata-missing"]
        out.append(r.finding(v.label, f"cannot check {', '.join(SKIPPED[cp.kind])} for "
                                        f"{cp.label}: {cp.missing}",
                             fix=r.fix.replace("NAME", cp.name),
                             where=v.lm.located.where((cp.kind, cp.name))))
    for path in cp.corrupt:
        r = BY_ID["metadata-matches-lock"]
        out.append(r.finding(v.label, f"{path} does not hold the bytes {LOCK_NAME} records "
                                        f"for {cp.label}", fix=r.fix.replace("NAME", cp.name)))
    return out


def quantization(v: CellView, cp: Checkpoint) -> list[Finding]:
    if cp.config is None:
        return []
    r = BY_ID["quantization-matches-checkpoint"]
    raw = v.flag("quantization")  # any spelling the version's parser has
    flag = raw if isinstance(raw, str) else None
    method = quant_method(cp)
    where = v.where("quantization")
    if method and flag is None:
        return [r.finding(v.label, f"the checkpoint is {method} but the serve command has no "
                                     "--quantization (vLLM guesses from config.json)",
                          severity="warning", fix=f"set quantization: {method}", where=where)]
    if method and _quant_family(flag or "") != _quant_family(method):
        src = CONFIG if (cp.config or {}).get("quantization_config") or cp.text.get(
            "quantization_config") else HF_QUANT
        return [r.finding(v.label, f"--quantization {flag} but the checkpoint's {src} says "
                                     f"{method}", fix=f"set quantization: {method}",
                          where=where)]
    if not method and flag and _quant_family(flag) not in ONLINE_QUANT:
        return [r.finding(v.label, f"--quantization {flag} but the checkpoint carries no "
                                     "quantization_config", fix="remove quantization",
                          where=where)]
    return []


def nested_vision(v: CellView, cp: Checkpoint) -> list[Finding]:
    nested = cp.nested_vision
    if not nested:
        return []
    r = BY_ID["vision-weights-nested"]
    return [r.finding(v.label, f"{len(nested)} vision tensors of {cp.label} sit under "
                                 f"language_model.visual.* (e.g. {nested[0]}); vLLM will skip "
                                 "loading them", where=v.lm.located.where((cp.kind, cp.name)))]


def max_model_len(v: CellView, cp: Checkpoint) -> list[Finding]:
    raw = v.flag("max-model-len")
    if cp.config is None or not isinstance(raw, str):
        return []
    r = BY_ID["max-model-len-supported"]
    want = parse_len(raw)
    if want is None or want < 0:
        return []  # -1/auto: vLLM fits the length itself
    limit, how = derived_max_len(cp.text)
    if limit is None or want <= limit:
        return []
    allowed = v.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    return [r.finding(v.label, f"--max-model-len {want} exceeds the {limit} that "
                                 f"{cp.label} supports ({how})"
                                 + ("; VLLM_ALLOW_LONG_MAX_MODEL_LEN lets it boot, outputs "
                                    "past that length degrade" if allowed else ""),
                      severity="warning" if allowed else None,
                      fix=f"set max-model-len: {limit} or lower", where=v.where("max-model-len"))]


def _target_layer_ids(cfg: dict) -> tuple[list | None, str]:
    for block, key in (("dflash_config", "target_layer_ids"),
                       ("eagle_config", "eagle_aux_hidden_state_layer_ids")):
        sub = cfg.get(block)
        if isinstance(sub, dict) and key in sub:
            return sub[key], f"{block}.{key}"
    if "target_layer_ids" in cfg:
        return cfg["target_layer_ids"], "target_layer_ids"
    return None, ""


def target_layers(v: CellView, model: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    if model.config is None or drafter.config is None:
        return []
    ids, key = _target_layer_ids(drafter.config)
    n = model.text.get("num_hidden_layers")
    if ids is None or not isinstance(n, int):
        return []
    r = BY_ID["dflash-target-layers"]
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n]
    if not bad:
        return []
    return [r.finding(v.label, f"{drafter.label} {key} {ids} names layer(s) {bad} outside "
                                 f"the target's {n} layers (0..{n - 1})",
                      where=v.where("speculative-config"))]


def drafter_fit(v: CellView, model: Checkpoint, drafter: Checkpoint) -> list[Finding]:
    if model.config is None or drafter.config is None:
        return []
    r = BY_ID["drafter-fits-target"]
    out = []
    for key in ("vocab_size", "hidden_size"):
        want, got = model.text.get(key), drafter.text.get(key)
        if isinstance(want, int) and isinstance(got, int) and want != got:
            out.append(r.finding(v.label, f"{drafter.label} has {key} {got}, the target "
                                            f"{model.label} has {want}",
                                 where=v.where("speculative-config")))
    return out


def check_cell(v: CellView, model: Checkpoint, drafter: Checkpoint | None) -> list[Finding]:
    out = missing_metadata(v, model)
    out += quantization(v, model) + nested_vision(v, model) + max_model_len(v, model)
    if drafter is not None:
        out += missing_metadata(v, drafter)
        if v.applies(BY_ID["dflash-target-layers"]):
            out += target_layers(v, model, drafter)
        if v.applies(BY_ID["drafter-fits-target"]):
            out += drafter_fit(v, model, drafter)
    return out


def served_name_collisions(views: list[CellView]) -> list[Finding]:
    """Cells of one target and engine run side by side: a served name must mean one model.

    Cells of the same model (other drafter or profile) are alternatives of one deployment and
    share its names by design; only different models answering to one name collide.
    """
    r = BY_ID["served-name-collision"]
    first: dict[tuple[str, str, str], CellView] = {}
    out = []
    for v in views:
        c = v.cell
        for name in flag_values(v.cmd.argv, "served-model-name"):
            key = (c.target_name, c.engine_name, name)
            other = first.setdefault(key, v)
            if other.cell.model_name != c.model_name:
                out.append(r.finding(v.label, f"served name {name!r} of model {c.model_name} is "
                                              f"also served by {other.label} (model "
                                              f"{other.cell.model_name}) on target "
                                              f"{c.target_name}, engine {c.engine_name}",
                                     where=v.where("served-model-name")))
    return out
