"""runner-clean's plan without a daemon (the real engine: tests/e2e/test_runner_clean.py)."""

from __future__ import annotations

from imagebuild.builder.hygiene import Local, plan_clean

S = "127.0.0.1:5000/ns/cell"
R = [f"2026-06-0{d}-v0.23.0-dflashfix" for d in range(1, 6)]


def _img(i: str, created: str, tags: list[str], *, layers: tuple[str, ...] = (),
         parent: str | None = None, chain: bool = False) -> Local:
    releases = [(S, t.rsplit(":", 1)[1]) for t in tags if t.startswith(S + ":")]
    ours = [t for t in tags if not t.startswith("user/")]
    return Local(i, tags, created, layers, parent, 1, releases, chain, ours)


def test_keeps_newest_latest_rollback_and_what_they_were_built_from():
    images = {i.id: i for i in (
        # gb10-like chain: the engine's layers are not its base's (runtime stage FROM
        # another image), so only the parent label links them
        _img("b0", "2026-06-01T00", ["imagebuild/base-t:0", "imagebuild/inputs:b0"],
             layers=("base-layer-0",), chain=True),
        _img("e0", "2026-06-01T01", ["imagebuild/engine-t-x:0"], layers=("rt", "e0"),
             parent="b0", chain=True),
        _img("s0", "2026-06-01T02", [f"{S}:{R[0]}", "imagebuild/inputs:s0"],
             layers=("rt", "e0", "s0"), parent="e0"),
        _img("b1", "2026-06-02T00", ["imagebuild/base-t:1", "user/mine:1"],
             layers=("base-layer-1",), chain=True),
        _img("e1", "2026-06-02T01", ["imagebuild/engine-t-x:1"], layers=("rt", "e1"),
             parent="b1", chain=True),
        _img("s1", "2026-06-02T02", [f"{S}:{R[1]}"], layers=("rt", "e1", "s1"), parent="e1"),
        # an older build without the label: found through its layers
        _img("s2", "2026-06-03T02", [f"{S}:{R[2]}", f"{S}:{R[3]}"], layers=("rt", "e1", "s2")),
        # a newer engine no release uses yet (a release in progress): kept
        _img("e9", "2026-06-09T00", ["imagebuild/engine-t-x:9"], layers=("rt", "e9"),
             chain=True),
    )}
    plan = plan_clean(images, keep=1, protected={(S, R[1]): "latest"})
    assert plan.keep == {R[3]: "newest 1", R[1]: "latest"}
    assert sorted(plan.drop) == [R[0], R[2]]
    assert plan.remove == {
        "s0": [f"{S}:{R[0]}", "imagebuild/inputs:s0"],
        "e0": ["imagebuild/engine-t-x:0"],
        "b0": ["imagebuild/base-t:0", "imagebuild/inputs:b0"],
        "s2": [f"{S}:{R[2]}"],  # same image as the kept R[3]: only the old tag goes
    }
    assert set(plan.kept_images) == {"s1", "e1", "b1", "s2"}
    assert plan.kept_images["b1"].startswith("built into")  # via the parent label
    assert "e9" not in plan.remove  # used after every kept release


def test_nothing_local_to_age_out_keeps_every_chain_image():
    images = {"e": _img("e", "2026-06-01", ["imagebuild/engine-t-x:1"], chain=True)}
    plan = plan_clean(images, keep=2, protected={})
    assert plan.remove == {} and plan.keep == {}


def test_runner_clean_removes_through_the_docker_seam():
    """The clean asks the engine only through the seam (here its shared double): the old
    release's tags go, a tag the engine refuses to remove is said with the engine's
    reason, and an inputs tag left as an image's only name goes after it."""
    from imagebuild.builder.hygiene import runner_clean
    from tests.support.memengine import MemoryEngine, image_doc

    eng = MemoryEngine()
    for i, (day, release) in enumerate([("01", R[0]), ("02", R[1])]):
        eng.add_image(image_doc(f"sha256:{i}", Metadata={"LastTagTime": f"2026-06-{day}"}),
                      f"{S}:{release}", f"imagebuild/inputs:s{i}")
    eng.add_image(image_doc("sha256:9"), "imagebuild/inputs:orphan")
    eng.in_use = {"imagebuild/inputs:s0"}  # a container still uses the image
    lines: list[str] = []
    plan = runner_clean(eng, serve_repos={S: "ns/cell"}, chain_repos=set(), keep=1,
                        protected={}, log=lines.append)
    assert plan.drop == [R[0]]
    assert f"removed {S}:{R[0]}, imagebuild/inputs:s0; kept: conflict: a container uses it" \
        in lines
    assert eng.image_id(f"{S}:{R[1]}") == "sha256:1" and eng.image_id(f"{S}:{R[0]}") is None
    assert plan.orphans == ["dropped imagebuild/inputs:s0 (no other name left); kept: "
                            "conflict: a container uses it",
                            "dropped imagebuild/inputs:orphan (no other name left)"]
