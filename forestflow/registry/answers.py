"""Which release answered a recent request: the index reward feedback is joined through.

Every answered request is remembered (request id -> contract, release, the prediction log key,
when) in a bounded, time-limited map in process memory; that is all a single gateway needs.
Processes that share a registry share this index too, so feedback may reach any of them:

- replicas on Redis (:class:`RedisAnswers`): one key per answer with the feedback TTL, written in
  batches by a gateway timer every :data:`SHARE_EVERY_S` (requests never wait on Redis);
- ``--workers N`` on the file store (:class:`FileAnswers`): each worker appends its answers to
  its own file under ``<data_dir>/state/answers/`` in the same batches; a worker that does not
  know an id reads the other workers' files.

A feedback that arrives at another process before the batch holding its answer was written
looks again, up to three batch intervals later.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import structlog

from forestflow.core.ids import FQRV, Contract
from forestflow.errors import InvalidInput, StoreUnavailable

log = structlog.get_logger("forestflow.feedback")

#: How often remembered answers are written to the shared index.
SHARE_EVERY_S = 0.02
#: How many more looks (one batch interval apart) an id unknown to the shared index gets.
LOOK_AGAIN = 3


#: No key values: an answer of a release that logs nothing, or of a request without its key features.
NO_KEY_VALUES: tuple[str | None, ...] = ()


@dataclass(slots=True)
class Answered:
    """The answer a feedback refers to.

    The request's configs that make its prediction log key (the feedback event has the same key) are kept as
    the key features of the answering release's logging settings (their own tuple, shared by every answer)
    and the request's value of each: the value itself for one feature (the usual key), else a tuple, None where
    the request had none. Index entries live for ``feedback_index_size`` requests (100,000 by default), and a
    dict per answer held that long cost ~1.6% of a 100-row ``/score`` request's CPU (bench/logging_cost.py,
    2026-11-27): the value is an object the request already made. :attr:`key_configs` rebuilds the dict.
    """

    fqrv: FQRV
    key_features: tuple[str, ...]
    key_values: str | tuple[str | None, ...] | None
    at_ms: int
    pinned: bool = False

    @classmethod
    def of(cls, fqrv: FQRV, key_features: tuple[str, ...], configs: dict[str, str], at_ms: int, pinned: bool = False) -> Answered:
        """The answer of ``fqrv`` to a request with ``configs``, keyed by ``key_features``."""
        values: str | tuple[str | None, ...] | None
        if len(key_features) == 1:  # the usual key: the request's own str
            values = configs.get(key_features[0])
        else:
            values = tuple(map(configs.get, key_features)) if key_features else NO_KEY_VALUES
        return cls(fqrv, key_features, values, at_ms, pinned)

    @property
    def key_configs(self) -> dict[str, str]:
        """The request's ``configs`` for the key features it was answered with (those it had)."""
        values = self.key_values
        if isinstance(values, tuple):
            return {name: value for name, value in zip(self.key_features, values, strict=False) if value is not None}
        return {self.key_features[0]: values} if values is not None else {}

    def to_bytes(self, request_id: str | None = None) -> bytes:
        """The shared form: a JSON array (led by ``request_id`` when given)."""
        fields = [str(self.fqrv.contract), self.fqrv.release, self.key_configs, self.at_ms, self.pinned]
        return orjson.dumps(fields if request_id is None else [request_id, *fields])

    @classmethod
    def from_bytes(cls, raw: bytes | str, with_id: bool = False) -> Answered:
        """Inverse of :meth:`to_bytes` (ValueError when it is not one)."""
        fields = orjson.loads(raw)
        contract, release, key_configs, at_ms, pinned = fields[1:] if with_id else fields
        configs = {str(k): str(v) for k, v in key_configs.items()} if isinstance(key_configs, dict) else {}
        try:
            fqrv = FQRV(Contract.parse(str(contract)), str(release))
        except InvalidInput as error:
            raise ValueError(error.message) from None
        return cls.of(fqrv, tuple(configs), configs, int(at_ms), bool(pinned))


class SharedAnswers(Protocol):
    """Where processes sharing a registry put their answers for one another."""

    async def put(self, entries: list[tuple[str, Answered]], ttl_s: float) -> None:
        """Store a batch of answers by request id."""
        ...

    async def get(self, request_id: str) -> Answered | None:
        """An answer another process stored (None when unknown)."""
        ...


class AnsweredIndex:
    """Recent answers by request id: bounded (oldest out first) and expiring after ``ttl_s``."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], int], shared: SharedAnswers | None = None) -> None:
        self.capacity = capacity
        self.ttl_ms = int(ttl_s * 1000)
        self.clock = clock
        self.shared = shared
        self._recent: OrderedDict[str, Answered] = OrderedDict()
        self._outgoing: list[tuple[str, Answered]] = []

    def remember(self, request_id: str, answered: Answered) -> None:
        """Note who answered ``request_id`` (on the request path: memory only)."""
        recent = self._recent
        recent[request_id] = answered
        if len(recent) > self.capacity:
            recent.popitem(last=False)
        if self.shared is not None:
            self._outgoing.append((request_id, answered))

    def alias(self, request_id: str, known_id: str) -> None:
        """Remember the answer to ``known_id`` under ``request_id`` too (a V2 body's own ``id``
        beside the ``X-Request-Id`` the answer carries)."""
        answered = self._recent.get(known_id)
        if answered is not None and request_id != known_id:
            self.remember(request_id, answered)

    async def lookup(self, request_id: str) -> Answered | None:
        """Who answered ``request_id`` (None when unknown here and in the shared index, or expired)."""
        found = self._recent.get(request_id)
        if found is None and self.shared is not None:
            found = await self._shared_get(self.shared, request_id)
            for _ in range(LOOK_AGAIN):  # another process may not have written its latest batch yet
                if found is not None:
                    break
                await asyncio.sleep(SHARE_EVERY_S)
                found = await self._shared_get(self.shared, request_id)
        if found is None or self.clock() - found.at_ms > self.ttl_ms:
            return None
        return found

    @staticmethod
    async def _shared_get(shared: SharedAnswers, request_id: str) -> Answered | None:
        """An answer of the shared index; 503 when the index cannot be read, None for what does not parse."""
        try:
            return await shared.get(request_id)
        except (ValueError, TypeError):
            return None
        except Exception as exc:
            raise StoreUnavailable(f"the shared answers index is unavailable: {exc}; try again") from exc

    async def share(self) -> None:
        """Write the answers remembered since the last call to the shared index (the gateway's
        timer, every :data:`SHARE_EVERY_S`, and once more at stop)."""
        if self.shared is None or not self._outgoing:
            return
        batch, self._outgoing = self._outgoing, []
        try:
            await self.shared.put(batch, self.ttl_ms / 1000)
        except Exception as exc:  # Redis away, disk full: feedback for these answers will be a 404
            log.warning("answers_not_shared", answers=len(batch), error=repr(exc))


class RedisAnswers:
    """The shared index in Redis: ``<namespace>:answer:<request id>`` with the feedback TTL."""

    def __init__(self, client: Any, namespace: str = "forestflow") -> None:
        self.client = client
        self.prefix = f"{namespace}:answer:"

    async def put(self, entries: list[tuple[str, Answered]], ttl_s: float) -> None:
        """One pipeline for the batch."""
        ttl_ms = max(1, int(ttl_s * 1000))
        async with self.client.pipeline(transaction=False) as pipe:
            for request_id, answered in entries:
                pipe.set(self.prefix + request_id, answered.to_bytes(), px=ttl_ms)
            await pipe.execute()

    async def get(self, request_id: str) -> Answered | None:
        """GET the answer (Redis expires old ones)."""
        raw = await self.client.get(self.prefix + request_id)
        return Answered.from_bytes(raw) if raw else None


class FileAnswers:
    """The shared index of a host's workers: one append-only file per worker, rotated when full.

    A worker's file holds at most ``capacity`` answers before it becomes ``<replica>.old`` (the
    previous one dropped), so each worker keeps between ``capacity`` and ``2 * capacity`` answers.
    """

    def __init__(self, directory: Path, replica_id: str, capacity: int) -> None:
        self.directory = directory
        self.replica_id = replica_id
        self.capacity = capacity
        self.path = directory / f"{replica_id}.log"
        self._written: int | None = None

    async def put(self, entries: list[tuple[str, Answered]], ttl_s: float) -> None:
        """Append the batch to this worker's file (in a thread)."""
        lines = b"".join(answered.to_bytes(request_id) + b"\n" for request_id, answered in entries)
        await asyncio.to_thread(self._append, lines, len(entries))

    def _append(self, lines: bytes, count: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._written is None:  # a restarted worker goes on with the file it left
            try:
                self._written = self.path.read_bytes().count(b"\n")
            except FileNotFoundError:
                self._written = 0
        if self._written + count > self.capacity:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.path, self.path.with_suffix(".old"))
            self._written = 0
        with open(self.path, "ab") as fh:
            fh.write(lines)
        self._written += count

    async def get(self, request_id: str) -> Answered | None:
        """Search the other workers' files, newest answers first."""
        return await asyncio.to_thread(self._search, request_id)

    def _search(self, request_id: str) -> Answered | None:
        needle = b"\n" + orjson.dumps([request_id])[:-1] + b","
        own = {self.path.name, self.path.with_suffix(".old").name}
        try:
            names = sorted(p for p in os.listdir(self.directory) if p not in own)
        except FileNotFoundError:
            return None
        for name in sorted(names, key=lambda n: n.endswith(".old")):  # current files first
            try:
                data = b"\n" + (self.directory / name).read_bytes()
            except FileNotFoundError:
                continue
            at = data.rfind(needle)
            if at < 0:
                continue
            end = data.find(b"\n", at + 1)
            line = data[at + 1 : end if end >= 0 else len(data)]
            try:
                return Answered.from_bytes(line, with_id=True)
            except (ValueError, TypeError):  # orjson.JSONDecodeError is a ValueError
                continue
        return None
