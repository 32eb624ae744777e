"""The ``forestflow`` command: serve the gateway, deploy servables, list contracts, tail the log."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

DEFAULT_URL = "http://127.0.0.1:8090"

DESCRIPTION = (
    "forestflow: a model-serving gateway. 'serve' runs it; 'deploy', 'contracts' and 'logs tail' talk "
    "to a running gateway or read its prediction log. Run 'forestflow <command> --help' for the options."
)


def gateway_url(text: str) -> str:
    """A gateway URL as the user typed it: ``localhost:8090`` and ``:8090`` (httpie's style) mean http."""
    text = text.strip()
    if text.startswith(":"):
        text = "127.0.0.1" + text
    if "://" not in text:
        text = "http://" + text
    return text.rstrip("/")


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
    from forestflow.datadir_lock import DataDirInUse, DataDirLock
    from forestflow.logs import configure_logging

    configure_logging(settings.log_level)
    from forestflow.errors import GatewayError

    # The data dir has one owner for the life of this process (the file store rewrites the registry
    # from its own snapshot: a second gateway would silently undo the first one's changes).
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire()
    except DataDirInUse as exc:
        return _fail(str(exc), code=1)
    except OSError as exc:
        return _fail(f"cannot lock data dir {settings.data_dir}: {exc.strerror or exc}", code=1)
    try:
        _run(_serve(settings), settings.event_loop)
    except PortInUse as exc:
        return _fail(str(exc), code=1)
    except OSError as exc:
        if exc.strerror is None:  # raised with a whole message (e.g. the gRPC bind)
            return _fail(str(exc), code=1)
        return _fail(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror}")
    except GatewayError as exc:  # e.g. the registry store is unreachable at start
        return _fail(exc.message, code=1)
    finally:
        lock.release()
    return 0


class PortInUse(Exception):
    """A port the gateway needs cannot be bound; the message is the one line to print."""


def _bind_http(settings: Any) -> socket.socket:
    """The HTTP listening socket, bound before anything starts (a taken port fails fast)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        return socket.create_server((settings.host, settings.port), family=family, backlog=1024)
    except OSError as exc:
        raise PortInUse(f"cannot serve HTTP on {settings.host}:{settings.port}: {exc.strerror or exc}") from None


def _check_grpc_port(settings: Any) -> None:
    """Fail before start-up when the gRPC port is taken (the server itself binds it later).

    gRPC binds with SO_REUSEPORT off (see ``api.v2_grpc``), so the bind that follows this check
    fails too if the port is taken in between; the check only makes the failure early and clear.
    """
    if settings.grpc_port <= 0:
        return
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        probe = socket.create_server((settings.host, settings.grpc_port), family=family)
    except OSError as exc:
        raise PortInUse(
            f"cannot serve gRPC on {settings.host}:{settings.grpc_port}: {exc.strerror or exc} "
            f"(choose another with --grpc-port, or -1 to disable gRPC)"
        ) from None
    probe.close()


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
    # Both ports are checked before the gateway starts (loading every servable takes a while, and
    # a second gateway must not get that far on a port another one serves).
    sock = _bind_http(settings)
    try:
        _check_grpc_port(settings)
        app = build_app(settings)
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
    site = web.SockSite(runner, sock)
    await site.start()
    log.info("serving", host=settings.host, port=sock.getsockname()[1], data_dir=str(settings.data_dir))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping")
    await runner.cleanup()
    log.info("stopped")  # written after (and with) every buffered access line


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
        text = Path(args.file).read_bytes()
    except OSError as exc:
        return _fail(f"cannot read {args.file}: {exc.strerror or exc}")
    try:
        definition = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError included
        return _fail(f"{args.file} is not JSON ({exc}); expected a servable definition such as servables/prostate-gbm.json")
    if isinstance(definition, dict) and isinstance(definition.get("path"), str):
        definition["path"] = _absolute_file_path(definition["path"])
    try:
        status, body = _request("POST", gateway_url(args.url) + "/servable", definition, args.token)
    except OSError as exc:
        return _fail(f"cannot reach {args.url}: {exc}")
    print(json.dumps(body, indent=2))
    return 0 if status == 200 else 1


def cmd_contracts(args: argparse.Namespace) -> int:
    """List the contracts of a running gateway."""
    try:
        status, body = _request("GET", gateway_url(args.url) + "/contracts/list")
    except OSError as exc:
        return _fail(f"cannot reach {args.url}: {exc}")
    print(json.dumps(body, indent=2))
    return 0 if status == 200 else 1


def cmd_logs_tail(args: argparse.Namespace) -> int:
    """Print prediction events (Kafka, or the local file log) as JSON lines."""
    from forestflow.predlog.tail import run_tail

    return run_tail(args)


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
    serve.set_defaults(func=cmd_serve)

    url_help = "gateway URL; host:port means http://host:port (default: %(default)s)"
    token_default = os.environ.get("FORESTFLOW_ADMIN_TOKEN")
    deploy = sub.add_parser(
        "deploy", help="deploy a servable definition JSON file",
        description="POST a servable definition (ForestFlow's BasicServeRequest JSON) to a running gateway; "
        "a relative file:// path in it is resolved from the current directory.",
    )
    deploy.add_argument("file", help="the definition, e.g. servables/prostate-gbm.json")
    deploy.add_argument("--url", default=DEFAULT_URL, help=url_help)
    deploy.add_argument("--token", default=token_default, help="admin token (default $FORESTFLOW_ADMIN_TOKEN)")
    deploy.set_defaults(func=cmd_deploy)

    contracts = sub.add_parser("contracts", help="list contracts", description="List the contracts of a running gateway.")
    contracts.add_argument("--url", default=DEFAULT_URL, help=url_help)
    contracts.set_defaults(func=cmd_contracts)

    logs = sub.add_parser("logs", help="prediction log tools", description="Prediction log tools.")
    logs_sub = logs.add_subparsers(dest="logs_command", required=True, metavar="command")
    tail = logs_sub.add_parser(
        "tail", help="print prediction events as JSON lines (Kafka, or the local file log)",
        description="Print prediction events as JSON lines: from Kafka when bootstrap servers are configured, "
        "else from the gateway's local file log (jsonl or protobuf).",
    )
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
