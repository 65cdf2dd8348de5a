"""Do the release-state tests catch a reverted fix? Revert each fix once, run the tests.

    .venv/bin/python -m tools.mutate_release_state [--only NAME] [--no-regression]

Each mutant reverts one fix of issue 25 (imagebuild/release/*.py, imagebuild/bench/
{store,gate}.py) in a copy of the tracked tree (the checkout itself is never touched),
then runs the stateful property test (tests/unit/test_release_properties.py, a fixed
derandomized run) and the fix's own regression test. A mutant is *killed* by a test
that fails. Exit 1 when a regression test survives, or the property test survives a
mutant it is meant to catch; `invisible` says why the few others are out of its reach.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.mutate_gates import _tracked_copy  # the same copy of the tracked tree

ROOT = Path(__file__).resolve().parents[1]

PROPERTY = "tests/unit/test_release_properties.py"
RACES = "tests/unit/test_release_state_races.py"
FENCING = "tests/unit/test_release_state_fencing.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    edits: tuple[tuple[str, str], ...]  # (text, replacement), each text once in file
    tests: tuple[str, ...]  # the fix's regression tests
    invisible: str | None = None  # why no release-state invariant can see it


def _races(*names: str) -> tuple[str, ...]:
    return tuple(f"{RACES}::{n}" for n in names)


def _fencing(*names: str) -> tuple[str, ...]:
    return tuple(f"{FENCING}::{n}" for n in names)


# the property test reaches these only by search (a pause or a fault at one exact request,
# a set one image of which was pruned): its kills are incidental; the regression test
# builds the state and is what must kill them
BY_SEARCH = ("the property test's invariants see it, but reach its state only by search; "
             "the regression test builds that state")


MUTANTS = (
    Mutant("1 target not re-read under the lease", "imagebuild/release/latest.py",
           (("            rel = _reread(client, rel)\n", ""),),
           _races("test_a_rollback_racing_prune_does_not_recreate_the_deleted_release")),
    Mutant("2 lease never renewed", "imagebuild/release/lease.py",
           (("        if elapsed >= self.ttl / 3:\n", "        if False:\n"),),
           _races("test_long_work_renews_the_lease_and_stops_when_it_is_lost")),
    Mutant("2 a lease unrenewed past its TTL renewed", "imagebuild/release/lease.py",
           (("        if elapsed >= self.ttl * LAPSED:\n", "        if False:\n"),),
           _fencing("test_a_lease_not_renewed_for_most_of_its_ttl_is_lost_even_when_its_tag_is_back")),
    Mutant("2 prune goes on after losing the lease", "imagebuild/release/prune.py",
           (("                              fix=\"re-run the prune\")\n    lease.check()\n",
             "                              fix=\"re-run the prune\")\n"),
            ("            lease.check()  # the fence before the results' deletes too\n", "")),
           _races("test_prune_stops_at_the_next_delete_once_the_lease_is_lost")),
    Mutant("2 lease expiry by the writer's clock", "imagebuild/release/lease.py",
           (("        now = registry_time(self.client)\n        if held",
             "        now = time.time()\n        if held"),),
           _races("test_lease_expiry_uses_the_registrys_clock_not_the_writers")),
    Mutant("2 quadratic prune (2.x delete fallback)", "imagebuild/release/prune.py",
           (("            _delete(client, repo, tag, digest)",
             "            client.delete_tag(repo, tag)"),),
           _races("test_prune_requests_grow_linearly"),
           invisible="a cost, not a state: the same tags go, with more requests (the "
                     "property test kills it only because this path also loses the "
                     "idempotent delete: a lost DELETE answer aborts the prune)"),
    Mutant("3 a re-run undoes a rollback", "imagebuild/release/latest.py",
           (("if rel.tag in rolled and not accept.rolled_back:", "if False:"),),
           _races("test_a_rerun_does_not_undo_a_rollback")),
    Mutant("4 no undo on a refusal mid-set", "imagebuild/release/latest.py",
           (("            _undo(client, done, [rel for rel, _ in checked], leases, log)\n",
             "            pass\n"),),
           _races("test_a_refusal_while_moving_puts_the_moved_images_back")),
    Mutant("4 images checked and moved one by one", "imagebuild/release/latest.py",
           (("        if why:\n            raise OperationFailed(f\"{rel.repo}: {why}\",\n"
             "                                  fix=\"nothing moved; see `build.py releases`\")",
             "        pass"),
            ("        stays = _move_all(client, plans,",
             "        for p in plans:\n"
             "            stays = _move_all(client, [p],")),
           _races("test_the_older_of_two_tags_in_flight_refuses_before_moving_anything")),
    Mutant("5 releases ordered by tag, not record", "imagebuild/registry/records.py",
           (("        return (day, at or 0.0) + (rt.sort_key() if rt else (dt.date.min,))",
             "        return rt.sort_key() if rt else (dt.date.min,)"),),
           _races("test_same_day_releases_order_by_when_recorded_not_by_name",
                  "test_a_future_dated_release_neither_blocks_nor_holds_a_keep_slot")),
    Mutant("5 a future tag date accepted", "imagebuild/registry/records.py",
           (("    if tag.date > today + DATE_SKEW:", "    if False:"),),
           _races("test_a_tag_dated_in_the_future_is_refused_as_bad_input")),
    Mutant("6 rollback to a never-benched release", "imagebuild/release/latest.py",
           (("    if accept.unmeasured:\n        return None",
             "    if True:\n        return None"),),
           _races("test_rollback_refuses_never_benched_targets_and_forward_moves")),
    Mutant("6 rollback moves latest forward", "imagebuild/release/latest.py",
           (("    elif not accept.forward and (before is None or _newer(rel, before)):",
             "    elif False:"),),
           _races("test_rollback_refuses_never_benched_targets_and_forward_moves")),
    Mutant("7 promote --dry-run annotates results", "imagebuild/bench/gate.py",
           (("        if cand is not None and not dry_run:", "        if cand is not None:"),),
           _races("test_promote_dry_run_writes_nothing")),
    Mutant("8 a container's live lease taken", "imagebuild/release/lease.py",
           (("                    and held.get(f\"{LEASE}.pidns\", \"\") == self.pidns\n", ""),),
           _races("test_a_live_lease_of_a_container_on_this_host_is_not_taken")),
    Mutant("m malformed or endless lease expiry", "imagebuild/release/lease.py",
           (("    if not math.isfinite(value) or value > now + MAX_TTL:", "    if False:"),
            ("    except ValueError:\n        return None\n    if",
             "    except ValueError:\n        raise\n    if")),
           _races("test_a_lease_of_another_host_whose_expiry_is_unreadable_holds_the_run_off")),
    Mutant("m an unreadable lease taken over", "imagebuild/release/lease.py",
           (("            elif expires is None:\n", "            elif False:\n"),),
           _races("test_a_lease_of_another_host_whose_expiry_is_unreadable_holds_the_run_off")),
    Mutant("m a retried delete aborts prune", "imagebuild/release/prune.py",
           (("        if client.head_manifest(repo, tag) is not None:\n            raise",
             "        raise"),),
           _races("test_a_retried_delete_whose_first_attempt_succeeded_is_fine")),
    Mutant("m forget ignores the subject", "imagebuild/registry/referrers.py",
           (("        if _subject_of(client, repo, str(desc.get(\"digest\"))) != digest:\n"
             "            continue\n", ""),),
           _races("test_forget_leaves_artifacts_whose_subject_is_another_release")),
    Mutant("m prune trusts a truncated tag list", "imagebuild/release/prune.py",
           (("        if LATEST not in tags or digests.get(named) != latest.digest:",
             "        if False:"),),
           _races("test_a_truncated_tag_list_stops_prune_and_runner_clean")),
    # the holes closed after the first round: fencing, undo, rollback --all, forward-only
    Mutant("f rollbacks record written unfenced", "imagebuild/release/latest.py",
           (("rel.tag, rel.config_descriptor, fence=lease.check)",
             "rel.tag, rel.config_descriptor)"),),
           _fencing("test_a_run_paused_between_reading_and_writing_the_rollbacks_record_"
                    "drops_nothing"), invisible=BY_SEARCH),
    Mutant("f lease renewal unfenced", "imagebuild/release/lease.py",
           (("            self._fence()  # nothing between the fence and the renewal's write\n",
             ""),),
           _fencing("test_a_lease_renewal_is_fenced"),
           invisible=BY_SEARCH),
    Mutant("f prune's lease check not last before a delete", "imagebuild/release/prune.py",
           (("                              fix=\"re-run the prune\")\n    lease.check()\n"
             "    return True\n", "                              fix=\"re-run the prune\")\n"
             "    return True\n"),),
           _fencing("test_a_prune_paused_past_its_lease_before_a_delete_deletes_nothing"),
           invisible=BY_SEARCH),
    Mutant("f undo puts back what it did not write", "imagebuild/release/latest.py",
           (("            if (now := at[rel.repo]) is not None and now[0] == rel.digest]",
             "            ]"),),
           _fencing("test_the_undo_leaves_a_move_it_did_not_write"),
           invisible=BY_SEARCH),
    Mutant("f undo misses a landed PUT", "imagebuild/release/latest.py",
           (("                if before is None or before.digest != rel.digest:\n"
             "                    done.append((rel, before))\n"
             "                move_latest(client, lease, rel, before.digest if before else None, "
             "as_left)\n",
             "                move_latest(client, lease, rel, before.digest if before else None, "
             "as_left)\n"
             "                if before is None or before.digest != rel.digest:\n"
             "                    done.append((rel, before))\n"),),
           _fencing("test_a_landed_put_whose_read_back_failed_is_put_back"),
           invisible=BY_SEARCH),
    Mutant("f undo writes under another's live lease", "imagebuild/release/latest.py",
           (("            with client.deadline.grace(), _fence_for_undo(client, leases[rel.repo], "
             "rel, log):", "            with client.deadline.grace():"),),
           _fencing("test_an_undo_does_not_write_under_another_runs_live_lease"),
           invisible=BY_SEARCH),
    Mutant("f undo splits a whole set", "imagebuild/release/latest.py",
           (("    if all((now := at[rel.repo]) is not None",
             "    if False and all((now := at[rel.repo]) is not None"),),
           _fencing("test_two_runs_rolling_back_to_the_same_release_leave_the_set_there"),
           invisible=BY_SEARCH),
    Mutant("f undo gives up once the lease was lost", "imagebuild/release/latest.py",
           (("    except OperationFailed:\n        fresh = Lease(",
             "    except ImportError:\n        fresh = Lease("),),
           _fencing("test_a_run_paused_while_another_host_prunes_puts_its_half_move_back"),
           invisible=BY_SEARCH),
    Mutant("f a lapsed lease stops a half-moved first promotion", "imagebuild/release/latest.py",
           (("before.digest if before else None, as_left)\n",
             "before.digest if before else None)\n"),),
           _fencing("test_a_first_promotion_whose_leases_lapse_mid_set_is_finished"),
           invisible=BY_SEARCH),
    Mutant("f a lapsed lease taken again without reading the set again",
           "imagebuild/release/lease.py",
           (("            self.acquire()\n            retake()\n",
             "            self.acquire()\n"),),
           _fencing("test_an_expired_lease_taken_again_finds_the_set_moved_and_stays_"
                    "together"),
           invisible=BY_SEARCH),
    Mutant("f forgiving a rolled-back release between the moves",
           "imagebuild/release/latest.py",
           (("            for rel, _ in checked if mode == \"promote\" and accept.rolled_back "
             "else ():\n                rollbacks.forgive(client, rel.repo, rel.tag, "
             "rel.config_descriptor,\n                                  fence=leases[rel.repo]"
             ".check)\n", ""),
            ("before.digest if before else None, as_left)\n",
             "before.digest if before else None, as_left)\n"
             "                if mode == \"promote\" and accept.rolled_back:\n"
             "                    rollbacks.forgive(client, rel.repo, rel.tag, "
             "rel.config_descriptor, fence=lease.check)\n")),
           _fencing("test_a_first_promotion_whose_leases_lapse_mid_set_is_finished"),
           invisible=BY_SEARCH),
    Mutant("b rollback --all splits a set", "imagebuild/release/latest.py",
           (("    if split:\n", "    if False:\n"),),
           _fencing("test_rollback_all_refuses_when_an_image_lacks_the_release"),
           invisible=BY_SEARCH),
    Mutant("d --forward-only decided before the lease", "imagebuild/release/latest.py",
           (("            if forward_only:  # decided here, under the lease: from latest as it "
             "is now\n", "            if False:\n"),),
           _fencing("test_forward_only_is_decided_under_the_lease"),
           invisible=BY_SEARCH),
)


def _run(tree: Path, tests: tuple[str, ...]) -> tuple[int, float]:
    start = time.monotonic()
    env = {**os.environ, "NO_SHRINK": "1"}  # killed or not is all we need: no shrinking
    code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *tests], cwd=tree, capture_output=True, text=True, env=env).returncode
    return code, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run mutants whose name contains this")
    ap.add_argument("--no-regression", action="store_true",
                    help="run the property test only")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or args.only in m.name]
    if not chosen:  # an empty selection would run every test as its "baseline"
        print(f"no mutant's name contains {args.only!r}", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="imagebuild-release-mutants-") as tmp:
        tree = Path(tmp)
        _tracked_copy(tree)
        tests = {PROPERTY} | (set() if args.no_regression else {t for m in chosen for t in m.tests})
        baseline, _ = _run(tree, tuple(sorted(tests)))
        if baseline != 0:
            print(f"the unmutated tests fail (exit {baseline}): fix them first")
            return 2
        print(f"{'mutant':42} {'property test':14} {'seconds':>7}  regression test")
        for m in chosen:
            path = tree / m.file
            original = path.read_text()
            text = original
            for old, new in m.edits:
                if text.count(old) != 1:
                    print(f"{m.name}: the text to mutate is not in {m.file} exactly once; "
                          "update this script with the code")
                    return 2
                text = text.replace(old, new)
            path.write_text(text)
            try:
                code, seconds = _run(tree, (PROPERTY,))
                prop = "killed" if code else ("survived*" if m.invisible else "SURVIVED")
                failed += code == 0 and not m.invisible
                reg = "-"
                if not args.no_regression:
                    rcode, _ = _run(tree, m.tests)
                    reg = "killed" if rcode else "SURVIVED"
                    failed += rcode == 0
            finally:
                path.write_text(original)
            print(f"{m.name:42} {prop:14} {seconds:7.1f}  {reg}", flush=True)
    for m in chosen:
        if m.invisible:  # shown for every run: a kill of these is incidental
            print(f"* {m.name}: {m.invisible}")
    print(f"{failed} mutant(s) survived a test meant to catch them")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
