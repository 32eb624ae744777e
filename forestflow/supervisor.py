"""``forestflow serve --workers N``: one supervisor process, N worker processes behind the same ports.

The supervisor binds the HTTP socket itself and hands it to every worker (they all accept on it),
reserves the gRPC port (each worker binds it with ``SO_REUSEPORT``, which the kernel balances), and
starts the workers as fresh interpreters after binding, so no JVM or event loop ever crosses a
fork. Workers share the registry through the file store (``registry/file_store.py``; or Redis when
``redis_url`` is set, as replicas do) and append to one prediction log. A worker that exits
unexpectedly is logged and restarted with backoff; one whose release loads keep failing (its status
file says so) while another worker is ready is stopped after ``worker_broken_restart_s`` and
restarted the same way. SIGTERM or SIGINT drains and stops them all.

This module is imported by the supervisor: it must stay free of the gateway's heavy imports.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import structlog

from forestflow.ports import address_family, bind_http, check_grpc_port

log = structlog.get_logger("forestflow.supervisor")

#: Restart delays of a worker that keeps failing: doubled per failure, reset after a healthy run.
FIRST_BACKOFF_S, MAX_BACKOFF_S, HEALTHY_RUN_S = 0.5, 30.0, 60.0
#: How often the supervisor reads the workers' status files (for ``worker_broken_restart_s``).
BROKEN_CHECK_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Which worker this process is, of how many, and the listening socket it inherited."""

    index: int
    count: int
    listen_fd: int | None = None

    @property
    def replica_id(self) -> str:
        """The name this worker's counters and router state are kept under in the file store."""
        return f"w{self.index}"

    @classmethod
    def parse(cls, text: str, listen_fd: int | None) -> WorkerIdentity:
        """``"<index>/<count>"`` as the supervisor passes it."""
        index, _, count = text.partition("/")
        return cls(int(index), int(count), listen_fd)


def worker_count(setting: int) -> int:
    """The number of workers a ``workers`` setting asks for (0 = one per core this process may use)."""
    return setting if setting > 0 else len(os.sched_getaffinity(0))


# ---- worker status (readiness across workers) -----------------------------------------------------
#: How often a worker checks whether its status changed (and rewrites its file when it did).
STATUS_EVERY_S = 0.25


def _status_path(data_dir: Path, index: int) -> Path:
    return data_dir / "state" / "workers" / f"w{index}.json"


def write_worker_status(data_dir: Path, worker: WorkerIdentity, ready: bool, failed: dict[str, Any] | None = None) -> None:
    """Record whether this worker serves, and the releases whose loads fail on it (read by every
    worker's readiness route and by the supervisor)."""
    doc = {"pid": os.getpid(), "ready": ready, "failed": failed or {}}
    replace_file(_status_path(data_dir, worker.index), orjson.dumps(doc))


async def report_worker_status(data_dir: Path, worker: WorkerIdentity, status: Callable[[], tuple[bool, dict[str, Any]]]) -> None:
    """Keep this worker's status file up to date: ``status()`` is (ready, failing releases); the
    file is rewritten when it changes (runs until cancelled)."""
    last: tuple[bool, dict[str, Any]] | None = None
    while True:
        now = status()
        if now != last:
            write_worker_status(data_dir, worker, *now)
            last = now
        await asyncio.sleep(STATUS_EVERY_S)


def replace_file(path: Path, data: bytes) -> None:
    """Write a small state file whole (a temporary file renamed over it): readers never see half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def read_workers(data_dir: Path, count: int) -> dict[str, dict[str, Any]]:
    """``w<i>`` -> ``{"state": ready / loading / failed / down, "pid", "failed": {fqrv: {error, attempts}}}``
    for every worker of this gateway (``failed``: a worker not ready because release loads fail on it)."""
    out: dict[str, dict[str, Any]] = {}
    for index in range(count):
        try:
            status = orjson.loads(_status_path(data_dir, index).read_bytes())
            pid = int(status["pid"])
            os.kill(pid, 0)  # a worker that died left its file behind
        except (OSError, ValueError, KeyError, TypeError):
            out[f"w{index}"] = {"state": "down"}
            continue
        failed = status.get("failed") or {}
        state = "ready" if status.get("ready") else "failed" if failed else "loading"
        out[f"w{index}"] = {"state": state, "pid": pid, **({"failed": failed} if failed else {})}
    return out


def workers_status(data_dir: Path, count: int) -> dict[str, str]:
    """``w<i>`` -> ``ready`` / ``loading`` / ``failed`` / ``down`` for every worker of this gateway."""
    return {name: worker["state"] for name, worker in read_workers(data_dir, count).items()}


# ---- the supervisor ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff_s: float = FIRST_BACKOFF_S
    restart_at: float = 0.0
    #: Since when (monotonic) its status has said its release loads fail (None: they do not).
    broken_since: float | None = None
    #: When a worker stopped for being broken is killed if it has not exited by then.
    kill_at: float | None = None


#: Added to a worker's own stop budget before it is killed: the late-connection pauses of its drain
#: (2 x 0.5 s), closing the runner and the process exit.
STOP_MARGIN_S = 5.0


def stop_deadline_s(settings: Any) -> float:
    """How long a SIGTERMed worker gets before SIGKILL: all of its graceful stop (the drain grace,
    in-flight requests, the prediction log's flush) and a margin."""
    return float(settings.drain_grace_s + settings.shutdown_timeout_s + settings.log_flush_timeout_s + STOP_MARGIN_S)


class Supervisor:
    """Binds the ports, runs ``count`` workers, restarts the ones that die, stops them all on a signal."""

    def __init__(self, settings: Any, serve_args: list[str], count: int) -> None:
        self.settings = settings
        #: The ``serve`` arguments each worker is started with (the supervisor's own, minus --workers).
        self.serve_args = serve_args
        self.count = count
        self._stopping = False
        self._slots: list[_Slot] = []

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; raises OSError when a port is taken."""

        settings = self.settings
        http = bind_http(settings)
        check_grpc_port(settings)
        grpc_reservation, grpc_port = self._reserve_grpc_port()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        slots = self._slots = [_Slot(i) for i in range(self.count)]
        signal.signal(signal.SIGHUP, self._on_hangup)
        log.info(
            "serving",
            host=settings.host,
            port=http.getsockname()[1],
            grpc_port=grpc_port,
            workers=self.count,
            data_dir=str(settings.data_dir),
        )
        try:
            for slot in slots:
                self._start(slot, http.fileno(), grpc_port)
            checked = time.monotonic()
            while not self._stopping:
                time.sleep(0.1)
                self._watch(slots, http.fileno(), grpc_port)
                if time.monotonic() - checked >= BROKEN_CHECK_EVERY_S:
                    checked = time.monotonic()
                    self._stop_broken(slots, checked)
            log.info("stopping", workers=self.count)
            self._stop_all(slots)
        finally:
            http.close()
            if grpc_reservation is not None:
                grpc_reservation.close()
        log.info("stopped")
        return 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def _on_hangup(self, signum: int, frame: Any) -> None:
        """SIGHUP goes on to every worker: each reopens its prediction log file (log rotation)."""
        for slot in self._slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGHUP)

    def _reserve_grpc_port(self) -> tuple[socket.socket | None, int]:
        """Hold the (checked, free) gRPC port with SO_REUSEPORT for the workers to share.

        Port 0 picks a free port here, so every worker serves the same one.
        """
        settings = self.settings
        if settings.grpc_port < 0:
            return None, -1
        hold = socket.socket(address_family(settings.host), socket.SOCK_STREAM)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        hold.bind((settings.host, settings.grpc_port))  # bound, never listening: it receives no connections
        return hold, hold.getsockname()[1]

    def _start(self, slot: _Slot, listen_fd: int, grpc_port: int) -> None:
        command = [
            sys.executable, "-m", "forestflow.cli", "serve", *self.serve_args,
            "--worker", f"{slot.index}/{self.count}", "--listen-fd", str(listen_fd), "--grpc-port", str(grpc_port),
        ]  # fmt: skip
        slot.process = subprocess.Popen(command, pass_fds=(listen_fd,))
        slot.started_at = time.monotonic()
        log.info("worker_started", worker=f"w{slot.index}", pid=slot.process.pid)

    def _watch(self, slots: list[_Slot], listen_fd: int, grpc_port: int) -> None:
        now = time.monotonic()
        for slot in slots:
            process = slot.process
            if process is not None and process.poll() is not None:
                ran_s = now - slot.started_at
                if ran_s >= HEALTHY_RUN_S:
                    slot.backoff_s = FIRST_BACKOFF_S
                log.error(
                    "worker_exited",
                    worker=f"w{slot.index}",
                    pid=process.pid,
                    code=process.returncode,
                    ran_s=round(ran_s, 1),
                    restart_in_s=slot.backoff_s,
                )
                slot.process, slot.restart_at, slot.kill_at = None, now + slot.backoff_s, None
                slot.backoff_s = min(slot.backoff_s * 2, MAX_BACKOFF_S)
            elif process is None and now >= slot.restart_at and not self._stopping:
                self._start(slot, listen_fd, grpc_port)
            elif process is not None and slot.kill_at is not None and now >= slot.kill_at:
                log.error("worker_killed", worker=f"w{slot.index}", pid=process.pid)
                process.kill()
                slot.kill_at = None

    def _stop_broken(self, slots: list[_Slot], now: float) -> None:
        """SIGTERM a worker whose release loads have failed for ``worker_broken_restart_s`` while
        another worker is ready (the fault is that process's); :meth:`_watch` starts a new one."""
        bound = float(self.settings.worker_broken_restart_s)
        if bound <= 0:
            return
        workers = read_workers(self.settings.data_dir, self.count)
        for slot in slots:
            name, process = f"w{slot.index}", slot.process
            status = workers.get(name, {})
            if (
                process is None
                or process.poll() is not None
                or slot.kill_at is not None  # being stopped already
                or status.get("pid") != process.pid
                or status.get("state") != "failed"
            ):
                slot.broken_since = None
                continue
            if slot.broken_since is None:
                slot.broken_since = now
            others_ready = any(w["state"] == "ready" for other, w in workers.items() if other != name)
            if now - slot.broken_since >= bound and others_ready:
                log.error(
                    "worker_restarted_broken",
                    worker=name,
                    pid=process.pid,
                    broken_s=round(now - slot.broken_since, 1),
                    failed=sorted(status.get("failed", {})),
                )
                slot.broken_since = None
                slot.kill_at = now + stop_deadline_s(self.settings)
                process.send_signal(signal.SIGTERM)

    def _stop_all(self, slots: list[_Slot]) -> None:
        """SIGTERM every worker (each drains), wait for them, kill what outlives the grace period."""
        running = [s.process for s in slots if s.process is not None and s.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_deadline_s(self.settings)
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker_killed", pid=process.pid)
                process.kill()
                process.wait()
