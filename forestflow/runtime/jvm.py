"""The in-process JVM that scores H2O MOJOs: started once per process, lazily, thread-safely.

The genmodel classes (``hex.genmodel.*``) come from the ``h2o.jar`` the ``h2o`` wheel ships
(``h2o/backend/bin/h2o.jar``); nothing is downloaded. The ``genmodel_jar`` setting
(``FORESTFLOW_GENMODEL_JAR``) may point at a different jar (e.g. a standalone ``h2o-genmodel.jar``)
and ``jvm_opts`` (``FORESTFLOW_JVM_OPTS``) adds JVM options (e.g. ``-Xmx1g``); the gateway hands
them over with :func:`configure` when it builds its app.

Importing this module does not import ``jpype`` nor start anything: the JVM starts on the first
:func:`ensure_jvm` call (the first H2O model load). A JVM cannot survive a ``fork``: a child
forked after the start hangs in Java, so :func:`ensure_jvm` refuses to run in such a child; use
the ``spawn`` start method for worker processes.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from forestflow.extras import pip_command

__all__ = [
    "JAVA_DIR",
    "JVMError",
    "batch_scorer",
    "configure",
    "ensure_jvm",
    "genmodel_jar",
    "is_started",
    "jclass",
    "score_batch",
]

_lock = threading.Lock()
_started_pid: int | None = None
_classes: dict[str, Any] = {}
#: What :func:`configure` set (the settings); a name absent here is read from the environment.
_configured: dict[str, str] = {}

#: Our own Java helper: its source and compiled class (scripts/gen_java.py builds it).
JAVA_DIR = Path(__file__).resolve().parent / "java"
JAVA_SOURCES = ("BatchScorer.java",)

# A class every genmodel jar has: proves the classpath is right after start.
_PROBE_CLASS = "hex.genmodel.MojoModel"


class JVMError(RuntimeError):
    """The JVM or the genmodel classes are not available."""


def configure(jvm_opts: str, genmodel_jar: str) -> None:
    """Use these values of the ``jvm_opts`` and ``genmodel_jar`` settings (instead of the environment)
    when the JVM starts; has no effect on a JVM that already runs."""
    _configured["jvm_opts"] = jvm_opts
    _configured["genmodel_jar"] = genmodel_jar


def _setting(name: str) -> str:
    if name in _configured:
        return _configured[name]
    return os.environ.get(f"FORESTFLOW_{name.upper()}", "")


def genmodel_jar() -> Path:
    """The jar holding the genmodel classes: the ``genmodel_jar`` setting or the h2o wheel's h2o.jar."""
    override = _setting("genmodel_jar")
    if override:
        path = Path(override)
        if not path.is_file():
            raise JVMError(f"genmodel_jar = {override!r} is not a file (FORESTFLOW_GENMODEL_JAR)")
        return path
    # find_spec locates the package without importing it (importing h2o is slow and not needed).
    try:
        spec = importlib.util.find_spec("h2o")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise JVMError(
            f"the 'h2o' package, which ships the genmodel jar, is not installed: {pip_command('h2o-jvm')} "
            "(or set genmodel_jar to a genmodel jar)"
        )
    for location in spec.submodule_search_locations:
        jar = Path(location) / "backend" / "bin" / "h2o.jar"
        if jar.is_file():
            return jar
    raise JVMError("the installed 'h2o' package has no backend/bin/h2o.jar")


def is_started() -> bool:
    """Whether a JVM runs in this process (never starts one, never imports jpype)."""
    jpype = sys.modules.get("jpype")
    return bool(jpype is not None and jpype.isJVMStarted())


def _jvm_options() -> list[str]:
    # -Xrs: the JVM leaves SIGINT/SIGTERM/SIGHUP to Python, so the server's own signal handlers
    # (graceful shutdown) keep working after the JVM starts under them.
    options = ["-Xrs", "-Djava.awt.headless=true"]
    options += shlex.split(_setting("jvm_opts"))
    return options


def ensure_jvm() -> None:
    """Start the JVM with the genmodel classes on its classpath, unless it already runs.

    Safe to call from any thread, any number of times. If something else already started a JVM
    in this process, it is reused provided the genmodel classes can be loaded from it.
    """
    global _started_pid
    pid = os.getpid()
    if _started_pid == pid:
        return
    with _lock:
        if _started_pid == pid:
            return
        if _started_pid is not None:
            raise JVMError(
                "the JVM was started in a parent process before fork(); a forked child cannot use it. "
                "Start worker processes with the 'spawn' method."
            )
        try:
            import jpype
        except ImportError as exc:  # JPype comes with the h2o-jvm extra
            raise JVMError(f"JPype1, which starts the JVM, is not installed: {pip_command('h2o-jvm')}") from exc
        if not jpype.isJVMStarted():
            jar = genmodel_jar()
            try:
                jpype.startJVM(*_jvm_options(), classpath=[str(jar)], convertStrings=False, interrupt=False)
            except (OSError, ValueError) as exc:  # JPype's JVMNotFoundException is a ValueError
                raise JVMError(f"cannot start the JVM (is Java 8+ installed and JAVA_HOME set?): {exc}") from exc
            if threading.current_thread() is not threading.main_thread():
                # The starting thread is attached as the JVM's non-daemon main thread; if it is a
                # pool thread that later ends, DestroyJavaVM at interpreter exit waits for it
                # forever. Detached now, it re-attaches as a daemon on its next Java call.
                jpype.JClass("java.lang.Thread").detach()
        try:
            jpype.JClass(_PROBE_CLASS)
        except Exception as exc:
            raise JVMError(
                f"the running JVM cannot load {_PROBE_CLASS}: it was started without the genmodel jar on its classpath"
            ) from exc
        _started_pid = pid


def jclass(name: str) -> Any:
    """The JPype wrapper of a Java class (cached), starting the JVM if needed."""
    ensure_jvm()  # cheap once started; also refuses a JVM inherited through fork()
    cls = _classes.get(name)
    if cls is None:
        import jpype

        cls = _classes[name] = jpype.JClass(name)
    return cls


@functools.cache
def batch_scorer() -> Any:
    """Our ``forestflow.h2o.BatchScorer`` class (see ``java/BatchScorer.java``), loaded once.

    It is loaded by a class loader of its own whose parent is genmodel's, so it links against the
    same ``GenModel`` whatever started the JVM and whatever its classpath.
    """
    import jpype

    ensure_jvm()
    url = jclass("java.io.File")(str(JAVA_DIR) + os.sep).toURI().toURL()
    parent = jclass("hex.genmodel.GenModel").class_.getClassLoader()
    loader = jclass("java.net.URLClassLoader")(jpype.JArray(jclass("java.net.URL"))([url]), parent)
    return jpype.JClass("forestflow.h2o.BatchScorer", loader=loader)


@functools.cache
def _double_array() -> Any:
    """The ``double[]`` array type (building it costs more than a one-row score)."""
    import jpype

    return jpype.JArray(jpype.JDouble)


def score_batch(model: Any, X: np.ndarray, offsets: np.ndarray | None, preds_size: int) -> np.ndarray:
    """``GenModel.score0`` of every row of ``X`` (NaN = NA) in one Java call: ``(n, preds_size)``.

    The rows cross as one flat ``double[]`` and the predictions come back as another: a handful
    of JNI crossings per batch whatever its size (a ``double[][]`` costs one per row each way,
    and every crossing is slow once other work has pushed the JVM out of the CPU caches). With
    ``offsets`` the offset overload ``score0(row, offset, preds)`` is used per row.
    """
    import jpype

    ensure_jvm()  # cheap once started; refuses a JVM inherited through fork() (it would hang)
    n, features = X.shape
    doubles = _double_array()
    if n == 1 and offsets is None:  # one row: a direct call is as cheap and needs no copy
        out = doubles(preds_size)
        model.score0(doubles(np.ascontiguousarray(X[0], dtype=np.float64)), out)
        return np.array(out).reshape(1, preds_size)
    rows = jpype.JArray.of(np.ascontiguousarray(X, dtype=np.float64).reshape(-1))
    preds = doubles(n * preds_size)  # allocated on the Java side: cheaper than converting zeros
    if offsets is None:
        batch_scorer().score(model, rows, features, preds, preds_size)
    else:
        jo = jpype.JArray.of(np.ascontiguousarray(offsets, dtype=np.float64))
        batch_scorer().scoreWithOffsets(model, rows, features, jo, preds, preds_size)
    return np.array(preds).reshape(n, preds_size)
