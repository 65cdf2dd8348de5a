"""vLLM's model-class inspection, done once when the engine image is built.

Before a model loads, vLLM inspects its class (hybrid? multimodal? pooling? ...) in a
fresh Python process that imports torch and vLLM again: ~8.5 s of every boot on a 2-core
host, and again on every restart, because the result is cached under
`$VLLM_CACHE_ROOT/modelinfos/` and that folder is a tmpfs in our containers (read-only
root). This script fills that cache for every architecture vLLM registers, in one
process, through vLLM's own inspection and cache code (so the files are exactly what
vLLM writes and reads: each keyed by the hash of its model's source file, so a changed
file is inspected again at boot, never answered wrongly). The launcher (vllm-serve.py)
copies them into the cache folder before vLLM starts.

    python bake-modelinfos.py /opt/imagebuild/vllm-cache

The build has no GPU to keep uninitialised, so the inspection that vLLM runs in a child
process runs in this one. Architectures whose module does not import in this engine
(an optional dependency it does not install) are listed and left to vLLM at boot, where
they would fail the same way. A vLLM whose cache no longer reads back fails the build.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: bake-modelinfos.py CACHE_ROOT", file=sys.stderr)
        return 2
    root = Path(argv[0])
    os.environ["VLLM_CACHE_ROOT"] = str(root)  # read by vllm.envs when the cache is used
    # Importing every model class warns about several of them; none of it concerns a build.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # The launcher's version alias, so vLLM imports here as it does at serve time.
    runpy.run_path(str(Path(__file__).with_name("vllm-serve.py")), run_name="launcher")

    from vllm.model_executor.models import registry

    def in_process(fn):
        return fn()

    def must_be_cached(fn):
        raise LookupError("not read from the baked cache")

    registry._run_in_subprocess = in_process
    lazy = {arch: model for arch, model in registry.ModelRegistry.models.items()
            if isinstance(model, registry._LazyRegisteredModel)}
    baked, skipped = [], []
    for arch, model in lazy.items():
        try:
            model.inspect_model_cls()
            baked.append(arch)
        except Exception as e:  # noqa: BLE001 - an optional dependency this engine lacks
            skipped.append(f"{arch} ({type(e).__name__})")

    # vLLM caches only classes whose module is one file it can hash (not a package such as
    # the Transformers backend's): those are inspected at boot as before.
    cache_dir = root / "modelinfos"
    cached = [a for a in baked if (cache_dir / lazy[a]._get_cache_filename()).is_file()]
    # Read back the way a boot reads it: a miss would start a child process, which is
    # now an error.
    registry._run_in_subprocess = must_be_cached
    unread = []
    for arch in cached:
        try:
            lazy[arch].inspect_model_cls()
        except LookupError:
            unread.append(arch)
    if not cached or unread:
        print(f"bake-modelinfos: vLLM did not read back its model-info cache for "
              f"{len(unread) or 'any'} architecture(s) ({', '.join(unread[:5])}): its cache "
              f"format changed; update images/engine/files/bake-modelinfos.py for this vLLM",
              file=sys.stderr)
        return 1
    files = sorted(cache_dir.glob("*.json"))
    # vLLM writes through a private temporary file (mode 0600, owner root); the serve user
    # reads them.
    for path in (root, cache_dir, *files):
        path.chmod(0o755 if path.is_dir() else 0o644)
    uncached = sorted(set(baked) - set(cached))
    print(f"bake-modelinfos: {len(cached)} architectures in {len(files)} files under "
          f"{cache_dir}; inspected at boot: {len(uncached)} that vLLM never caches "
          f"({', '.join(uncached) or 'none'}), {len(skipped)} whose modules do not import "
          f"here ({', '.join(skipped) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
