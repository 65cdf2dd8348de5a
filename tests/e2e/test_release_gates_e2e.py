"""The release gates on the real vLLM CPU engine (the session's cpu serve image). The good
image passes every gate and condition in the whole job (test_release_flow.py, whose
records carry them); here a thin image FROM it (COPY layers, no engine rebuild) carries a
drafter path that corrupts output only where prefix caching is involved: vLLM's model
runner marks a request that started from prefix-cache hits (its own KV cache manager
decided the hit: `num_computed_tokens` of a new request), and the rejection sampler then
emits the neighbour of the first token of every speculative step of that request.

- prefix caching on (vLLM 0.23.0's default for this decoder-only model): the fresh
  requests and the long generation pass, the lossless gate fails naming the conditions
  whose requests start from cache hits (shared-prefix, repeat), with the position, both
  tokens and their logprobs;
- the same image with --no-enable-prefix-caching: every condition runs without hits and
  passes, and the gates say prefix caching is off (the corruption never triggers).

Four boots, two pairs at the same time (each: the image as it ships, then the same image
minus --speculative-config with the requests the first one was sent): 97.6 s for the
module on 2 shared cores, where the four boots at once took 221 s (each boot 160 s)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imagebuild.docker import inspect_image
from imagebuild.expectations import expectations_from_labels
from imagebuild.gates import FAIL, NOT_RUN, PASS
from imagebuild.gates.conditions import CONDITIONS, PREEMPTION, REPEAT, SHARED_PREFIX
from imagebuild.gates.prompts import FRESH
from imagebuild.gates.run import Run, judge, run_requests
from imagebuild.gates.shape import prefix_caching_source
from imagebuild.plan import load_plan
from imagebuild.serving.runspec import SPEC_FLAG, speculates
from tests.support.cpu_build import TAG

pytestmark = pytest.mark.slow

SITE = "/opt/vllm/lib/python3.11/site-packages/vllm"
RUNNER = f"{SITE}/v1/worker/gpu_model_runner.py"  # the CPU model runner's base class
SAMPLER = f"{SITE}/v1/sample/rejection_sampler.py"
# (file, anchor, code put before the anchor)
PATCHES = (
    (RUNNER, "            self.late_interaction_runner.register_request(req_id, pooling_params)\n",
     "            req_state.imagebuild_hit = new_req_data.num_computed_tokens > 0\n"),
    (RUNNER, "        sampler_output = self.rejection_sampler(\n",
     "        from vllm.v1.sample import rejection_sampler as _ib_rs\n"
     "        _ib_rs.IMAGEBUILD_HIT_ROWS = [getattr(self.requests.get(r), 'imagebuild_hit', "
     "False) for r in self.input_batch.req_ids]\n"),
    (SAMPLER, "        logprobs_tensors = None\n        if sampling_metadata.max_num_logprobs",
     "        _hits = IMAGEBUILD_HIT_ROWS[: output_token_ids.shape[0]]\n"
     "        if any(_hits):\n"
     "            _m = torch.tensor(_hits + [False] * (output_token_ids.shape[0] - len(_hits)))\n"
     "            _first = output_token_ids[:, 0]\n"
     "            output_token_ids[:, 0] = torch.where(\n"
     "                _m & (_first >= 0), (_first + 1) % target_logits.shape[-1], _first)\n"),
    (SAMPLER, "class RejectionSampler(", "IMAGEBUILD_HIT_ROWS: list = []\n\n\n"),
)
CORRUPT_REF = "imagebuild-test/cpu-tiny-ngram-corrupt-on-hits:gates"
NO_CACHE_REF = "imagebuild-test/cpu-tiny-ngram-corrupt-on-hits:no-prefix-caching"


def _corrupt_images(good: str, work: Path) -> tuple[str, str]:
    name = subprocess.run(["docker", "create", good], capture_output=True, text=True,
                          check=True).stdout.strip()
    try:
        for path in {p for p, _, _ in PATCHES}:
            subprocess.run(["docker", "cp", f"{name}:{path}", str(work / Path(path).name)],
                           check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "rm", name], capture_output=True)
    for path, anchor, code in PATCHES:
        f = work / Path(path).name
        text = f.read_text()
        assert text.count(anchor) == 1, f"vLLM's {path} changed: update the test's anchors"
        f.write_text(text.replace(anchor, code + anchor))
    (work / "Dockerfile").write_text(f"FROM {good}\n" + "".join(
        f"COPY {Path(p).name} {p}\n" for p in {p for p, _, _ in PATCHES}))
    subprocess.run(["docker", "build", "-q", "-t", CORRUPT_REF, str(work)], check=True,
                   capture_output=True)
    cmd = inspect_image(good)["Config"]["Cmd"] + ["--no-enable-prefix-caching"]
    (work / "Dockerfile").write_text(f"FROM {CORRUPT_REF}\nCMD {json.dumps(cmd)}\n")
    subprocess.run(["docker", "build", "-q", "-t", NO_CACHE_REF, str(work)], check=True,
                   capture_output=True)
    return CORRUPT_REF, NO_CACHE_REF


@pytest.fixture(scope="module")
def judged(cpu_serve_image, tmp_path_factory):
    good = cpu_serve_image.ref
    images = _corrupt_images(good, tmp_path_factory.mktemp("corrupt"))
    (job,) = load_plan(None, TAG, "cpu", "cpu/cpu-tiny-ngram").jobs
    settings = job.cell.target.gates
    expect = expectations_from_labels(good, info=inspect_image(good))

    def pair(image: str) -> tuple[Run, Run, dict]:
        info = inspect_image(image)
        assert speculates(info)
        spec = run_requests(image, info, expect, settings, what="speculative")
        plain = run_requests(image, info, expect, settings, what="plain", plan=spec.plan,
                             drop_flags=(SPEC_FLAG,))
        return spec, plain, info

    with ThreadPoolExecutor(2) as pool:  # a boot is ~30 s of mostly one core; two cores
        done = list(pool.map(pair, images))
    out = {}
    for image, (spec, plain, info) in zip(("on", "off"), done, strict=True):
        said = prefix_caching_source(info["Config"]["Cmd"], "0.23.0")
        out[image] = (spec, plain, *judge(spec, plain, settings, prefix_said=said))
    yield out
    subprocess.run(["docker", "rmi", NO_CACHE_REF, CORRUPT_REF], capture_output=True)


def _conditions(loss) -> dict[str, dict]:
    return loss.detail["conditions"]


def test_corruption_under_prefix_cache_hits_fails_the_gate_naming_the_condition(judged):
    spec, plain, loss, lg = judged["on"]
    assert spec.untrusted is None and plain.untrusted is None, (spec.untrusted, plain.untrusted)
    conds = _conditions(loss)
    print("\nprefix caching on:\n" + "\n".join(f"  {n}: {c['status']}: {c['reason'][:300]}"
                                               for n, c in conds.items()))
    assert loss.status == FAIL and lg.status == PASS, (loss.reason, lg.reason)
    # only what starts from cache hits is corrupted: the fresh requests pass
    assert conds[FRESH]["status"] == PASS and conds["concurrent"]["status"] == PASS
    for cond in (SHARED_PREFIX, REPEAT):
        assert conds[cond]["status"] == FAIL, conds[cond]
        assert "speculative decoding emitted" in conds[cond]["reason"]
    assert loss.reason.startswith(f"{SHARED_PREFIX}: "), loss.reason
    bad = next(c for c in conds[REPEAT]["comparisons"] if c["result"] == "mismatch")
    d = bad["divergence"]
    # the first token of the first speculative step, moved to its neighbour
    assert d["speculative"]["token"] == d["plain"]["token"] + 1, d
    assert f"{bad['name']} token {d['position']}:" in conds[REPEAT]["reason"]
    # the evidence that the condition happened was read from vLLM's own counters
    assert spec.evidence[REPEAT].prefix_hits > 0 and spec.evidence[SHARED_PREFIX].prefix_hits > 0
    assert spec.evidence[PREEMPTION].preemptions > 0


def test_without_prefix_caching_every_condition_runs_and_passes(judged):
    spec, plain, loss, lg = judged["off"]
    conds = _conditions(loss)
    print("\nprefix caching off:\n" + "\n".join(f"  {n}: {c['status']}: {c['reason'][:300]}"
                                                for n, c in conds.items()))
    assert (loss.status, lg.status) == (PASS, PASS), (loss.reason, lg.reason)
    assert set(conds) == set(CONDITIONS) and all(c["status"] == PASS for c in conds.values())
    assert not [c for c in conds.values() if c["status"] == NOT_RUN]
    assert spec.plan is not None and spec.plan.shape is not None
    assert not spec.plan.shape.prefix_caching
    assert all(e.prefix_hits == 0 for e in spec.evidence.values())
    for cond in (SHARED_PREFIX, REPEAT):
        assert "prefix caching off (the profile: --no-enable-prefix-caching)" in \
            conds[cond]["reason"]
    assert "vLLM preempted" in conds[PREEMPTION]["reason"]
