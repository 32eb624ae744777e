"""``forestflow logs tail``: print the prediction events of a Kafka topic as JSON lines.

Without Kafka bootstrap servers (no ``--bootstrap``, no ``FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS``, none
in ``--config``) it reads the gateway's local file log instead (:mod:`forestflow.predlog.file_tail`).

No consumer group is involved: the tail assigns itself every partition of the topic and starts
at the beginning or at the end of each, so it never moves anyone's committed offsets. Each event
is printed as one JSON object, the event in protobuf's JSON mapping (camelCase, as
:func:`~forestflow.predlog.encode.event_to_dict` gives it) plus the record's ``key``,
``partition``, ``offset`` and ``timestamp`` (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from google.protobuf.message import DecodeError

from forestflow.predlog.convert import to_forestflow
from forestflow.predlog.encode import event_to_dict

#: ``--format`` values: events as they were logged, or V2 wire events converted to ForestFlow's shape.
FORMATS = ("logged", "forestflow")

#: How often the tail looks again for a topic that does not exist yet.
_TOPIC_POLL_S = 0.5


def _decode(value: bytes, graphpipe: bool | None, topic: str) -> dict[str, Any]:
    """The event as a dict; ``graphpipe=None`` guesses from the topic name, then by trying."""
    if graphpipe is None:
        if topic.endswith(".gp"):
            graphpipe = True
        else:
            try:
                return event_to_dict(value, graphpipe=False)
            except DecodeError:
                graphpipe = True
    return event_to_dict(value, graphpipe=graphpipe)


def _line(record: Any, graphpipe: bool | None, fmt: str = "logged") -> dict[str, Any]:
    key = record.key.decode("utf-8", errors="replace") if record.key is not None else None
    try:
        event = _decode(record.value or b"", graphpipe, record.topic)
    except DecodeError as exc:
        event = {"error": f"not a prediction event: {exc}", "valueBase64": base64.b64encode(record.value or b"").decode()}
    if fmt == "forestflow":
        event = to_forestflow(event)
    # The record's coordinates go last so an event field of the same name cannot hide them.
    return {**event, "key": key, "partition": record.partition, "offset": record.offset, "timestamp": record.timestamp}


async def _partitions(consumer: AIOKafkaConsumer, topic: str, deadline: float | None) -> set[int] | None:
    """The topic's partitions, waiting for the topic to appear (None if the deadline passes)."""
    while True:
        parts: set[int] | None = consumer.partitions_for_topic(topic)
        if parts:
            return parts
        await consumer.topics()  # refreshes the cluster metadata
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return parts
        if deadline is not None and time.monotonic() >= deadline:
            return None
        await asyncio.sleep(_TOPIC_POLL_S)


async def tail(
    bootstrap: str,
    topic: str,
    from_beginning: bool,
    key: str | None,
    out: TextIO,
    graphpipe: bool | None = None,
    max_events: int | None = None,
    idle_timeout_s: float | None = None,
    fmt: str = "logged",
) -> int:
    """Print the topic's events to ``out`` as JSON lines until stopped; return how many were printed.

    ``key`` keeps only records whose key is exactly that string. ``graphpipe`` says which event
    type the topic holds (None: a topic ending in ``.gp`` is GraphPipe, otherwise a
    PredictionEvent is tried first). The tail stops after ``max_events`` printed events, or when
    no record has arrived for ``idle_timeout_s`` seconds; with neither it runs until cancelled.
    ``fmt`` "forestflow" converts V2 wire events to ForestFlow's shape.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        client_id="forestflow-tail",
        auto_offset_reset="earliest" if from_beginning else "latest",
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    printed = 0
    wanted = key.encode() if key is not None else None
    try:
        last_activity = time.monotonic()
        idle_deadline = None if idle_timeout_s is None else last_activity + idle_timeout_s
        parts = await _partitions(consumer, topic, idle_deadline)
        if parts is None:
            return 0
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        if from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the start positions now, not lazily at the first fetch
            await consumer.position(tp)
        last_activity = time.monotonic()
        while max_events is None or printed < max_events:
            if idle_timeout_s is not None:
                left = last_activity + idle_timeout_s - time.monotonic()
                if left <= 0:
                    break
                timeout_ms = int(min(left, 1.0) * 1000) or 1
            else:
                timeout_ms = 1000
            batches = await consumer.getmany(timeout_ms=timeout_ms)
            records = sorted((r for rs in batches.values() for r in rs), key=lambda r: (r.timestamp, r.partition, r.offset))
            if records:
                last_activity = time.monotonic()
            for record in records:
                if wanted is not None and record.key != wanted:
                    continue
                out.write(orjson.dumps(_line(record, graphpipe, fmt)).decode() + "\n")
                printed += 1
                if max_events is not None and printed >= max_events:
                    break
            out.flush()
    finally:
        await consumer.stop()
    return printed


def add_tail_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``forestflow logs tail`` to ``parser``."""
    default_bootstrap = os.environ.get("FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS") or None
    parser.add_argument(
        "--bootstrap",
        default=default_bootstrap,
        help="Kafka bootstrap servers host:port[,host:port] (default: $FORESTFLOW_KAFKA_BOOTSTRAP_SERVERS, "
        "else kafka_bootstrap_servers in --config; with none, the local file log is read)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="logged",
        help="logged: events as they were written; forestflow: V2 events (request and answer as on the wire) "
        "converted to ForestFlow's inferenceRequest/prediction",
    )
    parser.add_argument(
        "--topic",
        default=os.environ.get("FORESTFLOW_KAFKA_TOPIC", "forestflow.predictions"),
        help="Kafka topic to read (default: %(default)s)",
    )
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest event instead of new ones (a file log read without --follow always starts there)",
    )
    parser.add_argument("--key", default=None, help="print only events with exactly this key")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="file log: keep printing new events as they are written (Kafka is always followed)",
    )
    parser.add_argument("--config", help="the gateway's TOML settings file (for its data dir, log file and Kafka)")
    parser.add_argument("--data-dir", help="the gateway's data dir (default: ./forestflow-data, or as --config sets)")
    parser.add_argument("--file", help="read this log file (default: <data dir>/predictions.jsonl, or as --config sets)")
    parser.add_argument(
        "--file-format",
        choices=("jsonl", "protobuf"),
        default=None,
        help="format of the file log (default: as --config sets, else jsonl)",
    )
    parser.add_argument(
        "--graphpipe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Kafka: the topic holds PredictionEventGP (default: topics ending in .gp do)",
    )
    parser.add_argument("--max-events", type=int, default=None, help="stop after printing this many events")
    parser.add_argument("--idle-timeout", type=float, default=None, help="stop after this many seconds without events")


def _file_source(args: argparse.Namespace) -> tuple[str | None, Path, str]:
    """``(bootstrap servers or None, file log path, file format)`` from the options and settings."""
    from forestflow.settings import Settings

    settings = Settings.load(getattr(args, "config", None), overrides={"data_dir": getattr(args, "data_dir", None)})
    bootstrap = args.bootstrap or settings.kafka_bootstrap_servers or None
    path = Path(args.file) if getattr(args, "file", None) else settings.data_dir / settings.log_file
    return bootstrap, path, getattr(args, "file_format", None) or settings.log_file_format


def run_tail(args: argparse.Namespace) -> int:
    """Run the tail for parsed CLI arguments; return the process exit status."""
    from forestflow.settings import SettingsError

    convert = getattr(args, "format", "logged")
    try:
        bootstrap, path, file_format = _file_source(args)
    except SettingsError as exc:
        print(f"forestflow logs tail: {exc}", file=sys.stderr)
        return 2
    try:
        if bootstrap is None:
            from forestflow.predlog.file_tail import tail_file

            if not path.exists() and not getattr(args, "follow", False):
                print(f"forestflow logs tail: no prediction log at {path} (no Kafka configured either)", file=sys.stderr)
                return 1
            tail_file(
                path,
                file_format,
                sys.stdout,
                convert=convert == "forestflow",
                from_beginning=args.from_beginning,
                follow=getattr(args, "follow", False),
                key=args.key,
                max_events=getattr(args, "max_events", None),
                idle_timeout_s=getattr(args, "idle_timeout", None),
            )
            return 0
        args.bootstrap = bootstrap
        asyncio.run(
            tail(
                bootstrap,
                args.topic,
                args.from_beginning,
                args.key,
                sys.stdout,
                graphpipe=getattr(args, "graphpipe", None),
                max_events=getattr(args, "max_events", None),
                idle_timeout_s=getattr(args, "idle_timeout", None),
                fmt=convert,
            )
        )
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep the interpreter's final
        # flush of stdout from failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KafkaError as exc:
        print(f"forestflow logs tail: cannot read {args.topic} from {args.bootstrap}: {exc}", file=sys.stderr)
        return 1
    return 0
