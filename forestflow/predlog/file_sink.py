"""The embedded default sink: prediction events appended to a local file.

``jsonl``: one JSON object per line (``{"topic": "basic"|"graphpipe", "key": ..., "event": {...}}``,
the event in protobuf's JSON mapping, encoded by :func:`encode_event_json`). ``protobuf``: length-delimited records (varint length +
serialized event), the way protobuf's ``writeDelimitedTo`` writes them; GraphPipe events go to a
sibling file with ``.gp`` before the suffix.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import BinaryIO


from forestflow.codecs.ff_protobuf import varint
from forestflow.predlog.log import LogEntry


#: Batches up to this many bytes are written on the event loop, larger ones in a worker thread.
#: Measured (/score 100-row events, ~20 KB each, batches of ~75 at 50 ms linger): the thread hop and
#: the GIL passed back and forth cost more CPU than the write it moves off the loop (11% vs 9% of the
#: request); only a batch big enough to hold the loop for milliseconds goes to the thread.
INLINE_WRITE_BYTES = 4 * 1024 * 1024


#: Buffers per writev() call (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024


def _append(fd: int, pieces: list[bytes]) -> None:
    """Append ``pieces`` with as few writev() calls as possible: the kernel gathers them, so the
    events are not first copied into one Python string (a batch of 100-row events is megabytes)."""
    while pieces:
        chunk = pieces[:_IOV_MAX]
        written = os.writev(fd, chunk)
        pieces = pieces[_IOV_MAX:]
        total = sum(map(len, chunk))
        if written < total:  # a short write (a full disk, a signal): the rest, in order, before the next chunk
            rest = b"".join(chunk)[written:]
            while rest:
                rest = rest[os.write(fd, rest):]


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
        # A batch is an append to the page cache (a writev() without copies): written right here
        # unless it is megabytes. Handing it to a thread costs more, in the hop and the GIL.
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
                # Unbuffered O_APPEND: every batch is one write of whole events at the end of the
                # file, so the workers of one gateway can share it without interleaving events.
                fh = self._files[graphpipe] = open(self.gp_path if graphpipe else self.path, "ab", buffering=0)
            if self.fmt == "protobuf":
                pieces = [piece for e in chosen for piece in (varint(len(e.value)), e.value)]
            else:
                pieces = [piece for e in chosen for piece in (e.value, b"\n")]
            _append(fh.fileno(), pieces)

    async def close(self) -> None:
        files, self._files = self._files, {}
        for fh in files.values():
            fh.close()
