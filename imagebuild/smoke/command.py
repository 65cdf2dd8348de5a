"""`build.py smoke IMAGE_REF` and `build.py smoke --tag T [--only GLOB]`, ready to wire.

cli.py adds the shared flags (`--matrix/--tag/--target/--only`, tag not required), then
`add_arguments(p)`, and calls `run(args, context=_context)`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imagebuild.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", nargs="?", default=None, metavar="IMAGE_REF",
                   help="a local serve image; expectations from its labels and cell")
    p.add_argument("--out", type=Path, default=None,
                   help="output dir (default: build/smoke/<target>/<engine>/<image>/, or "
                        "build/smoke/ref/<ref>/ for IMAGE_REF)")
    p.add_argument("--boot-timeout", type=float, default=None, metavar="S",
                   help="override the target's boot_timeout_s")
    p.add_argument("--stall-limit", type=float, default=None, metavar="S",
                   help="silent-log seconds before boot counts as the spawn hang "
                        "(default: boot timeout / 4, within 60..180)")


def run(args: argparse.Namespace, context: Callable[[argparse.Namespace], Any]) -> int:
    """Exit code: 0 when every image passed, 1 when one failed (its verdict says why)."""
    from imagebuild.plan import plan_rows
    from imagebuild.smoke.runner import smoke_cells, smoke_ref

    kw = {"boot_timeout_s": args.boot_timeout, "stall_s": args.stall_limit}
    if args.image and args.tag:
        raise UserError("give IMAGE_REF or --tag, not both",
                        fix="`build.py smoke IMAGE_REF` or `build.py smoke --tag T`")
    if args.image:
        verdicts = [smoke_ref(args.image, out_dir=args.out, **kw)]
    elif args.tag:
        lm, cells, tag, _target, _why, lock = context(args)
        refs = {r["cell"]: r["refs"][0] for r in plan_rows(cells, lm, tag, lock)}
        verdicts = smoke_cells(lm, cells, refs, lock, out_root=args.out, **kw)
    else:
        raise UserError("nothing to smoke-test", fix="give IMAGE_REF or --tag T")
    for v in verdicts:
        print(f"{'PASS' if v['passed'] else 'FAIL'}  {v['image_ref']}  {v['message']}")
    return 0 if all(v["passed"] for v in verdicts) else 1
