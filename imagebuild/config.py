"""matrix.yaml schema: typed, immutable, strict (unknown keys are errors).

Every error is reported with file:line:column (see yamlpos) by `load_matrix`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import UserError
from .yamlpos import Located, load_located

HEX_PIN = re.compile(r"^[0-9a-f]{7,40}$")
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

Name = Annotated[str, StringConstraints(pattern=NAME.pattern, max_length=63)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_pin(value: str, what: str) -> str:
    """A pin is a commit SHA (>= 7 hex; lock expands short ones), never a branch or tag."""
    if not HEX_PIN.match(value):
        raise ValueError(
            f"{what} {value!r} is not a commit SHA (7-40 lowercase hex); branch or tag names "
            "move. Put the branch under `track:` instead and run `build.py lock --update NAME`"
        )
    return value


class BenchSettings(Strict):
    """How the whole job (and `build.py bench --tag`) measures a target's images."""

    concurrency: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    requests: int = Field(default=32, ge=1)  # per level
    max_tokens: int = Field(default=128, ge=2)
    prompts: str = "structured,prose"
    # overrides publish.regression_threshold: shared CPU hosts are noisier than a GB10
    regression_threshold: float | None = Field(default=None, ge=0, le=1)


SIZE = re.compile(r"^[1-9][0-9]*[KMGT]$")  # ccache / sccache size syntax: 40G


class SharedCompileCache(Strict):
    """A compile cache every runner of the target reads and fills (sccache). Endpoints and
    buckets live here; credentials only reach builds as the BuildKit secret sccache_env
    (README: compile cache)."""

    backend: Literal["redis", "s3"]
    endpoint: str | None = None  # redis://host:6379/0 (redis); an S3-compatible URL (s3)
    bucket: str | None = None  # s3 only
    region: str | None = None  # s3 only
    key_prefix: str = "imagebuild"  # one cache can serve several targets or projects

    @model_validator(mode="after")
    def _complete(self) -> SharedCompileCache:
        if self.backend == "redis" and not (self.endpoint or "").startswith(
                ("redis://", "rediss://")):
            raise ValueError("a redis backend needs `endpoint: redis://host:port[/db]`")
        if self.backend == "redis" and (self.bucket or self.region):
            raise ValueError("`bucket`/`region` belong to an s3 backend")
        if self.backend == "s3" and not self.bucket:
            raise ValueError("an s3 backend needs `bucket`")
        if self.endpoint and "@" in self.endpoint.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError("credentials do not belong in `endpoint`: pass them as the "
                             "sccache_env build secret (README: compile cache)")
        return self


class CompileCache(Strict):
    # cap of the local ccache (no shared backend) or sccache directory, per runner
    local_max_size: Annotated[str, StringConstraints(pattern=SIZE.pattern)] = "50G"
    shared: SharedCompileCache | None = None  # None: local ccache only


class Target(Strict):
    platform: Literal["linux/arm64", "linux/amd64"]
    description: str
    base_image: str
    runtime_image: str | None = None
    bootstrap: dict[str, str] | None = None  # cpu: debootstrap suite/mirror when no pull works
    engine_from: Literal["source", "wheel"]
    build_args: dict[str, str] = Field(default_factory=dict)
    max_jobs: int | Literal["auto"] = "auto"
    nvcc_threads: int | None = None
    # an extra package index for the engine build's pip, beside the runner's own pip
    # configuration (which the build receives as the pip_conf secret)
    torch_index: str | None = None
    compile_cache: CompileCache = Field(default_factory=CompileCache)
    expect_cuda_arch: str | None = None
    runner: list[str] = Field(min_length=1)
    gpu: bool = False
    smoke_concurrency: list[int] = Field(min_length=1)
    boot_timeout_s: int = Field(gt=0)
    memory_limit: str
    bench: BenchSettings | None = None  # None: the whole job does not bench this target

    @model_validator(mode="after")
    def _source_needs_toolchain(self) -> Target:
        if self.engine_from == "source" and not (self.runtime_image and self.expect_cuda_arch):
            raise ValueError("a source-built target needs runtime_image and expect_cuda_arch")
        if self.engine_from == "wheel" and self.expect_cuda_arch:
            raise ValueError("expect_cuda_arch only applies to source-built (CUDA) targets")
        return self


class SourcePin(Strict):
    repository: str
    commit: str

    _pin = field_validator("commit")(lambda v: _check_pin(v, "commit"))


class WheelPin(Strict):
    package: str
    version: str
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]  # --require-hashes
    requirements: str  # pinned requirement set installed before the wheel (--no-deps)


class EngineRealization(Strict):
    source: SourcePin | None = None
    wheel: WheelPin | None = None
    patches: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_origin(self) -> EngineRealization:
        if (self.source is None) == (self.wheel is None):
            raise ValueError("give exactly one of `source` (git pin) or `wheel`")
        return self


class Engine(Strict):
    vllm_version: str
    description: str
    note: str | None = None
    realize: dict[Name, EngineRealization] = Field(min_length=1)


class HubPin(Strict):
    """A Hub repository at a commit (`revision`) or a branch that `lock` resolves (`track`)."""

    repository: str | None = None
    revision: str | None = None
    track: str | None = None

    @field_validator("revision")
    @classmethod
    def _revision_is_sha(cls, v: str | None) -> str | None:
        return None if v is None else _check_pin(v, "revision")

    @model_validator(mode="after")
    def _revision_or_track(self) -> HubPin:
        if self.repository and (self.revision is None) == (self.track is None):
            raise ValueError("give exactly one of `revision` (a commit SHA) or `track` (a branch)")
        if not self.repository and (self.revision or self.track):
            raise ValueError("`revision`/`track` need a `repository`")
        return self


class Generated(Strict):
    script: str
    seed: int = 0


class Model(HubPin):
    description: str
    generate: Generated | None = None
    quantization: str | None = None  # --quantization; must match config quant_method
    served_names: list[Name] = Field(min_length=1)
    multimodal: dict[str, int] | None = None  # --limit-mm-per-prompt; None = text only
    targets: list[Name] = Field(min_length=1)

    @model_validator(mode="after")
    def _hub_or_generated(self) -> Model:
        if (self.repository is None) == (self.generate is None):
            raise ValueError("give exactly one of `repository` (a Hub model) or `generate`")
        return self


class Drafter(HubPin):
    method: Literal["dflash", "mtp", "eagle", "eagle3", "ngram"]
    description: str
    num_speculative_tokens: int = Field(ge=1, le=32)
    options: dict[str, Any] = Field(default_factory=dict)  # extra speculative-config keys
    targets: list[Name] = Field(min_length=1)

    @model_validator(mode="after")
    def _model_when_needed(self) -> Drafter:
        needs_model = self.method in ("dflash", "eagle", "eagle3")
        if needs_model and not self.repository:
            raise ValueError(f"method {self.method} needs a drafter `repository`")
        if not needs_model and self.repository:
            raise ValueError(f"method {self.method} uses no drafter model; remove `repository`")
        return self


class Profile(Strict):
    description: str
    target: Name
    methods: list[Literal["dflash", "mtp", "eagle", "eagle3", "ngram"]] = Field(min_length=1)
    port: int = Field(default=8000, ge=1, le=65535)
    args: dict[str, str | int | float | bool | dict[str, Any]] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    acceptance_floor: float = Field(ge=0, le=1)
    reasoning: bool = True
    tools: bool = True


class Waiver(Strict):
    rule: str
    reason: Annotated[str, StringConstraints(min_length=10)]


class Include(Strict):
    engine: Name | None = None
    model: Name | None = None
    drafter: Name | None = None
    profile: Name | None = None


class Axes(Strict):
    engine: list[Name] = Field(min_length=1)
    model: list[Name] = Field(min_length=1)
    drafter: list[Name] = Field(min_length=1)
    profile: list[Name] = Field(min_length=1)
    include: list[Include] = Field(default_factory=list)
    exclude: list[Include] = Field(default_factory=list)


class ImageFamily(Strict):
    description: str
    target: Name
    name: str = "{family}-{model}-{drafter}"  # image repository name per cell
    matrix: Axes
    waivers: list[Waiver] = Field(default_factory=list)


class Publish(Strict):
    registry: str
    namespace: Name
    regression_threshold: float = Field(default=0.05, ge=0, le=1)


class Matrix(Strict):
    schema_version: Literal[1] = Field(alias="schema")
    publish: Publish
    targets: dict[Name, Target] = Field(min_length=1)
    engines: dict[Name, Engine] = Field(min_length=1)
    models: dict[Name, Model] = Field(min_length=1)
    drafters: dict[Name, Drafter] = Field(min_length=1)
    profiles: dict[Name, Profile] = Field(min_length=1)
    images: dict[Name, ImageFamily] = Field(min_length=1)


def _fix_for(err: Any) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "remove the key or correct its spelling (see the matrix.yaml reference in README)"
    if kind == "missing":
        return "add the field"
    if kind in ("literal_error", "enum"):
        return "use one of the allowed values"
    if kind == "string_pattern_mismatch":
        return "use lowercase letters, digits, '.', '_' or '-' (start with a letter or digit)"
    return "correct the value"


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    found = err.get("input")
    shown = "" if err["type"] == "missing" or isinstance(found, dict) else f"; found {found!r}"
    return f"{loc}: {err['msg']}{shown}"


def validate(located: Located) -> Matrix:
    try:
        return Matrix.model_validate(located.data)
    except ValidationError as exc:
        # a misspelt key shows up as "extra" plus "missing": lead with the misspelling
        errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden",
                                                     e["type"] == "missing"))
        first = errors[0]
        loc = tuple(first["loc"])
        lines = [f"{located.where(tuple(e['loc']))}: {_describe(e)}" for e in errors[1:6]]
        more = "\n".join(["also:"] + lines) if lines else ""
        message = _describe(first) + (f"\n{more}" if more else "")
        raise UserError(message, fix=_fix_for(first), where=located.where(loc)) from None


def load_matrix(path: Path, display: str | None = None) -> tuple[Matrix, Located]:
    located = load_located(path, display)
    if not isinstance(located.data, dict):
        raise UserError("matrix.yaml must be a mapping", fix="see the README reference",
                        where=located.file)
    return validate(located), located


FULL_SHA_RE = FULL_SHA
