"""Boot judgement from the log: phases, fatal lines, the spawn hang; and wait_ready's speed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from imagebuild.serving.boot import Container, wait_ready
from imagebuild.serving.logwatch import LogState, exceptions, excerpt, fatal_of, phase_after
from tests.support.memengine import MemoryEngine

# Lines as vLLM 0.23 prints them (cpu boot of the tiny model, and docs/domain.md's failures).
BOOT = [
    "(APIServer pid=1) INFO 06-18 10:00:01 [api_server.py:1] vLLM API server version 0.23.0",
    "(APIServer pid=1) INFO 06-18 10:00:01 [utils.py:1] non-default args: {'model': '/model'}",
    "(EngineCore pid=60) INFO 06-18 10:00:09 [core.py:1] Initializing a V1 LLM engine",
    "(EngineCore pid=60) INFO 06-18 10:00:12 [cpu_model_runner.py:104] Starting to load model",
    "(EngineCore pid=60) INFO 06-18 10:00:13 [default_loader.py:1] Loading weights took 0.02 s",
    "(APIServer pid=1) INFO:     Application startup complete.",
]
FAIL = [
    "(EngineCore pid=60) ERROR 06-18 10:00:13 [core.py:1195] EngineCore failed to start.",
    "(EngineCore pid=60) ERROR 06-18 10:00:13 [core.py:1195] Traceback (most recent call last):",
    '(EngineCore pid=60) ERROR 06-18 10:00:13 [core.py:1195]   File "vllm/v1/core/kv_cache_utils'
    '.py", line 900, in unify_kv_cache_spec_page_size',
    "(EngineCore pid=60) ERROR 06-18 10:00:13 [core.py:1195] AssertionError",
    "RuntimeError: Engine core initialization failed. See root cause above.",
]


def test_phases_follow_the_boot_and_never_go_back():
    phase, seen = "starting", []
    for line in BOOT:
        phase = phase_after(phase, line)
        seen.append(phase)
    assert seen == ["engine starting", "engine starting", "engine starting",
                    "loading weights", "loading weights", "ready"]
    assert phase_after("ready", BOOT[0]) == "ready"
    assert phase_after("starting", "Capturing CUDA graphs (mixed prefill-decode)") == \
        "capturing graphs"


def test_fatal_lines():
    assert [fatal_of(line) for line in BOOT] == [None] * len(BOOT)
    assert fatal_of(FAIL[0]) == "engine init failed"
    assert fatal_of(FAIL[2]) == "KV page-size assert (unify_kv_cache_spec_page_size)"
    assert fatal_of("torch.OutOfMemoryError: CUDA out of memory. Tried") == "CUDA out of memory"


def test_exceptions_are_the_root_causes_without_prefixes():
    assert exceptions(BOOT) == []
    assert exceptions(FAIL + FAIL) == [
        "AssertionError", "RuntimeError: Engine core initialization failed. See root cause above."]
    assert exceptions(["(Worker pid=41) ERROR 11-30 01:25:53 [multiproc_executor.py:987] "
                       "torch._inductor.exc.InductorError: InvalidCxxCompiler: no g++"]) == [
        "torch._inductor.exc.InductorError: InvalidCxxCompiler: no g++"]


def test_excerpt_starts_at_the_traceback():
    lines = BOOT[:3] + ["Traceback (most recent call last):", "  File x", "ValueError: bad"]
    assert excerpt(lines, 5, after=0).splitlines()[:4] == [
        "exceptions raised:", "  ValueError: bad", "--- log ---",
        "Traceback (most recent call last):"]
    assert excerpt([]) == "(the container printed nothing)"


def test_state_records_the_first_fatal_line():
    s = LogState()
    for i, line in enumerate(BOOT[:3] + FAIL):
        s.feed(line, float(i))
    assert s.fatal == "engine init failed" and s.fatal_index == 3 and s.fatal_at == 3.0


@pytest.fixture
def container(memory_engine: MemoryEngine) -> Callable[..., Container]:
    """A serve container on the Docker seam's double: exited with code 1, using `cpu`
    percent; on the discard port 9 unless told (nothing answers /health there)."""
    def make(cpu: float = 0.5, port: int = 9) -> Container:
        memory_engine.add_container("c", state={"Status": "exited", "Running": False,
                                                "ExitCode": 1})
        memory_engine.cpu["c"] = cpu
        return Container("c", port)
    return make


class FakeWatcher:
    """A LogWatcher fed by a script of (delay, line) instead of `docker logs -f`."""

    def __init__(self, script: list[tuple[float, str]], end: bool = False):
        self.state = LogState()
        self.changed = threading.Event()
        self._lock = threading.Lock()

        def play() -> None:
            for delay, line in script:
                time.sleep(delay)
                with self._lock:
                    self.state.feed(line, time.monotonic())
                self.changed.set()
            if end:
                with self._lock:
                    self.state.ended_at = time.monotonic()
                self.changed.set()
        threading.Thread(target=play, daemon=True).start()

    def snapshot(self) -> LogState:
        with self._lock:
            s = self.state
            return LogState(list(s.lines), s.phase, s.fatal, s.fatal_index, s.fatal_at,
                            s.last_line_at, s.started_at, s.ended_at)


def test_a_fatal_line_ends_the_wait_within_seconds(container):
    w = FakeWatcher([(0.2, BOOT[0]), (0.2, BOOT[2])] + [(0.05, line) for line in FAIL])
    t0 = time.monotonic()
    out = wait_ready(container(), w, timeout_s=300, stall_s=60)  # type: ignore[arg-type]
    assert out.kind == "fatal" and out.message.startswith("engine failed at boot: engine init "
                                                          "failed (log line 3): AssertionError")
    assert time.monotonic() - t0 < 5
    assert out.fatal_line_s is not None and out.seconds - out.fatal_line_s < 2
    assert "unify_kv_cache_spec_page_size" in out.excerpt


def test_container_exit_ends_the_wait(container):
    out = wait_ready(container(), FakeWatcher([(0.1, "usage: vllm serve")], end=True),  # type: ignore[arg-type]
                     timeout_s=300, stall_s=60)
    assert out.kind == "exited" and out.exit_code == 1 and "usage" in out.excerpt


def test_silent_idle_log_before_weights_is_the_spawn_hang(container):
    out = wait_ready(container(cpu=0.3), FakeWatcher([(0.0, BOOT[0])]),  # type: ignore[arg-type]
                     timeout_s=30, stall_s=1.0)
    assert out.kind == "stalled" and "silent spawn hang" in out.message
    assert out.seconds < 5


def test_a_busy_silent_engine_is_not_a_hang_but_times_out(container):
    out = wait_ready(container(cpu=180.0), FakeWatcher([(0.0, BOOT[0])]),  # type: ignore[arg-type]
                     timeout_s=2.0, stall_s=0.5)
    assert out.kind == "timeout" and "engine starting" in out.message


def test_silence_after_weights_load_is_not_a_hang(container):
    out = wait_ready(container(cpu=0.0), FakeWatcher([(0.0, line) for line in BOOT[:4]]),  # type: ignore[arg-type]
                     timeout_s=2.0, stall_s=0.5)
    assert out.kind == "timeout" and "loading weights" in out.message


def test_health_is_asked_as_soon_as_the_log_says_ready(container):
    """/health answers from the moment the ready line is printed (1.3 s in, between two of
    the 1 s probes of a booting engine): the wait ends within a poll of it, not at the next
    1 s probe."""
    import http.server

    ready = threading.Event()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if ready.is_set() else 503)
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = container(port=server.server_address[1])
    watcher = FakeWatcher([(0.0, line) for line in BOOT[:-1]] + [(1.3, BOOT[-1])])
    threading.Timer(1.3, ready.set).start()
    try:
        out = wait_ready(served, watcher, timeout_s=30, stall_s=60)  # type: ignore[arg-type]
    finally:
        server.shutdown()
    assert out.kind == "ready", out.message
    assert out.seconds < 1.3 + 0.5, out.seconds  # the old 1 s probe: 2.0 s
