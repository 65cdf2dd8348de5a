"""After smoke and push: bench every cell, then the regression gate, then latest.

The whole job (`build.py --tag T`) and `build.py promote` share this: each cell's tested
image is measured with its target's `bench:` settings from matrix.yaml and the results
stored beside the release in the registry; then every cell passes the gate (tok/s not
below latest's beyond the threshold, or a written reason) before any `latest` moves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from imagebuild.bench import results, store
from imagebuild.bench.command import bench_image, load_settings, write_outputs
from imagebuild.bench.gate import check_promotion
from imagebuild.release.records import latest_release, set_latest, split_repository
from imagebuild.smoke.expect import inspect_image
from imagebuild.spec.tags import parse_release_tag


def bench_release(client: Any, cells: list, rows: list[dict[str, Any]], out: Path) -> None:
    """Measure each cell's tested image with its target's settings and store the results
    with the release (kept when the registry already has them for this image: a re-run)."""
    for cell, row in zip(cells, rows, strict=True):
        b = cell.target.bench
        if b is None:
            print(f"{row['cell']}: target {cell.target_name} has no bench settings; "
                  "the regression gate will not apply")
            continue
        _, repo = split_repository(row["repository"])
        ref = row["refs"][0]
        info = inspect_image(ref)
        if store.get_results(client, repo, info["Id"]) is not None:
            print(f"{row['cell']}: bench results for {info['Id'][:19]} already stored")
            continue
        prompt_set, load_kw, settings = load_settings(
            b.concurrency, b.prompts, requests=b.requests, duration=None,
            max_tokens=b.max_tokens)
        doc = bench_image(ref, info, prompt_set=prompt_set, levels=b.concurrency,
                          load_kw=load_kw, settings=settings, label=row["release_tag"])
        digest = store.put_results(client, repo, doc)
        md = results.markdown(doc)
        print(md + f"stored with {repo}:{row['release_tag']} ({digest[:19]})")
        write_outputs(doc, out, md)


def threshold_for(lm: Any, cell: Any) -> float:
    b = cell.target.bench
    if b is not None and b.regression_threshold is not None:
        return float(b.regression_threshold)
    return float(lm.matrix.publish.regression_threshold)


def promote_rows(lm: Any, client: Any, cells: list, rows: list[dict[str, Any]], *,
                 accept_regression: str | None, forward_only: bool = False,
                 dry_run: bool = False) -> None:
    """Regression gate for every cell first (a refusal moves nothing), then latest.
    `forward_only` (the whole job): a release older than latest leaves latest alone."""
    ready = []
    for cell, row in zip(cells, rows, strict=True):
        _, repo = split_repository(row["repository"])
        if forward_only:
            _, current = latest_release(client, repo)
            cur, this = parse_release_tag(current or ""), parse_release_tag(row["release_tag"])
            if cur and this and this.sort_key() < cur.sort_key():
                print(f"{repo}: latest stays at the newer {current}; "
                      "use `build.py rollback` to go back")
                continue
        check_promotion(client, repo, row["release_tag"], threshold=threshold_for(lm, cell),
                        accept_regression=accept_regression)
        ready.append((repo, row["release_tag"]))
    for repo, release_tag in ready:
        set_latest(client, repo, release_tag, mode="promote", dry_run=dry_run)
