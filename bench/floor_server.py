"""The floor: a bare aiohttp server that parses the request body and returns a fixed answer.

No aiohttp service can beat it on this machine; the benchmark reports the gateway as a ratio of it.
JSON bodies are parsed with orjson (what the gateway uses), anything else is only read.

Usage: python bench/floor_server.py PORT
"""

from __future__ import annotations

import sys

import orjson
from aiohttp import web

ANSWER = orjson.dumps({"ok": True})


async def handle(request: web.Request) -> web.Response:
    """Read (and for JSON, parse) the body; answer a constant."""
    body = await request.read()
    if body[:1] in (b"{", b"["):
        orjson.loads(body)
    return web.Response(body=ANSWER, content_type="application/json")


def main() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
