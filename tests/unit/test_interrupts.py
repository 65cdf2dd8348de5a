"""Interrupt handling without Docker: SIGTERM becomes Ctrl-C's KeyboardInterrupt, an
interrupt during a container's creation waits until the engine has answered, and the
bench server's clean-up then removes the container (tests/e2e/test_interrupts_e2e.py does
the same against the real engine, at several points of smoke, bench and the whole job)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from imagebuild.interrupts import held_interrupts, interrupts_as_keyboard_interrupt
from tests.support.memengine import MemoryEngine, installed


def test_an_interrupt_waits_for_the_held_block_then_stops_the_run():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now: it only noted the signal
            done.append("finished")
    assert done == ["finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_a_signal_landing_on_another_thread_is_held_too():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupts():
            t = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM))
            t.start()
            t.join()
            time.sleep(0.05)
            done.append("finished")
    assert done == ["finished"]


def test_sigterm_takes_the_ctrl_c_path():
    with pytest.raises(KeyboardInterrupt):
        with interrupts_as_keyboard_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


class LateEngine(MemoryEngine):
    """The Docker seam's double whose create lands a moment after the client gave up
    waiting (what a real engine does with a request it already accepted): `run` is the
    real seam's, on an SDK client whose interrupt arrives while the request is in flight."""

    def run(self, image: str, command: list[str], *, name: str, labels: Mapping[str, str],
            **kw: Any) -> str:
        from imagebuild.docker import Engine

        def create() -> None:
            time.sleep(0.2)
            self.add_container(name, image, labels)

        class Client:
            class containers:  # noqa: N801 - the SDK's attribute name
                @staticmethod
                def run(*a: Any, **k: Any) -> Any:
                    threading.Thread(target=create).start()
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the engine works
                    time.sleep(0.3)  # the engine answers once the container exists
                    return type("C", (), {"id": "abc"})()

        engine = Engine(Client())  # type: ignore[arg-type]
        return engine.run(image, command, name=name, labels=labels)


def test_an_interrupt_during_creation_leaves_no_bench_container():
    from imagebuild.serving import container as server
    from imagebuild.serving.runspec import Limits

    fake = LateEngine()
    with installed(fake), pytest.raises(KeyboardInterrupt):
        with server.serving("img:t", {"Config": {"Cmd": ["vllm", "serve"]}},
                            Limits(memory=None, gpu=False, boot_timeout_s=5),
                            log=lambda _: None):
            pytest.fail("the server cannot have booted")
    time.sleep(0.3)  # anything still being created has landed by now
    assert fake.containers == {}
