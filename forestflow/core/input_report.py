"""What a request's columns lacked or had too many of, and the ``strictInputs`` rule built on it.

A flavor that matches inputs by name (H2O) reports, in its output frame's parameters, the model
inputs the request did not send (``missing_inputs``; scored as NA) and the request columns the
model does not take (``unknown_inputs``; ignored). The front-ends pass both on to the caller
(header and body field). A servable with ``strictInputs`` turns either into a 400 instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from forestflow.core.frame import Frame
from forestflow.core.policies import ServableSettings
from forestflow.errors import InvalidInput

MISSING = "missing_inputs"
UNKNOWN = "unknown_inputs"


def missing_inputs(frame: Frame) -> list[str]:
    """Model inputs the request did not send (as the flavor reported them)."""
    return list(frame.parameters.get(MISSING) or ())


def unknown_inputs(frame: Frame) -> list[str]:
    """Request columns the model does not take (as the flavor reported them)."""
    return list(frame.parameters.get(UNKNOWN) or ())


def describe(missing: Sequence[str], unknown: Sequence[str]) -> str:
    """``missing inputs: A, B; unknown inputs: C`` (only the parts that are not empty)."""
    parts = []
    if missing:
        parts.append("missing inputs: " + ", ".join(missing))
    if unknown:
        parts.append("unknown inputs: " + ", ".join(unknown))
    return "; ".join(parts)


def strict_inputs_error(settings: ServableSettings, output: Frame) -> InvalidInput | None:
    """The 400 a ``strictInputs`` servable answers when the request's columns were not exactly its inputs."""
    if not settings.strict_inputs:
        return None
    missing, unknown = missing_inputs(output), unknown_inputs(output)
    if not missing and not unknown:
        return None
    return InvalidInput(f"strictInputs: {describe(missing, unknown)}")


def checked(settings: ServableSettings, output: Frame) -> Frame:
    """``output`` itself, or the ``strictInputs`` 400 raised."""
    error = strict_inputs_error(settings, output)
    if error is not None:
        raise error
    return output
