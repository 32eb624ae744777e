"""A real ``redis-server`` on a free loopback port, for tests: start, stop (the outage), restart."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tests.support import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """One redis-server child process without persistence (a restart comes back empty)."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start on the same port as before and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / f"redis-{self.port}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                time.sleep(0.02)
        raise TimeoutError(f"redis-server on {self.port} did not start")

    def stop(self) -> None:
        """Stop the server (SIGKILL: nothing is saved, clients see their connections drop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> redis.Redis:
        """A synchronous client for assertions and fault injection."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True)
