"""The ``Python`` flavor: a module in the artifact directory scores frames.

Definition: ``{"flavor": {"Python": {"modulePath": "model.py", "entryPoint": "predict"}}}``.
``entryPoint`` names either a function ``predict(frame: Frame) -> Frame`` (or returning a mapping
of columns), or a class whose instances have such a ``predict`` method (instantiated once at load;
its constructor may take the artifact directory as its only argument). An optional module-level
``METADATA = {"inputs": [...], "outputs": [...]}`` (each ``{"name", "datatype", "shape"}``)
describes the model. Off unless the operator allows it: it runs code an admin request names.

Concurrent requests share one ``predict`` call (micro-batching) only when the model opts in: the
entry point (function or class) has ``batchable = True``, or the flavor setting ``"batchable": true``
(which wins). Only a model that scores row by row may: each request gets its rows of the answer.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from forestflow.core.frame import Frame, TensorSpec
from forestflow.core.ids import FQRV
from forestflow.errors import CreateServableRequestInvalidError
from forestflow.runtime.base import Servable, ServableMetadata

_module_ids = itertools.count()


def _specs(items: Any, what: str) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list):
        raise CreateServableRequestInvalidError(f"METADATA[{what!r}] must be a list")
    return tuple(
        TensorSpec(str(i["name"]), str(i.get("datatype", "FP64")), tuple(i.get("shape", (-1,))), str(i.get("description", "")))
        for i in items
    )


class PythonServable(Servable):
    """Scores with a Python function or class loaded from the artifact directory."""

    def __init__(self, fqrv: FQRV, artifact_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(fqrv, artifact_dir, settings)
        self._predict: Callable[[Frame], Any] | None = None
        self._metadata: ServableMetadata | None = None

    def load(self) -> None:
        module_path = self.settings.get("modulePath") or self.settings.get("module_path")
        entry = self.settings.get("entryPoint") or self.settings.get("entry_point") or "predict"
        if not isinstance(module_path, str) or not module_path:
            raise CreateServableRequestInvalidError("flavor.Python.modulePath: required (a .py file in the artifact)")
        root = self.artifact_dir.resolve()
        file = (root / module_path).resolve()
        if root not in file.parents and file != root:
            raise CreateServableRequestInvalidError(f"flavor.Python.modulePath {module_path!r} leaves the artifact directory")
        if not file.is_file():
            raise CreateServableRequestInvalidError(f"flavor.Python.modulePath {module_path!r} not found in the artifact")
        name = f"forestflow_servable_{next(_module_ids)}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise CreateServableRequestInvalidError(f"cannot import {module_path!r}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            target: Any = getattr(module, entry)
            self.batchable = self._opts_in(target)
            if inspect.isclass(target):
                params = inspect.signature(target).parameters
                factory: Any = target
                instance = factory(self.artifact_dir) if params else factory()
                self._predict = instance.predict
            else:
                self._predict = target
        except CreateServableRequestInvalidError:
            raise
        except Exception as exc:  # any failure in user code is a load failure with its reason
            raise CreateServableRequestInvalidError(f"loading {module_path!r} failed: {type(exc).__name__}: {exc}") from exc
        meta = getattr(module, "METADATA", {}) or {}
        self._metadata = ServableMetadata(
            name=entry,
            platform="python",
            inputs=_specs(meta.get("inputs", []), "inputs"),
            outputs=_specs(meta.get("outputs", []), "outputs"),
            description=str(getattr(module, "__doc__", "") or "").strip(),
        )
        sys.modules.pop(name, None)
        self.ready = True

    def _opts_in(self, target: Any) -> bool:
        """Whether the model lets several requests share one call: the setting, else the model's word."""
        setting = self.settings.get("batchable")
        if setting is not None:
            if not isinstance(setting, bool):
                raise CreateServableRequestInvalidError(f"flavor.Python.batchable: expected true or false, got {setting!r}")
            return setting
        return getattr(target, "batchable", False) is True

    def predict(self, frame: Frame) -> Frame:
        assert self._predict is not None, "predict before load"
        # Whatever the model raises is the server's failure: the scheduler answers it as a 500
        # PredictionFailed and the service logs its type and traceback.
        result = self._predict(frame)
        if isinstance(result, Frame):
            out = result
        elif isinstance(result, Mapping):
            out = Frame.from_columns(result)
        else:
            raise TypeError(f"{self.fqrv}: predict returned {type(result).__name__}, expected a Frame or a mapping")
        return out  # its row count is checked on the scoring path (scheduler)

    def metadata(self) -> ServableMetadata:
        assert self._metadata is not None, "metadata before load"
        return self._metadata

    def unload(self) -> None:
        self._predict = None
        self.ready = False
