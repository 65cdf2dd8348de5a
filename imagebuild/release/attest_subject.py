"""What release.yml's sign job signs, read back from the registry, never handed over by
the cell job that ran the model's code: the release's manifest digest for the tag and the
SBOM that publish stored with it (made for that very image). Writes
<out>/<target>/<image>/{sbom.cdx.json,subject.txt} and prints name=, digest=, sbom= for
$GITHUB_OUTPUT (`make attest-subject`). Exit 1 when the registry lacks either (publish
did not finish: re-run the cell job), 2 for bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imagebuild import buildfolder
from imagebuild.errors import ImagebuildError, OperationFailed
from imagebuild.plan import load_plan
from imagebuild.registry import referrers
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import read_release
from imagebuild.supplychain.attach import SBOM_FILE


def subject_files(client, job, out: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    repo, tag = job.image.repository, str(job.tag)
    rel = read_release(client, repo, tag)
    if rel is None:
        raise OperationFailed(f"{job.id}: {job.image.name}:{tag} is not in the registry",
                              fix="re-run the cell job: it publishes the release")
    sboms = [d for d in referrers.listed(client, repo, rel.digest, referrers.SBOM_TYPE)
             if (d.get("annotations") or {}).get(referrers.A_IMAGE_ID) == rel.image_id]
    if not sboms:
        raise OperationFailed(f"{job.id}: no SBOM of image {rel.image_id[:19]} is stored "
                              f"with {repo}:{tag}",
                              fix="re-run the cell job: publish stores it")
    raw, _media, _ = client.get_manifest(repo, sboms[0]["digest"])
    body = client.get_blob(repo, json.loads(raw)["layers"][0]["digest"])
    folder = out / job.cell.target_name / job.cell.image
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SBOM_FILE).write_bytes(body)
    fields = {"name": job.image.name, "digest": rel.digest, "sbom": str(folder / SBOM_FILE),
              "tag": tag}
    (folder / "subject.txt").write_text("".join(f"{k}={v}\n" for k, v in fields.items()))
    return fields


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m imagebuild.release.attest_subject")
    p.add_argument("--tag", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--image", "--only", dest="only", required=True,
                   help="the cell (its image, as `build.py --image`)")
    p.add_argument("--out", type=Path, default=Path(buildfolder.BUILD, buildfolder.SUPPLY_CHAIN))
    p.add_argument("--matrix", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        plan = load_plan(args.matrix, args.tag, args.target, args.only)
        (job,) = plan.jobs
        fields = subject_files(RegistryClient(plan.destination.registry), job, args.out)
    except ImagebuildError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    print("".join(f"{k}={fields[k]}\n" for k in ("name", "digest", "sbom")), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
