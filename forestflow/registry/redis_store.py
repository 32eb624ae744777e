"""The Redis registry store: one registry shared by many gateway replicas.

Layout under a namespace (default ``forestflow``):

- ``<ns>:docs``     hash, document key -> JSON: ``servable/*``, ``contract/*`` and the *shared* part
  of ``metrics/*`` (createdAtMS, becameValidAtMS, performanceMetrics).
- ``<ns>:meta``     hash: ``epoch`` (random, set when the registry is first written or re-seeded)
  and ``version`` (bumped in the same MULTI/EXEC as every change of ``<ns>:docs``).
- ``<ns>:counters`` hash, ``<fqrv>@<replica>`` -> ``"<scoreCount> <shadeCount> <errorCount> <shadeErrorCount>"``: every replica
  writes only its own counters, so none is lost to another's stale write; peers' sums feed /stats.
- ``<ns>:changed``  sorted set, document key -> the version that last wrote or deleted it: a
  replica that follows reads only the documents changed since the version it holds (with 10,000
  releases reading them all on every deploy took seconds). Entries older than
  :data:`CHANGELOG_KEEP` versions are trimmed; ``<ns>:meta`` ``trimmed`` says from which version
  the set is complete (a replica further behind reads everything).
- ``<ns>:changes``  pub/sub channel; every change publishes ``<epoch>:<version>``.

Router state (``routing/*``) stays in each replica's memory and is not written. Replicas follow
changes by pub/sub *and* by checking ``(epoch, version)`` every ``sync_interval_s`` (pub/sub is
at-most-once: a subscriber that is reconnecting misses messages and is not told). Requests never
touch Redis; writes while it is away raise :class:`StoreUnavailable`. If Redis comes back empty
(restarted without persistence), the first replica to notice writes its last snapshot back under a
new epoch and every other replica follows that snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
import structlog
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, WatchError

from forestflow.cancelling import cancel_until_done
from forestflow.core.ids import FQRV
from forestflow.errors import StoreUnavailable
from forestflow.registry.store import NO_COUNTS, counters_doc, counters_of, merge_shared_metrics, split_counters

log = structlog.get_logger("forestflow.registry.redis")

#: How many versions of document changes ``<ns>:changed`` keeps (trimmed every 1,000 versions).
CHANGELOG_KEEP = 10_000


def _dumps(doc: Any) -> str:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS).decode()


class RedisStore:
    """A :class:`~forestflow.registry.store.Store` in Redis, followed by every replica.

    ``watch(on_change)`` starts following: ``on_change()`` is awaited whenever the registry moved
    past what :meth:`load` last returned; it is expected to call :meth:`load` and apply the result.
    """

    def __init__(
        self,
        url: str,
        sync_interval_s: float = 2.0,
        *,
        namespace: str = "forestflow",
        replica_id: str | None = None,
        pool_size: int = 8,
        pool_timeout_s: float = 2.0,
        socket_timeout_s: float = 2.0,
    ) -> None:
        self.url = url
        self.sync_interval_s = sync_interval_s
        self.replica_id = replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.namespace = namespace
        self.docs_key, self.meta_key = f"{namespace}:docs", f"{namespace}:meta"
        self.counters_key, self.channel = f"{namespace}:counters", f"{namespace}:changes"
        self.changed_key = f"{namespace}:changed"
        self._conn_kwargs: dict[str, Any] = {
            "socket_connect_timeout": socket_timeout_s,
            "socket_timeout": socket_timeout_s,
            "decode_responses": True,
            "client_name": f"forestflow:{self.replica_id}",
        }
        # Blocking pool: under load callers wait (up to pool_timeout_s) for a connection instead of
        # failing with "Too many connections" (redis-py#2517); the pool never grows past pool_size.
        self._pool = BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=pool_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
            **self._conn_kwargs,
        )
        self._redis = Redis(connection_pool=self._pool)
        #: ``(epoch, version)`` of the registry this replica has loaded (or written on top of).
        self.epoch: str | None = None
        self.version = 0
        self._known: dict[str, Any] = {}
        self._own_counters: dict[str, str] = {}
        self._peer_counts: dict[str, tuple[int, ...]] = {}
        self._on_change: Callable[[], Awaitable[None]] | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: Set by :meth:`close`: the follow loops end at their next turn even if a cancel was lost.
        self._closing = False
        self.available = True

    # ---- Store ----------------------------------------------------------------------------------
    async def load(self) -> dict[str, Any]:
        """Every document; ``metrics/*`` carry this replica's own counters.

        After the first load only the documents changed since the version this replica holds are
        read (``<ns>:changed``); everything again when the registry was re-seeded or the change
        set no longer reaches back that far."""
        if self.epoch is not None:
            try:
                if await self._load_changes():
                    return self._view()
            except (RedisError, OSError) as exc:
                raise self._unavailable(exc) from exc
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hmget(self.meta_key, "epoch", "version")
                pipe.hgetall(self.docs_key)
                pipe.hgetall(self.counters_key)
                (epoch, version), raw_docs, counters = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise self._unavailable(exc) from exc
        self._mark_available()
        if epoch is None and self.version > 0:  # Redis came back empty: re-seed, then read that
            await self.apply({})
            return await self.load()
        self._known = {key: orjson.loads(value) for key, value in raw_docs.items()}
        if epoch is not None:
            self.epoch, self.version = epoch, int(version or 0)
        self._read_counters(counters)
        suffix = "@" + self.replica_id
        self._own_counters = {f: v for f, v in counters.items() if f.endswith(suffix)}
        return self._view()

    async def _load_changes(self) -> bool:
        """Bring ``_known`` to the store by reading the documents changed since ``version``; False
        when that cannot be done (another epoch, the change set trimmed past it, or Redis empty)."""
        redis: Any = self._redis
        for _ in range(5):
            try:
                async with redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(self.meta_key)
                    epoch, version, trimmed = await pipe.hmget(self.meta_key, "epoch", "version", "trimmed")
                    if epoch != self.epoch or int(trimmed or 0) > self.version:
                        return False
                    keys = await pipe.zrangebyscore(self.changed_key, f"({self.version}", "+inf")
                    pipe.multi()
                    pipe.hgetall(self.counters_key)  # the peers' counters, as a full load reads them
                    if keys:
                        pipe.hmget(self.docs_key, *keys)
                    counters, *found = await pipe.execute()
                    values = found[0] if keys else []
            except WatchError:
                continue  # the registry moved while it was read: read again
            self._read_counters(counters)
            for key, value in zip(keys, values):
                if value is None:
                    self._known.pop(key, None)
                else:
                    self._known[key] = orjson.loads(value)
            self.version = int(version or 0)
            return True
        return False

    def _view(self) -> dict[str, Any]:
        """The documents as last read, ``metrics/*`` with this replica's own counters."""
        own, _ = split_counters(_parsed_counters(self._own_counters), self.replica_id)
        out = dict(self._known)
        for key, doc in self._known.items():
            if key.startswith("metrics/"):
                out[key] = {**doc, **counters_doc(own.get(key.removeprefix("metrics/"), NO_COUNTS))}
        return out

    async def apply(self, changes: dict[str, Any | None]) -> None:
        """Write a batch atomically; bump the version and publish when registry documents changed."""
        for _ in range(20):
            try:
                await self._apply_once(changes)
                self._mark_available()
                return
            except WatchError:
                await asyncio.sleep(0.005)  # another replica wrote meanwhile: read again, retry
            except (RedisError, OSError) as exc:
                raise self._unavailable(exc) from exc
        raise StoreUnavailable("registry store (Redis) is busy with concurrent writes; try again")

    async def close(self) -> None:
        """Stop following and release every connection."""
        self._closing = True
        # A timeout raised by the client while cancelled is an OSError the loops catch (the subscription
        # loop then went on reconnecting and shutdown never ended): cancelled until done, and the loops
        # also check _closing at every turn.
        await cancel_until_done(self._tasks)
        self._tasks = []
        await self._redis.aclose()
        await self._pool.disconnect()

    @property
    def client(self) -> Redis:
        """The pooled client (for what replicas share beside the registry: the answers index)."""
        return self._redis

    # ---- counters ---------------------------------------------------------------------------------
    def peer_counters(self, fqrv: FQRV) -> tuple[int, ...]:
        """The counters (:data:`~forestflow.registry.store.COUNTERS` order) summed over the other
        replicas, as of the last sync round."""
        return self._peer_counts.get(str(fqrv), NO_COUNTS)

    def _read_counters(self, counters: dict[str, str]) -> dict[str, tuple[int, ...]]:
        """This replica's counters by fqrv; the other replicas' sums go to :meth:`peer_counters`."""
        own, self._peer_counts = split_counters(_parsed_counters(counters), self.replica_id)
        return own

    # ---- writing ----------------------------------------------------------------------------------
    async def _apply_once(self, changes: dict[str, Any | None]) -> None:
        changes = {k: v for k, v in changes.items() if not k.startswith("routing/")}
        # redis-py types every answer bytes | str and mappings as bytes-keyed; with decode_responses
        # they are all str here, which the annotations below say.
        redis: Any = self._redis
        async with redis.pipeline(transaction=True) as pipe:
            await pipe.watch(self.docs_key, self.meta_key)
            epoch, version = await pipe.hmget(self.meta_key, "epoch", "version")
            reseed = epoch is None and self.version > 0  # Redis lost the registry: write ours back
            keys = list(changes) + [f"servable/{k.removeprefix('metrics/')}" for k in changes if k.startswith("metrics/")]
            stored: dict[str, str | None] = dict(zip(keys, await pipe.hmget(self.docs_key, *keys))) if keys else {}
            drop_counters = [k.removeprefix("metrics/") for k, v in changes.items() if k.startswith("metrics/") and v is None]
            counter_fields: list[str] = await pipe.hkeys(self.counters_key) if drop_counters else []

            writes: dict[str, str] = {_k: _dumps(doc) for _k, doc in self._known.items()} if reseed else {}
            deletes: list[str] = []
            counters: dict[str, str] = dict(self._own_counters) if reseed else {}
            for key, doc in changes.items():
                if doc is None:
                    if stored.get(key) is not None:
                        deletes.append(key)
                    writes.pop(key, None)
                    continue
                if not key.startswith("metrics/"):
                    if _dumps(doc) != stored.get(key):
                        writes[key] = _dumps(doc)
                    continue
                fqrv = key.removeprefix("metrics/")
                servable = f"servable/{fqrv}"
                if changes.get(servable, stored.get(servable)) is None and servable not in writes:
                    continue  # deleted meanwhile: do not bring its counters back
                counters[f"{fqrv}@{self.replica_id}"] = " ".join(str(v) for v in counters_of(doc))
                stored_doc = stored.get(key)
                current = orjson.loads(stored_doc) if stored_doc else None
                merged = merge_shared_metrics(current, self._known.get(key), doc)
                if merged != current:
                    writes[key] = _dumps(merged)
            dropped = [f for f in counter_fields if f.rpartition("@")[0] in drop_counters]

            pipe.multi()
            if writes:
                pipe.hset(self.docs_key, mapping=writes)
            if deletes:
                pipe.hdel(self.docs_key, *deletes)
            if counters:
                pipe.hset(self.counters_key, mapping=counters)
            if dropped:
                pipe.hdel(self.counters_key, *dropped)
            bump = bool(writes or deletes or reseed)
            new_epoch = epoch if epoch is not None else secrets.token_hex(8)
            new_version = (self.version if reseed else int(version or 0)) + 1
            if bump:
                meta: dict[str, Any] = {"epoch": new_epoch, "version": new_version}
                if reseed:
                    pipe.delete(self.changed_key)
                    meta["trimmed"] = new_version
                elif new_version % 1000 == 0 and new_version > CHANGELOG_KEEP:
                    pipe.zremrangebyscore(self.changed_key, "-inf", new_version - CHANGELOG_KEEP)
                    meta["trimmed"] = new_version - CHANGELOG_KEEP
                changed = {key: new_version for key in [*writes, *deletes]}
                if changed:
                    pipe.zadd(self.changed_key, changed)
                pipe.hset(self.meta_key, mapping=meta)
                pipe.publish(self.channel, f"{new_epoch}:{new_version}")
            if not (bump or counters or dropped):
                await pipe.reset()
                return
            await pipe.execute()

        if reseed:
            log.warning("registry_reseeded", epoch=new_epoch, version=new_version, documents=len(writes))
        for key in deletes:
            self._known.pop(key, None)
        for key, value in writes.items():
            self._known[key] = orjson.loads(value)
        self._own_counters.update({f: v for f, v in counters.items() if f.endswith("@" + self.replica_id)})
        for field in dropped:
            self._own_counters.pop(field, None)
        # Only claim the new version when nothing else happened in between; otherwise the next
        # check sees a version we have not loaded and reloads.
        if bump and (reseed or (epoch, int(version or 0)) == (self.epoch, self.version)):
            self.epoch, self.version = new_epoch, new_version

    # ---- following --------------------------------------------------------------------------------
    def watch(self, on_change: Callable[[], Awaitable[None]]) -> None:
        """Follow the registry: pub/sub plus a version check every ``sync_interval_s``."""
        self._on_change = on_change
        self._tasks = [
            asyncio.create_task(self._listen(), name="redis-store-listen"),
            asyncio.create_task(self._sync_loop(), name="redis-store-sync"),
        ]

    async def check(self) -> None:
        """One sync round: refresh peer counters; reload (or re-seed) if the registry moved."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self.meta_key, "epoch", "version")
            pipe.hgetall(self.counters_key)
            (epoch, version), counters = await pipe.execute()
        self._read_counters(counters)
        if epoch is None:
            if self.version > 0:
                await self.apply({})
            return
        if (epoch, int(version or 0)) != (self.epoch, self.version) and self._on_change is not None:
            await self._on_change()

    async def _sync_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.sync_interval_s)
            self._wake.clear()
            try:
                await self.check()
                self._mark_available()
            except (RedisError, OSError, StoreUnavailable) as exc:
                self._unavailable(exc)
            except Exception:
                log.exception("registry_sync_failed")

    async def _listen(self) -> None:
        """Wake the sync loop on every published change; after each (re)subscribe, check anyway."""
        backoff = 0.05
        while not self._closing:
            # Its own connection, without redis-py's silent reconnect: a reconnect must be seen,
            # because messages published while it was away are gone.
            client = Redis.from_url(self.url, retry=Retry(ExponentialBackoff(), 0), **self._conn_kwargs)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self._wake.set()
                backoff = 0.05
                while not self._closing:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(self.sync_interval_s, 1.0))
                    if message is not None:
                        self._wake.set()
            except (RedisError, OSError) as exc:
                log.debug("registry_subscription_lost", error=str(exc))
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.sync_interval_s)

    # ---- availability -----------------------------------------------------------------------------
    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        if isinstance(exc, StoreUnavailable):
            error = exc
        else:
            error = StoreUnavailable(
                f"registry store (Redis) unavailable: {exc}; serving from the last snapshot, retry the change later"
            )
        if self.available:
            self.available = False
            log.warning("registry_store_unavailable", error=str(exc), version=self.version)
        return error

    def _mark_available(self) -> None:
        if not self.available:
            self.available = True
            log.info("registry_store_available", version=self.version)


def _parsed_counters(counters: dict[str, str]) -> Iterable[tuple[str, list[int]]]:
    """The counters hash's fields with their values as numbers (a field that does not parse is skipped)."""
    for field, value in counters.items():
        try:
            yield field, [int(v) for v in value.split()]
        except ValueError:
            continue
