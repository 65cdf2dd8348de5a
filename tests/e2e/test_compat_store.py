"""The compatibility table and the acceptance gate on a real registry (distribution 2.8,
no vLLM): the table is an OCI referrer of each release manifest beside the bench results,
found and pulled by a standard tool (oras); `build.py releases` shows its verdict and
`prune` deletes it with its release; and a release whose real stored bench results show
a lower acceptance than latest's is refused as latest unless accepted with a reason.

The bench documents are real runs of the cpu image (docs/data/placement-before-after.json:
ngram accepted 183 of 293 drafted tokens at every level)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from imagebuild import REPO_ROOT
from imagebuild.bench import store
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient
from imagebuild.registry.records import A_GATES, A_IMAGE, A_SMOKE, A_TAG, read_release
from imagebuild.release import compat

pytestmark = pytest.mark.slow
REPO = "vllm-spark/cpu-tiny-ngram"
OLD, NEW = "2026-06-11-v0.23.0-pr41703", "2026-06-18-v0.23.0-dflashfix"
NEWER = "2026-06-25-v0.23.0-next"
GATES = {"lossless": {"status": "pass", "reason": "", "requests": 8, "compared_tokens": 1536,
                      "ties": 0, "tie_rate": 0.0},
         "long_generation": {"status": "pass", "reason": "", "tokens": 448}}


def _real_run() -> dict:
    """A real bench document of the cpu image (levels c=1 and c=4, unflagged)."""
    runs = json.loads((REPO_ROOT / "docs/data/placement-before-after.json").read_text())["runs"]
    run = next(r for r in runs if r["levels"] and all(not lv.get("flags") for lv in r["levels"]))
    return copy.deepcopy(run)


def _release(client: RegistryClient, tag: str, gates: dict | None = None) -> str:
    """A minimal passed release (its own config); its manifest digest."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "tag": tag}).encode()
    cfg = client.put_blob(REPO, config)
    layer = b"layer of " + tag.encode()
    ann = {A_TAG: tag, A_SMOKE: "passed", A_IMAGE: cfg}
    if gates is not None:
        ann[A_GATES] = json.dumps(gates, separators=(",", ":"))
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cfg, "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": client.put_blob(REPO, layer), "size": len(layer)}],
                "annotations": ann}
    return client.put_manifest(REPO, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def _results(client: RegistryClient, tag: str, accepted_share: float = 1.0) -> dict:
    """The real run stored with `tag`; `accepted_share` scales its accepted tokens (a
    drafter that accepts fewer of the same drafts)."""
    doc = _real_run()
    doc["image"] = {**doc["image"], "id": read_release(client, REPO, tag).image_id, "tag": tag}
    for lv in doc["levels"]:
        sd = lv["spec_decode"]
        sd["accepted_tokens"] = round(sd["accepted_tokens"] * accepted_share)
        sd["acceptance"] = sd["accepted_tokens"] / sd["draft_tokens"]
        sd["mean_accepted_length"] = 1 + sd["accepted_tokens"] / sd["drafts"]
    store.put_results(client, REPO, tag, doc)
    return doc


def _env(reg) -> dict[str, str]:
    return {**os.environ, "IMAGEBUILD_REGISTRY": reg.host, "IMAGEBUILD_NAMESPACE": "vllm-spark",
            "IMAGEBUILD_REGISTRY_USER": reg.user, "IMAGEBUILD_REGISTRY_PASSWORD": reg.password}


def test_the_table_is_a_referrer_oras_finds_releases_shows_and_prune_deletes(
        fresh_registry, tmp_path) -> None:
    import jsonschema
    import oras.client
    import oras.schemas

    reg = fresh_registry
    client = reg.client()
    plan = load_plan(REPO_ROOT / "matrix.yaml", NEW, "cpu")
    digests = {OLD: _release(client, OLD, GATES), NEW: _release(client, NEW, GATES)}
    _results(client, OLD)
    _results(client, NEW)
    client.copy_tag(REPO, OLD, "latest")
    doc = compat.gather(client, plan.jobs, plan.lm.matrix.publish)
    [row] = doc["rows"]
    assert row["verdict"] == "passed", row["why"]
    assert row["acceptance"]["levels"]["4"]["rate"] == pytest.approx(183 / 293)
    compat.store_tables(client, plan.jobs, doc, log=lambda _: None)
    compat.store_tables(client, plan.jobs, doc, log=lambda _: None)  # a re-run: no write

    # a standard tool: oras reads the referrers index by the tag schema (distribution 2.8
    # has no referrers API) and finds the table beside the bench results
    assert client.referrers(REPO, digests[NEW]) is None
    o = oras.client.OrasClient(hostname=reg.host, insecure=True, auth_backend="basic")
    o.auth.set_basic_auth(reg.user, reg.password)
    ref = f"{reg.host}/{REPO}"
    index = o.get_manifest(f"{ref}:{referrers.referrers_tag(digests[NEW])}",
                           allowed_media_type=[OCI_INDEX])
    kinds = sorted(m["artifactType"] for m in index["manifests"])
    assert kinds == sorted([store.ARTIFACT_TYPE, compat.ARTIFACT_TYPE])
    [entry] = [m for m in index["manifests"] if m["artifactType"] == compat.ARTIFACT_TYPE]
    assert entry["annotations"][compat.A_VERDICT] == "passed"
    pulled = o.get_manifest(f"{ref}@{entry['digest']}")
    jsonschema.validate(pulled, oras.schemas.manifest)
    assert pulled["subject"]["digest"] == digests[NEW]
    [path] = o.pull(target=f"{ref}@{entry['digest']}", outdir=str(tmp_path))
    assert os.path.basename(path) == compat.FILE_NAME
    assert json.loads(open(path).read())["rows"] == json.loads(json.dumps(doc))["rows"]

    # the commands: the table as markdown, the verdict column of `releases`
    proc = subprocess.run([sys.executable, "build.py", "table", "--tag", NEW, "--target", "cpu"],
                          capture_output=True, text=True, env=_env(reg), timeout=120,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    rows, advice = proc.stdout.split("\n### Which cell to deploy\n")
    assert "| `cpu-tiny-ngram` | passed | passed (8 req, 1,536 tokens) | passed (448 tokens) |" \
        in rows and rows.rstrip().endswith("| passed |")
    # results stored without a plain twin: nothing to compare the cell with, and it says so
    assert "_one configuration measured: nothing to compare_" in advice
    proc = subprocess.run([sys.executable, "build.py", "releases", "--image", "cpu-tiny-ngram"],
                          capture_output=True, text=True, env=_env(reg), timeout=120,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = {ln[2:].split()[0]: ln[2:].split() for ln in proc.stdout.splitlines()
             if ln[2:].startswith((NEW, OLD))}
    assert lines[NEW][3] == "passed" and lines[OLD][3:5] == ["no", "table"]  # GATES_VERDICT

    # prune: the release goes with its table (and results), the kept ones keep theirs
    compat.put_table(client, REPO, OLD, doc)
    old_table = referrers._ours(client, REPO, digests[OLD], compat.ARTIFACT_TYPE)[0][0]["digest"]
    _release(client, NEWER)
    client.copy_tag(REPO, NEWER, "latest")
    from imagebuild.release.prune import prune

    plan_ = prune(client, REPO, 1, log=lambda _: None, settle=0)
    assert plan_.delete == [OLD]  # NEW is the rollback target
    assert referrers.referrers_tag(digests[OLD]) not in client.tags(REPO)
    with pytest.raises(Exception, match="not found|404"):
        client.get_manifest(REPO, old_table)
    assert compat.stored_table(client, REPO, NEW) is not None


def test_lower_acceptance_is_refused_as_latest_unless_accepted(fresh_registry) -> None:
    """`build.py promote` end to end: cpu's acceptance_threshold (0.05) from matrix.yaml,
    the cell's drafter from its plan, the gate, the lease, the move."""
    reg = fresh_registry
    client = reg.client()
    for tag in (OLD, NEW):
        _release(client, tag, GATES)
    _results(client, OLD)  # 183 of 293 accepted
    _results(client, NEW, accepted_share=0.8)  # the same drafts, 146 accepted: -20 %
    client.copy_tag(REPO, OLD, "latest")
    env = {**_env(reg), "IMAGEBUILD_LEASE_SETTLE": "0"}

    def promote(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "build.py", "promote", "--tag", NEW, "--target",
                               "cpu", *extra], capture_output=True, text=True, env=env,
                              timeout=120, cwd=REPO_ROOT)

    no = promote()
    assert no.returncode == 2, no.stderr
    assert "accepts fewer drafted tokens than latest, by more than 5%" in no.stderr
    assert "c=4: acceptance 0.50 vs 0.62 (-20.2%)" in no.stderr
    assert "--accept-acceptance-drop" in no.stderr
    assert client.digest(REPO, "latest") == client.digest(REPO, OLD)
    # a reason for another gate is no answer
    assert promote("--accept-regression", "slower is fine").returncode == 2
    ok = promote("--accept-acceptance-drop", "new drafter, longer drafts on purpose")
    assert ok.returncode == 0, ok.stderr
    assert client.digest(REPO, "latest") == client.digest(REPO, NEW)
    assert store.stored(client, REPO, NEW).annotations[store.A_ACCEPTED_DROP] == \
        "new drafter, longer drafts on purpose"
    # the table of that release says it was accepted, with the reason
    plan = load_plan(REPO_ROOT / "matrix.yaml", NEW, "cpu")
    [row] = compat.gather(client, plan.jobs, plan.lm.matrix.publish)["rows"]
    assert row["acceptance"]["status"] == "accepted" and row["verdict"] == "accepted"
    assert "longer drafts on purpose" in row["acceptance"]["reason"]
