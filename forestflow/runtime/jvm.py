"""The in-process JVM that scores H2O MOJOs: started once per process, lazily, thread-safely.

The genmodel classes (``hex.genmodel.*``) come from the ``h2o.jar`` the ``h2o`` wheel ships
(``h2o/backend/bin/h2o.jar``); nothing is downloaded. ``FORESTFLOW_GENMODEL_JAR`` may point at a
different jar (e.g. a standalone ``h2o-genmodel.jar``) and ``FORESTFLOW_JVM_OPTS`` adds JVM
options (e.g. ``-Xmx1g``).

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

__all__ = ["JVMError", "ensure_jvm", "genmodel_jar", "is_started", "jclass", "score0_loop", "score_batch"]

_lock = threading.Lock()
_started_pid: int | None = None
_classes: dict[str, Any] = {}
_loops: dict[bool, Any] = {}

# A class every genmodel jar has: proves the classpath is right after start.
_PROBE_CLASS = "hex.genmodel.MojoModel"


class JVMError(RuntimeError):
    """The JVM or the genmodel classes are not available."""


def genmodel_jar() -> Path:
    """The jar holding the genmodel classes: ``$FORESTFLOW_GENMODEL_JAR`` or the h2o wheel's h2o.jar."""
    override = os.environ.get("FORESTFLOW_GENMODEL_JAR")
    if override:
        path = Path(override)
        if not path.is_file():
            raise JVMError(f"FORESTFLOW_GENMODEL_JAR={override!r} is not a file")
        return path
    # find_spec locates the package without importing it (importing h2o is slow and not needed).
    spec = importlib.util.find_spec("h2o")
    if spec is None or not spec.submodule_search_locations:
        raise JVMError("the 'h2o' package is not installed: it ships the genmodel jar (pip install h2o==3.46.0.11)")
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
    options += shlex.split(os.environ.get("FORESTFLOW_JVM_OPTS", ""))
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
        except ImportError as exc:  # pragma: no cover - JPype is a declared dependency
            raise JVMError("JPype1 is not installed (pip install JPype1)") from exc
        if not jpype.isJVMStarted():
            jar = genmodel_jar()
            try:
                jpype.startJVM(*_jvm_options(), classpath=[str(jar)], convertStrings=False, interrupt=False)
            except OSError as exc:
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


def score0_loop(with_offset: bool = False) -> Any:
    """A MethodHandle ``(int n, GenModel m, double[][] X, [double[] O,] double[][] P) -> void``.

    Invoked with ``invokeWithArguments``, it runs ``m.score0(X[i], [O[i],] P[i])`` for every
    ``i < n`` inside the JVM: one JNI crossing per batch instead of one per row. It is assembled
    from JDK method-handle combinators (``MethodHandles.countedLoop``), so no Java source has to
    be compiled. Built once per process; method handles are immutable and thread-safe.
    """
    ensure_jvm()
    with _lock:
        handle = _loops.get(with_offset)
        if handle is not None:
            return handle
        import jpype

        mh = jpype.JClass("java.lang.invoke.MethodHandles")
        mt = jpype.JClass("java.lang.invoke.MethodType")
        gen = jpype.JClass("hex.genmodel.GenModel").class_
        d1 = jpype.JArray(jpype.JDouble).class_
        d2 = jpype.JArray(jpype.JDouble, 2).class_
        void = jpype.JClass("java.lang.Void").TYPE
        int_ = jpype.JClass("java.lang.Integer").TYPE
        double_ = jpype.JClass("java.lang.Double").TYPE
        row = mh.arrayElementGetter(d2)  # (double[][] a, int i) -> a[i]
        lookup = mh.publicLookup()
        if with_offset:
            score = lookup.findVirtual(gen, "score0", mt.methodType(d1, d1, [double_, d1]))
            score = score.asType(mt.methodType(void, gen, [d1, double_, d1]))
            body = mh.collectArguments(score, 3, row)
            body = mh.collectArguments(body, 2, mh.arrayElementGetter(d1))
            body = mh.collectArguments(body, 1, row)
            # body takes (m, X, i, O, i, P, i); the loop calls it with (i, n, m, X, O, P).
            params, order = [gen, d2, d1, d2], [2, 3, 0, 4, 0, 5, 0]
        else:
            score = lookup.findVirtual(gen, "score0", mt.methodType(d1, d1, [d1]))
            score = score.asType(mt.methodType(void, gen, [d1, d1]))
            body = mh.collectArguments(mh.collectArguments(score, 2, row), 1, row)
            # body takes (m, X, i, P, i); the loop calls it with (i, n, m, X, P).
            params, order = [gen, d2, d2], [2, 3, 0, 4, 0]
        body = mh.permuteArguments(body, mt.methodType(void, int_, [int_, *params]), jpype.JArray(jpype.JInt)(order))
        iterations = mh.dropArguments(mh.identity(int_), 1, params)  # the loop runs n times
        handle = _loops[with_offset] = mh.countedLoop(iterations, None, body)
        return handle


@functools.cache
def _double_array() -> Any:
    """The ``double[]`` array type (building it costs more than a one-row score)."""
    import jpype

    return jpype.JArray(jpype.JDouble)


def score_batch(model: Any, X: np.ndarray, offsets: np.ndarray | None, preds_size: int) -> np.ndarray:
    """``GenModel.score0`` of every row of ``X`` (NaN = NA) in one Java call: ``(n, preds_size)``.

    With ``offsets`` the offset overload ``score0(row, offset, preds)`` is used per row.
    """
    import jpype

    n = len(X)
    if n == 1 and offsets is None:  # one row: a direct call is cheaper than the loop handle
        doubles = _double_array()
        out = doubles(preds_size)
        model.score0(doubles(np.ascontiguousarray(X[0], dtype=np.float64)), out)
        return np.asarray(out).reshape(1, preds_size)
    rows = jpype.JArray.of(np.ascontiguousarray(X, dtype=np.float64))
    preds = jpype.JDouble[n, preds_size]  # allocated on the Java side: cheaper than converting zeros
    count = jclass("java.lang.Integer")(n)
    if offsets is None:
        score0_loop(False).invokeWithArguments(count, model, rows, preds)
    else:
        jo = jpype.JArray.of(np.ascontiguousarray(offsets, dtype=np.float64))
        score0_loop(True).invokeWithArguments(count, model, rows, jo, preds)
    return np.asarray(preds)
