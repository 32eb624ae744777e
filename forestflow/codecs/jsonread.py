"""Reading ForestFlow-style JSON: snake_case or camelCase keys, single-key oneof objects, typed
fields, and error messages that name the path of what is wrong."""

from __future__ import annotations

import builtins
import functools
import re
from typing import Any, TypeVar

from forestflow.errors import InvalidInput

T = TypeVar("T")

_CAMEL_BOUNDARY = re.compile(r"_([a-z0-9])")


# Cached: the names are the codecs' own field names, and a registry of 10,000 releases is read
# at every start (computing both spellings per lookup was most of parsing a serve request).
@functools.lru_cache(maxsize=4096)
def camel(name: str) -> str:
    """``phase_in_over_secs`` -> ``phaseInOverSecs``."""
    return _CAMEL_BOUNDARY.sub(lambda m: m.group(1).upper(), name)


@functools.lru_cache(maxsize=4096)
def snake(name: str) -> str:
    """``phaseInOverSecs`` -> ``phase_in_over_secs`` (``validAfterMS`` -> ``valid_after_ms``)."""
    out = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return out.lower()


class Obj:
    """A JSON object being read, with its path for error messages."""

    __slots__ = ("data", "path")

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise InvalidInput(f"{path or 'body'}: expected a JSON object, got {type_name(data)}")
        self.data = data
        self.path = path

    def _key(self, name: str) -> str | None:
        data = self.data
        if name in data:
            return name
        for candidate in (camel(name), snake(name)):
            if candidate in data:
                return candidate
        return None

    def has(self, name: str) -> bool:
        """Whether the field is present (in either spelling) and not null."""
        key = self._key(name)
        return key is not None and self.data[key] is not None

    def raw(self, name: str) -> Any:
        """The raw value or None."""
        key = self._key(name)
        return None if key is None else self.data[key]

    def sub(self, name: str) -> str:
        """The path of a child field."""
        return f"{self.path}.{name}" if self.path else name

    def obj(self, name: str, required: bool = True) -> Obj | None:
        """A nested object."""
        if not self.has(name):
            if required:
                raise InvalidInput(f"{self.sub(name)}: required")
            return None
        return Obj(self.raw(name), self.sub(name))

    def str(self, name: builtins.str, required: bool = True, default: builtins.str = "") -> str:
        """A string field."""
        return self._typed(name, builtins.str, "a string", required, default)

    def int(self, name: builtins.str, required: bool = True, default: int = 0) -> int:
        """An integer field (int64 may arrive as a JSON string, as protobuf JSON prints it)."""
        if not self.has(name):
            if required:
                raise InvalidInput(f"{self.sub(name)}: required")
            return default
        value = self.raw(name)
        if isinstance(value, builtins.str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise InvalidInput(f"{self.sub(name)}: expected an integer, got {value!r}")
        return int(value)

    def float(self, name: builtins.str, required: bool = True, default: float = 0.0) -> float:
        """A number field."""
        if not self.has(name):
            if required:
                raise InvalidInput(f"{self.sub(name)}: required")
            return default
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInput(f"{self.sub(name)}: expected a number, got {value!r}")
        return float(value)

    def list(self, name: builtins.str, required: bool = False) -> list[Any]:
        """An array field (absent -> empty)."""
        if not self.has(name):
            if required:
                raise InvalidInput(f"{self.sub(name)}: required")
            return []
        value = self.raw(name)
        if not isinstance(value, list):
            raise InvalidInput(f"{self.sub(name)}: expected an array, got {type_name(value)}")
        return value

    def str_map(self, name: builtins.str) -> dict[builtins.str, builtins.str]:
        """A ``map<string,string>`` field (absent -> empty)."""
        if not self.has(name):
            return {}
        value = self.raw(name)
        if not isinstance(value, dict) or not all(isinstance(v, builtins.str) for v in value.values()):
            raise InvalidInput(f"{self.sub(name)}: expected an object of string values")
        return dict(value)

    def _typed(self, name: builtins.str, kind: type[T], label: builtins.str, required: bool, default: T) -> T:
        if not self.has(name):
            if required:
                raise InvalidInput(f"{self.sub(name)}: required")
            return default
        value = self.raw(name)
        if not isinstance(value, kind):
            raise InvalidInput(f"{self.sub(name)}: expected {label}, got {value!r}")
        return value


def oneof(value: Any, path: str, variants: tuple[str, ...]) -> tuple[str, Obj]:
    """Read a single-key oneof object such as ``{"KeepLatest": {...}}``."""
    if isinstance(value, str) and value in variants:
        return value, Obj({}, f"{path}.{value}")
    if not isinstance(value, dict) or len(value) != 1:
        raise InvalidInput(f"{path}: expected an object with exactly one of {', '.join(variants)}")
    ((name, body),) = value.items()
    if name not in variants:
        raise InvalidInput(f"{path}: unknown variant {name!r}; expected one of {', '.join(variants)}")
    return name, Obj({} if body is None else body, f"{path}.{name}")


def type_name(value: Any) -> str:
    """A JSON-ish type name for error messages."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
