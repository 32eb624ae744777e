"""Contract and FQRV identifiers with their text forms (``org.project.N`` and ``org.project.N.release``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from forestflow.errors import InvalidInput

# Organization and project names are path segments and part of dotted text forms, so dots are out.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# A release is free text in ForestFlow; we allow dots (versions like 1.2.3) but nothing that
# could escape a directory or a URL path segment.
_RELEASE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True, slots=True, order=True)
class Contract:
    """A contract ``{organization, project, contract_number}``: what clients address."""

    organization: str
    project: str
    number: int
    #: The text form and the hash, made once: every request asks for both (registry look-ups,
    #: logs, metrics, answers); the generated ``__hash__`` would hash a new tuple of the fields.
    _text: str = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.organization):
            raise InvalidInput(f"invalid organization {self.organization!r}: use 1-128 of [A-Za-z0-9_-]")
        if not _NAME.match(self.project):
            raise InvalidInput(f"invalid project {self.project!r}: use 1-128 of [A-Za-z0-9_-]")
        if isinstance(self.number, bool) or not isinstance(self.number, int) or not 0 <= self.number < 2**31:
            raise InvalidInput(f"invalid contract number {self.number!r}: use an integer 0..2147483647")
        object.__setattr__(self, "_text", f"{self.organization}.{self.project}.{self.number}")
        object.__setattr__(self, "_hash", hash(self._text))

    def __str__(self) -> str:
        return self._text

    def __hash__(self) -> int:  # equal contracts have equal texts
        return self._hash

    def __reduce__(self) -> tuple[type[Contract], tuple[str, str, int]]:
        return Contract, (self.organization, self.project, self.number)  # hashes differ between processes

    @classmethod
    def parse(cls, text: str) -> Contract:
        """Parse ``org.project.N``."""
        parts = text.split(".")
        if len(parts) != 3 or not parts[2].isdigit():
            raise InvalidInput(f"invalid contract {text!r}: expected org.project.N")
        return cls(parts[0], parts[1], int(parts[2]))


@dataclass(frozen=True, slots=True, order=True)
class FQRV:
    """A fully qualified release version: one servable of a contract."""

    contract: Contract
    release: str
    #: The text form and the hash, made once (as Contract's).
    _text: str = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.release, str) or not _RELEASE.match(self.release) or ".." in self.release:
            raise InvalidInput(f"invalid release version {self.release!r}: use 1-128 of [A-Za-z0-9._-], not starting with '.'")
        object.__setattr__(self, "_text", f"{self.contract}.{self.release}")
        object.__setattr__(self, "_hash", hash(self._text))

    def __str__(self) -> str:
        return self._text

    def __hash__(self) -> int:  # equal releases have equal texts
        return self._hash

    def __reduce__(self) -> tuple[type[FQRV], tuple[Contract, str]]:
        return FQRV, (self.contract, self.release)

    @classmethod
    def parse(cls, text: str) -> FQRV:
        """Parse ``org.project.N.release`` (the release may itself contain dots)."""
        parts = text.split(".", 3)
        if len(parts) != 4 or not parts[2].isdigit():
            raise InvalidInput(f"invalid FQRV {text!r}: expected org.project.N.release")
        return cls(Contract(parts[0], parts[1], int(parts[2])), parts[3])
