"""Packaging: pyproject.toml says everything but this one step. An installed imagebuild
must build the cpu target on its own, so the wheel carries what a checkout keeps beside
the package (templates, tool files, the default matrix and its lock, patches, the
tiny-model generator) as imagebuild/_bundle; imagebuild.REPO_ROOT finds it there."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLE = ("matrix.yaml", "matrix.lock.json", "Dockerfile.base", "images", "patches", "locked",
          "scripts/make_tiny_model.py",
          "docs/matrix.schema.json")  # what the default matrix's schema modeline names


class BuildWithBundle(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        dest = Path(self.build_lib) / "imagebuild" / "_bundle"
        for rel in BUNDLE:
            src, dst = root / rel, dest / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildWithBundle})
