"""Artifact sources: each copies or downloads one artifact into a staging directory.

The :class:`~forestflow.registry.artifacts.ArtifactCache` gives a source an empty staging
directory and the limits below; the source fills it or raises
:class:`~forestflow.errors.CreateServableRequestInvalidError` saying what went wrong. The cache
removes the staging directory on any failure and moves it into place only when it is complete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from forestflow.errors import CreateServableRequestInvalidError


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """What one fetch may take: bytes on disk and seconds."""

    max_bytes: int
    timeout_s: float


def too_large(what: str, limits: FetchLimits) -> CreateServableRequestInvalidError:
    """The refusal of an artifact over the size cap, naming the setting."""
    return CreateServableRequestInvalidError(
        f"{what}: larger than artifact_max_bytes = {limits.max_bytes} bytes (FORESTFLOW_ARTIFACT_MAX_BYTES)"
    )


def timed_out(what: str, limits: FetchLimits) -> CreateServableRequestInvalidError:
    """The refusal of a fetch that took too long, naming the setting."""
    return CreateServableRequestInvalidError(
        f"{what}: not fetched within artifact_download_timeout_s = {limits.timeout_s:g} s "
        "(FORESTFLOW_ARTIFACT_DOWNLOAD_TIMEOUT_S)"
    )


_USERINFO = re.compile(r"//[^/@\s]+@")


def redact(text: str) -> str:
    """A URL or message with any ``user:password@`` taken out."""
    return _USERINFO.sub("//***@", text)


def tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (files vanishing meanwhile are skipped)."""
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def safe_relative(name: str) -> Path:
    """A relative path that stays inside the directory it is joined to, or a 422."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts:
        raise CreateServableRequestInvalidError(f"{name!r}: expected a relative path inside the artifact")
    return rel
