"""The matrix's registry in memory for tests of whole commands (`cli.main`): every
RegistryClient a command makes talks to one MemRegistry, seeded with releases of the
repository matrix's cpu images as `publish` and `bench --store` record them."""

from __future__ import annotations

import hashlib
import json

from imagebuild import plan
from imagebuild.registry import client as registry_client
from tests.support.memregistry import MemRegistry


def bench_doc(tag: str, image_id: str) -> dict:
    """Bench results as `bench --store` keeps them (bench/store.py's document)."""
    return {"schema": "imagebuild.bench/v1", "started": "2026-07-01T10-00-00Z",
            "image": {"tag": tag, "id": image_id},
            "hardware": {"model": "cpu", "machine": "x86_64"},
            "settings": {"prompts": "structured,prose", "max_tokens": 16},
            "levels": [{"concurrency": 1, "requests": 8, "errors": 0, "output_tok_s": 40.0,
                        "request_rate": 2.5, "ttft_ms": {"median": 80.0, "p90": 95.0},
                        "tpot_ms": {"median": 9.0}, "itl_ms": {"median": 9.0},
                        "e2e_ms": {"median": 400.0}, "client_cpu_ms_per_request": 4.2}]}


def cli_registry(monkeypatch, tmp_path, tags: tuple[str, ...] = ()) -> MemRegistry:
    """Each of `tags` a benched release of every cpu image (the last one latest); the
    build folder in tmp_path, the cpu target chosen."""
    from imagebuild.bench import store
    from imagebuild.spec import matrix as mx

    monkeypatch.setenv("IMAGEBUILD_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("IMAGEBUILD_LEASE_SETTLE", "0")
    monkeypatch.setenv("IMAGEBUILD_TARGET", "cpu")
    monkeypatch.setattr("imagebuild.buildfolder.default", lambda root: tmp_path / "build")
    reg = MemRegistry()
    lm = mx.load(None)
    for image in sorted({c.image for c in mx.expand(lm) if c.target_name == "cpu"}):
        repo = f"{lm.matrix.publish.namespace}/{image}"
        for tag in tags:
            config = json.dumps({"tag": tag}).encode()
            reg.add_release(repo, tag, config=config)
            image_id = "sha256:" + hashlib.sha256(config).hexdigest()
            store.put_results(reg.client(), repo, tag, bench_doc(tag, image_id))
        if tags:
            reg.point_latest(repo, tags[-1])

    def client(*_a, **_kw):
        return reg.client()

    monkeypatch.setattr(registry_client, "RegistryClient", client)
    monkeypatch.setattr(plan, "RegistryClient", client)
    return reg
