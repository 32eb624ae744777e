"""Artifact fetching into a content-addressed cache under the data dir.

``file://`` (a file or a directory; relative paths resolve against the working directory) is
copied; ``http(s)://`` (one file) is downloaded. Either way the content lands in
``<cache>/<sha256>/`` and a restart that finds the same content (or, for URLs, a remembered
URL -> digest entry) reuses it without copying or downloading again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

import aiohttp
import orjson

from forestflow.errors import CreateServableRequestInvalidError

MAX_DOWNLOAD_BYTES = 2 * 1024**3
SCHEMES = ("file", "http", "https")


class ArtifactCache:
    """Fetches artifacts by URI and returns the local directory holding them."""

    def __init__(self, root: Path, download_timeout_s: float = 300.0) -> None:
        self.root = root
        self.download_timeout_s = download_timeout_s
        self._index_path = root / "url-index.json"

    async def fetch(self, uri: str) -> Path:
        """The cached directory for ``uri``; raises CreateServableRequestInvalidError with the reason."""
        scheme = urlparse(uri).scheme.lower()
        if scheme == "file":
            return await asyncio.to_thread(self._fetch_file, uri)
        if scheme in ("http", "https"):
            return await self._fetch_http(uri)
        raise CreateServableRequestInvalidError(
            f"path {uri!r}: unsupported scheme {scheme or '(none)'!r}; supported: {', '.join(s + '://' for s in SCHEMES)}"
        )

    # ---- file:// --------------------------------------------------------------------------------
    def _fetch_file(self, uri: str) -> Path:
        parsed = urlparse(uri)
        source = Path(unquote(parsed.netloc + parsed.path)).expanduser()
        if not source.exists():
            raise CreateServableRequestInvalidError(f"path {uri!r}: {source} does not exist")
        digest = _digest_path(source)
        target = self.root / digest
        if not target.exists():
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self._ensure_root()))
            if source.is_dir():
                shutil.copytree(source, staging, dirs_exist_ok=True)
            else:
                shutil.copy2(source, staging / source.name)
            _publish(staging, target)
        return target

    # ---- http(s):// --------------------------------------------------------------------------------
    async def _fetch_http(self, uri: str) -> Path:
        index = await asyncio.to_thread(self._read_index)
        known = index.get(uri)
        if known and (self.root / known).exists():
            return self.root / known
        name = Path(unquote(urlparse(uri).path)).name or "artifact"
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self._ensure_root()))
        sha = hashlib.sha256()
        size = 0
        try:
            timeout = aiohttp.ClientTimeout(total=self.download_timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session, session.get(uri) as response:
                if response.status != 200:
                    raise CreateServableRequestInvalidError(f"path {uri!r}: download answered HTTP {response.status}")
                with open(staging / name, "wb") as out:
                    async for chunk in response.content.iter_chunked(1 << 16):
                        size += len(chunk)
                        if size > MAX_DOWNLOAD_BYTES:
                            raise CreateServableRequestInvalidError(f"path {uri!r}: larger than {MAX_DOWNLOAD_BYTES} bytes")
                        sha.update(chunk)
                        out.write(chunk)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise CreateServableRequestInvalidError(f"path {uri!r}: download failed: {type(exc).__name__}: {exc}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        sha.update(b"\0" + name.encode())
        digest = sha.hexdigest()
        target = self.root / digest
        await asyncio.to_thread(_publish, staging, target)
        index[uri] = digest
        await asyncio.to_thread(self._write_index, index)
        return target

    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def _read_index(self) -> dict[str, str]:
        try:
            return dict(orjson.loads(self._index_path.read_bytes()))
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def _write_index(self, index: dict[str, str]) -> None:
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(index))
        os.replace(tmp, self._index_path)


def _digest_path(source: Path) -> str:
    """sha256 over relative names and contents (a directory) or name and content (a file)."""
    sha = hashlib.sha256()
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    for file in files:
        rel = file.relative_to(source) if source.is_dir() else Path(file.name)
        sha.update(str(rel).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
        sha.update(b"\0")
    return sha.hexdigest()


def _publish(staging: Path, target: Path) -> None:
    """Move a fully written staging dir into place (another writer may have won the race)."""
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
