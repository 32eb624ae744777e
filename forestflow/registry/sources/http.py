"""``http(s)://`` artifacts: one file, streamed to the staging directory within the size cap."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

import aiohttp

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources import FetchLimits, redact, timed_out, too_large


async def fetch_http(url: str, staging: Path, limits: FetchLimits) -> None:
    """Download ``url`` to ``staging/<its file name>``."""
    name = Path(unquote(urlparse(url).path)).name or "artifact"
    shown = redact(url)
    size = 0
    try:
        timeout = aiohttp.ClientTimeout(total=limits.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
            if response.status != 200:
                raise CreateServableRequestInvalidError(f"path {shown!r}: download answered HTTP {response.status}")
            if (response.content_length or 0) > limits.max_bytes:
                raise too_large(f"path {shown!r}", limits)
            with open(staging / name, "wb") as out:  # noqa: ASYNC230 (a local staging file, written as chunks arrive)
                async for chunk in response.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limits.max_bytes:
                        raise too_large(f"path {shown!r}", limits)
                    out.write(chunk)
    except TimeoutError:
        raise timed_out(f"path {shown!r}", limits) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise CreateServableRequestInvalidError(f"path {shown!r}: download failed: {type(exc).__name__}: {exc}") from None
