"""The engine handoff's pull: a cell job builds only its serve layers on the engine its
target's engine job pushed (`build.py build --engine-image REF@sha256:...`; the push is
engineship.py).

The digest fixes the content; the image's `io.imagebuild.inputs` label must equal
the inputs digest this checkout computes for that engine (recipe, patches, lock, base),
else it is refused (another commit's engine, a relabelled image) and nothing is tagged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from imagebuild.docker import engine as docker_engine
from imagebuild.errors import UserError
from imagebuild.plan import ImageRef
from imagebuild.registry.client import resolve_credentials
from imagebuild.registry.credentials import docker_auth_config
from imagebuild.spec.names import INPUTS_LABEL

DIGEST_REF = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
REF_FIX = ("pass the `REPOSITORY@sha256:...` the engine job printed (build/engines/"
           "<target>.ref), or drop --engine-image to build the engine here")
Log = Callable[[str], None]


def parse_engine_ref(text: str) -> tuple[ImageRef, str]:
    """`host/path@sha256:<64 hex>` -> (ImageRef, digest). A tag alone is refused: only a
    digest fixes what is pulled."""
    m = DIGEST_REF.match(text.strip())
    if not m:
        raise UserError(f"--engine-image {text!r} is not REPOSITORY@sha256:<64 hex digits>",
                        fix=REF_FIX)
    image, tag = ImageRef.parse(m["name"])
    if tag:
        raise UserError(f"--engine-image {text!r} names a tag and a digest", fix=REF_FIX)
    return image, m["digest"]


def _auth(host: str) -> dict[str, str] | None:
    return docker_auth_config(resolve_credentials(host), host)


def pull_engine(ref: str, want: str, what: str, *, log: Log = print) -> str:
    """Pull `ref` (by digest) and return its local image id when its inputs label is
    `want`; refuse it otherwise, leaving no trace of an image this pull brought in."""
    image, digest = parse_engine_ref(ref)
    by_digest = image.by_digest(digest)
    seam = docker_engine()
    had = seam.image_id(by_digest)
    image_id = seam.pull_checked(by_digest, _auth(image.registry))
    info = seam.inspect_image(image_id) or {}
    got = ((info.get("Config") or {}).get("Labels") or {}).get(INPUTS_LABEL) or ""
    if got != want:
        if not had:
            seam.remove_image(by_digest)
        raise UserError(
            f"{by_digest} is not the {what} engine this checkout builds: its {INPUTS_LABEL} "
            f"label is {got[:16] or '(missing)'}, this checkout's engine inputs are "
            f"{want[:16]}; nothing was built", fix=REF_FIX)
    log(f"[engine] {by_digest}: inputs {want[:12]} as this checkout builds it")
    return image_id
