"""What one vLLM version's own code decides about the KV cache, read from its recorded `kv`
facts (imagebuild/facts/recorder/kv.py executed that code): the dtypes it takes, the page
each attention layer kind takes per token and KV head (for the backend that runs it, where
the version lets the backend pack the cache: 0.32's customize_spec), the block a
sliding-window layer picks, the kernel block sizes of each backend, and what
`unify_kv_cache_spec_page_size` does with a page that differs from the largest (scale the
block, pad the page, or raise), from the stock code or, for an engine whose patches change
that function, from the patched code (recorded with `facts record --patch`).

Nothing here is typed per version: a version recorded tomorrow gets its own model. What a
version's facts do not say is CannotPredict, never another version's answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebuild.facts import VllmFacts, patch_key, record_command
from imagebuild.facts.record import touches
from imagebuild.preflight.kv.errors import CannotPredict
from imagebuild.spec.values import in_range

# the page of these dtypes holds plain elements (no scales, no packing); a backend that
# was not recorded is assumed to store them plainly only when every recorded one does
KINDS = ("full", "sliding", "mla")
# vLLM's own names (AttentionBackendEnum) for the backend names serve flags use
LAYER = "<layer>"


def _upper(backend: str | None) -> str | None:
    return backend.upper() if backend else None


@dataclass(frozen=True)
class KVModel:
    version: str
    kv: dict[str, Any] = field(repr=False)
    unify: dict[str, Any] = field(repr=False)
    unify_from: str  # "stock vLLM X" or "vLLM X with <patches>"
    facts_where: str = ""

    @classmethod
    def of(cls, facts: VllmFacts | None, version: str,
           patches: Iterable[Path] = ()) -> KVModel:
        """The model of `version` from its facts, with the unification of the engine's
        patches; CannotPredict when the facts do not hold it."""
        if facts is None:
            raise CannotPredict(f"no recorded facts for vLLM {version}: "
                                f"{record_command(version)}")
        kv = facts.kv
        if kv is None:
            raise CannotPredict(facts.missing("kv"))
        series = [Path(p) for p in patches if Path(p).is_file() and touches(Path(p))]
        unify, source = kv["unify"], f"stock vLLM {facts.version}"
        if series:
            names = ", ".join(p.name for p in series)
            patched = facts.patched_unify(patch_key(series))
            if patched is None:
                raise CannotPredict(
                    f"the engine's patches ({names}) change vLLM's page-size unification "
                    f"(vllm/v1/core/kv_cache_utils.py), and vLLM {facts.version}'s facts hold "
                    "no recording of the patched code: record it with `python build.py facts "
                    "record --python <vLLM venv python> " + " ".join(
                        f"--patch patches/{p.name}" for p in series) + "`")
            unify, source = patched["unify"], f"vLLM {facts.version} with {names}"
        return cls(facts.version, kv, unify, source, facts.where)

    # --- versions of behaviour read (not executed) from code ------------------------------
    def within(self, spec: str) -> bool:
        return in_range(self.version, spec)

    def has_class(self, name: str) -> bool:
        return name in (self.kv.get("spec_classes") or {})

    # --- dtypes ------------------------------------------------------------------------------
    @property
    def cache_dtypes(self) -> list[str]:
        return list(self.kv.get("cache_dtypes") or [])

    @property
    def mamba_dtypes(self) -> list[str]:
        return list(self.kv.get("mamba_dtypes") or [])

    @property
    def mamba_cache_modes(self) -> list[str]:
        return list(self.kv.get("mamba_cache_modes") or [])

    def storage(self, dtype: str) -> str:
        found = (self.kv.get("storage") or {}).get(dtype)
        if found is None:
            raise CannotPredict(f"vLLM {self.version}'s facts give no storage dtype for "
                                f"{dtype!r}")
        return found

    def quant_mode(self, dtype: str) -> str:
        return (self.kv.get("quant_mode") or {}).get(dtype, "NONE")

    # --- pages -------------------------------------------------------------------------------
    @property
    def backend_decides(self) -> bool:
        """The backend hands back the layer's spec (customize_spec): it is an input."""
        return bool(self.kv.get("customize_spec"))

    def _entry(self, kind: str, column: str, dtype_key: str, head: int) -> int | None:
        table = ((self.kv.get("pages") or {}).get(kind) or {}).get(column) or {}
        entry = table.get(dtype_key)
        if entry is None:
            return None
        if "raises" in entry:
            raise CannotPredict(f"vLLM {self.version}'s {kind} attention layer refuses "
                                f"{dtype_key} on {column}: {entry['raises']}")
        if "per_dim" in entry:
            value = entry["per_dim"] * head + entry["constant"]
        else:
            one = (entry.get("by_head_size") or {}).get(str(head))
            if one is None:
                raise CannotPredict(f"vLLM {self.version}'s page of {dtype_key} is recorded "
                                    f"for other head sizes than {head}")
            if "raises" in one:
                raise CannotPredict(f"vLLM {self.version}'s {kind} attention layer refuses "
                                    f"{dtype_key} at head size {head}: {one['raises']}")
            value = one["bytes"]
        if value != int(value):
            raise CannotPredict(f"vLLM {self.version}'s page of {dtype_key} at head size "
                                f"{head} is not a whole number of bytes per token")
        return int(value)

    def per_token_head(self, kind: str, backend: str | None, dtype: str, model_dtype: str,
                       head: int) -> int:
        """Bytes one token takes per KV head (per layer, for MLA) in the layer's page."""
        key = f"auto:{model_dtype}" if dtype == "auto" else dtype
        columns = ((self.kv.get("pages") or {}).get(kind) or {})
        if not self.backend_decides:
            got = self._entry(kind, "layer", key, head)
            if got is None:
                raise CannotPredict(f"vLLM {self.version}'s facts hold no {kind} page for "
                                    f"{key}")
            return got
        name = _upper(backend)
        if name is not None and name in columns:
            got = self._entry(kind, name, key, head)
            if got is not None:
                return got
        # the backend was not recorded (not importable where the facts were recorded) or
        # not named: only a page every recorded backend agrees on is certain
        seen = {got for c in columns if c != "layer"
                if (got := self._entry(kind, c, key, head)) is not None}
        if len(seen) == 1:
            return seen.pop()
        said = (f"backend {backend} was not recorded" if backend else
                "no --attention-backend is given")
        raise CannotPredict(
            f"on vLLM {self.version} the attention backend decides the KV page of {key} "
            f"(customize_spec) and its recorded backends disagree; {said}: name the backend "
            "with --attention-backend (one the facts record) to predict the layout")

    def page(self, kind: str, backend: str | None, dtype: str, model_dtype: str, heads: int,
             head: int, block: int) -> int:
        """page_size_bytes of the layer's spec at `block` tokens."""
        per = self.per_token_head(kind, backend, dtype, model_dtype, head)
        return per * block * (1 if kind == "mla" else heads)

    def sliding_block(self, backend: str | None, block: int) -> int:
        """The block size the version's sliding-window layer takes when `block` is asked
        (0.32: the backend's largest kernel block within the page; 0.23: `block`)."""
        table = self.kv.get("sliding_block_size") or {}
        rows = [table[c] for c in ([_upper(backend)] if _upper(backend) in table else table)
                if isinstance(table.get(c), dict)]
        answers = set()
        for row in rows:
            got = row.get(str(block))
            if isinstance(got, int):
                answers.add(got)
            elif got is None:  # not on the recorded grid: follows the block when all did
                if all(isinstance(v, int) and v == int(k) for k, v in row.items()):
                    answers.add(block)
                else:
                    answers.add(-1)
        answers.discard(-1)
        if len(answers) != 1:
            raise CannotPredict(f"the block size vLLM {self.version}'s sliding-window layers "
                                f"take for block {block} on "
                                f"{backend or 'an unnamed backend'} is not recorded")
        return answers.pop()

    def kernel_sizes(self, backend: str | None) -> list[Any] | None:
        """The backend's supported kernel block sizes (ints, {"multiple_of": n}) or None."""
        entry = (self.kv.get("kernel_block_sizes") or {}).get(_upper(backend) or "")
        return None if entry is None or "sizes" not in entry else list(entry["sizes"])

    def kernel_min(self, backend: str | None) -> int | None:
        sizes = self.kernel_sizes(backend)
        if not sizes:
            return None
        return min(s if isinstance(s, int) else s["multiple_of"] for s in sizes)

    # --- unification ------------------------------------------------------------------------
    def does(self, situation: str, backend: str | None = None) -> dict[str, Any]:
        """What unify does in `situation` (a recorded probe) for a layer on `backend`:
        where the version pads an attention page only for a backend that indexes KV pages
        by block stride (0.28: `<probe>_by_block_stride` recorded beside the probe), the
        backend's recorded answer picks one."""
        found = self.unify.get(situation)
        if found is None:
            raise CannotPredict(f"how vLLM {self.version} unifies a {situation} page is not "
                                "recorded")
        strided = self.unify.get(f"{situation}_by_block_stride")
        if strided is None or strided.get("does") == found.get("does"):
            return found
        stride = (self.kv.get("block_stride_backends") or {}).get(_upper(backend) or "")
        if stride is None:
            raise CannotPredict(
                f"vLLM {self.version} pads a {situation} page only when the attention "
                "backend indexes KV pages by block stride, and whether "
                f"{_upper(backend) or 'the backend it picks'} does is not recorded: name "
                "one with --attention-backend (recorded: "
                f"{', '.join(sorted(self.kv.get('block_stride_backends') or {}))})")
        return strided if stride else found
