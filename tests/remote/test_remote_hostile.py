"""A RemoteV2 release whose backend answers with broken HTTP framing: each call fails with 502 and
the gateway (a child process, so a frozen event loop shows as calls that time out) keeps answering
every other contract."""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.remote.support import remote_servable
from tests.support import GatewayProcess, python_servable, score_body

METADATA = json.dumps(
    {
        "name": "m",
        "versions": ["1"],
        "platform": "hostile",
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP64", "shape": [-1]}],
    }
).encode()
#: What the backend answers to inference calls, in turn.
BROKEN = [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\n",  # froze the gateway's loop
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: +1_0\r\n\r\n0123456789",
]


class Hostile(socketserver.StreamRequestHandler):
    """Well-formed metadata and readiness; the next of BROKEN to an inference call."""

    answers: list[bytes] = []

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
            self.rfile.read(length)
            if head.startswith(b"POST"):
                self.wfile.write(self.answers.pop(0))
                return  # and leave the connection open until the client closes it
            body = b"{}" if head.split(b" ")[1].endswith((b"/ready", b"/v2")) else METADATA
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.fixture
def hostile() -> Iterator[str]:
    Hostile.answers = list(BROKEN)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_broken_framing_is_a_502_and_other_contracts_keep_answering(tmp_path: Path, hostile: str) -> None:
    gw = GatewayProcess(tmp_path / "data").start()
    try:
        http = requests.Session()
        for body in (remote_servable(hostile, model="m"), python_servable()):
            r = http.post(gw.url + "/servable", json=body, timeout=30)
            assert r.status_code == 200, r.text
        request = {"inputs": [{"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0, 2.0]}]}
        for _ in BROKEN:
            r = http.post(gw.url + "/v2/models/acme.front.1/infer", json=request, timeout=10)
            assert r.status_code == 502, r.text
            assert "unreadable answer" in r.json()["error"], r.text
            other = http.post(gw.url + "/acme/demo/1/score", json=score_body([1.5]), timeout=10)
            assert other.status_code == 200, other.text
        assert "Traceback" not in gw.log()
    finally:
        gw.stop()
