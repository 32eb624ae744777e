"""The JSON-lines prediction log stays one event per line whatever the request body's layout.

A pretty-printed body (``curl --data-binary @file``, httpie ``< file``) used to be embedded
verbatim, line breaks and all, so one event spanned many lines of ``predictions.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from tests.support import python_servable, score_body, serve_in_process, wait_for

CONTRACT = ("acme", "demo", 1)
#: Strings a pretty-printer escapes: the event must give them back exactly.
TRICKY = ["two\nlines", "cr\r\nlf", 'quote " and \\ backslash', "tab\tend", "\u2028 separator"]


def _strings(datum: list[dict[str, Any]]) -> list[str]:
    return [t["String"]["data"][0] for d in datum for t in d["tensors"] if "String" in t]


def _log_lines(data_dir: Path) -> list[bytes]:
    path = data_dir / "predictions.jsonl"
    return path.read_bytes().split(b"\n")[:-1] if path.exists() else []


async def test_pretty_printed_bodies_give_one_parsable_line_per_event(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with serve_in_process(data_dir, access_log=False, log_level="warning") as gw:
        # v1 answers; v2 never becomes valid and only shadows (its events are shadow copies).
        for release, validity in (("v1", None), ("v2", [{"NeverValid": {}}])):
            async with gw.session.post(
                gw.url + "/servable", json=python_servable(CONTRACT, release, validity=validity, log_level="FULL")
            ) as resp:
                assert resp.status == 200, await resp.text()

        body = score_body([1.5] * len(TRICKY), labels=TRICKY, configs={"reqid": "basic-pretty"})
        pretty = json.dumps(body, indent=2)  # LF; then CRLF, then a lone CR (each must end up as spaces)
        for text in (pretty, json.dumps(body, indent="\t").replace("\n", "\r\n"), pretty.replace("\n", "\r")):
            async with gw.session.post(
                gw.url + "/acme/demo/1/score", data=text.encode(), headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == 200, await resp.text()
                assert _strings((await resp.json())["Prediction"]["datum"]) == TRICKY

        v2_body = {
            "inputs": [
                {"name": "x", "datatype": "FP64", "shape": [2], "data": [1.0, 2.0]},
                {"name": "label", "datatype": "BYTES", "shape": [2], "data": TRICKY[:2]},
            ],
            "parameters": {"reqid": "v2-pretty"},
        }
        async with gw.session.post(
            gw.url + "/v2/models/acme.demo.1/infer",
            data=json.dumps(v2_body, indent=4).encode(),
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200, await resp.text()

        # 4 requests, each answered by v1 and shadowed by v2: 8 events.
        await wait_for(lambda: len(_log_lines(data_dir)) >= 8, 10, "eight events in the log")

    lines = _log_lines(data_dir)
    assert len(lines) == 8, lines
    # No CR either: universal-newline readers (Python's text mode, splitlines()) end a line at a lone CR.
    assert b"\r" not in (data_dir / "predictions.jsonl").read_bytes()
    events: list[dict[str, Any]] = [orjson.loads(line)["event"] for line in lines]  # every line parses alone
    served = sorted((e["fqrv"]["releaseVersion"], bool(e.get("servedRequest"))) for e in events)
    assert served == [("v1", True)] * 4 + [("v2", False)] * 4
    basic = [e for e in events if e["protocol"] == "basic"]
    assert len(basic) == 6
    for event in basic:
        request = event["inferenceRequest"]
        assert request == body  # the body's meaning survived, escaped newlines included
        assert _strings(request["datum"]) == TRICKY
        if event.get("servedRequest"):
            assert _strings(event["prediction"]["datum"]) == TRICKY
    v2 = [e for e in events if e["protocol"] == "v2"]
    assert len(v2) == 2
