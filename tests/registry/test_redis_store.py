"""RedisStore against a real redis-server: documents, versions, counters, following, outages, pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from forestflow.core.ids import FQRV
from forestflow.errors import StoreUnavailable
from forestflow.registry.redis_store import RedisStore
from tests.registry.redis_server import RedisServer

SERVABLE = {"path": "file:///models/a", "fqrv": "acme.demo.1.v1"}
FQ = FQRV.parse("acme.demo.1.v1")


def metrics(score: int = 0, shade: int = 0, stamp: int | None = None, perf: dict[str, float] | None = None) -> dict:
    doc = {
        "createdAtMS": 1000,
        "scoreCount": score,
        "shadeCount": shade,
        "currentPhaseInPct": 100,
        "performanceMetrics": perf or {},
    }
    if stamp is not None:
        doc["becameValidAtMS"] = stamp
    return doc


@asynccontextmanager
async def store(server: RedisServer, **kwargs: object) -> AsyncIterator[RedisStore]:
    s = RedisStore(server.url, kwargs.pop("sync_interval_s", 5.0), **kwargs)
    try:
        yield s
    finally:
        await s.close()


async def wait_for(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float) -> float:
    """Seconds until ``condition`` held; fails the test at the deadline."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        result = condition()
        if await result if isinstance(result, Awaitable) else result:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s}s")


async def test_documents_round_trip_and_every_change_bumps_the_version(redis_server: RedisServer) -> None:
    async with store(redis_server) as a, store(redis_server) as b:
        assert await a.load() == {}
        await a.apply(
            {"servable/acme.demo.1.v1": SERVABLE, "contract/acme.demo.1": {"router": "x"}, "routing/acme.demo.1": {"picker": {}}}
        )
        assert a.version == 1
        docs = await b.load()
        assert docs == {"servable/acme.demo.1.v1": SERVABLE, "contract/acme.demo.1": {"router": "x"}}
        assert (b.epoch, b.version) == (a.epoch, 1)
        await b.apply({"contract/acme.demo.1": {"router": "y"}})
        await b.apply({"contract/acme.demo.1": {"router": "y"}})  # same content: no new version
        await a.apply({"contract/acme.demo.1": None, "contract/nope.nope.1": None})
        assert redis_server.client().hget("forestflow:meta", "version") == "3"
        assert "contract/acme.demo.1" not in await b.load()


async def test_counters_are_per_replica_and_summed_for_peers(redis_server: RedisServer) -> None:
    async with store(redis_server) as a, store(redis_server) as b:
        await a.apply({"servable/acme.demo.1.v1": SERVABLE})
        await a.apply({"metrics/acme.demo.1.v1": metrics(score=5, shade=1)})  # + the shared part: a change
        assert a.version == 2
        await b.apply({"metrics/acme.demo.1.v1": metrics(score=7)})
        await b.apply({"metrics/acme.demo.1.v1": metrics(score=8)})  # absolute, not added
        await a.apply({"metrics/acme.demo.1.v1": metrics(score=6, shade=1)})
        assert redis_server.client().hget("forestflow:meta", "version") == "2"  # counters alone are no change
        docs_a, docs_b = await a.load(), await b.load()
        assert (docs_a["metrics/acme.demo.1.v1"]["scoreCount"], docs_b["metrics/acme.demo.1.v1"]["scoreCount"]) == (6, 8)
        assert a.peer_counters(FQ)[:2] == (8, 0) and b.peer_counters(FQ)[:2] == (6, 1)
        # Deleting the servable drops every replica's counters, and a late flush does not bring them back.
        await a.apply({"servable/acme.demo.1.v1": None, "metrics/acme.demo.1.v1": None})
        await b.apply({"metrics/acme.demo.1.v1": metrics(score=9)})
        assert redis_server.client().hgetall("forestflow:counters") == {}


async def test_shared_stamp_first_writer_wins_and_stale_flushes_keep_others_performance(redis_server: RedisServer) -> None:
    async with store(redis_server) as a, store(redis_server) as b:
        await a.apply({"servable/acme.demo.1.v1": SERVABLE})
        await b.load()
        await a.apply({"metrics/acme.demo.1.v1": metrics(stamp=111)})
        version = a.version
        await b.apply({"metrics/acme.demo.1.v1": metrics(stamp=222)})
        assert a.version == version == int(redis_server.client().hget("forestflow:meta", "version"))
        await a.apply({"metrics/acme.demo.1.v1": metrics(stamp=111, perf={"auc": 0.9})})
        # b has not reloaded: its flush carries the old (empty) performance metrics and its own stamp.
        await b.apply({"metrics/acme.demo.1.v1": metrics(score=3, stamp=222)})
        shared = (await b.load())["metrics/acme.demo.1.v1"]
        assert shared["becameValidAtMS"] == 111 and shared["performanceMetrics"] == {"auc": 0.9}
        await b.apply({"metrics/acme.demo.1.v1": metrics(stamp=111, perf={"auc": 0.7})})  # b's own change
        assert (await a.load())["metrics/acme.demo.1.v1"]["performanceMetrics"] == {"auc": 0.7}


async def test_a_write_while_behind_does_not_claim_the_version(redis_server: RedisServer) -> None:
    async with store(redis_server) as a, store(redis_server) as b:
        await a.load()
        await b.apply({"contract/acme.demo.1": {"router": "x"}})
        await a.apply({"contract/acme.demo.2": {"router": "x"}})
        assert a.version == 0  # it has not seen b's change: the next check must reload
        calls: list[int] = []

        async def on_change() -> None:
            calls.append(1)
            await a.load()

        a._on_change = on_change
        await a.check()
        assert calls == [1] and a.version == 2


async def test_a_follower_reads_only_the_documents_changed_since_its_version(redis_server: RedisServer) -> None:
    async with store(redis_server) as writer, store(redis_server) as follower:
        await writer.apply({f"servable/acme.demo.{i}.v1": {**SERVABLE, "n": i} for i in range(300)})
        await follower.load()
        # Written behind the stores' backs: a follower that read every document would see it.
        redis_server.client().hset("forestflow:docs", "servable/acme.demo.7.v1", '{"sneaked": true}')
        await writer.apply({"servable/acme.demo.3.v1": None, "contract/acme.demo.300": {"k": 1}})
        await writer.apply({"metrics/acme.demo.5.v1": metrics(score=4, perf={"auc": 0.5})})
        docs = await follower.load()
        assert follower.version == writer.version == 3
        assert "servable/acme.demo.3.v1" not in docs and docs["contract/acme.demo.300"] == {"k": 1}
        assert docs["metrics/acme.demo.5.v1"]["performanceMetrics"] == {"auc": 0.5}
        assert docs["metrics/acme.demo.5.v1"]["scoreCount"] == 0  # the writer's count is its own
        assert docs["servable/acme.demo.7.v1"]["n"] == 7
        assert len(docs) == 301
        fresh = RedisStore(redis_server.url)
        try:
            assert (await fresh.load())["servable/acme.demo.7.v1"] == {"sneaked": True}  # a first load reads all
        finally:
            await fresh.close()


async def test_a_follower_behind_the_trimmed_change_set_reads_everything(redis_server: RedisServer, monkeypatch) -> None:
    from forestflow.registry import redis_store

    monkeypatch.setattr(redis_store, "CHANGELOG_KEEP", 5)
    async with store(redis_server) as writer, store(redis_server) as follower:
        await writer.apply({"contract/acme.demo.0": {"k": 0}})
        await follower.load()
        for version in range(2, 1002):
            redis_server.client().hset("forestflow:meta", "version", version - 1)  # skip ahead: 1,000 writes
            writer.version = version - 1
            if version in (2, 1000, 1001):
                await writer.apply({"contract/acme.demo.0": {"k": version}})
        assert writer.version == 1001
        assert int(redis_server.client().hget("forestflow:meta", "trimmed")) == 995
        assert redis_server.client().zcard("forestflow:changed") == 1
        docs = await follower.load()
        assert docs == {"contract/acme.demo.0": {"k": 1001}} and follower.version == 1001


async def test_followers_hear_changes_by_pubsub(redis_server: RedisServer) -> None:
    async with store(redis_server, sync_interval_s=30.0) as a, store(redis_server, sync_interval_s=30.0) as b:
        seen: list[dict] = []

        async def on_change() -> None:
            seen.append(await b.load())

        await b.load()
        b.watch(on_change)
        await wait_for(lambda: redis_server.client().pubsub_numsub("forestflow:changes")[0][1] == 1, 5)
        await a.apply({"servable/acme.demo.1.v1": SERVABLE})
        # Far sooner than the 30 s version check: the published message woke it.
        await wait_for(lambda: any("servable/acme.demo.1.v1" in d for d in seen), 2)


async def test_a_change_without_a_message_is_found_by_the_version_check(redis_server: RedisServer) -> None:
    async with store(redis_server, sync_interval_s=0.3) as b:
        seen: list[dict] = []

        async def on_change() -> None:
            seen.append(await b.load())

        await b.load()
        b.watch(on_change)
        await asyncio.sleep(0.1)
        raw = redis_server.client()
        raw.hset("forestflow:docs", "contract/acme.demo.1", '{"router":"x"}')
        raw.hset("forestflow:meta", mapping={"epoch": "e1", "version": 1})  # no PUBLISH: a lost message
        await wait_for(lambda: any("contract/acme.demo.1" in d for d in seen), 5)  # by the version check, not a message


async def test_redis_away_writes_fail_fast_then_an_empty_redis_is_reseeded(redis_server: RedisServer) -> None:
    async with store(redis_server, sync_interval_s=0.2) as a, store(redis_server, sync_interval_s=0.2) as b:
        await a.apply({"servable/acme.demo.1.v1": SERVABLE, "contract/acme.demo.1": {"router": "x"}})
        await a.apply({"metrics/acme.demo.1.v1": metrics(score=4)})
        await b.load()
        redis_server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Redis.*unavailable"):
            await a.apply({"contract/acme.demo.2": {"router": "x"}})
        assert time.monotonic() - started < 3
        with pytest.raises(StoreUnavailable):
            await b.load()
        redis_server.start()  # same port, nothing kept
        loads: list[dict] = []

        async def on_change() -> None:
            loads.append(await b.load())

        b.watch(on_change)
        await a.check()  # a notices the empty registry first and writes its snapshot back
        raw = redis_server.client()
        assert raw.hget("forestflow:docs", "contract/acme.demo.1") is not None
        assert raw.hget("forestflow:counters", f"acme.demo.1.v1@{a.replica_id}") == "4 0 0 0 0 0 0"  # store.COUNTERS order
        await wait_for(lambda: bool(loads) and b.epoch == a.epoch, 3)
        assert set(loads[-1]) == {"servable/acme.demo.1.v1", "contract/acme.demo.1", "metrics/acme.demo.1.v1"}
        assert loads[-1]["metrics/acme.demo.1.v1"]["scoreCount"] == 0 and b.peer_counters(FQ)[:2] == (4, 0)


class DelayProxy:
    """A TCP proxy that holds every client->server chunk for ``delay_s`` (Redis latency injection)."""

    def __init__(self, port: int, delay_s: float) -> None:
        self.port, self.delay_s = port, delay_s
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
            try:
                while chunk := await src.read(65536):
                    if delay:
                        await asyncio.sleep(delay)
                    dst.write(chunk)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, self.delay_s), pipe(up_reader, writer, 0.0))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_pool_waits_for_connections_and_never_grows_past_its_size(redis_server: RedisServer) -> None:
    proxy = DelayProxy(redis_server.port, 0.01)
    url = await proxy.start()
    raw = redis_server.client()
    s = RedisStore(url, 5.0, pool_size=3, pool_timeout_s=10.0, replica_id="pooled")
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            clients = await asyncio.to_thread(raw.client_list)
            peak = max(peak, sum(1 for c in clients if c["name"] == "forestflow:pooled"))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(s.apply({f"contract/acme.demo.{i}": {"n": i}}) for i in range(1, 31)))
        assert 1 <= peak <= 3
        assert len(await s.load()) == 30
    finally:
        sampler.cancel()
        await s.close()
        await proxy.close()


async def test_pool_exhaustion_is_a_503_after_the_timeout_not_a_crash(redis_server: RedisServer) -> None:
    proxy = DelayProxy(redis_server.port, 0.1)
    url = await proxy.start()
    s = RedisStore(url, 5.0, pool_size=2, pool_timeout_s=0.05)
    try:
        results = await asyncio.gather(
            *(s.apply({f"contract/acme.demo.{i}": {"n": i}}) for i in range(1, 9)), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors and all(isinstance(e, StoreUnavailable) for e in errors), results
        assert all("No connection available" in str(e) for e in errors)
        assert any(r is None for r in results)  # those holding a connection went through
    finally:
        await s.close()
        await proxy.close()


async def test_close_ends_the_follow_loops_even_when_a_cancel_is_lost(redis_server: RedisServer) -> None:
    # Python 3.11's wait_for can drop a cancel, and the client can turn one into a timeout the loops
    # catch: shutdown then waited for the subscription loop forever (seen in CI). close() cancels again.
    s = RedisStore(redis_server.url, 0.2)

    async def on_change() -> None:
        return None

    s.watch(on_change)
    swallowed = asyncio.Event()

    async def loses_its_first_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()
        await asyncio.sleep(3600)

    stubborn = asyncio.create_task(loses_its_first_cancel())
    s._tasks.append(stubborn)
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(s.close())
    await asyncio.wait([closing], timeout=10)
    finished = closing.done()
    stubborn.cancel()  # lets a close() that waits forever end, so a failure does not hang the suite
    await closing
    assert swallowed.is_set() and finished, "close() waited for a task that lost its cancel"
    assert not s._tasks
