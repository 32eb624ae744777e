"""One owner per data directory: an exclusive lock held for the life of ``forestflow serve``.

The file store rewrites ``state/registry.json`` from its own snapshot, so two gateways on one data
dir silently undo each other's writes. The first gateway takes ``<data_dir>/forestflow.lock``
(``flock``, released by the kernel when the process ends, however it ends) and writes its pid
there; a second one fails at start with a line naming that pid.

The process that serves takes the lock once (``cli.cmd_serve``); child processes it forks share
the lock's open file, so workers of one gateway need no lock of their own.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

#: The lock file's name inside the data directory.
LOCK_NAME = "forestflow.lock"


class DataDirInUse(Exception):
    """Another process holds the data directory's lock."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        self.data_dir = data_dir
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(
            f"data dir {data_dir} is in use by another forestflow process ({holder}); stop it or pass another --data-dir"
        )


class DataDirLock:
    """The exclusive lock on one data directory (a context manager)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting; raise :class:`DataDirInUse` naming the holder's pid."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirInUse(self.data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock back (the file stays: removing it would race the next owner)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote (None if it has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
