"""RecordBatch: a record batch built whole reads back, with aiokafka's own reader, as the events it holds."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch

from forestflow.predlog.kafka_batch import RecordBatch
from forestflow.predlog.log import LogEntry


def entries() -> list[LogEntry]:
    # Keys of every kind (none, empty, long), values from empty to past a one-byte varint length.
    return [
        LogEntry(False, None, b"first"),
        LogEntry(False, b"", b""),
        LogEntry(False, b"customer-7", b"x" * 300),
        LogEntry(True, b"k" * 200, bytes(range(256)) * 40),
    ]


@pytest.mark.parametrize("compression", ["none", "gzip", "lz4", "zstd"])
def test_a_batch_reads_back_as_its_entries(compression: str) -> None:
    batch = RecordBatch(entries(), compression)
    built = bytes(batch._build())
    assert len(built) == batch.size() and batch.record_count() == 4 and batch.closed()
    parsed = DefaultRecordBatch(built)
    assert parsed.validate_crc()
    assert (parsed.magic, parsed.base_offset, parsed.last_offset_delta, parsed.producer_id) == (2, 0, 3, -1)
    records = list(parsed)
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in records] == [
        (i, e.key, e.value, []) for i, e in enumerate(entries())
    ]
    assert len({r.timestamp for r in records}) == 1
    expected_codec = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4}[compression]
    assert parsed.compression_type == expected_codec


def test_an_idempotent_producers_state_is_written_when_it_sends() -> None:
    batch = RecordBatch(entries(), "zstd")
    before = DefaultRecordBatch(bytes(batch._build()))
    batch._set_producer_state(4242, 3, 17)  # what aiokafka's sender does right before sending
    after = DefaultRecordBatch(bytes(batch._build()))
    assert (before.producer_id, after.producer_id, after.producer_epoch, after.base_sequence) == (-1, 4242, 3, 17)
    assert after.validate_crc() and [r.value for r in after] == [e.value for e in entries()]


def test_incompressible_records_go_uncompressed() -> None:
    import os

    noise = [LogEntry(False, None, os.urandom(64))]
    parsed = DefaultRecordBatch(bytes(RecordBatch(noise, "zstd")._build()))
    assert parsed.compression_type == 0 and [r.value for r in parsed] == [noise[0].value]


def test_a_closed_batch_takes_nothing_more_and_bad_entries_are_refused() -> None:
    batch = RecordBatch(entries(), "none")
    assert batch.append(timestamp=None, key=b"k", value=b"v") is None and batch.record_count() == 4
    with pytest.raises(TypeError, match="key must be bytes or None"):
        RecordBatch([LogEntry(False, "text", b"v")], "none")


def test_log_entries_count_their_bytes_and_stay_out_of_the_collector() -> None:
    """LogEntry (C): size as the buffer budget counts it, keywords as positionals, read-only fields,
    and untracked by the garbage collector unless it holds something that could form a cycle."""
    import gc

    from forestflow.predlog.log import EVENT_OVERHEAD_BYTES

    entry = LogEntry(False, b"key", b"value", b"\x02ab")
    assert entry.size == 5 + 3 + 2 + EVENT_OVERHEAD_BYTES  # headers past their count byte
    assert LogEntry(graphpipe=True, key=None, value=b"v").size == 1 + EVENT_OVERHEAD_BYTES
    assert (entry.graphpipe, entry.key, entry.value, entry.headers) == (False, b"key", b"value", b"\x02ab")
    assert "value=<5 bytes>" in repr(entry)
    with pytest.raises(AttributeError):
        entry.size = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        LogEntry(False, None)  # type: ignore[call-arg]
    assert not gc.is_tracked(entry)
    held: list[object] = []
    cyclic = LogEntry(False, None, held)  # type: ignore[arg-type]
    held.append(cyclic)
    assert gc.is_tracked(cyclic)
