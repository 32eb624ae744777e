"""The ``forestflow`` command: serve the gateway; the admin commands (``cli_admin.py``); tail the log; score through Kafka."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import socket
import sys
from typing import Any

from forestflow.cli_admin import add_commands as add_admin_commands

DESCRIPTION = (
    "forestflow: a model-serving gateway. 'serve' runs it; the other commands talk to a running gateway "
    "(deploy, releases, stats, phase-in, shadow, undeploy, score, ...) or read its prediction log. "
    "Run 'forestflow <command> --help' for the options."
)


def _fail(message: str, code: int = 2) -> int:
    print(f"forestflow: error: {message}", file=sys.stderr)
    return code


# ---- serve --------------------------------------------------------------------------------------
class StartFailed(RuntimeError):
    """The gateway's background start failed for good (the message is one line)."""


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the gateway until SIGINT/SIGTERM."""
    from forestflow.settings import Settings, SettingsError

    try:
        settings = Settings.load(
            args.config,
            overrides={
                "host": args.host,
                "port": args.port,
                "data_dir": args.data_dir,
                "grpc_port": args.grpc_port,
                "insecure_admin": True if args.insecure_admin else None,
                "workers": args.workers,
                "repository": args.repository,
            },
        )
    except SettingsError as exc:
        return _fail(str(exc))
    from forestflow.extras import missing_for_settings

    missing = missing_for_settings(settings)  # a setting whose extra is not installed: one line, before any bind
    if missing is not None:
        return _fail(missing)
    from forestflow.datadir_lock import DataDirInUse, DataDirLock
    from forestflow.logs import configure_logging
    from forestflow.ports import PortInUse
    from forestflow.supervisor import Supervisor, WorkerIdentity, worker_count

    configure_logging(settings.log_level)
    if settings.kafka_enabled:
        from forestflow.predlog.kafka_sink import KafkaInternalsChanged, check_aiokafka

        try:
            check_aiokafka()  # refuse to start rather than deliver events twice
        except KafkaInternalsChanged as exc:
            return _fail(str(exc), code=1)
    worker = WorkerIdentity.parse(args.worker, args.listen_fd) if args.worker else None
    from forestflow.errors import GatewayError

    # The data dir has one owner for the life of this process (the file store rewrites the registry
    # from its own snapshot: a second gateway would silently undo the first one's changes). Under
    # --workers the supervisor owns it, and its workers share the registry through the file lock.
    lock = DataDirLock(settings.data_dir)
    if worker is None:
        try:
            lock.acquire()
        except DataDirInUse as exc:
            return _fail(str(exc), code=1)
        except OSError as exc:
            return _fail(f"cannot lock data dir {settings.data_dir}: {exc.strerror or exc}", code=1)
    try:
        count = worker_count(settings.workers)
        if worker is None and count > 1:
            return Supervisor(settings, _worker_args(args), count).run()
        # Until the gateway installs its own SIGHUP handler (log reopen), a SIGHUP sent during
        # start-up (logrotate, or the supervisor passing one on) must not end the process.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _run(_serve(settings, worker), settings.event_loop)
    except PortInUse as exc:
        return _fail(str(exc), code=1)
    except OSError as exc:
        if exc.strerror is None:  # raised with a whole message (e.g. the gRPC bind)
            return _fail(str(exc), code=1)
        return _fail(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror}")
    except GatewayError as exc:  # e.g. the registry store is unreachable at start
        return _fail(exc.message, code=1)
    except StartFailed as exc:
        return _fail(str(exc), code=1)
    finally:
        lock.release()
    return 0


def _run(main: Any, event_loop: str) -> None:
    """Run the server coroutine on asyncio's loop, or on uvloop when the settings ask for it."""
    if event_loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)
    else:
        asyncio.run(main)


def _worker_args(args: argparse.Namespace) -> list[str]:
    """The ``serve`` arguments a worker gets: the supervisor's own (its settings), one worker each."""
    out: list[str] = []
    flags = (
        ("--config", args.config),
        ("--host", args.host),
        ("--port", args.port),
        ("--data-dir", args.data_dir),
        ("--repository", args.repository),
    )
    for flag, value in flags:
        if value is not None:
            out += [flag, str(value)]
    if args.insecure_admin:
        out.append("--insecure-admin")
    return out


async def _serve(settings: Any, worker: Any = None) -> None:
    import structlog
    from aiohttp import web

    from forestflow.api.app import build_app, make_runner

    log = structlog.get_logger("forestflow")
    from forestflow.ports import bind_http, check_grpc_port

    # Both ports are checked before the gateway starts (loading every servable takes a while, and
    # a second gateway must not get that far on a port another one serves). A worker takes the
    # socket its supervisor bound, and the gRPC port the supervisor reserved for its workers.
    if worker is not None and worker.listen_fd is not None:
        sock = socket.socket(fileno=worker.listen_fd)
    else:
        sock = bind_http(settings)
    try:
        if worker is None:
            check_grpc_port(settings)
        app = build_app(settings, worker)
        runner = make_runner(app, settings)
        try:
            await runner.setup()
        except BaseException:
            await runner.cleanup()
            raise
    except BaseException:
        sock.close()
        raise
    # What start-up loaded (modules, restored servables) lives as long as the process: move it out
    # of the collector's reach, or every full pass walks it and pauses the loop for tens of ms.
    gc.collect()
    gc.freeze()
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()
    log.info("serving", host=settings.host, port=sock.getsockname()[1], data_dir=str(settings.data_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from forestflow.api.common import GATEWAY, STARTING

    # SIGHUP (logrotate's postrotate): the file log reopens its path before its next write.
    loop.add_signal_handler(signal.SIGHUP, app[GATEWAY].prediction_log.reopen)
    # A start that fails for good (not a store that is away: that is retried) ends the process
    # with a non-zero status, rather than leaving it alive and never ready.
    failed: list[BaseException] = []

    def start_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            failed.append(error)
            stop.set()

    app[STARTING].add_done_callback(start_done)
    await stop.wait()
    if failed:
        await runner.cleanup()
        sock.close()
        error = failed[0]
        raise StartFailed(f"gateway start failed: {type(error).__name__}: {' '.join(str(error).split())}")
    # A worker shares its listener with the supervisor and the other workers: it must not change it.
    await _drain(app, runner, settings, stop, log, sock, owns_listener=worker is None or worker.listen_fd is None)


#: How long connections accepted right before the listener closed have to send their request.
#: (``supervisor.STOP_MARGIN_S`` covers the twice this may be waited.)
_LATE_REQUEST_S = 0.5


async def _drain(
    app: Any, runner: Any, settings: Any, stop: asyncio.Event, log: Any, sock: socket.socket, *, owns_listener: bool
) -> None:
    """Graceful stop: readiness fails at once; requests are still accepted for ``drain_grace_s``
    (load balancers take a moment to stop sending); then the listener closes, in-flight requests
    finish (up to ``shutdown_timeout_s``), the prediction log is flushed, and the process exits 0.
    A second signal cuts the grace period short. No connection that was accepted is reset: new
    handshakes are refused first, and what the kernel's accept queue still holds when the listener
    closes is accepted and served."""
    from forestflow.api.common import GATEWAY
    from forestflow.ports import accept_pending, refuse_new_handshakes

    gateway = app[GATEWAY]
    gateway.draining = True
    log.info("draining", grace_s=settings.drain_grace_s, shutdown_timeout_s=settings.shutdown_timeout_s)
    stop.clear()
    try:
        await asyncio.wait_for(stop.wait(), settings.drain_grace_s)
    except TimeoutError:
        pass
    refusing = owns_listener and refuse_new_handshakes(sock)
    log.info("stopping", refusing_new_connections=refusing)
    # A client that connected a moment ago sends its request a moment later: give it that moment
    # (the loop still accepts what is queued), or aiohttp would close its connection as idle.
    await asyncio.sleep(_LATE_REQUEST_S)
    late = accept_pending(sock)  # with no await before the close: nothing can queue in between
    for site in list(runner.sites):
        await site.stop()  # the listener closes here
    if late:
        loop = asyncio.get_running_loop()
        for conn in late:
            await loop.connect_accepted_socket(runner.server, conn)
        log.info("late_connections_adopted", count=len(late))
        await asyncio.sleep(_LATE_REQUEST_S)
    await runner.cleanup()
    stats = gateway.prediction_log.stats
    # written after (and with) every buffered access line
    log.info("stopped", log_produced=stats.produced, log_delivered=stats.delivered, log_dropped=stats.dropped)


# ---- client commands ------------------------------------------------------------------------------
def cmd_logs_tail(args: argparse.Namespace) -> int:
    """Print prediction events (Kafka, or the local file log) as JSON lines."""
    from forestflow.predlog.tail import run_tail

    return run_tail(args)


def cmd_kafka(args: argparse.Namespace) -> int:
    """Score through Kafka by hand: produce a request and print its reply, or print replies."""
    from forestflow.kafka_cli import run

    return run(args)


# ---- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="forestflow", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    serve = sub.add_parser("serve", help="run the gateway", description="Run the gateway until SIGINT or SIGTERM.")
    serve.add_argument("--config", help="TOML settings file (see config/)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8090)")
    serve.add_argument("--grpc-port", type=int, help="V2 gRPC port (default 8081, -1 disables)")
    serve.add_argument("--data-dir", help="state directory, owned by one gateway at a time (default ./forestflow-data)")
    serve.add_argument("--insecure-admin", action="store_true", help="allow a non-loopback bind without admin token")
    serve.add_argument("--workers", type=int, help="worker processes behind the same ports (default 1, 0 = one per core)")
    # Set by the supervisor on the workers it starts: which worker, and the listening socket inherited.
    serve.add_argument("--worker", help=argparse.SUPPRESS)
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--repository", help="model repository directory: its entries are deployed at start")
    serve.set_defaults(func=cmd_serve)

    add_admin_commands(sub)  # deploy, contracts, releases, stats, phase-in, shadow, ... (cli_admin.py)

    logs = sub.add_parser("logs", help="prediction log tools", description="Prediction log tools.")
    logs_sub = logs.add_subparsers(dest="logs_command", required=True, metavar="command")
    tail = logs_sub.add_parser(
        "tail",
        help="print prediction events as JSON lines (Kafka, or the local file log)",
        description="Print prediction events as JSON lines: from Kafka when bootstrap servers are configured, "
        "else from the gateway's local file log (jsonl or protobuf).",
    )
    from forestflow.predlog.tail import add_tail_arguments

    add_tail_arguments(tail)
    tail.set_defaults(func=cmd_logs_tail)

    kafka = sub.add_parser("kafka", help="score through Kafka by hand (see kafka_ingest_topics)")
    from forestflow.kafka_cli import add_arguments as add_kafka_arguments

    add_kafka_arguments(kafka)
    kafka.set_defaults(func=cmd_kafka)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forestflow`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
