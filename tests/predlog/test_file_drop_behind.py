"""The file sink keeps only the end of its log in the page cache (log_file_cache_mb): older chunks are
handed to writeback and dropped as the file grows; every event still reaches the file."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from forestflow.predlog import file_sink
from forestflow.predlog.file_sink import FileSink
from forestflow.predlog.log import LogEntry
from forestflow.settings import Settings, SettingsError

MIB = 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (mincore on a private mapping of it)."""
    size = path.stat().st_size
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del address  # the buffer export ends before the mapping closes
        return sum(v & 1 for v in vec) * mmap.PAGESIZE


def batch(n: int, size: int) -> list[LogEntry]:
    return [LogEntry(False, None, b"%08d" % i + b"x" * (size - 9), b"\x00") for i in range(n)]


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux's")
async def test_only_the_end_of_a_growing_log_stays_in_the_page_cache(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "predictions.jsonl", cache_bytes=2 * MIB)  # chunks of 1 MiB, 2 MiB kept
    await sink.start()
    for round_ in range(20):  # 20 x 512 KiB
        if round_:
            os.fsync(sink._files[False].fileno())  # what was written is clean: the advice drops it at once
        assert await sink.send(batch(64, 8192)) == []
    path = tmp_path / "predictions.jsonl"
    assert path.stat().st_size == 20 * 64 * 8192
    assert resident_bytes(path) <= 3 * MIB, resident_bytes(path)
    lines = path.read_bytes().split(b"\n")[:-1]
    assert len(lines) == 20 * 64 and all(len(line) == 8191 for line in lines)
    await sink.close()


async def test_no_cache_limit_leaves_the_file_to_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    advised: list[tuple[int, int]] = []
    monkeypatch.setattr(file_sink, "_FADVISE", lambda fd, offset, length, advice: advised.append((offset, length)))
    sink = FileSink(tmp_path / "p.jsonl", cache_bytes=0)
    for _ in range(8):
        assert await sink.send(batch(64, 8192)) == []
    assert advised == [] and (tmp_path / "p.jsonl").stat().st_size == 8 * 64 * 8192
    await sink.close()


async def test_the_advice_covers_each_chunk_once_behind_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    advised: list[tuple[int, int]] = []
    real = os.posix_fadvise if hasattr(os, "posix_fadvise") else None

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((offset, length))
        if real is not None:
            real(fd, offset, length, advice)

    monkeypatch.setattr(file_sink, "_FADVISE", record)
    (tmp_path / "p.jsonl").write_bytes(b"y" * (MIB + 5))  # an existing file: advice starts from its end's chunk
    sink = FileSink(tmp_path / "p.jsonl", cache_bytes=2 * MIB)
    for _ in range(12):  # 6 MiB more
        assert await sink.send(batch(64, 8192)) == []
    # From the chunk the file ended in when it was opened (1 MiB): each whole chunk handed to writeback once a
    # newer one follows it, and from the second on, the chunk 2 MiB before it dropped (the old content's too).
    assert advised == [(MIB, MIB), (2 * MIB, MIB), (0, MIB), (3 * MIB, MIB), (MIB, MIB)] + [
        (4 * MIB, MIB),
        (2 * MIB, MIB),
        (5 * MIB, MIB),
        (3 * MIB, MIB),
    ]
    await sink.close()


def test_log_file_cache_mb_is_a_setting_that_reaches_the_sink(tmp_path: Path) -> None:
    from forestflow.predlog import make_sink

    sink = make_sink(Settings.load(environ={"FORESTFLOW_LOG_FILE_CACHE_MB": "16"}, overrides={"data_dir": tmp_path}))
    assert isinstance(sink, FileSink) and sink.cache_bytes == 16 * MIB
    with pytest.raises(SettingsError, match="log_file_cache_mb"):
        Settings.load(environ={"FORESTFLOW_LOG_FILE_CACHE_MB": "-1"})
