"""The embedded registry store: a snapshot and a journal under the data dir, shared by a host's workers.

The registry is ``state/registry.json`` (the *snapshot*) plus ``state/registry.json.journal``,
the changes made since the snapshot was written, one JSON record a line. Together they hold the
registry documents (``servable/*``, ``contract/*`` and the *shared* part of ``metrics/*``:
createdAtMS, becameValidAtMS, performanceMetrics), a ``version`` bumped by every change of those
documents, and what each process keeps for itself: ``counters`` (``<fqrv>@<replica>`` ->
``[scoreCount, shadeCount, ...]``) and ``routing`` (``<contract>@<replica>`` -> router state). A
gateway of one process is replica ``w0``; ``forestflow serve --workers N`` runs ``w0`` ..
``w<N-1>``, so a restart gives each worker its own counters and router position back.

A write costs what it changes, not the size of the registry (with 10,000 releases rewriting the
whole file on every deploy took seconds): under an exclusive ``flock`` on a sibling lock file the
writer reads the journal records other processes appended since its last look, applies its batch
to the registry it keeps in memory, and appends the entries that changed as one record, fsynced.
When the journal outgrows the snapshot (and :data:`COMPACT_MIN_BYTES`) the writer compacts: a new
snapshot of the next *generation* (temporary file, fsync, rename) and then an empty journal of
that generation. The journal's first line names its generation; a journal of another generation
(a crash between the two renames) is already in the snapshot and is ignored. A record cut short
by a crash (no newline, or not JSON) ends the journal: readers ignore it, the next writer cuts it off.

Followers (:meth:`FileStore.watch`) stat both files every ``sync_interval_s`` and, when they
changed, read only the journal's new tail (the whole registry again only after a compaction),
refresh the peers' counters and call back if the version moved past what they loaded: the same
contract :class:`~forestflow.registry.redis_store.RedisStore` offers replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Awaitable, Callable, Iterator
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
#: The journal is compacted into a new snapshot once it is larger than the snapshot and this.
COMPACT_MIN_BYTES = 1 << 20

#: The journal record's sections, by the name of the registry part each changes.
_SECTIONS = {"d": "documents", "c": "counters", "r": "routing"}


@dataclass(slots=True)
class _Contents:
    """What the snapshot and its journal hold."""

    version: int = 0
    documents: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, list[int]] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)
    #: The snapshot's generation; only a journal of the same generation applies to it.
    generation: int = 0
    #: Every replica id a counter or router field has named (a superset: ids are never removed), so
    #: deleting one release's fields looks up ``<name>@<id>`` for each instead of scanning them all.
    replicas: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Position:
    """Where this process is in the files: what it read of them, and their identities then."""

    snapshot: tuple[int, int, int] | None = None
    journal_ino: int | None = None
    #: The end of the last whole record read from the journal (0: nothing read, not even the header).
    offset: int = 0
    #: The journal's generation matched the snapshot's (a stale journal is not read).
    journal_valid: bool = False
    snapshot_size: int = 0


class FileStore:
    """A :class:`~forestflow.registry.store.Store` in a snapshot and a journal, safe for several processes."""

    def __init__(self, path: Path, replica_id: str = "w0", sync_interval_s: float = 0.25, replicas: int = 1) -> None:
        self.path = path
        self.journal_path = journal_path(path)
        self.lock_path = path.with_name(f"{path.name}.lock")
        self.replica_id = replica_id
        #: The replicas of the gateway now running: ``w0`` .. ``w<replicas-1>``.
        self.replicas = replicas
        self._retired = False
        self.sync_interval_s = sync_interval_s
        #: The registry version this process has loaded (or written on top of).
        self.version = 0
        #: The registry as of the last look at the files (only touched under ``_lock``).
        self._contents = _Contents()
        self._position = _Position()
        #: The documents as this process last loaded or wrote them (what its metrics writes diff against).
        self._known: dict[str, Any] = {}
        #: Documents other processes changed since ``_known`` was last brought up to date.
        self._unseen: set[str] = set()
        self._peer_counts: dict[str, tuple[int, ...]] = {}
        self._seen_stat: tuple[Any, ...] | None = None
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
        docs: dict[str, Any] = await self._locked(self._load_locked)
        return docs

    async def apply(self, changes: dict[str, Any | None]) -> None:
        """Write a batch under the file lock; bump the version when registry documents changed."""
        await self._locked(self._apply_locked, changes)

    async def close(self) -> None:
        """Stop following the files."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _locked(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work`` in a worker thread, one at a time in this process."""
        async with self._lock:
            job = asyncio.ensure_future(asyncio.to_thread(work, *args))
            try:
                return await asyncio.shield(job)
            except asyncio.CancelledError:
                # A cancelled caller must not release the lock while the thread still works on the
                # files and this process's view of them: the next call would race it.
                await asyncio.wait([job])
                raise

    # ---- shared use -------------------------------------------------------------------------------
    def watch(self, on_change: Callable[[], Awaitable[None]]) -> None:
        """Follow the files: ``on_change()`` is awaited when another process changed the registry."""
        self._on_change = on_change
        self._task = asyncio.create_task(self._follow(), name="file-store-follow")

    def peer_counters(self, fqrv: FQRV) -> tuple[int, ...]:
        """The counters (:data:`~forestflow.registry.store.COUNTERS` order) summed over the other
        processes, as of the last look."""
        return self._peer_counts.get(str(fqrv), NO_COUNTS)

    async def check(self) -> None:
        """One look at the files: refresh the peers' counters; call back if the registry moved."""
        stat = _stats(self.path, self.journal_path)
        if stat == self._seen_stat or stat == (None, None):
            return
        version = await self._locked(self._check_locked)
        if version != self.version and self._on_change is not None:
            await self._on_change()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.check()
            except Exception:  # a bad round must not end following
                log.exception("registry_file_check_failed", path=str(self.path))

    # ---- work under the file lock (worker threads) ------------------------------------------------
    @contextlib.contextmanager
    def _file_lock(self, mode: int) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+b") as lock:
            fcntl.flock(lock, mode)  # released when the file closes
            yield

    def _check_locked(self) -> int:
        with self._file_lock(fcntl.LOCK_SH):
            self._seen_stat = _stats(self.path, self.journal_path)
            self._unseen |= self._catch_up()
        return self._contents.version

    def _load_locked(self) -> dict[str, Any]:
        with self._file_lock(fcntl.LOCK_SH):
            self._seen_stat = _stats(self.path, self.journal_path)
            self._catch_up()
        contents = self._contents
        self.version = contents.version
        self._known = dict(contents.documents)
        self._unseen = set()
        own, _ = split_counters(contents.counters.items(), self.replica_id)
        out = dict(contents.documents)
        for key, doc in contents.documents.items():
            if key.startswith("metrics/"):
                out[key] = {**doc, **counters_doc(own.get(key.removeprefix("metrics/"), NO_COUNTS))}
        suffix = "@" + self.replica_id
        for field_name, state in contents.routing.items():
            if field_name.endswith(suffix):
                out[f"routing/{field_name.removesuffix(suffix)}"] = state
        return out

    def _apply_locked(self, changes: dict[str, Any | None]) -> None:
        with self._file_lock(fcntl.LOCK_EX):
            self._unseen |= self._catch_up(writing=True)
            contents = self._contents
            loaded_version = contents.version
            record = _Record(self)
            self._merge(record, changes)
            if record.documents_changed:
                contents.version += 1
            if record.entries:
                self._append({"v": contents.version, **record.entries})
            written = _stats(self.path, self.journal_path)  # under the lock: what this process wrote
        for key in self._unseen | set(record.entries.get("d", ())):
            doc = contents.documents.get(key)
            if doc is None:
                self._known.pop(key, None)
            else:
                self._known[key] = doc
        self._unseen = set()
        # Claim the new version only when nothing else happened in between; otherwise the next
        # check sees a version this process has not loaded, and reloads.
        if loaded_version == self.version:
            self.version = contents.version
            self._seen_stat = written  # nothing in it to follow: the next check need not look

    def _catch_up(self, *, writing: bool = False) -> set[str]:
        """Bring ``_contents`` to the files (a lock held): the journal's new records, or everything
        after a compaction. Returns the documents that changed. A writer cuts off a torn tail and
        replaces a journal of another generation, so that its record follows the last whole one."""
        pos = self._position
        try:
            snapshot = _stat(self.path)
        except FileNotFoundError:
            snapshot = None
        changed: set[str] = set()
        if snapshot != pos.snapshot:
            previous = self._contents.documents
            self._contents = _read_snapshot(self.path)
            pos.snapshot, pos.snapshot_size = snapshot, (snapshot[1] if snapshot else 0)
            pos.journal_ino, pos.offset, pos.journal_valid = None, 0, False
            documents = self._contents.documents
            changed = {k for k in previous.keys() | documents.keys() if previous.get(k) != documents.get(k)}
            self._peer_counts = split_counters(self._contents.counters.items(), self.replica_id)[1]
        try:
            fh = open(self.journal_path, "r+b" if writing else "rb")
        except FileNotFoundError:
            if writing:
                self._new_journal()
            return changed
        with fh:
            ino = os.fstat(fh.fileno()).st_ino
            if ino != pos.journal_ino:
                pos.journal_ino, pos.offset = ino, 0
                header = fh.readline()
                pos.journal_valid = header.endswith(b"\n") and _generation(header) == self._contents.generation
                if pos.journal_valid:
                    pos.offset = len(header)
            if pos.journal_valid:
                fh.seek(pos.offset)
                tail = fh.read()
                used = 0
                while (end := tail.find(b"\n", used)) >= 0:
                    try:
                        entry = orjson.loads(tail[used:end])
                    except orjson.JSONDecodeError:
                        break  # a record cut short by a crash: the journal ends before it
                    used = end + 1
                    changed |= self._replay(entry)
                pos.offset += used
                if writing and used < len(tail):
                    log.warning("registry_journal_torn_tail_dropped", path=str(self.journal_path), bytes=len(tail) - used)
                    fh.truncate(pos.offset)
                    os.fsync(fh.fileno())
        if writing and not pos.journal_valid:
            self._new_journal()
        return changed

    def _replay(self, entry: dict[str, Any]) -> set[str]:
        contents = self._contents
        contents.version = int(entry.get("v", contents.version))
        for short, values in entry.items():
            if short in ("d", "r"):
                target = contents.documents if short == "d" else contents.routing
                for key, value in values.items():
                    if value is None:
                        target.pop(key, None)
                    else:
                        target[key] = value
                        if short == "r":
                            contents.replicas.add(key.rpartition("@")[2])
            elif short == "c":
                for key, value in values.items():
                    self._set_counter(key, value)
        return set(entry.get("d", ()))

    def _set_counter(self, field_name: str, values: list[int] | None) -> None:
        """Set (None: drop) one per-process counter field, keeping the peers' sums in step."""
        counters = self._contents.counters
        old = counters.pop(field_name, None)
        fqrv, _, replica = field_name.rpartition("@")
        if values is not None:
            counters[field_name] = values
            self._contents.replicas.add(replica)
        if replica != self.replica_id:
            total = self._peer_counts.get(fqrv, NO_COUNTS)
            if old is not None:
                total = add_counters(total, [-int(v) for v in old])
            if values is not None:
                total = add_counters(total, values)
            self._peer_counts[fqrv] = total

    def _append(self, entry: dict[str, Any]) -> None:
        """Append one record to the journal (fsynced); compact when the journal outgrew the snapshot."""
        line = orjson.dumps(entry) + b"\n"
        pos = self._position
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        pos.offset += len(line)
        if pos.offset > max(COMPACT_MIN_BYTES, pos.snapshot_size):
            self._compact()

    def _compact(self) -> None:
        """A new snapshot of the next generation, then an empty journal of it (a lock held)."""
        contents = self._contents
        contents.generation += 1
        payload = orjson.dumps(
            {
                "format": FORMAT,
                "generation": contents.generation,
                "version": contents.version,
                "documents": contents.documents,
                "counters": contents.counters,
                "routing": contents.routing,
            },
            option=orjson.OPT_SORT_KEYS,
        )
        _atomic_write(self.path, payload, f".{self.path.name}.{self.replica_id}.tmp")
        pos = self._position
        pos.snapshot = _stat(self.path)
        pos.snapshot_size = len(payload)
        self._new_journal()

    def _new_journal(self) -> None:
        """An empty journal of the snapshot's generation, replacing whatever journal was there."""
        header = orjson.dumps({"generation": self._contents.generation}) + b"\n"
        _atomic_write(self.journal_path, header, f".{self.journal_path.name}.{self.replica_id}.tmp")
        pos = self._position
        pos.journal_ino, pos.offset, pos.journal_valid = _stat(self.journal_path)[2], len(header), True

    def _merge(self, record: _Record, changes: dict[str, Any | None]) -> None:
        """Apply ``changes`` to the registry, noting in ``record`` what changed."""
        contents = self._contents
        docs, counters, routing = contents.documents, contents.counters, contents.routing
        if not self._retired and self.replica_id == "w0":
            self._retire_gone_replicas(record)
        for key, doc in changes.items():
            kind, _, name = key.partition("/")
            if kind == "routing":
                if doc is None:  # the contract is gone: every process's router state with it
                    for field_name in self._fields(routing, name):
                        record.put("r", field_name, None)
                else:
                    record.put("r", f"{name}@{self.replica_id}", doc)
            elif kind == "metrics" and doc is not None:
                servable = f"servable/{name}"
                if servable not in docs and changes.get(servable) is None:
                    continue  # deleted meanwhile: do not bring its counters back
                record.put("c", f"{name}@{self.replica_id}", counters_of(doc))
                merged = merge_shared_metrics(docs.get(key), self._known.get(key), doc)
                record.put("d", key, merged)
            elif doc is None:
                if kind == "metrics":
                    for field_name in self._fields(counters, name):
                        record.put("c", field_name, None)
                record.put("d", key, None)
            else:
                record.put("d", key, doc)

    def _fields(self, fields: dict[str, Any], name: str) -> list[str]:
        """The fields ``<name>@<replica>`` of every replica (each one looked up, none scanned)."""
        return [f for replica in sorted(self._contents.replicas) if (f := f"{name}@{replica}") in fields]

    def _retire_gone_replicas(self, record: _Record) -> None:
        """Fold the counters of replicas not running now into this one's; drop their router state."""
        live = {f"w{i}" for i in range(self.replicas)}
        counters = self._contents.counters
        for field_name in [f for f in counters if f.rpartition("@")[2] not in live]:
            mine = f"{field_name.rpartition('@')[0]}@{self.replica_id}"
            gone = counters[field_name]
            record.put("c", field_name, None)
            record.put("c", mine, list(add_counters(add_counters(NO_COUNTS, counters.get(mine, ())), gone)))
        for field_name in [f for f in self._contents.routing if f.rpartition("@")[2] not in live]:
            record.put("r", field_name, None)


class _Record:
    """One journal record in the making: each entry is applied to the registry as it is put."""

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self.entries: dict[str, dict[str, Any]] = {}
        self.documents_changed = False

    def put(self, section: str, key: str, value: Any) -> None:
        """Set (None: delete) one entry of a section (``d`` documents, ``c`` counters, ``r`` routing)."""
        contents = self.store._contents
        if value is not None and section != "c":
            value = orjson.loads(orjson.dumps(value))  # the registry's own copy, as it is read back
        if section == "c":
            if contents.counters.get(key) == value:
                return
            self.store._set_counter(key, value)
        else:
            target = contents.documents if section == "d" else contents.routing
            if target.get(key) == value:
                return
            if value is None:
                del target[key]
            else:
                target[key] = value
                if section == "r":
                    contents.replicas.add(key.rpartition("@")[2])
            self.documents_changed |= section == "d"
        self.entries.setdefault(section, {})[key] = value


def journal_path(path: Path) -> Path:
    """The journal beside a registry snapshot."""
    return path.with_name(f"{path.name}.journal")


def read_registry(path: Path) -> dict[str, Any]:
    """The registry documents of a snapshot and its journal (read-only, e.g. to count what it holds)."""
    if _stats(path, journal_path(path)) == (None, None):
        return {}
    store = FileStore(path)
    with store._file_lock(fcntl.LOCK_SH):
        store._catch_up()
    return store._contents.documents


def compact(path: Path) -> None:
    """Fold the journal into the snapshot, leaving an empty journal (e.g. before moving the file)."""
    store = FileStore(path)
    with store._file_lock(fcntl.LOCK_EX):
        store._catch_up(writing=True)
        store._compact()


def _read_snapshot(path: Path) -> _Contents:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return _Contents()
    if data.get("format", 1) < FORMAT:
        return _from_single_process_format(data.get("documents", {}))
    counters, routing = data.get("counters", {}), data.get("routing", {})
    return _Contents(
        int(data.get("version", 0)),
        data.get("documents", {}),
        counters,
        routing,
        int(data.get("generation", 0)),
        {f.rpartition("@")[2] for fields in (counters, routing) for f in fields},
    )


def _generation(header: bytes) -> int | None:
    try:
        doc = orjson.loads(header)
    except orjson.JSONDecodeError:
        return None
    value = doc.get("generation") if isinstance(doc, dict) else None
    return value if isinstance(value, int) else None


def _from_single_process_format(documents: dict[str, Any]) -> _Contents:
    """A registry written before workers existed (format 1): its counters and router state become w0's."""
    contents = _Contents(replicas={"w0"})
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
    """What tells one version of a file from the next."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _stats(*paths: Path) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            out.append(_stat(path))
        except FileNotFoundError:
            out.append(None)
    return tuple(out)


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
