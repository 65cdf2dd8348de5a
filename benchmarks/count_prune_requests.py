"""Count the registry requests `prune --keep 1` makes for 20, 40 and 80 releases, against
the in-memory registry of the tests (distribution 2.8's API: no tag deletes, no
referrers API), each release with stored bench results, latest at the newest.

    .venv/bin/python benchmarks/count_prune_requests.py            # this checkout
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/count_prune_requests.py

Prints one line per size: releases, requests, requests per release.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(":")[0] or os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))

from imagebuild.bench import store  # noqa: E402
from imagebuild.registry.records import read_release  # noqa: E402
from imagebuild.release.prune import prune  # noqa: E402
from tests.support.memregistry import MemRegistry  # noqa: E402

REPO = "ns/img"


def count(n: int) -> tuple[int, Counter]:
    reg = MemRegistry()
    tags = [f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}-v0.23.0-x" for i in range(n)]
    client = reg.client()
    for tag in tags:  # a release and its bench results, as publish and bench store them
        reg.add_release(REPO, tag)
        image = read_release(client, REPO, tag).image_id  # type: ignore[union-attr]
        store.put_results(client, REPO, tag, {"image": {"id": image}, "levels": []})
    reg.point_latest(REPO, tags[-1])
    reg.calls.clear()
    prune(client, REPO, 1, log=lambda _: None, settle=0)
    return len(reg.calls), Counter(m for m, _ in reg.calls)


def main() -> int:
    os.environ.setdefault("IMAGEBUILD_LOCK_DIR", tempfile.mkdtemp(prefix="prune-count-"))
    os.environ["IMAGEBUILD_LEASE_SETTLE"] = "0"
    for n in (20, 40, 80):
        total, by = count(n)
        print(f"{n:3d} releases: {total:6,d} requests ({total / n:5.1f} per release; "
              + ", ".join(f"{m} {c}" for m, c in sorted(by.items())) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
