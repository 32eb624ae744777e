"""The Kafka sink: prediction events produced with aiokafka, every delivery confirmed or handed back.

``send`` produces a batch of entries (GraphPipe ones to the GraphPipe topic, the rest to the basic
topic, each with its key), waits for the broker's acknowledgement of each, and returns the entries
whose delivery was not confirmed so the :class:`~forestflow.predlog.log.PredictionLog` retries them.
Every wait is bounded by the request timeout (plus a small margin): aiokafka's own ``send()``
waits for metadata and for room in its batch, and an idempotent producer never gives up on a batch
while the broker is away, so without that bound a dead broker would stall the drain task forever.

When a batch fails, whatever the producer still holds is discarded on the spot (its sender task
is stopped, its batches failed and unqueued) before the entries are handed back, so the old
producer cannot deliver them later behind our back while the log retries them through a new one: a broker that was cleanly
down never sees an entry twice. (A produce request already on the wire when the connection died
may or may not have been written; that ambiguity is Kafka's at-least-once and cannot be removed
without the idempotent producer across restarts.) ``start`` always builds a fresh producer, and
``close`` discards rather than flushes, for the same reason: by the time the log closes its sink,
everything it still cares about has either been confirmed or been counted.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, attrgetter
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import MessageAccumulator, MessageBatch
from aiokafka.producer.sender import Sender
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from forestflow.kafka_checks import check_idempotence
from forestflow.predlog.kafka_batch import RecordBatch
from forestflow.predlog.log import EVENT_OVERHEAD_BYTES, LogEntry

log = structlog.get_logger("forestflow.predlog.kafka")

#: Added to the request timeout for every bounded wait (connect, one batch, close).
_MARGIN_S = 1.0
#: aiokafka's own default partitioner: a key goes to the partition ``send()`` would have chosen.
_PARTITIONER = DefaultPartitioner()
#: Record batches of up to this many bytes as sent, compressed (aiokafka's default is 16 KiB); below Kafka's
#: default message.max.bytes of 1 MiB, which the broker checks against the batch as sent.
_BATCH_BYTES = 512 * 1024
#: With compression on, a record batch holds up to this many times ``_BATCH_BYTES`` of records before
#: compression: a topic's batches are cut at ``_RATIO_HEADROOM`` of the ratio its last batch compressed by.
#: Each record batch is a produce round trip of its own (aiokafka sends a partition's batches one at a time;
#: a send of one record batch to the test broker cost ~1.3 ms of CPU besides packing it): cut at 512 KiB
#: before compression, 500 100-row GraphPipe events made 7 of them per send, and their produce path cost
#: 2.7% of each request (bench/logging_cost.py, 2026-11-27).
_MOST_RATIO, _RATIO_HEADROOM = 8.0, 0.75
#: Bytes of a record batch's header, and the most a record adds to its key and value (attributes,
#: timestamp and offset deltas, three length varints, the header count).
_BATCH_HEADER, _RECORD_OVERHEAD = 61, 24
#: Compression codecs of the producer (lz4 and zstd come from cramjam, a runtime dependency).
COMPRESSIONS = ("none", "gzip", "lz4", "zstd")
#: Keys whose partition is remembered per topic (murmur2 in Python costs ~3 us a key, and the
#: keys of a prediction log repeat: the same customer, model or region values).
_PARTITION_CACHE_KEYS = 4096
_GRAPHPIPE, _SIZE, _KEY = attrgetter("graphpipe"), attrgetter("size"), attrgetter("key")
#: Upper bound for stopping a producer (it holds nothing we still want at that point).
_CLOSE_TIMEOUT_S = 5.0


class KafkaInternalsChanged(RuntimeError):
    """The installed aiokafka lacks a private attribute the sink relies on (one line saying which)."""


#: The private parts of aiokafka that :meth:`KafkaSink._discard_pending` uses, as (owner, attribute
#: names assigned in its ``__init__`` or defined on the class). Without them a failed batch could
#: not be discarded and would be delivered twice; pyproject pins the aiokafka range they hold in.
_INTERNALS: tuple[tuple[type, tuple[str, ...], tuple[str, ...]], ...] = (
    (AIOKafkaProducer, ("_sender", "_message_accumulator", "client"), ("send_batch", "create_batch", "partitions_for")),
    (Sender, (), ("sender_task",)),
    (MessageAccumulator, ("_batches", "_pending_batches"), ("fail_all",)),
    (MessageBatch, ("future", "_msg_futures", "_drain_waiter"), ()),
)


def check_aiokafka() -> None:
    """Raise :class:`KafkaInternalsChanged` unless aiokafka has what the sink needs to never send twice."""
    import aiokafka

    for owner, assigned, defined in _INTERNALS:
        names = owner.__init__.__code__.co_names  # type: ignore[misc]  # a class's own __init__, a function
        missing = [n for n in assigned if n not in names] + [n for n in defined if not hasattr(owner, n)]
        if missing:
            raise KafkaInternalsChanged(
                f"aiokafka {aiokafka.__version__} lacks {owner.__name__}.{missing[0]}, which the Kafka prediction "
                "log needs to never deliver an event twice; install the aiokafka version pyproject.toml names"
            )


def _consume_exception(fut: asyncio.Future[Any]) -> None:
    # Mark a discarded delivery future's exception as seen so asyncio does not log it.
    if not fut.cancelled():
        fut.exception()


class KafkaSink:
    """A :class:`~forestflow.predlog.log.Sink` that writes to two Kafka topics with aiokafka."""

    name = "kafka"
    #: Records carry CloudEvents binary-mode headers (predlog/cloudevents.py).
    cloudevents = True

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        gp_topic: str,
        *,
        compression: str = "zstd",
        acks: str = "all",
        enable_idempotence: bool = True,
        request_timeout_ms: int = 10000,
        max_request_size: int = 1024 * 1024,
        client_id: str = "forestflow-predlog",
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"kafka compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        if acks not in ("0", "1", "all"):
            raise ValueError(f"kafka acks must be 0, 1 or all, got {acks!r}")
        if enable_idempotence and acks != "all":
            raise ValueError(f"the idempotent producer needs acks=all, got acks={acks}")
        check_aiokafka()
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.gp_topic = gp_topic
        self.compression = compression
        self.acks = acks
        self.enable_idempotence = enable_idempotence
        self.request_timeout_ms = request_timeout_ms
        self.max_request_size = max_request_size
        self.client_id = client_id
        #: Longest one ``send`` call may take before unconfirmed entries are handed back.
        self.delivery_timeout_s = request_timeout_ms / 1000 + _MARGIN_S
        #: Events the producer refused outright as too large; they can never be delivered, so
        #: they are not handed back (that would retry them forever) but counted here.
        self.rejected = 0
        #: What went wrong with the last batch that was not confirmed (the prediction log shows it).
        self.last_error: str | None = None
        self._producer: AIOKafkaProducer | None = None
        self._broken = False
        #: Whether the broker was seen to grant a producer id (asked once, before the first producer).
        self._idempotence_checked = False
        #: topic -> (its partitions, key -> partition) while that partition list holds.
        self._partition_of: dict[str, tuple[list[int], dict[bytes, int]]] = {}
        #: The most bytes of one record batch as sent (compressed).
        self._batch_bytes = min(_BATCH_BYTES, max_request_size)
        #: topic -> how many times smaller its last record batch came out of compression (1 without).
        self._ratio: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> KafkaSink:
        """A sink configured from the gateway's ``kafka_*`` settings."""
        return cls(
            settings.kafka_bootstrap_servers,
            settings.kafka_topic,
            settings.kafka_gp_topic,
            compression=settings.kafka_compression,
            acks=settings.kafka_acks,
            enable_idempotence=settings.kafka_enable_idempotence,
            request_timeout_ms=settings.kafka_request_timeout_ms,
        )

    @property
    def connected(self) -> bool:
        """Whether a started producer is ready for the next batch."""
        return self._producer is not None and not self._broken

    def _new_producer(self) -> AIOKafkaProducer:
        acks: int | str = "all" if self.acks == "all" else int(self.acks)
        return AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=self.client_id,
            acks=acks,
            compression_type=None if self.compression == "none" else self.compression,
            # The prediction log gathers events for log_linger_ms and hands over whole record
            # batches: a producer linger on top would only hold each one back.
            linger_ms=0,
            enable_idempotence=self.enable_idempotence,
            request_timeout_ms=self.request_timeout_ms,
            max_request_size=self.max_request_size,
        )

    async def start(self) -> None:
        """Connect a fresh producer (any previous one is discarded); raises if the broker is away,
        and :class:`~forestflow.kafka_checks.IdempotenceRefused` if it lacks the idempotent producer."""
        await self.close()
        if self.enable_idempotence and not self._idempotence_checked:
            await check_idempotence(self.bootstrap_servers, self.request_timeout_ms / 1000 + _MARGIN_S)
            self._idempotence_checked = True
        producer = self._new_producer()
        try:
            await asyncio.wait_for(producer.start(), self.request_timeout_ms / 1000 + _MARGIN_S)
        except BaseException:
            await self._shutdown(producer)
            raise
        self._producer = producer
        self._broken = False

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        """Produce ``entries``; return those whose delivery was not confirmed, in their order.

        Entries are packed into one record batch per topic partition (aiokafka's batch API: one
        delivery future per batch instead of a coroutine and a future per event; the batch written
        whole by :class:`~forestflow.predlog.kafka_batch.RecordBatch`), partitioned by key exactly as
        aiokafka's default partitioner does for ``send()``.
        """
        producer = self._producer
        if producer is None or self._broken:
            return list(entries)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.delivery_timeout_s
        pending: list[tuple[list[LogEntry], asyncio.Future[Any]]] = []
        handed: set[int] = set()  # ids of the entries given to the producer
        # ids of the entries too large to ever be sent (counted in ``rejected``): filled as _pack
        # goes, so a later timeout inside it does not hand a counted one back too.
        refused: set[int] = set()
        error: BaseException | None = None
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    packed = await self._pack(producer, entries, refused)
                    for (topic, partition), builder, members in packed:
                        fut = await producer.send_batch(builder, topic, partition=partition)
                        pending.append((members, fut))
                        handed.update(map(id, members))
            except Exception as exc:  # TimeoutError included: a cancelled send_batch() did not queue its batch
                error = exc
            if pending:
                await asyncio.wait([fut for _, fut in pending], timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            # The log is shutting down and counts these entries as not delivered: make sure the
            # producer does not deliver them anyway.
            self._discard_pending(producer, [fut for _, fut in pending])
            raise

        def confirmed(fut: asyncio.Future[Any]) -> bool:
            return fut.done() and not fut.cancelled() and fut.exception() is None

        unconfirmed = {id(e) for members, fut in pending if not confirmed(fut) for e in members}
        if error is None and not unconfirmed:
            return []
        self._broken = True
        self._discard_pending(producer, [fut for _, fut in pending])
        if error is None:
            error = next(
                (fut.exception() for _, fut in pending if fut.done() and not confirmed(fut) and not fut.cancelled()), None
            )
        failed = [e for e in entries if id(e) in unconfirmed or (id(e) not in handed and id(e) not in refused)]
        self.last_error = repr(error) if error is not None else "not confirmed in time"
        log.warning(
            "prediction_log_kafka_delivery_failed",
            failed=len(failed),
            batch=len(entries),
            error=repr(error) if error is not None else "not confirmed in time",
        )
        return failed

    async def _pack(
        self, producer: AIOKafkaProducer, entries: list[LogEntry], refused: set[int]
    ) -> list[tuple[tuple[str, int], Any, list[LogEntry]]]:
        """Record batches ((topic, partition), batch, its entries in order); the ids of entries too
        large to send are added to ``refused`` as they are found (and counted in ``rejected``)."""
        packed = await self._pack_usual(producer, entries)
        if packed is not None:
            return packed
        # Per topic (by entry.graphpipe): its name, its partitions and key cache (as _partitions gives
        # them), that key cache alone, its record batches by partition, each [bytes so far, entries], and
        # where they are cut (:meth:`_room`). Looked up once per topic, not per entry: this loop runs for
        # every event.
        topics: dict[bool, tuple[str, tuple[list[int], dict[bytes, int]], dict[bytes, int], dict[int, list[list[Any]]], int]] = {}
        # Events well under the limit skip the exact estimate (a one-record batch adds under 128 bytes
        # to key and value: 61 of batch header, the rest varints).
        surely_fits = self.max_request_size - 128 + EVENT_OVERHEAD_BYTES  # in entry.size terms
        partition_of = self._partition
        for entry in entries:
            size = entry.size
            if (
                size > surely_fits
                and DefaultRecordBatchBuilder.estimate_size_in_bytes(entry.key, entry.value, []) > self.max_request_size
            ):
                self.rejected += 1
                refused.add(id(entry))
                log.error(
                    "prediction_log_event_too_large",
                    topic=self.gp_topic if entry.graphpipe else self.topic,
                    bytes=len(entry.value),
                    max_request_size=self.max_request_size,
                )
                continue
            state = topics.get(entry.graphpipe)
            if state is None:
                topic = self.gp_topic if entry.graphpipe else self.topic
                known = await self._partitions(producer, topic)
                state = topics[entry.graphpipe] = (topic, known, known[1], {}, self._room(topic))
            _, known, by_key, by_partition, room = state
            key = entry.key
            partition = by_key.get(key) if key is not None else None  # a cached key's partition without a call
            if partition is None:
                partition = partition_of(key, known)
            batches = by_partition.get(partition)
            if batches is None:
                batches = by_partition[partition] = []
            size += _RECORD_OVERHEAD - EVENT_OVERHEAD_BYTES  # key and value bytes, and the record's own
            if not batches or batches[-1][0] + size > room:  # a first record always fits
                batches.append([_BATCH_HEADER, []])
            last = batches[-1]
            last[0] += size
            last[1].append(entry)
        return [
            packed
            for topic, _, _, by_partition, _ in topics.values()
            for partition, batches in by_partition.items()
            for _, members in batches
            for packed in self._record_batches(topic, partition, members)
        ]

    async def _pack_usual(
        self, producer: AIOKafkaProducer, entries: list[LogEntry]
    ) -> list[tuple[tuple[str, int], Any, list[LogEntry]]] | None:
        """:meth:`_pack` of the usual batch without a Python step per entry: every event of one topic (all
        GraphPipe or none), none near the size limit, every key's partition cached and all of them on one
        partition (the loops below run in C). Cut into record batches where the general loop cuts it: a
        batch ends before the event that would take it past :meth:`_room` (found by bisection over the
        running total, a step per record batch). None for any other batch (``_pack`` sorts it)."""
        if not entries:
            return None
        graphpipe = any(map(_GRAPHPIPE, entries))
        if graphpipe and not all(map(_GRAPHPIPE, entries)):
            return None
        sizes = list(map(_SIZE, entries))
        if max(sizes) > self.max_request_size - 128 + EVENT_OVERHEAD_BYTES:
            return None
        topic = self.gp_topic if graphpipe else self.topic
        known = await self._partitions(producer, topic)
        partitions = set(map(known[1].get, map(_KEY, entries)))  # None: a key not cached yet, or no key
        partition = partitions.pop() if len(partitions) == 1 else None
        if partition is None:
            return None
        # ends[k]: the bytes of the first k records (key and value bytes, and each record's own).
        ends = list(accumulate(map(add, sizes, repeat(_RECORD_OVERHEAD - EVENT_OVERHEAD_BYTES)), initial=0))
        room, count = self._room(topic) - _BATCH_HEADER, len(entries)
        if ends[count] <= room:  # the usual batch: one record batch
            return self._record_batches(topic, partition, entries)
        packed: list[tuple[tuple[str, int], Any, list[LogEntry]]] = []
        start = 0
        while start < count:
            # The records after ``start`` while they fit; a first record always does.
            stop = max(start + 1, bisect_right(ends, ends[start] + room, start + 1) - 1)
            packed += self._record_batches(topic, partition, entries[start:stop])
            start = stop
        return packed

    def _room(self, topic: str) -> int:
        """Where ``topic``'s record batches are cut: the most bytes of records (before compression, the batch
        header included) one may hold. ``_batch_bytes`` times what its last batch compressed by, with headroom
        (at least once, at most ``_MOST_RATIO`` times)."""
        ratio = self._ratio.get(topic, 1.0) * _RATIO_HEADROOM
        return int(self._batch_bytes * min(_MOST_RATIO, max(1.0, ratio)))

    def _record_batches(
        self, topic: str, partition: int, members: list[LogEntry]
    ) -> list[tuple[tuple[str, int], Any, list[LogEntry]]]:
        """``members`` as one record batch; as several where it came out of compression over ``_batch_bytes``
        (the topic's events compressing worse than its last batch did): halved until each fits or holds one
        event. Remembers the topic's compression ratio for :meth:`_room`."""
        batch = RecordBatch(members, self.compression)
        size = batch.size()
        self._ratio[topic] = batch.records_bytes / size
        if size <= self._batch_bytes or len(members) == 1:
            return [((topic, partition), batch, members)]
        half = len(members) // 2
        return self._record_batches(topic, partition, members[:half]) + self._record_batches(topic, partition, members[half:])

    async def _partitions(self, producer: AIOKafkaProducer, topic: str) -> tuple[list[int], dict[bytes, int]]:
        """The topic's partitions and its key cache, emptied when the partitions change."""
        current = sorted(await producer.partitions_for(topic))
        cached = self._partition_of.get(topic)
        if cached is None or cached[0] != current:
            cached = self._partition_of[topic] = (current, {})
        return cached

    @staticmethod
    def _partition(key: bytes | None, known: tuple[list[int], dict[bytes, int]]) -> int:
        """The partition aiokafka's default partitioner picks for ``key`` (random when None)."""
        partitions, by_key = known
        if key is None:
            chosen: int = _PARTITIONER(key, partitions, partitions)
            return chosen
        partition = by_key.get(key)
        if partition is None:
            if len(by_key) >= _PARTITION_CACHE_KEYS:
                by_key.clear()
            partition = by_key[key] = _PARTITIONER(key, partitions, partitions)
        return partition

    async def close(self) -> None:
        """Stop the producer within a bounded time, discarding anything it still holds."""
        producer, self._producer = self._producer, None
        self._broken = False
        if producer is not None:
            await self._shutdown(producer)

    # ---- internals --------------------------------------------------------------------------------
    @staticmethod
    def _discard_pending(producer: AIOKafkaProducer, futures: Sequence[asyncio.Future[Any]] = ()) -> None:
        """Make sure nothing this producer still holds is ever sent (aiokafka has no "abort").

        Failing the batches alone is not enough: they stay queued and the sender task would still
        ship them (or re-queue an in-flight one after an error) once the broker answers. So the
        sender task is stopped first, then every batch is failed and taken out of the queue. A
        request already on the wire may still be written; nothing else goes out. The producer is
        unusable afterwards and is replaced on the next start().
        """
        # check_aiokafka() proved at construction that these private attributes exist.
        task = producer._sender.sender_task
        if task is not None and not task.done():
            task.cancel()
        accumulator = producer._message_accumulator
        seen: list[asyncio.Future[Any]] = list(futures)
        if accumulator is not None:
            batches = [b for queue in accumulator._batches.values() for b in queue] + list(accumulator._pending_batches)
            accumulator.fail_all(KafkaConnectionError("delivery not confirmed in time; discarded for retry"))
            accumulator._batches.clear()
            for batch in batches:
                seen.extend([batch.future, batch._drain_waiter, *(fut for fut, _ in batch._msg_futures)])
        for fut in seen:
            if fut.done():
                _consume_exception(fut)
            else:
                fut.add_done_callback(_consume_exception)

    async def _shutdown(self, producer: AIOKafkaProducer) -> None:
        self._discard_pending(producer)
        timeout = min(_CLOSE_TIMEOUT_S, self.request_timeout_ms / 1000 + _MARGIN_S)
        try:
            await asyncio.wait_for(producer.stop(), timeout)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled
            # stop() awaits the sender task cancelled above and lets its CancelledError out (seen
            # when that task is still unwinding, e.g. on uvloop): stop() did not get to the sockets.
            await self._close_client(producer)
        except Exception as exc:  # a hung or dead connection: drop the sockets ourselves
            log.warning("prediction_log_kafka_close_timeout", error=repr(exc))
            await self._close_client(producer)

    @staticmethod
    async def _close_client(producer: AIOKafkaProducer) -> None:
        try:
            await asyncio.wait_for(producer.client.close(), 1.0)
        except Exception:  # nothing more we can do about a socket that will not close
            pass
