"""The 1-row V2 cell in-process: Python calls and time per request on the V2 scoring path.

Runs a real gateway app (file store, Python flavor) in this process, deploys the three-input
``linear`` test servable, and scores ``--requests`` 1-row V2 JSON bodies through
``v2_rest.infer_payload`` (the route minus aiohttp), twice: once counting every Python function
call (``sys.setprofile``; deterministic, so two versions of the path compare exactly), once timed.

    python bench/v2_one_row_calls.py --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from forestflow.api.v2_rest import infer_payload  # noqa: E402
from tests.support import python_servable, serve_in_process  # noqa: E402

BODY = orjson.dumps({"inputs": [{"name": n, "datatype": "FP64", "shape": [1], "data": [1.0]} for n in ("a", "b", "c")]})
NP_BODY = orjson.dumps(
    {
        "inputs": [{"name": "x", "datatype": "FP64", "shape": [1, 3], "data": [1.0, 2.0, 3.0]}],
        "parameters": {"content_type": "np"},
    }
)


async def main(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with serve_in_process(Path(tmp) / "data") as gw:
            servable = python_servable(directory=ROOT / "tests" / "api" / "servables", module="linear.py")
            async with aiohttp.ClientSession() as session, session.post(gw.url + "/servable", json=servable) as r:
                assert r.status == 200, await r.text()
            gateway = gw.gateway

            async def one(body: bytes) -> None:
                await infer_payload(gateway, "acme.demo.1", None, body, None, request_id="b", protocol="v2", timeout_s=5.0)

            for label, body in (("named", BODY), ("np", NP_BODY)):
                for _ in range(200):  # warm
                    await one(body)
                calls = 0

                def count(frame: object, event: str, arg: object) -> None:
                    nonlocal calls
                    if event == "call":
                        calls += 1

                sys.setprofile(count)
                for _ in range(requests):
                    await one(body)
                sys.setprofile(None)
                started = time.perf_counter()
                for _ in range(requests):
                    await one(body)
                elapsed = time.perf_counter() - started
                print(
                    f"V2 1-row {label:5}: {calls / requests:7.1f} Python calls/request, "
                    f"{elapsed / requests * 1e6:7.1f} us/request ({requests} requests)"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    asyncio.run(main(parser.parse_args().requests))
