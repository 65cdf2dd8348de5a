"""The act rehearsal's stand-ins of upload-artifact v5, download-artifact v6,
setup-python v6 and checkout v5 (.github/act-standins/README.md) fail where the actions
fail and write what they write; and the rehearsal hands each run what GitHub's runner
would: a fresh HOME, the pins the stand-ins were written from, the event's repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from imagebuild import REPO_ROOT

STANDINS = REPO_ROOT / ".github" / "act-standins"


def _run(script: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": str(tmp / "ws"),
            "IMAGEBUILD_REHEARSAL_ARTIFACTS": str(tmp / "store"),
            "GITHUB_OUTPUT": str(tmp / "out"), "GITHUB_PATH": str(tmp / "path"),
            "GITHUB_ENV": str(tmp / "env"), "RUNNER_TEMP": str(tmp / "temp")}
    (tmp / "temp").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(STANDINS / script)], env={**base, **env},
                          cwd=tmp / "ws", capture_output=True, text=True, timeout=60)


def _ws(tmp: Path) -> Path:
    ws = tmp / "ws"
    for rel in ("build/resume-state.txt", "build/records/cpu/e/img.json",
                "build/smoke/cpu/e/img/verdict.json", "build/logs/.hidden", "build/logs/a.log"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(rel)
    return ws


def test_upload_roots_at_the_search_paths_and_refuses_a_second_upload_of_a_name(tmp_path):
    _ws(tmp_path)
    paths = ("build/resume-state.txt\nbuild/records/cpu/*/img.json\n"
             "build/smoke/cpu/*/img/\nbuild/logs/")
    proc = _run("upload-artifact/upload.py", tmp_path, NAME="cell-cpu-img", PATHS=paths,
                IF_NONE="warn")
    assert proc.returncode == 0, proc.stdout
    art = tmp_path / "store" / "cell-cpu-img"
    got = sorted(str(p.relative_to(art)) for p in art.rglob("*") if p.is_file())
    assert got == ["logs/a.log", "records/cpu/e/img.json", "resume-state.txt",
                   "smoke/cpu/e/img/verdict.json"]  # rooted at build/, .hidden left out
    again = _run("upload-artifact/upload.py", tmp_path, NAME="cell-cpu-img", PATHS=paths)
    assert again.returncode == 1 and "(409) Conflict: an artifact with this name already " \
        "exists on the workflow run" in again.stdout
    over = _run("upload-artifact/upload.py", tmp_path, NAME="cell-cpu-img",
                PATHS="build/logs/", OVERWRITE="true")
    assert over.returncode == 0 and "Artifact ID is 2" in over.stdout
    assert sorted(p.name for p in art.rglob("*") if p.is_file()) == ["a.log"]  # replaced


def test_upload_of_one_file_and_of_nothing(tmp_path):
    _ws(tmp_path)
    one = _run("upload-artifact/upload.py", tmp_path, NAME="engine-cpu",
               PATHS="build/resume-state.txt", IF_NONE="error")
    assert one.returncode == 0
    assert [p.name for p in (tmp_path / "store" / "engine-cpu").iterdir()] == ["resume-state.txt"]
    none = _run("upload-artifact/upload.py", tmp_path, NAME="x", PATHS="build/nothing.ref",
                IF_NONE="error")
    assert none.returncode == 1 and "No files were found with the provided path: " \
        "build/nothing.ref. No artifacts will be uploaded." in none.stdout
    warn = _run("upload-artifact/upload.py", tmp_path, NAME="x", PATHS="build/nothing.ref")
    assert warn.returncode == 0 and "::warning::No files were found" in warn.stdout
    assert not (tmp_path / "store" / "x").exists()
    bad = _run("upload-artifact/upload.py", tmp_path, NAME="a:b", PATHS="build/logs/")
    assert bad.returncode == 1 and "The artifact name is not valid" in bad.stdout


def test_download_by_name_and_by_pattern(tmp_path):
    _ws(tmp_path)
    for name, path in (("cell-cpu-a", "build/logs/"), ("cell-cpu-b", "build/records/"),
                       ("engine-cpu", "build/resume-state.txt")):
        assert _run("upload-artifact/upload.py", tmp_path, NAME=name, PATHS=path).returncode == 0
    missing = _run("download-artifact/download.py", tmp_path, NAME="engine-gb10", DEST="e")
    assert missing.returncode == 1
    assert "Unable to download artifact(s): Artifact not found for name: engine-gb10" in \
        missing.stdout
    assert _run("download-artifact/download.py", tmp_path, NAME="engine-cpu",
                DEST="build/engines").returncode == 0
    assert (tmp_path / "ws/build/engines/resume-state.txt").exists()
    assert _run("download-artifact/download.py", tmp_path, PATTERN="cell-*",
                DEST="sep").returncode == 0
    assert sorted(p.name for p in (tmp_path / "ws/sep").iterdir()) == ["cell-cpu-a", "cell-cpu-b"]
    one = _run("download-artifact/download.py", tmp_path, PATTERN="cell-cpu-a", DEST="one")
    assert one.returncode == 0 and (tmp_path / "ws/one/a.log").exists()  # one: into path
    assert _run("download-artifact/download.py", tmp_path, PATTERN="cell-*", DEST="merged",
                MERGE="true").returncode == 0
    assert sorted(p.name for p in (tmp_path / "ws/merged").iterdir()) == ["a.log", "cpu"]
    none = _run("download-artifact/download.py", tmp_path, PATTERN="nope-*", DEST="n")
    assert none.returncode == 0 and "Total of 0 artifact(s) downloaded" in none.stdout


def test_setup_python_fails_without_the_version_and_puts_it_first_on_path(tmp_path):
    (tmp_path / "ws").mkdir()
    missing = _run("setup-python/setup.py", tmp_path, VERSION="3.99")
    assert missing.returncode == 1
    assert "The version '3.99' with architecture 'x64' was not found" in missing.stdout
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    bindir = str(Path(sys.executable).parent)
    ok = _run("setup-python/setup.py", tmp_path, VERSION=mine,
              PATH=f"{bindir}:{os.environ['PATH']}")
    assert ok.returncode == 0, ok.stdout
    first = Path((tmp_path / "path").read_text().splitlines()[0])
    out = subprocess.run([str(first / "python3"), "-c",
                          "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()
    assert out == mine
    assert f"python-version={mine}" in (tmp_path / "out").read_text()


def test_checkout_leaves_the_token_only_when_asked(tmp_path):
    origin = tmp_path / "origin"
    subprocess.run(["git", "init", "-q", "-b", "main", str(origin)], check=True)
    subprocess.run(["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    for persist, has in (("true", True), ("false", False)):
        ws = tmp_path / f"ws-{persist}"
        ws.mkdir()
        subprocess.run(["bash", str(STANDINS / "checkout/checkout.sh")], check=True,
                       capture_output=True, env={**os.environ, "GITHUB_WORKSPACE": str(ws),
                                                 "IMAGEBUILD_REHEARSAL_ORIGIN": str(origin),
                                                 "REF": "refs/heads/main", "PERSIST": persist,
                                                 "TOKEN": "ghs_x", "GITHUB_OUTPUT": "/dev/null"})
        cfg = subprocess.run(["git", "-C", str(ws), "config", "--local", "--get-regexp",
                              "extraheader"], capture_output=True, text=True).stdout
        assert ("AUTHORIZATION: basic" in cfg) is has, persist


def test_every_run_gets_a_fresh_runner_home_and_the_runner_context(monkeypatch, tmp_path):
    from tools.rehearse_release.act import Rehearsal

    seen = tmp_path / "seen"
    script = (f'echo "$HOME" >> {seen}; ls -A "$HOME" >> {seen}; '
              f'echo "${{DOCKER_CONFIG:-}}" >> {seen}')
    monkeypatch.setattr(Rehearsal, "command", lambda self, *a, **k: ["sh", "-c", script])
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "hosts-docker"))
    reh = Rehearsal(tmp_path / "r", registry="127.0.0.1:5000")
    reh.work.mkdir(parents=True)
    for _ in range(2):
        assert reh.run("release.yml", "workflow_dispatch", "refs/heads/main").returncode == 0
    lines = seen.read_text().splitlines()
    homes = [line for line in lines if "runner-home-" in line]
    assert len(set(homes)) == 2 and all(Path(h).parent == reh.root for h in homes)
    assert str(Path.home()) not in homes and lines.count("") == 2  # empty, no DOCKER_CONFIG


def test_the_rehearsal_command_gives_what_githubs_runner_gives(tmp_path):
    from tools.rehearse_release.act import STANDIN_OF, Rehearsal, for_act, pinned_actions

    wfs = sorted((REPO_ROOT / ".github/workflows").glob("*.yml"))
    assert {(r, s) for r, s in pinned_actions(wfs)} == set(STANDIN_OF.items())
    reh = Rehearsal(tmp_path, registry="127.0.0.1:5000")
    cmd = reh.command("release.yml", "workflow_dispatch", "refs/heads/main", "1",
                      inputs={"tag": "2026-06-18-x"})
    env = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--env")
    assert env["GITHUB_WORKFLOW_REF"] == \
        "ActRehearsal/imagebuild/.github/workflows/release.yml@refs/heads/main"
    assert env["IMAGEBUILD_REHEARSAL_WORKFLOW"].endswith(".github/workflows/release.yml")
    event = json.loads(Path(cmd[cmd.index("-e") + 1]).read_text())
    assert event["repository"]["visibility"] == "public"
    assert event["repository"]["owner"]["type"] == "Organization"
    ran = Path(cmd[cmd.index("-W") + 1]).read_text()
    source = (REPO_ROOT / ".github/workflows/release.yml").read_text()
    assert "queue: max" in source and not re.search(r"^\s+queue:", ran, re.M)
    import yaml

    def drop_queue(node):  # what act gets: less `queue` and `artifact-metadata` keys
        if isinstance(node, dict):
            return {k: drop_queue(v) for k, v in node.items()
                    if k not in ("queue", "artifact-metadata")}
        return [drop_queue(v) for v in node] if isinstance(node, list) else node

    assert yaml.safe_load(for_act(source)) == drop_queue(yaml.safe_load(source))


def test_each_stand_in_runs_from_a_copy_of_its_folder_alone(tmp_path):
    """act copies an action's folder into its cache and runs it there: a stand-in finds
    the shared lib/ through IMAGEBUILD_REHEARSAL_STANDINS, not beside itself."""
    import shutil

    for folder in ("upload-artifact", "download-artifact", "attest", "setup-python"):
        shutil.copytree(STANDINS / folder, tmp_path / "cache" / folder)
    _ws(tmp_path)
    copy = tmp_path / "cache"
    base = {"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": str(tmp_path / "ws"),
            "IMAGEBUILD_REHEARSAL_ARTIFACTS": str(tmp_path / "store"),
            "IMAGEBUILD_REHEARSAL_STANDINS": str(STANDINS), "GITHUB_OUTPUT": os.devnull}
    for script, env in (("upload-artifact/upload.py", {"NAME": "a", "PATHS": "build/logs/"}),
                        ("download-artifact/download.py", {"NAME": "a", "DEST": "d"}),
                        ("attest/attest.py", {"INPUT_PUSH-TO-REGISTRY": "false",
                                              "INPUT_CREATE-STORAGE-RECORD": "true",
                                              "INPUT_SHOW-SUMMARY": "true"})):
        proc = subprocess.run([sys.executable, str(copy / script)], env={**base, **env},
                              cwd=tmp_path / "ws", capture_output=True, text=True, timeout=60)
        assert "ModuleNotFoundError" not in proc.stderr, (script, proc.stderr)
        if not script.startswith("attest"):
            assert proc.returncode == 0, (script, proc.stdout, proc.stderr)
