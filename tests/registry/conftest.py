"""Fixtures of the registry tests: a private redis-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, stopped after the test."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()
