"""Shared fixtures: an in-process gateway on a real port, gateway child processes, and MLServer."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

# One OpenMP (and OpenBLAS) thread in every test process and every process the tests start, before any library
# loads its runtime: two xdist workers share two cores, and a pool of spinning OpenMP threads per library call
# oversubscribes them (a 300-row XGBoost multiclass model took 15 s to train on a busy machine, 0.03 s with one
# thread). The models the tests train give the same answers either way; the libraries' own answers are computed
# in the same process as the comparison.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests import tiers  # noqa: E402
from tests.remote_backends import MLServerProcess, train_iris  # noqa: E402
from tests.support import SESSION_MARK, GatewayProcess, InProcessGateway, leftover_gateways, serve_in_process  # noqa: E402


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[InProcessGateway]:
    """A gateway (file store, file log, Python flavor allowed) served on a free loopback port."""
    async with serve_in_process(tmp_path / "data") as server:
        yield server


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[type[GatewayProcess]]:
    """Factory for gateway child processes; all are stopped at the end of the test."""
    started: list[GatewayProcess] = []

    class Tracked(GatewayProcess):
        def start(self, timeout_s: float = 30.0, wait_started: bool = True) -> GatewayProcess:
            started.append(self)
            return super().start(timeout_s, wait_started)

    yield Tracked
    for proc in started:
        proc.kill()


@pytest.fixture(scope="session")
def mlserver_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerProcess]:
    """One MLServer serving the iris model (tests/remote_backends.py), shared by the session's tests
    (per xdist worker): started once, stopped at the end."""
    work = tmp_path_factory.mktemp("mlserver")
    train_iris(work / "models")
    server = MLServerProcess(work / "models", work / "mlserver.log").start()
    yield server
    server.stop()


@pytest.fixture
def mlserver(mlserver_session: MLServerProcess) -> MLServerProcess:
    """The session's MLServer, running: started again first when an earlier test stopped it and
    failed before starting it again."""
    if not mlserver_session.running:
        mlserver_session.start()
    return mlserver_session


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loop the tests run on: asyncio's, like ``forestflow serve`` by default; FF_TEST_LOOP=uvloop
    runs them on uvloop (the opt-in ``event_loop`` setting; gateway child processes get it too).

    Not a FORESTFLOW_* name: child gateways inherit the environment and refuse unknown settings."""
    if os.environ.get("FF_TEST_LOOP", "asyncio") == "asyncio":
        return {"asyncio": asyncio.new_event_loop}
    import uvloop

    return {"uvloop": uvloop.new_event_loop}


def pytest_configure(config: pytest.Config) -> None:
    """Mark this session's processes (xdist workers and every gateway started inherit the mark), and tell the
    fuzz tests the tier: under ``-m "not slow"`` they run fewer examples (tests/tiers.py)."""
    os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)
    tiers.QUICK = "not slow" in (config.getoption("markexpr", "") or "")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the slow tests still tell which modules have them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order in which xdist hands the modules out (``--no-loadscope-reorder`` in pyproject.toml keeps it): the
    modules with slow tests first, as they hold the longest runs (bench smoke, fuzzing, outages, rollouts), then the
    others by number of tests, as xdist would order them all. By the number alone a one-test module such as the
    OpenAPI fuzz run (25-65 s on the shared machine) went last while the other worker had nothing left to do.
    A module's own tests keep their order."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow = {module(item) for item in items if item.get_closest_marker("slow")}
    count = Counter(module(item) for item in items)
    first: dict[str, int] = {}
    for n, item in enumerate(items):
        first.setdefault(module(item), n)
    items.sort(key=lambda item: (module(item) not in slow, -count[module(item)], first[module(item)]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite must leave no gateway process behind: name any that still runs, kill it, and fail."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once all are done
        return
    token = os.environ[SESSION_MARK]
    deadline = time.monotonic() + 3.0  # one that is being stopped right now gets a moment
    while (left := leftover_gateways(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = [f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
    message = "\n".join(["LEFT BEHIND: the test session ended with gateway processes still running (now killed):", *lines])
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
