"""Do the gates' unit tests catch a broken gate? Break each behaviour once, run its tests.

    .venv/bin/python -m tools.mutate_gates [--only NAME]

Each mutant is one textual change to one module, applied to a copy of the tracked tree
(the checkout itself is never touched); the mutant is *killed* when its unit tests fail.
A surviving mutant means a gate could break with every unit test green: exit 1.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant("publish skips the smoke gate", "imagebuild/release/publish.py",
           "    gate(verdict, image_id, local_ref)  # before any registry request",
           "    pass", ("tests/unit/test_gates.py",)),
    Mutant("publish accepts a verdict of another image", "imagebuild/release/publish.py",
           '    if verdict.get("image_id") != image_id:', "    if False:",
           ("tests/unit/test_gates.py",)),
    Mutant("verdict ignores erroring checks", "imagebuild/smoke/runner.py",
           'if ch["outcome"] in ("failed", "error")]', 'if ch["outcome"] in ("failed",)]',
           ("tests/unit/test_smoke_verdict.py",)),
    Mutant("verdict ignores pytest's exit code", "imagebuild/smoke/runner.py",
           "and not missing and pytest_code == 0", "and not missing",
           ("tests/unit/test_smoke_verdict.py",)),
    Mutant("verdict ignores checks that did not run", "imagebuild/smoke/runner.py",
           "passed = ready and not bad and not missing and", "passed = ready and not bad and",
           ("tests/unit/test_smoke_verdict.py",)),
    Mutant("regression gate never refuses", "imagebuild/bench/gate.py",
           "        if not accept_regression:", "        if False:",
           ("tests/unit/test_gates.py", "tests/unit/test_promotion.py")),
    Mutant("untrusted figures compared silently", "imagebuild/bench/gate.py",
           "        if not accept_untrusted:", "        if False:",
           ("tests/unit/test_gates.py", "tests/unit/test_promotion.py",
            "tests/unit/test_bench_trust.py")),
    Mutant("a side without bench results passes", "imagebuild/bench/gate.py",
           "    if missing:", "    if False:",
           ("tests/unit/test_gates.py",)),
    Mutant("acceptance gate never refuses a drop", "imagebuild/bench/gate.py",
           "        if not accept_acceptance_drop:", "        if False:",
           ("tests/unit/test_gates.py",)),
    Mutant("acceptance gate ignores the mean accepted length", "imagebuild/bench/acceptance.py",
           "                or cand.mean_length < base.mean_length * (1 - threshold)):", "):",
           ("tests/unit/test_gates.py",)),
    Mutant("missing or restarted acceptance figures pass silently", "imagebuild/bench/gate.py",
           "    if untold and not accept_untrusted:", "    if False:",
           ("tests/unit/test_gates.py",)),
    Mutant("a server restart reads as acceptance", "imagebuild/bench/acceptance.py",
           "    if drafts < 0 or drafted < 0 or accepted < 0 or accepted > drafted:",
           "    if False:", ("tests/unit/test_gates.py",)),
    Mutant("table: a gate not run or untrusted reads as pass", "imagebuild/release/compat.py",
           '        elif g["status"] in ("untrusted", NOT_RUN):', "        elif False:",
           ("tests/unit/test_compat_table.py",)),
    Mutant("table: an acceptance drop reads as pass", "imagebuild/release/compat.py",
           '    if a["status"] == "drop":', "    if False:",
           ("tests/unit/test_compat_table.py",)),
    Mutant("lossless ignores its conditions", "imagebuild/gates/condverdict.py",
           "    every = {FRESH: fresh, **conds}", "    every = {FRESH: fresh}",
           ("tests/unit/test_gates_conditions.py",)),
    Mutant("a cache condition passes without a cache hit", "imagebuild/gates/condverdict.py",
           "        if ev.prefix_hits <= 0:", "        if False:",
           ("tests/unit/test_gates_conditions.py",)),
    Mutant("the preemption load passes without a preemption", "imagebuild/gates/condverdict.py",
           "        if ev.preemptions <= 0:", "        if False:",
           ("tests/unit/test_gates_conditions.py",)),
    Mutant("acceptance decaying towards 0 passes", "imagebuild/gates/decay.py",
           "    if tail.rate < s.min_ratio * head.rate:", "    if False:",
           ("tests/unit/test_gates_conditions.py",)),
    Mutant("a first window short of drafts never takes in the next", "imagebuild/gates/decay.py",
           "    if first > last:", "    if first > 1 or last < n - 1:",
           ("tests/unit/test_gates_conditions.py",)),
    Mutant("the plain server gets another plan", "imagebuild/gates/run.py",
           "plan=spec.plan,", "plan=None,", ("tests/unit/test_release_gates_logic.py",)),
    Mutant("registry never retries 429/5xx", "imagebuild/registry/client.py",
           "if not (status == 429 or status >= 500) or not idempotent:", "if True:",
           ("tests/unit/test_registry_retries.py",)),
    Mutant("registry retries auth refusals", "imagebuild/registry/client.py",
           "if not (status == 429 or status >= 500) or not idempotent:",
           "if not (status in (429, 401, 403) or status >= 500) or not idempotent:",
           ("tests/unit/test_registry_retries.py",)),
    Mutant("a build secret becomes a build arg", "imagebuild/builder/builder.py",
           'cmd += ["--secret", f"id={sid},src={src}"]',
           'cmd += ["--build-arg", f"{sid.upper()}={content.decode(errors=\'replace\')}"]',
           ("tests/unit/test_build_secrets.py",)),
)


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)


def _run(tree: Path, tests: tuple[str, ...]) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *tests], cwd=tree, capture_output=True, text=True).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run mutants whose name contains this")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or args.only in m.name]
    if not chosen:  # an empty selection would run every test as its "baseline"
        print(f"no mutant's name contains {args.only!r}", file=sys.stderr)
        return 2
    survived = 0
    with tempfile.TemporaryDirectory(prefix="imagebuild-mutants-") as tmp:
        tree = Path(tmp)
        _tracked_copy(tree)
        baseline = _run(tree, tuple(sorted({t for m in chosen for t in m.tests})))
        if baseline != 0:
            print(f"the unmutated tests fail (exit {baseline}): fix them first")
            return 2
        print(f"{'mutant':45} {'tests':55} {'result':8} seconds")
        for m in chosen:
            path = tree / m.file
            original = path.read_text()
            if original.count(m.old) != 1:
                print(f"{m.name}: the text to mutate is not in {m.file} exactly once; "
                      "update this script with the code")
                return 2
            path.write_text(original.replace(m.old, m.new))
            start = time.monotonic()
            code = _run(tree, m.tests)
            path.write_text(original)
            result = "killed" if code != 0 else "SURVIVED"
            survived += code == 0
            print(f"{m.name:45} {', '.join(Path(t).name for t in m.tests):55} {result:8} "
                  f"{time.monotonic() - start:.1f}")
    print(f"{len(chosen) - survived} of {len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
