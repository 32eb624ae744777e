"""The model file a flavor's ``modelPath`` setting names inside the servable's directory (ONNX and
the tree flavors), checked before anything reads it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime.base import Servable


def model_path(servable: Servable, flavor: str, known: Iterable[str], what: str = "the model file") -> tuple[Path, str]:
    """The file ``modelPath`` names and the name to show; unknown settings are refused first (a typo is no default)."""
    known = tuple(known)
    unknown = sorted(set(servable.settings) - set(known))
    if unknown:
        raise CreateServableRequestInvalidError(
            f"flavor.{flavor}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    raw = servable.settings.get("modelPath")
    if not isinstance(raw, str) or not raw.strip():
        raise CreateServableRequestInvalidError(f'the {flavor} flavor needs "modelPath": {what} inside the servable directory')
    base = Path(servable.artifact_dir).resolve()
    path = (base / raw).resolve()
    if Path(raw).is_absolute() or not path.is_relative_to(base):
        raise CreateServableRequestInvalidError(f"flavor.{flavor}.modelPath {raw!r} must stay inside the servable directory")
    if not path.is_file():
        raise CreateServableRequestInvalidError(f"{flavor} model {raw!r} not found in the servable directory")
    return path, raw
