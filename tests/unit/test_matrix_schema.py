"""matrix.yaml's JSON Schema and reference page: generated from the models and checked in
unchanged; a standard validator (jsonschema) accepts every matrix of the repository and
refuses the mistakes the CLI refuses, at the same file:line:column; renamed fields are
answered with their replacement, and `migrate` rewrites them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from imagebuild.cli import main
from imagebuild.errors import UserError
from imagebuild.spec.config import load_matrix
from imagebuild.spec.migrate import migrate
from imagebuild.spec.reference import markdown, schema_text
from imagebuild.spec.schemafile import REPO_COPY, SCHEMA_FILE
from imagebuild.spec.yamlpos import load_located

ROOT = Path(__file__).resolve().parents[2]
MATRICES = [ROOT / "matrix.yaml", *sorted(ROOT.glob("examples/*/matrix.yaml"))]
REGENERATE = ("regenerate: python build.py schema > docs/matrix.schema.json && cp "
              "docs/matrix.schema.json imagebuild/spec/matrix.schema.json && python build.py "
              "schema --format markdown > docs/matrix-reference.md")


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_checked_in_schema_and_reference_are_what_the_models_generate() -> None:
    generated = schema_text()
    assert (ROOT / REPO_COPY).read_text() == generated, REGENERATE
    assert SCHEMA_FILE.read_text() == generated, REGENERATE
    assert (ROOT / "docs/matrix-reference.md").read_text() == markdown(ROOT), REGENERATE


def test_the_reference_states_what_the_loader_requires() -> None:
    """The errors the prose reference had: publish.registry and wheel.sha256 are required,
    bench.* has defaults."""
    page = (ROOT / "docs/matrix-reference.md").read_text()

    def row(section: str, field: str) -> str:
        part = page.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        return next(line for line in part.splitlines() if line.startswith(f"| `{field}` |"))

    assert "**required**" in row("Publish", "registry")
    assert "**required**" in row("WheelPin", "sha256")
    assert "| `32` |" in row("BenchSettings", "requests")
    assert "| `128` |" in row("BenchSettings", "max_tokens")
    assert "| `structured,prose` |" in row("BenchSettings", "prompts")


@pytest.mark.parametrize("path", MATRICES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_matrix_is_valid_and_names_the_schema(path: Path, validator) -> None:
    errors = list(validator.iter_errors(load_located(path).data))
    assert not errors, [e.message for e in errors]
    first = path.read_text().splitlines()[0]
    m = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert m, f"{path} does not start with the schema modeline"
    assert (path.parent / m.group(1)).resolve() == (ROOT / REPO_COPY).resolve()


def _schema_paths(error: jsonschema.ValidationError) -> list[tuple[Any, ...]]:
    """The field(s) a schema error is about, as a path of keys: an unknown key and a
    missing one are named by the key itself, as the CLI names them."""
    base = tuple(error.absolute_path)
    if "propertyNames" in error.absolute_schema_path:  # a key that is not a NAME
        return [(*base, error.instance)]
    if error.context:  # anyOf (e.g. a section that may be null): the member's errors
        return [base, *(p for sub in error.context for p in _schema_paths(sub))]
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        return [(*base, k) for k in error.instance if k not in known]
    if error.validator == "required":
        return [(*base, k) for k in error.validator_value if k not in error.instance]
    return [base]


# (id, text in the repository's matrix.yaml, its replacement, what the CLI says)
MISTAKES = [
    ("unknown-field", "  namespace: vllm-spark\n", "  namespace: vllm-spark\n  colour: red\n",
     "publish.colour: unknown key"),
    ("wrong-type", "    boot_timeout_s: 300\n", '    boot_timeout_s: "300"\n',
     "must be a whole number"),
    ("missing-required", "  namespace: vllm-spark\n", "",
     "publish.namespace: missing (it is required)"),
    ("bad-enum", "    engine_from: wheel\n", "    engine_from: docker\n",
     "must be 'source' or 'wheel'"),
    ("bad-list-enum", "    methods: [ngram]\n", "    methods: [medusa]\n", "must be 'none', "),
    ("renamed-field", "    accelerator: cpu\n    # No registry",
     "    gpu: false\n    # No registry", "renamed to `accelerator`"),
    ("bad-name-key", "\n  cpu:\n    description: any x86-64",
     "\n  Cpu:\n    description: any x86-64", "must match the pattern"),
    ("number-out-of-range", "    requests: 16\n", "    requests: 0\n", "greater than or equal"),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_schema_refuses_what_the_cli_refuses_at_the_same_place(mistake, validator,
                                                               tmp_path: Path) -> None:
    _, old, new, said = mistake
    text = (ROOT / "matrix.yaml").read_text()
    assert text.count(old) >= 1, old
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UserError) as cli:
        load_matrix(path)
    assert said in cli.value.message, cli.value.message
    located = load_located(path)
    errors = list(validator.iter_errors(located.data))
    assert errors, "the schema accepted what the CLI refuses"
    places = {located.where(p) for e in errors for p in _schema_paths(e)}
    assert cli.value.where in places, (cli.value.where, places,
                                       [e.message for e in errors])


def test_a_renamed_field_is_answered_with_its_replacement_and_migrate_rewrites_it(
        matrix_dir: Path, capsys) -> None:
    text = (ROOT / "matrix.yaml").read_text()
    old = text.replace("    accelerator: cpu\n    # No registry",
                       "    gpu: false  # the old spelling\n    # No registry", 1)
    path = matrix_dir / "matrix.yaml"
    path.write_text(old)
    with pytest.raises(UserError) as err:
        load_matrix(path)
    assert "targets.cpu.gpu: renamed to `accelerator`" in err.value.message
    assert "migrate" in (err.value.fix or "")
    assert main(["migrate", "--matrix", str(path), "--dry-run"]) == 0
    assert path.read_text() == old, "--dry-run wrote"
    assert main(["migrate", "--matrix", str(path)]) == 0
    assert "gpu: false  # the old spelling -> accelerator: cpu  # the old spelling" in (
        capsys.readouterr().out)
    assert path.read_text() == old.replace("gpu: false  #", "accelerator: cpu  #")
    load_matrix(path)
    assert migrate(path) == []  # nothing left to do


def test_a_migrated_gpu_target_is_then_asked_for_what_migrate_cannot_know(
        matrix_dir: Path) -> None:
    text = (ROOT / "matrix.yaml").read_text()
    path = matrix_dir / "matrix.yaml"
    path.write_text(text.replace("    accelerator: cuda\n    compute_capability: \"12.1\"\n",
                                 "    gpu: true\n", 1))
    assert "    gpu: true\n" in path.read_text()
    migrate(path)
    assert "    accelerator: cuda\n" in path.read_text()
    with pytest.raises(UserError, match="needs compute_capability"):
        load_matrix(path)


@pytest.mark.parametrize(("version", "said"), [(2, "newer than this imagebuild"),
                                               (0, "older than this imagebuild")])
def test_another_schema_version_is_named(version: int, said: str, tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text((ROOT / "matrix.yaml").read_text().replace("schema: 1\n",
                                                               f"schema: {version}\n", 1))
    with pytest.raises(UserError, match=said) as err:
        load_matrix(path)
    line = path.read_text().splitlines().index(f"schema: {version}") + 1
    assert err.value.where and err.value.where.endswith(f":{line}:1")


def test_schema_command_prints_the_shipped_schema(capsys) -> None:
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == SCHEMA_FILE.read_text()
    assert main(["schema", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs/matrix-reference.md").read_text()


def test_example_directories_validate_from_their_own_folder(tmp_path: Path, validator) -> None:
    """The modeline's relative path works where the matrix is copied with docs/ beside."""
    shutil.copytree(ROOT / "examples/cpu-tiny-llama", tmp_path / "examples/cpu-tiny-llama")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / REPO_COPY, tmp_path / REPO_COPY)
    path = tmp_path / "examples/cpu-tiny-llama/matrix.yaml"
    ref = re.search(r"\$schema=(\S+)", path.read_text().splitlines()[0])
    assert ref and (path.parent / ref.group(1)).is_file()
