"""The ``forestflow`` command: serve the gateway, deploy servables, list contracts, tail the log."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

DEFAULT_URL = "http://127.0.0.1:8090"


def _fail(message: str, code: int = 2) -> int:
    print(f"forestflow: error: {message}", file=sys.stderr)
    return code


# ---- serve --------------------------------------------------------------------------------------
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
            },
        )
    except SettingsError as exc:
        return _fail(str(exc))
    from forestflow.logs import configure_logging

    configure_logging(settings.log_level)
    from forestflow.errors import GatewayError

    try:
        _run(_serve(settings), settings.event_loop)
    except OSError as exc:
        return _fail(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror or exc}")
    except GatewayError as exc:  # e.g. the registry store is unreachable at start
        return _fail(exc.message, code=1)
    return 0


def _run(main: Any, event_loop: str) -> None:
    """Run the server coroutine on asyncio's loop, or on uvloop when the settings ask for it."""
    if event_loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)
    else:
        asyncio.run(main)


async def _serve(settings: Any) -> None:
    import structlog
    from aiohttp import web

    from forestflow.api.app import build_app, make_runner

    log = structlog.get_logger("forestflow")
    app = build_app(settings)
    runner = make_runner(app, settings)
    await runner.setup()
    # What start-up loaded (modules, restored servables) lives as long as the process: move it out
    # of the collector's reach, or every full pass walks it and pauses the loop for tens of ms.
    gc.collect()
    gc.freeze()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    await site.start()
    ports = [s.getsockname()[1] for s in site._server.sockets] if site._server else []  # type: ignore[union-attr]
    log.info("serving", host=settings.host, port=ports[0] if ports else settings.port, data_dir=str(settings.data_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await _drain(app, runner, settings, stop, log)


#: How long connections accepted right before the listener closed have to send their request.
_LATE_REQUEST_S = 0.5


async def _drain(app: Any, runner: Any, settings: Any, stop: asyncio.Event, log: Any) -> None:
    """Graceful stop: readiness fails at once; requests are still accepted for ``drain_grace_s``
    (load balancers take a moment to stop sending); then the listener closes, in-flight requests
    finish (up to ``shutdown_timeout_s``), the prediction log is flushed, and the process exits 0.
    A second signal cuts the grace period short."""
    from forestflow.api.common import GATEWAY

    gateway = app[GATEWAY]
    gateway.draining = True
    log.info("draining", grace_s=settings.drain_grace_s, shutdown_timeout_s=settings.shutdown_timeout_s)
    stop.clear()
    try:
        await asyncio.wait_for(stop.wait(), settings.drain_grace_s)
    except TimeoutError:
        pass
    log.info("stopping")
    for site in list(runner.sites):
        await site.stop()  # no new connections from here on
    # A client that connected just before the listener closed sends its request a moment later:
    # give it that moment, or aiohttp would close its connection as idle, unanswered.
    await asyncio.sleep(_LATE_REQUEST_S)
    await runner.cleanup()
    stats = gateway.prediction_log.stats
    # written after (and with) every buffered access line
    log.info("stopped", log_produced=stats.produced, log_delivered=stats.delivered, log_dropped=stats.dropped)


# ---- client commands ------------------------------------------------------------------------------
def _request(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        payload = exc.read()
        try:
            return exc.code, json.loads(payload)
        except ValueError:
            return exc.code, {"error": payload.decode(errors="replace")}


def _absolute_file_path(path: str) -> str:
    """``file://./dir`` or ``file://dir`` relative to where the command runs -> an absolute file URI."""
    parsed = urlparse(path)
    if parsed.scheme != "file":
        return path
    local = parsed.netloc + parsed.path
    if os.path.isabs(local):
        return path
    return Path(local).resolve().as_uri()


def cmd_deploy(args: argparse.Namespace) -> int:
    """POST a servable definition (a BasicServeRequest JSON file) to a running gateway."""
    try:
        definition = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    if isinstance(definition, dict) and isinstance(definition.get("path"), str):
        definition["path"] = _absolute_file_path(definition["path"])
    try:
        status, body = _request("POST", args.url.rstrip("/") + "/servable", definition, args.token)
    except OSError as exc:
        return _fail(f"cannot reach {args.url}: {exc}")
    print(json.dumps(body, indent=2))
    return 0 if status == 200 else 1


def cmd_contracts(args: argparse.Namespace) -> int:
    """List the contracts of a running gateway."""
    try:
        status, body = _request("GET", args.url.rstrip("/") + "/contracts/list")
    except OSError as exc:
        return _fail(f"cannot reach {args.url}: {exc}")
    print(json.dumps(body, indent=2))
    return 0 if status == 200 else 1


def cmd_logs_tail(args: argparse.Namespace) -> int:
    """Print prediction events from a Kafka topic as JSON lines."""
    from forestflow.predlog.tail import run_tail

    return run_tail(args)


# ---- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="forestflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="TOML settings file")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8090)")
    serve.add_argument("--grpc-port", type=int, help="V2 gRPC port (default 8081, -1 disables)")
    serve.add_argument("--data-dir", help="state directory (default ./forestflow-data)")
    serve.add_argument("--insecure-admin", action="store_true", help="allow a non-loopback bind without admin token")
    serve.set_defaults(func=cmd_serve)

    token_default = os.environ.get("FORESTFLOW_ADMIN_TOKEN")
    deploy = sub.add_parser("deploy", help="deploy a servable definition JSON file")
    deploy.add_argument("file")
    deploy.add_argument("--url", default=DEFAULT_URL)
    deploy.add_argument("--token", default=token_default, help="admin token (default $FORESTFLOW_ADMIN_TOKEN)")
    deploy.set_defaults(func=cmd_deploy)

    contracts = sub.add_parser("contracts", help="list contracts")
    contracts.add_argument("--url", default=DEFAULT_URL)
    contracts.set_defaults(func=cmd_contracts)

    logs = sub.add_parser("logs", help="prediction log tools")
    logs_sub = logs.add_subparsers(dest="logs_command", required=True)
    tail = logs_sub.add_parser("tail", help="print events of a Kafka topic as JSON lines")
    from forestflow.predlog.tail import add_tail_arguments

    add_tail_arguments(tail)
    tail.set_defaults(func=cmd_logs_tail)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``forestflow`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
