"""Graceful drain: SIGTERM mid-stream loses no accepted request, and the prediction log is flushed."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.support import GatewayProcess, python_servable, score_body

CLIENTS = 8


def one_request(port: int, x: float) -> tuple[str, object]:
    """('refused', None) | ('reset', exc) after the connection was accepted | ('answer', (status, body))."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.connect()
    except ConnectionRefusedError:
        return "refused", None
    try:
        time.sleep(0.1)  # a client takes a moment between connecting and sending: the listener may close meanwhile
        body = json.dumps(score_body([x], configs={"sleep": "0.05"}))
        conn.request("POST", "/acme/demo/1/score", body, {"Content-Type": "application/json", "Connection": "close"})
        response = conn.getresponse()
        return "answer", (response.status, response.read())
    except (OSError, http.client.HTTPException) as exc:
        return "reset", exc
    finally:
        conn.close()


@pytest.mark.slow
def test_sigterm_mid_stream_answers_every_accepted_request(tmp_path: Path, gateway_process: type[GatewayProcess]) -> None:
    gw = gateway_process(
        tmp_path / "data",
        env={"FORESTFLOW_DRAIN_GRACE_S": "1.0", "FORESTFLOW_SHUTDOWN_TIMEOUT_S": "10", "FORESTFLOW_SCORING_SLOTS": "8"},
    ).start()
    r = requests.post(gw.url + "/servable", json=python_servable(log_level="FULL"), timeout=60)
    assert r.status_code == 200, r.text
    outcomes: list[tuple[float, str, object, float]] = []
    lock = threading.Lock()
    stop_clients = threading.Event()
    sigterm_at: list[float] = []
    ready_503_at: list[float] = []

    def client(n: int) -> None:
        i = 0
        while not stop_clients.is_set():
            x = n * 100000 + i
            i += 1
            started = time.monotonic()
            kind, detail = one_request(gw.port, x)
            with lock:
                outcomes.append((started, kind, detail, x))
            if kind == "refused":
                time.sleep(0.01)

    def watch_readiness() -> None:
        while not ready_503_at and gw.proc is not None and gw.proc.poll() is None:
            try:
                if requests.get(gw.url + "/health/ready", timeout=1).status_code == 503 and sigterm_at:
                    ready_503_at.append(time.monotonic())
            except requests.RequestException:
                return
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)] + [threading.Thread(target=watch_readiness)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert gw.proc is not None
    sigterm_at.append(time.monotonic())
    gw.proc.send_signal(signal.SIGTERM)
    exit_code = gw.proc.wait(30)
    time.sleep(0.3)  # clients now only see refused connections
    stop_clients.set()
    for t in threads:
        t.join(30)

    answers = [(x, detail) for _, kind, detail, x in outcomes if kind == "answer"]
    resets = [(x, detail) for _, kind, detail, x in outcomes if kind == "reset"]
    refused = [x for _, kind, _, x in outcomes if kind == "refused"]
    after_sigterm = [x for started, kind, _, x in outcomes if kind == "answer" and started > sigterm_at[0]]
    print(
        f"drain: {len(outcomes)} requests, {len(answers)} answered ({len(after_sigterm)} sent after SIGTERM), "
        f"{len(refused)} refused, {len(resets)} reset after accept; exit {exit_code}"
    )
    assert exit_code == 0, gw.log()
    assert resets == [], resets[:5]
    for x, (status, body) in answers:
        assert status == 200, (status, body)
        assert json.loads(body)["Prediction"]["datum"][0]["tensors"][0]["Float64"]["data"] == [2.0 * x]
    assert after_sigterm, "requests sent during the grace period are still served"
    assert refused, "after the grace period new connections are refused"
    assert ready_503_at and ready_503_at[0] - sigterm_at[0] < 0.5, "readiness fails at once on SIGTERM"
    # every answer's prediction event reached the log before exit (the buffer was flushed)
    events = [json.loads(line) for line in (tmp_path / "data" / "predictions.jsonl").read_bytes().splitlines()]
    assert len(events) == len(answers)
    stopped = [json.loads(line) for line in gw.log_path.read_text().splitlines() if '"event":"stopped"' in line]
    assert stopped and stopped[0]["log_dropped"] == 0 and stopped[0]["log_delivered"] == len(answers)


def test_refused_handshakes_leave_accepted_connections_working() -> None:
    """After refuse_new_handshakes a new client never completes a handshake (and is refused once the
    listener closes), while a connection already established keeps talking."""
    import socket

    from forestflow.ports import accept_pending, refuse_new_handshakes

    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    port = listener.getsockname()[1]
    early = socket.create_connection(("127.0.0.1", port), timeout=2)
    queued = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(3)]
    assert refuse_new_handshakes(listener)
    late = socket.socket()
    late.settimeout(0.3)
    try:
        late.connect(("127.0.0.1", port))
        connected = True
    except TimeoutError:
        connected = False
    finally:
        late.close()
    assert not connected, "a new handshake completed after refuse_new_handshakes"
    # everything that was queued before is still there to accept, and nothing more
    accepted = accept_pending(listener)
    assert len(accepted) == 4 and accept_pending(listener) == []
    early.sendall(b"ping")
    assert accepted[0].recv(4) == b"ping"
    listener.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    for s in [early, *queued, *accepted]:
        s.close()
