"""Package indexes come from pip's own configuration, never from a host in this repo."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from imagebuild import pipconfig
from imagebuild.pipconfig import PipIndexes, indexes_from, parse_config_list


def test_config_list_is_parsed_and_scopes_ranked_like_pip() -> None:
    text = ("global.index-url='https://mirror.example/simple'\n"
            "install.index-url='https://install.example/simple'\n"
            "global.extra-index-url='https://a.example/simple https://b.example/simple'\n"
            "global.cert='/etc/ssl/x.pem'\n")
    config = parse_config_list(text)
    assert config["global.cert"] == "/etc/ssl/x.pem"
    got = indexes_from(config, "https://default.example/simple")
    assert got.index_url == "https://install.example/simple"  # a command section wins
    assert got.extra_index_urls == ("https://a.example/simple", "https://b.example/simple")
    env = indexes_from({**config, ":env:.index-url": "http://127.0.0.1:1/simple"}, "x")
    assert (env.index_url, env.source) == ("http://127.0.0.1:1/simple", "PIP_INDEX_URL")
    assert indexes_from({}, "https://default.example/simple") == PipIndexes(
        "https://default.example/simple")
    conf = got.pip_conf()
    assert "cert" not in conf and conf.startswith("[global]\nindex-url = https://install")


def test_real_pip_answers_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/extra")
    got = pipconfig.pip_indexes.__wrapped__()
    assert got.index_url == "http://127.0.0.1:9/simple" and got.source == "PIP_INDEX_URL"
    assert got.extra_index_urls == ("http://127.0.0.1:9/extra",)
    # the built-in default comes from pip with all configuration ignored
    default = pipconfig.builtin_index()
    assert default != "http://127.0.0.1:9/simple" and default.endswith("/simple")


def _file_index(root: Path, version: str) -> str:
    """A PEP 503 index on disk (what `file://` extra indexes point at) holding one sdist."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        body = f"VERSION = '{version}'\n".encode()
        info = tarfile.TarInfo(f"vllm-{version}/vllm/__init__.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    files = root / "files"
    files.mkdir(parents=True)
    (files / f"vllm-{version}.tar.gz").write_bytes(data.getvalue())
    sha = hashlib.sha256(data.getvalue()).hexdigest()
    (root / "simple" / "vllm").mkdir(parents=True)
    (root / "simple" / "vllm" / "index.html").write_text(
        f'<html><body><a href="../../files/vllm-{version}.tar.gz#sha256={sha}">'
        f"vllm-{version}.tar.gz</a></body></html>\n")
    return (root / "simple").as_uri()


def test_sdist_comes_from_the_index_pip_is_configured_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from imagebuild.vllmsource.sdist import sdist_tree

    index = _file_index(tmp_path / "mirror", "9.9.7")
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    pipconfig.pip_indexes.cache_clear()
    try:
        root = sdist_tree("9.9.7", tmp_path / "cache")
    finally:
        pipconfig.pip_indexes.cache_clear()
    assert (root / "vllm" / "__init__.py").read_text() == "VERSION = '9.9.7'\n"
