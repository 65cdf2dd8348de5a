"""`build.py runner-clean`'s release side: which local images belong to the matrix's
releases, and which of those the registry protects (each repository's latest and its
rollback target, read as `prune` reads them); builder/hygiene.py then removes what is left
on this Docker engine. First of all, what runs that are gone left running (reaper.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from imagebuild.builder.hygiene import (
    CleanPlan,
    base_repo,
    docker_engine,
    engine_repo,
    runner_clean,
)
from imagebuild.plan import destination
from imagebuild.reaper import reap
from imagebuild.registry.client import RegistryClient
from imagebuild.release.prune import protected, read_state
from imagebuild.spec import matrix as mx
from imagebuild.spec.matrix import LoadedMatrix


def protected_releases(client: Any, repos: Iterable[str]) -> dict[tuple[str, str], str]:
    """(repository path, tag) of each repository's latest and its rollback target, as
    `prune` protects them in the registry: latest from a direct read of `latest`, and a
    tag list that disagrees with it stops runner-clean before anything goes."""
    out: dict[tuple[str, str], str] = {}
    for repo in repos:
        for tag, why in protected(client, read_state(client, repo)).items():
            out[(repo, tag)] = why
    return out


def clean_runner(lm: LoadedMatrix, keep: int, *, dry_run: bool = False,
                 log: Callable[[str], None] = print) -> CleanPlan:
    """The matrix's serve repositories (local name -> registry path), the base and engine
    repositories they are built from, the registry's protected releases; then the clean."""
    reap(log=log, dry_run=dry_run)  # gone runs' containers first: they pin their images
    dest = destination(lm)
    cells = mx.expand(lm)
    serve = {ref.name: ref.repository for ref in (dest.image(c.image) for c in cells)}
    chain = {base_repo(t) for t in lm.matrix.targets} | {
        engine_repo(c.target_name, c.engine_name) for c in cells}
    # latest and its rollback target come from the registry: never guessed
    protected = protected_releases(RegistryClient(dest.registry), sorted(set(serve.values())))
    return runner_clean(docker_engine(), serve_repos=serve, chain_repos=chain, keep=keep,
                        protected=protected, dry_run=dry_run, log=log)
