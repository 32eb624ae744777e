"""CPU per prediction event spent by the encoders on the request path, in process, per kind of event.

For the bench's prostate rows (1 and 100 per request) and a binomial answer: what ``emit`` spends
encoding one event for the file (JSON line) and for Kafka (protobuf), for a /score request (its
body and Prediction JSON reused), for a V2 REST request, both as it was encoded before
(frames re-encoded into ForestFlow's shape) and as it is now (the wire bodies copied), and for a
GraphPipe request (its flatbuffers as they were on the wire; when the graphpipe client is installed).

    python bench/predlog_encode.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import payloads  # noqa: E402
from forestflow.codecs.graphpipe import encode_infer_response, parse_config  # noqa: E402
from forestflow.codecs.schema_datum import frame_from_json, prediction_json  # noqa: E402
from forestflow.core.frame import Frame  # noqa: E402
from forestflow.core.ids import FQRV  # noqa: E402
from forestflow.core.policies import LoggingSettings, LogLevel  # noqa: E402
from forestflow.predlog.encode import encode_event, encode_event_json  # noqa: E402
from forestflow.predlog.record import PredictionRecord, WireBody  # noqa: E402


def v2_response(rows: int, p1: np.ndarray) -> bytes:
    outputs = [
        {"name": "predict", "datatype": "BYTES", "shape": [rows], "data": np.where(p1 > 0.5, "1", "0").tolist()},
        {"name": "p0", "datatype": "FP64", "shape": [rows], "data": (1 - p1).tolist()},
        {"name": "p1", "datatype": "FP64", "shape": [rows], "data": p1.tolist()},
    ]
    return orjson.dumps({"model_name": "bench.full.1", "model_version": "gbm", "id": "x", "outputs": outputs})


def records(rows: int) -> dict[str, PredictionRecord]:
    """The record each front-end hands the log for one ``rows``-row request."""
    score_body = payloads.score_body(rows)
    frame, configs = frame_from_json(orjson.loads(score_body))
    p1 = np.random.default_rng(7).random(rows)
    answer = Frame.from_columns({"predict": np.where(p1 > 0.5, "1", "0").astype(object), "p0": 1 - p1, "p1": p1})
    fqrv = FQRV.parse("bench.full.1.gbm")
    base = PredictionRecord(
        fqrv=fqrv,
        served=True,
        request=frame,
        configs=configs,
        logging=LoggingSettings(LogLevel.FULL, ("reqid",)),
        request_id="5c1d4a8e9f0b5c1d4a8e9f0b",
        protocol="basic",
        event_time_ms=1_790_000_000_000,
        latency_ms=0.4,
        response=answer,
    )
    out = {
        "score": dataclasses.replace(base, request_json=score_body, response_json=prediction_json(fqrv, answer)),
        "v2-frames (before)": dataclasses.replace(base, protocol="v2"),
        "v2-wire (now)": dataclasses.replace(
            base,
            protocol="v2",
            request_json=WireBody.of(payloads.v2_body(rows)),
            response_json=WireBody.of(v2_response(rows, p1)),
        ),
    }
    gp_body = payloads.graphpipe_body(rows)
    if gp_body is not None:  # the request as the official client writes it, the answer as the front-end does
        out["graphpipe"] = dataclasses.replace(
            base,
            configs=parse_config("reqid:bench"),
            protocol="graphpipe",
            raw_request=gp_body,
            raw_response=encode_infer_response(fqrv, answer),
        )
    return out


def cpu_us(fn, record: PredictionRecord, min_s: float = 0.3) -> float:
    done, started = 0, time.process_time()
    while time.process_time() - started < min_s:
        for _ in range(50):
            fn(record)
        done += 50
    return (time.process_time() - started) / done * 1e6


def main() -> int:
    print(f"{'rows':>4} {'event':20} {'file (json) us':>14} {'kafka (protobuf) us':>19} {'json B':>7} {'proto B':>7}")
    for rows in (1, 100):
        for name, record in records(rows).items():
            j, k = cpu_us(encode_event_json, record), cpu_us(encode_event, record)
            print(
                f"{rows:>4} {name:20} {j:>14.1f} {k:>19.1f} {len(encode_event_json(record)):>7} {len(encode_event(record)):>7}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
