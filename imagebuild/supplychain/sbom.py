"""The CycloneDX SBOM of one serve image, from what the image holds (probe.py's snapshot)
and what the lock pinned (expected.py), made with cyclonedx-python-lib.

Components: the OS and its dpkg packages, every Python distribution of the engine's
environment (the wheel hash where pip recorded one, else the lock's for the engine
wheel; the sha256 of its RECORD), the vLLM source or wheel with every patch and pinned
compile dependency, the base and runtime images by digest, and the model and drafter
with each file's size and sha256. Where the image and the lock disagree, `findings` says
so; the findings are also in the SBOM (metadata properties `imagebuild:finding`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, XsUri
from cyclonedx.model import Property as CdxProperty
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from imagebuild.supplychain.expected import Expected, Weights, normalize

P = "imagebuild:"  # our property names (CycloneDX: a namespace prefix of the vendor's)


@dataclass(frozen=True)
class Subject:
    """The image the documents describe: the release manifest that was pushed."""

    name: str  # registry host/repository
    tag: str
    digest: str  # the release manifest's digest
    image_id: str  # its config digest (the tested local image id)
    inputs: str | None  # the image's inputs digest (its label)


def _text(value: str | list[str] | None) -> str:
    """probe.py sends a file's text as its lines."""
    return "\n".join(value) if isinstance(value, list) else (value or "")


def dpkg_packages(status: str | list[str] | None) -> list[dict[str, str]]:
    """Installed packages of a dpkg status file (paragraphs of `Field: value`)."""
    status = _text(status)
    out = []
    for para in re.split(r"\n\s*\n", status or ""):
        fields: dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line[:1] in (" ", "\t") and key:
                continue  # a continuation line (Description, Conffiles)
            key, sep, value = line.partition(":")
            if sep:
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            out.append(fields)
    return sorted(out, key=lambda f: (f["Package"], f.get("Architecture", "")))


def _os_release(snapshot: dict[str, Any]) -> dict[str, str]:
    out = {}
    for line in _text(snapshot.get("os_release")).splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def _sha256(hexdigest: str | None) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)] if hexdigest else []


def _props(**kv: Any) -> list[CdxProperty]:
    return [CdxProperty(name=P + k.replace("_", "-"), value=str(v))
            for k, v in kv.items() if v is not None and v != ""]


def _wheel_hash(dist: dict[str, Any]) -> str | None:
    """sha256 of the wheel pip installed, when it recorded one (direct_url.json)."""
    info = (dist.get("direct_url") or {}).get("archive_info") or {}
    hashes = info.get("hashes") or {}
    if hashes.get("sha256"):
        return str(hashes["sha256"])
    algo, _, value = str(info.get("hash") or "").partition("=")
    return value if algo == "sha256" and value else None


def _python(snapshot: dict[str, Any], ex: Expected) -> list[Component]:
    wheel = ex.wheel or {}
    comps = []
    for dist in snapshot.get("python") or []:
        name, version = str(dist.get("name") or ""), str(dist.get("version") or "")
        if not name:
            continue
        known = _wheel_hash(dist)
        if (known is None and wheel.get("sha256") and normalize(name) ==
                normalize(str(wheel.get("package", ""))) and version == wheel.get("version")):
            known = wheel["sha256"]  # the engine wheel: the lock pins its hash
        comps.append(Component(
            name=name, version=version, type=ComponentType.LIBRARY,
            bom_ref=f"pypi:{normalize(name)}@{version}",
            purl=PackageURL("pypi", None, normalize(name), version), hashes=_sha256(known),
            properties=_props(record_sha256=dist.get("record_sha256"), site=dist.get("site"),
                              installer=dist.get("installer"))))
    return comps


def _os(snapshot: dict[str, Any]) -> list[Component]:
    rel = _os_release(snapshot)
    distro = rel.get("ID", "debian")
    comps = []
    if rel:
        comps.append(Component(name=distro, version=rel.get("VERSION_ID", ""),
                               type=ComponentType.OPERATING_SYSTEM, bom_ref=f"os:{distro}",
                               description=rel.get("PRETTY_NAME")))
    for pkg in dpkg_packages(snapshot.get("dpkg_status")):
        arch = pkg.get("Architecture")
        comps.append(Component(
            name=pkg["Package"], version=pkg.get("Version", ""), type=ComponentType.LIBRARY,
            bom_ref=f"deb:{pkg['Package']}:{arch}@{pkg.get('Version', '')}",
            purl=PackageURL("deb", distro, pkg["Package"], pkg.get("Version"),
                            {"arch": arch} if arch else None),
            properties=_props(source_package=pkg.get("Source"))))
    return comps


def _github_purl(url: str, version: str | None) -> PackageURL | None:
    m = re.match(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$", url or "")
    return PackageURL("github", m.group(1).lower(), m.group(2).lower(), version) if m else None


def _engine(ex: Expected) -> list[Component]:
    e, comps = ex.engine, []
    patches = [Component(name=p["file"], type=ComponentType.FILE, bom_ref=f"patch:{p['file']}",
                         hashes=_sha256(p.get("sha256")),
                         properties=_props(applied_to="vllm", order=i))
               for i, p in enumerate(e.get("patches") or [], 1)]
    deps = []
    for name, d in sorted((e.get("dependencies") or {}).items()):
        commit = d.get("commit")
        deps.append(Component(
            name=name, version=commit or d.get("ref") or "", type=ComponentType.LIBRARY,
            bom_ref=f"compile-dep:{name}", purl=_github_purl(d.get("repository", ""), commit),
            external_references=[ExternalReference(type=ExternalReferenceType.VCS,
                                                   url=XsUri(d["repository"]))]
            if d.get("repository") else [],
            properties=_props(role="compile-dependency", ref=d.get("ref"),
                              declared_in=d.get("declared_in"),
                              unresolved="commit not pinned in the lock" if not commit else None)))
    src, wheel = ex.source, ex.wheel
    if src:
        comps.append(Component(
            name="vllm", version=ex.vllm_version or "", type=ComponentType.APPLICATION,
            bom_ref="vllm-source", purl=_github_purl(src.get("repository", ""), src.get("commit")),
            hashes=_sha256(src.get("sdist_sha256")),
            external_references=[ExternalReference(type=ExternalReferenceType.VCS,
                                                   url=XsUri(src["repository"]))]
            if src.get("repository") else [],
            properties=_props(role="engine-source", commit=src.get("commit"),
                              sdist_commit=src.get("sdist_commit"), engine=ex.engine_name),
            components=patches + deps))
    elif wheel:
        comps.append(Component(
            name=str(wheel.get("package", "vllm")), version=str(wheel.get("version", "")),
            type=ComponentType.APPLICATION, bom_ref="vllm-engine-wheel",
            hashes=_sha256(wheel.get("sha256")),
            properties=_props(role="engine-wheel", engine=ex.engine_name,
                              vllm_version=ex.vllm_version,
                              requirements=wheel.get("requirements"),
                              requirements_sha256=wheel.get("requirements_sha256")),
            components=patches + deps))
    return comps


def _image(role: str, image: str | None, digest: str | None) -> Component | None:
    if not image:
        return None
    return Component(name=image, version=digest or "unresolved", type=ComponentType.CONTAINER,
                     bom_ref=f"image:{role}", hashes=_sha256(
                         digest.removeprefix("sha256:") if digest else None),
                     properties=_props(role=role, unresolved=None if digest else
                                       "the lock records no digest for it"))


def _bases(ex: Expected) -> list[Component]:
    b = ex.base
    found = [_image("base-image", b.get("image"), b.get("digest")),
             _image("runtime-image", b.get("runtime_image"), b.get("runtime_digest"))]
    return [c for c in found if c is not None]


def _weights(w: Weights, found: dict[str, Any] | None) -> Component:
    files = (found or {}).get("files") or []
    return Component(
        name=w.repository or w.generated or w.name, version=w.revision or
        (f"seed-{w.seed}" if w.seed is not None else ""),
        type=ComponentType.MACHINE_LEARNING_MODEL, bom_ref=f"{w.role}:{w.name}",
        purl=PackageURL("huggingface", None, w.repository, w.revision)
        if w.repository and w.revision else None,
        properties=_props(role=w.role, matrix_name=w.name, path=w.path,
                          generated_by=w.generated, seed=w.seed),
        components=[Component(name=f"{w.path}/{f['path']}", type=ComponentType.DATA,
                              bom_ref=f"{w.role}:{w.name}:{f['path']}",
                              hashes=_sha256(f.get("sha256")), properties=_props(size=f["size"]))
                    for f in files])


def _left_out(snapshot: dict[str, Any]) -> dict[str, str]:
    """Pinned distributions the engine's build left out on purpose, as the image records
    them (slim.json of images/engine/files/slim-torch-cuda.py): name -> how."""
    slim = snapshot.get("slim") or {}
    out = {normalize(str(n)): "not installed" for n in slim.get("not_installed") or []}
    for origin in (slim.get("stubbed") or {}).values():
        # a stub of a library of a distribution not installed; one of torch's own files
        # leaves torch in (older engines named the distribution alone: it was left out)
        name = normalize(str(origin).split("==")[0])
        if name in out or "==" not in str(origin):
            out[name] = "stubbed"
    return out


def findings(snapshot: dict[str, Any], ex: Expected) -> list[str]:
    """Where the image and the lock disagree (every one is reported, none fails publish:
    the image passed smoke as it is; a release with findings says so in its SBOM)."""
    out = []
    have = {normalize(str(d.get("name", ""))): str(d.get("version", ""))
            for d in snapshot.get("python") or []}
    vllm = next((have[n] for n in ("vllm", normalize(str((ex.wheel or {}).get("package", ""))))
                 if n in have), None)
    if ex.vllm_version and vllm is None:
        out.append(f"vLLM: the lock pins {ex.vllm_version}, the image has no vllm distribution")
    elif ex.vllm_version and vllm and vllm.split("+")[0] != ex.vllm_version:
        out.append(f"vLLM: the image has {vllm}, the lock pins {ex.vllm_version}")
    left_out = _left_out(snapshot)
    for name, version in sorted(ex.python_pins.items()):
        if name not in have and name in left_out:
            continue  # the engine's build leaves it out on purpose, and the image says so
        if name not in have:
            out.append(f"python {name}: pinned {version}, not in the image")
        elif have[name] != version:
            out.append(f"python {name}: the image has {have[name]}, the lock's requirements "
                       f"pin {version}")
    for w in ex.weights:
        got = ((snapshot.get("weights") or {}).get(w.role) or {}).get("files")
        if got is None:
            out.append(f"{w.role} {w.name}: no folder {w.path} in the image")
            continue
        if w.files is None:
            out.append(f"{w.role} {w.name}: the lock lists no files for it (unresolved)")
            continue
        mine = {f["path"]: f for f in got}
        for f in w.files:
            held = mine.get(f["path"])
            if held is None:
                out.append(f"{w.role} {w.name}: {f['path']} is locked but not in the image")
            elif f.get("sha256") and held.get("sha256") != f["sha256"]:
                out.append(f"{w.role} {w.name}: {f['path']} has sha256 "
                           f"{str(held.get('sha256'))[:12]}, the lock pins {f['sha256'][:12]}")
        for path in sorted(set(mine) - {f["path"] for f in w.files}):
            out.append(f"{w.role} {w.name}: {path} is in the image but not in the lock")
    return out


def build_sbom(snapshot: dict[str, Any], ex: Expected, subject: Subject,
               found: list[str]) -> str:
    """The SBOM as CycloneDX 1.6 JSON text."""
    bom = Bom()
    bom.metadata.component = Component(
        name=subject.name, version=subject.tag, type=ComponentType.CONTAINER, bom_ref="image",
        hashes=_sha256(subject.digest.removeprefix("sha256:")),
        purl=PackageURL("oci", None, subject.name.rsplit("/", 1)[-1], subject.digest,
                        {"repository_url": subject.name, "tag": subject.tag}),
        properties=_props(image_id=subject.image_id, inputs_digest=subject.inputs,
                          cell=ex.cell, target=ex.target,
                          python_version=snapshot.get("python_version")))
    bom.metadata.properties.update(_props(finding_count=len(found)))
    for name, how in sorted(_left_out(snapshot).items()):  # pinned, left out by the build
        version = ex.python_pins.get(name, "")
        bom.metadata.properties.add(CdxProperty(
            name=f"{P}left-out", value=f"{name}=={version} ({how}: slim-torch-cuda.py)"
            if version else f"{name} ({how}: slim-torch-cuda.py)"))
    for path, origin in sorted(((snapshot.get("slim") or {}).get("stubbed") or {}).items()):
        bom.metadata.properties.add(CdxProperty(  # a file that is a stub in this image
            name=f"{P}stubbed", value=f"{path} (of {origin}: slim-torch-cuda.py)"))
    for i, text in enumerate(found):
        bom.metadata.properties.add(CdxProperty(name=f"{P}finding", value=f"{i + 1}: {text}"))
    parts = (_os(snapshot) + _python(snapshot, ex) + _engine(ex) + _bases(ex)
             + [_weights(w, (snapshot.get("weights") or {}).get(w.role)) for w in ex.weights])
    seen: set[str] = set()
    for comp in parts:
        ref = str(comp.bom_ref.value)
        if ref in seen:  # the same distribution in purelib and platlib: once
            continue
        seen.add(ref)
        bom.components.add(comp)
        bom.register_dependency(bom.metadata.component, [comp])
    return JsonV1Dot6(bom).output_as_string(indent=1)
