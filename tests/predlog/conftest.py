"""Fixtures of the prediction-log tests: one real broker per test module, and fresh topics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.kafka_broker import KafkaBroker, running_broker


@pytest.fixture(scope="module")
def module_broker() -> Iterator[KafkaBroker]:
    """A Kafka-protocol broker (tansu) on a free loopback port, for the whole test module."""
    with running_broker() as broker:
        yield broker


@pytest.fixture
def broker(module_broker: KafkaBroker) -> KafkaBroker:
    """The module's broker, running (a previous test may have stopped or paused it)."""
    module_broker.start()
    return module_broker


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"predlog-{uuid.uuid4().hex[:10]}"
