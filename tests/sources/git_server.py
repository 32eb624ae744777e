"""A bare Git repository served over HTTP by ``git http-backend`` (smart HTTP), on a loopback port.

A small aiohttp app is the CGI host: each request runs ``git http-backend`` with the CGI
variables it needs, feeds it the body and relays its headers and output.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(*args: str, cwd: Path) -> str:
    """Run git in ``cwd`` and return its output (raises on failure)."""
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(root: Path, name: str, tags: dict[str, dict[str, bytes]]) -> Path:
    """A bare repository ``root/name`` whose tags each hold the given files (path -> bytes)."""
    work = root / (name + "-work")
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=work)
    for tag, files in tags.items():
        for existing in [p for p in work.iterdir() if p.name != ".git"]:
            subprocess.run(["rm", "-rf", str(existing)], check=True)
        for rel, data in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_bytes(data)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", tag, cwd=work)
        git("tag", tag, cwd=work)
    bare = root / name
    git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    return bare


@asynccontextmanager
async def git_http_server(project_root: Path, delay_s: float = 0.0) -> AsyncIterator[str]:
    """Serve every repository under ``project_root`` (each answer ``delay_s`` late); yields its URL."""

    async def cgi(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)
        body = await request.read()
        env = {
            **os.environ,
            "GIT_PROJECT_ROOT": str(project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": request.path,
            "QUERY_STRING": request.query_string,
            "REQUEST_METHOD": request.method,
            "CONTENT_TYPE": request.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": request.remote or "127.0.0.1",
            "GIT_PROTOCOL": request.headers.get("Git-Protocol", ""),
        }
        if body[:2] == b"\x1f\x8b":  # still gzip-encoded (aiohttp did not inflate it): the backend does
            env["HTTP_CONTENT_ENCODING"] = "gzip"
        proc = await asyncio.create_subprocess_exec(
            "git",
            "http-backend",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        out, _ = await proc.communicate(body)
        head, _, payload = out.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = out.partition(b"\n\n")
        status, headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers[key.strip()] = value.strip()
        return web.Response(status=status, body=payload, headers=headers)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", cgi)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
