"""No value can add an instruction: every field of matrix.yaml (and every lock value) that
reaches a generated file is set to hostile text (line breaks of every kind, a
backslash-newline continuation, quotes, command substitution, variables, heredoc
markers, NUL, ...). Each one is either refused where it is written (file:line:column) or
rendered; a rendered Dockerfile is parsed (tests/support/dockerfile_parse.py, BuildKit's rules)
and must hold exactly the instructions, flags, shell shapes, keys and variable
expansions the safe matrix renders. The compose file and the `docker run` line of the
same cells must carry the serve command unchanged, with no interpolation of ours.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from imagebuild.errors import UserError
from imagebuild.lock.lockfile import read_lock
from imagebuild.plan import destination
from imagebuild.render import render_all
from imagebuild.serving.runspec import (
    IMAGE_VAR,
    PORT_VAR,
    RunSpec,
    docker_run_argv,
    docker_run_text,
)
from imagebuild.spec import matrix as mx
from imagebuild.spec.servecmd import serve_command
from tests.support.dockerfile_parse import instructions, shape

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

HOSTILE = {
    "newline": "x\nRUN touch /pwned",
    "continuation": "x \\\nRUN touch /pwned",
    "trailing-backslash": "x\\",
    "carriage-return": "x\rRUN touch /pwned",
    "crlf": "x\r\nRUN touch /pwned",
    "quotes": "x' \"; touch /pwned; echo \"'",
    "command-substitution": "$(touch /pwned)",
    "variables": "${HOME}$PATH",
    "backtick": "`touch /pwned`",
    "heredoc": "<<EOF",
    "heredoc-dash": "<<-EOF",
    "nul": "x\x00y",
    "line-separator": "x\u2028RUN touch /pwned",
    "paragraph-separator": "x\u2029RUN touch /pwned",
    "next-line": "x\x85RUN touch /pwned",
    "vertical-tab": "x\x0bRUN touch /pwned",
    "json-break": "\"]\nRUN touch /pwned #",
    "escape-directive": "# escape=`",
    "compose-variable": "${IMAGEBUILD_IMAGE}",
    "tab": "x\ty",
}

# Fields whose values reach a template, compose file or shell line, by path in
# matrix.yaml. ("key", path) renames the last key of the path instead.
VALUES: list[tuple[str | int, ...]] = [
    ("publish", "registry"), ("publish", "namespace"),
    ("targets", "cpu", "description"), ("targets", "gb10", "description"),
    ("targets", "cpu", "base_image"), ("targets", "gb10", "base_image"),
    ("targets", "gb10", "runtime_image"),
    ("targets", "cpu", "bootstrap", "suite"), ("targets", "cpu", "bootstrap", "mirror"),
    ("targets", "gb10", "build_args", "TORCH_CUDA_ARCH_LIST"),
    ("targets", "gb10", "expect_cuda_arch"), ("targets", "gb10", "memory_limit"),
    ("targets", "gb10", "compile_cache", "local_max_size"),
    ("targets", "gb10", "compile_cache", "shared", "endpoint"),
    ("targets", "gb10", "compile_cache", "shared", "key_prefix"),
    ("targets", "gb10", "runner", 0),
    ("engines", "dflashfix", "description"), ("engines", "dflashfix", "caveat"),
    ("engines", "dflashfix", "vllm_version"),
    ("engines", "dflashfix", "realize", "gb10", "source", "repository"),
    ("engines", "dflashfix", "realize", "gb10", "source", "commit"),
    ("engines", "dflashfix", "realize", "gb10", "patches", 0),
    ("engines", "dflashfix", "realize", "cpu", "wheel", "package"),
    ("engines", "dflashfix", "realize", "cpu", "wheel", "version"),
    ("engines", "dflashfix", "realize", "cpu", "wheel", "sha256"),
    ("engines", "dflashfix", "realize", "cpu", "wheel", "requirements"),
    ("engines", "dflashfix", "realize", "cpu", "patches", 0),
    ("models", "tiny", "description"), ("models", "tiny", "generate", "script"),
    ("models", "tiny", "served_names", 0),
    ("models", "heretic", "description"), ("models", "heretic", "repository"),
    ("models", "heretic", "track"), ("models", "heretic", "quantization"),
    ("models", "heretic", "exclude", 0),
    ("drafters", "aeon", "description"), ("drafters", "aeon", "repository"),
    ("drafters", "aeon", "track"), ("drafters", "ngram", "options", "prompt_lookup_max"),
    ("profiles", "loopback", "args", "host"), ("profiles", "cpu-ngram", "description"),
    ("profiles", "cpu-ngram", "args", "tool-call-parser"),
    ("profiles", "cpu-ngram", "env", "VLLM_CPU_KVCACHE_SPACE"),
    ("profiles", "spark-dflash", "args", "attention-backend"),
    ("images", "cpu", "description"), ("images", "cpu", "name"),
    ("images", "spark", "waivers", 0, "reason"),
]
KEYS: list[tuple[str | int, ...]] = [
    ("targets", "gb10", "build_args", "TORCH_CUDA_ARCH_LIST"),
    ("profiles", "cpu-ngram", "env", "VLLM_CPU_KVCACHE_SPACE"),
    ("profiles", "cpu-ngram", "args", "max-num-seqs"),
    ("drafters", "ngram", "options", "prompt_lookup_max"),
    ("models", "heretic", "multimodal", "image"),
    ("engines", "dflashfix"), ("images", "cpu"), ("targets", "cpu"), ("models", "tiny"),
    ("profiles", "cpu-ngram"),
]
# Lock values that reach a Dockerfile: weight file names (RUN lines), revisions and
# digests (labels, FROM lines)
LOCK_VALUES: list[tuple[str | int, ...]] = [
    ("models", "heretic", "files", 0, "path"), ("models", "heretic", "sha"),
    ("drafters", "aeon", "files", 0, "path"), ("drafters", "aeon", "sha"),
    ("bases", "gb10", "digest"), ("bases", "gb10", "runtime_digest"),
    ("engines", "dflashfix", "cpu", "patches", 0, "file"),
    ("models", "tiny", "files", 0, "path"), ("models", "heretic", "repository"),
]


def _base(matrix_text: str) -> dict[str, Any]:
    """The real matrix, cut to one cpu and one gb10 cell (with a Hub model and drafter),
    with every optional field that reaches a template set."""
    data = yaml.safe_load(matrix_text)
    data["images"] = {
        "cpu": {"description": "the cpu cell", "target": "cpu",
                "matrix": {"engine": ["dflashfix"], "model": ["tiny"], "drafter": ["ngram"],
                           "profile": ["cpu-ngram"]}},
        "spark": {"description": "a gb10 cell with a Hub model and drafter", "target": "gb10",
                  "matrix": {"engine": ["dflashfix"], "model": ["heretic"],
                             "drafter": ["aeon"], "profile": ["spark-dflash-aeon"]},
                  "waivers": [{"rule": "gpu-mem-util-unified",
                               "reason": "a waiver whose reason is printed"}]},
    }
    data["targets"]["gb10"]["compile_cache"]["shared"] = {
        "backend": "redis", "endpoint": "redis://cache.lan:6379/0", "key_prefix": "imagebuild"}
    data["targets"]["cpu"]["bootstrap"]["mirror"] = "http://mirror.invalid/debian"
    data["engines"]["dflashfix"]["caveat"] = "a caveat that is printed wherever it is named"
    data["models"]["heretic"]["exclude"] = ["original/*"]
    return data


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False, allow_unicode=False, width=1 << 20)


def _set(data: Any, path: tuple[str | int, ...], value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _rename(data: Any, path: tuple[str | int, ...], new: str) -> None:
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    items = list(parent.items())
    parent.clear()
    for k, v in items:
        parent[new if k == path[-1] else k] = v


def _node_lines(text: str, path: tuple[str | int, ...]) -> set[int]:
    """Lines of the key and the value at `path` in a YAML text (PyYAML's own marks)."""
    node = yaml.compose(text, Loader=LOADER)
    lines: set[int] = set()
    for p in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == p:
                    lines = {k.start_mark.line + 1}
                    node = v
                    break
            else:
                return lines
        else:
            node = node.value[p]
            lines = set()
        lines.add(node.start_mark.line + 1)
    return lines


def _json_lines(text: str, path: tuple[str | int, ...]) -> set[int]:
    from imagebuild.lock.jsonpos import json_marks

    mark = json_marks(text).get(path)
    return {mark[0]} if mark else set()


class Render:
    """Render a matrix folder the way `build.py render` does."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(self) -> tuple[list[tuple[str, list]], list[list[str]]]:
        lm = mx.load(self.root / "matrix.yaml")
        cells = mx.expand(lm)
        rendered, skipped = render_all(lm, cells, read_lock(lm.root))
        assert not skipped, [s.message for s in skipped]
        # the compose files render_all writes are read back as compose reads them below
        composed = {r.cell: r.text for r in rendered if r.kind == "compose"}
        shapes = [(r.kind, [shape(i) for i in instructions(r.text)]) for r in rendered
                  if r.kind != "compose"]
        dest = destination(lm)
        runs = []
        for cell in cells:
            cmd = serve_command(cell)
            spec = RunSpec(image=dest.image(cell.image).at("t"), command=cmd.argv,
                           memory=cell.target.memory_limit, gpu=cell.target.gpu,
                           port=cmd.port)
            runs.append(_compose_and_run(spec, cell.image, composed[cell.id]))
        return shapes, runs


def _compose_and_run(spec: RunSpec, name: str, compose_text: str) -> list[str]:
    """The rendered compose file's command, read back as compose reads it (`$$` is `$`; `$NAME`
    and `${...}` interpolate: only the two variables of ours may), and the notes' docker
    run line read back by a shell lexer: both must carry the serve command unchanged."""
    doc = yaml.load(compose_text, Loader=LOADER)
    svc = doc["services"]["vllm"]
    interpolated = []

    def read(text: str) -> str:
        out, i = "", 0
        while i < len(text):
            if text.startswith("$$", i):
                out, i = out + "$", i + 2
            elif text[i] == "$":
                end = text.index("}", i) + 1 if text.startswith("${", i) else i + 1
                interpolated.append(text[i:end])
                out, i = out + "<var>", end
            else:
                out, i = out + text[i], i + 1
        return out

    command = [read(a) for a in svc["command"]]
    read(svc["image"])
    read(svc["labels"]["io.imagebuild.service"])
    assert all(v.startswith((f"${{{IMAGE_VAR}:-", f"${{{PORT_VAR}:-")) for v in interpolated), \
        f"compose would interpolate {interpolated}"
    argv = command[:-4]  # compose's own --host/--port come last
    assert argv == _without_listen(list(spec.command)), (argv, spec.command)
    lines = docker_run_argv(spec, name=name)
    words = shlex.split(docker_run_text(spec, name=name).replace("\\\n", " "))
    assert words == [w for line in lines for w in line]
    return argv


def _without_listen(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        else:
            out.append(a)
    return out


@pytest.fixture(scope="module")
def workdir(locked_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("injection")
    for rel in ("matrix.lock.json", "locked", "patches", "images", "scripts"):
        src = locked_template / rel
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / rel)
    (root / "matrix.yaml").write_text(_dump(_base((locked_template / "matrix.yaml")
                                                  .read_text())))
    return root


@pytest.fixture(scope="module")
def safe(workdir: Path):
    shapes, runs = Render(workdir)()
    assert {k for k, _ in shapes} == {"base", "engine", "serve"} and len(runs) == 2
    return shapes


def _outcome(root: Path, safe_shapes: list, edit_file: str, lines: set[int]) -> str | None:
    """None when the edit was refused at its line or rendered to the safe shape; else
    what went wrong."""
    try:
        shapes, _runs = Render(root)()
    except UserError as exc:
        if not exc.where:
            return f"refused without a location: {exc.message[:200]}"
        file, line, _col = exc.where.rsplit(":", 2)
        if Path(file).name != edit_file:
            return f"refused at {exc.where}, not in {edit_file}"
        if lines and int(line) not in lines:
            return f"refused at line {line}, not at {sorted(lines)}: {exc.message[:200]}"
        if not exc.fix:
            return "refused without a fix"
        return None
    except Exception as exc:  # noqa: BLE001 - a crash is what this test looks for
        return f"{type(exc).__name__}: {exc}"
    if [k for k, _ in shapes] != [k for k, _ in safe_shapes]:
        return "rendered other files"
    for (kind, got), (_, want) in zip(shapes, safe_shapes, strict=True):
        if got != want:
            diff = next(((i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=False))
                         if g != w), (len(want), got[len(want):], want[len(got):]))
            return f"{kind} Dockerfile changed shape at instruction {diff[0]}: {diff[1:]}"
    return None


def _run_cases(root: Path, safe_shapes: list, edit: Callable[[str], tuple[str, set[int]]]
               ) -> list[str]:
    matrix = (root / "matrix.yaml").read_text()
    lock = (root / "matrix.lock.json").read_text()
    problems = []
    try:
        for name, value in HOSTILE.items():
            edit_file, lines = edit(value)
            why = _outcome(root, safe_shapes, edit_file, lines)
            if why:
                problems.append(f"{name}: {why}")
            (root / "matrix.yaml").write_text(matrix)
            (root / "matrix.lock.json").write_text(lock)
    finally:
        (root / "matrix.yaml").write_text(matrix)
        (root / "matrix.lock.json").write_text(lock)
    return problems


@pytest.mark.parametrize("path", VALUES, ids=[".".join(map(str, p)) for p in VALUES])
def test_hostile_value(path, workdir: Path, safe) -> None:
    base = yaml.safe_load((workdir / "matrix.yaml").read_text())

    def edit(value: str) -> tuple[str, set[int]]:
        data = copy.deepcopy(base)
        _set(data, path, value)
        text = _dump(data)
        (workdir / "matrix.yaml").write_text(text)
        assert yaml.load(text, Loader=LOADER) == data  # the file holds the hostile text
        return "matrix.yaml", _node_lines(text, path)

    assert not _run_cases(workdir, safe, edit)


@pytest.mark.parametrize("path", KEYS, ids=[".".join(map(str, p)) for p in KEYS])
def test_hostile_key(path, workdir: Path, safe) -> None:
    base = yaml.safe_load((workdir / "matrix.yaml").read_text())

    def edit(value: str) -> tuple[str, set[int]]:
        data = copy.deepcopy(base)
        _rename(data, path, value)
        text = _dump(data)
        (workdir / "matrix.yaml").write_text(text)
        return "matrix.yaml", _node_lines(text, path[:-1] + (value,))

    assert not _run_cases(workdir, safe, edit)


@pytest.mark.parametrize("path", LOCK_VALUES, ids=[".".join(map(str, p)) for p in LOCK_VALUES])
def test_hostile_lock_value(path, workdir: Path, safe) -> None:
    base = json.loads((workdir / "matrix.lock.json").read_text())

    def edit(value: str) -> tuple[str, set[int]]:
        data = copy.deepcopy(base)
        _set(data, path, value)
        text = json.dumps(data, indent=2, sort_keys=True)
        (workdir / "matrix.lock.json").write_text(text)
        return "matrix.lock.json", _json_lines(text, path)

    assert not _run_cases(workdir, safe, edit)


def test_the_tokenizer_sees_an_injected_instruction() -> None:
    """The parser is not blind: the unprotected forms of the same values change shape."""
    safe = 'ARG X="a"\nRUN echo \'a\'\nLABEL a="b"\n'
    for bad in ('ARG X=a\nRUN touch /pwned\nRUN echo \'a\'\nLABEL a="b"\n',
                'ARG X=a \\\nRUN echo \'a\'\nLABEL a="b"\n',
                'ARG X="a"\rRUN x\nRUN echo \'a\'\nLABEL a="b"\n',
                'ARG X="a"\u2028RUN x\nRUN echo \'a\'\nLABEL a="b"\n',
                'ARG X="a"\nRUN echo a; touch /pwned\nLABEL a="b"\n',
                'ARG X="a"\nRUN echo <<EOF\nRUN echo \'a\'\nEOF\nLABEL a="b"\n',
                'ARG X="a"\nRUN echo \'a\'\nLABEL a="$HOME"\n',
                'ARG X="a"\nRUN echo \'a\'\nLABEL a="b" c="d"\n'):
        assert [shape(i) for i in instructions(bad)] != [shape(i) for i in instructions(safe)], bad
