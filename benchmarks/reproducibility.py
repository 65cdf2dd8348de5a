#!/usr/bin/env python3
"""Does the cpu cell's build reproduce? Two cold builds of base, engine and serve image,
compared layer by layer and file by file (docs/reproducibility.md).

    flock /tmp/imagebuild-heavy.lock .venv/bin/python benchmarks/reproducibility.py \
        [--tag T] [--label NAME] [--json FILE] [--keep]

Each run is the product's own `build.py build --no-cache --target cpu` (no build
avoidance, no BuildKit layer cache; its pip cache mount stays, so nothing is downloaded
again). The images built are tagged `imagebuild-repro/KIND:LABEL-runN`; every tag the
build moved (the local release ref, the base/engine and `imagebuild/inputs` tags) is put
back on the image it named before, so other users of this Docker engine see no change.
Then, per image: image ids, the config fields that differ, each layer's diff id, and for
each layer that differs every file that differs and why (read from `docker save` with
tarfile). Prints a table and, with --json, writes everything to FILE. Without --keep the
two runs' images are untagged (removed) at the end. `--compare-only` compares the images a
`--keep` run left; `--images A B` any two images (a release against a rebuild of it).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
DOCKER = "/usr/bin/docker"
TAG = "2026-06-18-dflashfix"
MINE = "imagebuild-repro"
KINDS = ("base", "engine", "serve")
SAMPLES = 12  # paths listed per (layer, reason)


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        sys.exit(f"docker {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def tag_map() -> dict[str, str]:
    """Every `repository:tag` of this Docker engine -> its image id."""
    out = docker("image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}}\t{{.ID}}")
    return dict(line.split("\t") for line in out.splitlines() if "<none>" not in line)


# -- the builds -------------------------------------------------------------------------
def cold_build(tag: str, out: Path) -> tuple[float, list[dict]]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "build.py", "build", "--no-cache", "--tag", tag,
                           "--target", "cpu", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    records = [json.loads(p.read_text()) for p in sorted((out / "records").rglob("*.json"))]
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, records


def keep_and_restore(records: list[dict], before: dict[str, str], name: str) -> dict[str, str]:
    """Tag this run's images as ours; put every tag the build moved back where it was."""
    ours = {}
    for rec in records:
        ref = f"{MINE}/{rec['kind']}:{name}"
        docker("tag", rec["image_id"], ref)
        ours[rec["kind"]] = rec["image_id"]
    moved = {r["ref"] for r in records} | {f"imagebuild/inputs:{r['inputs_digest']}"
                                           for r in records}
    for ref in sorted(moved):
        if ref in before:
            docker("tag", before[ref], ref)
        else:
            docker("rmi", ref, check=False)  # untag only: our tag keeps the image
    return ours


# -- reading an image -------------------------------------------------------------------
class Hashing(io.RawIOBase):
    """A read-through stream that hashes what is read (a layer's diff id)."""

    def __init__(self, raw: IO[bytes], head: bytes = b"") -> None:
        self.raw, self.head, self.sha = raw, head, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.head:
            n = min(len(buf), len(self.head))
            buf[:n], self.head = self.head[:n], self.head[n:]
        else:
            data = self.raw.read(len(buf))
            n = len(data)
            buf[:n] = data
        self.sha.update(bytes(buf[:n]))
        return n


def index_layer(stream: IO[bytes]) -> dict[str, dict]:
    """Every entry of one layer tar: kind, mode, owner, size, mtime, link, content hash
    (and a .pyc's 16-byte header, which holds the source's mtime or hash)."""
    entries: dict[str, dict] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            e = {"type": m.type.decode(), "mode": m.mode, "owner": f"{m.uid}:{m.gid}",
                 "size": m.size, "mtime": int(m.mtime), "link": m.linkname}
            if m.isfile():
                fh = tar.extractfile(m)
                assert fh is not None
                whole, body = hashlib.sha256(), hashlib.sha256()
                first = fh.read(1 << 20)
                whole.update(first)
                body.update(first[16:])
                while chunk := fh.read(1 << 20):
                    whole.update(chunk)
                    body.update(chunk)
                e["sha256"] = whole.hexdigest()
                if m.name.endswith(".pyc"):  # header (flags, source mtime or hash), code
                    e["pyc_header"], e["pyc_body"] = first[:16].hex(), body.hexdigest()
            entries[m.name.removeprefix("./")] = e
    return entries


def index_images(refs: list[str]) -> tuple[dict[str, dict[str, dict]], dict[str, dict]]:
    """diff id -> its file index, for every layer of these images, and image id -> its
    config (one `docker save`)."""
    proc = subprocess.Popen([DOCKER, "save", *refs], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    layers: dict[str, dict[str, dict]] = {}
    configs: dict[str, dict] = {}
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            if not member.isfile():
                continue
            fh = outer.extractfile(member)
            assert fh is not None
            head = fh.read(512)
            if head[257:262] != b"ustar" and not member.name.endswith("layer.tar"):
                if member.size < 1 << 22:  # a config or manifest, not a layer
                    data = head + fh.read()
                    try:
                        doc = json.loads(data)
                    except ValueError:
                        continue
                    if isinstance(doc, dict) and "history" in doc:
                        configs["sha256:" + hashlib.sha256(data).hexdigest()] = doc
                continue
            stream = Hashing(fh, head)
            index = index_layer(io.BufferedReader(stream, 1 << 20))
            while stream.read(1 << 20):  # the tar's padding: the diff id covers it
                pass
            layers["sha256:" + stream.sha.hexdigest()] = index
    if proc.wait() != 0:
        sys.exit(f"docker save {' '.join(refs)} failed")
    return layers, configs


# -- why files differ -------------------------------------------------------------------
REASONS = (  # (path pattern, reason): first match wins; "content" otherwise
    (r"(^|/)var/log/(dpkg\.log|apt/|alternatives\.log)", "apt/dpkg logs"),
    (r"(^|/)var/cache/(debconf|ldconfig)/|(^|/)etc/ld\.so\.cache$|(^|/)var/lib/dpkg/"
     r"(status-old|triggers/)", "apt/dpkg and ld.so caches"),
    (r"\.dist-info/(RECORD|INSTALLER|direct_url\.json|REQUESTED)$", "pip install metadata"),
    (r"(^|/)(root/\.cache|tmp)/", "build leftovers (caches, /tmp)"),
    (r"(^|/)etc/(passwd|group|shadow|gshadow)-?$", "user database"),
)


def why(path: str, a: dict | None, b: dict | None) -> str:
    if a is None or b is None:
        return "only in run " + ("2" if a is None else "1")
    changed = [k for k in ("type", "mode", "owner", "size", "sha256", "link") if a.get(k) !=
               b.get(k)]
    if not changed:
        return "mtime only" if a["mtime"] != b["mtime"] else "tar header only"
    if path.endswith(".pyc") and a.get("pyc_header") and b.get("pyc_header"):
        flags = int.from_bytes(bytes.fromhex(a["pyc_header"])[4:8], "little")
        kind = "hash-based" if flags & 1 else "timestamp"
        if a["pyc_body"] == b["pyc_body"]:
            return f".pyc header only ({kind}: the source's mtime)" if kind == "timestamp" \
                else ".pyc header only (hash-based)"
        return f".pyc code differs ({kind} pyc: marshal output)"
    for pattern, reason in REASONS:
        if re.search(pattern, path):
            return reason
    return "content (" + ", ".join(changed) + ")"


def entry_kind(path: str, e: dict) -> str:
    if e["type"] == "5":
        return "directory"
    if e["type"] == "2":
        return "symlink"
    if Path(path).name.startswith(".wh."):
        return "whiteout"
    suffix = Path(path).suffix
    return f"{suffix} file" if suffix in (".py", ".pyc", ".so") else "other file"


def compare_layer(a: dict[str, dict], b: dict[str, dict]) -> dict:
    kinds: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    samples: dict[str, list[str]] = {}
    for path in sorted(set(a) | set(b)):
        ea, eb = a.get(path), b.get(path)
        if ea == eb:
            continue
        reason = why(path, ea, eb)
        reasons[reason] += 1
        kinds[entry_kind(path, ea or eb or {})] += 1
        samples.setdefault(reason, [])
        if len(samples[reason]) < SAMPLES:
            samples[reason].append(path)
    return {"files": len(set(a) | set(b)), "differing": sum(reasons.values()),
            "reasons": dict(reasons.most_common()), "kinds": dict(kinds.most_common()),
            "samples": samples}


def config_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths of the fields that differ between two image configs."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b))
                for p in config_diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True))
                for p in config_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "."]


def inspect(image: str) -> dict:
    return json.loads(docker("image", "inspect", image))[0]


def history_steps(config: dict) -> list[str]:
    """The step that made each layer, bottom-up, from the image config's history."""
    return [re.sub(r"\s+", " ", h.get("created_by", ""))[:110]
            for h in config.get("history", []) if not h.get("empty_layer")]


def compare(pairs: dict[str, tuple[str, str]]) -> dict:
    """Per pair of images (each built FROM the one before): ids, config fields, layers;
    per differing layer above the previous pair's, its files and why."""
    report: dict[str, Any] = {}
    index, configs = index_images([ref for pair in pairs.values() for ref in pair])
    below = 0  # layers of the image this one is built FROM
    for kind, (ref1, ref2) in pairs.items():
        i1, i2 = inspect(ref1), inspect(ref2)
        l1, l2 = i1["RootFS"]["Layers"], i2["RootFS"]["Layers"]
        steps = history_steps(configs.get(i1["Id"], {}))
        layers = []
        for n in range(below, max(len(l1), len(l2))):
            a, b = (l1[n] if n < len(l1) else None), (l2[n] if n < len(l2) else None)
            row: dict[str, Any] = {"layer": n, "run1": a, "run2": b, "same": a == b,
                                   "step": steps[n] if n < len(steps) else ""}
            if a != b and a in index and b in index:
                row.update(compare_layer(index[a], index[b]))
            layers.append(row)
        cfg = [p for p in config_diff(
            {k: i1.get(k) for k in ("Config", "Created", "Architecture", "Os")},
            {k: i2.get(k) for k in ("Config", "Created", "Architecture", "Os")})]
        report[kind] = {"id_run1": i1["Id"], "id_run2": i2["Id"], "same_id": i1["Id"] == i2["Id"],
                        "config_differs": cfg, "layers": layers,
                        "differing_layers": sum(not r["same"] for r in layers),
                        "differing_files": sum(r.get("differing", 0) for r in layers),
                        # entries whose bytes, mode, owner or type differ (not only mtime)
                        "differing_content": sum(n for r in layers for reason, n in
                                                 r.get("reasons", {}).items()
                                                 if reason != "mtime only")}
        below = len(l1)
    return report


def buildkit_facts() -> dict:
    """What this machine's Docker can do for reproducible images, detected: the daemon
    and client versions, buildx, and whether BuildKit stamps SOURCE_DATE_EPOCH into the
    image config (a two-line FROM scratch build, nothing pulled)."""
    version = json.loads(docker("version", "--format", "{{json .}}"))
    buildx = subprocess.run([DOCKER, "buildx", "version"], capture_output=True, text=True)
    created = ""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "f").write_text("x\n")
        (Path(tmp) / "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
        iid = Path(tmp) / "iid"
        probe = subprocess.run([DOCKER, "build", "--no-cache", "-q", "--iidfile", str(iid),
                                "--build-arg", "SOURCE_DATE_EPOCH=0", tmp],
                               capture_output=True, text=True,
                               env={**os.environ, "DOCKER_BUILDKIT": "1"})
        if probe.returncode == 0 and iid.exists():
            image = iid.read_text().strip()
            created = inspect(image)["Created"]
            docker("rmi", image, check=False)
    return {"client": version.get("Client", {}).get("Version"),
            "server": version.get("Server", {}).get("Version"),
            "buildx": buildx.stdout.strip() if buildx.returncode == 0 else None,
            "source_date_epoch_in_config": created.startswith("1970-01-01"),
            "probe_created": created}


def print_table(report: dict, walls: list[float], facts: dict) -> None:
    print(f"docker client {facts['client']}, daemon {facts['server']}, buildx "
          f"{facts['buildx'] or 'absent'}; SOURCE_DATE_EPOCH applied to the image config: "
          f"{'yes' if facts['source_date_epoch_in_config'] else 'no'}")
    if walls:
        print("cold builds: " + ", ".join(f"{w:.0f} s" for w in walls))
    print(f"{'image':7} {'same id':8} {'own layers':>10} {'differ':>7} {'files differ':>13} "
          f"{'content':>8}  config fields that differ")
    for kind, r in report.items():
        print(f"{kind:7} {'yes' if r['same_id'] else 'no':8} {len(r['layers']):10d} "
              f"{r['differing_layers']:7d} {r['differing_files']:13d} "
              f"{r['differing_content']:8d}  "
              f"{', '.join(r['config_differs'][:4])}"
              + (f" (+{len(r['config_differs']) - 4})" if len(r['config_differs']) > 4 else ""))
    for kind, r in report.items():
        for row in r["layers"]:
            if row["same"]:
                continue
            print(f"\n{kind} layer {row['layer']}: {row['step']}")
            print(f"  {row.get('differing', '?')} of {row.get('files', '?')} entries differ ("
                  + ", ".join(f"{n} {k}" for k, n in row.get("kinds", {}).items()) + ")")
            for reason, n in row.get("reasons", {}).items():
                sample = ", ".join(row["samples"][reason][:3])
                print(f"    {n:6d}  {reason}: {sample}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tag", default=TAG)
    p.add_argument("--label", default="repro", help="names this pair of runs in the tags")
    p.add_argument("--json", type=Path, default=None, help="write the whole report here")
    p.add_argument("--keep", action="store_true", help="keep the two runs' images")
    p.add_argument("--compare-only", action="store_true",
                   help="build nothing: compare the images a --keep run of --label kept")
    p.add_argument("--images", nargs=2, metavar=("IMAGE_A", "IMAGE_B"),
                   help="build nothing: compare these two images (a release against "
                        "a rebuild of it), every layer")
    a = p.parse_args()
    facts = buildkit_facts()
    runs: list[dict[str, str]] = []
    walls: list[float] = []
    if a.images:
        a.compare_only, a.keep = True, True
    elif a.compare_only:
        runs = [{"name": f"{a.label}-run{n}", **{k: inspect(f"{MINE}/{k}:{a.label}-run{n}")["Id"]
                                                 for k in KINDS}} for n in (1, 2)]
        a.keep = True
        if a.json and a.json.exists():  # the build times of the run that built them
            walls = json.loads(a.json.read_text()).get("cold_build_s", [])
    with tempfile.TemporaryDirectory(prefix="imagebuild-repro-") as tmp:
        for n in () if a.compare_only else (1, 2):
            name = f"{a.label}-run{n}"
            before = tag_map()
            try:
                wall, records = cold_build(a.tag, Path(tmp) / name)
            finally:
                records_now = [json.loads(x.read_text()) for x in
                               sorted((Path(tmp) / name / "records").rglob("*.json"))]
                ours = keep_and_restore(records_now, before, name)
            walls.append(wall)
            print(f"run {n}: cold build in {wall:.0f} s: "
                  + ", ".join(f"{k} {v[7:19]}" for k, v in ours.items()), flush=True)
            runs.append({"name": name, **ours})
    try:
        if a.images:
            pairs = {"image": (a.images[0], a.images[1])}
        else:
            pairs = {k: (f"{MINE}/{k}:{runs[0]['name']}", f"{MINE}/{k}:{runs[1]['name']}")
                     for k in KINDS}
        report = compare(pairs)
    finally:
        if not a.keep:
            for run in runs:
                for kind in KINDS:
                    docker("rmi", f"{MINE}/{kind}:{run['name']}", check=False)
    print_table(report, walls, facts)
    if a.json:
        a.json.write_text(json.dumps({"tag": a.tag, "label": a.label, "docker": facts,
                                      "cold_build_s": [round(w, 1) for w in walls],
                                      "images": report}, indent=1) + "\n")
        print(f"\nwritten: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
