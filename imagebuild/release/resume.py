"""What a release tag already holds, read-only, for a re-run of a release job: is each
cell published under the tag, recorded as smoke-passed for exactly the image it points
at, and benched (results stored with the release)? A re-run then skips the steps whose
work is done (a rebuild on another runner is a new image id, and release tags are never
overwritten), so a release that half-finished can be finished."""

from __future__ import annotations

from dataclasses import dataclass

from imagebuild.plan import Job
from imagebuild.registry.client import RegistryClient


@dataclass(frozen=True)
class CellState:
    cell: str
    published: bool  # the release tag exists with this release's record
    tested: bool  # ... recorded smoke-passed for the image it points at
    benched: bool  # bench results are stored with the release


def cell_state(client: RegistryClient, job: Job) -> CellState:
    from imagebuild.bench.store import release_stored
    from imagebuild.release.records import read_release

    repo, tag = job.image.repository, str(job.tag)
    rel = read_release(client, repo, tag)
    published = bool(rel and rel.recorded)
    tested = bool(rel and rel.passed)
    benched = bool(tested and (release_stored(client, repo, tag) or (rel and rel.unmeasured)))
    return CellState(job.cell.id, published, tested, benched)


def github_output(states: list[CellState]) -> str:
    """name=value lines for $GITHUB_OUTPUT, true only when true of every cell: `done`
    (published and tested: nothing to build, smoke or push) and `benched`."""
    def every(flag: str) -> str:
        return "true" if states and all(getattr(s, flag) for s in states) else "false"

    done = "true" if states and all(s.published and s.tested for s in states) else "false"
    return (f"published={every('published')}\ntested={every('tested')}\n"
            f"benched={every('benched')}\ndone={done}\n")
