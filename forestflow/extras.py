"""The optional parts of forestflow and the pip extras that install them.

``pip install forestflow`` serves native H2O GBM/DRF, XGBoost and LightGBM, Python, RemoteV2 and
pipelines, with Kafka and Redis. Everything else needs an extra (``pip install 'forestflow[onnx]'``): the packages each extra
brings are imported only where that feature is used, and a feature used without them is refused
with the pip command that installs them, never with an ImportError. Deploying a flavor whose extra
is missing is a 422 (:class:`MissingExtra`); ``forestflow serve`` with a setting that needs one stops
with one line (:func:`missing_for_settings`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from forestflow.errors import CreateServableRequestInvalidError


@dataclass(frozen=True, slots=True)
class Extra:
    """One pip extra: its name and the top-level modules it installs."""

    name: str
    modules: tuple[str, ...]


#: Every extra whose absence the gateway reports, by name. (``all`` is every one of them, ``test``
#: adds the test tools; neither is listed here because no feature needs them by name.)
EXTRAS: dict[str, Extra] = {
    extra.name: extra
    for extra in (
        Extra("h2o-jvm", ("jpype", "h2o")),
        Extra("images", ("PIL",)),
        Extra("mlflow", ("yaml",)),
        Extra("onnx", ("onnxruntime", "onnx")),
        Extra("s3", ("aiobotocore", "botocore")),
        Extra("sklearn", ("sklearn", "joblib")),
        Extra("tracing", ("opentelemetry",)),
        Extra("uvloop", ("uvloop",)),
    )
}


def pip_command(extra: str) -> str:
    """The command that installs an extra."""
    return f"pip install 'forestflow[{extra}]'"


def extra_of(module: str | None) -> Extra | None:
    """The extra that installs a module (by its top-level package), or None when no extra does."""
    top = (module or "").split(".", 1)[0]
    return next((extra for extra in EXTRAS.values() if top in extra.modules), None)


def installed(module: str) -> bool:
    """Whether a module can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a broken spec
        return False


def missing_message(what: str, extra: Extra, module: str) -> str:
    """One line: what cannot be done, which package is missing and the pip command."""
    return f"{what} needs {module!r}, which is not installed: {pip_command(extra.name)}"


class MissingExtra(CreateServableRequestInvalidError):
    """A servable needs a package that only an extra installs: a 422 naming the pip command, in ForestFlow's
    envelope of a serve request it cannot carry out."""

    @property
    def envelope_key(self) -> str:
        return "CreateServableRequestInvalidError"


@contextmanager
def needed_for(what: str) -> Iterator[None]:
    """Turn the ImportError of a module an extra installs, raised inside, into :class:`MissingExtra`."""
    try:
        yield
    except ImportError as exc:
        extra = extra_of(exc.name)
        if extra is None:
            raise
        raise MissingExtra(missing_message(what, extra, str(exc.name))) from None


def missing_for_settings(settings: Any) -> str | None:
    """One line saying which extra a setting needs and how to install it, or None when all is there."""
    from forestflow.tracing import wanted  # imports no OpenTelemetry

    needs: list[tuple[str, str]] = []
    if wanted(settings.otel_exporter_otlp_endpoint):
        needs.append(("tracing", "otel_exporter_otlp_endpoint (tracing on)"))
    if settings.event_loop == "uvloop":
        needs.append(("uvloop", "event_loop = uvloop"))
    if settings.h2o_scorer == "jvm":
        needs.append(("h2o-jvm", "h2o_scorer = jvm"))
    for extra_name, setting in needs:
        extra = EXTRAS[extra_name]
        absent = [module for module in extra.modules if not installed(module)]
        if absent and not (extra_name == "h2o-jvm" and absent == ["h2o"] and settings.genmodel_jar):
            return f"setting {setting} needs {absent[0]!r}, which is not installed: {pip_command(extra_name)}"
    return None
