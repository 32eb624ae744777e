"""The embedded registry store: one JSON file under the data dir, shared by a host's workers.

The file holds the registry documents (``servable/*``, ``contract/*`` and the *shared* part of
``metrics/*``: createdAtMS, becameValidAtMS, performanceMetrics), a ``version`` bumped by every
change of those documents, and what each process keeps for itself: ``counters``
(``<fqrv>@<replica>`` -> ``[scoreCount, shadeCount, errorCount, shadeErrorCount]``) and ``routing`` (``<contract>@<replica>`` ->
router state). A gateway of one process is replica ``w0``; ``forestflow serve --workers N`` runs
``w0`` .. ``w<N-1>``, so a restart gives each worker its own counters and router position back.

Every write is a read-modify-write under an exclusive ``flock`` on a sibling lock file, then an
atomic replace (temporary file, fsync, rename), so writers on one host never lose each other's
changes. Followers (:meth:`FileStore.watch`) stat the file every ``sync_interval_s`` and, when it
changed, refresh the peers' counters and call back if the version moved past what they loaded:
the same contract :class:`~forestflow.registry.redis_store.RedisStore` offers replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import structlog

from forestflow.core.ids import FQRV
from forestflow.registry.store import (
    NO_COUNTS,
    SHARED_METRICS,
    add_counters,
    counters_doc,
    counters_of,
    merge_shared_metrics,
    split_counters,
)

log = structlog.get_logger("forestflow.registry.file")

FORMAT = 2


@dataclass(slots=True)
class _Contents:
    """What the file holds."""

    version: int = 0
    documents: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, list[int]] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)


class FileStore:
    """A :class:`~forestflow.registry.store.Store` in one file, safe for several processes."""

    def __init__(self, path: Path, replica_id: str = "w0", sync_interval_s: float = 0.25, replicas: int = 1) -> None:
        self.path = path
        self.lock_path = path.with_name(f"{path.name}.lock")
        self.replica_id = replica_id
        #: The replicas of the gateway now running: ``w0`` .. ``w<replicas-1>``.
        self.replicas = replicas
        self._retired = False
        self.sync_interval_s = sync_interval_s
        #: The registry version this process has loaded (or written on top of).
        self.version = 0
        self._known: dict[str, Any] = {}
        self._peer_counts: dict[str, tuple[int, ...]] = {}
        self._seen_stat: tuple[int, int, int] | None = None
        self._on_change: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # ---- Store ----------------------------------------------------------------------------------
    async def load(self) -> dict[str, Any]:
        """Every document; ``metrics/*`` carry this replica's counters, ``routing/*`` its router state.

        The first load of ``w0`` takes over the counters of replicas this gateway no longer runs (an
        earlier ``--workers N`` with a larger N): added to its own, so every view of the counters
        (/stats, /metrics, the page) counts them once, whatever ran on this data dir before."""
        if not self._retired and self.replica_id == "w0":
            await self.apply({})  # a write under the file lock; _merge folds them
            self._retired = True
        contents = await asyncio.to_thread(self._read)
        self.version = contents.version
        return self._adopt(contents)

    async def apply(self, changes: dict[str, Any | None]) -> None:
        """Write a batch under the file lock; bump the version when registry documents changed."""
        async with self._lock:
            write = asyncio.ensure_future(asyncio.to_thread(self._apply_locked, changes))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # A cancelled caller must not release the lock while the thread still writes: the
                # next write would race it on the same temporary file.
                await asyncio.wait([write])
                raise

    async def close(self) -> None:
        """Stop following the file."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ---- shared use -------------------------------------------------------------------------------
    def watch(self, on_change: Callable[[], Awaitable[None]]) -> None:
        """Follow the file: ``on_change()`` is awaited when another process changed the registry."""
        self._on_change = on_change
        self._task = asyncio.create_task(self._follow(), name="file-store-follow")

    def peer_counters(self, fqrv: FQRV) -> tuple[int, ...]:
        """The counters (:data:`~forestflow.registry.store.COUNTERS` order) summed over the other
        processes, as of the last look."""
        return self._peer_counts.get(str(fqrv), NO_COUNTS)

    async def check(self) -> None:
        """One look at the file: refresh the peers' counters; call back if the registry moved."""
        try:
            stat = _stat(self.path)
        except FileNotFoundError:
            return
        if stat == self._seen_stat:
            return
        self._seen_stat = stat
        contents = await asyncio.to_thread(self._read)
        self._count_peers(contents)
        if contents.version != self.version and self._on_change is not None:
            await self._on_change()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.check()
            except Exception:  # a bad round must not end following
                log.exception("registry_file_check_failed", path=str(self.path))

    # ---- file I/O (worker threads) ------------------------------------------------------------------
    def _read(self) -> _Contents:
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return _Contents()
        if data.get("format", 1) < FORMAT:
            return _from_single_process_format(data.get("documents", {}))
        return _Contents(
            int(data.get("version", 0)), data.get("documents", {}), data.get("counters", {}), data.get("routing", {})
        )

    def _apply_locked(self, changes: dict[str, Any | None]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            contents = self._read()
            loaded_version = contents.version
            changed = self._merge(contents, changes)
            if changed:
                contents.version += 1
            payload = orjson.dumps(
                {
                    "format": FORMAT,
                    "version": contents.version,
                    "documents": contents.documents,
                    "counters": contents.counters,
                    "routing": contents.routing,
                },
                option=orjson.OPT_SORT_KEYS,
            )
            _atomic_write(self.path, payload, f".{self.path.name}.{self.replica_id}.tmp")
            written = _stat(self.path)  # under the lock: exactly the file this process wrote
        self._known = dict(contents.documents)
        self._count_peers(contents)
        # Claim the new version only when nothing else happened in between; otherwise the next
        # check sees a version this process has not loaded, and reloads.
        if loaded_version == self.version:
            self.version = contents.version
            self._seen_stat = written  # nothing in it to follow: the next check need not read it back

    def _merge(self, contents: _Contents, changes: dict[str, Any | None]) -> bool:
        """Apply ``changes`` to ``contents``; whether registry documents changed."""
        docs, counters, routing = contents.documents, contents.counters, contents.routing
        changed = False
        if not self._retired and self.replica_id == "w0":
            self._retire_gone_replicas(counters, routing)
        for key, doc in changes.items():
            kind, _, name = key.partition("/")
            if kind == "routing":
                if doc is None:  # the contract is gone: every process's router state with it
                    for field_name in [f for f in routing if f.rpartition("@")[0] == name]:
                        del routing[field_name]
                else:
                    routing[f"{name}@{self.replica_id}"] = doc
            elif kind == "metrics" and doc is not None:
                servable = f"servable/{name}"
                if servable not in docs and changes.get(servable) is None:
                    continue  # deleted meanwhile: do not bring its counters back
                counters[f"{name}@{self.replica_id}"] = counters_of(doc)
                merged = merge_shared_metrics(docs.get(key), self._known.get(key), doc)
                if merged != docs.get(key):
                    docs[key] = merged
                    changed = True
            elif doc is None:
                if kind == "metrics":
                    for field_name in [f for f in counters if f.rpartition("@")[0] == name]:
                        del counters[field_name]
                if docs.pop(key, None) is not None:
                    changed = True
            elif docs.get(key) != doc:
                docs[key] = doc
                changed = True
        return changed

    def _retire_gone_replicas(self, counters: dict[str, list[int]], routing: dict[str, Any]) -> None:
        """Fold the counters of replicas not running now into this one's; drop their router state."""
        live = {f"w{i}" for i in range(self.replicas)}
        for field_name in [f for f in counters if f.rpartition("@")[2] not in live]:
            fqrv = field_name.rpartition("@")[0]
            mine = f"{fqrv}@{self.replica_id}"
            counters[mine] = list(add_counters(add_counters(NO_COUNTS, counters.get(mine, ())), counters.pop(field_name)))
        for field_name in [f for f in routing if f.rpartition("@")[2] not in live]:
            del routing[field_name]

    # ---- views ------------------------------------------------------------------------------------
    def _adopt(self, contents: _Contents) -> dict[str, Any]:
        self._known = dict(contents.documents)
        own = self._count_peers(contents)
        out = dict(contents.documents)
        for key, doc in contents.documents.items():
            if key.startswith("metrics/"):
                out[key] = {**doc, **counters_doc(own.get(key.removeprefix("metrics/"), NO_COUNTS))}
        suffix = "@" + self.replica_id
        for field_name, state in contents.routing.items():
            if field_name.endswith(suffix):
                out[f"routing/{field_name.removesuffix(suffix)}"] = state
        return out

    def _count_peers(self, contents: _Contents) -> dict[str, tuple[int, ...]]:
        """This replica's counters by fqrv; the other replicas' sums go to :meth:`peer_counters`."""
        own, self._peer_counts = split_counters(contents.counters.items(), self.replica_id)
        return own


def _from_single_process_format(documents: dict[str, Any]) -> _Contents:
    """A registry written before workers existed (format 1): its counters and router state become w0's."""
    contents = _Contents()
    for key, doc in documents.items():
        kind, _, name = key.partition("/")
        if kind == "routing":
            contents.routing[f"{name}@w0"] = doc
        elif kind == "metrics":
            contents.counters[f"{name}@w0"] = counters_of(doc)
            contents.documents[key] = {k: doc[k] for k in SHARED_METRICS if k in doc}
        else:
            contents.documents[key] = doc
    return contents


def _stat(path: Path) -> tuple[int, int, int]:
    """What tells one version of the file from the next (it is replaced, never written in place)."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _atomic_write(path: Path, payload: bytes, tmp_name: str) -> None:
    tmp = path.with_name(tmp_name)
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
