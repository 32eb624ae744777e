"""CPU and bytes per prediction event for each Kafka compression codec, measured in process.

Realistic events: the bench's prostate rows (1 and 100 per request) as the /score front-end decodes
them, with a binomial answer (label + two probabilities), encoded as the PredictionEvent the Kafka
sink produces. Each codec packs them into record batches the way the sink does
(``producer.create_batch()`` -> aiokafka's DefaultRecordBatchBuilder with that codec) and the
figures are process CPU per event and batch bytes per event. The protobuf encoding itself is not
counted (the same for every codec); it is printed once for scale.

    python bench/predlog_compression.py            # events per batch: 16 and 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder  # noqa: E402

from bench import payloads  # noqa: E402
from forestflow.codecs.schema_datum import frame_from_json  # noqa: E402
from forestflow.core.frame import Frame  # noqa: E402
from forestflow.core.ids import FQRV  # noqa: E402
from forestflow.core.policies import LoggingSettings, LogLevel  # noqa: E402
from forestflow.predlog.encode import encode_event  # noqa: E402
from forestflow.predlog.kafka_sink import COMPRESSIONS  # noqa: E402
from forestflow.predlog.record import PredictionRecord  # noqa: E402

_CODEC = {
    "none": 0,
    "gzip": DefaultRecordBatch.CODEC_GZIP,
    "lz4": DefaultRecordBatch.CODEC_LZ4,
    "zstd": DefaultRecordBatch.CODEC_ZSTD,
}


def events(rows: int, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` (key, value) pairs of ``rows``-row events; request ids and latencies differ, as live."""
    frame, configs = frame_from_json(orjson.loads(payloads.score_body(rows)))
    rng = np.random.default_rng(7)
    p1 = rng.random(rows)
    answer = Frame.from_columns({"predict": np.where(p1 > 0.5, "1", "0").astype(object), "p0": 1 - p1, "p1": p1})
    logging = LoggingSettings(LogLevel.FULL, ("reqid",))
    fqrv = FQRV.parse("bench.full.1.gbm")
    out = []
    for i in range(count):
        record = PredictionRecord(
            fqrv=fqrv,
            served=True,
            request=frame,
            configs=configs,
            logging=logging,
            request_id=f"{i:08x}-5c1d-4a8e-9f0b-{i * 7919:012x}",
            protocol="basic",
            event_time_ms=1_790_000_000_000 + i,
            latency_ms=0.4 + (i % 17) / 10,
            response=answer,
        )
        out.append((b"bench", encode_event(record)))
    return out


def batch_bytes(codec: str, batch: list[tuple[bytes, bytes]]) -> int:
    """Build one record batch as the producer does and return its size on the wire."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=_CODEC[codec],
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1024 * 1024,
    )
    for key, value in batch:
        builder.append(0, timestamp=None, key=key, value=value, headers=[])
    return len(builder.build())


def measure(codec: str, evs: list[tuple[bytes, bytes]], per_batch: int, min_s: float) -> tuple[float, float]:
    """(CPU us per event, bytes per event) over repeated batches for at least ``min_s`` CPU seconds."""
    batches = [evs[i : i + per_batch] for i in range(0, len(evs), per_batch)]
    size = sum(batch_bytes(codec, b) for b in batches)
    done, started = 0, time.process_time()
    while time.process_time() - started < min_s:
        for b in batches:
            batch_bytes(codec, b)
        done += len(evs)
    return (time.process_time() - started) / done * 1e6, size / len(evs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-batch", type=int, nargs="+", default=[16, 200])
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU seconds per figure")
    args = parser.parse_args()
    print(f"{'rows':>4} {'batch':>5} {'codec':6} {'cpu us/event':>12} {'bytes/event':>11} {'ratio':>6}")
    for rows in (1, 100):
        evs = events(rows, 400)
        started = time.process_time()
        events(rows, 400)
        encode_us = (time.process_time() - started) / 400 * 1e6
        print(
            f"# {rows}-row event: {len(evs[0][1])} bytes of protobuf, encoded (record built + encode_event) in {encode_us:.1f} us"
        )
        for per_batch in args.per_batch:
            raw = None
            for codec in COMPRESSIONS:
                cpu, size = measure(codec, evs, per_batch, args.seconds)
                raw = raw or size
                print(f"{rows:>4} {per_batch:>5} {codec:6} {cpu:>12.1f} {size:>11.0f} {raw / size:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
