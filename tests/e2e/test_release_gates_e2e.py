"""The release gates on the real vLLM CPU engine (the session's cpu serve image): ngram
speculation at temperature 0 reproduces plain decoding token for token, so the gates
pass (proved by the whole job in test_release_flow.py, whose records carry both gates as
pass); a thin image FROM the same serve image whose rejection sampler perturbs the
verified token (one COPY layer, no engine rebuild) fails both gates, with the position,
both tokens and their logprobs in the reason.

Two boots, at the same time: the plain reference (the image minus --speculative-config;
the perturbed sampler is only on the speculative path) and the lossy image as it ships.
The good image as it ships is the whole job's own run, not booted again here (CI time)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imagebuild.docker import inspect_image
from imagebuild.expectations import expectations_from_labels
from imagebuild.gates import FAIL
from imagebuild.gates.prompts import gate_requests
from imagebuild.gates.run import Run, judge, run_requests
from imagebuild.plan import load_plan
from imagebuild.serving.runspec import SPEC_FLAG, speculates
from tests.support.cpu_build import TAG

pytestmark = pytest.mark.slow

SAMPLER = "/opt/vllm/lib/python3.11/site-packages/vllm/v1/sample/rejection_sampler.py"
ANCHOR = "        logprobs_tensors = None\n        if sampling_metadata.max_num_logprobs"
# the first token of every speculative step (a verified draft, or the recovered or bonus
# token) is replaced by its neighbour in the vocabulary: what a broken sampler would emit
PERTURB = ("        _first = output_token_ids[:, 0]\n"
           "        output_token_ids[:, 0] = torch.where(\n"
           "            _first >= 0, (_first + 1) % target_logits.shape[-1], _first)\n")
LOSSY_REF = "imagebuild-test/cpu-tiny-ngram-lossy:gates"


def _lossy_image(good: str, work: Path) -> str:
    name = subprocess.run(["docker", "create", good], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        subprocess.run(["docker", "cp", f"{name}:{SAMPLER}", str(work / "rs.py")], check=True,
                       capture_output=True)
    finally:
        subprocess.run(["docker", "rm", name], capture_output=True)
    text = (work / "rs.py").read_text()
    assert text.count(ANCHOR) == 1, "vLLM's rejection sampler changed: update ANCHOR"
    (work / "rejection_sampler.py").write_text(text.replace(ANCHOR, PERTURB + ANCHOR))
    (work / "Dockerfile").write_text(f"FROM {good}\nCOPY rejection_sampler.py {SAMPLER}\n")
    subprocess.run(["docker", "build", "-q", "-t", LOSSY_REF, str(work)], check=True,
                   capture_output=True)
    return LOSSY_REF


@pytest.fixture(scope="module")
def runs(cpu_serve_image, tmp_path_factory):
    good = cpu_serve_image.ref
    lossy = _lossy_image(good, tmp_path_factory.mktemp("lossy"))
    (job,) = load_plan(None, TAG, "cpu", "cpu/cpu-tiny-ngram").jobs
    settings = job.cell.target.gates
    reqs = gate_requests(settings)
    seed = settings.lossless.seed
    info = inspect_image(good)
    assert speculates(info)
    expect = expectations_from_labels(good, info=info)
    # the two servers boot and answer at the same time (their own containers and ports;
    # greedy decoding gives the same tokens either way): a boot is ~30 s of mostly one
    # core, and this machine has two
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(run_requests, good, info, expect, reqs, seed=seed, what="plain",
                            drop_flags=(SPEC_FLAG,))
        spec = pool.submit(run_requests, lossy, inspect_image(lossy), expect, reqs,
                           seed=seed, what="speculative")
        out: dict[str, Run] = {"plain": plain.result(), "lossy": spec.result()}
    yield settings, out
    subprocess.run(["docker", "rmi", LOSSY_REF], capture_output=True)


def test_a_sampler_that_perturbs_the_verified_token_fails_both_gates(runs):
    settings, r = runs
    assert r["plain"].untrusted is None, r["plain"].untrusted
    loss, lg = judge(r["lossy"], r["plain"], settings)
    print(f"\nlossy image: lossless {loss.status}: {loss.reason}\n  long generation "
          f"{lg.status}: {lg.reason}")
    assert loss.status == FAIL and lg.status == FAIL, (loss.reason, lg.reason)
    assert "not a tie" in loss.reason and "speculative decoding emitted" in loss.reason
    bad = next(c for c in loss.detail["comparisons"] if c["result"] == "mismatch")
    d = bad["divergence"]
    assert d["speculative"]["token"] != d["plain"]["token"]
    assert d["plain"]["logprobs"]["plain_token"] is not None
    assert f"{bad['name']} token {d['position']}:" in loss.reason
