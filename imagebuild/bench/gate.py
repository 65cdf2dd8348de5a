"""The regression gate `promote` runs before moving latest (matrix.yaml
`publish.regression_threshold`): a release slower than current latest at any concurrency
level by more than the threshold does not become latest unless a reason is given; the
reason is recorded on the release's stored bench results.

The gate compares only figures both runs can vouch for (bench/trust.py). A level flagged
on either side is not compared silently: promotion stops and says why, unless the user
accepts promoting without that comparison (`--accept-untrusted-bench REASON`, recorded
like an accepted regression). The two acceptances are separate on purpose: one says
"slower is fine", the other "we could not tell"; the remaining trusted levels are still
gated for regressions either way.

Nothing measured is nothing compared: when the release or the current latest has no
bench results, latest does not move unless the user says so (`--accept-unmeasured
REASON`); a release promoted without results is then recorded as unmeasured in its
release record (release/latest.py), one promoted against an unmeasured latest on its own
results, and the release notes say both.

The acceptance gate (bench/acceptance.py) runs on the same two documents: a release whose
speculative acceptance falls below latest's beyond the target's threshold stays out of
latest unless `--accept-acceptance-drop REASON` (recorded on its results like an
accepted regression); acceptance figures that cannot be compared (none, a restarted
server, too few drafts) are "could not tell", passed only with --accept-untrusted-bench.
Client-timing flags concern tok/s and latency only: a flagged level's acceptance is still
judged from the server's counters, and every gate judges before one refusal names what
each of them needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from imagebuild.bench import acceptance, store, trust
from imagebuild.bench.compare import Regression, regressions
from imagebuild.errors import UserError
from imagebuild.registry.client import RegistryClient
from imagebuild.registry.records import A_TAG as RELEASE_TAG
from imagebuild.registry.records import read_release, resolve_tag

UNMEASURED_FIX = ('measure it first (`build.py bench --tag T --store`; for latest, the '
                  'release it points at), or move latest without a measurement: '
                  '--accept-unmeasured "why"')
REGRESSION_FIX = 'promote anyway with --accept-regression "why it is acceptable"'
DROP_FIX = 'promote anyway with --accept-acceptance-drop "why it is acceptable"'
DEFAULT_ACCEPTANCE_THRESHOLD = 0.10  # publish.acceptance_threshold's default
UNTRUSTED_FIX = ('re-run the bench where nothing else competes for the CPUs (`build.py bench '
                 '--tag T --store`), or promote without that comparison: '
                 '--accept-untrusted-bench "why"')


@dataclass
class GateResult:
    regressions: list[Regression] = field(default_factory=list)
    accepted_reason: str | None = None
    note: str = ""  # why the gate had nothing to compare, when it had not
    untrusted: dict[int, list[str]] = field(default_factory=dict)  # level -> reasons
    accepted_untrusted: str | None = None
    # --accept-unmeasured: the reason, when a side had no results; `measured` whether
    # the release itself had results (False: its record is marked unmeasured)
    accepted_unmeasured: str | None = None
    measured: bool = True
    # the acceptance gate: drops beyond the threshold, the reason they were let through,
    # and levels whose acceptance figures could not be compared (level -> reasons)
    acceptance_drops: list[acceptance.Drop] = field(default_factory=list)
    accepted_drop: str | None = None
    acceptance_untrusted: dict[int, list[str]] = field(default_factory=dict)

    def notes_markdown(self) -> str:
        """A paragraph for the release notes ('' when there was nothing to say)."""
        out = ""
        if self.accepted_unmeasured:
            what = ("without a measurement" if not self.measured
                    else "without comparing it (latest has no bench results)")
            out += f"**Promoted {what}**: {self.accepted_unmeasured}\n"
        if self.untrusted:
            lines = "\n".join(f"- c={c}: {'; '.join(r)}" for c, r in sorted(self.untrusted.items()))
            out += (f"**Promoted without comparing untrusted bench figures**: "
                    f"{self.accepted_untrusted}\n\n{lines}\n")
        if self.regressions:
            lines = "\n".join(f"- {r.line()}" for r in self.regressions)
            out += (("\n" if out else "") + f"**Accepted throughput regression** vs the "
                    f"previous latest: {self.accepted_reason}\n\n{lines}\n")
        if self.acceptance_untrusted:
            lines = "\n".join(f"- c={c}: {'; '.join(r)}"
                              for c, r in sorted(self.acceptance_untrusted.items()))
            out += (("\n" if out else "") + "**Promoted without comparing speculative "
                    f"acceptance**: {self.accepted_untrusted}\n\n{lines}\n")
        if self.acceptance_drops:
            lines = "\n".join(f"- {d.line()}" for d in self.acceptance_drops)
            out += (("\n" if out else "") + "**Accepted drop in speculative acceptance** vs "
                    f"the previous latest: {self.accepted_drop}\n\n{lines}\n")
        return out



def _flagged(cand: dict, base: dict, shared: set[int]) -> dict[int, list[str]]:
    """Reasons per shared level, from either run ('latest:' marks the baseline's)."""
    mine, theirs = trust.untrusted(cand), trust.untrusted(base)
    out: dict[int, list[str]] = {}
    for c in sorted(shared):
        reasons = [f["reason"] for f in mine.get(c, [])]
        reasons += [f"latest: {f['reason']}" for f in theirs.get(c, [])]
        if reasons:
            out[c] = reasons
    return out


def _without(doc: dict, levels: set[int]) -> dict:
    return {**doc, "levels": [lv for lv in doc.get("levels", [])
                              if int(lv["concurrency"]) not in levels]}


def check_promotion(client: RegistryClient, repo: str, to: str, *, threshold: float,
                    accept_regression: str | None = None,
                    accept_untrusted: str | None = None,
                    accept_unmeasured: str | None = None, dry_run: bool = False,
                    acceptance_threshold: float = DEFAULT_ACCEPTANCE_THRESHOLD,
                    drafter: bool | None = None, accept_acceptance_drop: str | None = None,
                    log: Callable[[str], None] = print) -> GateResult:
    """Raise UserError when `to` regresses against latest, when the figures to compare
    are flagged, or when either side has no bench results, and no reason is given.
    An accepted reason is recorded on the stored results, except in a dry run (which
    reads only)."""
    tag = resolve_tag(client, repo, to)
    latest, cand_rel = read_release(client, repo, "latest"), read_release(client, repo, tag)
    if cand_rel is None:
        raise UserError(f"{repo}:{tag} does not exist", fix="list them with `build.py releases`")
    if latest is not None and latest.digest == cand_rel.digest:
        return GateResult(note=f"latest is {tag} already")
    cand = store.stored(client, repo, tag)
    base = store.stored(client, repo, "latest") if latest is not None else None
    missing = ([f"{tag} has no bench results"] if cand is None else []) + (
        [f"latest ({latest.annotations.get(RELEASE_TAG) or 'untagged'}) has no bench results"]
        if latest is not None and base is None else [])
    if missing:
        why = "; ".join(missing)
        if not accept_unmeasured:
            raise UserError(f"{repo}: {why}, so the regression gate has nothing to compare "
                            "and latest does not move", fix=UNMEASURED_FIX)
        log(f"{repo}: {why}; promoting without a measurement ({accept_unmeasured})")
        if cand is not None and not dry_run:  # measured, not compared: say so with them
            store.annotate(client, repo, tag, {store.A_UNCOMPARED: accept_unmeasured})
        return GateResult(note=why, accepted_unmeasured=accept_unmeasured,
                          measured=cand is not None)
    if latest is None or base is None or cand is None:
        return GateResult(note="no other latest to compare with")
    result, recorded = judge(cand.doc, base.doc, what=f"{repo}: {tag}", threshold=threshold,
                             accept_regression=accept_regression,
                             accept_untrusted=accept_untrusted,
                             acceptance_threshold=acceptance_threshold, drafter=drafter,
                             accept_acceptance_drop=accept_acceptance_drop, log=log)
    if recorded and not dry_run:
        store.annotate(client, repo, tag, recorded)
    return result


def judge(cand: dict, base: dict, *, what: str, threshold: float,
          accept_regression: str | None, accept_untrusted: str | None,
          acceptance_threshold: float = DEFAULT_ACCEPTANCE_THRESHOLD,
          drafter: bool | None = None, accept_acceptance_drop: str | None = None,
          log: Callable[[str], None] = print) -> tuple[GateResult, dict[str, str]]:
    """The gate's decision on two results documents: (result, annotations to record on
    the candidate's stored results). Raises UserError on a refusal."""
    shared = ({int(lv["concurrency"]) for lv in cand.get("levels", [])}
              & {int(lv["concurrency"]) for lv in base.get("levels", [])})
    flagged = _flagged(cand, base, shared)
    recorded: dict[str, str] = {}
    # every gate judges before any refuses: the flags are about client timing (tok/s,
    # latency), while acceptance comes from the server's counters, so a flagged level
    # neither hides an acceptance drop nor skips its comparison; one refusal names all
    refusals: list[tuple[str, str]] = []  # (why, fix)
    if flagged:
        why = "; ".join(f"c={c}: {' / '.join(r)}" for c, r in flagged.items())
        if not accept_untrusted:
            refusals.append((f"{what} vs latest: the bench figures cannot be trusted at "
                             f"{len(flagged)} of {len(shared)} shared level(s), so the "
                             f"regression gate cannot compare them: {why}", UNTRUSTED_FIX))
        else:
            log(f"{what}: not comparing untrusted levels ({accept_untrusted}): {why}")
            recorded[store.A_UNTRUSTED] = accept_untrusted
    found = regressions(_without(cand, set(flagged)), _without(base, set(flagged)), threshold)
    if found:
        lines = "; ".join(r.line() for r in found)
        if not accept_regression:
            refusals.append((f"{what} is slower than latest by more than {threshold:.0%}: "
                             f"{lines}", REGRESSION_FIX))
        else:
            log(f"{what}: regression accepted ({accept_regression}): {lines}")
            recorded[store.A_ACCEPTED] = accept_regression
    acc = acceptance.compare(cand, base, acceptance_threshold, drafter=drafter)
    untold = "; ".join(f"c={c}: {' / '.join(r)}" for c, r in acc.problems.items())
    if untold and not accept_untrusted:
        refusals.append((f"{what} vs latest: speculative acceptance cannot be compared at "
                         f"{len(acc.problems)} level(s), so the acceptance gate cannot pass "
                         f"it: {untold}", UNTRUSTED_FIX))
    elif untold:
        log(f"{what}: not comparing acceptance ({accept_untrusted}): {untold}")
        recorded[store.A_UNTRUSTED] = str(accept_untrusted)
    if acc.drops:
        lines = "; ".join(d.line() for d in acc.drops)
        if not accept_acceptance_drop:
            refusals.append((f"{what} accepts fewer drafted tokens than latest, by more "
                             f"than {acceptance_threshold:.0%}: {lines}", DROP_FIX))
        else:
            log(f"{what}: acceptance drop accepted ({accept_acceptance_drop}): {lines}")
            recorded[store.A_ACCEPTED_DROP] = accept_acceptance_drop
    if refusals:
        fixes = list(dict.fromkeys(fix for _, fix in refusals))
        raise UserError("\n".join(why for why, _ in refusals), fix="; and ".join(fixes))
    note = "no trusted level to compare" if flagged and set(flagged) == shared else ""
    return GateResult(found, accept_regression if found else None, note=note,
                      untrusted=flagged,
                      accepted_untrusted=accept_untrusted if flagged or acc.problems else None,
                      acceptance_drops=acc.drops,
                      accepted_drop=accept_acceptance_drop if acc.drops else None,
                      acceptance_untrusted=acc.problems), recorded
