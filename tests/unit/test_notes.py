"""Release notes: pull by tag and digest, hardened run, pins, smoke summary, rollback."""

from __future__ import annotations

import time

from imagebuild import REPO_ROOT
from imagebuild.plan import load_plan
from imagebuild.registry.records import list_releases
from imagebuild.release.notes import ImageFacts, previous_release, release_notes
from imagebuild.spec.tags import parse_release_tag
from tests.support.memregistry import MemRegistry

DIGEST = "sha256:" + "ab" * 32
VERDICT = {"passed": True, "message": "all 9 checks passed",
           "checks": {"health": {"outcome": "passed", "measured": {}},
                      "spec_decode": {"outcome": "passed",
                                      "measured": {"acceptance": 0.81}}}}


def _plan(matrix_dir, target: str):
    return load_plan(matrix_dir / "matrix.yaml", "2026-06-18-dflashfix", target)


def test_notes_per_image(matrix_dir):
    plan = _plan(matrix_dir, "gb10")
    jobs = plan.jobs
    first = jobs[0]
    facts = {first.id: ImageFacts(DIGEST, "2026-06-11-v0.23.0-pr41703", VERDICT,
                                  latest="2026-06-18-v0.23.0-dflashfix")}
    text = release_notes(plan.lm, jobs, facts)
    repo = first.image.name
    assert f"docker pull {repo}:2026-06-18-v0.23.0-dflashfix" in text
    assert f"docker pull {repo}@{DIGEST}" in text
    # hardened run of the tested digest: GB10 flags, read-only, no env/credentials
    block = text.split("Run it hardened")[1].split("```")[1]
    assert f"{repo}@{DIGEST}" in block and "--read-only" in block
    assert "--gpus all --ipc host" in block and "--cap-drop ALL" in block
    assert " -e " not in block and "--env" not in block and "TOKEN" not in block
    # the compose file is the cell's rendered one, pinned to the tested digest
    compose = text.split("compose file (`docker compose up -d`")[1].split("```yaml\n")[1]
    compose = compose.split("```")[0]
    committed = (REPO_ROOT / "rendered" / first.cell.target_name / first.cell.engine_name /
                 f"{first.cell.image}.compose.yaml").read_text()
    assert compose.strip() == committed.replace(f"{repo}:latest", f"{repo}@{DIGEST}").strip()
    # pins: the full commits, never abbreviated
    zlab = next(j for j in jobs if j.cell.drafter_name == "zlab")
    assert f"`{zlab.pins['drafter']['revision']}`" in text
    assert "91df0fad4dc98a67c7659d9dbd915245d5c43d96" in text
    assert "**PASSED** · all 9 checks passed" in text and "acceptance 0.81" in text
    assert "python build.py rollback --tag 2026-06-11-v0.23.0-pr41703" in text
    # a cell the registry has no digest for says so instead of inventing one
    other = jobs[1].cell.image
    section = text.split(f"## {other}")[1].split("## ")[0]
    assert "not pushed" in section and "no smoke report" in section


def test_cpu_notes_use_shm_not_gpus(matrix_dir):
    plan = _plan(matrix_dir, "cpu")
    text = release_notes(plan.lm, plan.jobs, {j.id: ImageFacts(DIGEST, None, VERDICT,
                                                              latest=str(j.tag))
                                              for j in plan.jobs})
    assert "--shm-size" in text and "--gpus" not in text
    assert "nothing to roll back to" in text


def test_previous_release_is_the_newest_older_passing_one():
    reg, now = MemRegistry(), time.time()
    for i, (tag, smoke) in enumerate((
            ("2026-05-01-v0.22.0-base", "passed"), ("2026-06-11-v0.23.0-pr41703", "passed"),
            ("2026-06-12-v0.23.0-broken", "failed"), ("2026-06-18-v0.23.0-dflashfix", "passed"),
            ("2026-07-01-v0.23.0-later", "passed"))):
        reg.add_release("ns/img", tag, smoke=smoke, created=now - 3600 * (10 - i))
    rels = list_releases(reg.client(), "ns/img")
    tag = parse_release_tag("2026-06-18-v0.23.0-dflashfix")
    assert previous_release(rels, tag) == "2026-06-11-v0.23.0-pr41703"
    assert previous_release(rels, parse_release_tag("2026-05-01-v0.22.0-base")) is None
    # not recorded yet: it comes after every recorded release
    assert previous_release(rels, parse_release_tag("2026-07-02-v0.23.0-next")) == \
        "2026-07-01-v0.23.0-later"


def test_previous_release_orders_same_day_releases_as_promote_does():
    """Two releases of one day order by when they were recorded, not by name (the order
    promote, rollback and prune use): the notes of `alpha`, recorded after `zeta`, name
    `zeta` as the rollback target."""
    reg, now = MemRegistry(), time.time()
    zeta, alpha = "2026-06-05-v0.23.0-zeta", "2026-06-05-v0.23.0-alpha"
    reg.add_release("ns/img", zeta, created=now - 60)
    reg.add_release("ns/img", alpha, created=now)
    rels = list_releases(reg.client(), "ns/img")
    assert previous_release(rels, parse_release_tag(alpha)) == zeta
    assert previous_release(rels, parse_release_tag(zeta)) is None


def _bench_doc(tag: str, tok_s: dict[int, float]) -> dict:
    return {"schema": "imagebuild.bench/v1", "started": "2026-06-18T10-00-00Z",
            "image": {"tag": tag, "id": "sha256:" + "cd" * 32},
            "hardware": {"model": "NVIDIA GB10", "machine": "aarch64"},
            "settings": {"prompts": "structured,prose", "max_tokens": 128},
            "levels": [{"concurrency": c, "requests": 32, "errors": 0, "output_tok_s": v,
                        "request_rate": v / 128, "ttft_ms": {"median": 80.0, "p90": 95.0},
                        "tpot_ms": {"median": 9.0}, "itl_ms": {"median": 9.0},
                        "e2e_ms": {"median": 1200.0},
                        "spec_decode": {"acceptance": 0.61, "mean_accepted_length": 3.4},
                        "client_cpu_ms_per_request": 4.2} for c, v in tok_s.items()]}


def test_notes_carry_the_bench_table_deltas_reason_and_plot(matrix_dir, tmp_path):
    from imagebuild.release.notes import write_plots

    plan = _plan(matrix_dir, "gb10")
    jobs = plan.jobs
    first, tag = jobs[0], str(jobs[0].tag)
    prev = "2026-06-11-v0.23.0-pr41703"
    facts = {first.id: ImageFacts(
        DIGEST, prev, VERDICT, bench=_bench_doc(tag, {1: 120.0, 64: 760.0}),
        bench_previous=_bench_doc(prev, {1: 125.0, 64: 840.0}),
        accepted_regression="DFlash acceptance fix costs 10% at c=64")}
    facts = write_plots(facts, jobs, tmp_path, "https://example.invalid/dl/")
    png = tmp_path / f"bench-{first.cell.image}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = release_notes(plan.lm, jobs, facts)
    section = text.split(f"## {first.cell.image}")[1].split("\n## ")[0]
    bench = section.split("Benchmark:")[1]
    assert "| 64 | 32 | 0 | 760.0 | -9.5% |" in bench  # tok/s and its delta vs previous
    assert f"against `{prev}`" in bench
    assert "**Accepted throughput regression:** DFlash acceptance fix costs 10% at c=64" in bench
    assert f"](https://example.invalid/dl/bench-{first.cell.image}.png)" in bench
    # an image without stored results says so instead of an empty table
    other = text.split(f"## {jobs[1].cell.image}")[1].split("\n## ")[0]
    assert "no benchmark results are stored" in other


def test_not_promoted_notes_name_each_failed_cell_and_say_latest_stayed(matrix_dir):
    """A release run whose cell failed: its summary names the cell and how it failed, that
    nothing was promoted and where latest stays, and tells a passed cell from one whose
    job never reached smoke."""
    from imagebuild.release.notes import not_promoted_notes

    jobs = _plan(matrix_dir, "gb10").jobs[:3]
    boot = {"passed": False, "outcome": "boot timeout",
            "message": "not healthy after 10s (boot timeout) | last phase: starting"}
    text = not_promoted_notes(jobs, {jobs[0].id: boot, jobs[1].id: VERDICT},
                              {jobs[0].id: "2026-06-11-v0.23.0-pr41703"})
    assert text.startswith("# 2026-06-18-dflashfix: not released\n")
    assert "**Nothing was promoted**" in text and "3 of 3" not in text
    assert "2 of 3 cell(s) failed" in text and "No GitHub release was made" in text
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines()
            if line.startswith("| `")}
    failed = rows[jobs[0].id]
    assert "FAILED: boot timeout" in failed and "not healthy after 10s" in failed
    assert "\\| last phase" in failed  # a | in a message never breaks the table
    assert failed.rstrip().endswith("| 2026-06-11-v0.23.0-pr41703 |")
    assert "| passed |" in rows[jobs[1].id] and "after smoke" in rows[jobs[1].id]
    assert "no report" in rows[jobs[2].id] and "_no latest yet_" in rows[jobs[2].id]


def test_a_multi_node_cell_gets_one_run_command_per_node_workers_first(tmp_path):
    """examples/two-spark-tp2: TP=2 over two Sparks; each node's hardened `docker run`
    with the interconnect settings, MASTER_ADDR from the shell and the node's own flags."""
    from imagebuild.release.notes import write_compose_files

    plan = load_plan(REPO_ROOT / "examples/two-spark-tp2/matrix.yaml", "2026-06-18-spark",
                     "gb10")
    job = plan.jobs[0]
    text = release_notes(plan.lm, plan.jobs, {job.id: ImageFacts(DIGEST, None, VERDICT)})
    section = text.split("Run it on 2 nodes")[1].split("<details>")[0]
    worker, head = section.split("```sh")[1:3]
    assert section.index("worker1 (node-rank 1, headless):") < section.index(
        "Last, the head (node-rank 0, the API server):")
    pinned = f"{job.image.name}@{DIGEST}"
    for block, rank in ((worker, "1"), (head, "0")):
        assert f"\n  {pinned} \\\n  vllm serve /model " in block
        assert "-e NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in block
        assert "-e GLOO_SOCKET_IFNAME=enp1s0f1np1" in block and "-e MASTER_ADDR \\" in block
        assert f"--nnodes 2 --node-rank {rank} --master-addr ${{MASTER_ADDR}} " in block
        assert "--tensor-parallel-size 2" in block and "--gpus all --ipc host" in block
    assert "--headless" in worker and "--headless" not in head
    assert head.rstrip().rstrip("`").rstrip().endswith("--host 127.0.0.1 --port 8000")
    # no single-node `docker run` of the image's CMD: it cannot serve a TP=2 cell alone
    assert text.count("docker run --detach") == 2
    written = write_compose_files(plan.lm, {job.id: ImageFacts(DIGEST, None, VERDICT)},
                                  plan.jobs, tmp_path)
    assert sorted(p.name for p in written) == sorted(
        f"{job.cell.image}{s}.compose.yaml" for s in ("", ".head", ".worker1"))
    assert pinned in (tmp_path / f"{job.cell.image}.worker1.compose.yaml").read_text()
