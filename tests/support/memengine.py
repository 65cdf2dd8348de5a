"""The one test double of the Docker seam: a Docker engine in memory.

`MemoryEngine` answers what imagebuild/docker.py's `DockerEngine` Protocol asks: images
(inspect documents by reference and id, tags, labels, history), pulls and pushes,
containers (labels, states, logs), volumes and networks, BuildKit builds (each writes
its image id and is kept with its command line, environment and the secret files it was
handed), and every call in `calls`. Tests install it with `installed(double)` or the
`memory_engine` fixture (tests/conftest.py); what a test needs differently it sets on the
instance (`server`, `buildx`, `run_error`, `probe_answer`, ...). `make typecheck` checks
this class against the Protocol (the assignment at the end), so a change of the seam
breaks the double at type-check time, not in a test run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from imagebuild.docker import ENGINE_FIX, run_labels, use_engine
from imagebuild.errors import OperationFailed, UserError

if TYPE_CHECKING:
    from imagebuild.docker import DockerEngine

E = TypeVar("E", bound="DockerEngine")
BUILD_OUTPUT = "#5 [1/2] RUN true\n#5 DONE 0.1s\n"  # BuildKit's plain progress: one step
# a probe's answer for an engine whose vLLM kernels are built for GB10 (builder/archtable.py)
SM121A_TABLE = json.dumps([{"library": lib, "verdict": "sm_121a", "files": 1,
                            "cubins": ["sm_121a"], "ptx": [], "worst": "sm_121a"}
                           for lib in ("vllm", "vllm/vllm_flash_attn")])


@dataclass
class Call:
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass
class Build:
    argv: list[str]
    env: dict[str, str]
    secrets: dict[str, str]  # --secret id -> the file's text while the build ran


@dataclass
class Container:
    name: str
    image: str
    labels: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)  # run()'s SDK keyword arguments
    state: dict[str, Any] = field(default_factory=lambda: {"Status": "running",
                                                           "Running": True, "ExitCode": 0})
    log: list[bytes] = field(default_factory=list)
    created: float = 0.0
    status: str = "Up"  # `docker ps`' STATUS column
    exec_answer: tuple[int, str] = (0, "")
    files: dict[str, bytes] = field(default_factory=dict)  # path in the container -> content


def image_doc(image_id: str, labels: Mapping[str, str] | None = None, *,
              cmd: list[str] | None = None, user: str = "", **more: Any) -> dict[str, Any]:
    """An inspect document: its id, labels, command and user, and whatever else (top
    level keys) a test sets."""
    return {"Id": image_id, "RepoTags": [], "Size": 1,
            "Config": {"Labels": dict(labels or {}), "Env": [], "Cmd": list(cmd or []),
                       "User": user}, **more}


def _matches(labels: Mapping[str, str] | None, label: str) -> bool:
    labels = labels or {}
    key, eq, value = label.partition("=")
    return key in labels and (not eq or labels[key] == value)


class MemoryEngine:
    """A Docker engine in memory (module docstring). `answers=False`: an engine that
    does not answer (`info` fails as the real one's does); `refuse=True`: any call is a
    test failure (for input that must be refused before Docker is asked anything)."""

    def __init__(self, *, answers: bool = True, refuse: bool = False) -> None:
        self.answers, self.refuse = answers, refuse
        self.server: dict[str, Any] = {"ServerVersion": "27.0",
                                       "DockerRootDir": "/var/lib/docker"}
        self.buildx = False
        self.images_by_ref: dict[str, dict[str, Any]] = {}
        self.histories: dict[str, list[dict[str, Any]]] = {}
        self.pullable: dict[str, dict[str, Any]] = {}  # what a registry holds, by reference
        self.digests: dict[str, str] = {}  # registry_digest's answers
        self.exports: dict[str, bytes] = {}  # image id -> its `docker save` tar
        self.containers: dict[str, Container] = {}
        self.objects: dict[str, dict[str, dict[str, str] | None]] = {"volume": {},
                                                                      "network": {}}
        self.in_use: set[str] = set()  # what removing fails for (a container uses it)
        self.run_error: BaseException | None = None  # what run() raises instead
        self.probe_answer: tuple[int, str] = (0, "")
        self.user = (1000, 1000)  # what an image's USER name resolves to
        self.cpu: dict[str, float] = {}
        self.build_output = BUILD_OUTPUT
        self.build_id: str | None = None  # every build's image id (None: from its argv)
        self.builds: list[Build] = []
        self.build_records: list[dict[str, Any]] = []  # BuildKit's cache, as df lists it
        self.calls: list[Call] = []

    # -- what tests read and set

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append(Call(method, args, kwargs))
        if self.refuse:
            raise AssertionError(f"Docker was asked for {method!r}")

    def called(self, method: str) -> list[Any]:
        """The arguments of each call of `method`: the one positional one, else a tuple."""
        return [c.args[0] if len(c.args) == 1 else c.args
                for c in self.calls if c.method == method]

    def called_with(self, method: str) -> list[dict[str, Any]]:
        """The keyword arguments of each call of `method` (run's: the SDK's options)."""
        return [c.kwargs for c in self.calls if c.method == method]

    def add_image(self, doc: dict[str, Any], *refs: str) -> str:
        """An image known by its id and each of `refs`; its id."""
        self.images_by_ref[doc["Id"]] = doc
        for ref in refs:
            self._name(doc, ref)
        return str(doc["Id"])

    def add_container(self, name: str, image: str = "img", labels: Mapping[str, str]
                      | None = None, **fields: Any) -> Container:
        self.containers[name] = Container(name, image, dict(labels or {}), **fields)
        return self.containers[name]

    def _name(self, doc: dict[str, Any], ref: str) -> None:
        self.images_by_ref[ref] = doc
        if ref != doc["Id"] and ref not in doc.setdefault("RepoTags", []):
            doc["RepoTags"].append(ref)

    # -- the Protocol

    def info(self) -> dict[str, Any]:
        self._call("info")
        if not self.answers:
            raise OperationFailed("no Docker engine answers (the memory engine is stopped)",
                                  fix=ENGINE_FIX)
        return dict(self.server)

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        self._call("inspect_image", ref)
        return self.images_by_ref.get(ref)

    def image_id(self, ref: str) -> str | None:
        self._call("image_id", ref)
        doc = self.images_by_ref.get(ref)
        return str(doc["Id"]) if doc else None

    def send_image(self, ref: str, to: MemoryEngine) -> None:
        self._call("send_image", ref, to)
        to.add_image(self.images_by_ref[ref], ref)

    def on_this_machine(self) -> bool:
        return False  # no dockerd files to read: a push takes the export path

    def export_image(self, ref: str) -> Iterator[bytes]:
        self._call("export_image", ref)
        doc = self.images_by_ref.get(ref)
        if doc is None or doc["Id"] not in self.exports:
            raise OperationFailed(f"cannot export {ref}: no such image")
        yield self.exports[doc["Id"]]

    def tag(self, image: str, repository: str, tag: str) -> None:
        self._call("tag", image, f"{repository}:{tag}")
        if image not in self.images_by_ref:
            raise OperationFailed(f"cannot tag {image} as {repository}:{tag}: no such image")
        self._name(self.images_by_ref[image], f"{repository}:{tag}")

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        self._call("remove_image", ref)
        if ref in self.in_use and not force:
            raise OperationFailed(f"cannot remove {ref}: conflict: a container uses it")
        doc = self.images_by_ref.pop(ref, None)
        if doc is None:
            return False
        tags = doc.get("RepoTags") or []
        if ref in tags:
            tags.remove(ref)
        if not tags:  # an image goes with its last name
            self.images_by_ref.pop(doc["Id"], None)
        return True

    def images(self, *, label: str | None = None, reference: str | None = None
               ) -> list[dict[str, Any]]:
        self._call("images", label=label, reference=reference)
        unique = {d["Id"]: d for d in self.images_by_ref.values()}.values()
        return [{"Id": d["Id"], "RepoTags": list(d.get("RepoTags") or []),
                 "Labels": (d.get("Config") or {}).get("Labels") or {},
                 "Size": d.get("Size", 0), "Created": d.get("Created", 0)}
                for d in unique
                if (not label or _matches((d.get("Config") or {}).get("Labels") or {}, label))
                and (not reference or any(t.rpartition(":")[0] == reference
                                          for t in d.get("RepoTags") or []))]

    def history(self, image_id: str) -> list[dict[str, Any]]:
        self._call("history", image_id)
        return list(self.histories.get(image_id, []))

    def registry_digest(self, ref: str) -> str:
        self._call("registry_digest", ref)
        if ref not in self.digests:
            raise OperationFailed(f"cannot look up the digest of {ref}: not found")
        return self.digests[ref]

    def _pull(self, ref: str) -> str | None:
        doc = self.pullable.get(ref)
        return self.add_image(doc, ref) if doc else None

    def pull(self, ref: str, *, timeout: float = 120) -> str | None:
        self._call("pull", ref)
        return self._pull(ref)

    def pull_checked(self, ref: str, auth: Mapping[str, str] | None = None) -> str:
        self._call("pull_checked", ref)
        got = self._pull(ref)
        if got is None:
            raise OperationFailed(f"docker pull {ref} failed: not found")
        return got

    def import_tar(self, tar_path: Path, repository: str, tag: str,
                   changes: list[str]) -> str:
        self._call("import_tar", tar_path, f"{repository}:{tag}")
        image_id = "sha256:" + hashlib.sha256(tar_path.read_bytes()).hexdigest()
        return self.add_image(image_doc(image_id), f"{repository}:{tag}")

    def container_state(self, name: str) -> dict[str, Any] | None:
        self._call("container_state", name)
        c = self.containers.get(name)
        return dict(c.state) if c else None

    def container_env(self, name: str) -> list[str]:
        self._call("container_env", name)
        env = self.containers[name].options.get("environment") or {}
        return [f"{k}={v}" for k, v in dict(env).items()]

    def container_names(self, *, label: str) -> list[str]:
        self._call("container_names", label=label)
        return [n for n, c in self.containers.items() if _matches(c.labels, label)]

    def logs(self, name: str, *, follow: bool = True) -> Iterator[bytes]:
        self._call("logs", name)
        c = self.containers.get(name)
        yield from (c.log if c else [])

    def cpu_percent(self, name: str) -> float | None:
        self._call("cpu_percent", name)
        return self.cpu.get(name)

    def exec(self, name: str, argv: list[str]) -> tuple[int, str]:
        self._call("exec", name, argv)
        return self.containers[name].exec_answer

    def copy_from(self, name: str, path: str, dest: Path) -> Path:
        """The container's files at or below `path`, into the directory `dest`."""
        self._call("copy_from", name, path)
        top = Path(path)
        for where, content in self.containers[name].files.items():
            inside = Path(where)
            if inside == top or top in inside.parents:
                out = dest / top.name / inside.relative_to(top)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(content)
        return dest / top.name

    def run(self, image: str, command: list[str], *, name: str, labels: Mapping[str, str],
            **kw: Any) -> str:
        self._call("run", image, command, name=name, labels=dict(labels), **kw)
        if self.run_error is not None:
            raise self.run_error
        if image not in self.images_by_ref:
            raise UserError(f"no local image {image}", fix="build it first")
        self.add_container(name, image, run_labels(labels), options=dict(kw))
        return name

    def probe(self, image: str, argv: list[str], *, entrypoint: str,
              mounts: Mapping[str, str]) -> tuple[int, str]:
        self._call("probe", image, argv)
        if image not in self.images_by_ref:
            raise UserError(f"no local image {image}", fix="build it first")
        return self.probe_answer

    def resolve_user(self, ref: str) -> tuple[int, int]:
        self._call("resolve_user", ref)
        return self.user

    def remove_container(self, name: str) -> None:
        self._call("remove_container", name)
        self.containers.pop(name, None)

    def labelled_leftovers(self, label: str) -> list[str]:
        self._call("labelled_leftovers", label)
        return [f"{kind} {row['Name']}" for kind in ("container", "volume", "network")
                for row in self._rows(kind, label)]

    def remove_labelled(self, label: str) -> list[str]:
        self._call("remove_labelled", label)
        names = [n for n, c in self.containers.items() if _matches(c.labels, label)]
        for n in names:
            del self.containers[n]
        return names

    def _rows(self, kind: str, label: str | None) -> list[dict[str, Any]]:
        if kind == "container":
            return [{"Name": c.name, "Labels": c.labels, "State": c.state["Status"],
                     "Status": c.status, "Created": c.created}
                    for c in self.containers.values() if not label or _matches(c.labels, label)]
        return [{"Name": n, "Labels": labels} for n, labels in self.objects[kind].items()
                if not label or _matches(labels, label)]

    def listing(self, kind: str, *, label: str | None = None) -> list[dict[str, Any]]:
        self._call("listing", kind, label=label)
        return self._rows(kind, label)

    def remove_object(self, kind: str, name: str) -> None:
        self._call("remove_object", kind, name)
        if name in self.in_use:
            raise OperationFailed(f"{name} is in use")
        if kind == "container":
            self.containers.pop(name, None)
        else:
            self.objects[kind].pop(name, None)

    def buildkit_build(self, argv: list[str], env: Mapping[str, str]
                       ) -> subprocess.Popen[str]:
        """Keeps the build, writes its --iidfile and names the image by its -t tags."""
        self._call("buildkit_build", argv)
        values = {flag: [argv[i + 1] for i, a in enumerate(argv) if a == flag]
                  for flag in ("--secret", "-t", "--label", "--iidfile")}
        secrets = {}
        for spec in values["--secret"]:
            kv = dict(part.split("=", 1) for part in spec.split(","))
            secrets[kv["id"]] = Path(kv["src"]).read_text()  # exists during the build only
        self.builds.append(Build(list(argv), dict(env), secrets))
        image_id = self.build_id or "sha256:" + hashlib.sha256(" ".join(argv).encode()
                                                               ).hexdigest()
        labels = dict(v.split("=", 1) for v in values["--label"])
        self.add_image(image_doc(image_id, labels), *values["-t"])
        for iid in values["--iidfile"]:
            Path(iid).write_text(image_id)
        return subprocess.Popen(["printf", "%s", self.build_output], stdout=subprocess.PIPE,
                                text=True)

    def has_buildx(self) -> bool:
        self._call("has_buildx")
        return self.buildx

    def build_cache(self) -> list[dict[str, Any]]:
        self._call("build_cache")
        return [dict(r) for r in self.build_records]

    def prune_build_cache(self, record_id: str) -> int:
        self._call("prune_build_cache", record_id)
        gone = [r for r in self.build_records if r["ID"].startswith(record_id)]
        self.build_records = [r for r in self.build_records if r not in gone]
        return sum(int(r.get("Size", 0)) for r in gone)


@contextmanager
def installed(double: E) -> Iterator[E]:
    """`double` (or a real Engine on some socket) as the process-wide engine while the
    block runs."""
    old = use_engine(double)
    try:
        yield double
    finally:
        use_engine(old)


if TYPE_CHECKING:  # mypy: the double is a DockerEngine (make typecheck)
    _checked: DockerEngine = MemoryEngine()
