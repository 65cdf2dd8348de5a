"""What matrix.lock.json may hold, value by value: every string in it reaches image builds
(digests in FROM lines, weight file names in RUN lines, revisions in labels), so a hand
edit or a corrupt file is refused at its file:line:column, never rendered.

Strict like the matrix schema: unknown keys, wrong types, a digest that is not
`sha256:<64 hex>`, a SHA that is not 40 hex characters, a file path that leaves its folder
or holds a line break are errors. Fields later versions of the tool record are optional,
so an older lock reads, and `lock --check` says what it lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from imagebuild.errors import UserError, validation_text
from imagebuild.spec.config import ImageRef, Name
from imagebuild.spec.repopaths import check_relative
from imagebuild.spec.values import BadValue, hub_repository
from imagebuild.spec.yamlpos import shorten, unsafe_char

Marks = dict[tuple[str | int, ...], tuple[int, int]]
MarksOf = Callable[[], Marks]  # positions are only worked out for a refusal
FIX = "regenerate it with `python build.py lock` (and commit it); never edit it by hand"


def _hex(n: int, what: str) -> Any:
    def check(v: str) -> str:
        if len(v) != n or any(c not in "0123456789abcdef" for c in v):
            raise BadValue(f"{what} {shorten(v)} is not {n} lowercase hex characters", FIX)
        return v
    return AfterValidator(check)


def _digest(v: str) -> str:
    algo, _, hexpart = v.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or any(c not in "0123456789abcdef"
                                                     for c in hexpart):
        raise BadValue(f"digest {shorten(v)} is not sha256:<64 lowercase hex>",
                       "run `python build.py lock --update TARGET` to record the digest the "
                       "registry reports")
    return v


def _path(v: str) -> str:
    bad = unsafe_char(v)
    if bad:
        raise BadValue(f"path {shorten(v)} holds {bad}", FIX)
    check_relative(v, "file")
    return v


def _text(v: str) -> str:
    bad = unsafe_char(v)
    if bad:
        raise BadValue(f"{shorten(v)} holds {bad}", FIX)
    return v


Sha40 = Annotated[str, _hex(40, "commit SHA")]
Sha256 = Annotated[str, _hex(64, "sha256")]
Digest = Annotated[str, AfterValidator(_digest)]
RelPath = Annotated[str, AfterValidator(_path)]
Text = Annotated[str, AfterValidator(_text)]
Status = Literal["resolved", "unresolved"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class HubFile(_Strict):
    path: RelPath
    size: int = Field(ge=0)
    lfs_sha256: Sha256 | None = None
    blob_id: Sha40 | None = None


class HubEntry(_Strict):
    repository: Annotated[str, AfterValidator(hub_repository)]
    revision: Annotated[str, Field(pattern=r"^[0-9a-f]{7,40}$")] | None = None
    track: Text | None = None
    sha: Sha40 | None = None
    status: Status
    files: list[HubFile] | None = None
    metadata: list[RelPath] | None = None
    unresolved: list[Literal["sha", "files", "metadata"]] | None = None
    fix: Text | None = None


class GeneratedFile(_Strict):
    path: RelPath
    size: int = Field(ge=0)
    sha256: Sha256


class GeneratedEntry(_Strict):
    generate: RelPath
    seed: int = Field(ge=0, le=2**32 - 1)
    script_sha256: Sha256
    files_digest: Sha256
    status: Literal["resolved"]
    files: list[GeneratedFile]
    metadata: list[RelPath]


class PatchEntry(_Strict):
    file: RelPath
    sha256: Sha256


class SourceEntry(_Strict):
    repository: Text
    commit: Sha40 | None
    # the commit the sdist was built from (setuptools-scm's short form)
    sdist_commit: Annotated[str, Field(pattern=r"^[0-9a-f]{7,40}$")] | None = None


class DependencyEntry(_Strict):
    """A git source vLLM's CMake fetches at build time (vllmsource/fetchcontent.py)."""

    repository: Text
    ref: Text  # GIT_TAG as vLLM's CMake declares it
    commit: Sha40 | None  # null until a tag is resolved (`lock --update TARGET`)
    submodules: Literal["all"] | list[RelPath]
    declared_in: RelPath


class WheelEntry(_Strict):
    package: Text
    version: Text
    sha256: Sha256
    requirements: RelPath
    requirements_sha256: Sha256


class EngineEntry(_Strict):
    vllm_version: Text | None = None  # recorded since the lock covers every engine input
    patches: list[PatchEntry]
    source: SourceEntry | None = None
    wheel: WheelEntry | None = None
    dependencies: dict[Text, DependencyEntry] | None = None  # source builds
    recipe: dict[str, Any] | None = None  # target settings that change the engine
    status: Status
    fix: Text | None = None


class BaseEntry(_Strict):
    image: ImageRef
    digest: Digest | None
    runtime_image: ImageRef | None = None
    runtime_digest: Digest | None = None
    bootstrap: dict[str, Text] | None = None
    status: Status
    fix: Text | None = None


class LockDoc(_Strict):
    version: Literal[1]
    models: dict[Name, dict[str, Any]]
    drafters: dict[Name, HubEntry]
    engines: dict[Name, dict[Name, EngineEntry]]
    bases: dict[Name, BaseEntry]


def _where(marks: Marks, path: tuple[str | int, ...], file: str) -> str:
    for cut in range(len(path), -1, -1):
        mark = marks.get(tuple(path[:cut]))
        if mark:
            return f"{file}:{mark[0]}:{mark[1]}"
    return f"{file}:1:1"


def _refuse(exc: ValidationError, prefix: tuple[str | int, ...], marks_of: MarksOf,
            file: str) -> UserError:
    marks = marks_of()
    err = exc.errors()[0]
    loc = prefix + tuple(p for p in err["loc"] if p != "[key]")
    cause = (err.get("ctx") or {}).get("error")
    shown = ".".join(str(p) for p in loc) or "(top level)"
    if isinstance(cause, BadValue):
        return UserError(f"{file}: {shown}: {cause}", fix=cause.fix,
                         where=_where(marks, loc, file))
    found = "" if err["type"] == "missing" else f"; found {shorten(err.get('input'))}"
    return UserError(f"{file}: {shown}: {validation_text(err)}{found}", fix=FIX,
                     where=_where(marks, loc, file))


def check_lock(data: dict[str, Any], marks: MarksOf, file: str = "matrix.lock.json") -> None:
    """Raise UserError (with file:line:col) unless `data` is a well-formed lock."""
    try:
        doc = LockDoc.model_validate(data)
    except ValidationError as exc:
        raise _refuse(exc, (), marks, file) from None
    for name, entry in doc.models.items():  # a Hub model, or one made by a generator
        kind = GeneratedEntry if "generate" in entry else HubEntry
        try:
            kind.model_validate(entry)
        except ValidationError as exc:
            raise _refuse(exc, ("models", name), marks, file) from None
