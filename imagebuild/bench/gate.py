"""The regression gate `promote` runs before moving latest (issue 8, matrix.yaml
`publish.regression_threshold`): a release slower than current latest at any concurrency
level by more than the threshold does not become latest unless a reason is given; the
reason is recorded on the release's stored bench results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from imagebuild.bench import store
from imagebuild.bench.compare import Regression, regressions
from imagebuild.errors import UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.release.records import resolve_tag


@dataclass
class GateResult:
    regressions: list[Regression] = field(default_factory=list)
    accepted_reason: str | None = None
    note: str = ""  # why the gate had nothing to compare, when it had not

    def notes_markdown(self) -> str:
        """A paragraph for the release notes ('' when there was nothing to say)."""
        if not self.regressions:
            return ""
        lines = "\n".join(f"- {r.line()}" for r in self.regressions)
        return (f"**Accepted throughput regression** vs the previous latest: "
                f"{self.accepted_reason}\n\n{lines}\n")


def check_promotion(client: RegistryClient, repo: str, to: str, *, threshold: float,
                    accept_regression: str | None = None,
                    log: Callable[[str], None] = print) -> GateResult:
    """Raise UserError when `to` regresses against latest and no reason is given."""
    tag = resolve_tag(client, repo, to)
    latest_id = store.release_image_id(client, repo, "latest")
    cand_id = store.release_image_id(client, repo, tag)
    if latest_id is None or cand_id is None or latest_id == cand_id:
        return GateResult(note="no other latest to compare with")
    base = store.get_results(client, repo, latest_id)
    cand = store.get_results(client, repo, cand_id)
    if base is None:
        log(f"{repo}: latest has no bench results; regression gate not applied")
        return GateResult(note="latest has no bench results")
    if cand is None:
        log(f"{repo}: {tag} has no bench results (run `build.py bench --tag ...`); "
            "regression gate not applied")
        return GateResult(note=f"{tag} has no bench results")
    found = regressions(cand[0], base[0], threshold)
    if not found:
        return GateResult()
    what = "; ".join(r.line() for r in found)
    if not accept_regression:
        raise UserError(
            f"{repo}: {tag} is slower than latest by more than {threshold:.0%}: {what}",
            fix='promote anyway with --accept-regression "why it is acceptable"')
    store.annotate(client, repo, cand_id, {store.A_ACCEPTED: accept_regression})
    log(f"{repo}: regression accepted ({accept_regression}): {what}")
    return GateResult(found, accept_regression)
