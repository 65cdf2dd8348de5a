"""Gate overrides a release workflow asks for, as `build.py promote` options.

A dispatch of the release workflow names the gates to pass anyway (`accept`, e.g.
`regression untrusted-bench`) and one written reason (`accept_reason`). Each name must be
an `--accept-NAME` option of `build.py promote` (read from its parser, so a gate the CLI
gains is reachable without a workflow change); a name needs a reason, a reason needs a
name. The plan job checks them before anything is built; the promote job turns them into
the options, one argument per line:

    ACCEPT="regression" ACCEPT_REASON="..." python -m tools.accept_overrides
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from imagebuild.errors import UserError

PREFIX = "--accept-"
MAX_REASON = 500  # it is stored in the release's annotations and shown in its notes


def accept_options() -> dict[str, bool]:
    """`--accept-NAME` options of `build.py promote`: NAME -> whether it takes a reason."""
    from imagebuild.cliparser import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    promote = sub.choices["promote"]
    return {opt.removeprefix(PREFIX): action.nargs != 0
            for action in promote._actions for opt in action.option_strings
            if opt.startswith(PREFIX)}


def override_args(accept: str, reason: str) -> list[str]:
    """`--accept-NAME=REASON` for each gate named in `accept` (spaces or commas)."""
    names = [n for n in re.split(r"[\s,]+", accept.strip()) if n]
    reason = reason.strip()
    known = accept_options()
    valid = ", ".join(sorted(known))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"accept: {', '.join(unknown)} is no gate of `build.py promote`",
                        fix=f"name one or more of: {valid} (or leave accept empty)")
    if names and not reason:
        raise UserError(f"accept: {' '.join(names)} needs a reason",
                        fix="write in accept_reason why this release may pass; it is "
                            "recorded with the release and shown in its notes")
    if reason and not names:
        raise UserError("accept_reason is given but accept names no gate",
                        fix=f"name the gate(s) it is for in accept ({valid}), or leave "
                            "accept_reason empty")
    if "\n" in reason or "\r" in reason or len(reason) > MAX_REASON:
        raise UserError(f"accept_reason must be one line of at most {MAX_REASON} characters",
                        fix="shorten it; link an issue for the details")
    # `--accept-NAME=REASON`: one argument, so a reason starting with "-" stays a reason
    return [f"{PREFIX}{name}={reason}" if known[name] else PREFIX + name
            for name in dict.fromkeys(names)]  # once each, in the order given


def main() -> int:
    try:
        args = override_args(os.environ.get("ACCEPT", ""), os.environ.get("ACCEPT_REASON", ""))
    except UserError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write("".join(a + "\n" for a in args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
