"""``file://`` artifacts: a file or a directory under the allowed roots, copied within the size cap."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.registry.sources import FetchLimits, too_large

_BLOCK = 1 << 20


def check_local(uri: str, raw_path: str, roots: list[Path], limits: FetchLimits) -> tuple[Path, list[Path]]:
    """The resolved source and its files, after the roots, existence, symlink and size checks."""
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
    if not resolved.exists():
        raise CreateServableRequestInvalidError(f"path {uri!r}: {resolved} does not exist")
    files = sorted(p for p in resolved.rglob("*") if not p.is_dir()) if resolved.is_dir() else [resolved]
    total = 0
    for file in files:
        if file.is_symlink() and not file.exists():  # before the roots: where it points is not the problem
            raise CreateServableRequestInvalidError(
                f"path {uri!r}: {file} is a symbolic link to {os.readlink(file)}, which does not exist "
                "(a copy of the directory that left the link's target behind?); put the file itself there"
            )
        if file.is_symlink() and not _inside(file.resolve(), roots):
            raise CreateServableRequestInvalidError(
                f"path {uri!r}: {file} links outside the directories file:// deploys may read (artifact_roots)"
            )
        if not file.is_file():
            raise CreateServableRequestInvalidError(f"path {uri!r}: {file} is not a regular file")
        total += file.stat().st_size
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


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
