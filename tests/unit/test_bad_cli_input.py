"""Malformed input beyond matrix.yaml (tests/unit/test_bad_input.py has those): a corrupt
or hand-edited matrix.lock.json, environment variables, release tags and command-line
misuse, each through the real CLI.

Every case asserts: the exit code (2 for bad input), no traceback, a location (the
file:line:col where a file is involved, else the option or variable named), a `fix:`,
nothing written (the matrix folder, the output paths and the repository's build/ stay
as they were), under 2 s and 256 MB of Python allocations. No case reaches Docker, a
registry or the Hub: the Docker seam and HTTP refuse to be used during the test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from tests.support.bad_input import LIMIT_BYTES, LIMIT_S, run_cli_measured, tree_snapshot

TAG = "2026-06-18-dflashfix"
LOCATION = re.compile(r"(\S+?):(\d+):(\d+)")
EDIT = Callable[[Path], None]


def lock_json(change: Callable[[dict], None]) -> EDIT:
    """Edit matrix.lock.json as data, written back indented (as `lock` writes it)."""
    def edit(root: Path) -> None:
        path = root / "matrix.lock.json"
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return edit


def lock_text(text: str | bytes) -> EDIT:
    def edit(root: Path) -> None:
        path = root / "matrix.lock.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return edit


def lock_replace(old: str, new: str) -> EDIT:
    def edit(root: Path) -> None:
        path = root / "matrix.lock.json"
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))
    return edit


def make_file(rel: str, content: str | bytes = "x\n") -> EDIT:
    def edit(root: Path) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return edit


def make_dir(rel: str) -> EDIT:
    return lambda root: (root / rel).mkdir(parents=True, exist_ok=True)


def then(*edits: EDIT) -> EDIT:
    def edit(root: Path) -> None:
        for e in edits:
            e(root)
    return edit


def _set(path: tuple, value) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        for p in path[:-1]:
            data = data[p]
        data[path[-1]] = value
    return change


def _del(path: tuple) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        for p in path[:-1]:
            data = data[p]
        del data[path[-1]]
    return change


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]  # {m}: the matrix, {d}: its folder
    expect: str  # words the output must hold
    where: str  # a file name (file:line:col must name it) or an option/variable name
    edit: EDIT | None = None
    env: dict[str, str] = field(default_factory=dict)
    code: int = 2
    line_of: str | None = None  # the location's line must hold this text (in `where`)


PLAN = ["plan", "--tag", TAG, "--target", "cpu", "--matrix", "{m}"]
CHECK = ["lock", "--check", "--matrix", "{m}"]
BUILD = ["build", "--tag", TAG, "--target", "cpu", "--matrix", "{m}", "--out", "{d}/out"]
LOCK = "matrix.lock.json"
DIGEST_PATH = ("bases", "gb10", "digest")

CASES = [
    # --- a corrupt or hand-edited matrix.lock.json --------------------------------------------
    Case("lock-truncated", PLAN, "is not valid JSON", LOCK,
         edit=lambda r: (r / LOCK).write_text((r / LOCK).read_text()[:500])),
    Case("lock-trailing-comma", PLAN, "is not valid JSON", LOCK,
         edit=lock_replace('"status": "resolved"\n    }\n  },',
                           '"status": "resolved",\n    }\n  },')),
    Case("lock-empty-file", PLAN, "is not valid JSON", LOCK, edit=lock_text("")),
    Case("lock-a-list", PLAN, "must be a JSON object, not a list", LOCK, edit=lock_text("[]")),
    Case("lock-version-2", PLAN, "has version 2, expected 1", LOCK,
         edit=lock_json(_set(("version",), 2))),
    Case("lock-version-missing", PLAN, "has version None", LOCK,
         edit=lock_json(_del(("version",)))),
    Case("lock-version-string", PLAN, "has version '1'", LOCK,
         edit=lock_json(_set(("version",), "1"))),
    Case("lock-models-a-list", PLAN, "models: must be a mapping", LOCK,
         edit=lock_json(_set(("models",), [])), line_of='"models"'),
    Case("lock-engines-missing", PLAN, "engines: missing (it is required)", LOCK,
         edit=lock_json(_del(("engines",)))),
    Case("lock-digest-md5", PLAN, "is not sha256:<64 lowercase hex>", LOCK,
         edit=lock_json(_set(DIGEST_PATH, "md5:" + "a" * 32)), line_of='"digest": "md5'),
    Case("lock-digest-short", PLAN, "is not sha256:<64 lowercase hex>", LOCK,
         edit=lock_json(_set(DIGEST_PATH, "sha256:abc")), line_of='"digest": "sha256:abc"'),
    Case("lock-digest-uppercase", PLAN, "is not sha256:<64 lowercase hex>", LOCK,
         edit=lock_json(_set(("bases", "gb10", "runtime_digest"), "sha256:" + "A" * 64)),
         line_of='"runtime_digest": "sha256:AAAA'),
    Case("lock-digest-a-number", PLAN, "must be text", LOCK,
         edit=lock_json(_set(DIGEST_PATH, 42)), line_of='"digest": 42'),
    Case("lock-commit-short", PLAN, "is not 40 lowercase hex characters", LOCK,
         edit=lock_json(_set(("engines", "dflashfix", "gb10", "source", "commit"), "91df0fad")),
         line_of='"commit": "91df0fad"'),
    Case("lock-patch-sha-not-hex", PLAN, "is not 64 lowercase hex characters", LOCK,
         edit=lock_json(_set(("engines", "dflashfix", "cpu", "patches", 0, "sha256"),
                             "not-a-sha")), line_of='"sha256": "not-a-sha"'),
    Case("lock-status-unknown", PLAN, "must be 'resolved' or 'unresolved'", LOCK,
         edit=lock_json(_set(("engines", "dflashfix", "cpu", "status"), "ok")),
         line_of='"status": "ok"'),
    Case("lock-status-missing", PLAN, "status: missing (it is required)", LOCK,
         edit=lock_json(_del(("engines", "dflashfix", "cpu", "status")))),
    Case("lock-unknown-key", PLAN, "unknown key", LOCK,
         edit=lock_json(_set(("bases", "cpu", "note"), "hand-written")), line_of='"note"'),
    Case("lock-file-size-a-string", PLAN, "must be a whole number", LOCK,
         edit=lock_json(_set(("models", "tiny", "files", 0, "size"), "12")),
         line_of='"size": "12"'),
    Case("lock-file-path-absolute", PLAN, "is absolute", LOCK,
         edit=lock_json(_set(("models", "tiny", "files", 0, "path"), "/etc/passwd")),
         line_of='"path": "/etc/passwd"'),
    Case("lock-file-path-dot-dot", PLAN, "leaves its folder", LOCK,
         edit=lock_json(_set(("models", "tiny", "files", 0, "path"), "../../x")),
         line_of='"path": "../../x"'),
    Case("lock-file-path-newline", PLAN, "holds a line feed", LOCK,
         edit=lock_json(_set(("models", "tiny", "files", 0, "path"), "a\nRUN x"))),
    Case("lock-entry-null", PLAN, "must be a mapping", LOCK,
         edit=lock_json(_set(("models", "tiny"), None))),
    Case("lock-hub-repository-path", PLAN, "is not a Hub repository id", LOCK,
         edit=lock_json(_set(("drafters", "zlab", "repository"), "../../etc")),
         line_of='"repository": "../../etc"'),
    Case("lock-not-utf8", PLAN, "is not UTF-8", LOCK, edit=lock_text(b'{"version": 1, "\xff"}')),
    Case("lock-a-directory", PLAN, "is not a regular file", LOCK,
         edit=lambda r: ((r / LOCK).unlink(), (r / LOCK).mkdir())),
    Case("lock-nested-ten-thousand-deep", PLAN, "matrix.lock.json", LOCK,
         edit=lock_text('{"version": 1, "models": ' + "[" * 10000 + "]" * 10000 + "}")),
    Case("lock-of-another-matrix", CHECK, "matrix.yaml has no engine 'other'", "matrix.yaml",
         edit=lock_json(lambda d: d["engines"].update(other=d["engines"].pop("pr41703")))),
    Case("lock-wheel-sha-edited", CHECK, "engines.dflashfix.cpu.wheel.sha256", "matrix.yaml",
         edit=lock_json(_set(("engines", "dflashfix", "cpu", "wheel", "sha256"), "0" * 64))),
    Case("lock-missing-for-build", BUILD, "no matrix.lock.json", "matrix.yaml",
         edit=lambda r: (r / LOCK).unlink()),
    # --- environment variables ----------------------------------------------------------------
    Case("env-registry-with-scheme", PLAN, "has a URL scheme", "IMAGEBUILD_REGISTRY",
         env={"IMAGEBUILD_REGISTRY": "https://registry.example.com"}),
    Case("env-registry-newline", PLAN, "IMAGEBUILD_REGISTRY", "IMAGEBUILD_REGISTRY",
         env={"IMAGEBUILD_REGISTRY": "127.0.0.1:5000\nRUN x"}),
    Case("env-registry-port-zero", PLAN, "outside 1..65535", "IMAGEBUILD_REGISTRY",
         env={"IMAGEBUILD_REGISTRY": "127.0.0.1:0"}),
    Case("env-namespace-dot-dot", PLAN, "not a valid repository path", "IMAGEBUILD_NAMESPACE",
         env={"IMAGEBUILD_NAMESPACE": "../etc"}),
    Case("env-namespace-empty", PLAN, "namespace is empty", "IMAGEBUILD_NAMESPACE",
         env={"IMAGEBUILD_NAMESPACE": ""}),
    Case("env-target-unknown", ["plan", "--tag", TAG, "--matrix", "{m}"],
         "is not a target of matrix.yaml", "IMAGEBUILD_TARGET",
         env={"IMAGEBUILD_TARGET": "h100"}),
    Case("env-target-newline", ["plan", "--tag", TAG, "--matrix", "{m}"],
         "is not a target of matrix.yaml", "IMAGEBUILD_TARGET",
         env={"IMAGEBUILD_TARGET": "cpu\n"}),
    Case("env-ca-bundle-missing", BUILD, "No such file or directory", "IMAGEBUILD_CA_BUNDLE",
         env={"IMAGEBUILD_CA_BUNDLE": "/nonexistent/ca.pem"}),
    Case("env-ca-bundle-a-directory", BUILD, "Is a directory", "IMAGEBUILD_CA_BUNDLE",
         env={"IMAGEBUILD_CA_BUNDLE": "/tmp"}),
    Case("env-sccache-file-missing", BUILD, "No such file", "IMAGEBUILD_SCCACHE_ENV_FILE",
         env={"IMAGEBUILD_SCCACHE_ENV_FILE": "/nonexistent/sccache.env"}),
    Case("env-debian-mirror-not-a-url", BUILD, "is not a mirror URL", "IMAGEBUILD_DEBIAN_MIRROR",
         env={"IMAGEBUILD_DEBIAN_MIRROR": "mirror with spaces"}),
    Case("env-lease-ttl-garbage", ["promote", "--tag", TAG, "--target", "cpu", "--matrix",
                                   "{m}"], "is not a number of seconds", "IMAGEBUILD_LEASE_TTL",
         env={"IMAGEBUILD_LEASE_TTL": "five minutes"}),
    Case("env-lease-settle-negative", ["rollback", "--to", TAG, "--matrix", "{m}"],
         "is not a number of seconds", "IMAGEBUILD_LEASE_SETTLE",
         env={"IMAGEBUILD_LEASE_SETTLE": "-1"}),
    # --- release tags -------------------------------------------------------------------------
    Case("tag-not-a-date", ["plan", "--tag", "2026-13-45-dflashfix", "--target", "cpu",
                            "--matrix", "{m}"], "is not a calendar date", "--tag"),
    Case("tag-unknown-patch-set", ["plan", "--tag", "2026-06-18-nightly", "--target", "cpu",
                                   "--matrix", "{m}"], "no engine patch set named", "--tag"),
    Case("tag-uppercase", ["plan", "--tag", "2026-06-18-DFLASHFIX", "--target", "cpu",
                           "--matrix", "{m}"], "is not DATE-NAME", "--tag"),
    Case("tag-trailing-newline", ["plan", "--tag", TAG + "\n", "--target", "cpu",
                                  "--matrix", "{m}"], "is not DATE-NAME", "--tag"),
    Case("tag-wrong-version", ["plan", "--tag", "2026-06-18-v0.24.0-dflashfix", "--target",
                               "cpu", "--matrix", "{m}"], "but engine dflashfix is 0.23.0",
         "--tag"),
    Case("tag-version-garbage", ["plan", "--tag", "2026-06-18-v0.23.x-dflashfix", "--target",
                                 "cpu", "--matrix", "{m}"], "is not a version", "--tag"),
    Case("tag-empty", ["plan", "--tag", "", "--target", "cpu", "--matrix", "{m}"],
         "is not DATE-NAME", "--tag"),
    Case("tag-day-first", ["plan", "--tag", "18-06-2026-dflashfix", "--target", "cpu",
                           "--matrix", "{m}"], "is not DATE-NAME", "--tag"),
    Case("rollback-to-garbage", ["rollback", "--to", "yesterday", "--matrix", "{m}"],
         "neither DATE-NAME nor DATE-vX.Y.Z-NAME", "--to"),
    Case("rollback-to-bad-date", ["rollback", "--to", "2026-02-30-pr41703", "--matrix", "{m}"],
         "is not a calendar date", "--to"),
    Case("bench-baseline-garbage", ["bench", "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:x",
                                    "--baseline", "last-week"], "neither DATE-NAME",
         "--baseline"),
    # --- command-line misuse ------------------------------------------------------------------
    Case("render-out-is-a-file", ["render", "--matrix", "{m}", "--out", "{d}/matrix.yaml"],
         "is a file; give a directory", "--out"),
    Case("render-out-under-a-file", ["render", "--matrix", "{m}", "--out",
                                     "{d}/matrix.yaml/rendered"], "is a file", "--out"),
    Case("render-matrix-is-a-directory", ["render", "--matrix", "{d}/patches"],
         "is a directory, not a matrix file", "patches"),
    Case("lock-matrix-is-a-directory", ["lock", "--check", "--matrix", "{d}/locked"],
         "is a directory, not a matrix file", "locked"),
    Case("plan-only-matches-nothing", ["plan", "--tag", TAG, "--target", "cpu", "--only",
                                       "nothing-*", "--matrix", "{m}"], "no cell matches",
         "--only"),
    Case("plan-unknown-target", ["plan", "--tag", TAG, "--target", "h100", "--matrix", "{m}"],
         "is not a target of matrix.yaml", "--target"),
    Case("plan-unknown-format", PLAN + ["--format", "xml"], "invalid choice: 'xml'", "--format"),
    Case("plan-misspelt-option", PLAN + ["--fromat", "json"], "plan has no option --fromat",
         "--fromat"),
    # the typo of a required option is named, not the option it left out
    Case("plan-misspelt-required-option", ["plan", "--tga", TAG],
         "plan has no option --tga (did you mean --tag?)", "--tga"),
    Case("whole-job-misspelt-option", ["--tga", TAG], "release has no option --tga", "--tga"),
    Case("unknown-command", ["frobnicate"], "invalid choice: 'frobnicate'", "frobnicate"),
    Case("tag-missing-its-value", ["plan", "--tag"], "expected one argument", "--tag"),
    Case("prune-keep-zero", ["prune", "--keep", "0", "--matrix", "{m}"], "outside 1..1000000",
         "--keep"),
    Case("prune-keep-negative", ["prune", "--keep", "-3", "--matrix", "{m}"],
         "outside 1..1000000", "--keep"),
    Case("runner-clean-keep-words", ["runner-clean", "--keep", "all", "--matrix", "{m}"],
         "is not a whole number", "--keep"),
    Case("bench-concurrency-zero", ["bench", "--concurrency", "0", "--tag", TAG],
         "comma-separated positive integers", "--concurrency"),
    Case("bench-concurrency-words", ["bench", "--concurrency", "1,many", "--tag", TAG],
         "comma-separated positive integers", "--concurrency"),
    Case("bench-requests-zero", ["bench", "--requests", "0", "--tag", TAG],
         "outside 1..1000000", "--requests"),
    Case("bench-duration-negative", ["bench", "--duration", "-5", "--tag", TAG],
         "not a number of seconds", "--duration"),
    Case("bench-duration-nan", ["bench", "--duration", "nan", "--tag", TAG],
         "not a number of seconds", "--duration"),
    Case("bench-requests-and-duration", ["bench", "--requests", "5", "--duration", "9",
                                         "--tag", TAG], "not allowed with argument",
         "--duration"),
    Case("bench-max-tokens-zero", ["bench", "--max-tokens", "0", "--tag", TAG],
         "outside 1..1000000", "--max-tokens"),
    Case("bench-client-cpus-garbage", ["bench", "--client-cpus", "a-b", "--tag", TAG],
         "CPU numbers such as", "--client-cpus"),
    Case("bench-server-cpus-shell", ["bench", "--server-cpus", "0;rm -rf /", "--tag", TAG],
         "CPU numbers such as", "--server-cpus"),
    Case("bench-image-ref-garbage", ["bench", "not a reference!"], "IMAGE_REF", "IMAGE_REF"),
    Case("bench-url-not-http", ["bench", "--url", "ftp://127.0.0.1:21"],
         "is not a server's base URL", "--url"),
    Case("bench-image-and-url", ["bench", "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:x",
                                 "--url", "http://127.0.0.1:8000"],
         "give one of IMAGE_REF, --tag T or --url URL", "--url"),
    Case("bench-nothing-to-measure", ["bench"], "give one of IMAGE_REF, --tag T or --url URL",
         "IMAGE_REF"),
    Case("bench-store-with-url", ["bench", "--url", "http://127.0.0.1:8000", "--store"],
         "--store keeps results with a release", "--store"),
    Case("bench-store-not-a-release", ["bench", "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:dev",
                                       "--store"], "is not a release", "--store"),
    Case("bench-prompts-not-utf8", ["bench", "--url", "http://127.0.0.1:8000", "--prompts",
                                    "{d}/p.jsonl"], "is not UTF-8", "p.jsonl",
         edit=make_file("p.jsonl", b'{"prompt": "\xff"}\n')),
    Case("bench-prompts-bad-line", ["bench", "--url", "http://127.0.0.1:8000", "--prompts",
                                    "{d}/p.jsonl"], "not JSON", "p.jsonl",
         edit=make_file("p.jsonl", '{"prompt": "a"}\n{"prompt": \n')),
    Case("bench-out-is-a-file", ["bench", "--url", "http://127.0.0.1:8000", "--out",
                                 "{d}/matrix.yaml"], "is a file", "--out"),
    Case("smoke-image-and-tag", ["smoke", "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:x",
                                 "--tag", TAG, "--matrix", "{m}"], "not both", "IMAGE_REF"),
    Case("smoke-nothing", ["smoke", "--matrix", "{m}"], "give IMAGE_REF or --tag T",
         "IMAGE_REF"),
    Case("smoke-image-ref-garbage", ["smoke", "Not/A/Ref:!"], "IMAGE_REF", "IMAGE_REF"),
    Case("smoke-image-with-only", ["smoke", "127.0.0.1:5000/vllm-spark/cpu-tiny-ngram:x",
                                   "--only", "cpu/*"], "IMAGE_REF is one image", "--only"),
    Case("smoke-boot-timeout-negative", ["smoke", "--tag", TAG, "--boot-timeout", "-5"],
         "not a number of seconds", "--boot-timeout"),
    Case("smoke-stall-limit-zero", ["smoke", "--tag", TAG, "--stall-limit", "0"],
         "not a number of seconds", "--stall-limit"),
    Case("smoke-out-with-a-quote", ["smoke", "--tag", TAG, "--out", '{d}/a"b'],
         "passed through a shell", "--out"),
    Case("smoke-out-is-a-file", ["smoke", "--tag", TAG, "--out", "{d}/matrix.yaml"],
         "is a file", "--out"),
    Case("build-out-is-a-file", ["build", "--tag", TAG, "--target", "cpu", "--matrix", "{m}",
                                 "--out", "{d}/matrix.yaml"], "is a file", "--out"),
    Case("release-out-with-a-dollar", ["--tag", TAG, "--target", "cpu", "--out",
                                       "{d}/$HOME"], "passed through a shell", "--out"),
    Case("release-no-bench-without-reason", ["--tag", TAG, "--target", "cpu", "--matrix",
                                             "{m}", "--no-bench"], "--no-bench measures nothing",
         "--accept-unmeasured"),
    Case("release-empty-reason", ["--tag", TAG, "--target", "cpu", "--accept-regression", " "],
         "the reason is empty", "--accept-regression"),
    Case("promote-reason-with-newline", ["promote", "--tag", TAG, "--accept-unmeasured",
                                         "a\nb"], "must be one line", "--accept-unmeasured"),
    Case("lock-check-and-update", ["lock", "--check", "--update", "tiny", "--matrix", "{m}"],
         "not both", "--update"),
    Case("lock-update-unknown", ["lock", "--update", "nonexistent", "--matrix", "{m}"],
         "not a model, drafter, target or engine", "--update"),
    Case("notes-asset-url-alone", ["notes", "--tag", TAG, "--asset-url",
                                   "https://example.invalid/dl/", "--matrix", "{m}"],
         "--asset-url is the prefix", "--asset-dir"),
    Case("notes-asset-dir-is-a-file", ["notes", "--tag", TAG, "--asset-dir", "{d}/matrix.yaml",
                                       "--matrix", "{m}"], "is a file", "--asset-dir"),
    Case("history-out-is-a-file", ["history", "--out", "{d}/matrix.yaml", "--matrix", "{m}"],
         "is a file", "--out"),
    Case("rehearse-jobs-zero", ["rehearse", "--jobs", "0", "--matrix", "{m}"],
         "outside 1..1000000", "--jobs"),
    Case("pins-watch-out-is-a-file", ["pins", "watch", "--out", "{d}/matrix.yaml",
                                      "--matrix", "{m}"], "is a file", "--out"),
]


class Refuse:
    """Docker and HTTP doubles: any use means the input was not refused early enough."""

    def __getattr__(self, name: str):
        raise AssertionError(f"Docker was asked for {name!r}")



def _repo_build() -> list[str]:
    build = REPO_ROOT / "build"
    return sorted(str(p) for p in build.rglob("*")) if build.exists() else []


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    import requests

    from imagebuild import docker

    monkeypatch.setattr(docker, "_engine", Refuse())

    def no_network(self, method, url, *a, **kw):  # noqa: ANN001
        raise AssertionError(f"a request to {url} was made")

    monkeypatch.setattr(requests.Session, "request", no_network)
    for var in ("IMAGEBUILD_REGISTRY", "IMAGEBUILD_NAMESPACE", "IMAGEBUILD_TARGET",
                "IMAGEBUILD_CA_BUNDLE", "IMAGEBUILD_SCCACHE_ENV_FILE", "IMAGEBUILD_DEBIAN_MIRROR",
                "IMAGEBUILD_LEASE_TTL", "IMAGEBUILD_LEASE_SETTLE"):
        monkeypatch.delenv(var, raising=False)


def test_there_are_at_least_sixty_cases() -> None:
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_cli_input(case: Case, matrix_dir: Path, guarded, capsys, monkeypatch):
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    if case.edit:
        case.edit(matrix_dir)
    argv = [a.replace("{m}", str(matrix_dir / "matrix.yaml")).replace("{d}", str(matrix_dir))
            for a in case.argv]
    before, build_before = tree_snapshot(matrix_dir), _repo_build()
    code, output, elapsed, peak = run_cli_measured(argv, case.id, capsys)
    assert code == case.code, output
    assert "Traceback" not in output, output
    assert case.expect in output, output
    assert "fix:" in output, output
    assert elapsed < LIMIT_S, f"{case.id} took {elapsed:.2f} s of CPU"
    assert peak < LIMIT_BYTES, f"{case.id}: {peak / 2**20:.0f} MB allocated"
    assert tree_snapshot(matrix_dir) == before, "something was written"
    assert _repo_build() == build_before, "something was written under build/"
    if case.where.endswith((".json", ".yaml", ".jsonl")) or case.where in ("patches", "locked"):
        located = [m for m in LOCATION.finditer(output) if case.where in m.group(1)]
        assert located, f"no {case.where}:line:col in {output}"
        if case.line_of:
            text = (matrix_dir / case.where).read_text()
            line = text.count("\n", 0, text.index(case.line_of)) + 1
            assert int(located[0].group(2)) == line, f"expected line {line}: {output}"
    else:
        assert case.where in output, f"{case.where} not named in {output}"
