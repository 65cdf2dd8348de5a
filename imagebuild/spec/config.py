"""matrix.yaml schema: typed, immutable, strict (unknown keys are errors).

Every error is reported with file:line:column (see yamlpos) by `load_matrix`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from imagebuild.errors import UserError
from imagebuild.spec import schemahint as sh
from imagebuild.spec.gates import GateSettings
from imagebuild.spec.names import (
    NAME_MAX,
    PATH_JSON,
    REFERENCE_JSON,
    REGISTRY_JSON,
    check_path,
    check_reference,
    check_registry,
)
from imagebuild.spec.profiles import resolve_extends
from imagebuild.spec.repopaths import RELATIVE_JSON, check_relative
from imagebuild.spec.schemaerrors import invalid
from imagebuild.spec.schemahint import Schema
from imagebuild.spec.values import (
    BRANCH_JSON,
    BUILD_PY_ARGS,
    ENV_NAME_JSON,
    GIT_URL_JSON,
    HUB_REPO_JSON,
    MEMORY_JSON,
    MIRROR_JSON,
    PACKAGE_JSON,
    PEP440_JSON,
    BadValue,
    branch_name,
    build_arg_name,
    env_name,
    git_url,
    hub_repository,
    in_range,
    memory_bytes,
    mirror_url,
    package_name,
    pep440,
    version_range,
)
from imagebuild.spec.yamlpos import Located, load_located

HEX_PIN = re.compile(r"^[0-9a-f]{7,40}\Z")
FULL_SHA = re.compile(r"^[0-9a-f]{40}\Z")
CAPABILITY = re.compile(r"^[0-9]{1,2}\.[0-9]\Z")
CUDA_ARCH = re.compile(r"^sm_([0-9]{1,2})([0-9])[af]?\Z")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # pydantic (Rust regex): $ is the very end

Name = Annotated[str, StringConstraints(pattern=NAME.pattern, max_length=63)]

# Values users get wrong, checked where they are written (the BadValue's fix is shown).
# Ranges are sanity bounds: far outside them a value is a typo, not a setting.
Concurrency = Annotated[int, Field(ge=1, le=4096)]
# (Schema: the same grammar in the JSON Schema, for editors; the function is the rule)
ImageRef = Annotated[str, AfterValidator(lambda v: check_reference(v, "image")),
                     Schema(pattern=REFERENCE_JSON)]
RegistryHost = Annotated[str, AfterValidator(check_registry),
                         Schema(pattern=REGISTRY_JSON, maxLength=NAME_MAX)]
Namespace = Annotated[str, AfterValidator(check_path), Schema(pattern=PATH_JSON,
                                                              maxLength=NAME_MAX)]
MemorySize = Annotated[str, AfterValidator(lambda v: memory_bytes(v) and v),
                       Schema(pattern=MEMORY_JSON)]
PEP440 = Annotated[str, AfterValidator(pep440), Schema(pattern=PEP440_JSON)]
VersionRange = Annotated[str, AfterValidator(version_range)]
EnvName = Annotated[str, AfterValidator(env_name), Schema(pattern=ENV_NAME_JSON)]
BuildArgName = Annotated[str, AfterValidator(build_arg_name),
                         Schema(pattern=ENV_NAME_JSON, **{"not": {"enum": list(BUILD_PY_ARGS)}})]
HubRepository = Annotated[str, AfterValidator(hub_repository), Schema(pattern=HUB_REPO_JSON)]
# one word of printable ASCII, no quotes: endpoints, buckets, prefixes
Word = Annotated[str, StringConstraints(pattern=r"^[!#-&(-~]+$", max_length=500)]


def _repo_file(what: str) -> Any:
    return AfterValidator(lambda v: check_relative(v, what))


RepoFile = Schema(pattern=RELATIVE_JSON)


def _full_sha(value: str) -> str:
    if not FULL_SHA.match(value):
        raise BadValue(f"commit {value!r} is not a commit SHA (a source pin is all 40 "
                       "lowercase hex characters)",
                       "write the whole 40-character commit SHA (`git rev-parse <ref>`); "
                       "branch and tag names move, short SHAs can become ambiguous")
    return value


class Strict(BaseModel):
    # strict: no silent coercion (YAML's `yes` is not the number 1, "300" not 300)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              use_attribute_docstrings=True)  # field docs: schema, reference


def _check_pin(value: str, what: str) -> str:
    """A pin is a commit SHA (>= 7 hex; lock expands short ones), never a branch or tag."""
    if not HEX_PIN.match(value):
        raise BadValue(
            f"{what} {value!r} is not a commit SHA (7-40 lowercase hex); branch or tag names "
            "move", "write the commit SHA, or put the branch under `track:` instead and run "
            "`build.py lock --update NAME`")
    return value


class BenchSettings(Strict):
    """How the whole job (and `build.py bench --tag`) measures a target's images."""

    concurrency: list[Concurrency] = Field(min_length=1)
    """Concurrency levels measured, in order (requests in flight at once)."""
    requests: int = Field(default=32, ge=1, le=100_000)  # per level
    """Requests sent per concurrency level."""
    max_tokens: int = Field(default=128, ge=2, le=1 << 20)
    """Output tokens per request (fixed with ignore_eos, so every run does the same work)."""
    prompts: str = "structured,prose"
    """Prompt sets: built-in names (structured, prose), comma-separated."""
    # overrides publish.regression_threshold: shared CPU hosts are noisier than a GB10
    regression_threshold: float | None = Field(default=None, ge=0, le=1)
    """Overrides publish.regression_threshold for this target (shared CPU hosts are noisier
    than a GB10)."""
    acceptance_threshold: float | None = Field(default=None, ge=0, le=1)
    """Overrides publish.acceptance_threshold for this target: the relative drop in
    speculative acceptance (rate or mean accepted length, per concurrency level) that keeps
    a release from latest."""
    plain_baseline: bool = True
    """Also bench each speculating image without --speculative-config (one more boot per
    cell), so the advice in the notes and the table can say whether its drafter beats
    plain serving at each level."""
    tie_margin: float = Field(default=0.05, ge=0, le=1)
    """The advice calls a level's winner a tie when it beats the runner-up by less than
    this fraction: how much back-to-back benches of one image differ on this target."""


# What serves a speculative method needs, and the word for none (plain serving).
SpecMethod = Literal["dflash", "mtp", "eagle", "eagle3", "ngram"]
NO_SPECULATION = "none"
Method = Literal["none", "dflash", "mtp", "eagle", "eagle3", "ngram"]


def _capability(value: str | float) -> str:
    """A CUDA compute capability as nvidia-smi prints it ("12.1"); an unquoted 12.1 is
    read the same (no capability has a two-digit minor, so the float is unambiguous)."""
    text = f"{value:.1f}" if isinstance(value, float) else str(value)
    if isinstance(value, bool) or not CAPABILITY.match(text):
        raise BadValue(f"compute capability {value!r} is not MAJOR.MINOR",
                       "write it as nvidia-smi --query-gpu=compute_cap shows it, e.g. "
                       "\"12.1\" (GB10), \"12.0\" (RTX 5090), \"9.0\" (H100)")
    return text


# a float is printed with one decimal, so only its range is said (12.1, not 121.0)
ComputeCapability = Annotated[
    Annotated[str, Schema(pattern=sh.pattern_of(CAPABILITY))]
    | Annotated[float, Schema(exclusiveMinimum=0, maximum=99.94)],
    AfterValidator(_capability)]


SIZE = re.compile(r"^[1-9][0-9]*[KMGT]$")  # ccache / sccache size syntax: 40G


# user:password@ in an endpoint's host part
CREDENTIALS_JSON = r"^(?:(?:(?!://).)*://)?[^/]*@"


class SharedCompileCache(Strict):
    """A compile cache every runner of the target reads and fills (sccache). Endpoints and
    buckets live here; credentials only reach builds as the BuildKit secret sccache_env
    (README: compile cache)."""

    backend: Literal["redis", "s3"]
    """Where the shared sccache lives."""
    endpoint: Word | None = None  # redis://host:6379/0 (redis); an S3-compatible URL (s3)
    """redis://host:6379/0 for redis; an S3-compatible URL for s3. No credentials (they reach
    builds as the sccache_env build secret)."""
    bucket: Word | None = None  # s3 only
    """s3 only: the bucket."""
    region: Word | None = None  # s3 only
    """s3 only: the bucket's region."""
    key_prefix: Word = "imagebuild"  # one cache can serve several targets or projects
    """Prefix of every cache key, so one cache can serve several targets or projects."""

    # _endpoint_of_backend and _complete, for the JSON Schema
    model_config = ConfigDict(json_schema_extra=sh.rules(
        {"if": sh.equals("backend", "redis"),
         "then": {"allOf": [sh.given("endpoint"),
                            {"properties": {"endpoint": {"pattern": "^rediss?://"}}},
                            sh.absent("bucket"), sh.absent("region")]}},
        {"if": sh.equals("backend", "s3"), "then": sh.given("bucket")},
        {"not": {"properties": {"endpoint": {"type": "string", "pattern": CREDENTIALS_JSON}},
                 "required": ["endpoint"]}}))

    @field_validator("endpoint")
    @classmethod
    def _endpoint_of_backend(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("backend") == "redis" and not (v or "").startswith(
                ("redis://", "rediss://")):
            raise BadValue(f"endpoint {v!r} is not a redis URL",
                           "write `endpoint: redis://host:port[/db]` for a redis backend")
        return v

    @model_validator(mode="after")
    def _complete(self) -> SharedCompileCache:
        if self.backend == "redis" and not self.endpoint:
            raise BadValue("a redis backend needs an endpoint",
                           "add `endpoint: redis://host:port[/db]`")
        if self.backend == "redis" and (self.bucket or self.region):
            raise BadValue("`bucket`/`region` belong to an s3 backend",
                           "remove them, or set `backend: s3`")
        if self.backend == "s3" and not self.bucket:
            raise BadValue("an s3 backend needs `bucket`", "add `bucket: NAME` (and `region`, "
                           "and `endpoint` for a store other than AWS)")
        if self.endpoint and "@" in self.endpoint.split("://", 1)[-1].split("/", 1)[0]:
            raise BadValue("credentials do not belong in `endpoint`",
                           "remove user:password@ and pass them as the sccache_env build "
                           "secret (README: compile cache)")
        return self


class Bootstrap(Strict):
    """Bootstrap the base image (no registry to pull from): the Debian suite, and the
    mirror (else IMAGEBUILD_DEBIAN_MIRROR, else the host's apt sources)."""

    suite: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,30}$")]
    """Debian suite to bootstrap (mmdebstrap or debootstrap), e.g. trixie."""
    mirror: Annotated[str, AfterValidator(mirror_url), Schema(pattern=MIRROR_JSON)] | None = None
    """Debian mirror URL (else IMAGEBUILD_DEBIAN_MIRROR, else the host's apt sources)."""

    def settings(self) -> dict[str, str]:
        """As the lock records them."""
        return self.model_dump(exclude_none=True)


class CompileCache(Strict):
    # cap of the local ccache (no shared backend) or sccache directory, per runner
    local_max_size: Annotated[str, StringConstraints(pattern=SIZE.pattern)] = "50G"
    """Cap of the local ccache or sccache directory per runner (ccache size syntax: 40G)."""
    shared: SharedCompileCache | None = None  # None: local ccache only
    """A compile cache every runner of the target reads and fills; none: local cache only."""


# a Linux network interface name (IFNAMSIZ: 15 characters), as NCCL/Gloo take it
IfName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}$")]
# set from `interfaces`, so never written in `env` too
SOCKET_IFNAME_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


class Interconnect(Strict):
    """How the nodes of a multi-node cell reach each other (docs/multi-node.md): the NICs
    NCCL and Gloo use and the NCCL/IB settings, as data. Containers use the host's network
    (compose `network_mode: host`), so rendered files name the host's interfaces."""

    interfaces: list[IfName] = Field(default_factory=list)
    """Network interface names every node uses for the collective traffic, e.g. the
    ConnectX port's enp1s0f1np1 (they become NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME)."""
    env: dict[EnvName, str] = Field(default_factory=dict, json_schema_extra={
        "not": {"anyOf": [{"required": [k]} for k in SOCKET_IFNAME_ENV]}})
    """NCCL/IB settings of every node, e.g. NCCL_IB_HCA: rocep1s0f1,roceP2p1s0f1 (the
    ConnectX ports), NCCL_IB_DISABLE: "0"."""
    hosts_network: Literal["host"] = "host"
    """The containers' network: always the host's (NCCL and Gloo bind the host's NICs)."""

    @field_validator("env")
    @classmethod
    def _ifname_from_interfaces(cls, v: dict[str, str]) -> dict[str, str]:
        both = [k for k in SOCKET_IFNAME_ENV if k in v]
        if both:
            raise BadValue(f"{', '.join(both)} is set from `interfaces`",
                           "list the NICs under interconnect.interfaces instead")
        return v


class Target(Strict):
    """A machine class images are built for and served on, described by what it is: the
    rules, the runner, the disk estimate and host detection read these properties, never
    the target's name (spec/hardware.py)."""

    platform: Literal["linux/arm64", "linux/amd64"]
    """Docker platform of the images."""
    description: str
    """What the machine is, in words (plan and release notes show it)."""
    # what runs the model: an NVIDIA GPU through CUDA, or the CPU engine
    accelerator: Literal["cuda", "cpu"] = "cpu"
    """What runs the model: an NVIDIA GPU through CUDA, or the CPU engine. Replaces the former
    `gpu: true/false`."""
    compute_capability: ComputeCapability | None = None  # cuda: the GPU's, e.g. "12.1"
    """cuda: the GPU's compute capability as nvidia-smi prints it, e.g. "12.1" (GB10)."""
    unified_memory: bool = False  # the GPU shares the host's memory (GB10)
    """The GPU shares the host's memory (GB10)."""
    base_image: ImageRef
    """Image the base stage starts from."""
    runtime_image: ImageRef | None = None
    """Source builds: the slim image the engine is installed into."""
    bootstrap: Bootstrap | None = None  # cpu: bootstrap the base when no pull works
    """cpu: bootstrap the base image from the Debian archive when no pull works."""
    engine_from: Literal["source", "wheel"]
    """source: compile vLLM (cuda targets); wheel: install vLLM's CPU wheel."""
    build_args: dict[BuildArgName, str] = Field(default_factory=dict)
    """Extra Docker build arguments of the engine build."""
    max_jobs: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = "auto"
    """Parallel compile jobs of a source build (auto: from the runner's cores and memory)."""
    nvcc_threads: Annotated[int, Field(ge=1, le=64)] | None = None
    """nvcc --threads per compile job of a source build."""
    # gone: package indexes come from the runner's pip configuration (README: package
    # indexes); kept as a field only to answer an old matrix with the way to do it now
    torch_index: Annotated[Any, AfterValidator(_no_torch_index)] = None
    """Removed: package indexes come from the runner's pip configuration. Any value is refused
    with the way to do it now."""
    compile_cache: CompileCache = Field(default_factory=CompileCache)
    """Compiler cache of source builds."""
    # checked against compute_capability (declared first)
    expect_cuda_arch: Annotated[str, Schema(pattern=sh.pattern_of(CUDA_ARCH))] | None = None
    """Source builds: the CUDA arch the built engine must contain, e.g. sm_121a (checked
    against compute_capability)."""
    runner: list[str] | None = Field(default=None, min_length=1)  # None: from the properties
    """GitHub runner labels of this target's jobs (default: derived from the target's
    properties)."""
    smoke_concurrency: list[Concurrency] = Field(min_length=1)
    """Concurrency levels the smoke test sends at once."""
    boot_timeout_s: int = Field(ge=10, le=86400)
    """Seconds a server may take to become ready in smoke and bench."""
    memory_limit: MemorySize
    """Memory limit of the serving container (docker --memory syntax, e.g. 100g)."""
    memory: MemorySize | None = None
    """The machine's memory as vLLM reads it (unified memory: the host's RAM the GPU
    shares, e.g. 128g on GB10); the memory rule's budget is gpu-memory-utilization x this
    (default: memory_limit)."""
    host_reserve: MemorySize | None = None
    """Unified memory: what the host's OS must keep beyond vLLM's share and its API
    processes, or the machine wedges instead of killing the server (preflight/memory.py)."""
    bench: BenchSettings | None = None  # None: the whole job does not bench this target
    """How the whole job benchmarks this target's images; none: not benchmarked."""
    gates: GateSettings = Field(default_factory=GateSettings)
    """The release gates' thresholds: losslessness and long generation (defaults:
    docs/release-gates.md)."""
    interconnect: Interconnect | None = None
    """How this target's machines reach each other when a cell spans several (multi-node
    tensor parallelism); none: single-node cells only (preflight refuses a multi-node one)."""

    # _fields_of_its_kind, for the JSON Schema (accelerator defaults to cpu)
    model_config = ConfigDict(json_schema_extra=sh.rules(
        {"if": sh.equals("accelerator", "cuda"), "then": sh.given("compute_capability"),
         "else": {"allOf": [sh.absent("compute_capability"),
                            {"not": sh.equals("unified_memory", True)}]}},
        {"if": sh.equals("engine_from", "source"),
         "then": {"allOf": [sh.equals("accelerator", "cuda"), sh.given("runtime_image"),
                            sh.given("expect_cuda_arch")]}},
        {"if": sh.equals("engine_from", "wheel"),
         "then": {"allOf": [{"not": sh.equals("accelerator", "cuda")},
                            sh.absent("expect_cuda_arch")]}}))

    @property
    def gpu(self) -> bool:
        return self.accelerator == "cuda"

    @field_validator("expect_cuda_arch")
    @classmethod
    def _arch_of_the_gpu(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            _arch_matches(v, info.data.get("compute_capability"))
        return v

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> Target:
        """Each kind of target has what it needs to render and run (never `FROM None`)."""
        cuda = self.accelerator == "cuda"
        if cuda and self.compute_capability is None:
            raise BadValue("a cuda target needs compute_capability (rules, runner and host "
                           "detection read it)",
                           "add compute_capability as nvidia-smi --query-gpu=compute_cap "
                           "shows it on the target machine, e.g. \"12.1\" for GB10")
        if not cuda and (self.compute_capability is not None or self.unified_memory):
            raise BadValue("compute_capability and unified_memory describe a GPU, but this "
                           "target's accelerator is cpu",
                           "set accelerator: cuda, or remove the GPU properties")
        if self.engine_from == "source":
            missing = [name for name in SOURCE_NEEDS if getattr(self, name) is None]
            if missing or not cuda:
                raise BadValue(
                    "a source-built target compiles vLLM for CUDA: it needs accelerator: "
                    f"cuda and {', '.join(SOURCE_NEEDS)}"
                    + (f" (missing: {', '.join(missing)})" if missing else ""),
                    "add " + ", ".join(missing or ["accelerator: cuda"]) + "; runtime_image "
                    "is the slim image the engine is installed into, e.g. "
                    "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04")
        if self.engine_from == "wheel":
            if cuda:
                raise BadValue("engine_from: wheel installs vLLM's CPU wheel (the engine "
                               "template's wheel stage); a cuda target builds from source",
                               "set engine_from: source with a source realization, or "
                               "accelerator: cpu")
            if self.expect_cuda_arch:
                raise BadValue("expect_cuda_arch only applies to source-built (CUDA) targets",
                               "remove expect_cuda_arch")
        return self


# What a source build renders from (images/engine/Dockerfile.j2): without them the engine
# would say `FROM None AS runtime`. No index: torch for CUDA 13.0 is on the default index
# for linux/arm64, and package indexes come from the runner's pip configuration.
SOURCE_NEEDS = ("runtime_image", "expect_cuda_arch")


def _arch_matches(arch: str, capability: str | None) -> None:
    m = CUDA_ARCH.match(arch)
    if not m:
        raise BadValue(f"expect_cuda_arch {arch!r} is not a CUDA arch such as sm_121a",
                       "write sm_<major><minor>[a], e.g. sm_121a for GB10")
    if capability is not None and f"{m.group(1)}.{m.group(2)}" != capability:
        raise BadValue(f"expect_cuda_arch {arch} is for compute capability "
                       f"{m.group(1)}.{m.group(2)}, but the target's compute_capability is "
                       f"{capability}", "make the two describe the same GPU")


def _no_torch_index(value: Any) -> None:
    if value is None:
        return None
    raise BadValue("torch_index is no longer a matrix setting: package indexes come from the "
                   "runner's own pip configuration, so no index host is written here",
                   "remove it, and add the index to the runner's pip configuration "
                   "(`pip config set global.extra-index-url URL`, or PIP_EXTRA_INDEX_URL); "
                   "engine builds receive it as the pip_conf build secret")


class SourcePin(Strict):
    repository: Annotated[str, AfterValidator(git_url), Schema(pattern=GIT_URL_JSON)]
    """Git URL of the vLLM source."""
    # exactly 40 hex: nothing expands it
    commit: Annotated[str, AfterValidator(_full_sha),
                      Schema(pattern=sh.pattern_of(FULL_SHA))]
    """The full 40-character commit SHA built."""


class WheelPin(Strict):
    package: Annotated[str, AfterValidator(package_name), Schema(pattern=PACKAGE_JSON)]
    """Distribution name of the wheel (e.g. vllm)."""
    version: PEP440
    """Its version (PEP 440)."""
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]  # --require-hashes
    """SHA-256 of the wheel file; pip installs it with --require-hashes."""
    # pinned requirement set installed before the wheel (--no-deps)
    requirements: Annotated[str, _repo_file("requirements file"), RepoFile]
    """Repository path of the pinned requirement set installed before the wheel (--no-deps)."""


class EngineRealization(Strict):
    source: SourcePin | None = None
    """Build vLLM from this git commit (give this or `wheel`)."""
    wheel: WheelPin | None = None
    """Install this vLLM wheel (give this or `source`)."""
    patches: list[Annotated[str, _repo_file("patch"), RepoFile]] = Field(default_factory=list)
    """Repository paths of patches applied to the vLLM source, in order."""

    model_config = ConfigDict(json_schema_extra=sh.rules(
        sh.one_of(sh.given("source"), sh.given("wheel"))))

    @model_validator(mode="after")
    def _one_origin(self) -> EngineRealization:
        if (self.source is None) == (self.wheel is None):
            raise BadValue("a realization needs exactly one of `source` (a git pin) or "
                           "`wheel`", "keep `source` for a target that compiles vLLM, `wheel` "
                           "for one that installs its CPU wheel")
        return self


class Engine(Strict):
    vllm_version: PEP440
    """vLLM version the engine reports (PEP 440)."""
    description: str
    """What this patch set is, in words."""
    note: str | None = None
    """A longer remark shown with the engine."""
    # what users must know about this patch set wherever it is named (plan, image labels,
    # release notes, a preflight warning), e.g. that it lacks what its name promises
    caveat: Annotated[str, StringConstraints(min_length=10, max_length=500)] | None = None
    """What users must know wherever this patch set is named (plan, labels, release notes, a
    preflight warning)."""
    realize: dict[Name, EngineRealization] = Field(min_length=1)
    """How the engine is obtained per target: target name -> source or wheel."""


# HubPin._revision_or_track, for the JSON Schema
HUB_PIN_RULES = (
    {"if": sh.given("repository"), "then": sh.one_of(sh.given("revision"), sh.given("track")),
     "else": sh.none_of([sh.given("revision"), sh.given("track"),
                         {"properties": {"exclude": {"minItems": 1}}, "required": ["exclude"]}])},
)
# drafter methods that load a drafter model (Drafter._model_when_needed)
DRAFTER_MODEL_METHODS = ("dflash", "eagle", "eagle3")


class HubPin(Strict):
    """A Hub repository at a commit (`revision`) or a branch that `lock` resolves (`track`)."""

    repository: HubRepository | None = None
    """Hub repository (owner/name)."""
    revision: Annotated[str, Schema(pattern=sh.pattern_of(HEX_PIN))] | None = None
    """Commit SHA of the repository (7-40 hex; `lock` expands short ones). Give this or
    `track`."""
    track: Annotated[str, AfterValidator(branch_name), Schema(pattern=BRANCH_JSON)] | None = None
    """A branch `build.py lock` resolves to a commit in matrix.lock.json. Give this or
    `revision`."""
    # repository files the image leaves out (fnmatch globs on their paths, e.g.
    # "original/*": Llama repos carry Meta's consolidated weights beside the safetensors)
    exclude: list[Annotated[str, StringConstraints(min_length=1)]] = Field(
        default_factory=list)
    """Repository files the image leaves out (fnmatch globs, e.g. "original/*")."""

    model_config = ConfigDict(json_schema_extra=sh.rules(*HUB_PIN_RULES))

    @field_validator("revision")
    @classmethod
    def _revision_is_sha(cls, v: str | None) -> str | None:
        return None if v is None else _check_pin(v, "revision")

    @model_validator(mode="after")
    def _revision_or_track(self) -> HubPin:
        if self.repository and (self.revision is None) == (self.track is None):
            raise BadValue("a Hub repository needs exactly one of `revision` (a commit SHA) or "
                           "`track` (a branch)", "keep `revision: SHA`, or `track: BRANCH` "
                           "and run `build.py lock --update NAME`")
        if not self.repository and (self.revision or self.track or self.exclude):
            raise BadValue("`revision`/`track`/`exclude` need a `repository`",
                           "add `repository: owner/name`, or remove them")
        return self


class Generated(Strict):
    script: Annotated[str, _repo_file("generator script"), RepoFile]
    """Repository path of the script that generates the model."""
    seed: int = Field(default=0, ge=0, le=2**32 - 1)  # numpy's seed range
    """Seed passed to the script."""


class Model(HubPin):
    description: str
    """What the model is, in words."""
    generate: Generated | None = None
    """Generate the model with a script instead of a Hub repository."""
    quantization: str | None = None  # --quantization; must match config quant_method
    """vLLM --quantization; must match the checkpoint's quant_method."""
    # config.json architectures[0]: until `lock` has the checkpoint's metadata, what `check`
    # predicts vLLM's kernels for; the locked config.json must then agree
    architecture: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                                   max_length=128)] | None = None
    """The checkpoint's model class (config.json architectures[0]), declared for `check`'s
    kernel prediction while the lock has no metadata; the locked config.json must agree."""
    served_names: list[Name] = Field(min_length=1)
    """Names the server answers to (--served-model-name)."""
    # --limit-mm-per-prompt; None = text only
    multimodal: dict[str, Annotated[int, Field(ge=0, le=1024)]] | None = None
    """vLLM --limit-mm-per-prompt (modality -> count); none: text only."""
    targets: list[Name] = Field(min_length=1)
    """Targets this model is built for."""

    model_config = ConfigDict(json_schema_extra=sh.rules(
        *HUB_PIN_RULES, sh.one_of(sh.given("repository"), sh.given("generate"))))

    @model_validator(mode="after")
    def _hub_or_generated(self) -> Model:
        if (self.repository is None) == (self.generate is None):
            raise BadValue("a model needs exactly one of `repository` (a Hub model) or "
                           "`generate` (a script)", "keep one of them")
        return self


class Drafter(HubPin):
    method: SpecMethod
    """Speculative decoding method."""
    description: str
    """What the drafter is, in words."""
    num_speculative_tokens: int = Field(ge=1, le=32)
    """Tokens proposed per step."""
    options: dict[str, Any] = Field(default_factory=dict)  # extra speculative-config keys
    """Extra keys of vLLM's --speculative-config."""
    targets: list[Name] = Field(min_length=1)
    """Targets this drafter is built for."""

    model_config = ConfigDict(json_schema_extra=sh.rules(
        *HUB_PIN_RULES,
        {"if": {"properties": {"method": {"enum": list(DRAFTER_MODEL_METHODS)}}},
         "then": sh.given("repository"), "else": sh.absent("repository")}))

    @model_validator(mode="after")
    def _model_when_needed(self) -> Drafter:
        needs_model = self.method in DRAFTER_MODEL_METHODS
        if needs_model and not self.repository:
            raise BadValue(f"method {self.method} needs a drafter `repository`",
                           "add `repository: owner/name` of the drafter model and its "
                           "`revision`")
        if not needs_model and self.repository:
            raise BadValue(f"method {self.method} uses no drafter model",
                           "remove `repository` (and its revision or track)")
        return self


def _plain() -> list[Method]:
    return ["none"]


# Which kernels vLLM chose at boot, as its log names them (smoke/backends.py reads them):
# attention backend (FLASH_ATTN, FLASHINFER, CPU_ATTN...), NVFP4 GEMM kernel (CUTLASS,
# MARLIN, FLASHINFER_CUTLASS...), MoE backend (VLLM_CUTLASS, FLASHINFER_CUTLASS, MARLIN...),
# top-p/top-k sampler (FLASHINFER, NATIVE), speculative method (ngram, dflash, mtp, none).
BackendName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                               max_length=63)]


class ExpectBackends(Strict):
    """What a profile expects vLLM to choose at boot; smoke fails on a mismatch with both
    values. A kind left out is not asserted (it is still reported)."""

    attention: BackendName | None = None
    """Attention backend, as vLLM's log names it (FLASH_ATTN, FLASHINFER, CPU_ATTN...)."""
    nvfp4_gemm: BackendName | None = None
    """NVFP4 GEMM kernel (CUTLASS, MARLIN, FLASHINFER_CUTLASS...)."""
    moe: BackendName | None = None
    """MoE backend (VLLM_CUTLASS, FLASHINFER_CUTLASS, MARLIN...)."""
    sampler: BackendName | None = None
    """Top-p/top-k sampler (FLASHINFER, NATIVE)."""
    speculative: BackendName | None = None
    """Speculative method (ngram, dflash, mtp, none)."""
    drafter_moe: BackendName | None = None
    """The drafter's MoE backend (an MTP head's experts: TRITON, VLLM_CUTLASS...), read
    from the log lines after vLLM's "Loading drafter model..."."""
    drafter_attention: BackendName | None = None
    """The drafter's attention backend (FLASH_ATTN for a DFlash drafter...)."""


# serve flags a `parallel:` block derives (spec/nodecmd.py); never written in `args` too
PARALLEL_ARGS = ("tensor-parallel-size", "nnodes", "node-rank", "master-addr", "master-port",
                 "headless", "distributed-executor-backend")


class Parallel(Strict):
    """How a server is spread over GPUs and machines (docs/multi-node.md). It derives the
    serve flags of every node; `args` does not repeat them."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    """GPUs each layer is split across (vLLM --tensor-parallel-size), over all nodes."""
    nodes: int = Field(default=1, ge=1, le=256)
    """Machines the server spans: node 0 (the head) serves the API, the others are workers."""
    backend: Literal["mp", "ray"] = "mp"
    """vLLM's executor across nodes: mp (multiprocessing: --nnodes/--node-rank/--master-addr,
    workers --headless) or ray (--distributed-executor-backend ray; the head starts a Ray
    head, workers join it)."""
    master_port: int = Field(default=29501, ge=1, le=65535)
    """Port on the head the nodes meet at (mp: --master-port; ray: the Ray head's port)."""

    @model_validator(mode="after")
    def _nodes_share_the_tp(self) -> Parallel:
        tp, nodes = self.tensor_parallel_size, self.nodes
        if nodes > 1 and (tp < nodes or tp % nodes):
            raise BadValue(f"tensor_parallel_size {tp} cannot be split evenly over {nodes} "
                           "nodes (every node runs the same number of ranks)",
                           f"make tensor_parallel_size a multiple of nodes, e.g. {nodes} "
                           f"(one GPU per node) or {2 * nodes}")
        return self

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nodes


# a serve flag's value in a profile's args (and a variant's, where null drops it)
ArgValue = str | int | float | bool | list[str | int | float] | dict[str, Any]
# what a profile variant may change; every other field is the profile's on every engine
VARIANT_FIELDS = ("args", "env", "acceptance_floor", "reasoning", "tools", "expect_backends")


class ProfileVariant(Strict):
    """What a profile says differently on some engines (by_vllm, by_engine): `args` and
    `env` merged key by key over the profile's (null drops a flag or variable), each other
    field given replaces the profile's (`expect_backends: null` expects nothing)."""

    args: dict[str, ArgValue | None] = Field(default_factory=dict)
    """Serve flags set (or, null, dropped) on these engines."""
    env: dict[EnvName, str | None] = Field(default_factory=dict)
    """Environment variables set (or, null, dropped) on these engines."""
    acceptance_floor: float | None = Field(default=None, ge=0, le=1)
    """Accepted/draft token ratio smoke must see on these engines."""
    reasoning: bool | None = None
    """Smoke checks the reasoning parser's output on these engines."""
    tools: bool | None = None
    """Smoke checks tool calling on these engines."""
    expect_backends: ExpectBackends | None = None
    """Kernels vLLM must choose at boot on these engines (null: none asserted)."""


class Profile(Strict):
    """How a server runs: serve flags, environment, what smoke expects. `extends` names a
    profile whose fields this one starts from (spec/profiles.py resolves it before this
    schema sees the profile: args and env merged, the child's values win). What differs
    between vLLM versions is said once, in by_vllm or by_engine: each cell gets the
    profile as its engine sees it (`on_engine`), no second profile and no excludes."""

    description: str
    """How the server runs, in words. Inherited through `extends`."""
    extends: Name | None = None
    """A profile whose fields this one starts from (args and env merged key by key, the child's
    values win)."""
    target: Name | None = None  # None: usable on every target
    """The only target this profile is usable on; none: every target."""
    # speculative methods it serves; `none` is plain serving (the default)
    methods: list[Method] = Field(default_factory=lambda: _plain(), min_length=1)
    """Speculative methods it serves; `none` is plain serving."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port the server listens on (loopback)."""
    args: dict[str, ArgValue] = Field(default_factory=dict)
    """vllm serve flags without the leading --, e.g. max-model-len: 4096; a flag taking
    several values as a list, e.g. cudagraph-capture-sizes: [1, 2, 4]."""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """Environment variables of the server."""
    acceptance_floor: float | None = Field(default=None, ge=0, le=1)
    """Accepted/draft token ratio smoke must see; required when a speculative method is served."""
    reasoning: bool = True
    """Smoke checks the reasoning parser's output."""
    tools: bool = True
    """Smoke checks tool calling."""
    expect_backends: ExpectBackends | None = None
    """Kernels vLLM must choose at boot; smoke fails on a mismatch."""
    parallel: Parallel | None = None
    """Tensor parallelism and the nodes it spans; none: one GPU (or CPU engine) on one host.
    Derives --tensor-parallel-size and the multi-node flags, which `args` must not repeat."""
    by_vllm: dict[VersionRange, ProfileVariant] = Field(default_factory=dict)
    """What differs on engines whose vllm_version is in a range (PEP 440 specifiers, e.g.
    '>=0.30'): every matching entry applies, in the order written, before by_engine."""
    by_engine: dict[Name, ProfileVariant] = Field(default_factory=dict)
    """What differs on the named engines, applied after by_vllm."""

    # _floor_for_speculation, for the JSON Schema: a profile that extends another is
    # checked once resolved (the CLI's part alone)
    model_config = ConfigDict(json_schema_extra=sh.rules(
        {"if": {"not": {"required": ["extends"]},
                "properties": {"methods": {"contains": {"not": {"const": NO_SPECULATION}}}},
                "required": ["methods"]},
         "then": sh.given("acceptance_floor")}))

    @model_validator(mode="after")
    def _floor_for_speculation(self) -> Profile:
        speculative = [m for m in self.methods if m != NO_SPECULATION]
        if speculative and self.acceptance_floor is None:
            raise BadValue(f"the profile serves {', '.join(speculative)} but has no "
                           "acceptance_floor",
                           "add acceptance_floor: the accepted/draft token ratio smoke must "
                           "see, e.g. 0.2 (DFlash) or 0.4 (MTP)")
        return self

    def variants(self, engine: str, vllm_version: str) -> list[tuple[tuple, ProfileVariant]]:
        """The entries that apply on this engine, in the order they apply, each with its
        path under the profile (for an error's line)."""
        found = [(("by_vllm", spec), v) for spec, v in self.by_vllm.items()
                 if in_range(vllm_version, spec)]
        if engine in self.by_engine:
            found.append((("by_engine", engine), self.by_engine[engine]))
        return found

    def on_engine(self, engine: str, vllm_version: str) -> Profile:
        """This profile as a cell of `engine` (vLLM `vllm_version`) runs it: its by_vllm and
        by_engine entries applied. BadValue when the result is not a valid profile (the
        caller names the last entry applied: variants())."""
        variants = self.variants(engine, vllm_version)
        if not variants:
            return self
        data = self.model_dump(exclude={"by_vllm", "by_engine"})
        for _at, v in variants:
            for field in VARIANT_FIELDS:
                if field not in v.model_fields_set:
                    continue
                value = getattr(v, field)
                if field in ("args", "env"):
                    merged = {**data[field], **value}
                    data[field] = {k: val for k, val in merged.items() if val is not None}
                else:
                    data[field] = value.model_dump() if isinstance(value, BaseModel) \
                        else value
        try:
            return Profile.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise BadValue(f"on engine {engine} (vLLM {vllm_version}) the profile is not "
                           f"valid: {first.get('msg')}",
                           "change this entry so the profile it gives is valid") from None


class Waiver(Strict):
    rule: str
    """Id of the preflight rule waived."""
    reason: Annotated[str, StringConstraints(min_length=10)]
    """Why, in words (at least 10 characters)."""


class Include(Strict):
    engine: Name | None = None
    """An engine name."""
    model: Name | None = None
    """A model name."""
    drafter: Name | None = None
    """A drafter name, or none."""
    profile: Name | None = None
    """A profile name."""


class Axes(Strict):
    engine: list[Name] = Field(min_length=1)
    """Engines of the product."""
    model: list[Name] = Field(min_length=1)
    """Models of the product."""
    # `none` serves without speculative decoding; leaving the axis out means [none]
    drafter: list[Name] = Field(default_factory=lambda: [NO_SPECULATION], min_length=1)
    """Drafters of the product; `none` serves without speculative decoding."""
    profile: list[Name] = Field(min_length=1)
    """Profiles of the product."""
    include: list[Include] = Field(default_factory=list)
    """Combinations added (or matched) after the product, as in GitHub's strategy.matrix."""
    exclude: list[Include] = Field(default_factory=list)
    """Combinations removed from the product (every entry's named axes must match)."""


class ImageFamily(Strict):
    description: str
    """What the family serves, in words."""
    target: Name
    """The target its images are built for."""
    name: str = "{family}-{model}-{drafter}"  # image repository name per cell
    """Image repository name per cell; fields: {family} {model} {drafter} {engine} {profile}."""
    matrix: Axes
    """The axes whose product are the family's cells."""
    waivers: list[Waiver] = Field(default_factory=list)
    """Preflight rules waived for this family, each with a reason."""


class Publish(Strict):
    registry: RegistryHost
    """Registry host[:port] images are pushed to (IMAGEBUILD_REGISTRY overrides it)."""
    namespace: Namespace
    """Repository path under the registry (IMAGEBUILD_NAMESPACE overrides it)."""
    regression_threshold: float = Field(default=0.05, ge=0, le=1)
    """Promote refuses a release whose tok/s falls this fraction below latest."""
    acceptance_threshold: float = Field(default=0.10, ge=0, le=1)
    """Promote refuses a release whose speculative acceptance falls this fraction below
    latest (rate or mean accepted length, per concurrency level)."""


# bumped with every change that refuses a matrix the previous version accepted
# (spec/renames.py keeps the way forward for each)
SCHEMA_VERSION = 1


class Matrix(Strict):
    schema_version: Literal[1] = Field(alias="schema")
    """Version of this file's schema (bumped on every breaking change; `build.py migrate`
    rewrites an older matrix)."""
    publish: Publish
    """Where releases go."""
    targets: dict[Name, Target] = Field(min_length=1)
    """Machine classes images are built for: name -> target."""
    engines: dict[Name, Engine] = Field(min_length=1)
    """vLLM patch sets: name -> engine."""
    models: dict[Name, Model] = Field(min_length=1)
    """Models served: name -> model."""
    drafters: dict[Name, Drafter] = Field(default_factory=dict)  # none: plain serving only
    """Speculative decoding drafters: name -> drafter (none: plain serving only)."""
    profiles: dict[Name, Profile] = Field(min_length=1)
    """How servers run: name -> profile."""
    images: dict[Name, ImageFamily] = Field(min_length=1)
    """Image families: name -> family; each expands into cells."""


def _check_version(located: Located) -> None:
    """A matrix of another schema version is answered before its fields are."""
    version = located.data.get("schema") if isinstance(located.data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise UserError(f"schema: {version} is newer than this imagebuild knows (schema "
                        f"{SCHEMA_VERSION})", fix="upgrade imagebuild",
                        where=located.where(("schema",)))
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        raise UserError(f"schema: {version} is older than this imagebuild's (schema "
                        f"{SCHEMA_VERSION})", fix="run `python build.py migrate` to rewrite it",
                        where=located.where(("schema",)))


def validate(located: Located) -> Matrix:
    _check_version(located)
    try:
        return Matrix.model_validate(located.data)
    except ValidationError as exc:
        raise invalid(exc, located, Matrix) from None


def load_matrix(path: Path, display: str | None = None) -> tuple[Matrix, Located]:
    located = load_located(path, display)
    if not isinstance(located.data, dict):
        raise UserError(f"matrix.yaml must be a mapping of sections (schema, publish, "
                        f"targets, ...), not a {type(located.data).__name__}",
                        fix="start from the repository's matrix.yaml (README reference)",
                        where=located.where(()))
    located = resolve_extends(located)
    return validate(located), located


FULL_SHA_RE = FULL_SHA
