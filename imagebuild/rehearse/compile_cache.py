"""A compile cache shared by build runners, on this machine: sccache in front of nvcc and
g++, Redis (Debian's redis-server on 127.0.0.1) as the shared backend.

A "runner" is one sccache server with its own, initially empty, local directory
(SCCACHE_DIR) and port, talking to the shared Redis; it is stopped when the runner is
done, so the next runner starts with no server state (compiler detection, preprocessor
cache) and no local files: whatever it finds, it found in Redis. Each unit is compiled
with the statistics zeroed first, so hits and misses are per unit.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from imagebuild.rehearse.compile import Compiled, Unit, compile_units


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """redis-server on 127.0.0.1 at a free port, in memory only (no RDB, no AOF)."""

    def __init__(self, binary: str | None = None):
        self.binary = binary or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def __enter__(self) -> RedisServer:
        self._dir = tempfile.TemporaryDirectory(prefix="imagebuild-redis.")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self._dir.name, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}")
            try:
                if self.command("PING") == "+PONG":
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer on 127.0.0.1:{self.port}")

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._dir:
            self._dir.cleanup()

    def command(self, *args: str) -> str:
        """One RESP command, first reply line (enough for PING, DBSIZE, FLUSHALL)."""
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(payload.encode())
            return conn.recv(4096).decode().split("\r\n", 1)[0]

    def keys(self) -> int:
        return int(self.command("DBSIZE").lstrip(":"))


@dataclass(frozen=True)
class UnitStats:
    """One unit's compile through sccache: time, and the server's counters for it."""

    compiled: Compiled
    hits: int
    misses: int
    not_cacheable: int

    @property
    def requests(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0


def _count(stats: dict, key: str) -> int:
    return sum(stats.get(key, {}).get("counts", {}).values())


class SccacheRunner:
    """One runner's sccache server: fresh local dir and port, the shared Redis."""

    def __init__(self, sccache: str, redis_url: str, local_dir: Path):
        self.sccache = sccache
        self.local_dir = local_dir
        if local_dir.exists():
            shutil.rmtree(local_dir)
        local_dir.mkdir(parents=True)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")},
            "SCCACHE_REDIS_ENDPOINT": redis_url,
            "SCCACHE_DIR": str(local_dir),
            "SCCACHE_SERVER_PORT": str(free_port()),
            "SCCACHE_IDLE_TIMEOUT": "0",
            "SCCACHE_ERROR_LOG": str(local_dir / "server.log"),
            "SCCACHE_LOG": "warn",
        }

    def _cmd(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.sccache, *args], env=self.env, capture_output=True,
                              text=True, check=False)

    def __enter__(self) -> SccacheRunner:
        proc = self._cmd("--start-server")
        if proc.returncode != 0:
            raise RuntimeError(f"sccache --start-server: {proc.stderr.strip() or proc.stdout}")
        location = self.stats_json().get("cache_location", "")
        if "redis" not in location.lower():
            raise RuntimeError(f"sccache does not use Redis: {location}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._cmd("--stop-server")
        # the next runner must not find this server (or its in-memory state) on the port
        port = int(self.env["SCCACHE_SERVER_PORT"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the sccache server on port {port} did not stop")

    def stats_json(self) -> dict:
        proc = self._cmd("--show-stats", "--stats-format", "json")
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def compile(self, unit: Unit) -> UnitStats:
        self._cmd("--zero-stats")
        [compiled] = compile_units([unit], jobs=1, launcher=[self.sccache], env=self.env)
        stats = self.stats_json().get("stats", {})
        return UnitStats(compiled, _count(stats, "cache_hits"), _count(stats, "cache_misses"),
                         int(stats.get("non_cacheable_compilations", 0)))


def run_runner(sccache: str, redis_url: str, local_dir: Path, units: list[Unit]) -> list[UnitStats]:
    """One runner compiling `units` one after another (per-unit times and counters)."""
    for unit in units:
        unit.output.unlink(missing_ok=True)
    with SccacheRunner(sccache, redis_url, local_dir) as runner:
        return [runner.compile(unit) for unit in units]
