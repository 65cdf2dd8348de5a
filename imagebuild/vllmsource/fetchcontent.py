"""The git sources vLLM's CMake fetches at build time (FetchContent), read from its files.

vLLM's CUDA build clones CUTLASS, vllm-flash-attn, FlashMLA, DeepGEMM (with submodules),
QuTLASS and Triton's kernels inside the compile. The lock pins each of them by commit, the
engine's source stage fetches them, and the compile hands them to CMake through
FetchContent's own `FETCHCONTENT_SOURCE_DIR_<NAME>` (the compile then needs no network).
What is pinned comes from the pinned tree's CMake files, never typed by hand: a new
FetchContent in a pin bump is found here and cannot slip past the lock.

The parser knows CMake's command syntax (quoted and bracket arguments, comments), not its
semantics: a `${VAR}` in a declaration is resolved from the `set(VAR value)` commands of the
files read; a value it cannot resolve is an error, not a guess.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from imagebuild.errors import UserError
from imagebuild.vllmsource.tree import cmake_only_tree, cmake_patches

# Included only by the CPU build (CMakeLists.txt: `VLLM_TARGET_DEVICE STREQUAL "cpu"`).
NOT_CUDA = frozenset({"cmake/cpu_extension.cmake"})
ALL_SUBMODULES = "all"  # FetchContent without GIT_SUBMODULES initializes every submodule
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TOKEN = re.compile(r'#\[(=*)\[.*?\]\1\]|#[^\n]*|\[(=*)\[(.*?)\]\2\]|"((?:\\.|[^"\\])*)"'
                    r"|\(|\)|[^\s()#\"]+", re.S)
_COMMAND = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_VAR = re.compile(r"\$\{([A-Za-z0-9_.+-]+)\}")
# FetchContent_Declare keywords that take no value
_FLAGS = {"OVERRIDE_FIND_PACKAGE", "SYSTEM", "EXCLUDE_FROM_ALL"}


def is_commit(ref: str) -> bool:
    """A full 40-hex commit (a GIT_TAG that needs no resolving)."""
    return bool(_COMMIT.match(ref))


def source_dir_var(name: str) -> str:
    """FetchContent's override for content NAME: its source directory instead of a download."""
    return f"FETCHCONTENT_SOURCE_DIR_{name.upper()}"


@dataclass(frozen=True)
class Dependency:
    """One FetchContent git source of the CUDA build."""

    name: str  # FetchContent's content name, e.g. vllm-flash-attn
    repository: str
    ref: str  # GIT_TAG as declared: a commit, or a tag/branch the lock resolves
    submodules: str | tuple[str, ...]  # ALL_SUBMODULES, or the listed paths (() = none)
    declared_in: str  # the file (relative to the tree) that declares it

    @property
    def commit(self) -> str | None:
        """The commit when GIT_TAG is one; a tag or branch needs resolving."""
        return self.ref if is_commit(self.ref) else None

    @property
    def source_dir_var(self) -> str:
        return source_dir_var(self.name)

    def as_lock(self) -> dict:
        return {"repository": self.repository, "ref": self.ref,
                "submodules": (self.submodules if isinstance(self.submodules, str)
                               else list(self.submodules)),
                "declared_in": self.declared_in}


def _commands(text: str) -> list[tuple[str, list[str], int]]:
    """(name lower-cased, arguments, line) of every command in a CMake file."""
    out: list[tuple[str, list[str], int]] = []
    pos = 0
    while True:
        m = _COMMAND.search(text, pos)
        if m is None:
            return out
        line_start = text.rfind("\n", 0, m.start()) + 1
        prefix = text[line_start:m.start()]
        if "#" in prefix:  # inside a comment line
            pos = text.find("\n", m.end())
            if pos < 0:
                return out
            continue
        args: list[str] = []
        depth = 1
        i = m.end()
        while depth and i < len(text):
            t = _TOKEN.match(text, i)
            if t is None:
                i += 1
                continue
            tok = t.group(0)
            i = t.end()
            if tok.startswith("#"):
                continue
            if tok == "(":
                depth += 1
            elif tok == ")":
                depth -= 1
            elif t.group(3) is not None:
                args.append(t.group(3))
            elif t.group(4) is not None:
                args.append(t.group(4))
            else:
                args.append(tok)
        out.append((m.group(1).lower(), args, text.count("\n", 0, m.start()) + 1))
        pos = i


def _declared(args: list[str]) -> dict[str, list[str]]:
    """FetchContent_Declare(name KEY value ...) as {KEY: [values]}."""
    opts: dict[str, list[str]] = {}
    key: str | None = None
    for arg in args[1:]:
        if arg in _KEYS:
            opts.setdefault(arg, [])
            key = None if arg in _FLAGS else arg
        elif key is not None:
            opts[key].append(arg)
    return opts


_KEYS = {"GIT_REPOSITORY", "GIT_TAG", "GIT_SHALLOW", "GIT_PROGRESS", "GIT_SUBMODULES",
         "GIT_SUBMODULES_RECURSE", "SOURCE_DIR", "BINARY_DIR", "SOURCE_SUBDIR", "URL",
         "URL_HASH", "CONFIGURE_COMMAND", "BUILD_COMMAND", "INSTALL_COMMAND", "TEST_COMMAND",
         "PATCH_COMMAND", "UPDATE_COMMAND", "CMAKE_ARGS", "DOWNLOAD_EXTRACT_TIMESTAMP",
         "FIND_PACKAGE_ARGS", "SVN_REPOSITORY", "HG_REPOSITORY"} | _FLAGS


def cmake_files(tree: Path) -> list[Path]:
    """The CMake files of the CUDA build: CMakeLists.txt and cmake/**/*.cmake, less the
    CPU-only ones."""
    files = [tree / "CMakeLists.txt"]
    files += sorted(p for p in (tree / "cmake").rglob("*.cmake")
                    if p.relative_to(tree).as_posix() not in NOT_CUDA)
    return [p for p in files if p.is_file()]


def dependencies(tree: Path) -> list[Dependency]:
    """Every FetchContent git source the CUDA build of `tree` may download, by name."""
    parsed = [(p.relative_to(tree).as_posix(), _commands(p.read_text(errors="replace")))
              for p in cmake_files(tree)]
    variables: dict[str, str] = {}
    for _, cmds in parsed:
        for name, args, _line in cmds:
            if name == "set" and len(args) == 2 and "$" not in args[1]:
                variables.setdefault(args[0], args[1])
    found: dict[str, Dependency] = {}
    for rel, cmds in parsed:
        for name, args, line in cmds:
            if name != "fetchcontent_declare" or not args:
                continue
            opts = _declared(args)
            if "GIT_REPOSITORY" not in opts:
                if "URL" in opts:
                    raise UserError(f"{rel}:{line}: FetchContent_Declare({args[0]}) downloads "
                                    "a URL, which the lock cannot pin by commit",
                                    fix="teach imagebuild/vllmsource/fetchcontent.py URL sources")
                continue  # the SOURCE_DIR branch of an override
            dep = Dependency(
                name=args[0],
                repository=_resolve(_one(opts, "GIT_REPOSITORY", rel, line), variables, rel,
                                    line),
                ref=_resolve(_one(opts, "GIT_TAG", rel, line), variables, rel, line),
                submodules=(ALL_SUBMODULES if "GIT_SUBMODULES" not in opts else
                            tuple(s for s in opts["GIT_SUBMODULES"] if s)),
                declared_in=rel)
            if dep.name in found and found[dep.name] != dep:
                raise UserError(f"{rel}:{line}: {dep.name} is declared twice with different "
                                "sources", fix="read both declarations in vLLM's CMake files")
            found[dep.name] = dep
    return sorted(found.values(), key=lambda d: d.name)


def _one(opts: dict[str, list[str]], key: str, rel: str, line: int) -> str:
    values = opts.get(key) or []
    if len(values) != 1:
        raise UserError(f"{rel}:{line}: FetchContent_Declare has {len(values)} {key} values",
                        fix="a git source needs exactly one repository and one GIT_TAG")
    return values[0]


def _resolve(value: str, variables: dict[str, str], rel: str, line: int) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in variables:
            raise UserError(f"{rel}:{line}: cannot resolve ${{{m.group(1)}}} in {value!r}",
                            fix="set it with a literal value in vLLM's CMake files")
        return variables[m.group(1)]
    return _VAR.sub(sub, value)


def _cmake_tree(sdist_root: Path, patches: list[Path], dest: Path) -> Path:
    return cmake_only_tree(sdist_root, dest, cmake_patches(patches))


def read_sources(sdist_root: Path, patches: list[Path]) -> list[Dependency]:
    """The FetchContent git sources of the sdist with the series' CMake patches applied."""
    with tempfile.TemporaryDirectory(prefix="imagebuild-cmake-") as tmp:
        return dependencies(_cmake_tree(sdist_root, patches, Path(tmp) / "tree"))
