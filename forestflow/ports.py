"""The gateway's listening ports, checked before anything starts: a taken port is one clear line."""

from __future__ import annotations

import errno
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


# ---- closing the HTTP listener without resetting accepted connections -------------------------------
#: Linux's SO_ATTACH_FILTER (the socket module does not name it).
_SO_ATTACH_FILTER = 26
#: Classic BPF over a TCP segment (a listener's filter sees the TCP header at offset 0, IPv4 and
#: IPv6 alike): drop a segment whose flags have SYN without ACK, keep every other one whole.
_DROP_NEW_SYN = (
    (0x30, 0, 0, 13),  # ldb [13]: the flags byte
    (0x54, 0, 0, 0x12),  # and #(SYN|ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN: next, else skip one
    (0x06, 0, 0, 0),  # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: keep
)


def refuse_new_handshakes(sock: socket.socket) -> bool:
    """Drop the SYNs of new connections to a listening socket from now on (Linux; False elsewhere).

    A listener that is closed resets every connection whose handshake finished but which the
    process has not accepted yet, and such a client's ``connect()`` had already succeeded: it sees
    its request reset. With new SYNs dropped, the accept queue only empties from here on; a new
    client's retried SYN (a second later) meets the closed port and is refused, as it should be.
    """
    import ctypes
    import struct

    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _DROP_NEW_SYN))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, struct.pack("HL", len(_DROP_NEW_SYN), ctypes.addressof(program)))
    except OSError:
        return False
    return True


def accept_pending(sock: socket.socket) -> list[socket.socket]:
    """Every connection waiting in a listening socket's accept queue, accepted without blocking."""
    accepted: list[socket.socket] = []
    blocking = sock.getblocking()
    sock.setblocking(False)
    try:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):  # one client gave up: the rest are still there
                    continue
                return accepted  # e.g. out of file descriptors: what is left is reset at close, as before
            accepted.append(conn)
    finally:
        sock.setblocking(blocking)
