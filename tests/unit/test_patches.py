"""Engine patch files and the two tools that apply/check them, on tiny fake trees."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.errors import OperationFailed
from imagebuild.vllmsource.patches import check_series, patch_sha256, touched_files

PATCH_DIR = REPO_ROOT / "patches"
# Patches applied to the cpu engine's site-packages as well as to the source tree, so they
# may only touch the Python package.
VLLM_ONLY = ["kv-page-size-pad-mamba.patch", "cpu-ngram-fp64-gumbel.patch"]
APPLY = REPO_ROOT / "images" / "engine" / "files" / "apply-patches.sh"

ORIGINAL = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"


@pytest.fixture
def make_patch(tmp_path: Path):
    def make(name: str, path: str, before: str, after: str) -> Path:
        a, b = tmp_path / f"{name}.a", tmp_path / f"{name}.b"
        a.write_text(before)
        b.write_text(after)
        diff = subprocess.run(
            ["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(a), str(b)],
            capture_output=True, text=True, check=False,
        ).stdout
        assert diff, "identical inputs"
        patch = tmp_path / name
        # With a `diff --git` line, like the real patches (git reads their paths as
        # repository-relative, which is what makes the enclosing-repository trap bite).
        patch.write_text(f"From: test\nSubject: [PATCH] {name}\n---\n"
                         f"diff --git a/{path} b/{path}\n{diff}")
        return patch

    return make


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    # Inside a git repository on purpose: there `git apply` skips paths outside the cwd
    # and exits 0 unless repository discovery is stopped at the tree.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree = tmp_path / "site-packages"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "mod.py").write_text(ORIGINAL)
    return tree


def test_real_patches_are_well_formed() -> None:
    patches = sorted(PATCH_DIR.glob("*.patch"))
    assert {p.name for p in patches} >= set(VLLM_ONLY)
    for patch in patches:
        text = patch.read_text()
        assert text.startswith("From: "), f"{patch.name}: no From: header"
        assert "\nSubject: [PATCH] " in text, f"{patch.name}: no Subject: header"
        # git parses every hunk (counts must match the hunk headers) without a tree.
        numstat = subprocess.run(
            ["git", "apply", "--numstat", str(patch)], capture_output=True, text=True
        )
        assert numstat.returncode == 0, f"{patch.name}: {numstat.stderr}"
        assert numstat.stdout.strip(), f"{patch.name}: no changes"


@pytest.mark.parametrize("name", VLLM_ONLY)
def test_cpu_patches_touch_only_the_vllm_package(name: str) -> None:
    files = touched_files(PATCH_DIR / name)
    assert files
    assert all(f.startswith("vllm/") and f.endswith(".py") for f in files), files


def test_touched_files_reads_git_and_plain_headers(make_patch) -> None:
    patch = make_patch("p", "vllm/mod.py", ORIGINAL, ORIGINAL.replace("1", "3"))
    assert touched_files(patch) == ["vllm/mod.py"]


def test_patch_sha256_is_the_file_bytes_hash(tmp_path: Path) -> None:
    patch = tmp_path / "x.patch"
    patch.write_bytes(b"abc")
    assert patch_sha256(patch) == hashlib.sha256(b"abc").hexdigest()
    patch.write_bytes(b"abd")
    assert patch_sha256(patch) != hashlib.sha256(b"abc").hexdigest()


def test_check_series_is_cumulative_and_leaves_the_tree_alone(fake_tree, make_patch) -> None:
    first = make_patch("01-first.patch", "vllm/mod.py", ORIGINAL, ORIGINAL.replace("1", "3"))
    # Fits only after `first`: its context is first's result.
    after_first = ORIGINAL.replace("1", "3")
    second = make_patch("02-second.patch", "vllm/mod.py", after_first,
                        after_first.replace("return 3", "return 5"))
    check_series(fake_tree, [first, second])
    assert (fake_tree / "vllm" / "mod.py").read_text() == ORIGINAL

    with pytest.raises(OperationFailed) as err:
        check_series(fake_tree, [second])
    assert "02-second.patch" in err.value.message and "vllm/mod.py" in err.value.message

    with pytest.raises(OperationFailed) as err:  # applied twice: the second copy fails
        check_series(fake_tree, [first, first])
    assert "01-first.patch" in err.value.message


def test_check_series_names_a_missing_file(fake_tree, make_patch) -> None:
    patch = make_patch("ghost.patch", "vllm/ghost.py", ORIGINAL, ORIGINAL + "# x\n")
    with pytest.raises(OperationFailed) as err:
        check_series(fake_tree, [patch])
    assert "ghost.patch" in err.value.message and "vllm/ghost.py" in err.value.message


def _run_apply(tree: Path, *patches: Path, path: str | None = None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["sh", str(APPLY), str(tree), *map(str, patches)],
                          capture_output=True, text=True, env=env)


def test_apply_patches_applies_in_order(fake_tree, make_patch) -> None:
    first = make_patch("01-first.patch", "vllm/mod.py", ORIGINAL, ORIGINAL.replace("1", "3"))
    after_first = ORIGINAL.replace("1", "3")
    second = make_patch("02-second.patch", "vllm/mod.py", after_first,
                        after_first.replace("return 3", "return 5"))
    proc = _run_apply(fake_tree, first, second)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "apply-patches: applied 01-first.patch",
        "apply-patches: applied 02-second.patch",
    ]
    assert (fake_tree / "vllm" / "mod.py").read_text() == ORIGINAL.replace("1", "5")


def test_apply_patches_fails_naming_the_bad_patch(fake_tree, make_patch) -> None:
    good = make_patch("01-good.patch", "vllm/mod.py", ORIGINAL, ORIGINAL.replace("1", "3"))
    bad = make_patch("02-bad.patch", "vllm/mod.py", ORIGINAL.replace("2", "9"),
                     ORIGINAL.replace("2", "8"))
    proc = _run_apply(fake_tree, good, bad)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "02-bad.patch" in lines[0] and "vllm/mod.py" in lines[0]
    assert proc.stdout.strip() == "apply-patches: applied 01-good.patch"


def test_apply_patches_without_git_uses_patch(tmp_path, fake_tree, make_patch) -> None:
    if shutil.which("patch") is None:
        pytest.skip("patch(1) not installed")
    # A PATH with the shell tools the script needs but no git.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "patch", "grep", "head", "basename", "dirname", "cat"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    good = make_patch("01-good.patch", "vllm/mod.py", ORIGINAL, ORIGINAL.replace("1", "3"))
    proc = _run_apply(fake_tree, good, path=str(bin_dir))
    assert proc.returncode == 0, proc.stderr
    assert "return 3" in (fake_tree / "vllm" / "mod.py").read_text()
    again = _run_apply(fake_tree, good, path=str(bin_dir))  # already applied: refused
    assert again.returncode == 1
    assert len(again.stderr.strip().splitlines()) == 1 and "01-good.patch" in again.stderr
    assert "(patch)" in again.stderr


def test_apply_patches_rejects_a_missing_patch(fake_tree) -> None:
    proc = _run_apply(fake_tree, fake_tree / "nope.patch")
    assert proc.returncode == 2 and "nope.patch" in proc.stderr


# --- the sdist fetcher, against a fake index on loopback ------------------------------------

@pytest.fixture
def fake_index(tmp_path: Path):
    """A PEP 691 simple index on 127.0.0.1 offering vllm-9.9.9.tar.gz (and a bad copy)."""
    import http.server
    import io
    import json
    import tarfile
    import threading

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = b"VERSION = '9.9.9'\n"
        info = tarfile.TarInfo("vllm-9.9.9/vllm/__init__.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    files = {"/files/vllm-9.9.9.tar.gz": data.getvalue()}
    sha = hashlib.sha256(data.getvalue()).hexdigest()
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            if self.path == "/simple/vllm/":
                body = json.dumps({"files": [
                    {"filename": "vllm-9.9.9.tar.gz", "url": f"{host}/files/vllm-9.9.9.tar.gz",
                     "hashes": {"sha256": sha}, "size": len(files["/files/vllm-9.9.9.tar.gz"])},
                    {"filename": "vllm-9.9.8.tar.gz", "url": f"{host}/files/vllm-9.9.9.tar.gz",
                     "hashes": {"sha256": "0" * 64}},
                ]}).encode()
            elif self.path in files:
                body = files[self.path]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", sha, hits
    finally:
        server.shutdown()


def test_sdist_tree_fetches_verifies_and_reuses(fake_index, tmp_path: Path) -> None:
    from imagebuild.vllmsource.sdist import resolve_sdist, sdist_tree

    index, sha, hits = fake_index
    assert resolve_sdist("9.9.9", index).sha256 == sha
    root = sdist_tree("9.9.9", tmp_path / "cache", index)
    assert (root / "vllm" / "__init__.py").read_text() == "VERSION = '9.9.9'\n"
    downloads = hits.count("/files/vllm-9.9.9.tar.gz")
    assert downloads == 1
    assert sdist_tree("9.9.9", tmp_path / "cache", index) == root  # reused, not re-fetched
    assert hits.count("/files/vllm-9.9.9.tar.gz") == downloads


def test_sdist_with_a_wrong_hash_is_refused(fake_index, tmp_path: Path) -> None:
    from imagebuild.errors import UserError
    from imagebuild.vllmsource.sdist import sdist_tree

    index, _, _ = fake_index
    with pytest.raises(OperationFailed) as err:  # the index lists 0000... for 9.9.8
        sdist_tree("9.9.8", tmp_path / "cache", index)
    assert "sha256" in err.value.message
    assert not list((tmp_path / "cache").glob("vllm-9.9.8*"))  # nothing half-written kept
    with pytest.raises(UserError):
        sdist_tree("1.2.3", tmp_path / "cache", index)
