"""CPU per request of the digits image pipeline against the bare ONNX model fed pixels, side by side.

Two gateways pinned to core 0, each loaded at the same time by its own wrk on core 1: one serves the
pipeline ``image_decode`` (mode L, size [8, 8], scale 16/255, flatten) -> ``onnx`` -> ``classifier``
(tests/image_support.py: scikit-learn's 8x8 digits, a random forest exported to ONNX); the other serves
the same ONNX model bare, fed the pixels the pipeline decodes (FP32 [N, 64]). Cells: 1- and 32-row
requests through V2 JSON (images as base64 text, pixels as JSON numbers) and V2 binary (images as raw
bytes, pixels as raw FP32). Printed per cell: the medians over the rounds of each side's CPU per
request and requests per second, the image part (pipeline - bare) and its share of the pipeline, and
the decode step's own CPU per request (timed in this process on the same images) with its share.

    python bench/images.py
    python bench/images.py --rows 32 --rounds 3 --seconds 5
    python bench/images.py --smoke          # one 0.5-s round of the 1-row cells (the tests run it)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import Request, Server, deploy_body, round_options, side_by_side, start_gateway  # noqa: E402
from forestflow.core.frame import Frame  # noqa: E402
from forestflow.core.ids import FQRV, Contract  # noqa: E402
from forestflow.runtime.flavors import create_servable  # noqa: E402
from forestflow.runtime.pipeline_definition import read_definition  # noqa: E402
from tests.image_support import Digits, b64, digits_pipeline  # noqa: E402
from tests.pipeline_support import servable_request  # noqa: E402

PIPELINE = ("bench", "digits", 1)
BARE = ("bench", "digits-onnx", 1)
HEADER = "Inference-Header-Content-Length"


def _bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


def _binary(tensor: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(blob)}}],
            "parameters": {"binary_data_output": True},
        }
    )
    return head + blob, {HEADER: str(len(head))}


def requests_for(digits: Digits, rows: int) -> dict[str, tuple[Request, Request]]:
    """encoding -> (the pipeline's request, the bare model's request) for ``rows`` digits."""
    images = [digits.images[i % len(digits.images)] for i in range(rows)]
    pixels = np.stack([digits.features[i % len(digits.features)] for i in range(rows)]).astype(np.float32)
    pipeline_path = "/v2/models/{}.{}.{}/infer".format(*PIPELINE)
    bare_path = "/v2/models/{}.{}.{}/infer".format(*BARE)
    image_tensor = {"name": "image", "datatype": "BYTES", "shape": [rows]}
    pixel_tensor = {"name": "pixels", "datatype": "FP32", "shape": [rows, 64]}
    json_pipeline = orjson.dumps({"inputs": [{**image_tensor, "data": [b64(i) for i in images]}]})
    json_bare = orjson.dumps({"inputs": [{**pixel_tensor, "data": pixels.reshape(-1).tolist()}]})
    bin_pipeline, pipeline_headers = _binary(image_tensor, _bytes_blob(images))
    bin_bare, bare_headers = _binary(pixel_tensor, pixels.astype("<f4").tobytes())
    octet = "application/octet-stream"
    return {
        "v2-json": ((pipeline_path, json_pipeline, "application/json", {}), (bare_path, json_bare, "application/json", {})),
        "v2-binary": ((pipeline_path, bin_pipeline, octet, pipeline_headers), (bare_path, bin_bare, octet, bare_headers)),
    }


def decode_alone_us(digits: Digits, rows: int, as_text: bool, seconds: float = 0.5) -> float:
    """CPU microseconds of the pipeline's own decode step on ``rows`` images (raw or base64), in process."""
    spec = read_definition(digits.directory, "pipeline.toml")
    step_spec = next(s for s in spec.steps if s.platform == "image_decode")
    fqrv = FQRV(Contract("bench", "decode", 1), "r")
    step = create_servable(step_spec.flavor.flavor, fqrv, digits.directory, step_spec.flavor_settings())
    step.load()
    images = [digits.images[i % len(digits.images)] for i in range(rows)]
    column = np.empty(rows, dtype=object)
    column[:] = [b64(i) for i in images] if as_text else images
    frame = Frame({"image": column})
    calls, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        step.predict(frame)
        calls += 1
    return (time.process_time() - start) / calls * 1e6


def bare_request(directory: Path) -> dict[str, Any]:
    """The digits ONNX model deployed on its own."""
    body = servable_request(directory, release="onnx", contract=BARE)
    body["flavor"] = {"ONNX": {"modelPath": "digits.onnx"}}
    return body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--encodings", nargs="+", default=["v2-json", "v2-binary"], choices=["v2-json", "v2-binary"])
    round_options(parser, 8, "gateway", "one 0.5-s round of the 1-row cells, no warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.rounds, args.seconds, args.warmup = [1], 1, 0.5, 0.0
    work = Path(tempfile.mkdtemp(prefix="ff-images-"))
    digits = digits_pipeline(work / "digits")
    print(
        f"# logs under {work}; both gateways on core 0, wrk on core 1; medians of {args.rounds} round(s) of "
        f"{args.seconds:g} s per side; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    servers: list[Server] = []
    try:
        pipeline = start_gateway(work / "data-pipeline", {}, work, "gateway-pipeline")
        servers.append(pipeline)
        bare = start_gateway(work / "data-bare", {}, work, "gateway-bare")
        servers.append(bare)
        deploy_body(pipeline, servable_request(digits.directory, release="pipeline", contract=PIPELINE))
        deploy_body(bare, bare_request(digits.directory))
        for rows in args.rows:
            cells = requests_for(digits, rows)
            for encoding in args.encodings:
                (path, body, ctype, headers), other = cells[encoding]
                if args.warmup:
                    side_by_side(pipeline, bare, path, body, ctype, args.concurrency, args.warmup, other, headers)
                cpu, rps, errors = [], [], 0
                for _ in range(args.rounds):
                    a, b = side_by_side(pipeline, bare, path, body, ctype, args.concurrency, args.seconds, other, headers)
                    cpu.append((a.cpu_us, b.cpu_us))
                    rps.append((a.rps, b.rps))
                    errors += a.errors + b.errors
                piped, alone = statistics.median(c[0] for c in cpu), statistics.median(c[1] for c in cpu)
                decode = decode_alone_us(digits, rows, as_text=encoding == "v2-json", seconds=0.2 if args.smoke else 1.0)
                rps_piped, rps_alone = statistics.median(r[0] for r in rps), statistics.median(r[1] for r in rps)
                print(
                    f"{encoding:9} {rows:>2}-row c{args.concurrency}: CPU/request pipeline {piped:.0f} us, bare ONNX "
                    f"{alone:.0f} us, image part {piped - alone:.0f} us ({(piped - alone) / piped:.0%} of the pipeline); "
                    f"decode step alone {decode:.0f} us ({decode / piped:.0%}); req/s pipeline {rps_piped:.0f}, "
                    f"bare {rps_alone:.0f}; errors {errors}",
                    flush=True,
                )
    finally:
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
