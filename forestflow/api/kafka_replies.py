"""The replies of Kafka scoring requests: produced, confirmed by the broker, retried until they are.

A reply counts as delivered only once the broker acknowledged it (the consumer side commits a
request's offset only then). Sends that fail are retried with a growing pause while the broker
is away. Two failures can never succeed and would hold the request's partition forever, so they
end in a drop that is logged and counted: a reply over the broker's size limit (replaced first by
a 413 error reply, dropped if even that does not fit) and a reply topic the broker says does not
exist.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from forestflow.api.kafka_messages import Reply, Request, error_reply
from forestflow.api.kafka_state import IngestStats
from forestflow.errors import PayloadTooLarge
from forestflow.kafka_checks import check_idempotence
from forestflow.predlog import cloudevents
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.kafka")

#: Errors of a send that may mean the reply topic does not exist (or may not be written).
_TOPIC_ERRORS = (UnknownTopicOrPartitionError, InvalidTopicError, TopicAuthorizationFailedError)
#: Record batches of replies of up to this many bytes (below Kafka's default 1 MiB message.max.bytes).
_REPLY_BATCH_BYTES = 512 * 1024


class ReplyWriter:
    """Produces replies with aiokafka and reports each one delivered only once it is confirmed."""

    def __init__(self, settings: Settings, stats: IngestStats) -> None:
        self.settings = settings
        self.stats = stats
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect a producer; raises when the broker cannot be reached in time."""
        s = self.settings
        if s.kafka_enable_idempotence:
            await check_idempotence(s.kafka_bootstrap_servers, s.kafka_request_timeout_ms / 1000 + 1)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.kafka_bootstrap_servers,
            client_id="forestflow-replies",
            acks="all" if s.kafka_acks == "all" else int(s.kafka_acks),
            enable_idempotence=s.kafka_enable_idempotence,
            linger_ms=s.kafka_linger_ms,
            request_timeout_ms=s.kafka_request_timeout_ms,
            # aiokafka's 16 KiB batches fill with a few dozen replies, and every reply sent while
            # a partition's full batch is in flight waits for it (an asyncio.wait each).
            max_batch_size=_REPLY_BATCH_BYTES,
        )
        await asyncio.wait_for(self._producer.start(), s.kafka_request_timeout_ms / 1000 + 1)

    async def stop(self) -> None:
        """Flush and disconnect (bounded)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            await asyncio.wait_for(producer.stop(), 10.0)
        except Exception as exc:  # a dead connection: nothing more to do about it
            log.warning("kafka_reply_producer_close_failed", error=repr(exc))

    async def send(self, key: bytes | None, request: Request, reply: Reply) -> bool:
        """Produce ``reply`` with ``key`` and wait for the broker's confirmation, retrying until it
        comes; True once it is delivered or dropped for good (the request is then done)."""
        delay = 0.2
        while True:
            producer = self._producer
            try:
                if producer is None:
                    raise KafkaError("no producer")
                headers = reply.headers + cloudevents.reply_headers(request.request_id, _source(request), int(time.time() * 1000))
                delivery = await producer.send(request.reply_topic, reply.value, key=key, headers=headers)
                await delivery
                self.stats.answered[reply.status] += 1
                return True
            except MessageSizeTooLargeError:
                if reply.status == 413:
                    self.stats.dropped["reply_too_large"] += 1
                    log.error("kafka_reply_too_large", request_id=request.request_id, bytes=len(reply.value))
                    return True
                reply = error_reply(request, PayloadTooLarge("the answer is over the reply topic's message size limit"))
            except KafkaError as exc:
                if isinstance(exc, _TOPIC_ERRORS) and await self._topic_missing(request.reply_topic):
                    self.stats.dropped["reply_topic_unknown"] += 1
                    log.error("kafka_reply_topic_unknown", request_id=request.request_id, topic=request.reply_topic)
                    return True
                self.stats.reply_retries += 1
                log.warning("kafka_reply_failed", request_id=request.request_id, error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _topic_missing(self, topic: str | None) -> bool:
        """Whether the broker answers that ``topic`` does not exist (False when it does not answer)."""
        producer = self._producer
        if producer is None or topic is None:
            return False
        try:
            metadata = await asyncio.wait_for(producer.client.fetch_all_metadata(), self.settings.kafka_request_timeout_ms / 1000)
        except Exception:  # the broker is away: an outage, not a missing topic
            return False
        return topic not in metadata.topics() or topic in metadata.unauthorized_topics


def _source(request: Request) -> str:
    """The gateway route the request addressed (ce_source of its reply)."""
    if request.contract is not None:
        return cloudevents.source_of(request.contract)
    return f"/v2/models/{request.v2_model}" if request.v2_model else "/"
