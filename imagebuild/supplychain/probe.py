"""What an image holds, read inside it: run by the image's own `python3` (stdlib only, no
network), or on the host against an unpacked file tree (`--root`, the unit tests).

Prints one JSON object (short lines): the dpkg status file's lines, every Python distribution of the
interpreter's environment (name, version, the wheel hash its direct_url.json records when
pip installed it from a file or URL, and the sha256 of its RECORD, which lists every file
it installed), and each model directory's files with size and sha256. The host turns it
into the SBOM (sbom.py); nothing here interprets it.

Usage: python3 probe.py [--root DIR] [--site DIR ...] [--weights NAME=DIR ...]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig

DPKG_STATUS = "var/lib/dpkg/status"
SLIM_RECORD = "opt/imagebuild/slim.json"  # images/engine/files/slim-torch-cuda.py writes it
CHUNK = 1 << 20


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _headers(text: str) -> dict[str, str]:
    """Name and Version of a METADATA file (RFC 822 headers up to the first blank line)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in out:
            out[key] = value.strip()
    return out


def distributions(site: str) -> list[dict[str, object]]:
    found = []
    for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        if not entry.endswith(".dist-info"):
            continue
        info = os.path.join(site, entry)
        try:
            with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as f:
                meta = _headers(f.read())
        except OSError:
            continue
        dist: dict[str, object] = {"name": meta.get("Name", ""),
                                   "version": meta.get("Version", ""), "dist_info": entry}
        direct = os.path.join(info, "direct_url.json")
        if os.path.isfile(direct):
            try:
                with open(direct, encoding="utf-8") as f:
                    dist["direct_url"] = json.load(f)
            except (OSError, ValueError):
                pass
        record = os.path.join(info, "RECORD")
        if os.path.isfile(record):
            dist["record_sha256"] = sha256(record)
        for name in ("INSTALLER", "REQUESTED"):
            if os.path.isfile(os.path.join(info, name)):
                with open(os.path.join(info, name), encoding="utf-8", errors="replace") as f:
                    dist[name.lower()] = f.read().strip() or True
        found.append(dist)
    return found


def weight_files(folder: str) -> list[dict[str, object]] | None:
    if not os.path.isdir(folder):
        return None
    files = []
    for base, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(base, name)
            if os.path.isfile(path):
                files.append({"path": os.path.relpath(path, folder),
                              "size": os.path.getsize(path), "sha256": sha256(path)})
    return files


def _site_dirs() -> list[str]:
    # lib64 is often a link to lib: the same distributions once
    return sorted({os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")})


def probe(root: str, sites: list[str], weights: dict[str, str]) -> dict[str, object]:
    def under(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    status = under(DPKG_STATUS)
    dpkg = None
    if os.path.isfile(status):
        with open(status, encoding="utf-8", errors="replace") as f:
            dpkg = f.read()
    os_release = None
    for path in ("etc/os-release", "usr/lib/os-release"):
        if os.path.isfile(under(path)):
            with open(under(path), encoding="utf-8", errors="replace") as f:
                os_release = f.read()
            break
    slim = None  # what the cpu engine's build left out of torch's CUDA dependencies, on purpose
    if os.path.isfile(under(SLIM_RECORD)):
        try:
            with open(under(SLIM_RECORD), encoding="utf-8") as f:
                record = json.load(f)
            stubbed = record.get("stubbed") or {}
            # stubbed library -> the distribution whose file it stands in for; engines
            # before issue 37 recorded distribution -> its stubbed libraries
            slim = {"not_installed": list(record.get("not_installed") or []),
                    "stubbed": {**{str(p): str(d) for d, paths in stubbed.items()
                                   if isinstance(paths, list) for p in paths},
                                **{str(p): str(m.get("from", "")) for p, m in stubbed.items()
                                   if isinstance(m, dict)}}}
        except (OSError, ValueError, AttributeError):
            slim = None
    python: list[dict[str, object]] = []
    for site in sites:
        for dist in distributions(under(site)):
            python.append({**dist, "site": site})
    # text as lists of lines, printed one JSON value per line: Docker's json-file log
    # driver cuts lines beyond 16 KiB into parts that `docker logs` does not always rejoin
    return {"dpkg_status": dpkg.splitlines() if dpkg is not None else None,
            "os_release": os_release.splitlines() if os_release is not None else None,
            "python": python, "slim": slim, "sites": sites,
            "python_version": ".".join(map(str, sys.version_info[:3])),
            "weights": {name: {"dir": d, "files": weight_files(under(d))}
                        for name, d in weights.items()}}


def main(argv: list[str]) -> int:
    root, sites, weights = "/", [], {}
    it = iter(argv)
    for arg in it:
        if arg == "--root":
            root = next(it)
        elif arg == "--site":
            sites.append(next(it))
        elif arg == "--weights":
            name, _, folder = next(it).partition("=")
            weights[name] = folder
        else:
            print(f"probe: unknown argument {arg!r}", file=sys.stderr)
            return 2
    json.dump(probe(root, sites or _site_dirs(), weights), sys.stdout, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
