"""``forestflow logs tail`` on the local file log (the embedded default, when Kafka is not configured).

Reads the file the gateway's :class:`~forestflow.predlog.file_sink.FileSink` writes, in either of
its formats: ``jsonl`` (one ``{"topic", "key", "event"}`` object per line) or ``protobuf``
(length-delimited PredictionEvent records, no key stored: the key is derived from the event's
logging settings and request configs, as the gateway derived it). GraphPipe events live in the
sibling ``<stem>.gp<suffix>`` file; both files are read. Each event is printed like the Kafka tail
prints it: the event in protobuf's JSON mapping plus ``key``, ``topic`` and ``offset`` (the
record's index in its file).

Only whole records are read: a line or record the gateway is still writing waits for the next poll.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import orjson
from google.protobuf.message import DecodeError

from forestflow.codecs.ff_protobuf import read_varint
from forestflow.predlog.convert import to_forestflow
from forestflow.predlog.encode import event_to_dict

#: How often ``--follow`` looks for new records.
POLL_S = 0.2
#: Bytes read at a time (the log can be far larger than memory should hold).
READ_CHUNK = 4 * 1024 * 1024


@dataclass
class TailRecord:
    """One event read from the file log, ready to print."""

    event: dict[str, Any]
    key: str | None
    topic: str
    offset: int

    def line(self) -> dict[str, Any]:
        """The printed object; the record's coordinates last so an event field cannot hide them."""
        return {**self.event, "key": self.key, "topic": self.topic, "offset": self.offset}

    @property
    def time_ms(self) -> int:
        """The event's time (for merging the two files in order)."""
        try:
            return int(self.event.get("eventTimeMS", 0))
        except (TypeError, ValueError):
            return 0


def derived_key(event: dict[str, Any], graphpipe: bool) -> str | None:
    """The key the gateway gave the event: the key features' configs joined by the separator."""
    logging = event.get("loggingSettings") or {}
    names = logging.get("keyFeatures") or []
    separator = logging.get("keyFeaturesSeparator", ".")
    if graphpipe:
        configs = _graphpipe_configs(event.get("inferBytes", ""))
    else:
        configs = (event.get("inferenceRequest") or {}).get("configs") or {}
    parts = [configs[name] for name in names if name in configs]
    return separator.join(parts) if parts else None


def _graphpipe_configs(infer_b64: str) -> dict[str, str]:
    from forestflow.codecs.graphpipe import GPInferRequest, parse_config, parse_request

    try:
        parsed = parse_request(base64.b64decode(infer_b64))
    except Exception:  # a request the gateway logged but could not parse: no key
        return {}
    return parse_config(parsed.config) if isinstance(parsed, GPInferRequest) else {}


class FileReader:
    """Reads whole records appended to one log file since the last call."""

    def __init__(self, path: Path, fmt: str, graphpipe: bool) -> None:
        self.path = path
        self.fmt = fmt
        self.graphpipe = graphpipe
        self.position = 0
        self.index = 0

    def skip_to_end(self) -> None:
        """Start after what the file holds now (only records written later are read)."""
        for _ in self.read():
            pass

    def read(self) -> Iterator[TailRecord]:
        """The records completed since the last call."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return
        with fh:
            size = fh.seek(0, 2)
            if size < self.position:  # truncated or replaced: start over
                self.position = self.index = 0
            chunk = READ_CHUNK
            while self.position < size:
                fh.seek(self.position)
                data = fh.read(min(chunk, size - self.position))
                used = 0
                for end, record in self._parse(data):
                    used = end
                    yield record
                if used == 0:
                    if len(data) < chunk:
                        return  # an incomplete record at the end: wait for the rest
                    chunk *= 2  # one record larger than the chunk
                    continue
                self.position += used

    def _parse(self, data: bytes) -> Iterator[tuple[int, TailRecord]]:
        if self.fmt == "jsonl":
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                line = data[start:end]
                start = end + 1
                if line.strip():
                    yield start, self._from_json(line)
            return
        pos = 0
        while pos < len(data):
            try:
                length, body_start = read_varint(data, pos)
            except ValueError:
                return  # the length itself is still being written
            if body_start + length > len(data):
                return
            payload = data[body_start : body_start + length]
            pos = body_start + length
            yield pos, self._from_protobuf(payload)

    def _next_offset(self) -> int:
        self.index += 1
        return self.index - 1

    def _from_json(self, line: bytes) -> TailRecord:
        topic = "graphpipe" if self.graphpipe else "basic"
        try:
            doc = orjson.loads(line)
            return TailRecord(doc["event"], doc.get("key"), doc.get("topic", topic), self._next_offset())
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            event = {"error": f"not a prediction event: {exc}", "line": line.decode("utf-8", "replace")}
            return TailRecord(event, None, topic, self._next_offset())

    def _from_protobuf(self, payload: bytes) -> TailRecord:
        topic = "graphpipe" if self.graphpipe else "basic"
        try:
            event = event_to_dict(payload, graphpipe=self.graphpipe)
        except DecodeError as exc:
            event = {"error": f"not a prediction event: {exc}", "valueBase64": base64.b64encode(payload).decode()}
            return TailRecord(event, None, topic, self._next_offset())
        return TailRecord(event, derived_key(event, self.graphpipe), topic, self._next_offset())


def tail_file(
    path: Path,
    fmt: str,
    out: TextIO,
    *,
    from_beginning: bool = False,
    follow: bool = False,
    key: str | None = None,
    max_events: int | None = None,
    idle_timeout_s: float | None = None,
    convert: bool = False,
) -> int:
    """Print the file log's events (and its GraphPipe sibling's) as JSON lines; return how many.

    ``convert``: V2 events (request and answer as on the wire) in ForestFlow's shape
    (``logs tail --format forestflow``); other events are printed as they are.

    Without ``follow`` the files are read once, from the beginning, and the tail stops. With it,
    the tail starts at the end (or the beginning with ``from_beginning``) and keeps printing new
    events until ``max_events`` were printed, ``idle_timeout_s`` passed without one, or it is
    interrupted.
    """
    readers = [FileReader(path, fmt, False), FileReader(path.with_name(f"{path.stem}.gp{path.suffix}"), fmt, True)]
    if follow and not from_beginning:
        for reader in readers:
            reader.skip_to_end()
    printed = 0
    last_activity = time.monotonic()
    while True:
        batch = sorted((r for reader in readers for r in reader.read()), key=lambda r: r.time_ms)
        for record in batch:
            if key is not None and record.key != key:
                continue
            if convert:
                record.event = to_forestflow(record.event)
            out.write(orjson.dumps(record.line()).decode() + "\n")
            printed += 1
            if max_events is not None and printed >= max_events:
                out.flush()
                return printed
        out.flush()
        if batch:
            last_activity = time.monotonic()
        if not follow:
            return printed
        if idle_timeout_s is not None and time.monotonic() - last_activity >= idle_timeout_s:
            return printed
        time.sleep(POLL_S)
