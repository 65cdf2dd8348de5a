"""What the SBOM and provenance add to one cell of a release, on a built serve image:
the three parts of imagebuild/supplychain/attach.py timed apart, each RUNS times.

    flock /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/supply_chain_cost.py \
        [--image REF] [--runs 3]

1. probe: one `docker run --rm --network none` of the image's python3 reading the dpkg
   status, every Python distribution and the model files (hashing them);
2. documents: findings against the lock, the CycloneDX SBOM, the in-toto statement;
3. store: both documents pushed as referrers of a release manifest on a real registry
   (distribution, started here on 127.0.0.1; the release is a minimal manifest: pushing
   the image itself is publish's cost, not this one's).
Prints one line per part (median, min, max seconds) and the documents' sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagebuild import REPO_ROOT  # noqa: E402
from imagebuild.lock.lockfile import read_lock  # noqa: E402
from imagebuild.plan import load_plan  # noqa: E402
from imagebuild.registry import referrers  # noqa: E402
from imagebuild.registry.client import OCI_MANIFEST  # noqa: E402
from imagebuild.registry.records import A_IMAGE, A_SMOKE, A_TAG, read_release  # noqa: E402
from imagebuild.supplychain import provenance, sbom  # noqa: E402
from imagebuild.supplychain.attach import probe_image  # noqa: E402
from imagebuild.supplychain.expected import expected_for  # noqa: E402
from tests.support.cpu_build import CPU_SERVE_REF, TAG  # noqa: E402
from tests.support.registry.server import start_registry  # noqa: E402


def _release(client, repo: str, tag: str) -> None:  # noqa: ANN001
    config = json.dumps({"architecture": "amd64", "os": "linux", "tag": tag}).encode()
    cfg = client.put_blob(repo, config)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": cfg, "size": len(config)},
                "layers": [], "annotations": {A_TAG: tag, A_SMOKE: "passed", A_IMAGE: cfg}}
    client.put_manifest(repo, tag, json.dumps(manifest).encode(), OCI_MANIFEST)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--image", default=CPU_SERVE_REF)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    job = load_plan(REPO_ROOT / "matrix.yaml", TAG, "cpu").jobs[0]
    lock = read_lock(REPO_ROOT)
    assert lock is not None
    ex = expected_for(job, lock, REPO_ROOT)
    times: dict[str, list[float]] = {"probe": [], "documents": [], "store": []}
    with tempfile.TemporaryDirectory() as tmp:
        reg = start_registry(Path(tmp))
        try:
            client = reg.client()
            repo, tag = job.image.repository, str(job.tag)
            _release(client, repo, tag)
            rel = read_release(client, repo, tag)
            assert rel is not None
            subject = sbom.Subject(job.image.name, tag, rel.digest, rel.image_id, None)
            for _ in range(a.runs):
                t0 = time.monotonic()
                snap = probe_image(a.image, {w.role: w.path for w in ex.weights})
                t1 = time.monotonic()
                found = sbom.findings(snap, ex)
                text = sbom.build_sbom(snap, ex, subject, found)
                commit, dirty = provenance.repository_commit(REPO_ROOT)
                stmt = provenance.build_statement(
                    subject, ex, pins=job.pins, lock_entries={"engine": ex.engine},
                    commit=commit, dirty=dirty, repo_uri=f"git+file://{REPO_ROOT}",
                    env=os.environ)
                t2 = time.monotonic()
                referrers.put_artifact(client, repo, rel, text.encode(),
                                       artifact_type=referrers.SBOM_TYPE, file_name="sbom.cdx.json")
                referrers.put_artifact(client, repo, rel, stmt.encode(),
                                       artifact_type=referrers.PROVENANCE_TYPE,
                                       file_name="provenance.intoto.json")
                t3 = time.monotonic()
                for key, secs in (("probe", t1 - t0), ("documents", t2 - t1),
                                  ("store", t3 - t2)):
                    times[key].append(secs)
        finally:
            reg.stop()
    print(f"image {a.image}: {len(snap['python'])} Python distributions, "
          f"{len(sbom.dpkg_packages(snap['dpkg_status']))} dpkg packages, "
          f"{sum(len((w or {}).get('files') or []) for w in snap['weights'].values())} "
          f"weight files; SBOM {len(text) / 1024:.0f} KiB, provenance "
          f"{len(stmt) / 1024:.0f} KiB; {len(found)} finding(s)")
    total = [sum(x) for x in zip(*times.values(), strict=True)]
    for key, xs in [*times.items(), ("total", total)]:
        print(f"{key:<10} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  "
              f"max {max(xs):6.2f}  ({a.runs} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
