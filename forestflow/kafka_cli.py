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
import logging
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError

from forestflow.kafka_checks import ensure_topics

#: Longest wait for the broker to answer one step (connect, list or create topics).
_BROKER_TIMEOUT_S = 10.0


class CliError(RuntimeError):
    """A failure the command reports in one line (no traceback)."""


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


async def _reply_consumer(bootstrap: str, topic: str, from_beginning: bool) -> AIOKafkaConsumer:
    """A consumer assigned every partition of ``topic``, created first when missing: the CLI never
    waits for a topic that only appears once the gateway has answered."""
    await ensure_topics(bootstrap, [topic], _BROKER_TIMEOUT_S)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        client_id="forestflow-kafka-cli",
        fetch_max_wait_ms=100,
        request_timeout_ms=int(_BROKER_TIMEOUT_S * 1000),
    )
    try:
        await asyncio.wait_for(consumer.start(), _BROKER_TIMEOUT_S)
        deadline = time.monotonic() + _BROKER_TIMEOUT_S  # metadata of a topic just created
        while not consumer.partitions_for_topic(topic):
            await consumer.topics()
            if consumer.partitions_for_topic(topic):
                break
            if time.monotonic() > deadline:
                raise CliError(f"topic {topic} has no partitions on {bootstrap}")
            await asyncio.sleep(0.2)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


async def _require_topic(bootstrap: str, topic: str) -> None:
    """Fail in one line when the gateway's request topic does not exist (nobody would answer)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(_BROKER_TIMEOUT_S * 1000))
    await asyncio.wait_for(admin.start(), _BROKER_TIMEOUT_S)
    try:
        topics = await asyncio.wait_for(admin.list_topics(), _BROKER_TIMEOUT_S)
    finally:
        await admin.close()
    if topic not in topics:
        raise CliError(
            f"topic {topic} does not exist on {bootstrap}: no gateway consumes it "
            f"(start one with FORESTFLOW_KAFKA_INGEST_TOPICS={topic}; it creates the topic)"
        )


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
    await _require_topic(args.bootstrap, args.topic)
    consumer = await _reply_consumer(args.bootstrap, args.reply_topic, False)  # listen first
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
    """Print the replies of a topic as JSON lines; follows the topic until Ctrl-C unless
    --max-replies or --idle-timeout is given."""
    consumer = await _reply_consumer(args.bootstrap, args.topic, args.from_beginning)
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
    """The ``kafka score`` and ``kafka replies`` subcommands; they read the gateway's settings
    (``FORESTFLOW_KAFKA_*``, or ``--config``) as ``serve`` does, options override them."""
    sub = parser.add_subparsers(dest="kafka_command", required=True)
    s = sub.add_parser("score", help="produce one scoring request and print its reply")
    s.add_argument("file", help="the request body (a /score body, or a V2 inference request with --format v2)")
    _common(s)
    s.add_argument(
        "--topic", help="a topic the gateway consumes (default: the first of kafka_ingest_topics, else forestflow.requests)"
    )
    s.add_argument("--contract", required=True, help="org/project/N (org.project.N with --format v2)")
    s.add_argument("--reply-topic", help="where the gateway answers (default: kafka_reply_topic, forestflow.replies)")
    s.add_argument("--key", help="the message key (the reply carries it)")
    s.add_argument("--format", choices=sorted(CONTENT_TYPES), default="json")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    s.set_defaults(kafka_func=score)
    r = sub.add_parser(
        "replies", help="print the replies of a topic as JSON lines; follows the topic until Ctrl-C unless told when to stop"
    )
    _common(r)
    r.add_argument("--topic", help="the reply topic (default: kafka_reply_topic, forestflow.replies)")
    r.add_argument("--from-beginning", action="store_true")
    r.add_argument("--key", help="only replies with this key")
    r.add_argument("--max-replies", type=int, help="stop after this many replies")
    r.add_argument("--idle-timeout", type=float, help="stop after this many seconds without a reply")
    r.set_defaults(kafka_func=replies)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: $FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS, or kafka_bootstrap_servers in --config)",
    )
    parser.add_argument("--config", help="the gateway's TOML settings file")


def _resolve(args: argparse.Namespace) -> None:
    """Fill the options left out from the gateway's settings (environment and --config)."""
    from forestflow.settings import Settings, SettingsError

    try:
        settings = Settings.load(args.config)
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    args.bootstrap = args.bootstrap or settings.kafka_bootstrap_servers
    if not args.bootstrap:
        raise CliError("no Kafka bootstrap servers: set FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS (as for serve) or --bootstrap")
    reply_topic = settings.kafka_reply_topic or "forestflow.replies"
    if args.kafka_func is score:
        args.topic = args.topic or next(iter(settings.kafka_ingest_topic_list), "forestflow.requests")
        args.reply_topic = args.reply_topic or reply_topic
    else:
        args.topic = args.topic or reply_topic


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand."""
    # aiokafka logs each failed connection itself; the command says what failed in its own line.
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())
    logging.getLogger("aiokafka").propagate = False
    try:
        _resolve(args)
        return int(asyncio.run(args.kafka_func(args)))
    except CliError as exc:
        print(f"forestflow: error: {exc}", file=sys.stderr)
        return 2
    except KafkaConnectionError:
        print(f"forestflow: error: Kafka at {args.bootstrap} cannot be used: no broker answers there", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, KafkaError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"forestflow: error: Kafka at {args.bootstrap} cannot be used: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
