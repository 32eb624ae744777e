"""What the gateway and the CLI ask a Kafka broker before they rely on it.

- :func:`check_idempotence`: whether the broker hands out producer ids. A broker without the
  idempotent producer (the tansu test broker, some managed offerings) answers InitProducerId with
  an error, and aiokafka's sender would then fail every batch and log the error on every retry.
  Asking once, up front, turns that into one :class:`IdempotenceRefused` naming the setting.
- :func:`ensure_topics`: create the topics that are missing (ingestion, replies), so nobody waits
  for a topic that only appears once someone has written to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.protocol.transaction import InitProducerIdRequest

#: Error codes of InitProducerId that mean "ask again in a moment", not "never".
_RETRIABLE = {14, 15, 51}  # coordinator load in progress, coordinator not available, concurrent transactions
_TRANSACTION_TIMEOUT_MS = 60000


class IdempotenceRefused(RuntimeError):
    """The broker refuses the idempotent producer; retrying cannot help (the message says what to set)."""

    #: Read by the prediction log: do not retry the sink, say it once.
    permanent = True


def idempotence_refused_message(bootstrap: str, error: str) -> str:
    """The one line that tells the operator what to change."""
    return (
        f"the Kafka broker at {bootstrap} refuses the idempotent producer (InitProducerId: {error}); "
        "start the gateway with FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE=false (kafka_enable_idempotence = false)"
    )


async def check_idempotence(bootstrap: str, timeout_s: float) -> None:
    """Ask the broker for a producer id (before any producer asks: aiokafka's own sender would log
    the refusal as an error on every attempt); raise :class:`IdempotenceRefused` when it answers
    with an error that retrying does not clear. Connection errors are raised as they are."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id="forestflow-probe", request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        for _ in range(5):
            request = InitProducerIdRequest(
                transactional_id=None, transaction_timeout_ms=_TRANSACTION_TIMEOUT_MS
            )  # None: no transactions
            response = await asyncio.wait_for(client.send(client.get_random_node(), request), timeout_s)
            code = int(response.error_code)
            if code == 0:
                return
            if code not in _RETRIABLE:
                raise IdempotenceRefused(idempotence_refused_message(bootstrap, for_code(code).__name__))
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def ensure_topics(bootstrap: str, topics: Iterable[str], timeout_s: float, partitions: int = 1) -> list[str]:
    """Create those of ``topics`` that do not exist; return the ones created.

    Raises what the broker answers (e.g. not authorized): the caller says so in one line.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        wanted = [t for t in dict.fromkeys(topics) if t]
        existing = set(await asyncio.wait_for(admin.list_topics(), timeout_s))
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return []
        response = await asyncio.wait_for(admin.create_topics([NewTopic(t, partitions, 1) for t in missing]), timeout_s)
        for topic, code, *_ in response.topic_errors:
            if code and for_code(code) is not TopicAlreadyExistsError:
                raise for_code(code)(f"cannot create topic {topic}")
        return missing
    finally:
        await admin.close()
