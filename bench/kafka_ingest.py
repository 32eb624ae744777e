"""Scoring from Kafka against HTTP ``/score``, measured in the same run on the same gateway.

Starts the Kafka test broker (tansu) and one gateway that serves HTTP and consumes a request
topic, with the H2O prostate GBM deployed (logging NONE). The gateway is pinned to core 0; this
process (the load generator: wrk or an asyncio HTTP client, an aiokafka producer and consumer)
and the broker share core 1. For each row count it measures, one after the other:

- ``http c16``: ``POST /score`` at concurrency 16 (as in bench/run.py);
- ``kafka w16``: at most 16 requests outstanding on Kafka (a request is produced when a reply
  comes back), so its latency compares with the HTTP cell;
- ``kafka flood``: N requests produced as fast as the producer goes, timed until the last reply.

Each prints requests per second end to end, p50/p99 latency (Kafka: reply timestamp minus request
timestamp, both set by their producers) and the gateway's CPU microseconds per request.

    python bench/kafka_ingest.py                 # 1 and 100 rows, 5 s HTTP, 20,000 / rows Kafka requests
    python bench/kafka_ingest.py --smoke         # a few seconds; asserts nothing about speed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from bench.servers import Server, deploy, measured, pin_process, start_gateway  # noqa: E402

CONTRACT = ("bench", "kafka", 1)
HEADERS = [("forestflow-contract", b"bench/kafka/1"), ("content-type", b"application/json")]
PARTITIONS = 4


@dataclass
class KafkaResult:
    """One Kafka cell's figures."""

    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us: float
    #: CPU microseconds per request of the broker, and of this load generator.
    broker_us: float = float("nan")
    client_us: float = float("nan")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes so far."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _create_topics(bootstrap: str, *names: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
    finally:
        await admin.close()


async def kafka_cell(
    server: Server, bootstrap: str, topic: str, body: bytes, n: int, window: int | None, broker_pids: list[int]
) -> KafkaResult:
    """Produce ``n`` requests (at most ``window`` outstanding, or all at once) and wait for ``n`` replies."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    replies = f"bench.replies.{uuid.uuid4().hex[:8]}"  # a fresh topic, read from its start
    await _create_topics(bootstrap, replies)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, linger_ms=1 if window else 5)
    await consumer.start()
    await producer.start()
    tps = [TopicPartition(replies, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    headers = [*HEADERS, ("forestflow-reply-topic", replies.encode())]
    slots = asyncio.Semaphore(window or n)
    latencies: list[float] = []
    errors = 0
    done = asyncio.Event()

    async def read() -> None:
        nonlocal errors
        while len(latencies) < n:
            for batch in (await consumer.getmany(timeout_ms=100)).values():
                for record in batch:
                    sent_ms = int(record.key.split(b":")[1])
                    latencies.append(record.timestamp - sent_ms)
                    if dict(record.headers).get("forestflow-status") != b"200":
                        errors += 1
                    slots.release()
        done.set()

    try:
        cpu_before, broker_before, client_before = server.cpu_s(), cpu_s(broker_pids), time.process_time()
        started = time.perf_counter()
        reader = asyncio.create_task(read())
        pending = []
        for i in range(n):
            await slots.acquire()
            now_ms = int(time.time() * 1000)
            pending.append(await producer.send(topic, body, key=f"{i}:{now_ms}".encode(), headers=headers, timestamp_ms=now_ms))
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - started
        cpu = server.cpu_s() - cpu_before
        broker_cpu, client_cpu = cpu_s(broker_pids) - broker_before, time.process_time() - client_before
        await reader
    finally:
        await producer.stop()
        await consumer.stop()
    latencies.sort()

    def pct(p: float) -> float:
        return float(latencies[min(len(latencies) - 1, int(p * len(latencies)))]) if latencies else float("nan")

    return KafkaResult(n, n / elapsed, pct(0.5), pct(0.99), errors, cpu / n * 1e6, broker_cpu / n * 1e6, client_cpu / n * 1e6)


HEADER = (
    f"{'cell':12} {'rows':>4} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7} {'errors':>6} "
    f"{'broker us':>9} {'client us':>9}"
)


def show(
    name: str,
    rows: int,
    rps: float,
    p50: float,
    p99: float,
    cpu_us: float,
    errors: int,
    broker_us: float = float("nan"),
    client_us: float = float("nan"),
) -> None:
    print(
        f"{name:12} {rows:>4} {rps:>8.0f} {p50:>7.2f} {p99:>7.2f} {cpu_us:>7.0f} {errors:>6} {broker_us:>9.0f} {client_us:>9.0f}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="short cells; asserts nothing about speed")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of the HTTP cell")
    parser.add_argument(
        "--requests", type=int, default=20000, help="requests of the Kafka flood cell (the w16 cell sends half as many)"
    )
    parser.add_argument(
        "--no-scale",
        dest="scale",
        action="store_false",
        help="as many Kafka requests for every row count (default: --requests / rows, at least 1)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.duration, args.requests = [1], 0.5, 500
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1})  # the load generator keeps off the gateway's core
    from tests.kafka_broker import running_broker

    work = Path(tempfile.mkdtemp(prefix="ff-bench-kafka-"))
    print(f"# logs and data under {work}", flush=True)
    started = time.monotonic()
    ok = True
    with running_broker() as broker:
        for pid in broker.pids:
            pin_process(pid, 1)
        topic = f"bench.requests.{uuid.uuid4().hex[:8]}"
        asyncio.run(_create_topics(broker.bootstrap, topic))
        env = {
            "FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
            "FORESTFLOW_KAFKA_ENABLE_IDEMPOTENCE": "false",  # tansu has no idempotent producer
            "FORESTFLOW_KAFKA_INGEST_TOPICS": topic,
            "FORESTFLOW_KAFKA_INGEST_GROUP": f"bench.{uuid.uuid4().hex[:8]}",
            # tansu holds a fetch for the whole wait even when records arrive (Kafka answers at once).
            "FORESTFLOW_KAFKA_INGEST_FETCH_MAX_WAIT_MS": "10",
        }
        gw = start_gateway(work / "data", env, work, "gateway")
        try:
            deploy(gw, CONTRACT, "NONE")
            deadline = time.monotonic() + 30
            while not requests.get(gw.url + "/metrics/json", timeout=5).json()["kafkaIngest"]["partitions"]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the gateway was not assigned the request topic's partitions")
                time.sleep(0.2)
            print(HEADER, flush=True)
            path = "/{}/{}/{}/score".format(*CONTRACT)
            for rows in args.rows:
                body = payloads.score_body(rows)
                measured(gw, path, body, "application/json", 16, min(2.0, args.duration))  # warm-up
                n = max(1, args.requests // rows) if args.scale else args.requests
                asyncio.run(kafka_cell(gw, broker.bootstrap, topic, body, min(2000, n), 16, broker.pids))  # warm-up
                http = measured(gw, path, body, "application/json", 16, args.duration)
                show("http c16", rows, http.rps, http.p50_ms, http.p99_ms, http.cpu_us, http.errors)
                w16 = asyncio.run(kafka_cell(gw, broker.bootstrap, topic, body, max(1, n // 2), 16, broker.pids))
                show("kafka w16", rows, w16.rps, w16.p50_ms, w16.p99_ms, w16.cpu_us, w16.errors, w16.broker_us, w16.client_us)
                flood = asyncio.run(kafka_cell(gw, broker.bootstrap, topic, body, n, None, broker.pids))
                show(
                    "kafka flood",
                    rows,
                    flood.rps,
                    flood.p50_ms,
                    flood.p99_ms,
                    flood.cpu_us,
                    flood.errors,
                    flood.broker_us,
                    flood.client_us,
                )
                print(
                    f"# {rows} row(s): kafka w16 / http c16 req/s {w16.rps / http.rps:.2f}, cpu per request "
                    f"{w16.cpu_us / http.cpu_us:.2f}; kafka flood / http c16 req/s {flood.rps / http.rps:.2f}, "
                    f"cpu per request {flood.cpu_us / http.cpu_us:.2f}",
                    flush=True,
                )
                ok = ok and not (http.errors or w16.errors or flood.errors)
            ingest = requests.get(gw.url + "/metrics/json", timeout=10).json()["kafkaIngest"]
            print(
                f"# kafka ingest: consumed {ingest['consumed']}, answered {ingest['answered']}, dropped {ingest['dropped']}, "
                f"pauses {ingest['pauses']} ({ingest['pausedSeconds']} s), overload retries {ingest['overloadRetries']}",
                flush=True,
            )
        finally:
            gw.stop()
    print(f"# done in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
