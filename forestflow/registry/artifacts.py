"""The artifact cache: every source fetched into one content-addressed directory under the data dir.

A fetch fills a staging directory (``.staging-*``) and moves it to ``<cache>/<sha256>/`` only
once complete, so a failure or a cancellation never leaves a partial artifact in place (the
staging directory is removed; one left by a crash goes at the next start). Concurrent fetches of
the same source share one download. Remote sources (HTTP, Git, S3) are remembered as
source -> digest, so a restart reuses the directory without fetching again.

Every servable that uses an artifact holds an :class:`ArtifactClaim`; releasing the last claim on
a directory removes it (delete, expiration, failed deploy; not an eviction from memory, which
keeps it for the next load), and :meth:`ArtifactCache.prune` removes whatever no claim holds and
no cold release may load from (called once the gateway has restored its servables).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import structlog

from forestflow.core.ids import FQRV
from forestflow.core.locator import FileLocator, GitLocator, HttpLocator, Locator, S3Locator, git_tag, parse_locator
from forestflow.errors import GatewayError
from forestflow.extras import needed_for
from forestflow.registry.sources import FetchLimits
from forestflow.registry.sources.git import fetch_git
from forestflow.registry.sources.http import fetch_http
from forestflow.registry.sources.local import changed_while_read, check_local, copy_local, digest_local
from forestflow.settings import Settings

log = structlog.get_logger("forestflow.artifacts")

_STAGING = ".staging-"
_INDEX = "url-index.json"
_claim_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ArtifactRequest:
    """What to fetch: the servable's ``path``, its FQRV (the Git tag) and the files it needs."""

    path: str
    fqrv: FQRV
    #: Files the flavor loads, relative to the artifact (S3 fetches only these); None = all.
    files: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class ArtifactClaim:
    """One servable's hold on a cached directory; released when the servable goes."""

    directory: Path
    digest: str
    id: int = field(default_factory=lambda: next(_claim_ids))


class ArtifactCache:
    """Fetches artifacts by locator into ``root`` and removes the ones no servable holds."""

    def __init__(
        self,
        root: Path,
        limits: FetchLimits | None = None,
        file_roots: list[Path] | None = None,
        git_ssh_scheme: str = "https",
        git_ssl_verify: bool = True,
        written: list[tuple[Path, str, bool]] | None = None,
    ) -> None:
        self.root = root
        #: What the gateway writes while it runs (a file:// source may not hold or lie inside one).
        self.written = written if written is not None else [(root, "the artifact cache", True)]
        self.limits = limits or FetchLimits(2 * 1024**3, 300.0)
        self.file_roots = file_roots if file_roots is not None else [Path.cwd().resolve()]
        self.git_ssh_scheme = git_ssh_scheme
        self.git_ssl_verify = git_ssl_verify
        self._claims: dict[str, set[int]] = {}
        self._inflight: dict[str, asyncio.Future[str]] = {}
        self._lock = asyncio.Lock()
        self._index: dict[str, str] | None = None
        #: How many fetches went to the source (not served from the cache): for tests and logs.
        self.fetch_count = 0

    @classmethod
    def from_settings(cls, settings: Settings, replica: str | None = None) -> ArtifactCache:
        """The cache under ``<data_dir>/artifacts`` with the settings' limits and roots.

        Each worker of ``--workers N`` (``replica`` ``w<i>``) has a cache of its own under it: claims
        are held in memory, so a cache shared by processes would let one remove what another uses.
        """
        log_file = settings.data_dir / settings.log_file
        return cls(
            settings.data_dir / "artifacts" / replica if replica else settings.data_dir / "artifacts",
            FetchLimits(settings.artifact_max_bytes, settings.artifact_download_timeout_s),
            settings.file_roots,
            settings.git_ssh_scheme,
            settings.git_ssl_verify,
            [  # a model directory of its own under the data dir is fine; these are not
                (settings.data_dir, "the gateway's data directory", False),
                (settings.data_dir / "state", "the gateway's registry state", True),
                (settings.data_dir / "artifacts", "the artifact cache", True),
                (log_file, "the prediction log", True),
                (log_file.with_name(f"{log_file.stem}.gp{log_file.suffix}"), "the GraphPipe prediction log", True),
            ],
        )

    # ---- fetching ---------------------------------------------------------------------------------
    def locate(self, path: str) -> Locator:
        """The locator of a servable path (422 for an unsupported one)."""
        return parse_locator(path, self.git_ssh_scheme)

    async def fetch(self, request: ArtifactRequest) -> ArtifactClaim:
        """Fetch (or reuse) the artifact and claim it; raises CreateServableRequestInvalidError with the reason."""
        locator = self.locate(request.path)
        key = _source_key(locator, request)
        for _ in range(3):  # the directory can be released between the fetch and the claim: fetch again
            digest = await self._single_flight(key, locator, request)
            async with self._lock:
                if (self.root / digest).is_dir():
                    claim = ArtifactClaim(self.root / digest, digest)
                    self._claims.setdefault(digest, set()).add(claim.id)
                    return claim
        raise RuntimeError(f"artifact {digest} vanished three times while being claimed")

    async def _single_flight(self, key: str, locator: Locator, request: ArtifactRequest) -> str:
        running = self._inflight.get(key)
        if running is None:
            running = asyncio.ensure_future(self._fetch_digest(key, locator, request))
            self._inflight[key] = running
            running.add_done_callback(lambda done: self._inflight.pop(key, None) if self._inflight.get(key) is done else None)
            running.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved: no warning
        # Shielded: one caller going away must not cancel the download the others wait for.
        return await asyncio.shield(running)

    async def _fetch_digest(self, key: str, locator: Locator, request: ArtifactRequest) -> str:
        if isinstance(locator, FileLocator):
            return await asyncio.to_thread(self._fetch_local, request.path, locator)
        index = await self._read_index()
        known = index.get(key)
        if known and (self.root / known).is_dir():
            return known
        staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=self._ensure_root()))
        try:
            self.fetch_count += 1
            if isinstance(locator, HttpLocator):
                await fetch_http(locator.url, staging, self.limits)
            elif isinstance(locator, GitLocator):
                await fetch_git(locator.repo_url, git_tag(request.fqrv), staging, self.limits, self.git_ssl_verify)
            else:
                with needed_for("an S3 model source"):  # aiobotocore comes with the s3 extra
                    from forestflow.registry.sources.s3 import fetch_s3
                await fetch_s3(locator, request.files, staging, self.limits)
            digest = await asyncio.to_thread(_digest_tree, staging)
            await asyncio.to_thread(_publish, staging, self.root / digest)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise
        async with self._lock:
            index = await self._read_index()
            index[key] = digest
            await asyncio.to_thread(self._write_index, index)
        return digest

    def _fetch_local(self, uri: str, locator: FileLocator) -> str:
        source, files = check_local(uri, locator.path, self.file_roots, self.limits, self.written)
        try:
            digest = digest_local(source, files)
            if (self.root / digest).is_dir():
                return digest
            self.fetch_count += 1
            staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=self._ensure_root()))
            try:
                copy_local(uri, source, files, staging, self.limits)
                # Named by what was copied: a source changed since its digest is still cached as copied.
                digest = _digest_tree(staging)
                _publish(staging, self.root / digest)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        except OSError as exc:  # a file vanished or moved under us: the reason, not a 500
            raise changed_while_read(uri, exc) from None
        return digest

    # ---- releasing and pruning ----------------------------------------------------------------------
    async def release(self, claim: ArtifactClaim, *, keep: bool = False) -> None:
        """Drop a servable's claim; the directory goes when no other servable holds it, unless
        ``keep`` (a release evicted from memory stays in the registry and loads from it again)."""
        async with self._lock:
            holders = self._claims.get(claim.digest)
            if holders is None:
                return
            holders.discard(claim.id)
            if holders:
                return
            del self._claims[claim.digest]
            if not keep:
                await self._remove([claim.digest])

    async def prune(self, keep: Iterable[ArtifactRequest] = ()) -> list[str]:
        """Remove every cached directory no servable holds, and staging leftovers; returns their names.

        ``keep``: sources of releases that are not loaded but may be (cold, with lazy loading): the
        directories they were fetched into stay. A local source's digest is read from the source
        (it is copied again if it changed); a remote one's from the source index."""
        kept = await self._digests_of(list(keep))
        async with self._lock:
            if not self.root.is_dir():
                return []
            unused = [p.name for p in self.root.iterdir() if p.is_dir() and p.name not in self._claims and p.name not in kept]
            unused = [n for n in unused if not (n.startswith(_STAGING) and self._inflight)]  # not a live fetch's
            await self._remove(unused)
        if unused:
            log.info("artifacts_pruned", count=len(unused))
        return unused

    async def _digests_of(self, requests: list[ArtifactRequest]) -> set[str]:
        """The cached directories the sources of ``requests`` were (or would be) fetched into."""
        if not requests:
            return set()
        index = await self._read_index()
        digests: set[str] = set()

        def read() -> None:  # off the loop: thousands of releases (sharing a few sources)
            local: dict[str, tuple[str, FileLocator]] = {}
            for request in requests:
                try:
                    locator = self.locate(request.path)
                except GatewayError:
                    continue
                key = _source_key(locator, request)
                if isinstance(locator, FileLocator):
                    local.setdefault(key, (request.path, locator))
                elif key in index:
                    digests.add(index[key])
            for uri, locator in local.values():
                try:
                    source, files = check_local(uri, locator.path, self.file_roots, self.limits, self.written)
                    digests.add(digest_local(source, files))
                except (GatewayError, OSError):
                    continue  # gone or refused now: its load will say so

        await asyncio.to_thread(read)
        return digests

    def in_use(self) -> dict[str, int]:
        """Cached directories and how many servables hold each."""
        return {digest: len(holders) for digest, holders in self._claims.items()}

    async def _remove(self, names: list[str]) -> None:
        """Delete directories and forget the sources that pointed at them (the lock is held)."""
        if not names:
            return
        for name in names:
            await asyncio.to_thread(shutil.rmtree, self.root / name, True)
        index = await self._read_index()
        kept = {k: v for k, v in index.items() if v not in set(names)}
        if kept != index:
            await asyncio.to_thread(self._write_index, kept)

    # ---- the source index -------------------------------------------------------------------------
    def _ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    async def _read_index(self) -> dict[str, str]:
        if self._index is None:
            self._index = await asyncio.to_thread(self._load_index)
        return dict(self._index)

    def _load_index(self) -> dict[str, str]:
        try:
            return dict(orjson.loads((self.root / _INDEX).read_bytes()))
        except (FileNotFoundError, orjson.JSONDecodeError):
            return {}

    def _write_index(self, index: dict[str, str]) -> None:
        self._index = dict(index)
        if not index:  # nothing remembered: no file either (an unused cache is an empty directory)
            (self.root / _INDEX).unlink(missing_ok=True)
            return
        self._ensure_root()
        tmp = self.root / (_INDEX + ".tmp")
        tmp.write_bytes(orjson.dumps(index))
        os.replace(tmp, self.root / _INDEX)
        self._index = dict(index)


def _source_key(locator: Locator, request: ArtifactRequest) -> str:
    """What identifies one fetch: the same key means the same bytes (single flight, source index)."""
    if isinstance(locator, FileLocator):
        return "file:" + locator.path
    if isinstance(locator, HttpLocator):
        return locator.url
    if isinstance(locator, GitLocator):
        return f"git:{locator.repo_url}#{git_tag(request.fqrv)}"
    assert isinstance(locator, S3Locator)
    files = ",".join(request.files) if request.files else "*"
    return f"s3:{locator.endpoint or ''}|{locator.bucket}|{locator.prefix}|{files}"


def _digest_tree(root: Path) -> str:
    """sha256 over relative names and contents of every file under ``root``."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return digest_local(root, files) if files else hashlib.sha256(b"").hexdigest()


def _publish(staging: Path, target: Path) -> None:
    """Move a fully written staging dir into place (another writer may have won the race)."""
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
