"""``forestflow kafka score`` and ``forestflow kafka replies``: try scoring from Kafka by hand.

``score`` produces one request message (a body file, the contract and reply topic in headers, a
fresh request id) and waits for the reply carrying that id; ``replies`` prints the replies of a
topic as they come. Both print each reply as one JSON line: the record's ``key``, ``status``,
``requestId``, the other headers, and the ``body`` (JSON as it is, anything else in base64).
No consumer group is involved, so neither moves the gateway's committed offsets.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

CONTENT_TYPES = {"json": "application/json", "protobuf": "application/x-protobuf", "v2": "application/vnd.v2+json"}


def reply_line(record: Any) -> dict[str, Any]:
    """A reply record as a JSON-ready dict."""
    headers = {name: value.decode("utf-8", errors="replace") for name, value in record.headers or ()}
    value = record.value or b""
    try:
        body: Any = orjson.loads(value) if headers.get("content-type") == "application/json" else None
    except orjson.JSONDecodeError:
        body = None
    line: dict[str, Any] = {
        "key": record.key.decode("utf-8", errors="replace") if record.key is not None else None,
        "status": int(headers.pop("forestflow-status", "0") or 0),
        "requestId": headers.pop("forestflow-request-id", None),
        "headers": headers,
    }
    if body is not None:
        line["body"] = body
    else:
        line["bodyBase64"] = base64.b64encode(value).decode()
    return line


async def _reply_consumer(bootstrap: str, topic: str, from_beginning: bool, wait_s: float) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        client_id="forestflow-kafka-cli",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    deadline = time.monotonic() + wait_s
    while not consumer.partitions_for_topic(topic):
        await consumer.topics()
        if consumer.partitions_for_topic(topic):
            break
        if time.monotonic() > deadline:
            await consumer.stop()
            raise TimeoutError(f"topic {topic} does not exist")
        await asyncio.sleep(0.5)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    consumer.assign(tps)
    if from_beginning:
        await consumer.seek_to_beginning(*tps)
    else:
        await consumer.seek_to_end(*tps)
    for tp in tps:
        await consumer.position(tp)
    return consumer


async def score(args: argparse.Namespace) -> int:
    """Produce one request and print its reply; 0 when it was answered 200."""
    body = Path(args.file).read_bytes()  # noqa: ASYNC240 (a CLI reading its input before anything else runs)
    request_id = f"cli-{uuid.uuid4().hex[:12]}"
    headers = [
        ("content-type", CONTENT_TYPES[args.format].encode()),
        ("forestflow-reply-topic", args.reply_topic.encode()),
        ("forestflow-request-id", request_id.encode()),
    ]
    headers.append(
        ("forestflow-model", args.contract.encode()) if args.format == "v2" else ("forestflow-contract", args.contract.encode())
    )
    consumer = await _reply_consumer(args.bootstrap, args.reply_topic, False, args.timeout)  # listen first
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, enable_idempotence=False)
    try:
        await producer.start()
        await producer.send_and_wait(args.topic, body, key=args.key.encode() if args.key else None, headers=headers)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                for record in batch:
                    if dict(record.headers or ()).get("forestflow-request-id") == request_id.encode():
                        line = reply_line(record)
                        print(orjson.dumps(line).decode(), flush=True)
                        return 0 if line["status"] == 200 else 1
        print(f"forestflow: error: no reply to {request_id} on {args.reply_topic} within {args.timeout:g} s", file=sys.stderr)
        return 1
    finally:
        await producer.stop()
        await consumer.stop()


async def replies(args: argparse.Namespace) -> int:
    """Print the replies of a topic as JSON lines (until --max-replies, --idle-timeout, or Ctrl-C)."""
    consumer = await _reply_consumer(args.bootstrap, args.topic, args.from_beginning, args.idle_timeout or 3600)
    printed = 0
    try:
        last = time.monotonic()
        while args.max_replies is None or printed < args.max_replies:
            if args.idle_timeout is not None and time.monotonic() - last > args.idle_timeout:
                break
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                for record in batch:
                    if args.key is not None and record.key != args.key.encode():
                        continue
                    print(orjson.dumps(reply_line(record)).decode(), flush=True)
                    printed += 1
                    last = time.monotonic()
    finally:
        await consumer.stop()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``kafka score`` and ``kafka replies`` subcommands."""
    sub = parser.add_subparsers(dest="kafka_command", required=True)
    s = sub.add_parser("score", help="produce one scoring request and print its reply")
    s.add_argument("file", help="the request body (a /score body, or a V2 inference request with --format v2)")
    s.add_argument("--bootstrap", default="localhost:9092")
    s.add_argument("--topic", default="forestflow.requests", help="a topic the gateway consumes (kafka_ingest_topics)")
    s.add_argument("--contract", required=True, help="org/project/N (org.project.N with --format v2)")
    s.add_argument("--reply-topic", default="forestflow.replies")
    s.add_argument("--key", help="the message key (the reply carries it)")
    s.add_argument("--format", choices=sorted(CONTENT_TYPES), default="json")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    s.set_defaults(kafka_func=score)
    r = sub.add_parser("replies", help="print the replies of a topic as JSON lines")
    r.add_argument("--bootstrap", default="localhost:9092")
    r.add_argument("--topic", default="forestflow.replies")
    r.add_argument("--from-beginning", action="store_true")
    r.add_argument("--key", help="only replies with this key")
    r.add_argument("--max-replies", type=int)
    r.add_argument("--idle-timeout", type=float, help="stop after this many seconds without a reply")
    r.set_defaults(kafka_func=replies)


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand."""
    try:
        return int(asyncio.run(args.kafka_func(args)))
    except (OSError, TimeoutError) as exc:
        print(f"forestflow: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
