"""The release gates' judgement without a server (imagebuild/gates): token comparison and
tie classification, the order of verdicts (untrusted never passes), collapse, restart
detection, the summary's exact shape, thresholds in matrix.yaml, publish's refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from imagebuild.errors import OperationFailed
from imagebuild.gates import FAIL, NOT_APPLICABLE, PASS, UNTRUSTED
from imagebuild.gates.client import Generation, parse_choice
from imagebuild.gates.collapse import collapse_reason, entropy, tail_loop
from imagebuild.gates.compare import MATCH, MISMATCH, TIE, compare
from imagebuild.gates.conditions import CONDITIONS
from imagebuild.gates.identity import Identity, changed
from imagebuild.gates.run import Run, judge
from imagebuild.gates.summary import failures, load_summary, passed, summary
from imagebuild.gates.verdict import long_generation, lossless
from imagebuild.registry.records import A_GATES, release_record
from imagebuild.release.publish import gates_gate
from imagebuild.serving.runspec import speculates
from imagebuild.spec.gates import GateSettings, LongGenerationGate, LosslessGate
from imagebuild.spec.tags import parse_release_tag
from tests.support.gateruns import gen, runs, varied

EPS = 0.05


# ------------------------------------------------------------------ comparison


def test_identical_runs_match_over_every_token():
    c = compare(gen("a", [1, 2, 3]), gen("a", [1, 2, 3]), EPS)
    assert (c.kind, c.compared, c.divergence) == (MATCH, 3, None)


def test_a_flip_between_near_equal_tokens_is_a_tie():
    spec = gen("a", [1, 2, 7, 9], alt={3: -0.51}, at=2)  # spec chose 7 (-0.5), 3 at -0.51
    ref = gen("a", [1, 2, 3, 4], alt={7: -0.52}, at=2)   # plain chose 3 (-0.5), 7 at -0.52
    c = compare(spec, ref, EPS)
    assert c.kind == TIE and c.compared == 3
    d = c.divergence.as_json()
    assert d["position"] == 2 and d["speculative"]["token"] == 7 and d["plain"]["token"] == 3
    assert d["plain"]["logprobs"] == {"speculative_token": -0.52, "plain_token": -0.5}
    assert "numerical tie" in d["reason"] and "token 2" in d["reason"]


def test_a_token_far_below_the_plain_choice_is_a_mismatch():
    spec = gen("a", [1, 8], alt={5: -0.2}, at=1)
    ref = gen("a", [1, 5], lp=-0.2, alt={8: -4.0}, at=1)
    c = compare(spec, ref, EPS)
    assert c.kind == MISMATCH
    assert "changed the output" in c.divergence.reason and "3.8" in c.divergence.reason


def test_a_token_missing_from_the_other_runs_top_k_is_a_mismatch():
    c = compare(gen("a", [1, 8]), gen("a", [1, 5]), EPS)  # neither knows the other's token
    assert c.kind == MISMATCH and "top-" in c.divergence.reason


def test_the_tie_needs_both_runs_within_epsilon():
    spec = gen("a", [8], lp=-0.5, alt={5: -0.9}, at=0)  # 0.4 apart in the speculative run
    ref = gen("a", [5], lp=-0.5, alt={8: -0.51}, at=0)
    assert compare(spec, ref, EPS).kind == MISMATCH


def test_parse_choice_reads_vllms_token_id_logprobs():
    choice = {"finish_reason": "length", "logprobs": {
        "tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.1, -1.5],
        "top_logprobs": [{"token_id:5": -0.1, "token_id:6": -2.0},
                         {"token_id:9": -1.5, "token_id:3": -1.6}]}}
    g = parse_choice(Generation("x", 2), choice)
    assert g.tokens == [5, 9] and g.logprob_of(1, 3) == -1.6 and not g.truncated
    with pytest.raises(ValueError):
        parse_choice(Generation("x", 2), {"logprobs": {"tokens": ["hello"],
                                                       "token_logprobs": [0.0],
                                                       "top_logprobs": [{}]}})


# ------------------------------------------------------------------ the lossless verdict

S = LosslessGate(tie_logprob_epsilon=EPS, max_tie_rate=0.25, max_tokens=8,
                 min_compared_tokens=10)


def test_lossless_passes_when_every_token_is_equal():
    runs = [gen(f"r{i}", varied(8, i)) for i in range(4)]
    r = lossless(runs, [gen(g.name, g.tokens) for g in runs], S, untrusted=None)
    assert r.status == PASS and r.detail["compared_tokens"] == 32 and r.detail["ties"] == 0


def test_a_perturbed_token_fails_the_cell_with_position_tokens_and_logprobs():
    ref = [gen(f"r{i}", varied(8, i)) for i in range(4)]
    bad = varied(8, 0)
    bad[5] = (bad[5] + 1) % 2000
    spec = [gen("r0", bad)] + [gen(g.name, g.tokens) for g in ref[1:]]
    r = lossless(spec, ref, S, untrusted=None)
    assert r.status == FAIL and "r0 token 5" in r.reason and str(bad[5]) in r.reason


def test_ties_are_allowed_up_to_the_stated_rate():
    ref = [gen(f"r{i}", varied(8, i), alt={999: -0.52}, at=7) for i in range(4)]
    spec = [gen(g.name, g.tokens[:7] + [999], alt={g.tokens[7]: -0.51}, at=7) for g in ref]
    one = [spec[0]] + [gen(g.name, g.tokens) for g in ref[1:]]
    assert lossless(one, ref, S, untrusted=None).status == PASS  # 1 of 4 = 0.25
    two = spec[:2] + [gen(g.name, g.tokens) for g in ref[2:]]
    r = lossless(two, ref, S, untrusted=None)
    assert r.status == FAIL and "rate 0.50 > max_tie_rate 0.25" in r.reason


def test_a_restarted_server_is_untrusted_even_with_equal_tokens():
    runs = [gen(f"r{i}", varied(8, i)) for i in range(4)]
    r = lossless(runs, runs, S, untrusted="the speculative run: the container restarted")
    assert r.status == UNTRUSTED and "restarted" in r.reason


def test_a_truncated_answer_is_untrusted_not_passed():
    runs = [gen(f"r{i}", varied(8, i)) for i in range(4)]
    short = [gen("r0", varied(5, 0), n=8)] + runs[1:]
    r = lossless(short, runs, S, untrusted=None)
    assert r.status == UNTRUSTED and "5 of 8 tokens" in r.reason


def test_too_few_compared_tokens_is_untrusted():
    runs = [gen("r0", varied(8, 0))]
    r = lossless(runs, runs, S, untrusted=None)  # 8 < min_compared_tokens 10
    assert r.status == UNTRUSTED and "only 8 tokens compared" in r.reason


def test_an_error_fails_and_a_mismatch_beats_untrusted_truncation():
    runs = [gen(f"r{i}", varied(8, i)) for i in range(4)]
    err = [gen("r0", [], n=8, error="HTTP 500: boom")] + runs[1:]
    assert lossless(err, runs, S, untrusted=None).status == FAIL
    bad = varied(8, 1)
    bad[0] += 1
    mixed = [gen("r0", varied(5, 0), n=8), gen("r1", bad)] + runs[2:]
    assert lossless(mixed, runs, S, untrusted=None).status == FAIL


# ------------------------------------------------------------------ collapse


def test_tail_loop_finds_the_period_and_where_it_starts():
    toks = varied(100) + [7, 8, 9] * 20
    loop = tail_loop(toks)
    assert loop is not None and loop.period == 3 and loop.start == 100
    assert tail_loop(varied(200)) is None


def test_a_loop_the_plain_run_does_not_have_is_collapse():
    ref = varied(400)
    run = ref[:200] + [4, 5] * 100
    why = collapse_reason(run, ref, 0.5)
    assert why and "loop of period 2 from token 200" in why and "does not loop" in why
    # the same loop in both runs (a weak model looping on its own) is not collapse
    assert collapse_reason(run, list(run), 0.5) is None


def test_a_tail_far_poorer_in_tokens_than_the_plain_runs_is_collapse():
    ref = varied(400)
    run = ref[:200] + [t % 125 % 4 for t in varied(200, 7)]  # 4 distinct tokens, no cycle
    assert tail_loop(run) is None
    why = collapse_reason(run, ref, 0.5)
    assert why and "entropy" in why
    assert entropy([1, 1, 1, 1]) == 0.0 and entropy([1, 2]) == 1.0


def test_long_generation_against_the_plain_run():
    s = LongGenerationGate(tokens=400, min_entropy_ratio=0.5)
    ref = gen("long", varied(400))
    ok = long_generation(gen("long", list(ref.tokens)), ref, s, epsilon=EPS, untrusted=None)
    assert ok.status == PASS and "identical to plain decoding for all 400 tokens" in ok.reason
    collapsed = gen("long", ref.tokens[:200] + [4, 5] * 100, alt={ref.tokens[200]: -0.51},
                    at=200)
    ref2 = gen("long", ref.tokens, alt={4: -0.52}, at=200)
    r = long_generation(collapsed, ref2, s, epsilon=EPS, untrusted=None)  # a tie, then a loop
    assert r.status == FAIL and "collapse after 400 tokens" in r.reason
    short = long_generation(gen("long", varied(300), n=400), ref, s, epsilon=EPS,
                            untrusted=None)
    assert short.status == UNTRUSTED


def test_long_generation_without_a_drafter_checks_its_second_half_against_its_first():
    s = LongGenerationGate(tokens=400, min_entropy_ratio=0.5)
    toks = varied(400)
    assert long_generation(gen("long", toks), None, s, epsilon=EPS, untrusted=None
                           ).status == PASS
    broken = toks[:300] + [3] * 100
    r = long_generation(gen("long", broken), None, s, epsilon=EPS, untrusted=None)
    assert r.status == FAIL and "second half" in r.reason


def test_judge_a_cell_without_a_drafter_is_not_applicable_for_lossless():
    st = GateSettings(lossless=LosslessGate(max_tokens=8),
                      long_generation=LongGenerationGate(tokens=64))
    plain = Run("plain", gens=[gen("long", varied(64))])
    loss, lg = judge(None, plain, st)
    assert loss.status == NOT_APPLICABLE and lg.status == PASS
    gone = Run("plain", untrusted="the plain server did not serve: boom")
    assert judge(None, gone, st)[1].status == UNTRUSTED


def test_speculates_reads_the_images_own_serve_command():
    assert speculates({"Config": {"Cmd": ["vllm", "serve", "--speculative-config", "{}"]}})
    assert speculates({"Config": {"Cmd": ["--speculative-config={}"]}})
    assert not speculates({"Config": {"Cmd": ["vllm", "serve", "/model"]}})


# ------------------------------------------------------------------ restarts


def test_a_restart_or_a_second_boot_line_is_seen():
    a = Identity(True, "2026-12-01T10:00:00Z", 100, 0, 1)
    assert changed(a, a) is None
    assert "restarted" in changed(a, Identity(True, "2026-12-01T10:05:00Z", 200, 0, 1))
    assert "Docker restarted" in changed(a, Identity(True, a.started_at, 100, 1, 1))
    assert "booted again" in changed(a, Identity(True, a.started_at, 100, 0, 2))
    assert "no longer running" in changed(a, Identity(False, a.started_at, 0, 0, 1))


# ------------------------------------------------------------------ summary, record, publish


def _doc(loss: str = PASS, lg: str = PASS) -> dict:
    return {"image_id": "sha256:abc",
            "lossless": {"status": loss, "reason": "r", "requests": 5, "compared_tokens": 700,
                         "ties": 1, "tie_rate": 0.2, "comparisons": []},
            "long_generation": {"status": lg, "reason": "r2", "tokens": 448, "run": {}}}


def test_the_summary_has_exactly_the_shared_shape():
    s = summary(_doc())
    assert s == {"lossless": {"status": "pass", "reason": "r", "requests": 5,
                              "compared_tokens": 700, "ties": 1, "tie_rate": 0.2,
                              "conditions": {}},
                 "long_generation": {"status": "pass", "reason": "r2", "tokens": 448}}
    assert passed(s) and passed(summary(_doc(NOT_APPLICABLE)))
    assert not passed(summary(_doc(lg=UNTRUSTED)))
    assert failures(summary(_doc(FAIL))) == ["lossless fail: r"]


def test_load_summary_refuses_a_missing_file_or_another_images(tmp_path: Path):
    with pytest.raises(OperationFailed, match="no readable release-gates result") as exc:
        load_summary(tmp_path / "gates.json")
    assert "build.py gates" in exc.value.fix
    doc = {**_doc(), "summary": summary(_doc())}
    (tmp_path / "gates.json").write_text(json.dumps(doc))
    assert load_summary(tmp_path / "gates.json", "sha256:abc")["lossless"]["ties"] == 1
    with pytest.raises(OperationFailed, match="did not test"):
        load_summary(tmp_path / "gates.json", "sha256:other")


def test_publish_refuses_a_failed_or_untrusted_gate_and_records_a_passed_one():
    for bad in (summary(_doc(FAIL)), summary(_doc(lg=UNTRUSTED))):
        with pytest.raises(OperationFailed, match="nothing pushed, no tag moved"):
            gates_gate(bad, "img:1")
    gates_gate(summary(_doc()), "img:1")
    gates_gate(None, "img:1")  # publish() called without gates (e.g. runner-clean's tests)
    rec = release_record(parse_release_tag("2026-06-18-v0.23.0-dflashfix"), "sha256:abc",
                         {"passed": True}, pins={}, cell=None, inputs=None,
                         pushed_digest="sha256:d", gates=summary(_doc()))
    assert json.loads(rec[A_GATES])["long_generation"]["tokens"] == 448
    assert A_GATES == "io.imagebuild.release.gates"


# ------------------------------------------------------------------ thresholds


def test_gate_settings_have_documented_defaults_and_refuse_nonsense():
    d = GateSettings()
    assert (d.lossless.tie_logprob_epsilon, d.lossless.max_tie_rate,
            d.long_generation.tokens) == (0.05, 0.25, 16384)
    for bad in ({"lossless": {"max_tie_rate": 2.0}}, {"lossless": {"epsilon": 0.1}},
                {"long_generation": {"tokens": "448"}}, {"long_generation": {"tokens": 4}}):
        with pytest.raises(ValidationError):
            GateSettings.model_validate(bad)


def test_matrix_yaml_sets_the_gates_of_both_targets():
    from imagebuild.plan import load_plan

    plan = load_plan(None, "2026-06-18-dflashfix", "all", None)
    gates = {j.cell.target_name: j.cell.target.gates for j in plan.jobs}
    assert gates["gb10"].long_generation.tokens == 16384
    assert gates["cpu"].long_generation.tokens < 512  # the tiny model's max-model-len


# ------------------------------------------------------------------ the whole job's wiring


@pytest.mark.parametrize("status", [FAIL, UNTRUSTED])
def test_the_whole_job_publishes_nothing_when_a_gate_does_not_pass(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys, status: str):
    """Build, smoke and the gates' servers replaced (they are the e2e tests' business):
    the job's own logic must stop before publish and say why."""
    from imagebuild import job as job_mod
    from imagebuild.builder import builder
    from imagebuild.gates import run as gates_run
    from imagebuild.plan import load_plan
    from imagebuild.smoke import runner

    plan = load_plan(None, "2026-06-18-dflashfix", "cpu", None)
    monkeypatch.setattr(builder, "build_jobs", lambda *a, **k: [])
    monkeypatch.setattr(runner, "smoke_jobs", lambda lm, jobs, **k: {
        j.id: {"passed": True, "image_ref": j.release_ref, "message": "ok"} for j in jobs})
    monkeypatch.setattr(job_mod, "buildable", lambda plan: plan)
    monkeypatch.setattr(gates_run, "gate_jobs", lambda jobs, out, **k: {
        j.id: {"summary": summary(_doc(lg=status)), "path": "x/gates.json"} for j in jobs})
    from tests.support.memregistry import MemRegistry

    pushed = []
    monkeypatch.setattr(job_mod, "publish_jobs", lambda *a, **k: pushed.append(a))
    # the registry is only read before smoke (the resume decision: no release yet)
    reg = MemRegistry()
    monkeypatch.setattr(job_mod, "registry_client", lambda plan: reg.client())
    monkeypatch.setattr("imagebuild.docker.inspect_image", lambda ref: {"Id": "sha256:" + "a" * 64})
    code = job_mod.run_release(plan, job_mod.ReleaseOptions(out=tmp_path, bench=False,
                                                            accept_unmeasured="unit test"))
    out = capsys.readouterr()
    assert code == 1 and pushed == []
    assert not [c for c in reg.calls if c[0] in ("PUT", "POST", "DELETE", "PATCH")]
    assert "did not pass the release gates: nothing pushed, no tag moved" in out.err
    assert f"gates {status.upper()}" in out.out and "long_generation" in out.out


def test_a_resumed_release_keeps_the_gates_its_record_holds(tmp_path: Path):
    from imagebuild.plan import load_plan
    from imagebuild.release.resume import write_recorded_verdict
    from tests.support.memregistry import MemRegistry

    (job,) = load_plan(None, "2026-06-18-dflashfix", "cpu", None).jobs
    reg = MemRegistry()
    recorded = summary(_doc(lg=PASS))
    reg.add_release(job.image.repository, str(job.tag), gates=recorded)
    path = write_recorded_verdict(reg.client(), job, tmp_path)
    doc = json.loads(path.with_name("gates.json").read_text())
    assert doc["summary"] == recorded and doc["source"] == "release record"


def test_smokes_record_serves_the_gates_only_for_the_same_image_and_settings(tmp_path: Path):
    from imagebuild.gates.capture import load_capture, save_capture

    st = GateSettings(lossless=LosslessGate(max_tokens=8))
    run = Run("speculative", gens=[gen("long", varied(8), alt={3: -0.7}, at=2)],
              before=Identity(True, "t", 1, 0, 1), after=Identity(True, "t", 1, 0, 1))
    path = tmp_path / "gates-speculative.json"
    save_capture(path, "sha256:abc", st, run)
    back = load_capture(path, "sha256:abc", st)
    assert back is not None and back.recorded and back.before == run.before
    g = back.gens[0]
    assert g.tokens == run.gens[0].tokens and g.logprob_of(2, 3) == -0.7
    assert load_capture(path, "sha256:other", st) is None  # another image: boot it
    assert load_capture(path, "sha256:abc", GateSettings()) is None  # other thresholds
    assert load_capture(tmp_path / "missing.json", "sha256:abc", st) is None


def test_gate_image_uses_smokes_record_and_boots_only_the_plain_server(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from imagebuild.buildfolder import CAPTURE_FILE
    from imagebuild.gates import run as gates_run
    from imagebuild.gates.capture import save_capture

    st = GateSettings(lossless=LosslessGate(max_tokens=8, min_compared_tokens=8),
                      long_generation=LongGenerationGate(tokens=64))
    spec, plain = runs(st)
    info = {"Id": "sha256:abc", "Config": {"Cmd": ["vllm", "serve", "--speculative-config",
                                                   "{}"]}}
    save_capture(tmp_path / CAPTURE_FILE, "sha256:abc", st, spec)
    booted = []

    def fake_boot(image, info, expect, settings, *, what, plan=None, drop_flags=(),
                  log=print, serve=None):
        booted.append((what, drop_flags, plan))
        return plain

    monkeypatch.setattr(gates_run, "run_requests", fake_boot)
    doc = gates_run.gate_image("img:1", info, {}, st, tmp_path, log=lambda s: None)
    # the plain server gets exactly the plan smoke's server was sent
    assert booted == [("plain", ("--speculative-config",), spec.plan)]
    assert doc["passed"] and doc["runs"][0]["source"] == "smoke's server"
    assert set(doc["summary"]["lossless"]["conditions"]) == set(CONDITIONS)
    assert json.loads((tmp_path / "gates.json").read_text())["summary"] == doc["summary"]


def test_the_smoke_check_records_what_the_runner_asked_for(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path):
    """The suite's check (its server replaced): it sends the gates' requests of the
    settings the runner passed, records them for the image smoke tested, and fails on an
    answer that is not complete."""
    from imagebuild.gates.capture import load_capture
    from imagebuild.smoke.suite import test_gates_capture as check

    st = GateSettings(lossless=LosslessGate(max_tokens=8),
                      long_generation=LongGenerationGate(tokens=64))
    sent = []
    spec, _ = runs(st)

    def fake_send(run, container, base_url, settings, *, command=(), plan=None):
        sent.append((container, base_url, settings, tuple(command), plan))
        run.plan, run.gens = spec.plan, spec.gens
        return run

    monkeypatch.setattr(check, "send_all", fake_send)
    path = tmp_path / "gates-speculative.json"
    cmd = ["vllm", "serve", "/model", "--speculative-config", "{}"]
    smoke = {"container": "c1", "base_url": "http://127.0.0.1:1", "image_id": "sha256:abc",
             "gates_capture": {"settings": st.model_dump(), "path": str(path),
                               "what": "speculative", "command": cmd}}
    check.test_release_gate_requests_answered(smoke)
    # the plan is cut on that server from the image's own command (send.py)
    assert sent == [("c1", "http://127.0.0.1:1", st, tuple(cmd), None)]
    back = load_capture(path, "sha256:abc", st)
    assert back.what == "speculative" and back.plan == spec.plan

    def short_send(run, container, base_url, settings, *, command=(), plan=None):
        run.gens = [gen(g.name, varied(3), n=g.max_tokens) for g in spec.gens]
        return run

    monkeypatch.setattr(check, "send_all", short_send)
    with pytest.raises(AssertionError, match="not answered in full"):
        check.test_release_gate_requests_answered(smoke)
    with pytest.raises(pytest.skip.Exception):
        check.test_release_gate_requests_answered({})


def test_the_thresholds_table_in_the_docs_is_the_schema_and_the_matrix():
    """docs/release-gates.md's table: every field, its default and both targets' value."""
    from imagebuild import REPO_ROOT
    from imagebuild.plan import load_plan

    plan = load_plan(None, "2026-06-18-dflashfix", "all", None)
    gates = {j.cell.target_name: j.cell.target.gates.model_dump() for j in plan.jobs}
    default = GateSettings().model_dump()

    def at(d: dict, dotted: str) -> object:
        for key in dotted.split("."):
            d = d[key]
        return d

    rows = [ln.split("|")[1:5] for ln in
            (REPO_ROOT / "docs/release-gates.md").read_text().splitlines()
            if ln.startswith("| `lossless.") or ln.startswith("| `long_generation.")
            or ln.startswith("| `conditions.")]
    seen = set()
    for field, dflt, gb10, cpu in rows:
        name = field.strip().strip("`")
        seen.add(name)
        for want, got in ((at(default, name), dflt), (at(gates["gb10"], name), gb10),
                          (at(gates["cpu"], name), cpu)):
            assert float(got) == float(want), (name, got, want)  # type: ignore[arg-type]

    def leaves(d: dict, pre: str = "") -> set[str]:
        return set().union(*(leaves(v, f"{pre}{k}.") if isinstance(v, dict) else {pre + k}
                             for k, v in d.items()))
    assert seen == leaves(default)
