"""The embedded default sink: prediction events appended to a local file.

``jsonl``: one JSON object per line (``{"topic": "basic"|"graphpipe", "key": ..., "event": {...}}``,
the event in protobuf's JSON mapping, encoded by :func:`encode_event_json`). ``protobuf``:
length-delimited records (varint length + serialized event), the way protobuf's ``writeDelimitedTo``
writes them; GraphPipe events go to a sibling file with ``.gp`` before the suffix.
"""

from __future__ import annotations

import asyncio
import os
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO

import structlog

from forestflow.codecs.ff_protobuf import varint
from forestflow.predlog.log import LogEntry

log = structlog.get_logger("forestflow.predlog")
#: An entry's value, read in C by map() (the batch loops run once per event).
_VALUE = attrgetter("value")


#: Batches up to this many bytes are written on the event loop, larger ones in a worker thread.
#: Measured (/score 100-row events, ~20 KB each, batches of ~75 at 50 ms linger): the thread hop and
#: the GIL passed back and forth cost more CPU than the write it moves off the loop (11% vs 9% of the
#: request); only a batch big enough to hold the loop for milliseconds goes to the thread.
INLINE_WRITE_BYTES = 4 * 1024 * 1024


#: Bytes of waiting events the prediction log writes at once, from ``emit``, without waiting for its linger
#: (``WritingSink.ship_bytes``): written while they are still in the core's cache, and a gateway that dies
#: loses at most this much or a linger's worth. bench/logging_cost.py, side by side with the drain's 500-event
#: batches (docs/performance.md, issue 45's ninth round): 1-row GraphPipe events cost 9.0-14.5% of a request
#: against 13.3-17.6% (four runs each), the other file cells the same within the noise; every 64 KB (a bench
#: variant) 100-row GraphPipe events cost 18-19% against 14%.
SHIP_BYTES = 256 * 1024


#: Buffers per writev() call (Linux's IOV_MAX is 1024).
_IOV_MAX = 1024

#: posix_fadvise where the platform has it (Linux does; macOS does not: the cache is then left to the kernel).
_FADVISE = getattr(os, "posix_fadvise", None)


class _DropBehind:
    """Keeps ``cache_bytes`` of a growing log file's end in the page cache and drops the rest as it ages.

    A prediction log is written once and read, if at all, near its end (``forestflow logs tail``, a log
    shipper). Left to the kernel, every appended page is a new page-cache page that stays until memory runs
    short; taking fresh pages is most of what a write costs (a loop of 20 KB appends on this project's VM:
    14-30 us of kernel time each, 5-8 us with drop-behind; docs/performance.md), and the log evicts the pages
    other work reads. So each time the file grows by a chunk (an eighth of ``cache_bytes``), the chunk
    before the newest one is handed to writeback (``POSIX_FADV_DONTNEED`` starts writeback of dirty pages
    without waiting for it) and the chunk ``cache_bytes`` further back, written back by then, is dropped. No
    call waits for a write to complete. Offsets are the file's, so the workers appending to one file each advise the
    same ranges."""

    def __init__(self, cache_bytes: int) -> None:
        self.chunk = max(1 << 20, cache_bytes // 8)
        self.keep = max(cache_bytes, 2 * self.chunk)
        #: The offset below which writeback was started, a multiple of ``chunk``; None: off for this file.
        self.started: int | None = None

    def opened(self, fd: int) -> None:
        """Start at the end of the file as it is opened (what was there is left as it is)."""
        try:
            self.started = os.lseek(fd, 0, os.SEEK_END) // self.chunk * self.chunk if _FADVISE is not None else None
        except OSError:  # not seekable (a FIFO): nothing to drop
            self.started = None

    def written(self, fd: int) -> None:
        """After an append: advise the chunks the file's end has moved past."""
        started = self.started
        if started is None or _FADVISE is None:
            return
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            while end - started >= 2 * self.chunk:
                _FADVISE(fd, started, self.chunk, os.POSIX_FADV_DONTNEED)  # writeback starts
                if started >= self.keep:
                    _FADVISE(fd, started - self.keep, self.chunk, os.POSIX_FADV_DONTNEED)  # written back: dropped
                started += self.chunk
        except OSError as exc:  # not a regular file (a FIFO, a device): nothing to drop
            log.info("prediction_log_drop_behind_off", error=str(exc))
            self.started = None
            return
        self.started = started


def _inline(entries: list[LogEntry]) -> bool:
    """Whether a batch is small enough to write on the event loop (:data:`INLINE_WRITE_BYTES`)."""
    return sum(map(len, map(_VALUE, entries))) <= INLINE_WRITE_BYTES


class _PartialWrite(Exception):
    """A write that failed after ``done`` bytes reached the file."""

    def __init__(self, done: int, cause: OSError) -> None:
        super().__init__(str(cause))
        self.done = done
        self.cause = cause


def _append(fd: int, pieces: list[bytes]) -> None:
    """Append ``pieces`` with as few writev() calls as possible: the kernel gathers them, so the
    events are not first copied into one Python string (a batch of 100-row events is megabytes).
    A failure raises :class:`_PartialWrite` saying how many bytes were written before it."""
    done = 0
    try:
        while pieces:
            chunk = pieces[:_IOV_MAX]
            written = os.writev(fd, chunk)
            done += written
            pieces = pieces[_IOV_MAX:]
            total = sum(map(len, chunk))
            if written < total:  # a short write (a full disk, a signal): the rest, in order, before the next chunk
                rest = b"".join(chunk)[written:]
                while rest:
                    n = os.write(fd, rest)
                    done += n
                    rest = rest[n:]
    except OSError as exc:
        raise _PartialWrite(done, exc) from exc


class FileSink:
    """Appends events to a file (in a worker thread only when a batch is megabytes).

    Follows rotation: before each batch the path's inode is compared with the open file's (one
    ``stat``), and a file renamed or removed (logrotate's ``mv``) is closed and the path opened anew;
    :meth:`reopen` (SIGHUP) forces that. A write that fails half-way returns only the events that
    did not reach the file, and the next attempt completes a half-written event instead of
    writing it again: no event is written twice. Only the last ``cache_bytes`` of each file stay in the
    page cache (:class:`_DropBehind`).
    """

    name = "file"
    #: See :data:`SHIP_BYTES`.
    ship_bytes = SHIP_BYTES

    def __init__(self, path: Path, fmt: str = "jsonl", cache_bytes: int = 64 * 1024 * 1024) -> None:
        self.path = path
        self.gp_path = path.with_name(f"{path.stem}.gp{path.suffix}")
        self.fmt = fmt
        #: What PredictionLog encodes entries as for this sink.
        self.encoding = "jsonl" if fmt == "jsonl" else "protobuf"
        self._files: dict[bool, BinaryIO] = {}
        #: Per file: the entry a failed write left half-written, and how many of its bytes are in.
        self._resume: dict[bool, tuple[LogEntry, int]] = {}
        self._inodes: dict[bool, tuple[int, int]] = {}
        #: Bytes of each file's end kept in the page cache (``log_file_cache_mb``); 0 leaves it to the kernel.
        self.cache_bytes = cache_bytes
        self._behind: dict[bool, _DropBehind] = {}
        self._reopen_requested = False
        #: Times a file was reopened (rotation seen, or SIGHUP).
        self.reopened = 0
        #: Why the last write failed, None once one succeeds (the log's ``failing_reason`` reports it).
        self.last_error: str | None = None

    def reopen(self) -> None:
        """Close and reopen the files before the next batch (SIGHUP, after a rotation)."""
        self._reopen_requested = True

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    async def send(self, entries: list[LogEntry]) -> list[LogEntry]:
        # A batch is an append to the page cache (a writev() without copies): written right here
        # unless it is megabytes. Handing it to a thread costs more, in the hop and the GIL.
        if _inline(entries):
            return self._write(entries)
        return await asyncio.to_thread(self._write, entries)

    def write_now(self, entries: list[LogEntry]) -> list[LogEntry] | None:
        """Write a batch on the event loop; the entries that did not reach the file, or None for a batch of
        megabytes (left to :meth:`send`, which writes it in a worker thread)."""
        return self._write(entries) if _inline(entries) else None

    def _file(self, graphpipe: bool) -> BinaryIO:
        """The open file for ``graphpipe`` events, reopened if its path now names another file."""
        path = self.gp_path if graphpipe else self.path
        fh = self._files.get(graphpipe)
        if fh is not None:
            try:
                st = os.stat(path)
                rotated = (st.st_ino, st.st_dev) != self._inodes[graphpipe]
            except FileNotFoundError:
                rotated = True
            if rotated:
                self._files.pop(graphpipe).close()
                self.reopened += 1
                fh = None
        if fh is None:
            # Unbuffered O_APPEND: every batch is one write of whole events at the end of the
            # file, so the workers of one gateway can share it without interleaving events.
            fh = self._files[graphpipe] = open(path, "ab", buffering=0)
            st = os.fstat(fh.fileno())
            inode = (st.st_ino, st.st_dev)
            if self._inodes.get(graphpipe) != inode:
                # Another file than the one a half-written event went to (rotated by logrotate, or while the
                # log waited to retry the write): the old file keeps the torn start, this one gets the event
                # whole. The same file reopened (SIGHUP alone) gets the rest of the event.
                self._resume.pop(graphpipe, None)
            self._inodes[graphpipe] = inode
            if self.cache_bytes:
                behind = self._behind[graphpipe] = _DropBehind(self.cache_bytes)
                behind.opened(fh.fileno())
        return fh

    def _write(self, entries: list[LogEntry]) -> list[LogEntry]:
        """Write a batch; return the entries that did not reach the file."""
        failed: list[LogEntry] = []
        if self._reopen_requested:
            self._reopen_requested = False
            for fh in self._files.values():
                fh.close()
                self.reopened += 1
            self._files.clear()
        gp = [e for e in entries if e.graphpipe]
        # One pass over the batch when it holds no GraphPipe event (nearly always).
        for graphpipe, chosen in ((False, [e for e in entries if not e.graphpipe] if gp else entries), (True, gp)):
            if not chosen:
                continue
            try:
                fh = self._file(graphpipe)
            except OSError as exc:
                self.last_error = str(exc)
                log.warning("prediction_log_file_open_failed", path=str(self.gp_path if graphpipe else self.path), error=str(exc))
                failed += chosen
                continue
            if self.fmt == "protobuf":
                framed = [(varint(len(e.value)), e.value) for e in chosen]
            else:
                framed = list(zip(map(_VALUE, chosen), repeat(b"\n")))  # iterated in C: this runs per event
            skip, prefix = 0, b""
            resume = self._resume.pop(graphpipe, None)
            if resume is not None and resume[0] is chosen[0]:
                skip = resume[1]  # that many bytes of the first event are already in the file
            elif resume is not None and self.fmt == "jsonl":
                prefix = b"\n"  # the torn event was dropped meanwhile: end its line
            pieces = list(chain.from_iterable(framed))
            if skip:
                pieces[:2] = [b"".join(framed[0])[skip:]]
            if prefix:
                pieces.insert(0, prefix)
            try:
                _append(fh.fileno(), pieces)
                if self.cache_bytes:
                    self._behind[graphpipe].written(fh.fileno())
            except _PartialWrite as exc:
                if exc.done < len(prefix):
                    self._resume[graphpipe] = resume  # type: ignore[assignment]  # set above whenever prefix is
                    failed += chosen
                else:
                    done, index = exc.done - len(prefix) + skip, 0
                    while index < len(framed) and done >= len(framed[index][0]) + len(framed[index][1]):
                        done -= len(framed[index][0]) + len(framed[index][1])
                        index += 1
                    if done:
                        self._resume[graphpipe] = (chosen[index], done)
                    failed += chosen[index:]
                self.last_error = str(exc.cause)
                log.warning("prediction_log_write_failed", path=fh.name, error=str(exc.cause))
        if not failed:
            self.last_error = None
        return failed

    async def close(self) -> None:
        files, self._files = self._files, {}
        for fh in files.values():
            fh.close()
