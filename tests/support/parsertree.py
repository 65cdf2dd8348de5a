"""Every (sub)command of the command line's parser, for tests that check each one."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def commands(ap: argparse.ArgumentParser, prefix: str = ""
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """("plan", its parser), ..., ("pins watch", ...): depth first, the program left out."""
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from commands(sub, f"{prefix}{name} ")
