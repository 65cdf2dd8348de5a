"""Which GitHub release should carry the repository's "Latest" badge: the short tag
(DATE-NAME, the GitHub release's name) of the newest release that some image's `latest`
holds in the registry, so the badge agrees with what `docker pull ...:latest` gets after
promote, a forward-only promote that left latest alone, and rollback. Prints it, or
nothing when no image has a latest yet (`make release-badge`)."""

from __future__ import annotations

import sys

from imagebuild.errors import ImagebuildError
from imagebuild.plan import destination
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import list_releases
from imagebuild.release.repositories import repositories
from imagebuild.spec import matrix as mx
from imagebuild.spec.tags import parse_release_tag


def badge_tag(latest_tags: list[str]) -> str | None:
    """The short tag of the newest of the full release tags `latest` holds."""
    parsed = [t for t in (parse_release_tag(x) for x in latest_tags) if t is not None]
    return max(parsed, key=lambda t: t.sort_key()).short if parsed else None


def main() -> int:
    try:
        lm = mx.load(None)
        dest = destination(lm)
        client = RegistryClient(dest.registry)
        repos = repositories(client, dest, [c.image for c in mx.expand(lm)], None)
        held = [r.tag for repo in repos for r in list_releases(client, repo) if r.is_latest]
    except ImagebuildError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    tag = badge_tag(held)
    if tag:
        print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
