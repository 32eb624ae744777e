"""Scoring from Kafka: requests consumed from topics, answers produced to reply topics.

Started with the app when ``kafka_ingest_topics`` is set. One consumer group per deployment
(``kafka_ingest_group``): the group protocol spreads the partitions over the replicas. Each
message is read by :mod:`forestflow.api.kafka_messages`, scored through the Gateway like an HTTP
request (live priority, phase-in routing, shadow copies, prediction events with protocol
``kafka``), and answered on its reply topic.

**At least once.** Offsets are committed by hand, and a partition's commit never passes a message
whose reply is not confirmed by the broker: the commit point is the lowest offset still queued
here or being answered. A gateway that dies loses nothing; what it had not committed is delivered
again (to it or to another replica) and answered again, with the same request id.

**Flow control.** Messages are taken in order per partition. Before one is handed to the Gateway
the live queues of the servables its contract may route to are checked: when they are full, the
partition is paused (its messages wait here, in order, and the consumer stops fetching it) and
resumed once there is room, so a slow servable makes the lag grow instead of answering 503 or
dropping. If other traffic fills a queue between that check and the offer, the message is tried
again (the prediction log then holds a 503 event for the refused attempt).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import structlog
from aiohttp import web
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import ConsumerRecord

from forestflow import tracing
from forestflow.api.common import AFTER_START, GATEWAY, SETTINGS
from forestflow.api.kafka_messages import Reply, Request, answer, read_request
from forestflow.api.kafka_replies import ReplyWriter
from forestflow.api.kafka_state import IngestStats, PartitionState
from forestflow.core.ids import Contract
from forestflow.errors import Overloaded
from forestflow.kafka_checks import IdempotenceRefused, ensure_topics
from forestflow.service import Gateway
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.kafka")

#: Records one poll may return (a paused partition holds at most about this many here).
_POLL_RECORDS = 256
#: Messages being scored or answered at once, over all partitions.
_MAX_INFLIGHT = 1024
#: How long a poll waits for records; shorter while a partition waits for room, which is
#: checked again after each poll.
_IDLE_POLL_MS = 200
_BLOCKED_POLL_MS = 10
_COMMIT_INTERVAL_S = 0.1
_LAG_INTERVAL_S = 1.0
#: Pause before offering again a message another client's traffic crowded out.
_OVERLOAD_RETRY_S = 0.02


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no types: its base is Any
    def __init__(self, ingest: KafkaIngest) -> None:
        self.ingest = ingest

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.ingest._release(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        for tp in assigned:
            self.ingest._parts.setdefault(tp, PartitionState(tp))


class KafkaIngest:
    """Consumes scoring requests, answers them on reply topics, commits what was answered."""

    def __init__(self, gateway: Gateway, settings: Settings) -> None:
        self.gateway = gateway
        self.settings = settings
        self.topics = settings.kafka_ingest_topic_list
        self.stats = IngestStats()
        self.connected = False
        #: Why ingestion cannot run at all (the broker refuses what the settings ask for), else None.
        self.refused: str | None = None
        self._parts: dict[TopicPartition, PartitionState] = {}
        self._tasks: dict[asyncio.Task[None], PartitionState] = {}
        self._inflight = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._replies = ReplyWriter(settings, self.stats)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and consume in the background (retrying while the broker is away)."""
        self._task = asyncio.create_task(self._run(), name="kafka-ingest")

    def stop_consuming(self) -> None:
        """Take no new messages; what is in flight is still answered (see :meth:`stop`)."""
        self._stopping.set()

    async def stop(self) -> None:
        """Stop consuming, answer what is in flight (within ``shutdown_timeout_s``), commit, disconnect."""
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, self.settings.shutdown_timeout_s + 15)
            except TimeoutError:
                log.warning("kafka_ingest_stop_timeout")

    async def _run(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                await self._connect()
            except IdempotenceRefused as exc:  # retrying cannot help: say so once, and wait for the stop
                self.refused = str(exc)
                log.error("kafka_ingest_refused", error=str(exc))
                await self._disconnect()
                await self._stopping.wait()
                break
            except Exception as exc:  # the broker is away: keep serving HTTP, try again later
                log.warning("kafka_ingest_connect_failed", error=repr(exc), retry_in_s=delay)
                await self._disconnect()
                await self._sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            delay = 0.5
            self.connected = True
            log.info("kafka_ingest_started", topics=list(self.topics), group=self.settings.kafka_ingest_group)
            try:
                await self._consume()
            except Exception:  # a defect: start over with fresh clients rather than stop ingesting
                log.exception("kafka_ingest_failed")
                await self._sleep(delay)
            finally:
                self.connected = False
                await self._drain(self.settings.shutdown_timeout_s)
                await self._disconnect()
        log.info("kafka_ingest_stopped", consumed=self.stats.consumed, answered=sum(self.stats.answered.values()))

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _connect(self) -> None:
        s = self.settings
        timeout = s.kafka_request_timeout_ms / 1000 + 1
        if s.kafka_create_topics:
            await self._create_topics(timeout)
        await self._replies.start()
        session = s.kafka_ingest_session_timeout_ms
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            group_id=s.kafka_ingest_group,
            client_id="forestflow-ingest",
            enable_auto_commit=False,
            # A new group starts at the oldest request: none produced before the first start is lost.
            auto_offset_reset="earliest",
            session_timeout_ms=session,
            heartbeat_interval_ms=max(100, min(3000, session // 3)),
            max_poll_records=_POLL_RECORDS,
            fetch_max_wait_ms=s.kafka_ingest_fetch_max_wait_ms,
        )
        self._consumer.subscribe(topics=list(self.topics), listener=_Rebalance(self))
        await asyncio.wait_for(self._consumer.start(), timeout)

    async def _create_topics(self, timeout_s: float) -> None:
        """Create the request topics and the default reply topic when missing (a client that waits
        for its reply must not wait for a topic that only appears once the gateway has answered)."""
        s = self.settings
        try:
            created = await ensure_topics(s.kafka_bootstrap_servers, [*self.topics, s.kafka_reply_topic], timeout_s)
        except (KafkaConnectionError, TimeoutError):
            raise  # the broker is away: retried by the caller
        except KafkaError as exc:  # e.g. not authorized: the topics must then be made by whoever may
            log.warning("kafka_topics_not_created", error=repr(exc), topics=[*self.topics, s.kafka_reply_topic])
            return
        if created:
            log.info("kafka_topics_created", topics=created)

    async def _disconnect(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await asyncio.wait_for(consumer.stop(), 10.0)
            except Exception as exc:  # a dead connection: nothing more to do about it
                log.warning("kafka_ingest_close_failed", error=repr(exc))
        await self._replies.stop()
        now = asyncio.get_running_loop().time()
        for part in self._parts.values():
            self.stats.paused_s_released += part.paused_seconds(now)
        self._parts.clear()

    # ---- consuming --------------------------------------------------------------------------------
    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        housekeeping = asyncio.create_task(self._housekeeping(), name="kafka-ingest-commit")
        try:
            while not self._stopping.is_set():
                waiting = any(p.backlog or p.retrying for p in self._parts.values())
                try:
                    batches = await consumer.getmany(
                        timeout_ms=_BLOCKED_POLL_MS if waiting else _IDLE_POLL_MS, max_records=_POLL_RECORDS
                    )
                except KafkaError as exc:  # e.g. a fetch error aiokafka does not retry by itself
                    log.warning("kafka_ingest_poll_failed", error=repr(exc))
                    await self._sleep(1.0)
                    continue
                default_reply = self.settings.kafka_reply_topic
                for tp, records in batches.items():
                    part = self._parts.setdefault(tp, PartitionState(tp))
                    for r in records:
                        part.backlog.append((r, read_request(r.topic, r.partition, r.offset, r.headers, default_reply)))
                    part.next_offset = records[-1].offset + 1
                    self.stats.consumed += len(records)
                if self._dispatch():
                    # Let the new tasks make their offers before the next room check.
                    await asyncio.sleep(0)
        finally:
            housekeeping.cancel()
            await asyncio.gather(housekeeping, return_exceptions=True)

    def _dispatch(self) -> bool:
        """Start every waiting message its servables have room for; pause the partitions that wait."""
        started = False
        rooms: dict[Contract, int | None] = {}
        now = asyncio.get_running_loop().time()
        for part in list(self._parts.values()):
            while part.backlog and not part.retrying:
                record, request = part.backlog[0]
                if request.reply_topic is None:
                    part.backlog.popleft()
                    self.stats.dropped[request.dropped] += 1
                    log.warning(
                        "kafka_request_dropped",
                        reason=request.dropped,
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        request_id=request.request_id,
                    )
                    continue
                if self._inflight >= _MAX_INFLIGHT:
                    break
                contract = request.contract if request.error is None else None
                if contract is not None:
                    if contract not in rooms:
                        rooms[contract] = self._room(contract)
                    room = rooms[contract]
                    if room is not None:
                        if room <= 0:
                            break
                        rooms[contract] = room - 1
                part.backlog.popleft()
                self._start(part, record, request)
                started = True
            self._set_paused(part, bool(part.backlog) or part.retrying > 0, now)
        return started

    def _room(self, contract: Contract) -> int | None:
        """Free live places on the servables the contract may route to (None: no limit applies)."""
        state = self.gateway.contracts.get(contract)
        if state is None:
            return None  # answered 404 at once
        rooms = []
        for release in state.picker.keys():  # noqa: SIM118 (a WeightedPicker, not a dict)
            entry = state.servables.get(release)
            loaded = self.gateway.loaded.get(entry.fqrv) if entry is not None else None
            if loaded is not None:
                rooms.append(loaded.scheduler.live_room())
        return min(rooms) if rooms else None

    def _set_paused(self, part: PartitionState, paused: bool, now: float) -> None:
        consumer = self._consumer
        if consumer is None or paused == (part.paused_since is not None):
            return
        try:
            if paused:
                consumer.pause(part.tp)
                part.paused_since = now
                self.stats.pauses += 1
            else:
                consumer.resume(part.tp)
                part.paused_s += now - (part.paused_since or now)
                part.paused_since = None
        except Exception as exc:  # the partition was just revoked
            log.debug("kafka_ingest_pause_failed", tp=str(part.tp), error=repr(exc))

    def _start(self, part: PartitionState, record: ConsumerRecord, request: Request) -> None:
        part.inflight.add(record.offset)
        self._inflight += 1
        task = asyncio.create_task(self._handle(part, record, request))
        self._tasks[task] = part
        task.add_done_callback(self._tasks.pop)

    async def _handle(self, part: PartitionState, record: ConsumerRecord, request: Request) -> None:
        delivered = False
        span = tracing.ServerSpan(f"kafka {record.topic}", tracing.carrier_of(record.headers), "kafka") if tracing.ON else None
        reply = None
        try:
            reply = await self._score(part, record, request)
            delivered = await self._replies.send(record.key, request, reply)
        finally:
            if span is not None:
                span.end(
                    reply.status if reply is not None else 499, str(request.contract) if request.contract else request.v2_model
                )
            self._inflight -= 1
            if delivered:  # an unconfirmed reply keeps its offset, so the commit never passes it
                part.inflight.discard(record.offset)

    async def _score(self, part: PartitionState, record: ConsumerRecord, request: Request) -> Reply:
        while True:
            try:
                return await answer(self.gateway, request, record.value)
            except Overloaded:
                # Other traffic filled the queue between our room check and our offer.
                self.stats.overload_retries += 1
                part.retrying += 1
                self._set_paused(part, True, asyncio.get_running_loop().time())
                try:
                    await asyncio.sleep(_OVERLOAD_RETRY_S)
                finally:
                    part.retrying -= 1

    # ---- commits, lag, rebalances, shutdown -------------------------------------------------------
    async def _housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        lag_at = loop.time()
        while True:
            await asyncio.sleep(_COMMIT_INTERVAL_S)
            try:
                await self._commit(list(self._parts.values()))
                if loop.time() - lag_at >= _LAG_INTERVAL_S:
                    lag_at = loop.time()
                    await self._refresh_paused_lag()
            except Exception:  # housekeeping must outlive one bad round
                log.exception("kafka_ingest_housekeeping_failed")

    async def _commit(self, parts: list[PartitionState]) -> None:
        consumer = self._consumer
        offsets = {}
        for part in parts:
            point = part.commit_point()
            if point is not None and (part.committed is None or point > part.committed):
                offsets[part.tp] = (part, point)
        if consumer is None or not offsets:
            return
        try:
            await consumer.commit({tp: point for tp, (_, point) in offsets.items()})
        except KafkaError as exc:  # a rebalance or the broker away: the next round commits
            self.stats.commit_failures += 1
            log.debug("kafka_ingest_commit_failed", error=repr(exc))
            return
        self.stats.commits += 1
        for part, point in offsets.values():
            part.committed = max(point, part.committed or 0)

    async def _refresh_paused_lag(self) -> None:
        """A paused partition is not fetched, so its high-water mark is asked for."""
        consumer = self._consumer
        paused = [p for p in self._parts.values() if p.paused_since is not None]
        if consumer is None or not paused:
            return
        ends = await asyncio.wait_for(consumer.end_offsets([p.tp for p in paused]), 5.0)
        for part in paused:
            end = ends.get(part.tp)
            if end is not None:
                part.highwater = max(end, part.highwater or 0)

    async def _release(self, tps: list[TopicPartition]) -> None:
        """Partitions go to another replica: finish what is in flight on them and commit it."""
        parts = [self._parts.pop(tp) for tp in tps if tp in self._parts]
        if not parts:
            return
        pending = [task for task, part in self._tasks.items() if part in parts]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.kafka_ingest_session_timeout_ms / 1000)
        await self._commit(parts)
        now = asyncio.get_running_loop().time()
        for part in parts:
            self.stats.paused_s_released += part.paused_seconds(now)
            part.backlog.clear()  # the next owner reads them again from the commit point

    async def _drain(self, timeout_s: float) -> None:
        """At shutdown: answer what is in flight (within ``timeout_s``), then commit."""
        tasks = list(self._tasks)
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if pending:
                log.warning("kafka_ingest_unanswered_at_stop", messages=len(pending))
        try:
            await self._commit(list(self._parts.values()))
        except Exception as exc:
            log.warning("kafka_ingest_final_commit_failed", error=repr(exc))

    # ---- metrics ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counters and per-partition positions, for ``/metrics/json``."""
        now = asyncio.get_running_loop().time()
        consumer = self._consumer
        partitions = {}
        for part in self._parts.values():
            if consumer is not None:
                try:
                    highwater = consumer.highwater(part.tp)
                except Exception:  # the partition was just revoked
                    highwater = None
                if highwater is not None:
                    part.highwater = max(highwater, part.highwater or 0)
            partitions[f"{part.tp.topic}/{part.tp.partition}"] = part.to_json(now)
        paused_s = self.stats.paused_s_released + sum(p.paused_seconds(now) for p in self._parts.values())
        return {
            "connected": self.connected,
            "refused": self.refused,
            "group": self.settings.kafka_ingest_group,
            "topics": list(self.topics),
            "consumed": self.stats.consumed,
            "answered": {str(status): n for status, n in sorted(self.stats.answered.items())},
            "dropped": dict(self.stats.dropped),
            "inflight": self._inflight,
            "pauses": self.stats.pauses,
            "pausedSeconds": round(paused_s, 3),
            "overloadRetries": self.stats.overload_retries,
            "replyRetries": self.stats.reply_retries,
            "commits": self.stats.commits,
            "commitFailures": self.stats.commit_failures,
            "partitions": partitions,
        }


KAFKA_INGEST = web.AppKey("kafka_ingest", KafkaIngest)


async def _ingest_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    if not settings.kafka_ingest_topic_list:
        yield
        return
    ingest = KafkaIngest(app[GATEWAY], settings)
    app[KAFKA_INGEST] = ingest

    async def start() -> None:  # consumed only once the gateway has its contracts
        ingest.start()

    app[AFTER_START].append(start)
    yield
    await ingest.stop()


async def _stop_consuming(app: web.Application) -> None:
    ingest = app.get(KAFKA_INGEST)
    if ingest is not None:
        ingest.stop_consuming()  # when shutdown begins, with the HTTP listener


def add_to(app: web.Application) -> None:
    """Run Kafka ingestion with the app when ``kafka_ingest_topics`` is set.

    Add it after the gateway's context: it scores through the gateway, so it stops first.
    """
    app.cleanup_ctx.append(_ingest_context)
    app.on_shutdown.append(_stop_consuming)
