"""``file://`` artifacts: a file or a directory under the allowed roots, copied within the size cap."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources import FetchLimits, too_large

_BLOCK = 1 << 20


def check_local(
    uri: str, raw_path: str, roots: list[Path], limits: FetchLimits, written: Sequence[tuple[Path, str, bool]] = ()
) -> tuple[Path, list[Path]]:
    """The resolved source and its files, after the roots, existence, symlink and size checks.

    ``written``: what the gateway writes to while it runs (path, what it is, whether a source
    inside it is refused too). A source that holds one is refused: its copy would race with
    those writes.
    """
    source = Path(raw_path).expanduser()
    if not source.is_absolute():
        source = Path.cwd() / source
    resolved = source.resolve()
    if not _inside(resolved, roots):
        raise CreateServableRequestInvalidError(
            f"path {uri!r}: {resolved} is outside the directories file:// deploys may read "
            f"(artifact_roots: {', '.join(str(r) for r in roots)}); an operator can add one with "
            "FORESTFLOW_ARTIFACT_ROOTS"
        )
    _check_not_written(uri, resolved, written)
    if not resolved.exists():
        raise CreateServableRequestInvalidError(f"path {uri!r}: {resolved} does not exist")
    try:
        files = sorted(p for p in resolved.rglob("*") if not p.is_dir()) if resolved.is_dir() else [resolved]
    except OSError as exc:
        raise changed_while_read(uri, exc) from None
    total = 0
    for file in files:
        if file.is_symlink() and not _inside(file.resolve(), roots):
            raise CreateServableRequestInvalidError(
                f"path {uri!r}: {file} links outside the directories file:// deploys may read (artifact_roots)"
            )
        if not file.is_file():
            raise CreateServableRequestInvalidError(f"path {uri!r}: {file} is not a regular file")
        try:
            total += file.stat().st_size
        except OSError as exc:
            raise changed_while_read(uri, exc) from None
        if total > limits.max_bytes:  # refused before a single byte is copied
            raise too_large(f"path {uri!r}", limits)
    return resolved, files


def digest_local(source: Path, files: list[Path]) -> str:
    """sha256 over relative names and contents, as the cache names its directories."""
    sha = hashlib.sha256()
    for file in files:
        rel = file.relative_to(source) if source.is_dir() else Path(file.name)
        sha.update(str(rel).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(_BLOCK), b""):
                sha.update(block)
        sha.update(b"\0")
    return sha.hexdigest()


def copy_local(uri: str, source: Path, files: list[Path], staging: Path, limits: FetchLimits) -> None:
    """Copy the files into ``staging``, counting bytes again (a file may grow while we copy)."""
    copied = 0
    for file in files:
        rel = file.relative_to(source) if source.is_dir() else Path(file.name)
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(file, "rb") as src, open(target, "wb") as out:
            for block in iter(lambda: src.read(_BLOCK), b""):
                copied += len(block)
                if copied > limits.max_bytes:
                    raise too_large(f"path {uri!r}", limits)
                out.write(block)
        os.utime(target, (file.stat().st_atime, file.stat().st_mtime))


def _check_not_written(uri: str, source: Path, written: Sequence[tuple[Path, str, bool]]) -> None:
    """Refuse a source that holds something the gateway writes, or lies inside one (``inside``)."""
    for path, what, inside in written:
        path = path.resolve()
        if path == source or path.is_relative_to(source):
            raise CreateServableRequestInvalidError(
                f"path {uri!r}: {source} contains {what} ({path}), which the gateway writes to while it runs, so "
                "a copy of it could never be consistent; deploy from a directory that holds only the model's files"
            )
        if inside and source.is_relative_to(path):
            raise CreateServableRequestInvalidError(
                f"path {uri!r}: {source} is inside {what} ({path}), which the gateway writes to while it runs; "
                "deploy from a directory that holds only the model's files"
            )


def changed_while_read(uri: str, exc: OSError) -> CreateServableRequestInvalidError:
    """The refusal of a local source whose files changed (vanished, moved) while they were read."""
    name = exc.filename or "a file"
    return CreateServableRequestInvalidError(
        f"path {uri!r}: {name} changed while it was read ({exc.strerror or exc}); something else writes "
        "to the source: deploy from a directory that holds only the model's files"
    )


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
