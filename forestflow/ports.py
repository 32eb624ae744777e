"""The gateway's listening ports, checked before anything starts: a taken port is one clear line."""

from __future__ import annotations

import socket
from typing import Any


def address_family(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal, else IPv4."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class PortInUse(Exception):
    """A port the gateway needs cannot be bound; the message is the one line to print."""


def bind_http(settings: Any) -> socket.socket:
    """The HTTP listening socket, bound before anything starts (a taken port fails fast)."""
    try:
        return socket.create_server((settings.host, settings.port), family=address_family(settings.host), backlog=1024)
    except OSError as exc:
        raise PortInUse(f"cannot serve HTTP on {settings.host}:{settings.port}: {exc.strerror or exc}") from None


def check_grpc_port(settings: Any) -> None:
    """Fail before start-up when the gRPC port is taken (the server itself binds it later).

    gRPC binds with SO_REUSEPORT off (see ``api.v2_grpc``), so the bind that follows this check
    fails too if the port is taken in between; the check only makes the failure early and clear.
    """
    if settings.grpc_port <= 0:
        return
    try:
        probe = socket.create_server((settings.host, settings.grpc_port), family=address_family(settings.host))
    except OSError as exc:
        raise PortInUse(
            f"cannot serve gRPC on {settings.host}:{settings.grpc_port}: {exc.strerror or exc} "
            f"(choose another with --grpc-port, or -1 to disable gRPC)"
        ) from None
    probe.close()
