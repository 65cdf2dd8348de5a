"""The JSON Schema refuses what the CLI refuses, at the same file:line:column, for the
mistakes people make everywhere in a matrix: every field of every matrix in the
repository is given a value of the wrong type, a blank, a null, one of a list of
plausible wrong strings, or is left out, and each mapping gets an unknown key. What the
schema cannot say (one field naming another section's key, numeric bounds of a memory
size) is listed in CLI_ONLY with the reason."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_matrix_schema import MATRICES, _schema_paths

from imagebuild.errors import UserError
from imagebuild.preflight.serve_args import args_problems
from imagebuild.spec import argschema
from imagebuild.spec.config import load_matrix
from imagebuild.spec.names import REFERENCE_JSON, REGISTRY_JSON, check_reference, check_registry
from imagebuild.spec.reference import schema_text
from imagebuild.spec.repopaths import RELATIVE_JSON, check_relative
from imagebuild.spec.values import (
    BRANCH_JSON,
    GIT_URL_JSON,
    HUB_REPO_JSON,
    MEMORY_JSON,
    PEP440_JSON,
    BadValue,
    branch_name,
    git_url,
    hub_repository,
    memory_bytes,
    pep440,
)
from imagebuild.spec.yamlpos import load_located

# libyaml when present (as the loader uses it): thousands of files are written
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# a string only free text takes: a field both accept it for takes the others too
FREE_TEXT = "Has Space, ünï: \"and\" 'quotes'"
# strings that are wrong for most fields with a grammar, and right for some
WRONG_STRINGS = (" ", "main", "Has Space", "UPPER/Case", "a/../b", "https://x.io/a", "-x",
                 "x-", "..", "sm_12", "12.10", "ünï", "/abs/path", "a@b", "0.23.0",
                 "deadbeef", "redis://u:p@h:1", "http://127.0.0.1:5000", "x:99999",
                 "NCCL_SOCKET_IFNAME", "a.lock", "1g", "100000t")
# refusals JSON Schema cannot express, by what the CLI says
CLI_ONLY = {
    "which is not a profile": "`extends` names another profile of the file",
    "is for compute capability": "expect_cuda_arch must agree with compute_capability",
    "is outside 1g..16t": "a memory size's bounds are numeric, its grammar is a pattern",
    "has no acceptance_floor": "a profile that extends another is checked once resolved",
    "cannot be split evenly over": "tensor_parallel_size must be a multiple of nodes",
}


NAME_KEYED = ("targets", "engines", "models", "drafters", "profiles", "images")


def _generic(path: tuple[Any, ...], data: dict[str, Any]) -> tuple[str, ...]:
    """The path with names of name-keyed maps and list indexes made generic, so each
    field of the schema is mutated once, not once per model or profile."""
    out, node = [], data
    for part in path:
        parent = node
        node = node[part]
        if isinstance(part, int):
            out.append("[]")
        elif (len(out) == 1 and out[0] in NAME_KEYED) or out == ["engines", "*", "realize"]:
            out.append("*")
        elif isinstance(parent, dict) and out and out[-1] in ("args", "env", "build_args",
                                                            "multimodal", "options"):
            out.append("*")
        else:
            out.append(str(part))
    return tuple(out)


def _fields(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _fields(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _fields(value, (*path, i))


# keys wrong for a map keyed by names or variable names (targets, env, build_args...)
WRONG_KEYS = ("Bad Key", "-x", "1x", "BASE_IMAGE", "NCCL_SOCKET_IFNAME", "x" * 64)


def _mutations(value: Any, keyed_by_name: bool) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        yield "unknown key", {**value, "zz_unknown": 1}
        for key in value:
            yield f"{key} left out", {k: v for k, v in value.items() if k != key}
        if keyed_by_name and value:
            first, rest = next(iter(value.items())), list(value.items())[1:]
            for wrong in WRONG_KEYS:
                yield f"key {wrong!r}", {wrong: first[1], **dict(rest)}
    elif isinstance(value, bool):
        yield "a string for a boolean", "maybe"
        yield "a number for a boolean", 2
    elif isinstance(value, int):
        yield from (("a string for a number", "abc"), ("negative", -5), ("a fraction", 1.5),
                    ("a list for a number", [1]))
    elif isinstance(value, float):
        yield from (("a string for a number", "abc"), ("negative", -5.0))
    elif isinstance(value, str):
        yield from (("a number for a string", 12345), ("a list for a string", ["x"]),
                    ("blank", ""), ("null", None), ("free text", FREE_TEXT))
        for wrong in WRONG_STRINGS:
            yield repr(wrong), wrong
    elif value is None:
        yield "a list for null", [1, 2]


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


def _cases() -> list[tuple[Path, tuple[Any, ...], str, Any, tuple[str, ...]]]:
    seen: set[tuple[tuple[str, ...], str]] = set()
    cases = []
    # the smallest matrix holding a field is the one mutated: each case costs a write, a
    # load and a validation of the whole file
    for matrix in sorted(MATRICES, key=lambda m: m.stat().st_size):
        data = yaml.load(matrix.read_text(), Loader=LOADER)
        for path, value in _fields(data):
            if not path:
                continue
            generic = _generic(path, data)
            keyed = isinstance(value, dict) and bool(value) and _generic(
                (*path, next(iter(value))), data)[-1] == "*"
            for what, wrong in _mutations(value, keyed):
                if (generic, what) not in seen:
                    seen.add((generic, what))
                    cases.append((matrix, path, what, wrong, generic))
    return cases


SERVE_FLAGS = argschema.recorded()  # the vLLM versions whose serve flags the schema knows


def _args_refusal(loaded: tuple[Any, Any], path: tuple[Any, ...]) -> UserError | None:
    """A profile's args are `check`'s (preflight/serve_args.py, per cell's vLLM version),
    not the loader's: a refusal when every version the schema knows refuses a key."""
    matrix, located = loaded
    name = path[1]
    at = ("profiles", name, "args")
    refused: dict[str, str] | None = None
    for cli in SERVE_FLAGS.values():
        problems = args_problems(matrix.profiles[name].args, cli,
                                 lambda key: located.surprise((*at, key)))
        said = {p.key: p.message for p in problems if p.rule != "serve-flag-false"}
        refused = said if refused is None else {k: v for k, v in refused.items() if k in said}
    if not refused:
        return None
    key, message = next(iter(refused.items()))
    return UserError(message, where=located.where((*at, key)))


def test_schema_and_cli_refuse_the_same_mutations_at_the_same_place(tmp_path: Path) -> None:
    validator = jsonschema.Draft202012Validator(json.loads(schema_text()))
    cases = _cases()
    assert len(cases) > 800, len(cases)  # every field of the schema, not a handful
    disagree: list[str] = []
    excuses_used: set[str] = set()
    target = tmp_path / "matrix.yaml"
    sources = {m: (m.read_text().splitlines(keepends=True)[0],
                   yaml.load(m.read_text(), Loader=LOADER)) for m in MATRICES}
    free: set[tuple[str, ...]] = set()  # fields of free text: the wrong strings are not
    for matrix, path, what, wrong, generic in cases:
        if generic in free and wrong in WRONG_STRINGS:
            continue
        modeline, data = sources[matrix]
        target.write_text(modeline + yaml.dump(_set(data, path, wrong), Dumper=DUMPER,
                                               sort_keys=False, allow_unicode=True))
        try:
            loaded = load_matrix(target)
            cli = _args_refusal(loaded, path) if path[2:3] == ("args",) else None
        except UserError as exc:
            cli = exc
            if "Value error" in exc.message:  # pydantic's wording, not ours
                disagree.append(f"{matrix.name} {path}: the CLI says {exc.message[:100]}")
        located = load_located(target)
        errors = list(validator.iter_errors(located.data))
        if wrong == FREE_TEXT and cli is None and not errors:
            free.add(generic)
        label = f"{matrix.relative_to(MATRICES[0].parent)} {'.'.join(map(str, path))}: {what}"
        if cli is not None and not errors:
            excused = [said for said in CLI_ONLY if said in cli.message]
            excuses_used.update(excused)
            if not excused:
                disagree.append(f"{label}: schema accepts, CLI says {cli.message[:100]}")
        elif errors and cli is None:
            disagree.append(f"{label}: CLI accepts, schema says {errors[0].message[:100]}")
        elif cli is not None and any(said in cli.message for said in CLI_ONLY):
            pass  # both refuse; the CLI's first complaint is one the schema cannot make
        elif cli is not None:
            places = {located.where(p) for e in errors for p in _schema_paths(e)}
            if cli.where not in places:
                disagree.append(f"{label}: CLI at {cli.where}, schema at {sorted(places)}")
    assert not disagree, "\n".join(disagree)
    # an excuse no mutation needs any more is stale (the schema learnt it, or the CLI
    # stopped refusing): drop it
    assert excuses_used == set(CLI_ONLY), set(CLI_ONLY) - excuses_used


def _accepts(check: Any, value: str) -> bool:
    try:
        check(value)
    except ValueError:
        return False
    return True


def _memory_grammar(value: str) -> None:
    """memory_bytes without its 1g..16t bounds (numeric: the CLI's alone, not a pattern's)."""
    try:
        memory_bytes(value)
    except BadValue as exc:
        if "outside" not in str(exc):
            raise


VERSIONS = ("0.23.0", "v1.0", "1!2.0", "1.0a1", "1.0.post1", "1.0-1", "1.0.dev0",
            "1.0+local.7", "1.0RC1", " 1.0 ", "1.0b2.post3.dev4", "1.0-r", "01.02", "1.0.",
            "1..0", "1.0+", "1.0+a..b", "v", "1.0-dev", "1.0_c_3", "1.0preview2", "1e3",
            "1.0 rc1", "1.0\n", "latest")


@pytest.mark.parametrize(("name", "pattern", "check", "corpus"), [
    ("pep440", PEP440_JSON, pep440, VERSIONS),
    ("registry", REGISTRY_JSON, check_registry,
     ("127.0.0.1:5000", "localhost", "localhost:5000", "ghcr.io", "[::1]:5000", "reg:0",
      "reg:65536", "reg:00080", "myregistry", "https://ghcr.io", "-a.io", "a-.io", "a_b.io")),
    ("reference", REFERENCE_JSON, check_reference,
     ("nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04", "debian:trixie", "localhost/x",
      "localhostx/y", "Foo/bar", "foo.io/Bar", "a:b/c", "host:5000/a:b:c", "x@sha256:" + "a" * 64,
      "x@sha256:abc", "a__b", "a___b", "a--b", "x:ünï", "x:-tag")),
    ("branch", BRANCH_JSON, branch_name, ("main", "release/1.0", "a..b", "x.lock", "x/",
                                          "x.", "-x", ".x", "a b")),
    ("hub repository", HUB_REPO_JSON, hub_repository,
     ("nvidia/Qwen3.6-35B-A3B-NVFP4", "a/b", "a", "a/b/c", "a--b/c", "a/b..c", "-a/b", "a/b-")),
    ("git url", GIT_URL_JSON, git_url, ("https://github.com/vllm-project/vllm",
                                        "https://h:8443/a/b", "http://h/a", "https://h/a/../b",
                                        "https://h/a/.", "https://u@h/a", "https://h/a?x=1")),
    ("repository file", RELATIVE_JSON, lambda v: check_relative(v, "patch"),
     ("patches/x.patch", "", " ", "/x", "~/x", "C:x", "../x", "a/../b", "a/..", "a\\b",
      "a..b", "..a", "a\x01")),
    ("memory size", MEMORY_JSON, _memory_grammar,
     ("8g", "120G", "120GiB", "512m", "8gb", "1.5t", " 8g ", "8 g", "8gg", "g", "8x", "-8g")),
])
def test_value_grammars_of_the_schema_are_the_cli_checks(name: str, pattern: str, check: Any,
                                                         corpus: tuple[str, ...]) -> None:
    """Each value grammar the schema states as a pattern accepts exactly what the CLI's
    check accepts (a memory size's numeric bounds aside: the CLI's alone)."""
    differ = []
    for value in (*corpus, *WRONG_STRINGS):
        said = _accepts(check, value)
        if bool(re.search(pattern, value)) != said:
            differ.append(f"{value!r}: CLI {'accepts' if said else 'refuses'}")
    assert not differ, differ


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _patterns(value)


def test_every_pattern_is_one_editors_read() -> None:
    """Editors evaluate patterns as ECMA-262 (with the u flag), jsonschema as Python re:
    none of Python's own constructs (\\Z, \\A, named groups, inline flags), no escape the
    u flag refuses, and each compiles in Python."""
    patterns = set(_patterns(json.loads(schema_text())))
    assert len(patterns) > 20
    python_only = re.compile(r"\\[AZ]|\(\?P|\(\?[aiLmsux]+[):]|\(\?#"  # \Z, groups, flags
                             r"|\\[^\\\[\]{}()*+?.^$|/dDsSwWbBnrtfvx0-9-]")  # other escapes
    bad = {p: python_only.search(p).group(0) for p in patterns if python_only.search(p)}
    assert not bad, bad
    for p in patterns:
        re.compile(p)
