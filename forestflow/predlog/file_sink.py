"""The embedded default sink: prediction events appended to a local file.

``jsonl``: one JSON object per line (``{"topic": "basic"|"graphpipe", "key": ..., "event": {...}}``,
the event in protobuf's JSON mapping, encoded by :func:`encode_event_json`). ``protobuf``: length-delimited records (varint length +
serialized event), the way protobuf's ``writeDelimitedTo`` writes them; GraphPipe events go to a
sibling file with ``.gp`` before the suffix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import BinaryIO

from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from forestflow.predlog.log import LogEntry


#: Batches up to this many bytes are written on the event loop, larger ones in a worker thread.
INLINE_WRITE_BYTES = 64 * 1024


class FileSink:
    """Appends events to a file; each batch is written and flushed in a worker thread."""

    name = "file"

    def __init__(self, path: Path, fmt: str = "jsonl") -> None:
        self.path = path
        self.gp_path = path.with_name(f"{path.stem}.gp{path.suffix}")
        self.fmt = fmt
        #: What PredictionLog encodes entries as for this sink.
        self.encoding = "jsonl" if fmt == "jsonl" else "protobuf"
        self._files: dict[bool, BinaryIO] = {}

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        # A small batch is an append to the page cache (microseconds): written right here. Handing
        # it to a thread would cost more, in the hop and the GIL passed back and forth.
        if sum(len(e.value) for e in entries) <= INLINE_WRITE_BYTES:
            self._write(entries)
        else:
            await asyncio.to_thread(self._write, entries)
        return []

    def _write(self, entries: list[LogEntry]) -> None:
        for graphpipe in (False, True):
            chosen = [e for e in entries if e.graphpipe == graphpipe]
            if not chosen:
                continue
            fh = self._files.get(graphpipe)
            if fh is None:
                # Unbuffered O_APPEND: every batch is one write() of whole events at the end of the
                # file, so the workers of one gateway can share it without interleaving events.
                fh = self._files[graphpipe] = open(self.gp_path if graphpipe else self.path, "ab", buffering=0)
            if self.fmt == "protobuf":
                data = b"".join(_VarintBytes(len(e.value)) + e.value for e in chosen)
            else:
                data = b"".join(e.value + b"\n" for e in chosen)
            written = fh.write(data) or 0
            while written < len(data):  # a short write (a full disk, a signal): append the rest
                written += fh.write(memoryview(data)[written:]) or 0

    async def close(self) -> None:
        files, self._files = self._files, {}
        for fh in files.values():
            fh.close()
